//! The HTTP server's worker: its own `SO_REUSEPORT` listener (steered so connections land on
//! the CPU their packets are processed on), its own epoll set, its connections. Requests are
//! parsed in place in one read buffer per worker; a connection keeps bytes only while a head is
//! split across reads or its answer does not fit the socket. Bodies up to
//! [`Bodies::copy_max`] go out from one prebuilt pattern buffer (`write`); larger ones with
//! `sendfile` from a memfd holding the pattern, so no byte of them is copied in user space.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowlane_io::tcp::{self, Interest, Poller};
use flowlane_wire::http::{
    self as h, Ask, BodyLen, HeadError, MessageError, RequestReader, RequestStep,
};
use slab::Slab;

use flowlane_runtime::{bump, counters, Poll};

counters! {
    /// What an HTTP server worker counts.
    pub struct HttpServeStats => HttpServeSnapshot {
        /// Connections accepted.
        accepted,
        /// Connections closed (by either side).
        closed,
        /// Accepted connections whose last packet was processed on another CPU
        /// (`SO_INCOMING_CPU` right after accept).
        missteered,
        /// Requests read (heads complete).
        requests,
        /// Answers with a 2xx status.
        status_2xx,
        /// Answers with a 4xx status (bad request, not found, too large).
        status_4xx,
        /// Answers with a 5xx status (not implemented).
        status_5xx,
        /// Bytes read from connections (heads and bodies).
        rx_bytes,
        /// Request body bytes read.
        body_rx_bytes,
        /// Bytes sent (heads and bodies).
        tx_bytes,
        /// Of those, body bytes sent by `sendfile` (never copied in user space).
        sendfile_bytes,
        /// Heads that could not be parsed (answered 400 or 431, then closed).
        parse_errors,
        /// Connections reset by the peer or failed while reading or writing.
        io_errors,
        /// Accepts refused for want of a descriptor (EMFILE/ENFILE) or memory.
        accept_errors,
        /// Connections whose request head did not arrive whole within the header timeout
        /// (answered 408, then closed).
        header_timeouts,
        /// Connections closed after no byte in or out for the idle timeout.
        idle_closed,
        /// Idle connections closed to make room when the file table was full.
        evicted,
    }
}

/// The response bodies every worker sends from.
#[derive(Debug)]
pub struct Bodies {
    /// The pattern, `copy_max` bytes long: bodies up to that size are written from it.
    pattern: Vec<u8>,
    /// A memfd holding `file_len` bytes of the pattern: larger bodies are sent from it.
    file: File,
    file_len: u64,
}

impl Bodies {
    /// Bodies up to `copy_max` are copied from a buffer; larger ones, up to `file_len`, are
    /// sent from a memfd with `sendfile`.
    pub fn new(copy_max: usize, file_len: u64) -> Result<Bodies, flowlane_io::SysError> {
        let file_len = file_len.max(copy_max as u64);
        let contents = h::body(usize::try_from(file_len).unwrap_or(usize::MAX));
        let file = tcp::memfd_with(c"flowlane-http-body", &contents)?;
        Ok(Bodies {
            pattern: contents[..copy_max].to_vec(),
            file,
            file_len,
        })
    }

    /// The largest body answered (bigger asks get 413).
    pub fn max(&self) -> u64 {
        self.file_len
    }

    /// The largest body written from the buffer.
    pub fn copy_max(&self) -> usize {
        self.pattern.len()
    }
}

/// A server worker's settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The size `/` answers.
    pub default_size: u64,
    /// Longest head accepted (431 beyond).
    pub max_head: usize,
    /// A request head begun must be whole within this (else 408 and the connection closes).
    pub header_timeout: Duration,
    /// A connection with no byte in or out for this long is closed (`None`: never).
    pub idle_timeout: Option<Duration>,
}

/// How often connections are checked against the timeouts.
const SWEEP: Duration = Duration::from_millis(100);

/// Idle connections closed at most per accept that found the file table full.
const EVICT_AT_ONCE: usize = 64;

/// Bytes still to be sent on a connection, in order.
#[derive(Debug)]
enum Out {
    Bytes(Vec<u8>, usize),
    File { off: i64, end: i64 },
}

/// What the worker does with the body being read.
#[derive(Debug, Clone, Copy)]
enum AfterBody {
    /// A body of known length, its answer already queued: its bytes are echoed when `echo`.
    Answered { echo: bool },
    /// A chunked body: answered with (ask, keep-alive, HTTP/1.minor) when it ends.
    Answer(Ask, bool, u8),
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    carry: Vec<u8>,
    /// Where the connection's bytes are in its requests (every framing rule is there).
    reader: RequestReader,
    after: AfterBody,
    out: VecDeque<Out>,
    /// Close once `out` is sent.
    close: bool,
    writing: bool,
    /// When a request head began arriving, while it is incomplete.
    head_since: Option<Instant>,
    /// When a byte last came in or went out.
    last: Instant,
}

/// One server worker.
#[derive(Debug)]
pub struct ServerWorker {
    listener: TcpListener,
    cpu: usize,
    poller: Poller,
    conns: Slab<Conn>,
    bodies: Arc<Bodies>,
    cfg: ServerConfig,
    scratch: Vec<u8>,
    ready: usize,
    /// Output of the connection being handled: bytes, and files after `segs` marks.
    wbuf: Vec<u8>,
    segs: Vec<(usize, i64, i64)>,
    closing: Vec<usize>,
    head_cache: (u16, u64, bool, u8, Vec<u8>),
    /// Accepting stopped until then (out of descriptors).
    paused_until: Option<Instant>,
    /// The time at the start of this poll round (one clock read per round).
    now: Instant,
    /// When connections were last checked against the timeouts.
    swept: Instant,
}

const LISTENER: u64 = u64::MAX;
const READ_BUF: usize = 64 * 1024;
/// Answers copied into the worker's buffer from one read, at most (then sendfile).
const WBUF_MAX: usize = 256 * 1024;

impl ServerWorker {
    /// A worker for `listener` (non-blocking), on `cpu`.
    pub fn new(
        listener: TcpListener,
        cpu: usize,
        bodies: Arc<Bodies>,
        cfg: ServerConfig,
    ) -> Result<ServerWorker, flowlane_io::SysError> {
        let poller = Poller::new(256)?;
        poller.add(&listener, LISTENER, Interest::READ)?;
        Ok(ServerWorker {
            listener,
            cpu,
            poller,
            conns: Slab::new(),
            bodies,
            cfg,
            scratch: vec![0; READ_BUF],
            ready: 0,
            wbuf: Vec::with_capacity(READ_BUF),
            segs: Vec::new(),
            closing: Vec::new(),
            head_cache: (0, 0, false, 0, Vec::new()),
            paused_until: None,
            now: Instant::now(),
            swept: Instant::now(),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.conns.len()
    }

    fn accept(&mut self, st: &HttpServeStats) -> usize {
        let mut n = 0;
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    n += 1;
                    bump(&st.accepted, 1);
                    if s.set_nonblocking(true).is_err() {
                        bump(&st.io_errors, 1);
                        bump(&st.closed, 1);
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    if tcp::incoming_cpu(&s).is_some_and(|c| c != self.cpu) {
                        bump(&st.missteered, 1);
                    }
                    let entry = self.conns.vacant_entry();
                    let key = entry.key();
                    if self.poller.add(&s, key as u64, Interest::READ).is_err() {
                        bump(&st.io_errors, 1);
                        bump(&st.closed, 1);
                        continue;
                    }
                    entry.insert(Conn {
                        stream: s,
                        carry: Vec::new(),
                        reader: RequestReader::new(self.cfg.max_head),
                        after: AfterBody::Answered { echo: false },
                        out: VecDeque::new(),
                        close: false,
                        writing: false,
                        head_since: None,
                        last: self.now,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) if tcp::out_of_descriptors(&e) && self.evict(st) > 0 => {
                    // Room made: accept again.
                    bump(&st.accept_errors, 1);
                }
                Err(_) => {
                    // Out of descriptors or memory: the listener stays readable, so stop
                    // watching it for a few rounds rather than spin on it.
                    bump(&st.accept_errors, 1);
                    let _ = self.poller.delete(&self.listener);
                    self.paused_until = Some(Instant::now() + Duration::from_millis(50));
                    return n;
                }
            }
        }
    }

    /// Closes up to [`EVICT_AT_ONCE`] idle connections (no request in progress, nothing to
    /// send), those quiet longest first, to make room in a full file table; returns how many.
    fn evict(&mut self, st: &HttpServeStats) -> usize {
        let mut idle: Vec<(Instant, usize)> = self
            .conns
            .iter()
            .filter(|(k, c)| {
                c.head_since.is_none()
                    && c.carry.is_empty()
                    && c.out.is_empty()
                    && c.reader.between()
                    && !self.closing.contains(k)
            })
            .map(|(k, c)| (c.last, k))
            .collect();
        idle.sort_unstable();
        idle.truncate(EVICT_AT_ONCE);
        for &(_, key) in &idle {
            if let Some(c) = self.conns.try_remove(key) {
                let _ = self.poller.delete(&c.stream);
                bump(&st.closed, 1);
                bump(&st.evicted, 1);
            }
        }
        idle.len()
    }

    /// Answers 408 to connections whose head is overdue and closes those idle too long.
    fn sweep(&mut self, st: &HttpServeStats) {
        if self.now.duration_since(self.swept) < SWEEP {
            return;
        }
        self.swept = self.now;
        let (now, header, idle) = (self.now, self.cfg.header_timeout, self.cfg.idle_timeout);
        let mut overdue = Vec::new();
        for (key, c) in self.conns.iter() {
            if c.head_since.is_some_and(|t| now.duration_since(t) > header) {
                overdue.push(key);
            } else if idle.is_some_and(|d| now.duration_since(c.last) > d) {
                bump(&st.idle_closed, 1);
                self.closing.push(key);
            }
        }
        for key in overdue {
            bump(&st.header_timeouts, 1);
            self.conns[key].head_since = None;
            self.conns[key].carry.clear();
            self.error(408, st);
            self.conns[key].close = true;
            self.after_io(key, st);
        }
    }

    fn head(&mut self, status: u16, len: u64, keep: bool, minor: u8) {
        let c = &self.head_cache;
        if !(c.0 == status && c.1 == len && c.2 == keep && c.3 == minor) {
            let mut v = Vec::with_capacity(160);
            h::write_response_head(&mut v, status, len, keep, minor);
            self.head_cache = (status, len, keep, minor, v);
        }
        self.wbuf.extend_from_slice(&self.head_cache.4);
    }

    /// Queues the answer to `ask`; returns whether the connection stays open.
    fn answer(
        &mut self,
        ask: Ask,
        keep: bool,
        head_only: bool,
        minor: u8,
        body_len: u64,
        st: &HttpServeStats,
    ) -> bool {
        let (status, len) = match ask {
            Ask::Bytes(n) => {
                let n = n.unwrap_or(self.cfg.default_size);
                if n > self.bodies.max() {
                    (413, 0)
                } else {
                    (200, n)
                }
            }
            // An echo is bounded as the bodies asked for are.
            Ask::Echo if body_len > self.bodies.max() => (413, 0),
            Ask::Echo => (200, body_len),
            Ask::NotFound => (404, 0),
            Ask::BadSize => (400, 0),
        };
        match status {
            200 => bump(&st.status_2xx, 1),
            _ => bump(&st.status_4xx, 1),
        }
        // A refused echo's body is read and dropped, then the connection closes.
        let keep = keep && !(status == 413 && matches!(ask, Ask::Echo));
        self.head(status, len, keep, minor);
        if status == 200 && !head_only && !matches!(ask, Ask::Echo) {
            // Copied while the worker's buffer stays small; past that (many pipelined asks in
            // one read), bodies go by sendfile too, so one connection cannot make it grow far.
            if len as usize <= self.bodies.copy_max() && self.wbuf.len() < WBUF_MAX {
                self.wbuf
                    .extend_from_slice(&self.bodies.pattern[..len as usize]);
            } else {
                self.segs.push((self.wbuf.len(), 0, len as i64));
            }
        }
        keep
    }

    fn error(&mut self, status: u16, st: &HttpServeStats) {
        match status {
            500..=599 => bump(&st.status_5xx, 1),
            _ => bump(&st.status_4xx, 1),
        }
        self.head(status, 0, false, 1);
    }

    /// Handles `data` (the connection's carried bytes and what was just read): every complete
    /// request is answered into `wbuf`/`segs`. Returns the bytes used and whether to close.
    fn requests(&mut self, key: usize, data: &[u8], st: &HttpServeStats) -> (usize, bool) {
        let mut at = 0;
        while at < data.len() {
            let mut reader = self.conns[key].reader;
            let read = reader.read(&data[at..]);
            self.conns[key].reader = reader;
            let (used, step) = match read {
                Ok(r) => r,
                Err(e) => {
                    bump(&st.parse_errors, 1);
                    self.error(
                        match e {
                            MessageError::HeadTooLarge(_) => 431,
                            MessageError::Head(HeadError::UnsupportedEncoding) => 501,
                            _ => 400,
                        },
                        st,
                    );
                    return (data.len(), true);
                }
            };
            match step {
                RequestStep::More => return (at, false),
                RequestStep::Body { data: n, end } => {
                    if let AfterBody::Answered { echo: true } = self.conns[key].after {
                        self.wbuf.extend_from_slice(&data[at..at + used]);
                    }
                    bump(&st.body_rx_bytes, n);
                    at += used;
                    if !end {
                        return (at, false);
                    }
                    let go_on = match self.conns[key].after {
                        AfterBody::Answer(ask, keep, minor) => {
                            self.answer(ask, keep, false, minor, 0, st)
                        }
                        AfterBody::Answered { .. } => !self.conns[key].close,
                    };
                    if !go_on {
                        return (at, true);
                    }
                }
                RequestStep::Head(head) => {
                    bump(&st.requests, 1);
                    at += used;
                    match head.body {
                        BodyLen::Chunked => {
                            if head.ask == Ask::Echo {
                                // An echo's length is sent first; a chunked body's is not known.
                                self.error(501, st);
                                return (data.len(), true);
                            }
                            self.conns[key].after =
                                AfterBody::Answer(head.ask, head.keep_alive, head.minor);
                        }
                        BodyLen::Fixed(n) => {
                            let keep = self.answer(
                                head.ask,
                                head.keep_alive,
                                head.head_only,
                                head.minor,
                                n,
                                st,
                            );
                            let echo =
                                head.ask == Ask::Echo && !head.head_only && n <= self.bodies.max();
                            if n > 0 {
                                self.conns[key].after = AfterBody::Answered { echo };
                                self.conns[key].close = !keep;
                            } else if !keep {
                                return (at, true);
                            }
                        }
                        BodyLen::UntilClose => {}
                    }
                }
            }
        }
        (at, false)
    }

    /// Moves `wbuf`/`segs` to the connection's queue and sends what the socket takes.
    fn flush(&mut self, key: usize, st: &HttpServeStats) -> io::Result<()> {
        let now = self.now;
        let c = &mut self.conns[key];
        if c.out.is_empty() && self.segs.is_empty() && !self.wbuf.is_empty() {
            // The usual case: answers that fit the socket go straight from the worker's buffer;
            // only what it does not take is kept by the connection.
            let sent = match c.stream.write(&self.wbuf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => return Err(e),
            };
            bump(&st.tx_bytes, sent as u64);
            if sent > 0 {
                c.last = now;
            }
            if sent < self.wbuf.len() {
                push_bytes(&mut c.out, &self.wbuf[sent..]);
            }
            self.wbuf.clear();
        }
        if !self.wbuf.is_empty() || !self.segs.is_empty() {
            let mut from = 0;
            for &(at, off, end) in &self.segs {
                if at > from {
                    push_bytes(&mut c.out, &self.wbuf[from..at]);
                }
                c.out.push_back(Out::File { off, end });
                from = at;
            }
            if self.wbuf.len() > from {
                push_bytes(&mut c.out, &self.wbuf[from..]);
            }
            self.wbuf.clear();
            self.segs.clear();
        }
        loop {
            let more = c.out.len() > 1;
            let Some(front) = c.out.front_mut() else {
                break;
            };
            let sent = match front {
                Out::Bytes(b, pos) => {
                    let r = if more {
                        tcp::send_more(&c.stream, &b[*pos..])
                    } else {
                        c.stream.write(&b[*pos..])
                    };
                    match r {
                        Ok(n) => {
                            *pos += n;
                            c.last = now;
                            bump(&st.tx_bytes, n as u64);
                            *pos == b.len()
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
                Out::File { off, end } => {
                    let want = (*end - *off) as usize;
                    match tcp::sendfile(&c.stream, &self.bodies.file, off, want) {
                        Ok(n) => {
                            c.last = now;
                            bump(&st.tx_bytes, n as u64);
                            bump(&st.sendfile_bytes, n as u64);
                            if n == 0 {
                                return Err(io::Error::from(io::ErrorKind::WriteZero));
                            }
                            *off >= *end
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
            };
            if sent {
                c.out.pop_front();
            }
        }
        let want_write = !c.out.is_empty();
        if want_write != c.writing {
            c.writing = want_write;
            // While answers wait for room, no more requests are read: a client that pipelines
            // without reading cannot make the server queue without bound.
            let i = if want_write {
                Interest::WRITE
            } else {
                Interest::READ
            };
            self.poller
                .modify(&c.stream, key as u64, i)
                .map_err(|e| e.source)?;
        }
        Ok(())
    }

    fn readable(&mut self, key: usize, st: &HttpServeStats) {
        let n = match self.conns[key].stream.read(&mut self.scratch) {
            Ok(0) => {
                self.closing.push(key);
                return;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(_) => {
                bump(&st.io_errors, 1);
                self.closing.push(key);
                return;
            }
        };
        bump(&st.rx_bytes, n as u64);
        self.conns[key].last = self.now;
        let scratch = std::mem::take(&mut self.scratch);
        let carry = std::mem::take(&mut self.conns[key].carry);
        let (close, rest) = if carry.is_empty() {
            let (used, close) = self.requests(key, &scratch[..n], st);
            (close, scratch[used..n].to_vec())
        } else {
            let mut all = carry;
            all.extend_from_slice(&scratch[..n]);
            let (used, close) = self.requests(key, &all, st);
            all.drain(..used);
            (close, all)
        };
        self.scratch = scratch;
        let now = self.now;
        let c = &mut self.conns[key];
        // A head split across reads: timed from its first bytes.
        c.head_since = if rest.is_empty() || !c.reader.between() {
            None
        } else {
            c.head_since.or(Some(now))
        };
        c.carry = rest;
        if close {
            c.close = true;
        }
        self.after_io(key, st);
    }

    fn after_io(&mut self, key: usize, st: &HttpServeStats) {
        if self.flush(key, st).is_err() {
            bump(&st.io_errors, 1);
            self.closing.push(key);
            return;
        }
        let c = &self.conns[key];
        if c.close && c.out.is_empty() && c.reader.between() {
            let _ = c.stream.shutdown(Shutdown::Write);
            self.closing.push(key);
        }
    }
}

fn push_bytes(q: &mut VecDeque<Out>, b: &[u8]) {
    if let Some(Out::Bytes(v, _)) = q.back_mut() {
        v.extend_from_slice(b);
    } else {
        q.push_back(Out::Bytes(b.to_vec(), 0));
    }
}

impl Poll for ServerWorker {
    type Stats = HttpServeStats;
    type Report = ();

    fn poll(
        &mut self,
        budget: usize,
        st: &HttpServeStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        self.now = Instant::now();
        self.sweep(st);
        self.ready = self
            .poller
            .ready_now(self.ready)
            .map_err(|e| e.to_string())?;
        let mut handled = 0;
        for i in 0..self.ready.min(budget) {
            let Some(ev) = self.poller.get(i) else { break };
            handled += 1;
            if ev.token == LISTENER {
                self.accept(st);
                continue;
            }
            let key = ev.token as usize;
            if !self.conns.contains(key) || self.closing.contains(&key) {
                continue;
            }
            if ev.writable && self.conns[key].writing {
                self.after_io(key, st);
            }
            if ev.readable && !self.closing.contains(&key) {
                self.readable(key, st);
            }
        }
        self.ready = 0;
        for key in self.closing.drain(..) {
            if let Some(c) = self.conns.try_remove(key) {
                let _ = self.poller.delete(&c.stream);
                bump(&st.closed, 1);
            }
        }
        if self.paused_until.is_some_and(|t| Instant::now() >= t) {
            self.paused_until = None;
            self.poller
                .add(&self.listener, LISTENER, Interest::READ)
                .map_err(|e| e.to_string())?;
        }
        Ok(handled)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        let t = if self.paused_until.is_some() {
            5
        } else {
            timeout_ms.max(0) as u64
        };
        self.ready = self
            .poller
            .wait(Duration::from_millis(t))
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    fn finish(&mut self, st: &HttpServeStats) -> Option<()> {
        bump(&st.closed, self.conns.len() as u64);
        self.conns.clear();
        None
    }
}
