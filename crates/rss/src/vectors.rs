//! The published RSS verification suite (Microsoft, "Verifying the RSS Hash Calculation"; also
//! Intel 82599 datasheet 7.1.2.8.3 and DPDK's `test_thash.c`), for the Microsoft key.
//! Every hash implementation in this crate is tested against all 16 values.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::tuple::Tuple;

/// One row: a flow and its expected hashes on the 2-tuple and on the 4-tuple.
#[derive(Debug, Clone, Copy)]
pub struct Vector {
    /// The flow as a 4-tuple.
    pub tuple: Tuple,
    /// Expected hash of the addresses only.
    pub hash_2tuple: u32,
    /// Expected hash of addresses and ports.
    pub hash_4tuple: u32,
}

fn v4(s: [u8; 4], sp: u16, d: [u8; 4], dp: u16, h2: u32, h4: u32) -> Vector {
    Vector {
        tuple: Tuple::v4(Ipv4Addr::from(s), Ipv4Addr::from(d), sp, dp),
        hash_2tuple: h2,
        hash_4tuple: h4,
    }
}

fn v6(s: [u16; 8], sp: u16, d: [u16; 8], dp: u16, h2: u32, h4: u32) -> Vector {
    Vector {
        tuple: Tuple::v6(Ipv6Addr::from(s), Ipv6Addr::from(d), sp, dp),
        hash_2tuple: h2,
        hash_4tuple: h4,
    }
}

/// The five IPv4 and three IPv6 rows (source → destination).
pub fn all() -> Vec<Vector> {
    vec![
        v4(
            [66, 9, 149, 187],
            2794,
            [161, 142, 100, 80],
            1766,
            0x323e8fc2,
            0x51ccc178,
        ),
        v4(
            [199, 92, 111, 2],
            14230,
            [65, 69, 140, 83],
            4739,
            0xd718262a,
            0xc626b0ea,
        ),
        v4(
            [24, 19, 198, 95],
            12898,
            [12, 22, 207, 184],
            38024,
            0xd2d0a5de,
            0x5c2b394a,
        ),
        v4(
            [38, 27, 205, 30],
            48228,
            [209, 142, 163, 6],
            2217,
            0x82989176,
            0xafc7327f,
        ),
        v4(
            [153, 39, 163, 191],
            44251,
            [202, 188, 127, 2],
            1303,
            0x5d1809c5,
            0x10e828a2,
        ),
        v6(
            [0x3ffe, 0x2501, 0x200, 0x1fff, 0, 0, 0, 7],
            2794,
            [0x3ffe, 0x2501, 0x200, 3, 0, 0, 0, 1],
            1766,
            0x2cc18cd5,
            0x40207d3d,
        ),
        v6(
            [0x3ffe, 0x501, 8, 0, 0x260, 0x97ff, 0xfe40, 0xefab],
            14230,
            [0xff02, 0, 0, 0, 0, 0, 0, 1],
            4739,
            0x0f0c461c,
            0xdde51bbf,
        ),
        v6(
            [0x3ffe, 0x1900, 0x4545, 3, 0x200, 0xf8ff, 0xfe21, 0x67cf],
            44251,
            [0xfe80, 0, 0, 0, 0x200, 0xf8ff, 0xfe21, 0x67cf],
            38024,
            0x4b61e985,
            0x02d1feef,
        ),
    ]
}
