//! The kernel's BTF (`/sys/kernel/btf/vmlinux`), read only to find a kernel function's type id:
//! a program calls a kfunc (e.g. `bpf_xdp_metadata_rx_hash`) by that id. The parser is pure
//! and bounded: a type section that lies about its lengths ends the walk, never a read past
//! the buffer.

use std::io;

use super::SysError;

const MAGIC: u16 = 0xeb9f;
const KIND_FUNC: u32 = 12;

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(
        b.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// The NUL-terminated name at `off` in the string section.
fn name_at(strings: &[u8], off: usize) -> Option<&[u8]> {
    let s = strings.get(off..)?;
    Some(&s[..s.iter().position(|&c| c == 0)?])
}

/// Bytes that follow a type's 12-byte header, by kind (`include/uapi/linux/btf.h`).
fn extra(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        1 | 14 | 17 => 4,                 // INT, VAR, DECL_TAG
        3 => 12,                          // ARRAY
        4 | 5 => vlen.checked_mul(12)?,   // STRUCT, UNION
        6 | 13 => vlen.checked_mul(8)?,   // ENUM, FUNC_PROTO
        15 | 19 => vlen.checked_mul(12)?, // DATASEC, ENUM64
        2 | 7..=12 | 16 | 18 => 0,        // PTR, FWD, TYPEDEF, qualifiers, FUNC, FLOAT, TYPE_TAG
        _ => return None,
    })
}

/// The type id of function `name` in a BTF blob (`None`: not there, or the blob is not BTF).
pub fn func_id(btf: &[u8], name: &str) -> Option<u32> {
    if u16::from_ne_bytes(btf.get(0..2)?.try_into().ok()?) != MAGIC {
        return None;
    }
    let hdr_len = u32_at(btf, 4)? as usize;
    let (type_off, type_len) = (u32_at(btf, 8)? as usize, u32_at(btf, 12)? as usize);
    let (str_off, str_len) = (u32_at(btf, 16)? as usize, u32_at(btf, 20)? as usize);
    let at = |off: usize, len: usize| {
        let start = hdr_len.checked_add(off)?;
        btf.get(start..start.checked_add(len)?)
    };
    let types = at(type_off, type_len)?;
    let strings = at(str_off, str_len)?;
    let mut o = 0;
    let mut id = 1u32;
    while o + 12 <= types.len() {
        let name_off = u32_at(types, o)? as usize;
        let info = u32_at(types, o + 4)?;
        let kind = (info >> 24) & 0x1f;
        if kind == KIND_FUNC && name_at(strings, name_off) == Some(name.as_bytes()) {
            return Some(id);
        }
        o = o
            .checked_add(12)?
            .checked_add(extra(kind, (info & 0xffff) as usize)?)?;
        id = id.checked_add(1)?;
    }
    None
}

/// The type id of kernel function `name` in this kernel's BTF; `None` when the kernel has
/// no BTF or no such function.
pub fn vmlinux_func_id(name: &str) -> Result<Option<u32>, SysError> {
    match std::fs::read("/sys/kernel/btf/vmlinux") {
        Ok(b) => Ok(func_id(&b, name)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SysError {
            call: "read(/sys/kernel/btf/vmlinux)",
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: an INT, a FUNC_PROTO with one parameter, then two FUNCs.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0f_one\0f_two\0".to_vec();
        let mut types = Vec::new();
        let mut ty = |name: u32, kind: u32, vlen: u32, extra: &[u8]| {
            types.extend(name.to_ne_bytes());
            types.extend(((kind << 24) | vlen).to_ne_bytes());
            types.extend(0u32.to_ne_bytes());
            types.extend_from_slice(extra);
        };
        ty(1, 1, 0, &[0; 4]); // id 1: int
        ty(0, 13, 1, &[0; 8]); // id 2: proto (int)
        ty(5, 12, 0, &[]); // id 3: f_one
        ty(11, 12, 0, &[]); // id 4: f_two
        let mut b = Vec::new();
        b.extend(MAGIC.to_ne_bytes());
        b.extend([1u8, 0]);
        b.extend(24u32.to_ne_bytes());
        b.extend(0u32.to_ne_bytes());
        b.extend((types.len() as u32).to_ne_bytes());
        b.extend((types.len() as u32).to_ne_bytes());
        b.extend((strings.len() as u32).to_ne_bytes());
        b.extend(types);
        b.extend(strings);
        b
    }

    #[test]
    fn functions_are_found_by_name_and_lies_end_the_walk() {
        let b = blob();
        assert_eq!(func_id(&b, "f_one"), Some(3));
        assert_eq!(func_id(&b, "f_two"), Some(4));
        assert_eq!(func_id(&b, "int"), None, "an INT is not a function");
        assert_eq!(func_id(&b, "nope"), None);
        // A type section longer than the blob, or no magic: nothing, no panic.
        let mut lying = b.clone();
        lying[12..16].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(func_id(&lying, "f_one"), None);
        assert_eq!(func_id(&b[2..], "f_one"), None);
        for cut in 0..b.len() {
            let _ = func_id(&b[..cut], "f_two");
        }
    }

    #[test]
    fn this_kernel_has_the_rx_hash_kfunc() {
        // Linux 6.3+ with BTF: the kfunc `rss verify` calls. (Skipped where the kernel has no
        // BTF at all.)
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            eprintln!("SKIP: no kernel BTF");
            return;
        }
        let id = vmlinux_func_id("bpf_xdp_metadata_rx_hash").expect("reads");
        assert!(id.is_some_and(|i| i > 0), "{id:?}");
    }
}
