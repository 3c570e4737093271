//! The flowlane payload header, first in every datagram/frame payload that has room:
//!
//! ```text
//! 0      2      4              8                              16
//! +------+------+--------------+------------------------------+
//! | 0xF1 | flow |  sequence    |  transmit time, ns (u64)      |
//! | 0x0E | (u16)|  (u32, low   |  on the sender's monotonic    |
//! |magic |      |  32 bits)    |  clock                        |
//! +------+------+--------------+------------------------------+   all big-endian
//! ```
//!
//! 16 bytes fit the smallest IPv4 UDP frame (60 bytes without FCS leaves 18 bytes of payload).
//! The receiver extends the 32-bit sequence number against the highest one seen.

/// Bytes of the header.
pub const HEADER_LEN: usize = 16;
/// The first two bytes.
pub const MAGIC: u16 = 0xF10E;

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowHeader {
    /// Flow index (per sender).
    pub flow: u16,
    /// Low 32 bits of the per-flow sequence number.
    pub seq: u32,
    /// Transmit time, ns on the sender's monotonic clock.
    pub tx_ns: u64,
}

/// Why a payload carries no flowlane header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// Shorter than [`HEADER_LEN`].
    Short(usize),
    /// Starts with something else.
    Foreign,
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Short(n) => write!(f, "payload of {n} bytes has no room for a header"),
            HeaderError::Foreign => write!(f, "payload does not start with the flowlane magic"),
        }
    }
}

impl std::error::Error for HeaderError {}

impl FlowHeader {
    /// Writes the header at the start of `out` (which must hold [`HEADER_LEN`] bytes; shorter
    /// payloads carry none, and false is returned).
    #[inline]
    pub fn write(&self, out: &mut [u8]) -> bool {
        let Some(h) = out.get_mut(..HEADER_LEN) else {
            return false;
        };
        h[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        h[2..4].copy_from_slice(&self.flow.to_be_bytes());
        h[4..8].copy_from_slice(&self.seq.to_be_bytes());
        h[8..16].copy_from_slice(&self.tx_ns.to_be_bytes());
        true
    }

    /// Reads a header from the start of a payload.
    #[inline]
    pub fn read(p: &[u8]) -> Result<FlowHeader, HeaderError> {
        let h: &[u8; HEADER_LEN] = p
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(HeaderError::Short(p.len()))?;
        if u16::from_be_bytes([h[0], h[1]]) != MAGIC {
            return Err(HeaderError::Foreign);
        }
        Ok(FlowHeader {
            flow: u16::from_be_bytes([h[2], h[3]]),
            seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
            tx_ns: u64::from_be_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let h = FlowHeader {
            flow: 513,
            seq: 0xdead_beef,
            tx_ns: 1 << 40,
        };
        let mut buf = [0u8; 18];
        assert!(h.write(&mut buf));
        assert_eq!(FlowHeader::read(&buf), Ok(h));
        assert_eq!(&buf[..2], &[0xF1, 0x0E]);
        assert!(!h.write(&mut [0u8; 15]));
        assert_eq!(FlowHeader::read(&buf[..15]), Err(HeaderError::Short(15)));
        buf[0] = 0;
        assert_eq!(FlowHeader::read(&buf), Err(HeaderError::Foreign));
    }
}
