//! Sans-IO message readers: what a connection's bytes mean, fed as they arrive, cut anywhere.
//!
//! [`ResponseReader`] is the load generator's side (one answer per request sent) and
//! [`RequestReader`] the server's (requests, one after another, each with its body). Neither
//! owns a socket, a clock or a buffer: the caller feeds the bytes it holds and keeps the ones a
//! step did not use (a head split across reads) for the next step. The epoll workers only move
//! bytes; every framing rule lives here, where it is tested byte sequence by byte sequence.

use super::{parse_request, parse_response, BodyLen, ChunkStep, Chunked, HeadError, RequestHead};

/// Why a connection's bytes cannot be read as messages (the connection cannot go on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageError {
    /// A head (or a chunk size line) that is not HTTP/1.x.
    Head(HeadError),
    /// A request head longer than the reader's bound (still incomplete, or complete).
    HeadTooLarge(usize),
    /// Bytes after an answer, when no request asked for more.
    Unasked,
}

impl std::fmt::Display for MessageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MessageError::Head(e) => e.fmt(f),
            MessageError::HeadTooLarge(max) => write!(f, "a head longer than {max} bytes"),
            MessageError::Unasked => f.write_str("bytes no request asked for"),
        }
    }
}

impl std::error::Error for MessageError {}

impl From<HeadError> for MessageError {
    fn from(e: HeadError) -> Self {
        MessageError::Head(e)
    }
}

/// An answer read in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// Its status code.
    pub status: u16,
    /// The server keeps the connection open after it.
    pub keep_alive: bool,
    /// Its body's data bytes (without chunk framing).
    pub body: u64,
}

/// One step of a [`ResponseReader`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Input bytes used; the rest is kept and fed again (a head not complete yet), or is the
    /// next answer's when `answer` is set.
    pub used: usize,
    /// Body data bytes in the used bytes.
    pub body: u64,
    /// The answer ended within the used bytes.
    pub answer: Option<Answer>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Head,
    Fixed(u64),
    Chunked(Chunked),
    UntilClose,
    Done,
}

/// Reads the answer to one request, from bytes as they come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseReader {
    part: Part,
    /// The request was `HEAD`: its answer has no body, whatever its head says.
    head_only: bool,
    status: u16,
    keep_alive: bool,
    body: u64,
}

impl ResponseReader {
    /// The reader of the answer to a request just sent (`head_only` for `HEAD`).
    pub fn new(head_only: bool) -> ResponseReader {
        ResponseReader {
            part: Part::Head,
            head_only,
            status: 0,
            keep_alive: false,
            body: 0,
        }
    }

    /// Its head has not been read in full yet.
    pub fn in_head(&self) -> bool {
        self.part == Part::Head
    }

    /// In a body of known length: the bytes left (the caller may drop them unread and say so
    /// with [`ResponseReader::skipped`]).
    pub fn fixed_left(&self) -> Option<u64> {
        match self.part {
            Part::Fixed(left) => Some(left),
            _ => None,
        }
    }

    /// Body data bytes read so far.
    pub fn body(&self) -> u64 {
        self.body
    }

    fn end(&mut self) -> Answer {
        self.part = Part::Done;
        Answer {
            status: self.status,
            keep_alive: self.keep_alive,
            body: self.body,
        }
    }

    /// Reads `data` as far as this answer goes: stops where it ends, or when `data` does.
    pub fn read(&mut self, data: &[u8]) -> Result<Step, MessageError> {
        let mut step = Step {
            used: 0,
            body: 0,
            answer: None,
        };
        loop {
            let rest = &data[step.used..];
            match self.part {
                Part::Done => return Err(MessageError::Unasked),
                Part::Head => {
                    let Some(head) = parse_response(rest)? else {
                        return Ok(step);
                    };
                    step.used += head.head_len;
                    self.status = head.status;
                    self.keep_alive = head.keep_alive;
                    let len = if self.head_only {
                        BodyLen::Fixed(0)
                    } else {
                        head.body
                    };
                    self.part = match len {
                        BodyLen::Fixed(0) => {
                            step.answer = Some(self.end());
                            return Ok(step);
                        }
                        BodyLen::Fixed(n) => Part::Fixed(n),
                        BodyLen::Chunked => Part::Chunked(Chunked::default()),
                        BodyLen::UntilClose => Part::UntilClose,
                    };
                }
                Part::Fixed(left) => {
                    let take = left.min(rest.len() as u64);
                    step.used += take as usize;
                    step.body += take;
                    self.body += take;
                    if take == left {
                        step.answer = Some(self.end());
                    } else {
                        self.part = Part::Fixed(left - take);
                    }
                    return Ok(step);
                }
                Part::Chunked(mut walk) => {
                    let before = walk.data;
                    let r = walk.step(rest)?;
                    step.body += walk.data - before;
                    self.body += walk.data - before;
                    self.part = Part::Chunked(walk);
                    match r {
                        ChunkStep::More(n) => step.used += n,
                        ChunkStep::Done(n) => {
                            step.used += n;
                            step.answer = Some(self.end());
                        }
                    }
                    return Ok(step);
                }
                Part::UntilClose => {
                    step.used = data.len();
                    step.body += rest.len() as u64;
                    self.body += rest.len() as u64;
                    return Ok(step);
                }
            }
        }
    }

    /// `n` bytes of a body of known length were dropped unread (`n` at most
    /// [`ResponseReader::fixed_left`]); the answer, if they ended it.
    pub fn skipped(&mut self, n: u64) -> Option<Answer> {
        let Part::Fixed(left) = self.part else {
            return None;
        };
        let n = n.min(left);
        self.body += n;
        if n == left {
            Some(self.end())
        } else {
            self.part = Part::Fixed(left - n);
            None
        }
    }

    /// The server closed the connection: the answer it ends (one delimited by the close), or
    /// `None` when the answer was cut short.
    pub fn closed(&mut self) -> Option<Answer> {
        match self.part {
            Part::UntilClose => {
                self.keep_alive = false;
                Some(self.end())
            }
            _ => None,
        }
    }
}

/// One step of a [`RequestReader`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStep {
    /// More bytes are needed (`used` bytes were; the rest is an incomplete head, kept).
    More,
    /// A request head (its body, if any, follows).
    Head(RequestHead),
    /// Body bytes: `data` data bytes in the used bytes (for a body of known length, the used
    /// bytes are the data); `end` when the body ended there.
    Body {
        /// Data bytes (without chunk framing).
        data: u64,
        /// The body ended.
        end: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InBody {
    None,
    Fixed(u64),
    Chunked(Chunked),
}

/// Reads the requests on one server connection, from bytes as they come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestReader {
    body: InBody,
    max_head: usize,
}

impl RequestReader {
    /// A reader refusing heads longer than `max_head` bytes.
    pub fn new(max_head: usize) -> RequestReader {
        RequestReader {
            body: InBody::None,
            max_head,
        }
    }

    /// Between requests (no body being read).
    pub fn between(&self) -> bool {
        self.body == InBody::None
    }

    /// In a body of known length (its bytes are the data).
    pub fn in_fixed_body(&self) -> bool {
        matches!(self.body, InBody::Fixed(_))
    }

    /// Reads the next thing in `data`; returns the bytes used and what they were.
    pub fn read(&mut self, data: &[u8]) -> Result<(usize, RequestStep), MessageError> {
        match self.body {
            InBody::Fixed(left) => {
                let take = left.min(data.len() as u64);
                let end = take == left;
                self.body = if end {
                    InBody::None
                } else {
                    InBody::Fixed(left - take)
                };
                Ok((take as usize, RequestStep::Body { data: take, end }))
            }
            InBody::Chunked(mut walk) => {
                let before = walk.data;
                let r = walk.step(data)?;
                let data = walk.data - before;
                Ok(match r {
                    ChunkStep::More(n) => {
                        self.body = InBody::Chunked(walk);
                        (n, RequestStep::Body { data, end: false })
                    }
                    ChunkStep::Done(n) => {
                        self.body = InBody::None;
                        (n, RequestStep::Body { data, end: true })
                    }
                })
            }
            InBody::None => {
                let head = match parse_request(data)? {
                    Some(h) => h,
                    None if data.len() > self.max_head => {
                        return Err(MessageError::HeadTooLarge(self.max_head))
                    }
                    None => return Ok((0, RequestStep::More)),
                };
                if head.head_len > self.max_head {
                    return Err(MessageError::HeadTooLarge(self.max_head));
                }
                self.body = match head.body {
                    BodyLen::Fixed(0) | BodyLen::UntilClose => InBody::None,
                    BodyLen::Fixed(n) => InBody::Fixed(n),
                    BodyLen::Chunked => InBody::Chunked(Chunked::default()),
                };
                Ok((head.head_len, RequestStep::Head(head)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Ask;

    /// Feeds `parts` as reads would, keeping unused bytes: the answers read, the body bytes
    /// counted, and the bytes left over.
    fn answers(parts: &[&[u8]], head_only: bool) -> (Vec<Answer>, u64, Vec<u8>) {
        let (mut out, mut body, mut pending) = (Vec::new(), 0, Vec::new());
        let mut r = ResponseReader::new(head_only);
        for p in parts {
            pending.extend_from_slice(p);
            loop {
                let s = r.read(&pending).expect("valid");
                assert!(s.used <= pending.len());
                pending.drain(..s.used);
                body += s.body;
                match s.answer {
                    Some(a) => {
                        out.push(a);
                        r = ResponseReader::new(head_only);
                    }
                    None => break,
                }
                if pending.is_empty() {
                    break;
                }
            }
        }
        (out, body, pending)
    }

    const TWO: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n";

    #[test]
    fn answers_cut_at_every_offset_and_twice() {
        let want = vec![
            Answer {
                status: 200,
                keep_alive: true,
                body: 5,
            },
            Answer {
                status: 404,
                keep_alive: false,
                body: 3,
            },
        ];
        for i in 0..=TWO.len() {
            for j in i..=TWO.len() {
                let (got, body, left) = answers(&[&TWO[..i], &TWO[i..j], &TWO[j..]], false);
                assert_eq!(got, want, "cut at {i} and {j}");
                assert_eq!((body, left.len()), (8, 0), "cut at {i} and {j}");
            }
        }
    }

    #[test]
    fn head_answers_have_no_body_and_close_ends_others() {
        let (got, body, left) = answers(&[b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"], true);
        assert_eq!((got.len(), got[0].body, body, left.len()), (1, 0, 0, 0));
        let mut r = ResponseReader::new(false);
        let s = r.read(b"HTTP/1.0 200 OK\r\n\r\nab").expect("valid");
        assert_eq!((s.body, s.answer), (2, None));
        assert_eq!(r.read(b"cd").expect("valid").body, 2);
        let a = r.closed().expect("a close ends it");
        assert_eq!((a.status, a.keep_alive, a.body), (200, false, 4));
        // A close inside a body of known length cuts the answer short.
        let mut r = ResponseReader::new(false);
        r.read(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab")
            .expect("valid");
        assert_eq!(r.closed(), None);
    }

    #[test]
    fn skipped_bytes_end_a_fixed_body() {
        let mut r = ResponseReader::new(false);
        r.read(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
            .expect("valid");
        assert_eq!(r.fixed_left(), Some(100));
        assert_eq!(r.skipped(60), None);
        let a = r.skipped(40).expect("ended");
        assert_eq!((a.body, r.fixed_left()), (100, None));
        assert_eq!(r.read(b"x"), Err(MessageError::Unasked));
    }

    #[test]
    fn bad_answers_are_errors() {
        let mut r = ResponseReader::new(false);
        assert!(matches!(
            r.read(b"HTTX/1.1 200 OK\r\n\r\n"),
            Err(MessageError::Head(_))
        ));
        let mut r = ResponseReader::new(false);
        let e = r.read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        assert!(matches!(e, Err(MessageError::Head(_))));
    }

    /// Feeds `parts` to a server's reader: heads, data bytes, body ends, leftover.
    fn requests(
        parts: &[&[u8]],
        max_head: usize,
    ) -> Result<(Vec<RequestHead>, u64, usize), MessageError> {
        let (mut heads, mut data, mut ends, mut pending) = (Vec::new(), 0, 0, Vec::new());
        let mut r = RequestReader::new(max_head);
        for p in parts {
            pending.extend_from_slice(p);
            while !pending.is_empty() {
                let (used, step) = r.read(&pending)?;
                assert!(used <= pending.len());
                pending.drain(..used);
                match step {
                    RequestStep::More => break,
                    RequestStep::Head(h) => heads.push(h),
                    RequestStep::Body { data: d, end } => {
                        data += d;
                        ends += usize::from(end);
                        if used == 0 && !end {
                            break;
                        }
                    }
                }
            }
        }
        assert!(pending.is_empty() || r.between());
        Ok((heads, data, ends))
    }

    const THREE: &[u8] = b"POST /echo HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcdGET /bytes/7 HTTP/1.1\r\n\r\nPOST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxy\r\n0\r\n\r\n";

    #[test]
    fn requests_cut_at_every_offset_and_twice() {
        for i in 0..=THREE.len() {
            for j in i..=THREE.len() {
                let (heads, data, ends) =
                    requests(&[&THREE[..i], &THREE[i..j], &THREE[j..]], 1024).expect("valid");
                let asks: Vec<Ask> = heads.iter().map(|h| h.ask).collect();
                assert_eq!(
                    asks,
                    [Ask::Echo, Ask::Bytes(Some(7)), Ask::Bytes(None)],
                    "cut at {i} and {j}"
                );
                assert_eq!((data, ends), (6, 2), "cut at {i} and {j}");
            }
        }
    }

    #[test]
    fn long_heads_are_refused_complete_or_not() {
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(100));
        assert_eq!(
            requests(&[long.as_bytes()], 64),
            Err(MessageError::HeadTooLarge(64))
        );
        assert_eq!(
            requests(&[&long.as_bytes()[..80]], 64),
            Err(MessageError::HeadTooLarge(64))
        );
        assert!(requests(&[long.as_bytes()], 200).is_ok());
    }
}
