//! Files flowlane reads — route tables, next hops, RETA dumps, HTTP scenarios, captures —
//! read under a byte cap, a line cap and a line-length cap, their format checked on the first
//! bytes, and stopped by Ctrl-C. `forward --routes /dev/urandom` took all of the machine's
//! memory while ignoring SIGINT; `--routes` from a FIFO that never closed needed SIGKILL;
//! `--next-hops /dev/zero` hung silently. Devices and FIFOs are read under the same caps as
//! files (opened without blocking, so a silent writer is waited for in steps that look at the
//! stop flag).

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::ToolError;

/// How much of a text input is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextCaps {
    /// Bytes in all.
    pub bytes: u64,
    /// Lines in all.
    pub lines: usize,
    /// Bytes in one line.
    pub line_bytes: usize,
}

/// A route table (`--routes`, `route lookup --table`): a full Internet table in `ip route`
/// form is ~1 M lines of under 100 bytes.
pub const ROUTES: TextCaps = TextCaps {
    bytes: 256 << 20,
    lines: 8 << 20,
    line_bytes: 4096,
};

/// A next-hop file (`--next-hops`): one line per next hop.
pub const NEXT_HOPS: TextCaps = TextCaps {
    bytes: 16 << 20,
    lines: 1 << 20,
    line_bytes: 4096,
};

/// A RETA file (`--reta`: numbers or `ethtool -x` output; the largest tables have 64 Ki
/// entries).
pub const RETA: TextCaps = TextCaps {
    bytes: 4 << 20,
    lines: 1 << 17,
    line_bytes: 4096,
};

/// An HTTP scenario (`http load --scenario`, TOML).
pub const SCENARIO: TextCaps = TextCaps {
    bytes: 16 << 20,
    lines: 1 << 20,
    line_bytes: 64 << 10,
};

/// Shards' reports (`merge`): a report with its per-flow table and histogram is at most a few
/// MiB; a `--json-stream` has a line a second.
pub const REPORTS: TextCaps = TextCaps {
    bytes: 256 << 20,
    lines: 16 << 20,
    line_bytes: 64 << 20,
};

/// At most this much of a bad token or line is quoted in an error.
pub const EXCERPT_BYTES: usize = 80;

/// `s` quoted and escaped (a NUL shows as `\0`), cut to [`EXCERPT_BYTES`] of escaped text
/// on a character, with `…` and the whole length where it was cut: what an error quotes of
/// the input (escaped control bytes take up to 10 bytes each, so the cut counts them).
pub fn excerpt(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        let e: String = c.escape_debug().collect();
        if out.len() + e.len() > EXCERPT_BYTES {
            return format!("{out}\"… ({} bytes)", s.len());
        }
        out.push_str(&e);
    }
    out.push('"');
    out
}

fn stopped(stop: Option<&AtomicBool>) -> bool {
    stop.is_some_and(|s| s.load(Ordering::Relaxed))
}

/// Reads all of `path` (for the flag `flag`, named in errors), at most `max` bytes; `early`
/// checks the first bytes (at least `early_len`, or all of a shorter input) before the rest is
/// read. Stops with an error when `stop` is set while it waits.
pub fn read(
    flag: &str,
    path: &Path,
    max: u64,
    early_len: usize,
    early: &dyn Fn(&[u8]) -> Result<(), String>,
    stop: Option<&AtomicBool>,
) -> Result<Vec<u8>, ToolError> {
    let name = || format!("{flag} {}", path.display());
    let mut f = flowlane_io::os::open_read_nonblocking(path)
        .map_err(|e| ToolError::usage(format!("{}: cannot read it: {e}", name())))?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    let mut checked = false;
    loop {
        if stopped(stop) {
            return Err(ToolError::runtime(format!(
                "{}: interrupted while reading it",
                name()
            )));
        }
        match f.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                if (buf.len() + n) as u64 > max {
                    return Err(ToolError::usage(format!(
                        "{}: more than {max} bytes, more than such a file holds (a device or a \
                         stream that does not end?)",
                        name()
                    )));
                }
                buf.extend_from_slice(&chunk[..n]);
                if !checked && buf.len() >= early_len {
                    early(&buf).map_err(|e| ToolError::usage(format!("{}: {e}", name())))?;
                    checked = true;
                }
            }
            // A FIFO whose writer has written nothing yet.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ToolError::usage(format!("{}: cannot read it: {e}", name()))),
        }
    }
    if !checked {
        early(&buf).map_err(|e| ToolError::usage(format!("{}: {e}", name())))?;
    }
    Ok(buf)
}

/// Reads a text input under `caps`: UTF-8, no NUL in it (binary data is said on its first
/// 64 KiB), at most `caps.lines` lines of at most `caps.line_bytes` bytes.
pub fn read_text(
    flag: &str,
    path: &Path,
    caps: TextCaps,
    stop: Option<&AtomicBool>,
) -> Result<String, ToolError> {
    let bytes = read(flag, path, caps.bytes, 64 << 10, &not_binary, stop)?;
    text(flag, &path.display().to_string(), bytes, caps)
}

/// Reads standard input as text under `caps` (`-` for a file name).
pub fn read_stdin_text(flag: &str, caps: TextCaps) -> Result<String, ToolError> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(caps.bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ToolError::usage(format!("{flag}: standard input: {e}")))?;
    text_of(flag, "standard input", bytes, caps)
}

/// The checks a text input passes once read, on its bytes in memory (`name` says where they
/// came from): at most `caps.bytes`, no NUL (binary data), UTF-8, at most `caps.lines` lines
/// of at most `caps.line_bytes`. Every refusal quotes at most an excerpt.
pub fn text_of(
    flag: &str,
    name: &str,
    bytes: Vec<u8>,
    caps: TextCaps,
) -> Result<String, ToolError> {
    if bytes.len() as u64 > caps.bytes {
        return Err(ToolError::usage(format!(
            "{flag}: {name} holds more than {} bytes",
            caps.bytes
        )));
    }
    not_binary(&bytes).map_err(|e| ToolError::usage(format!("{flag}: {name}: {e}")))?;
    text(flag, name, bytes, caps)
}

fn not_binary(b: &[u8]) -> Result<(), String> {
    let head = &b[..b.len().min(64 << 10)];
    match head.iter().position(|&c| c == 0) {
        Some(at) => Err(format!(
            "a NUL byte at offset {at}: binary data, not a text file"
        )),
        None => Ok(()),
    }
}

fn text(flag: &str, name: &str, bytes: Vec<u8>, caps: TextCaps) -> Result<String, ToolError> {
    let s = String::from_utf8(bytes).map_err(|e| {
        ToolError::usage(format!(
            "{flag} {name}: not UTF-8 text (at byte {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    for (i, line) in s.lines().enumerate() {
        if i >= caps.lines {
            return Err(ToolError::usage(format!(
                "{flag} {name}: more than {} lines",
                caps.lines
            )));
        }
        if line.len() > caps.line_bytes {
            return Err(ToolError::usage(format!(
                "{flag} {name}: line {} is {} bytes, longer than {}: {}",
                i + 1,
                line.len(),
                caps.line_bytes,
                excerpt(line)
            )));
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_short_escaped_and_cut_on_a_character() {
        assert_eq!(excerpt("10.0.0.0/8"), "\"10.0.0.0/8\"");
        let long = "é".repeat(100);
        let e = excerpt(&long);
        assert!(e.len() < EXCERPT_BYTES + 30, "{e}");
        assert!(e.ends_with("… (200 bytes)"), "{e}");
        assert_eq!(excerpt("a\0b"), "\"a\\0b\"");
    }

    #[test]
    fn devices_are_read_under_the_cap() {
        let caps = TextCaps {
            bytes: 1 << 20,
            ..ROUTES
        };
        let t = std::time::Instant::now();
        let e = read_text("--routes", Path::new("/dev/zero"), caps, None).expect_err("refused");
        assert!(e.message.contains("NUL byte at offset 0"), "{}", e.message);
        let e = read_text("--routes", Path::new("/dev/urandom"), caps, None).expect_err("refused");
        assert!(
            e.message.starts_with("--routes /dev/urandom"),
            "{}",
            e.message
        );
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    /// A FIFO whose writer never writes nor closes (`forward --routes FIFO` needed SIGKILL):
    /// the read waits in steps and ends when the stop flag is set.
    #[test]
    fn a_silent_fifo_is_left_when_stopped() {
        let dir = std::env::temp_dir().join(format!("fl-input-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("routes");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo (coreutils)");
        assert!(made.success());
        // Held open for reading and writing: a writer that never writes.
        let _writer = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .expect("open the FIFO");
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let setter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                stop.store(true, Ordering::Relaxed);
            })
        };
        let t = std::time::Instant::now();
        let e = read_text("--routes", &fifo, ROUTES, Some(&stop)).expect_err("stopped");
        setter.join().expect("setter");
        assert!(
            e.message.contains("interrupted while reading"),
            "{}",
            e.message
        );
        assert!(t.elapsed() < Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn lines_beyond_the_caps_are_refused_with_an_excerpt() {
        let dir = std::env::temp_dir().join(format!("fl-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let long = dir.join("long");
        std::fs::write(&long, format!("10.0.0.0/8 1\n{}\n", "x".repeat(10_000))).expect("w");
        let e = read_text("--routes", &long, ROUTES, None).expect_err("refused");
        assert!(e.message.contains("line 2 is 10000 bytes"), "{}", e.message);
        assert!(e.message.len() < 300, "{}", e.message);
        let many = dir.join("many");
        std::fs::write(&many, "1\n".repeat(20)).expect("w");
        let caps = TextCaps { lines: 10, ..RETA };
        let e = read_text("--reta", &many, caps, None).expect_err("refused");
        assert!(e.message.contains("more than 10 lines"), "{}", e.message);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
