//! An Ethernet MAC address as text: `02:f1:0e:00:01:01` (lowercase, colon-separated) out, and
//! the same in (one or two hex digits per octet) — the one place flowlane formats and parses
//! one, for sysfs, next-hop files, flags and reports alike.

use std::fmt;

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// `aa:bb:cc:dd:ee:ff` (one or two hex digits an octet); `None` for anything else.
    pub fn parse(s: &str) -> Option<Mac> {
        let mut m = [0u8; 6];
        let mut parts = s.split(':');
        for o in m.iter_mut() {
            let p = parts.next()?;
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            *o = u8::from_str_radix(p, 16).ok()?;
        }
        parts.next().is_none().then_some(Mac(m))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_reads_back_what_it_writes() {
        let m = Mac([0x02, 0xf1, 0x0e, 0x00, 0x01, 0x0a]);
        assert_eq!(m.to_string(), "02:f1:0e:00:01:0a");
        assert_eq!(Mac::parse(&m.to_string()), Some(m));
        assert_eq!(Mac::parse("2:F1:e:0:1:A"), Some(m));
        for bad in [
            "",
            "02:f1:0e:00:01",
            "02:f1:0e:00:01:0a:00",
            "02:f1:0e:00:01:",
            "+2:f1:0e:00:01:0a",
            "002:f1:0e:00:01:0a",
            "zz:f1:0e:00:01:0a",
        ] {
            assert_eq!(Mac::parse(bad), None, "{bad}");
        }
    }
}
