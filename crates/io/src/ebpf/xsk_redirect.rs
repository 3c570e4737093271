//! The XDP program that hands each frame to the AF_XDP socket of the queue it arrived on.

use super::*;

/// `struct xdp_md`'s `rx_queue_index`.
const RX_QUEUE_INDEX: i16 = 16;

/// Redirects every frame into the `xskmap_fd` entry of its receive queue; a queue with no
/// socket passes its frames to the kernel (the redirect's flags carry that default, Linux
/// 5.3+).
pub fn xsk_redirect_program(xskmap_fd: i32) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    a.load(Size::W, R2, R1, RX_QUEUE_INDEX)
        .load_map_fd(R1, xskmap_fd)
        .mov_imm(R3, xdp::PASS)
        .call(Helper::RedirectMap)
        .exit();
    a.finish()
}

/// Redirects unicast IPv4 and IPv6 frames into the `xskmap_fd` entry of their receive queue;
/// everything else — ARP, neighbour discovery (also unicast: the advertisement answering
/// the kernel's solicitation), IPv6 to link-local addresses, multicast, broadcast — goes to
/// the kernel (`XDP_PASS`), as a router's control traffic must, counted per CPU in the u64 array
/// `passed_fd` (one counter per CPU, at the CPU's index).
pub fn xsk_redirect_unicast_ip_program(
    xskmap_fd: i32,
    passed_fd: i32,
) -> Result<Vec<Insn>, AsmError> {
    unicast_ip(xskmap_fd, passed_fd, xdp::PASS, true, None)
}

/// The router's redirect: as [`xsk_redirect_unicast_ip_program`], and frames to one of the
/// host's own addresses — the keys of `local_fd`, a `maps::AddrSet` — go to the kernel too
/// (a ping or a session to the router itself; its figures count them as left to the host).
pub fn xsk_redirect_router_program(
    xskmap_fd: i32,
    passed_fd: i32,
    local_fd: i32,
) -> Result<Vec<Insn>, AsmError> {
    unicast_ip(xskmap_fd, passed_fd, xdp::PASS, true, Some(local_fd))
}

/// Redirects IPv4 and IPv6 frames (multicast too) into the `xskmap_fd` entry of their
/// receive queue; frames that are not IP go to the kernel (`XDP_PASS`: ARP keeps working),
/// counted per CPU in the u64 array `passed_fd` (one counter per CPU, at the CPU's index) —
/// the AF_XDP reflector's `--not-ip pass`.
pub fn xsk_redirect_ip_program(xskmap_fd: i32, passed_fd: i32) -> Result<Vec<Insn>, AsmError> {
    unicast_ip(xskmap_fd, passed_fd, xdp::PASS, false, None)
}

/// The program, with `no_socket` the verdict for a queue without a socket; `pass_group`:
/// multicast and broadcast destinations go to the kernel too, and so do IPv6 neighbour
/// discovery (ICMPv6 types 133–137 right after the fixed header) and IPv6 to link-local
/// addresses (`fe80::/10`), which no router forwards; `local_fd`: frames to an address in
/// that set (see [`xsk_redirect_router_program`]).
fn unicast_ip(
    xskmap_fd: i32,
    passed_fd: i32,
    no_socket: i32,
    pass_group: bool,
    local_fd: Option<i32>,
) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let pass = a.label();
    let redirect = a.label();
    // Where IPv4 and IPv6 go once nothing else passed them: the own-address check, if any.
    let (ip4, ip6) = match local_fd {
        Some(_) => (a.label(), a.label()),
        None => (redirect, redirect),
    };
    // R6 = ctx, R7 = data; the first 14 bytes must be there.
    a.mov(R6, R1)
        .load(Size::W, R7, R6, xdp_md::DATA)
        .load(Size::W, R8, R6, xdp_md::DATA_END)
        .mov(R1, R7)
        .alu_imm(Alu::Add, R1, 14)
        .jump_reg(Cond::Gt, R1, R8, pass);
    if pass_group {
        // The destination MAC's group bit: multicast or broadcast.
        a.load(Size::B, R2, R7, 0).jump_imm(Cond::Set, R2, 1, pass);
    }
    // The EtherType, as loaded from network order on a little-endian machine.
    a.load(Size::H, R2, R7, 12)
        .jump_imm(Cond::Eq, R2, 0x0008, ip4);
    if pass_group {
        let ipv6 = a.label();
        a.jump_imm(Cond::Eq, R2, 0xdd86, ipv6)
            .jump(pass)
            .bind(ipv6)
            // The fixed header and one byte after it (an ICMPv6 type), or the worker's to
            // judge (cut short).
            .mov(R1, R7)
            .alu_imm(Alu::Add, R1, 14 + 40 + 1)
            .jump_reg(Cond::Gt, R1, R8, redirect)
            // Destination fe80::/10: the first byte 0xfe, the second's top bits 10.
            .load(Size::B, R2, R7, 14 + 24)
            .load(Size::B, R3, R7, 14 + 25)
            .alu_imm(Alu::And, R3, 0xc0);
        let global = a.label();
        a.jump_imm(Cond::Ne, R2, 0xfe, global)
            .jump_imm(Cond::Eq, R3, 0x80, pass)
            .bind(global)
            // Next header ICMPv6 (58), type 133 (router solicitation) … 137 (redirect).
            .load(Size::B, R2, R7, 14 + 6)
            .jump_imm(Cond::Ne, R2, 58, ip6)
            .load(Size::B, R2, R7, 14 + 40)
            .jump_imm(Cond::Lt, R2, 133, ip6)
            .jump_imm(Cond::Le, R2, 137, pass)
            .jump(ip6);
    } else {
        a.jump_imm(Cond::Eq, R2, 0xdd86, redirect);
    }
    a.bind(pass);
    count_per_cpu(&mut a, passed_fd, 1, 0);
    a.mov_imm(R0, xdp::PASS).exit();
    if let Some(fd) = local_fd {
        // The key on the stack at R10 − 16: IPv4 as ::ffff:a.b.c.d (the header's 20 bytes
        // there, or the worker's to judge), IPv6 as it is.
        let lookup = a.label();
        a.bind(ip4)
            .mov(R1, R7)
            .alu_imm(Alu::Add, R1, 14 + 20)
            .jump_reg(Cond::Gt, R1, R8, redirect)
            .store_imm(Size::W, R10, -16, 0)
            .store_imm(Size::W, R10, -12, 0)
            // Bytes 00 00 ff ff, stored little-endian.
            .store_imm(Size::W, R10, -8, 0xffff_0000_u32 as i32)
            .load(Size::W, R1, R7, 14 + 16)
            .store(Size::W, R10, -4, R1)
            .jump(lookup)
            .bind(ip6);
        for k in 0..4i16 {
            a.load(Size::W, R1, R7, 14 + 24 + 4 * k)
                .store(Size::W, R10, -16 + 4 * k, R1);
        }
        a.bind(lookup)
            .mov(R2, R10)
            .alu_imm(Alu::Add, R2, -16)
            .load_map_fd(R1, fd)
            .call(Helper::MapLookupElem)
            .jump_imm(Cond::Ne, R0, 0, pass);
    }
    a.bind(redirect)
        .load(Size::W, R2, R6, RX_QUEUE_INDEX)
        .load_map_fd(R1, xskmap_fd)
        .mov_imm(R3, no_socket)
        .call(Helper::RedirectMap)
        .exit();
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the kernel's verifier and test runner (needs CAP_BPF; skipped without it):
    /// built to drop where no socket waits, the program tries to redirect unicast IPv4 and
    /// IPv6 (no socket: dropped) and passes ARP, multicast and broadcast (the kernel's test
    /// runner refuses frames shorter than an Ethernet header, so the length check is the
    /// verifier's to hold).
    /// (Long: one scenario, every step checked before the next.)
    #[test]
    fn unicast_ip_is_redirected_and_control_traffic_passes() {
        let map = match crate::maps::XskMap::create("fl_t_xsk", 1) {
            Ok(m) => m,
            Err(e) if e.source.kind() == std::io::ErrorKind::PermissionDenied => {
                eprintln!("SKIP: needs CAP_BPF");
                return;
            }
            Err(e) => panic!("map: {e}"),
        };
        let passed = crate::sys::bpf::MappedArray::new("fl_t_pass", 1024).expect("map");
        let insns =
            unicast_ip(map.raw_fd(), passed.fd(), xdp::DROP, true, None).expect("assembles");
        let prog = crate::sys::bpf::prog_load(crate::sys::bpf::PROG_XDP, "fl_t_uip", &insns)
            .expect("the verifier takes it");
        let frame = |dst: [u8; 6], ethertype: [u8; 2]| {
            let mut f = vec![0u8; 60];
            f[..6].copy_from_slice(&dst);
            f[12..14].copy_from_slice(&ethertype);
            f
        };
        let uni = [2, 0, 0, 0, 0, 1];
        // IPv6 to `dst` (first two bytes), next header `next`, then `first` (an ICMPv6 type).
        let v6 = |dst: [u8; 2], next: u8, first: u8| {
            let mut f = frame(uni, [0x86, 0xdd]);
            f[14] = 0x60;
            f[20] = next;
            f[38..40].copy_from_slice(&dst);
            f[54] = first;
            f
        };
        let cases = [
            // Neighbour advertisement and solicitation, router advertisement: the kernel's.
            (v6([0x20, 0x01], 58, 136), xdp::PASS),
            (v6([0x20, 0x01], 58, 135), xdp::PASS),
            (v6([0x20, 0x01], 58, 134), xdp::PASS),
            // Echo request and an error through the router: forwarded.
            (v6([0x20, 0x01], 58, 128), xdp::DROP),
            (v6([0x20, 0x01], 58, 1), xdp::DROP),
            (v6([0x20, 0x01], 17, 136), xdp::DROP),
            // To a link-local address (fe80::/10, fe80 … febf): the kernel's.
            (v6([0xfe, 0x80], 17, 0), xdp::PASS),
            (v6([0xfe, 0xbf], 17, 0), xdp::PASS),
            (v6([0xfe, 0xc0], 17, 0), xdp::DROP),
            (frame(uni, [0x08, 0x00]), xdp::DROP),
            (frame(uni, [0x86, 0xdd]), xdp::DROP),
            (frame([0xff; 6], [0x08, 0x06]), xdp::PASS),
            (frame(uni, [0x08, 0x06]), xdp::PASS),
            (frame([0x33, 0x33, 0, 0, 0, 1], [0x86, 0xdd]), xdp::PASS),
            (frame([1, 0, 0x5e, 0, 0, 1], [0x08, 0x00]), xdp::PASS),
        ];
        let mut passes = 0;
        for (f, want) in cases {
            let (ret, _) = crate::sys::bpf::xdp_test_run(&prog, &f).expect("test run");
            assert_eq!(ret, want as u32, "{:02x?}", &f[..f.len().min(14)]);
            passes += u64::from(want == xdp::PASS);
        }
        let counted: u64 = (0..1024).map(|c| passed.get(c)).sum();
        assert_eq!(counted, passes, "every pass counted once");
        // The router's: frames to the host's own addresses pass too, IPv4 (as ::ffff:a.b.c.d)
        // and IPv6; frames to others are redirected, and so is a header cut short.
        let local = crate::maps::AddrSet::create("fl_t_local", 8).expect("map");
        let own4 = u128::from(0xffff_c612_0002_u64).to_be_bytes(); // ::ffff:198.18.0.2
        let own6 = (0x2001_0002_u128 << 96 | 2).to_be_bytes(); // 2001:2::2
        local.insert(own4).expect("insert");
        local.insert(own6).expect("insert");
        assert!(local.contains(own4).expect("lookup"));
        let insns = unicast_ip(
            map.raw_fd(),
            passed.fd(),
            xdp::DROP,
            true,
            Some(local.raw_fd()),
        )
        .expect("assembles");
        let prog = crate::sys::bpf::prog_load(crate::sys::bpf::PROG_XDP, "fl_t_rtr", &insns)
            .expect("the verifier takes it");
        let to4 = |dst: [u8; 4], len: usize| {
            let mut f = frame(uni, [0x08, 0x00]);
            f[14] = 0x45;
            f[30..34].copy_from_slice(&dst);
            f.truncate(len);
            f
        };
        let to6 = |dst: [u8; 16]| {
            let mut f = v6([0, 0], 17, 0);
            f[38..54].copy_from_slice(&dst);
            f
        };
        let mut other6 = own6;
        other6[15] = 3;
        for (f, want) in [
            (to4([198, 18, 0, 2], 60), xdp::PASS),
            (to4([198, 18, 0, 3], 60), xdp::DROP),
            (to4([198, 18, 0, 2], 33), xdp::DROP),
            (to6(own6), xdp::PASS),
            (to6(other6), xdp::DROP),
            (to6(own4), xdp::PASS),
            (v6([0x20, 0x01], 58, 136), xdp::PASS),
            (frame([0xff; 6], [0x08, 0x06]), xdp::PASS),
        ] {
            let (ret, _) = crate::sys::bpf::xdp_test_run(&prog, &f).expect("test run");
            assert_eq!(ret, want as u32, "{:02x?}", &f[..f.len().min(54)]);
        }
        local.remove(own4).expect("remove");
        let (ret, _) =
            crate::sys::bpf::xdp_test_run(&prog, &to4([198, 18, 0, 2], 60)).expect("run");
        assert_eq!(ret, xdp::DROP as u32, "an address removed is routed again");
        // The reflector's variant: IP multicast is redirected too, ARP still passes.
        let insns =
            unicast_ip(map.raw_fd(), passed.fd(), xdp::DROP, false, None).expect("assembles");
        let prog = crate::sys::bpf::prog_load(crate::sys::bpf::PROG_XDP, "fl_t_ip", &insns)
            .expect("the verifier takes it");
        for (f, want) in [
            (frame([1, 0, 0x5e, 0, 0, 1], [0x08, 0x00]), xdp::DROP),
            (frame([0xff; 6], [0x08, 0x06]), xdp::PASS),
            (v6([0x20, 0x01], 58, 136), xdp::DROP),
        ] {
            let (ret, _) = crate::sys::bpf::xdp_test_run(&prog, &f).expect("test run");
            assert_eq!(ret, want as u32);
        }
    }
}
