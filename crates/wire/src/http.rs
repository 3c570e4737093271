//! HTTP/1.x as bytes, for the load generator and the server: heads parsed by `httparse` on
//! the caller's buffer (nothing copied), what a request asks of flowlane's server, response and
//! request heads written, chunked bodies walked, and the body pattern both sides agree on. The
//! Sans-IO readers ([`ResponseReader`], [`RequestReader`]) hold every framing rule of a
//! connection's bytes, so the epoll workers only move bytes.
//!
//! The server answers `GET /bytes/N` (or any path with `size=N` in its query) with N bytes of
//! [`PATTERN`] repeated from offset 0, so a client can check a body byte for byte without
//! having been told anything else.

use std::fmt::Write as _;

mod read;
pub use read::{Answer, MessageError, RequestReader, RequestStep, ResponseReader, Step};

/// One line of the body pattern: a body is this repeated, byte `i` being `PATTERN[i % 64]`.
pub const PATTERN: &[u8; 64] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-\n";

/// Most header lines a head may have.
pub const MAX_HEADERS: usize = 48;

/// Byte `i` of every body the server sends.
pub fn body_byte(i: u64) -> u8 {
    PATTERN[(i % 64) as usize]
}

/// `len` bytes of the body pattern from offset 0.
pub fn body(len: usize) -> Vec<u8> {
    (0..len as u64).map(body_byte).collect()
}

/// Why a head could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// Not HTTP/1.x syntax (the parser's reason).
    Syntax(&'static str),
    /// More header lines than [`MAX_HEADERS`].
    TooManyHeaders,
    /// A `Content-Length` that is not a number, or two that differ.
    BadLength,
    /// A `Transfer-Encoding` other than `chunked`.
    UnsupportedEncoding,
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadError::Syntax(w) => write!(f, "malformed head: {w}"),
            HeadError::TooManyHeaders => write!(f, "more than {MAX_HEADERS} header lines"),
            HeadError::BadLength => f.write_str("bad Content-Length"),
            HeadError::UnsupportedEncoding => f.write_str("Transfer-Encoding other than chunked"),
        }
    }
}

impl std::error::Error for HeadError {}

fn syntax(e: httparse::Error) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError::TooManyHeaders,
        other => HeadError::Syntax(match other {
            httparse::Error::HeaderName => "invalid header name",
            httparse::Error::HeaderValue => "invalid header value",
            httparse::Error::NewLine => "invalid line ending",
            httparse::Error::Status => "invalid status",
            httparse::Error::Token => "invalid token",
            httparse::Error::Version => "invalid version",
            _ => "invalid head",
        }),
    }
}

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLen {
    /// `Content-Length` bytes (0 when there is no body).
    Fixed(u64),
    /// Chunked transfer coding (walk it with [`Chunked`]).
    Chunked,
    /// Until the connection closes (a response with neither; HTTP/1.0 style).
    UntilClose,
}

/// What the headers of a message say about its framing and connection.
#[derive(Debug, Clone, Copy)]
struct Framing {
    len: Option<BodyLen>,
    keep_alive: bool,
}

fn framing(headers: &[httparse::Header<'_>], minor: u8) -> Result<Framing, HeadError> {
    let mut len = None;
    let mut keep_alive = minor >= 1;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or(HeadError::BadLength)?;
            match len {
                Some(BodyLen::Fixed(o)) if o != v => return Err(HeadError::BadLength),
                Some(BodyLen::Chunked) => {}
                _ => len = Some(BodyLen::Fixed(v)),
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let v = std::str::from_utf8(h.value).map_err(|_| HeadError::UnsupportedEncoding)?;
            if v.trim().eq_ignore_ascii_case("chunked") {
                // Chunked wins over a Content-Length (RFC 9112 §6.3).
                len = Some(BodyLen::Chunked);
            } else if !v.trim().eq_ignore_ascii_case("identity") {
                return Err(HeadError::UnsupportedEncoding);
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            for tok in h.value.split(|&b| b == b',') {
                let t = tok.trim_ascii();
                if t.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                }
            }
        }
    }
    Ok(Framing { len, keep_alive })
}

/// What a request asks of flowlane's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// `N` bytes of the pattern (`/bytes/N`, `size=N` in the query, or `/` for the default).
    Bytes(Option<u64>),
    /// The request's body sent back (`/echo`).
    Echo,
    /// No such resource (404).
    NotFound,
    /// A size that is not a number (400).
    BadSize,
}

fn ask_of(target: &str) -> Ask {
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let size = query.and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("size="))
            .map(|v| v.parse::<u64>())
    });
    match size {
        Some(Ok(n)) => return Ask::Bytes(Some(n)),
        Some(Err(_)) => return Ask::BadSize,
        None => {}
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        return n
            .parse()
            .map(|n| Ask::Bytes(Some(n)))
            .unwrap_or(Ask::BadSize);
    }
    match path {
        "/" | "/bytes" => Ask::Bytes(None),
        "/echo" => Ask::Echo,
        _ => Ask::NotFound,
    }
}

/// A request head, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHead {
    /// Bytes the head took (the body starts there).
    pub head_len: usize,
    /// Its body's framing ([`BodyLen::UntilClose`] never: a request without a length has none).
    pub body: BodyLen,
    /// The connection stays open after the answer.
    pub keep_alive: bool,
    /// `HEAD`: the answer carries no body.
    pub head_only: bool,
    /// What it asks.
    pub ask: Ask,
    /// HTTP/1.`minor`.
    pub minor: u8,
}

/// Reads a request head at the start of `buf`: `Ok(None)` if it is not complete yet.
pub fn parse_request(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf).map_err(syntax)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let minor = req.version.unwrap_or(1);
    let f = framing(req.headers, minor)?;
    let method = req.method.unwrap_or("GET");
    Ok(Some(RequestHead {
        head_len,
        body: f.len.unwrap_or(BodyLen::Fixed(0)),
        keep_alive: f.keep_alive,
        head_only: method == "HEAD",
        ask: ask_of(req.path.unwrap_or("/")),
        minor,
    }))
}

/// A response head, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    /// Bytes the head took.
    pub head_len: usize,
    /// Status code.
    pub status: u16,
    /// Its body's framing (before the caller applies "no body for HEAD, 1xx, 204, 304").
    pub body: BodyLen,
    /// The server keeps the connection open.
    pub keep_alive: bool,
}

/// Reads a response head at the start of `buf`: `Ok(None)` if it is not complete yet.
pub fn parse_response(buf: &[u8]) -> Result<Option<ResponseHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf).map_err(syntax)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let status = resp.code.unwrap_or(0);
    let f = framing(resp.headers, resp.version.unwrap_or(1))?;
    let body = if status < 200 || status == 204 || status == 304 {
        BodyLen::Fixed(0)
    } else {
        f.len.unwrap_or(BodyLen::UntilClose)
    };
    Ok(Some(ResponseHead {
        head_len,
        status,
        body,
        keep_alive: f.keep_alive && body != BodyLen::UntilClose,
    }))
}

/// Where a walk through a chunked body is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Chunked {
    /// Data bytes left in the current chunk, then its CRLF (2 bytes).
    left: u64,
    /// Between chunks: the next thing is a size line.
    in_data: bool,
    /// The last chunk (size 0) was read; its trailer section follows.
    trailer: bool,
    /// Data bytes seen so far.
    pub data: u64,
}

/// A step of a chunked walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkStep {
    /// `n` bytes were used; more input is needed.
    More(usize),
    /// The body ended after `n` bytes of the input.
    Done(usize),
}

impl Chunked {
    /// Walks as far as `buf` allows. Data bytes are only counted, never copied.
    pub fn step(&mut self, buf: &[u8]) -> Result<ChunkStep, HeadError> {
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            if self.trailer {
                // Trailer lines end with an empty line.
                match find_crlf(rest) {
                    None => return Ok(ChunkStep::More(at)),
                    Some(0) => return Ok(ChunkStep::Done(at + 2)),
                    Some(i) => at += i + 2,
                }
                continue;
            }
            if self.in_data {
                let take = (self.left as usize).min(rest.len());
                let data_left = self.left.saturating_sub(2);
                self.data += (take as u64).min(data_left);
                self.left -= take as u64;
                at += take;
                if self.left > 0 {
                    return Ok(ChunkStep::More(at));
                }
                self.in_data = false;
                continue;
            }
            match httparse::parse_chunk_size(rest) {
                Ok(httparse::Status::Complete((n, size))) => {
                    at += n;
                    if size == 0 {
                        self.trailer = true;
                    } else {
                        self.in_data = true;
                        self.left = size.saturating_add(2);
                    }
                }
                Ok(httparse::Status::Partial) => return Ok(ChunkStep::More(at)),
                Err(_) => return Err(HeadError::Syntax("invalid chunk size")),
            }
        }
    }
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

/// The reason phrase of the statuses the server sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Appends a response head: status line, `Content-Length`, `Content-Type`, and
/// `Connection: close` when the connection will be closed.
pub fn write_response_head(out: &mut Vec<u8>, status: u16, len: u64, keep_alive: bool, minor: u8) {
    let mut s = String::with_capacity(128);
    let _ = write!(
        s,
        "HTTP/1.{} {status} {}\r\nServer: flowlane\r\nContent-Type: text/plain\r\nContent-Length: {len}\r\n",
        minor.min(1),
        reason(status),
    );
    if !keep_alive {
        s.push_str("Connection: close\r\n");
    } else if minor == 0 {
        s.push_str("Connection: keep-alive\r\n");
    }
    s.push_str("\r\n");
    out.extend_from_slice(s.as_bytes());
}

/// A request head for the load generator: `method target` to `host`, with a
/// `Content-Length` when `body_len` > 0 and `Connection: close` when not keeping alive.
pub fn write_request_head(
    out: &mut Vec<u8>,
    method: &str,
    host: &str,
    target: &str,
    body_len: u64,
    keep_alive: bool,
) {
    let mut s = String::with_capacity(96 + target.len() + host.len());
    let _ = write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: flowlane\r\n"
    );
    if body_len > 0 || method == "POST" || method == "PUT" {
        let _ = write!(s, "Content-Length: {body_len}\r\n");
    }
    if !keep_alive {
        s.push_str("Connection: close\r\n");
    }
    s.push_str("\r\n");
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks() {
        assert_eq!(ask_of("/bytes/100"), Ask::Bytes(Some(100)));
        assert_eq!(ask_of("/x?a=1&size=7"), Ask::Bytes(Some(7)));
        assert_eq!(ask_of("/"), Ask::Bytes(None));
        assert_eq!(ask_of("/echo"), Ask::Echo);
        assert_eq!(ask_of("/bytes/x"), Ask::BadSize);
        assert_eq!(ask_of("/?size=-1"), Ask::BadSize);
        assert_eq!(ask_of("/nope"), Ask::NotFound);
    }

    #[test]
    fn request_heads() {
        let r = b"GET /bytes/5 HTTP/1.1\r\nHost: a\r\n\r\nGET";
        let h = parse_request(r).expect("valid").expect("complete");
        assert_eq!(h.head_len, r.len() - 3);
        assert_eq!(h.ask, Ask::Bytes(Some(5)));
        assert!(h.keep_alive);
        assert_eq!(h.body, BodyLen::Fixed(0));
        assert_eq!(parse_request(b"GET / HTTP/1.1\r\nHost"), Ok(None));
        let p = parse_request(b"POST /echo HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc")
            .expect("valid")
            .expect("complete");
        assert_eq!(
            (p.body, p.keep_alive, p.ask),
            (BodyLen::Fixed(3), false, Ask::Echo)
        );
        let c = b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n";
        assert!(
            !parse_request(c)
                .expect("valid")
                .expect("complete")
                .keep_alive
        );
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
            Err(HeadError::BadLength)
        );
        assert!(matches!(
            parse_request(b"\x01GET / HTTP/1.1\r\n\r\n"),
            Err(HeadError::Syntax(_))
        ));
    }

    #[test]
    fn response_heads_round_trip() {
        let mut out = Vec::new();
        write_response_head(&mut out, 200, 12, true, 1);
        let h = parse_response(&out).expect("valid").expect("complete");
        assert_eq!(
            (h.status, h.body, h.keep_alive, h.head_len),
            (200, BodyLen::Fixed(12), true, out.len())
        );
        out.clear();
        write_response_head(&mut out, 404, 0, false, 1);
        let h = parse_response(&out).expect("valid").expect("complete");
        assert_eq!((h.status, h.keep_alive), (404, false));
        let u = parse_response(b"HTTP/1.1 200 OK\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!((u.body, u.keep_alive), (BodyLen::UntilClose, false));
    }

    #[test]
    fn request_heads_round_trip() {
        let mut out = Vec::new();
        write_request_head(&mut out, "POST", "h:80", "/echo", 9, true);
        let h = parse_request(&out).expect("valid").expect("complete");
        assert_eq!(
            (h.body, h.ask, h.keep_alive),
            (BodyLen::Fixed(9), Ask::Echo, true)
        );
    }

    #[test]
    fn chunked_in_any_split() {
        let body = b"4\r\nWiki\r\n5;x=y\r\npedia\r\n0\r\nT: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        for split in 0..=end {
            let mut c = Chunked::default();
            // What a caller does: keep the unused bytes and feed them again with the next read.
            let (mut pending, mut used, mut done) = (Vec::new(), 0, None);
            for part in [&body[..split], &body[split..]] {
                pending.extend_from_slice(part);
                match c.step(&pending).expect("valid") {
                    ChunkStep::More(n) => {
                        used += n;
                        pending.drain(..n);
                    }
                    ChunkStep::Done(n) => {
                        done = Some(used + n);
                        break;
                    }
                }
            }
            assert_eq!(done, Some(end), "split at {split}");
            assert_eq!(c.data, 9);
        }
        assert!(Chunked::default().step(b"zz\r\n").is_err());
    }

    #[test]
    fn pattern() {
        assert_eq!(body(3), b"012");
        assert_eq!(body_byte(64), b'0');
        assert_eq!(body_byte(63), b'\n');
    }
}
