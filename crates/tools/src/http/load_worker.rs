//! The HTTP load generator's worker: its own connections, its own epoll set, no accept or
//! dispatch thread. One request in flight per connection. Closed loop (as wrk): a connection
//! sends when its last answer came (after an optional think time). Constant rate (as wrk2):
//! each connection has a schedule of intended send times; a request whose connection is still
//! busy at its time goes out as soon as it is free, and its latency counts from the intended
//! time, so a stalled server cannot hide behind the requests it held back (coordinated
//! omission). Responses are parsed in place in one read buffer per worker (a connection keeps
//! bytes only while a head is split across reads); body bytes are counted, never copied.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowlane_io::tcp::{self, Interest, Poller};
use flowlane_wire::http::{Answer, ResponseReader};
use hdrhistogram::Histogram;
use slab::Slab;

use flowlane_runtime::{bump, counters, Poll};

counters! {
    /// What an HTTP load worker counts.
    pub struct HttpLoadStats => HttpLoadSnapshot {
        /// Connections established.
        connects,
        /// Connects refused (RST to the SYN: nothing listening, or the accept queue full).
        refused,
        /// Connects that failed otherwise (unreachable, timed out, no source port).
        connect_errors,
        /// Connections closed (by either side, for any reason).
        closes,
        /// Requests sent in full.
        requests,
        /// Complete responses.
        responses,
        /// Responses by status class.
        status_1xx,
        /// 2xx.
        status_2xx,
        /// 3xx.
        status_3xx,
        /// 4xx.
        status_4xx,
        /// 5xx.
        status_5xx,
        /// Bytes read (heads and bodies).
        rx_bytes,
        /// Reads (and drops of body bytes) that returned bytes.
        reads,
        /// Batch waits made (`LoadPlan::batch_wait`).
        batch_waits,
        /// Time spent in them, ns.
        batch_wait_ns,
        /// Answers whose latency ended at the kernel's receive timestamp (with batch waits).
        stamped,
        /// Response body bytes.
        body_bytes,
        /// Bytes sent.
        tx_bytes,
        /// Connections reset or failed while a request was in flight.
        resets,
        /// Connections the server closed before the answer was complete.
        closed_early,
        /// Requests with no complete answer within the timeout.
        timeouts,
        /// Answers complete before their request was sent in full (the server answered
        /// early, e.g. an echo streamed back or a 413): the rest of the request is not sent and
        /// the connection is closed after the answer.
        early_answers,
        /// Responses that could not be parsed.
        parse_errors,
    }
}

/// Source tuples a placed connection tries at one connect before it counts a connect error.
const BIND_TRIES: usize = 8;

/// One client pool as one worker runs it.
#[derive(Debug, Clone)]
pub struct PoolPlan {
    /// Where its connections go.
    pub target: SocketAddr,
    /// Source addresses its connections bind (round robin); empty: the kernel chooses.
    pub sources: Vec<IpAddr>,
    /// Connections placed on RSS queues: each one's source tuples (`sources` unused).
    pub placed: Option<Arc<super::place::Placed>>,
    /// This worker's connections.
    pub conns: usize,
    /// Index of this worker's first connection in the pool (for source round robin).
    pub first: usize,
    /// Whole requests (head and body), with cumulative weights.
    pub requests: Vec<(Arc<[u8]>, u64)>,
    /// Requests are `HEAD`: answers have no body.
    pub head_method: bool,
    /// Requests per second from this worker's connections (`None`: closed loop).
    pub rate: Option<f64>,
    /// Closed loop: pause between an answer and the next request.
    pub think: Duration,
    /// Connections stay open between requests.
    pub keep_alive: bool,
}

/// The run's shape, shared by all workers.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// When sending starts (every worker the same instant).
    pub start: Instant,
    /// Rate and connections grow linearly over this.
    pub ramp_up: Duration,
    /// Full rate for this long.
    pub steady: Duration,
    /// Rate falls linearly to zero over this.
    pub ramp_down: Duration,
    /// After the last phase, how long answers in flight are waited for.
    pub drain: Duration,
    /// A request without a complete answer by then is a timeout.
    pub timeout: Duration,
    /// Connects in progress at once, per worker (paces new connections so the server's
    /// accept queue does not overflow).
    pub connect_window: usize,
    /// The most one read (or one drop of body bytes) takes, bytes (at most [`READ_BUF`]; 0:
    /// that), while at least [`SMALL_READS_FROM`] answers are outstanding on the worker.
    /// Smaller reads free receive space sooner: on one host, the server's next segments then
    /// go out in the client's system calls, on the client's CPU.
    pub read_size: usize,
    /// Batch waits (zero: none): the longest a worker sleeps, with answers outstanding,
    /// before it waits on readiness — so it wakes to a batch of answers, not to each one.
    /// Steered by what each wake finds (see `ClientWorker::batch_wait`).
    pub batch_wait: Duration,
}

impl LoadPlan {
    fn end(&self) -> Duration {
        self.ramp_up + self.steady + self.ramp_down
    }

    /// The rate factor at `t` since the start: 0…1.
    fn factor(&self, t: Duration) -> f64 {
        if t < self.ramp_up {
            return (t.as_secs_f64() / self.ramp_up.as_secs_f64()).max(0.0);
        }
        let t2 = t - self.ramp_up;
        if t2 < self.steady {
            return 1.0;
        }
        let t3 = t2 - self.steady;
        if t3 < self.ramp_down {
            return 1.0 - t3.as_secs_f64() / self.ramp_down.as_secs_f64();
        }
        0.0
    }

    /// Whether `t` is in the steady phase (latency is recorded then, when there are ramps).
    fn steady_at(&self, t: Duration) -> bool {
        t >= self.ramp_up && t < self.ramp_up + self.steady
    }
}

/// Latency of one pool, in nanoseconds. Histograms a run does not need are not made (each is
/// ~230 KB): the send lag only at a constant rate, a status class only once it is seen, and
/// 2xx never (it is `intended` less the other classes).
#[derive(Debug, Clone)]
pub struct PoolLatency {
    /// From the intended send time (closed loop: the actual one) to the complete answer.
    pub intended: Histogram<u64>,
    /// From the actual send to the complete answer.
    pub actual: Histogram<u64>,
    /// Constant rate: how late requests left (actual − intended).
    pub lag: Option<Histogram<u64>>,
    /// `intended` of answers with status 1xx, 3xx, 4xx, 5xx (index: class − 1; 2xx unused).
    pub by_class: [Option<Histogram<u64>>; 5],
    /// Answers in these histograms (all, or with ramps those to requests sent in the steady
    /// phase): what the pool's rates count.
    pub answers: u64,
    /// Their body bytes.
    pub body_bytes: u64,
}

/// An empty histogram from 1 ns at 3 significant digits that grows to the largest value it
/// is given. Made for 1 ns … 100 s at once it holds 28 672 counters (229 KiB), and a pool has
/// two per worker (issue 49: 5 000 pools took 4.4 GB before a request went out); grown as
/// values come it starts at 2 048 (16 KiB) and reaches ~90 KiB for answers within 1 ms. A
/// resize is a rare allocation on the answer path, once per doubling of the largest latency.
pub fn histogram() -> Histogram<u64> {
    let mut h = Histogram::new_with_bounds(1, 2, 3)
        .unwrap_or_else(|_| unreachable!("constant, valid bounds"));
    h.auto(true);
    h
}

/// Bytes a [`histogram`] holding values up to `max_ns` may take at most: its counters with the
/// spare room of a vector grown by doubling (from 2 048, so a power of two).
pub fn histogram_bytes(max_ns: u64) -> u64 {
    let mut h = histogram();
    let _ = h.record(max_ns.max(2));
    (h.distinct_values().next_power_of_two() * std::mem::size_of::<u64>()) as u64
}

fn add(into: &mut Option<Histogram<u64>>, from: &Option<Histogram<u64>>) {
    if let Some(f) = from {
        let _ = into.get_or_insert_with(histogram).add(f);
    }
}

impl PoolLatency {
    /// Empty histograms.
    pub fn new() -> PoolLatency {
        PoolLatency {
            intended: histogram(),
            actual: histogram(),
            lag: None,
            by_class: [None, None, None, None, None],
            answers: 0,
            body_bytes: 0,
        }
    }

    /// Adds another worker's.
    pub fn merge(&mut self, o: &PoolLatency) {
        let _ = self.intended.add(&o.intended);
        let _ = self.actual.add(&o.actual);
        add(&mut self.lag, &o.lag);
        for (a, b) in self.by_class.iter_mut().zip(&o.by_class) {
            add(a, b);
        }
        self.answers += o.answers;
        self.body_bytes += o.body_bytes;
    }

    /// Latency by status class (index: class − 1), 2xx included: `intended` less the others.
    pub fn classes(&self) -> [Option<Histogram<u64>>; 5] {
        let mut out = self.by_class.clone();
        let mut ok = self.intended.clone();
        for h in self.by_class.iter().flatten() {
            let _ = ok.subtract(h);
        }
        out[1] = (!ok.is_empty()).then_some(ok);
        out
    }
}

impl Default for PoolLatency {
    fn default() -> Self {
        PoolLatency::new()
    }
}

/// What a worker hands back when it ends (its report, through the runtime's join).
#[derive(Debug, Default)]
pub struct WorkerEnd {
    /// Its histograms, one per pool.
    pub latency: Vec<PoolLatency>,
    /// The first error it met, in words (what the counters cannot say: why).
    pub first_error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not connected; (re)connect from then (ns).
    Closed(u64),
    Connecting,
    Idle,
    /// A request sent (or still being sent: [`Conn::unsent`]), its answer being read: an
    /// answer may begin before the request ends.
    Reading(ResponseReader),
}

#[derive(Debug)]
struct Conn {
    pool: usize,
    /// Index in its pool (source address choice).
    index: usize,
    stream: Option<TcpStream>,
    state: State,
    carry: Vec<u8>,
    /// Which request is in flight.
    req: usize,
    /// The bytes of it written so far while it is being written; `None` once sent in full.
    unsent: Option<usize>,
    intended: u64,
    sent_at: u64,
    /// Constant rate: when the next request is due; closed loop: earliest next send.
    next_due: u64,
    /// Connections closed after each answer (keep-alive off, or the server said close).
    close_after: bool,
    writing: bool,
    /// Placed connections: connects made so far (which of its source tuples is next).
    cursor: usize,
}

/// One load worker.
#[derive(Debug)]
pub struct ClientWorker {
    pools: Vec<PoolPlan>,
    plan: LoadPlan,
    poller: Poller,
    conns: Slab<Conn>,
    scratch: Vec<u8>,
    /// The most one read takes (≤ `scratch.len()`).
    read_size: usize,
    ready: usize,
    timers: BinaryHeap<Reverse<(u64, usize)>>,
    connecting: usize,
    /// Connections not yet opened, per pool (opened as the ramp and the window allow).
    unopened: Vec<usize>,
    lat: Vec<PoolLatency>,
    /// `--metrics`: the latency from the intended send, over the pools, as it goes.
    latency: flowlane_runtime::latency::Publisher,
    rng: u64,
    last_scan: u64,
    closing: Vec<usize>,
    in_flight: usize,
    ramps: bool,
    finished: bool,
    /// Every pool is closed loop (batch waits apply only then).
    closed_loop: bool,
    /// Batch waits: answers and bytes read so far, and how the next wait is sized.
    pace: AnswerPace,
    /// With batch waits: the kernel's receive timestamps end each latency (see [`StampClock`]).
    stamps: Option<StampClock>,
    /// The read being handled carried a receive timestamp (its answers' latency ends there):
    /// when the read was made, which is when their connections' next requests go.
    stamp_read: Option<u64>,
    /// The first error met, in words, for the report.
    first_error: Option<String>,
}

/// Turns the kernel's receive timestamps (`CLOCK_REALTIME`) into the worker's clock (ns since
/// the plan's start, monotonic). With batch waits a client reads an answer up to a wait after
/// it came; its latency then ends when the kernel received the answer's last segment, not when
/// the client got round to reading it.
#[derive(Debug, Clone, Copy)]
struct StampClock {
    /// `CLOCK_REALTIME` at `mono`, ns since the epoch.
    real: u64,
    /// The worker's clock at the same moment (negative before the start).
    mono: i128,
}

impl StampClock {
    fn now(start: Instant) -> StampClock {
        let t = Instant::now();
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, ns);
        let mono = if t >= start {
            ns(t - start) as i128
        } else {
            -(ns(start - t) as i128)
        };
        StampClock { real, mono }
    }

    /// A receive timestamp on the worker's clock (0 if before the start).
    fn at(&self, stamp: u64) -> u64 {
        (stamp as i128 - self.real as i128 + self.mono).clamp(0, u64::MAX as i128) as u64
    }
}

/// Batch waits apply only while answers average less than this (bytes read per answer). With
/// larger answers, on one host, a client's reads are what move the server's sending onto the
/// client's CPU, and a client that sleeps leaves it all to the server's core: at 64 KiB × 100
/// connections batch waits made 41–44 k answers/s against 54–59 k without (BENCHMARKS.md).
pub const BATCH_ANSWERS_BELOW: u64 = 16 * 1024;

/// What a batch wait is sized from: how many answers the last one found, and how large answers
/// are.
#[derive(Debug, Default)]
struct AnswerPace {
    answers: u64,
    bytes: u64,
    /// The next wait, ns (0: not started; it then starts at [`BATCH_WAIT_MIN`]).
    next: u64,
    /// Answers outstanding when the last wait began (0: the last sleep was no batch wait).
    outstanding: usize,
    /// Sleeps to make without a batch wait: the shortest one still found nearly everything in,
    /// so the server is faster than this client; every so often one is tried again.
    rest: u32,
    /// This poll round follows a batch wait.
    woke: bool,
    /// Waits made and ns slept, not yet added to the worker's counters.
    waits: u64,
    slept_ns: u64,
}

/// The shortest batch wait, ns: where the wait shrinks to when every wake finds (nearly) all
/// answers in — a server faster than the client, which must not be kept waiting.
const BATCH_WAIT_MIN: u64 = 5_000;

/// Sleeps without a batch wait after the shortest one found nearly every answer in.
const BATCH_REST: u32 = 64;

/// The worker's read buffer, bytes: the most one read takes.
pub const READ_BUF: usize = 64 * 1024;

/// `read_size` applies while at least this many answers are outstanding on the worker. With
/// fewer, the server is waiting for this client's next requests, and whole reads send them
/// sooner: at 64 KiB × 10 connections on one host, 4 KiB reads throughout made 42–57 k
/// answers/s against 57–62 k with this rule (BENCHMARKS.md); from 100 connections up the
/// small reads are what raise the server's rate.
pub const SMALL_READS_FROM: usize = 64;

/// A body with at least this much left is dropped in the kernel (`MSG_TRUNC`), not read.
const DISCARD_MIN: u64 = 2048;
/// A read while a head is awaited takes at most this much, so most of a large body is left to
/// be dropped rather than copied.
const HEAD_READ: usize = 4096;

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

impl ClientWorker {
    /// A worker running `pools` by `plan`; its histograms are its report when it ends.
    pub fn new(
        pools: Vec<PoolPlan>,
        plan: LoadPlan,
        seed: u64,
    ) -> Result<ClientWorker, flowlane_io::SysError> {
        let total: usize = pools.iter().map(|p| p.conns).sum();
        let read_size = match plan.read_size {
            0 => READ_BUF,
            n => n.min(READ_BUF),
        };
        // Made on the worker's thread: its timed waits end when asked, not up to 50 µs later.
        flowlane_io::os::set_timer_slack_ns(1)?;
        let stamps = (!plan.batch_wait.is_zero()).then(|| StampClock::now(plan.start));
        Ok(ClientWorker {
            unopened: pools.iter().map(|p| p.conns).collect(),
            lat: pools.iter().map(|_| PoolLatency::new()).collect(),
            ramps: !plan.ramp_up.is_zero() || !plan.ramp_down.is_zero(),
            closed_loop: pools.iter().all(|p| p.rate.is_none()),
            pools,
            plan,
            poller: Poller::new(512)?,
            conns: Slab::with_capacity(total),
            scratch: vec![0; READ_BUF],
            read_size,
            ready: 0,
            timers: BinaryHeap::new(),
            connecting: 0,
            latency: flowlane_runtime::latency::Publisher::default(),
            rng: seed | 1,
            last_scan: 0,
            closing: Vec::new(),
            in_flight: 0,
            finished: false,
            pace: AnswerPace::default(),
            stamps,
            stamp_read: None,
            first_error: None,
        })
    }

    /// Publishes the latency from the intended send (all pools) into `share` as it goes
    /// (`--metrics`).
    pub fn with_latency_share(
        mut self,
        share: flowlane_runtime::latency::LatencyShare,
    ) -> ClientWorker {
        self.latency = flowlane_runtime::latency::Publisher::to(share);
        self
    }

    fn now(&self) -> u64 {
        ns(self.plan.start.elapsed())
    }

    fn sending(&self, now: u64) -> bool {
        now < ns(self.plan.end())
    }

    /// Opens connections the ramp allows, up to the connect window.
    fn open_more(&mut self, now: u64, st: &HttpLoadStats) {
        if !self.sending(now) {
            return;
        }
        let f = if self.plan.ramp_up.is_zero() {
            1.0
        } else {
            (now as f64 / ns(self.plan.ramp_up) as f64).min(1.0)
        };
        for p in 0..self.pools.len() {
            let want = (self.pools[p].conns as f64 * f).ceil() as usize;
            while self.unopened[p] > 0
                && self.pools[p].conns - self.unopened[p] < want
                && self.connecting < self.plan.connect_window
            {
                let index = self.pools[p].first + self.pools[p].conns - self.unopened[p];
                self.unopened[p] -= 1;
                let key = self.conns.insert(Conn {
                    pool: p,
                    index,
                    stream: None,
                    state: State::Closed(0),
                    carry: Vec::new(),
                    req: 0,
                    unsent: None,
                    intended: 0,
                    sent_at: 0,
                    next_due: 0,
                    close_after: !self.pools[p].keep_alive,
                    writing: false,
                    cursor: 0,
                });
                self.first_due(key, now);
                self.connect(key, now, st);
            }
        }
    }

    /// Spreads the connections' first requests evenly over one interval.
    fn first_due(&mut self, key: usize, now: u64) {
        let c = &self.conns[key];
        let p = &self.pools[c.pool];
        if let Some(rate) = p.rate {
            let per_conn = rate / p.conns.max(1) as f64;
            let interval = 1e9 / per_conn.max(1e-9);
            let slot = (c.index - p.first) as f64 / p.conns.max(1) as f64;
            self.conns[key].next_due = now + (interval * slot) as u64;
        } else {
            self.conns[key].next_due = now;
        }
    }

    fn connect(&mut self, key: usize, now: u64, st: &HttpLoadStats) {
        let c = &self.conns[key];
        let p = &self.pools[c.pool];
        let made = match &p.placed {
            Some(placed) => {
                // Its source tuples in turn, the next one where a tuple is busy (bound by
                // another socket, or this 4-tuple still in TIME_WAIT).
                let mine = placed.per_conn.get(c.index).map_or(&[][..], Vec::as_slice);
                let mut cursor = c.cursor;
                let mut made = Err(std::io::Error::from(std::io::ErrorKind::AddrNotAvailable));
                for _ in 0..mine.len().min(BIND_TRIES) {
                    let from = mine[cursor % mine.len()];
                    cursor = cursor.wrapping_add(1);
                    made = tcp::connect(Some(from), p.target);
                    match &made {
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::AddrInUse
                                    | std::io::ErrorKind::AddrNotAvailable
                            ) => {}
                        _ => break,
                    }
                }
                self.conns[key].cursor = cursor;
                made
            }
            None => {
                let src = (!p.sources.is_empty())
                    .then(|| SocketAddr::new(p.sources[c.index % p.sources.len()], 0));
                tcp::connect(src, p.target)
            }
        };
        match made {
            Ok(s) => {
                if let Err(e) = self.poller.add(&s, key as u64, Interest::BOTH) {
                    bump(&st.connect_errors, 1);
                    self.note(key, |t| {
                        format!("watching a connection to {t} (epoll): {e}")
                    });
                    self.conns[key].state = State::Closed(now + 10_000_000);
                    return;
                }
                if self.stamps.is_some() {
                    // If refused, its latencies end at the read (`stamped` counts the others).
                    let _ = tcp::set_rx_timestamps(&s);
                }
                let c = &mut self.conns[key];
                c.stream = Some(s);
                c.sent_at = now;
                c.state = State::Connecting;
                c.writing = true;
                self.connecting += 1;
            }
            Err(e) => {
                self.connect_failed(key, &e, now, st);
            }
        }
    }

    /// Keeps the first error's words (`what` is made only for the first).
    fn note(&mut self, key: usize, what: impl FnOnce(SocketAddr) -> String) {
        if self.first_error.is_none() {
            if let Some(c) = self.conns.get(key) {
                self.first_error = Some(what(self.pools[c.pool].target));
            }
        }
    }

    fn connect_failed(&mut self, key: usize, e: &io::Error, now: u64, st: &HttpLoadStats) {
        self.note(key, |t| format!("connect to {t}: {e}"));
        if e.kind() == io::ErrorKind::ConnectionRefused {
            bump(&st.refused, 1);
        } else {
            bump(&st.connect_errors, 1);
        }
        let c = &mut self.conns[key];
        if let Some(s) = c.stream.take() {
            let _ = self.poller.delete(&s);
        }
        // Try again a little later, so a dead server is not hammered in a tight loop.
        c.state = State::Closed(now + 10_000_000);
        self.timers.push(Reverse((now + 10_000_000, key)));
    }

    fn pick(&mut self, pool: usize) -> usize {
        let reqs = &self.pools[pool].requests;
        if reqs.len() == 1 {
            return 0;
        }
        // xorshift64*: enough to spread URLs by weight.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let total = reqs.last().map(|r| r.1).unwrap_or(1).max(1);
        let x = r % total;
        reqs.iter().position(|(_, w)| x < *w).unwrap_or(0)
    }

    /// Sends the next request on an idle connection.
    fn send(&mut self, key: usize, now: u64, st: &HttpLoadStats) {
        let pool = self.conns[key].pool;
        let req = self.pick(pool);
        let rate = self.pools[pool].rate;
        let c = &mut self.conns[key];
        c.req = req;
        c.sent_at = now;
        if let Some(rate) = rate {
            c.intended = c.next_due;
            let p = &self.pools[pool];
            let per_conn = rate / p.conns.max(1) as f64;
            let f = self.plan.factor(Duration::from_nanos(c.next_due)).max(0.05);
            c.next_due += (1e9 / (per_conn * f).max(1e-9)) as u64;
        } else {
            c.intended = now;
        }
        self.in_flight += 1;
        c.state = State::Reading(ResponseReader::new(self.pools[pool].head_method));
        c.unsent = Some(0);
        self.write_more(key, st);
    }

    fn write_more(&mut self, key: usize, st: &HttpLoadStats) {
        let c = &mut self.conns[key];
        let Some(mut done) = c.unsent else {
            return;
        };
        let bytes: &[u8] = &self.pools[c.pool].requests[c.req].0;
        let Some(s) = c.stream.as_mut() else { return };
        while done < bytes.len() {
            match s.write(&bytes[done..]) {
                Ok(n) => {
                    bump(&st.tx_bytes, n as u64);
                    done += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    bump(&st.resets, 1);
                    self.closing.push(key);
                    self.note(key, |t| format!("sending to {t}: {e}"));
                    return;
                }
            }
        }
        let want_write = done < bytes.len();
        c.unsent = if want_write {
            Some(done)
        } else {
            bump(&st.requests, 1);
            None
        };
        if want_write != c.writing {
            c.writing = want_write;
            let i = if want_write {
                Interest::BOTH
            } else {
                Interest::READ
            };
            if self.poller.modify(s, key as u64, i).is_err() {
                self.closing.push(key);
            }
        }
    }

    /// An answer completed at `now` (its latency ends there).
    fn complete(&mut self, key: usize, answer: Answer, now: u64, st: &HttpLoadStats) {
        let (status, keep) = (answer.status, answer.keep_alive);
        bump(&st.responses, 1);
        if self.stamp_read.is_some() {
            bump(&st.stamped, 1);
        }
        self.pace.answers += 1;
        self.in_flight -= 1;
        let c = &mut self.conns[key];
        let class = (status / 100).clamp(1, 5) as usize - 1;
        bump(
            match class {
                0 => &st.status_1xx,
                1 => &st.status_2xx,
                2 => &st.status_3xx,
                3 => &st.status_4xx,
                _ => &st.status_5xx,
            },
            1,
        );
        if !self.ramps || self.plan.steady_at(Duration::from_nanos(c.intended)) {
            let l = &mut self.lat[c.pool];
            l.answers += 1;
            l.body_bytes += answer.body;
            let total = now.saturating_sub(c.intended).max(1);
            let _ = l.intended.record(total);
            let _ = l.actual.record(now.saturating_sub(c.sent_at).max(1));
            if class != 1 {
                let _ = l.by_class[class]
                    .get_or_insert_with(histogram)
                    .record(total);
            }
            if self.pools[c.pool].rate.is_some() {
                let lag = c.sent_at.saturating_sub(c.intended).max(1);
                let _ = l.lag.get_or_insert_with(histogram).record(lag);
            }
        }
        c.state = State::Idle;
        if c.unsent.take().is_some() {
            // What the server made of the rest is unknown: the connection ends here.
            bump(&st.early_answers, 1);
            c.close_after = true;
        }
        if !keep || c.close_after {
            self.closing.push(key);
            return;
        }
        // The next request goes from now, not from when the answer arrived.
        let now = self.stamp_read.unwrap_or(now);
        let think = self.pools[c.pool].think;
        if self.pools[c.pool].rate.is_none() {
            c.next_due = now + ns(think);
        }
        self.due(key, now, st);
    }

    /// An idle connection: send now if its next request is due, else set a timer.
    fn due(&mut self, key: usize, now: u64, st: &HttpLoadStats) {
        let due = self.conns[key].next_due;
        if !self.sending(now) || !self.sending(due) {
            return;
        }
        if due <= now {
            self.send(key, now, st);
        } else {
            self.timers.push(Reverse((due, key)));
        }
    }

    fn readable(&mut self, key: usize, st: &HttpLoadStats) {
        // A read that filled its buffer may have left more waiting: go on, a few times.
        for _ in 0..4 {
            if !self.read_once(key, st) {
                return;
            }
        }
    }

    /// One read (or one drop of body bytes); whether it filled what it asked for.
    fn read_once(&mut self, key: usize, st: &HttpLoadStats) -> bool {
        self.stamp_read = None;
        let c = &mut self.conns[key];
        let Some(s) = c.stream.as_mut() else {
            return false;
        };
        let discard = match c.state {
            State::Reading(r) if c.carry.is_empty() => r.fixed_left().filter(|&l| l >= DISCARD_MIN),
            _ => None,
        };
        // Small reads only while the server has plenty to do (see `SMALL_READS_FROM`).
        let rs = if self.in_flight >= SMALL_READS_FROM {
            self.read_size
        } else {
            READ_BUF
        };
        let want = match (discard, c.state) {
            (Some(left), _) => (left as usize).min(rs),
            (None, State::Reading(r)) if r.in_head() => HEAD_READ.min(rs),
            _ => rs,
        };
        // Stamped reads (`recvmsg` with a control message) only in the round after a batch
        // wait, where answers may have waited for the client; elsewhere a read is as soon as
        // the client could and a plain one (measured: stamping every read cost 6–16 % of the
        // answers where the client is the limit).
        let r = match (discard, self.stamps.is_some() && self.pace.woke) {
            (d, true) => tcp::read_stamped(s, &mut self.scratch[..want], d.is_some()),
            (Some(_), false) => tcp::discard(s, &mut self.scratch[..want]).map(|n| (n, None)),
            (None, false) => s.read(&mut self.scratch[..want]).map(|n| (n, None)),
        };
        let (n, stamp) = match r {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) => {
                if matches!(c.state, State::Reading(_)) {
                    bump(&st.resets, 1);
                    self.note(key, |t| format!("reading from {t}: {e}"));
                }
                self.closing.push(key);
                return false;
            }
        };
        let now = self.now();
        if n == 0 {
            if let State::Reading(mut r) = self.conns[key].state {
                match r.closed() {
                    Some(answer) => {
                        self.conns[key].close_after = true;
                        self.complete(key, answer, now, st);
                    }
                    None => {
                        bump(&st.closed_early, 1);
                        self.note(key, |t| {
                            format!("{t} closed the connection before its answer was complete")
                        });
                    }
                }
            }
            self.closing.push(key);
            return false;
        }
        bump(&st.rx_bytes, n as u64);
        bump(&st.reads, 1);
        self.pace.bytes += n as u64;
        // Answers this read completes end where the kernel received their last segment, when
        // it said (never later than now: the clocks are read apart).
        let now = match (stamp, self.stamps) {
            (Some(t), Some(clock)) => {
                self.stamp_read = Some(now);
                clock.at(t).min(now)
            }
            _ => now,
        };
        if discard.is_some() {
            // Body bytes dropped in the kernel: counted, never copied.
            bump(&st.body_bytes, n as u64);
            if let State::Reading(mut r) = self.conns[key].state {
                let ended = r.skipped(n as u64);
                self.conns[key].state = State::Reading(r);
                if let Some(answer) = ended {
                    self.complete(key, answer, now, st);
                }
            }
            return n == want;
        }
        let scratch = std::mem::take(&mut self.scratch);
        let carry = std::mem::take(&mut self.conns[key].carry);
        if carry.is_empty() {
            let used = self.responses(key, &scratch[..n], now, st);
            if used < n {
                self.conns[key].carry = scratch[used..n].to_vec();
            }
        } else {
            let mut all = carry;
            all.extend_from_slice(&scratch[..n]);
            let used = self.responses(key, &all, now, st);
            all.drain(..used);
            self.conns[key].carry = all;
        }
        self.scratch = scratch;
        n == want
    }

    /// Walks answers in `data`; returns the bytes used (the rest is a head split across reads).
    fn responses(&mut self, key: usize, data: &[u8], now: u64, st: &HttpLoadStats) -> usize {
        let mut at = 0;
        while at < data.len() {
            let State::Reading(mut r) = self.conns[key].state else {
                bump(&st.parse_errors, 1);
                self.closing.push(key);
                self.note(key, |t| format!("{t} sent bytes no request asked for"));
                return data.len();
            };
            match r.read(&data[at..]) {
                Ok(step) => {
                    at += step.used;
                    bump(&st.body_bytes, step.body);
                    self.conns[key].state = State::Reading(r);
                    match step.answer {
                        Some(answer) => self.complete(key, answer, now, st),
                        None => return at,
                    }
                }
                Err(e) => {
                    bump(&st.parse_errors, 1);
                    self.closing.push(key);
                    self.note(key, |t| format!("answer from {t}: {e}"));
                    return data.len();
                }
            }
        }
        at
    }

    fn writable(&mut self, key: usize, now: u64, st: &HttpLoadStats) {
        match self.conns[key].state {
            State::Connecting => {
                self.connecting -= 1;
                let r = match &self.conns[key].stream {
                    Some(s) => tcp::connect_result(s),
                    None => Err(io::Error::from(io::ErrorKind::NotConnected)),
                };
                match r {
                    Ok(()) => {
                        bump(&st.connects, 1);
                        let c = &mut self.conns[key];
                        c.state = State::Idle;
                        c.writing = false;
                        if let Some(s) = &c.stream {
                            if self.poller.modify(s, key as u64, Interest::READ).is_err() {
                                self.closing.push(key);
                                return;
                            }
                        }
                        self.due(key, now, st);
                    }
                    Err(e) => self.connect_failed(key, &e, now, st),
                }
            }
            State::Reading(_) => self.write_more(key, st),
            _ => {}
        }
    }

    /// Closes connections marked this round; reconnects them while sending.
    fn reap(&mut self, now: u64, st: &HttpLoadStats) {
        while let Some(key) = self.closing.pop() {
            let Some(c) = self.conns.get_mut(key) else {
                continue;
            };
            let Some(s) = c.stream.take() else { continue };
            let _ = self.poller.delete(&s);
            drop(s);
            if matches!(c.state, State::Connecting) {
                self.connecting -= 1;
            } else {
                bump(&st.closes, 1);
            }
            if matches!(c.state, State::Reading(_)) {
                self.in_flight -= 1;
            }
            c.state = State::Closed(now);
            c.unsent = None;
            c.carry = Vec::new();
            c.close_after = !self.pools[c.pool].keep_alive;
            if self.sending(now) {
                self.timers.push(Reverse((now, key)));
            }
        }
    }

    fn timers(&mut self, now: u64, st: &HttpLoadStats) -> usize {
        let mut n = 0;
        while let Some(&Reverse((due, key))) = self.timers.peek() {
            if due > now {
                break;
            }
            self.timers.pop();
            n += 1;
            let Some(c) = self.conns.get(key) else {
                continue;
            };
            match c.state {
                State::Idle if c.next_due <= now => self.send(key, now, st),
                State::Closed(at) if at <= now && self.sending(now) => {
                    if self.connecting < self.plan.connect_window {
                        self.connect(key, now, st);
                    } else {
                        self.timers.push(Reverse((now + 1_000_000, key)));
                    }
                }
                _ => {}
            }
        }
        n
    }

    /// Requests in flight past the timeout are given up (their connections closed).
    fn scan_timeouts(&mut self, now: u64, st: &HttpLoadStats) {
        if now < self.last_scan + 100_000_000 {
            return;
        }
        self.last_scan = now;
        let limit = ns(self.plan.timeout);
        let mut first: Option<(usize, &str)> = None;
        for (key, c) in self.conns.iter() {
            let late = now.saturating_sub(c.sent_at) > limit;
            match c.state {
                State::Reading(_) if late => {
                    bump(&st.timeouts, 1);
                    self.closing.push(key);
                    first.get_or_insert((key, "no complete answer from"));
                }
                State::Connecting if late => {
                    bump(&st.connect_errors, 1);
                    self.closing.push(key);
                    first.get_or_insert((key, "no answer to the connect from"));
                }
                _ => {}
            }
        }
        if let Some((key, what)) = first {
            let secs = self.plan.timeout.as_secs_f64();
            self.note(key, |t| format!("{what} {t} within the timeout ({secs} s)"));
        }
    }

    fn next_timer(&self) -> Option<u64> {
        self.timers.peek().map(|Reverse((d, _))| *d)
    }
}

impl ClientWorker {
    /// A batch wait, before the worker sleeps on readiness (`LoadPlan::batch_wait`): with
    /// answers outstanding, sleep first, so the next wake finds a batch of answers rather than
    /// one — and the server's sends find no sleeping reader to wake. The wait is steered by
    /// what each wake finds ([`ClientWorker::batch_found`]): between 50 % and 80 % of what was
    /// outstanding (against one nginx worker at 100 connections that made 1.5–1.7× wrk's
    /// answers per CPU second, where 30–60 % made 1.4–1.6×, at the same requests/s). Only in
    /// a closed loop, with [`SMALL_READS_FROM`] or more answers outstanding (with fewer the
    /// server would idle while the client sleeps) and answers under [`BATCH_ANSWERS_BELOW`] on
    /// average.
    fn batch_wait(&mut self) {
        if self.plan.batch_wait.is_zero()
            || !self.closed_loop
            || self.in_flight < SMALL_READS_FROM
            || self.pace.bytes >= self.pace.answers.saturating_mul(BATCH_ANSWERS_BELOW)
        {
            return;
        }
        let now = self.now();
        let p = &mut self.pace;
        if p.rest > 0 {
            p.rest -= 1;
            return;
        }
        if p.next == 0 {
            p.next = BATCH_WAIT_MIN;
        }
        let mut d = p.next.min(ns(self.plan.batch_wait));
        if let Some(t) = self.timers.peek().map(|Reverse((t, _))| *t) {
            d = d.min(t.saturating_sub(now));
        }
        d = d.min(ns(self.plan.end()).saturating_sub(now));
        if d == 0 {
            return;
        }
        std::thread::sleep(Duration::from_nanos(d));
        p.waits += 1;
        p.slept_ns += d;
        p.woke = true;
        p.outstanding = self.in_flight;
        // The receive timestamps' clock (CLOCK_REALTIME) may be slewed against the monotonic
        // one over a long run: their offset is read again at every wake.
        if let Some(c) = self.stamps.as_mut() {
            *c = StampClock::now(self.plan.start);
        }
    }

    /// After a batch wait, `ready` connections were found ready: found more than 80 % of what
    /// was outstanding (as many as one wait reports, at most), the server may have had time to
    /// spare and the next wait is shorter; found under 50 %, it is longer (up to the asked-for
    /// most). Multiplicative steps of a quarter: it settles within a few dozen waits. When
    /// even the shortest wait found nearly everything in, the next [`BATCH_REST`] sleeps make
    /// none (measured against `http serve`, which answers faster than a client can ask: 5 µs
    /// waits on every sleep cost 6 % of the answers).
    fn batch_found(&mut self, ready: usize) {
        let p = &mut self.pace;
        let was = std::mem::take(&mut p.outstanding).min(self.poller.capacity());
        if was == 0 {
            return;
        }
        if ready * 10 > was * 8 {
            if p.next <= BATCH_WAIT_MIN {
                p.rest = BATCH_REST;
            }
            p.next = (p.next - p.next / 4).max(BATCH_WAIT_MIN);
        } else if ready * 10 < was * 5 {
            p.next = (p.next + p.next / 4).min(ns(self.plan.batch_wait));
        }
    }
}

impl Poll for ClientWorker {
    type Stats = HttpLoadStats;
    type Report = WorkerEnd;

    fn poll(
        &mut self,
        budget: usize,
        st: &HttpLoadStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        if self.pace.waits > 0 {
            bump(&st.batch_waits, std::mem::take(&mut self.pace.waits));
            bump(&st.batch_wait_ns, std::mem::take(&mut self.pace.slept_ns));
        }
        self.ready = self
            .poller
            .ready_now(self.ready)
            .map_err(|e| e.to_string())?;
        self.batch_found(self.ready);
        let mut handled = 0;
        let now = self.now();
        for i in 0..self.ready.min(budget) {
            let Some(ev) = self.poller.get(i) else { break };
            handled += 1;
            let key = ev.token as usize;
            if !self.conns.contains(key) || self.closing.contains(&key) {
                continue;
            }
            if ev.writable && self.conns[key].writing {
                self.writable(key, now, st);
            }
            if ev.readable && !self.closing.contains(&key) && self.conns[key].stream.is_some() {
                self.readable(key, st);
            }
        }
        self.ready = 0;
        self.pace.woke = false;
        let now = self.now();
        self.reap(now, st);
        handled += self.timers(now, st);
        self.open_more(now, st);
        self.scan_timeouts(now, st);
        self.reap(now, st);
        let end = ns(self.plan.end());
        if now >= end && (self.in_flight == 0 || now >= end + ns(self.plan.drain)) {
            self.finished = true;
        }
        Ok(handled)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        self.batch_wait();
        let now = self.now();
        let mut t = Duration::from_millis(timeout_ms.max(0) as u64);
        if let Some(d) = self.next_timer() {
            t = t.min(Duration::from_nanos(d.saturating_sub(now)));
        }
        let end = ns(self.plan.end());
        if now < end {
            t = t.min(Duration::from_nanos(end - now));
        }
        self.ready = self.poller.wait(t).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn done(&self) -> bool {
        self.finished
    }

    fn publish(&mut self, last: bool) {
        let now = self.now();
        if !self.latency.due(now, last) {
            return;
        }
        match self.lat.as_slice() {
            [one] => self.latency.offer(now, last, &one.intended),
            pools => {
                let mut all = histogram();
                for p in pools {
                    let _ = all.add(&p.intended);
                }
                self.latency.offer(now, last, &all);
            }
        }
    }

    fn finish(&mut self, st: &HttpLoadStats) -> Option<WorkerEnd> {
        bump(&st.batch_waits, std::mem::take(&mut self.pace.waits));
        bump(&st.batch_wait_ns, std::mem::take(&mut self.pace.slept_ns));
        let open = self
            .conns
            .iter()
            .filter(|(_, c)| c.stream.is_some() && c.state != State::Connecting)
            .count();
        bump(&st.closes, open as u64);
        self.conns.clear();
        Some(WorkerEnd {
            latency: std::mem::take(&mut self.lat),
            first_error: self.first_error.take(),
        })
    }
}
