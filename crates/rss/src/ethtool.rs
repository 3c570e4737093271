//! What `ethtool -x DEV` says about a NIC's RSS, read back from its text: the indirection table,
//! the key, the hash function and the input transformation.
//!
//! A saved `ethtool -x` is the user's record of what the NIC does. Using its table but another
//! key gives another answer than the NIC's, so everything the file holds is read; what it does
//! not hold (a driver that reports no key: "Operation not supported") stays `None`, and the
//! caller says which default it used instead.
//!
//! The layout is ethtool's (`netlink/rss.c` and the ioctl path print the same):
//!
//! ```text
//! RX flow hash indirection table for eth0 with 4 RX ring(s):
//!     0:      0     1     2     3     0     1     2     3
//! RSS hash key:
//! 6d:5a:56:da:…
//! RSS hash function:
//!     toeplitz: on
//!     xor: off
//!     crc32: off
//! RSS input transformation:
//!     symmetric-xor: off
//!     symmetric-or-xor: off
//! ```
//!
//! A plain list of queue numbers (no ethtool headers) is a table alone.

use crate::key::Key;
use crate::queue::{Reta, RetaError};
use crate::tuple::Symmetric;

/// The hash function a NIC reports (ethtool's `RSS hash function:` section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashFunction {
    /// Toeplitz, the function flowlane models bit-exactly.
    Toeplitz,
    /// Any other (`xor`, `crc32`, an unknown bit): named as ethtool printed it.
    Other(String),
}

impl HashFunction {
    /// The name ethtool prints.
    pub fn name(&self) -> &str {
        match self {
            HashFunction::Toeplitz => "toeplitz",
            HashFunction::Other(s) => s,
        }
    }
}

/// Everything an `ethtool -x` text holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EthtoolRss {
    /// The indirection table.
    pub reta: Reta,
    /// The key, when the driver reported one.
    pub key: Option<Key>,
    /// The hash function that is on, when the section was there.
    pub function: Option<HashFunction>,
    /// The input transformation: `Some(Xor)` for `symmetric-xor: on`, `Some(Off)` when the
    /// section says all off, `None` when the text has no such section (older ethtool).
    pub symmetric: Option<Symmetric>,
    /// A transformation that is on but that flowlane does not model (`symmetric-or-xor`, an
    /// unknown bit), as ethtool printed it.
    pub unmodelled_transform: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Table,
    Key,
    Function,
    Transform,
}

fn parse_err(line: usize, reason: impl Into<String>) -> RetaError {
    RetaError::Parse {
        line,
        reason: reason.into(),
    }
}

/// At most this many bytes of a bad token are quoted in an error.
const QUOTE_MAX: usize = 40;

fn quote(tok: &str) -> String {
    match tok.char_indices().nth(QUOTE_MAX) {
        Some((i, _)) => format!("{}…", &tok[..i]),
        None => tok.to_string(),
    }
}

impl EthtoolRss {
    /// Parses `ethtool -x` output, or a plain list of queue numbers. `#` starts a comment.
    pub fn parse(text: &str) -> Result<EthtoolRss, RetaError> {
        let mut entries: Vec<u16> = Vec::new();
        let mut key = None;
        let mut functions_on: Vec<String> = Vec::new();
        let mut function_seen = false;
        let mut symmetric = None;
        let mut unmodelled = None;
        let mut section = Section::Table;
        let mut in_ethtool_table = false;
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("rx flow hash indirection table") {
                in_ethtool_table = true;
                section = Section::Table;
                continue;
            }
            if lower.starts_with("rss hash key") {
                section = Section::Key;
                continue;
            }
            if lower.starts_with("rss hash function") {
                section = Section::Function;
                function_seen = true;
                continue;
            }
            if lower.starts_with("rss input transformation") {
                section = Section::Transform;
                symmetric.get_or_insert(Symmetric::Off);
                continue;
            }
            match section {
                Section::Table => table_line(line, n, in_ethtool_table, &mut entries)?,
                Section::Key => {
                    if lower.starts_with("operation not supported") {
                        continue;
                    }
                    if key.is_some() {
                        return Err(parse_err(n, "a second key line after `RSS hash key:`"));
                    }
                    key = Some(Key::parse(line).map_err(|e| {
                        parse_err(n, format!("the key `{}` does not parse: {e}", quote(line)))
                    })?);
                }
                Section::Function => {
                    if lower.starts_with("operation not supported") {
                        function_seen = false;
                        continue;
                    }
                    if let Some(raw) = lower.strip_prefix("unknown hash function:") {
                        functions_on.push(format!("unknown ({})", quote(raw.trim())));
                        continue;
                    }
                    let (name, state) = on_off(line, n)?;
                    if state {
                        functions_on.push(name);
                    }
                }
                Section::Transform => {
                    if lower.starts_with("unknown bits") {
                        unmodelled = Some(quote(line));
                        continue;
                    }
                    let (name, state) = on_off(line, n)?;
                    match (name.as_str(), state) {
                        (_, false) => {}
                        ("symmetric-xor", true) => symmetric = Some(Symmetric::Xor),
                        (other, true) => unmodelled = Some(other.to_string()),
                    }
                }
            }
        }
        if entries.is_empty() {
            return Err(parse_err(0, "no indirection table entries found"));
        }
        let function = if !function_seen {
            None
        } else {
            match functions_on.as_slice() {
                [] => None,
                [one] if one == "toeplitz" => Some(HashFunction::Toeplitz),
                many => Some(HashFunction::Other(many.join("+"))),
            }
        };
        Ok(EthtoolRss {
            reta: Reta::from_entries(entries)?,
            key,
            function,
            symmetric,
            unmodelled_transform: unmodelled,
        })
    }

    /// Why flowlane cannot model this NIC's hash, if it cannot: a function other than
    /// Toeplitz, or an input transformation other than `symmetric-xor`.
    pub fn unmodelled(&self) -> Option<String> {
        if let Some(HashFunction::Other(f)) = &self.function {
            return Some(format!(
                "the NIC hashes with `{f}`, not Toeplitz: flowlane models Toeplitz only \
                 (`ethtool -X DEV hfunc toeplitz` switches it)"
            ));
        }
        self.unmodelled_transform.as_ref().map(|t| {
            format!(
                "the NIC's input transformation `{t}` is on: flowlane models `symmetric-xor` \
                 only (`ethtool -X DEV xfrm none` switches it off)"
            )
        })
    }
}

/// `name: on|off` of ethtool's function and transformation sections.
fn on_off(line: &str, n: usize) -> Result<(String, bool), RetaError> {
    let bad = || {
        parse_err(
            n,
            format!("expected `NAME: on|off`, found `{}`", quote(line)),
        )
    };
    let (name, state) = line.split_once(':').ok_or_else(bad)?;
    let state = match state.trim() {
        "on" => true,
        "off" => false,
        _ => return Err(bad()),
    };
    Ok((name.trim().to_ascii_lowercase(), state))
}

/// One line of the table: `INDEX: Q Q …` (ethtool) or plain queue numbers.
fn table_line(
    line: &str,
    n: usize,
    in_ethtool_table: bool,
    entries: &mut Vec<u16>,
) -> Result<(), RetaError> {
    let body = match line.split_once(':') {
        // `ethtool -x` rows start with the index of their first entry.
        Some((idx, rest)) if idx.trim().chars().all(|c| c.is_ascii_digit()) => {
            let idx: usize = idx
                .trim()
                .parse()
                .map_err(|_| parse_err(n, "bad row index"))?;
            if idx != entries.len() {
                return Err(parse_err(
                    n,
                    format!(
                        "row starts at entry {idx} but {} entries were read so far",
                        entries.len()
                    ),
                ));
            }
            rest
        }
        Some(_) if in_ethtool_table => {
            return Err(parse_err(n, "expected `INDEX: QUEUE QUEUE …`"));
        }
        Some(_) => return Ok(()), // other ethtool header lines
        None => line,
    };
    for tok in body.split_ascii_whitespace() {
        let q: u16 = tok.parse().map_err(|_| {
            parse_err(
                n,
                format!("`{}` is not a queue number (0-65535)", quote(tok)),
            )
        })?;
        if entries.len() >= crate::queue::RETA_MAX {
            return Err(RetaError::BadSize(entries.len() + 1));
        }
        entries.push(q);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ethtool -x` of an ice NIC (ethtool 6.x over netlink), table cut to 16 entries.
    const ICE: &str = "RX flow hash indirection table for enp1s0 with 4 RX ring(s):\n\
        \x20   0:      0     1     2     3     0     1     2     3\n\
        \x20   8:      0     1     2     3     0     1     2     3\n\
        RSS hash key:\n\
        3c:fd:21:9a:55:10:d4:6e:a8:1f:43:bb:02:77:c0:5e:91:e3:7a:4b:66:08:fd:2c:39:d1:\
        8e:40:b5:7f:13:a2:c6:59:0d:e4:71:2b:98:34:af:6c:05:e1:d7:3a:4c:80:19:b6:62:f5\n\
        RSS hash function:\n\
        \x20   toeplitz: on\n\
        \x20   xor: off\n\
        \x20   crc32: off\n\
        RSS input transformation:\n\
        \x20   symmetric-xor: off\n\
        \x20   symmetric-or-xor: off\n";

    #[test]
    fn the_whole_dump_is_read() {
        let d = EthtoolRss::parse(ICE).expect("valid");
        assert_eq!(d.reta.len(), 16);
        assert_eq!(d.reta.entries()[5], 1);
        let key = d.key.expect("a key");
        assert_eq!(key.len(), 52);
        assert_eq!(&key.as_bytes()[..3], &[0x3c, 0xfd, 0x21]);
        assert_eq!(d.function, Some(HashFunction::Toeplitz));
        assert_eq!(d.symmetric, Some(Symmetric::Off));
        assert_eq!(d.unmodelled(), None);
    }

    #[test]
    fn symmetric_xor_is_read_and_other_transforms_refused() {
        let sym = ICE.replace("symmetric-xor: off", "symmetric-xor: on");
        let d = EthtoolRss::parse(&sym).expect("valid");
        assert_eq!(d.symmetric, Some(Symmetric::Xor));
        assert_eq!(d.unmodelled(), None);
        let or = ICE.replace("symmetric-or-xor: off", "symmetric-or-xor: on");
        let d = EthtoolRss::parse(&or).expect("valid");
        assert!(d
            .unmodelled()
            .expect("refused")
            .contains("symmetric-or-xor"));
    }

    #[test]
    fn a_function_other_than_toeplitz_is_named() {
        let xor = ICE
            .replace("toeplitz: on", "toeplitz: off")
            .replace("    xor: off", "    xor: on");
        let d = EthtoolRss::parse(&xor).expect("valid");
        assert_eq!(d.function, Some(HashFunction::Other("xor".into())));
        assert_eq!(d.symmetric, Some(Symmetric::Off));
        assert!(d.unmodelled().expect("refused").contains("`xor`"));
    }

    #[test]
    fn a_driver_without_key_or_function_leaves_them_unknown() {
        let text = "RX flow hash indirection table for veth0 with 2 RX ring(s):\n\
                    \x20   0:      0     1     0     1\n\
                    RSS hash key:\n\
                    Operation not supported\n\
                    RSS hash function:\n\
                    \x20   Operation not supported\n";
        let d = EthtoolRss::parse(text).expect("valid");
        assert_eq!(d.key, None);
        assert_eq!(d.function, None);
        assert_eq!(d.symmetric, None);
        assert_eq!(d.reta.entries(), &[0, 1, 0, 1]);
    }

    #[test]
    fn a_plain_list_is_a_table_alone() {
        let d = EthtoolRss::parse("0 1 2 3\n# comment\n3 2 1 0\n").expect("valid");
        assert_eq!(d.reta.len(), 8);
        assert_eq!((d.key, d.function, d.symmetric), (None, None, None));
    }

    #[test]
    fn bad_lines_are_named_with_a_bounded_quote() {
        let long = format!("RSS hash key:\n{}\n", "zz".repeat(10_000));
        let e = EthtoolRss::parse(&format!("0 1\n{long}")).expect_err("bad key");
        let msg = e.to_string();
        assert!(msg.contains("line 3"), "{msg}");
        assert!(msg.len() < 300, "{msg}");
        let e = EthtoolRss::parse("0 1\nRSS hash function:\n    toeplitz: maybe\n")
            .expect_err("bad state");
        assert!(e.to_string().contains("line 3"), "{e}");
    }
}
