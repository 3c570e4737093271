//! Live frames: the XDP program `BPF_PROG_TEST_RUN` runs to stamp and send each frame.

use super::*;

/// Layout of one flow's entry in the live-frames generator's flow map (see
/// [`live_tx_program`]): the frame's first bytes up to the end of the flowlane header, as the
/// flow's template has them with sequence number and time 0, then the UDP checksum seed.
pub mod live_flow {
    /// Most header bytes an entry holds (Ethernet + VLAN + IPv6 + UDP + flowlane header = 82,
    /// rounded up to 8).
    pub const HDR_MAX: usize = 88;
    /// Byte offset of the seed: the one's complement of the template's UDP checksum field,
    /// read as a native-endian u16 (the sum of every other 16-bit word of the checksum's
    /// coverage), stored as a u32.
    pub const SEED: usize = HDR_MAX;
    /// Value size of the map.
    pub const VALUE_SIZE: usize = HDR_MAX + 8;
}

/// Layout of a live-frames run's state (the one entry of an array map, see
/// [`live_tx_program`]): native-endian u64s. `BASE`, `NEXT`, `STEP` and `SLACK` pace (paced
/// runs only); `DEADLINE` and `LIMIT` bound every run; `FIRST` and `LAST` are the program's.
/// Times are CLOCK_MONOTONIC; "fixed" values are in 1/1024 ns so rates above 1 Mpps keep
/// their precision (at 3 Mpps a whole-ns step would be 0.1 % off).
pub mod live_pace {
    /// Time origin, ns: the program paces on `(now − BASE) × 1024`.
    pub const BASE: usize = 0;
    /// When the next frame is due (fixed, since `BASE`); the program advances it.
    pub const NEXT: usize = 8;
    /// Time between frames (fixed).
    pub const STEP: usize = 16;
    /// How far `NEXT` may lag behind now (fixed): `STEP × (burst − 1)`, so after a stall at
    /// most one burst leaves at once and the rest of the credit is not banked.
    pub const SLACK: usize = 24;
    /// No frame leaves at or after this time (ns; `u64::MAX`: no deadline).
    pub const DEADLINE: usize = 32;
    /// No frame leaves once the counter has reached this (`u64::MAX`: no limit).
    pub const LIMIT: usize = 40;
    /// When the first frame left (ns), written by the program.
    pub const FIRST: usize = 48;
    /// When the latest frame left (ns), written by the program (unpaced: its latest clock
    /// reading, which may lie past `DEADLINE` when that reading stopped the run).
    pub const LAST: usize = 56;
    /// Value size of the map.
    pub const VALUE_SIZE: usize = 64;
}

/// What the live-frames generator program is generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveTx {
    /// Array map of one entry of two u64 words (`bpf::MappedArray::words`), reached without a
    /// lookup (`Asm::load_map_value`): word 0 counts the frames run and is the source of
    /// sequence numbers; word 1 holds the shared clock reading (`clock_every`). The program is
    /// the counter's only writer (one program per sending thread; a test run calls it on that
    /// thread only, one frame after the other), so it adds without an atomic.
    pub counter_fd: i32,
    /// Array map of `flows` entries laid out as [`live_flow`].
    pub flows_fd: i32,
    /// Number of flows, at least 1: frame `n` belongs to flow `n % flows`.
    pub flows: u32,
    /// Header bytes copied from the flow's entry into each frame (even, at most
    /// [`live_flow::HDR_MAX`]); the frame run must be at least this long.
    pub hdr_len: usize,
    /// Offset of the flowlane header's sequence number in the frame (the 8-byte transmit time
    /// follows it).
    pub seq_off: usize,
    /// Offset of the UDP checksum in the frame.
    pub csum_off: usize,
    /// An array map of one [`live_pace`] entry (reached without a lookup): what bounds the
    /// run, so that a run can be one long kernel call ended by a signal (each call costs
    /// ~20 ms of set-up and tear-down). Paced (`paced`): each run first checks the deadline
    /// and the limit, then whether a frame is due; a run that may not send returns XDP_DROP
    /// without counting (in live-frames mode a dropped frame goes back to the page pool, a
    /// few ns). The run loop then spins at the rate the program can decide, so frames leave
    /// evenly spaced to within a batch, not in bursts of a whole kernel call. Unpaced: the
    /// limit is checked against the counter and the deadline against the frame's (shared)
    /// clock reading, so at most `clock_every - 1` frames leave after it; each reading is
    /// stamped as `LAST`, the first frame's as `FIRST`.
    pub state_fd: i32,
    /// Frames leave at the rate `state_fd`'s entry sets (its `live_pace` fields), not as fast
    /// as the run goes.
    pub paced: bool,
    /// One flow: its map entry ([`live_flow`]: the header bytes, then the checksum seed),
    /// built into the program — the headers written as immediates, no flow to look up. They
    /// are written every frame all the same: in live-frames mode a sent frame's page comes
    /// back to the run's pool as the receiver left it, and a receiver that forwards in place
    /// (a router decrementing the TTL, rewriting MACs) changes it.
    pub one_flow: Option<[u8; live_flow::VALUE_SIZE]>,
    /// Unpaced: read the clock for one frame in this many (a power of two; 1: every frame)
    /// and stamp the others with that reading, kept in the counter map's word 1. Live
    /// frames leave in batches (the kernel flushes a batch after running the program on all
    /// of it), so a frame's stamp is already up to a batch earlier than its departure; with
    /// a reading shared by at most as many frames as a batch holds, the stamp is still never
    /// later than the departure, and at most two batches earlier. Paced runs read the clock
    /// for every frame anyway (the gate needs it) and stamp that reading.
    pub clock_every: u32,
}

/// The generator of `flowlane blast --mode xdp-live`, run by `BPF_PROG_TEST_RUN` in
/// live-frames mode on copies of one frame. Each run takes a frame number `n` from the
/// counter, writes the headers of flow `n % flows` from its map entry over the frame (not
/// with one flow: the frame is that flow's), stamps the flowlane header with sequence number
/// `n / flows` and `bpf_ktime_get_ns()` (CLOCK_MONOTONIC, the clock the receivers compare
/// with; paced, the time the gate read), sets the UDP checksum from the flow's seed and those
/// 12 bytes (RFC 1624, summed in registers: no helper call), and returns XDP_TX. With one
/// program per sending thread, the flows of a thread get consecutive sequence numbers and the
/// counter says exactly how many frames the program released.
pub fn live_tx_program(p: &LiveTx) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let drop = a.label();
    let (seq_off, csum_off) = (p.seq_off as i16, p.csum_off as i16);
    let flows = p.flows.max(1) as i32;
    a.mov(R6, R1);
    if p.paced {
        pace_gate(&mut a, p.state_fd, p.counter_fd, drop);
        // n = counter[0]++ (the only writer: a plain add); R8 = the time the gate read.
        a.load_map_value(R2, p.counter_fd, 0)
            .load(Size::Dw, R7, R2, 0)
            .mov(R1, R7)
            .alu_imm(Alu::Add, R1, 1)
            .store(Size::Dw, R2, 0, R1)
            .load(Size::Dw, R8, R10, -16);
    } else {
        unpaced_gate(&mut a, p, drop);
    }
    if p.one_flow.is_none() {
        // flow k = n % flows, sequence number n / flows; R9 = the flow's entry
        a.mov(R1, R7)
            .alu_imm(Alu::Mod, R1, flows)
            .alu_imm(Alu::Div, R7, flows)
            .store(Size::W, R10, -8, R1)
            .mov(R2, R10)
            .alu_imm(Alu::Add, R2, -8)
            .load_map_fd(R1, p.flows_fd)
            .call(Helper::MapLookupElem)
            .jump_imm(Cond::Eq, R0, 0, drop)
            .mov(R9, R0);
    }
    a.load(Size::W, R2, R6, xdp_md::DATA)
        .load(Size::W, R3, R6, xdp_md::DATA_END)
        .mov(R6, R2)
        .alu_imm(Alu::Add, R2, p.hdr_len as i32)
        .jump_reg(Cond::Gt, R2, R3, drop);
    match &p.one_flow {
        Some(entry) => {
            // The headers as immediates, four bytes a store (the flowlane header's sequence
            // number and time are written below).
            let mut off = 0usize;
            while off + 4 <= p.hdr_len {
                let w = [entry[off], entry[off + 1], entry[off + 2], entry[off + 3]];
                a.store_imm(Size::W, R6, off as i16, i32::from_ne_bytes(w));
                off += 4;
            }
            if off + 2 <= p.hdr_len {
                let h = u16::from_ne_bytes([entry[off], entry[off + 1]]);
                a.store_imm(Size::H, R6, off as i16, i32::from(h));
            }
            let s = live_flow::SEED;
            let seed = u32::from_ne_bytes([entry[s], entry[s + 1], entry[s + 2], entry[s + 3]]);
            // An immediate is sign-extended: keep its low 32 bits.
            a.mov_imm(R5, seed as i32)
                .alu_imm(Alu::Lsh, R5, 32)
                .alu_imm(Alu::Rsh, R5, 32);
        }
        None => {
            // The flow's headers, widest moves first.
            let mut off = 0usize;
            for (size, width) in [(Size::Dw, 8), (Size::W, 4), (Size::H, 2)] {
                while off + width <= p.hdr_len {
                    a.load(size, R1, R9, off as i16)
                        .store(size, R6, off as i16, R1);
                    off += width;
                }
            }
            a.load(Size::W, R5, R9, live_flow::SEED as i16);
        }
    }
    stamp(&mut a, seq_off, csum_off);
    a.mov_imm(R0, xdp::TX)
        .exit()
        .bind(drop)
        .mov_imm(R0, xdp::DROP)
        .exit();
    a.finish()
}

/// Stamps a frame: sequence number R7 (its low 32 bits) and time R8 into the flowlane header at
/// `seq_off` of the frame at R6 (the frame checked to be long enough), and the UDP checksum at
/// `csum_off` from the seed in R5 — the one's complement of the checksum the frame has with
/// sequence number and time zero, a native-endian sum — and those 12 bytes (RFC 1624, summed in
/// registers: no helper call). Uses R0–R3. Shared with the benchmark's stamp-only reference,
/// the least a stamping generator does.
pub fn stamp(a: &mut Asm, seq_off: i16, csum_off: i16) {
    let csum_nonzero = a.label();
    a.mov(R1, R7)
        .to_be(R1, 32)
        .store(Size::W, R6, seq_off, R1)
        .mov(R2, R8)
        .to_be(R2, 64)
        .store(Size::Dw, R6, seq_off + 4, R2)
        // sum = seed + the 12 bytes as native 32-bit words (the sequence number as stored, the
        // time's two halves): one's-complement sums do not care how the words are cut.
        .mov(R0, R5)
        .alu_reg(Alu::Add, R0, R1)
        .mov(R3, R2)
        .alu_imm(Alu::Lsh, R3, 32)
        .alu_imm(Alu::Rsh, R3, 32)
        .alu_reg(Alu::Add, R0, R3)
        .alu_imm(Alu::Rsh, R2, 32)
        .alu_reg(Alu::Add, R0, R2);
    for _ in 0..3 {
        a.mov(R1, R0)
            .alu_imm(Alu::And, R1, 0xffff)
            .alu_imm(Alu::Rsh, R0, 16)
            .alu_reg(Alu::Add, R0, R1);
    }
    // A computed 0 is sent as 0xffff (RFC 768: 0 means "no checksum").
    a.alu_imm(Alu::Xor, R0, 0xffff)
        .jump_imm(Cond::Ne, R0, 0, csum_nonzero)
        .mov_imm(R0, 0xffff)
        .bind(csum_nonzero)
        .store(Size::H, R6, csum_off, R0);
}

/// The unpaced generator's frame number, time and bounds (R6 holds the context): R7 = n (the
/// counter, then counted), R8 = the time to stamp — now, or the reading shared by this frame's
/// group (`LiveTx::clock_every`), each reading also stamped as the state's `LAST` and the
/// first frame's as `FIRST`; jumps to `drop` (nothing counted) once the counter has reached
/// the state's `LIMIT` or the reading its `DEADLINE`.
fn unpaced_gate(a: &mut Asm, p: &LiveTx, drop: Label) {
    use live_pace::*;
    let (timed, later) = (a.label(), a.label());
    a.load_map_value(R9, p.state_fd, 0)
        .load_map_value(R2, p.counter_fd, 0)
        .load(Size::Dw, R7, R2, 0)
        .load(Size::Dw, R1, R9, LIMIT as i16)
        .jump_reg(Cond::Ge, R7, R1, drop);
    if p.clock_every > 1 {
        let read = a.label();
        a.mov(R1, R7)
            .alu_imm(Alu::And, R1, (p.clock_every.next_power_of_two() - 1) as i32)
            .jump_imm(Cond::Eq, R1, 0, read)
            .load_map_value(R1, p.counter_fd, 8)
            .load(Size::Dw, R8, R1, 0)
            .jump(timed)
            .bind(read);
    }
    a.call(Helper::KtimeGetNs)
        .mov(R8, R0)
        .load_map_value(R1, p.counter_fd, 8)
        .store(Size::Dw, R1, 0, R8)
        .store(Size::Dw, R9, LAST as i16, R8)
        .jump_imm(Cond::Ne, R7, 0, later)
        .store(Size::Dw, R9, FIRST as i16, R8)
        .bind(later)
        .bind(timed)
        .load(Size::Dw, R1, R9, DEADLINE as i16)
        .jump_reg(Cond::Ge, R8, R1, drop)
        // Counted only now that the frame leaves (the only writer: a plain add).
        .load_map_value(R2, p.counter_fd, 0)
        .mov(R1, R7)
        .alu_imm(Alu::Add, R1, 1)
        .store(Size::Dw, R2, 0, R1);
}

/// The paced generator's gate (registers R7–R9 are free; R6 holds the context): falls through
/// when a frame may leave now, after booking it; jumps to `drop` otherwise.
fn pace_gate(a: &mut Asm, pace_fd: i32, counter_fd: i32, drop: Label) {
    use live_pace::*;
    let no_floor = a.label();
    let keep = a.label();
    let stamped = a.label();
    a.call(Helper::KtimeGetNs)
        .mov(R7, R0)
        .load_map_value(R9, pace_fd, 0)
        .load(Size::Dw, R1, R9, DEADLINE as i16)
        .jump_reg(Cond::Ge, R7, R1, drop)
        // The limit: frames counted so far (this CPU is the counter's only writer).
        .load_map_value(R1, counter_fd, 0)
        .load(Size::Dw, R8, R1, 0)
        .load(Size::Dw, R2, R9, LIMIT as i16)
        .jump_reg(Cond::Ge, R8, R2, drop)
        // now = (ktime − base) × 1024; not yet due → drop
        .store(Size::Dw, R10, -16, R7)
        .load(Size::Dw, R1, R9, BASE as i16)
        .alu_reg(Alu::Sub, R7, R1)
        .alu_imm(Alu::Lsh, R7, 10)
        .load(Size::Dw, R8, R9, NEXT as i16)
        .jump_reg(Cond::Lt, R7, R8, drop)
        // Credit beyond one burst is not banked: next = max(next, now − slack).
        .load(Size::Dw, R1, R9, SLACK as i16)
        .jump_reg(Cond::Le, R7, R1, no_floor)
        .mov(R2, R7)
        .alu_reg(Alu::Sub, R2, R1)
        .jump_reg(Cond::Ge, R8, R2, keep)
        .mov(R8, R2)
        .bind(keep)
        .bind(no_floor)
        .load(Size::Dw, R1, R9, STEP as i16)
        .alu_reg(Alu::Add, R8, R1)
        .store(Size::Dw, R9, NEXT as i16, R8)
        // The send window, on the kernel's clock: the first frame's time once, every frame's.
        .load(Size::Dw, R2, R10, -16)
        .store(Size::Dw, R9, LAST as i16, R2)
        .load(Size::Dw, R1, R9, FIRST as i16)
        .jump_imm(Cond::Ne, R1, 0, stamped)
        .store(Size::Dw, R9, FIRST as i16, R2)
        .bind(stamped);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::bpf;

    /// One 60-byte IPv4/UDP frame with a valid checksum and the flowlane header zeroed after
    /// the magic; (frame, seq offset, checksum offset, seed).
    fn frame() -> (Vec<u8>, usize, usize, u32) {
        let mut f = vec![0u8; 60];
        f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&46u16.to_be_bytes());
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[198, 18, 0, 1]);
        ip[16..20].copy_from_slice(&[198, 18, 0, 2]);
        f[34..36].copy_from_slice(&1000u16.to_be_bytes());
        f[36..38].copy_from_slice(&9000u16.to_be_bytes());
        f[38..40].copy_from_slice(&26u16.to_be_bytes());
        f[42..44].copy_from_slice(&0xF10Eu16.to_be_bytes());
        let c = udp_sum(&f);
        f[40..42].copy_from_slice(&c.to_be_bytes());
        (
            f.clone(),
            46,
            40,
            u32::from(!u16::from_ne_bytes([f[40], f[41]])),
        )
    }

    /// The UDP checksum field `f` should hold (computed over the whole datagram with the
    /// field taken as zero).
    fn udp_sum(f: &[u8]) -> u16 {
        let mut acc: u64 = 0;
        let mut add = |b: &[u8]| {
            for w in b.chunks(2) {
                acc += u64::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
            }
        };
        add(&f[26..34]);
        add(&[0, 17]);
        add(&26u16.to_be_bytes());
        add(&f[34..40]);
        add(&f[42..60]);
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        let c = !(acc as u16);
        if c == 0 {
            0xffff
        } else {
            c
        }
    }

    /// The maps and frame both tests run the program on: the counter, a one-flow map holding
    /// the frame's entry; `None` (skipped) without CAP_BPF.
    struct Fixture {
        counter: bpf::MappedArray,
        flows: crate::maps::ArrayMap,
        entry: [u8; live_flow::VALUE_SIZE],
        f: Vec<u8>,
        seq_off: usize,
        csum_off: usize,
    }

    impl Fixture {
        /// The unpaced program for the fixture's one flow, verified and loaded.
        fn program(
            &self,
            state: &crate::maps::ArrayMap,
            one: bool,
            every: u32,
        ) -> std::os::fd::OwnedFd {
            let insns = live_tx_program(&LiveTx {
                counter_fd: self.counter.fd(),
                flows_fd: self.flows.raw_fd(),
                flows: 1,
                hdr_len: self.seq_off + 12,
                seq_off: self.seq_off,
                csum_off: self.csum_off,
                state_fd: state.raw_fd(),
                paced: false,
                one_flow: one.then_some(self.entry),
                clock_every: every,
            })
            .expect("assembles");
            bpf::prog_load(bpf::PROG_XDP, "fl_t_live", &insns).expect("verified")
        }
    }

    fn fixture() -> Option<Fixture> {
        let counter = match bpf::MappedArray::words("fl_t_live_c", 2) {
            Ok(m) => m,
            Err(e) if e.source.kind() == std::io::ErrorKind::PermissionDenied => {
                eprintln!("SKIP: needs CAP_BPF");
                return None;
            }
            Err(e) => panic!("map: {e}"),
        };
        let flows = crate::maps::ArrayMap::create("fl_t_live_f", live_flow::VALUE_SIZE, 1)
            .expect("flows map");
        let (f, seq_off, csum_off, seed) = frame();
        let mut entry = [0u8; live_flow::VALUE_SIZE];
        entry[..seq_off + 12].copy_from_slice(&f[..seq_off + 12]);
        entry[live_flow::SEED..live_flow::SEED + 4].copy_from_slice(&seed.to_ne_bytes());
        flows.set(0, &entry).expect("flow entry");
        Some(Fixture {
            counter,
            flows,
            entry,
            f,
            seq_off,
            csum_off,
        })
    }

    /// Run by the kernel's test runner (needs CAP_BPF; skipped without it) on a frame a
    /// forwarder changed in place: every frame gets its flow's headers back, the next sequence
    /// number, a checksum an independent computation agrees with, and — one reading per group
    /// of four — times that step up group by group and never go back.
    #[test]
    fn every_frame_is_stamped_with_a_valid_checksum_and_groups_share_a_reading() {
        let Some(fx) = fixture() else {
            return;
        };
        let (counter, f, seq_off, csum_off) = (&fx.counter, &fx.f, fx.seq_off, fx.csum_off);
        // The frame each run starts from, as a router that forwarded it in place left it:
        // MACs swapped, TTL decremented, the IP checksum adjusted — the program writes the
        // flow's headers back.
        let mut used = f.clone();
        used[..12].rotate_left(6);
        used[22] -= 1;
        used[24..26].fill(0x5a);
        let state = unbounded_state();
        for (every, one) in [(4u32, true), (1, false)] {
            let prog = fx.program(&state, one, every);
            let start = counter.get(0);
            let mut times = Vec::new();
            for k in 0..12u64 {
                let (ret, out) = bpf::xdp_test_run(&prog, &used).expect("test run");
                assert_eq!(ret, xdp::TX as u32);
                assert_eq!(
                    out[..csum_off],
                    f[..csum_off],
                    "the flow's headers, every {every}"
                );
                assert_eq!(out[csum_off + 2..seq_off], f[csum_off + 2..seq_off]);
                let seq = u32::from_be_bytes([
                    out[seq_off],
                    out[seq_off + 1],
                    out[seq_off + 2],
                    out[seq_off + 3],
                ]);
                assert_eq!(u64::from(seq), start + k, "every {every}");
                let mut t = [0u8; 8];
                t.copy_from_slice(&out[seq_off + 4..seq_off + 12]);
                times.push(u64::from_be_bytes(t));
                let want = udp_sum(&out);
                assert_eq!(
                    u16::from_be_bytes([out[csum_off], out[csum_off + 1]]),
                    want,
                    "frame {k}, every {every}"
                );
            }
            assert_eq!(counter.get(0), start + 12);
            assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
            assert!(times[0] > 0);
            if every == 4 {
                for g in times.chunks(4) {
                    assert!(
                        g.iter().all(|&t| t == g[0]),
                        "one reading a group: {times:?}"
                    );
                }
                assert!(times[0] < times[4] && times[4] < times[8], "{times:?}");
            }
        }
    }

    /// A run state with no deadline and no limit.
    fn unbounded_state() -> crate::maps::ArrayMap {
        let state = crate::maps::ArrayMap::create("fl_t_live_s", live_pace::VALUE_SIZE, 1)
            .expect("state map");
        set_bounds(&state, u64::MAX, u64::MAX);
        state
    }

    /// Sets the state's deadline and limit, the rest as it is.
    fn set_bounds(state: &crate::maps::ArrayMap, deadline: u64, limit: u64) {
        let mut v = state.get(0).expect("state");
        v[live_pace::DEADLINE..live_pace::DEADLINE + 8].copy_from_slice(&deadline.to_ne_bytes());
        v[live_pace::LIMIT..live_pace::LIMIT + 8].copy_from_slice(&limit.to_ne_bytes());
        state.set(0, &v).expect("state");
    }

    fn word(state: &crate::maps::ArrayMap, at: usize) -> u64 {
        let v = state.get(0).expect("state");
        u64::from_ne_bytes(v[at..at + 8].try_into().expect("8 bytes"))
    }

    /// Unpaced, the program keeps the run's bounds itself (so a run can be one long kernel
    /// call): no frame leaves, and none is counted, once the counter has reached the limit or
    /// the clock the deadline; the first frame's time and the latest reading are stamped.
    #[test]
    fn unpaced_frames_stop_at_the_limit_and_the_deadline_and_the_window_is_stamped() {
        let Some(fx) = fixture() else {
            return;
        };
        let (counter, f) = (&fx.counter, &fx.f);
        let state = unbounded_state();
        let prog = fx.program(&state, true, 4);
        let run = || bpf::xdp_test_run(&prog, f).expect("test run").0;
        // A limit of 6: six frames leave and are counted, the rest are dropped uncounted.
        set_bounds(&state, u64::MAX, 6);
        let t0 = crate::os::monotonic_ns();
        let verdicts: Vec<u32> = (0..9).map(|_| run()).collect();
        let t1 = crate::os::monotonic_ns();
        assert_eq!(verdicts[..6], [xdp::TX as u32; 6]);
        assert_eq!(verdicts[6..], [xdp::DROP as u32; 3]);
        assert_eq!(counter.get(0), 6);
        let (first, last) = (
            word(&state, live_pace::FIRST),
            word(&state, live_pace::LAST),
        );
        assert!(
            t0 <= first && first <= last && last <= t1,
            "{t0} {first} {last} {t1}"
        );
        // A deadline already passed: the frames with the group's reading from before it
        // (frames 6 and 7 of the group that began at 4) still leave; from the next reading
        // on nothing leaves or is counted.
        set_bounds(&state, crate::os::monotonic_ns(), u64::MAX);
        let verdicts: Vec<u32> = (0..5).map(|_| run()).collect();
        assert_eq!(
            verdicts,
            [
                xdp::TX as u32,
                xdp::TX as u32,
                xdp::DROP as u32,
                xdp::DROP as u32,
                xdp::DROP as u32
            ]
        );
        assert_eq!(counter.get(0), 8);
        assert!(word(&state, live_pace::LAST) >= word(&state, live_pace::DEADLINE));
        assert_eq!(word(&state, live_pace::FIRST), first, "stamped once");
    }
}
