//! The Sans-IO readers say the same whatever way a connection's bytes were cut by reads:
//! fed whole, or cut at two places with unused bytes fed again, they give the same answers
//! (or requests and body bytes) and the same verdict, never use more than they were given,
//! and never panic.
#![no_main]
use flowlane_wire::http::{RequestReader, RequestStep, ResponseReader};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, PartialEq)]
enum Seen {
    Answer(u16, bool, u64),
    Head(usize, bool),
    Data(u64, bool),
    Error,
}

fn answers(parts: &[&[u8]], head_only: bool) -> Vec<Seen> {
    let (mut seen, mut pending) = (Vec::new(), Vec::new());
    let mut r = ResponseReader::new(head_only);
    for p in parts {
        pending.extend_from_slice(p);
        while !pending.is_empty() {
            let Ok(s) = r.read(&pending) else {
                seen.push(Seen::Error);
                return seen;
            };
            assert!(s.used <= pending.len());
            assert!(s.body <= s.used as u64);
            pending.drain(..s.used);
            match s.answer {
                Some(a) => {
                    assert_eq!(a.body, r.body());
                    seen.push(Seen::Answer(a.status, a.keep_alive, a.body));
                    r = ResponseReader::new(head_only);
                }
                None => break,
            }
        }
    }
    seen
}

fn requests(parts: &[&[u8]], max_head: usize) -> Vec<Seen> {
    let (mut seen, mut pending) = (Vec::new(), Vec::new());
    let mut r = RequestReader::new(max_head);
    let mut data = 0;
    for p in parts {
        pending.extend_from_slice(p);
        while !pending.is_empty() {
            let Ok((used, step)) = r.read(&pending) else {
                seen.push(Seen::Error);
                return seen;
            };
            assert!(used <= pending.len());
            pending.drain(..used);
            match step {
                RequestStep::More => break,
                RequestStep::Head(h) => {
                    assert!(h.head_len <= max_head);
                    seen.push(Seen::Head(h.head_len, h.keep_alive));
                }
                RequestStep::Body { data: d, end } => {
                    assert!(d <= used as u64);
                    data += d;
                    if end {
                        seen.push(Seen::Data(data, true));
                        data = 0;
                    } else if used == 0 {
                        break;
                    }
                }
            }
        }
    }
    if data > 0 {
        seen.push(Seen::Data(data, false));
    }
    seen
}

fuzz_target!(|input: &[u8]| {
    let (Some(&a), Some(&b), Some(&c)) = (input.first(), input.get(1), input.get(2)) else {
        return;
    };
    let data = &input[3..];
    let i = a as usize % (data.len() + 1);
    let j = i + b as usize % (data.len() - i + 1);
    let cut: [&[u8]; 3] = [&data[..i], &data[i..j], &data[j..]];
    let head_only = c & 1 == 1;
    assert_eq!(answers(&[data], head_only), answers(&cut, head_only));
    let max_head = 16 + (c as usize) * 4;
    assert_eq!(requests(&[data], max_head), requests(&cut, max_head));
});
