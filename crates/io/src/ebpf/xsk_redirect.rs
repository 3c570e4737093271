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
