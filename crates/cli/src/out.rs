//! Standard output and error that cannot panic. `println!` panics when its write fails (stdout
//! on a full device, a pipe whose reader is gone), and the panic skipped the summary's last
//! lines and ended the process with a backtrace (exit 101). Here the first failed write is
//! kept, every later write to that stream is skipped, a running command is asked to stop as
//! Ctrl-C would ask it (so it detaches what it attached and removes what it made), and `main`
//! ends with `flowlane: error: writing standard output: …` and exit 1.
//!
//! SIGPIPE is left ignored, as the Rust runtime sets it: a closed pipe is then an `EPIPE` like
//! any other failed write, not the end of the process before its clean-up.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The first failed write to standard output.
static FAILED: OnceLock<String> = OnceLock::new();
/// A failed write to standard error: nothing more is written there (there is nowhere to say
/// so; the exit code still says whatever the run said).
static ERR_FAILED: AtomicBool = AtomicBool::new(false);
/// The running command's stop flag, set on a failed write.
static STOP: Mutex<Option<Arc<AtomicBool>>> = Mutex::new(None);

/// Registers the flag a failed write sets (the one SIGINT sets).
pub fn stop_on_failure(stop: &Arc<AtomicBool>) {
    if let Ok(mut s) = STOP.lock() {
        *s = Some(stop.clone());
    }
}

/// Writes `args` (and a newline) to standard output, unless a write failed before.
pub fn write(args: fmt::Arguments<'_>, newline: bool) {
    if FAILED.get().is_some() {
        return;
    }
    let mut o = std::io::stdout().lock();
    let r = o
        .write_fmt(args)
        .and_then(|()| if newline { o.write_all(b"\n") } else { Ok(()) });
    if let Err(e) = r {
        failed(&e);
    }
}

/// Writes `args` and a newline to standard error, unless a write there failed before.
pub fn write_err(args: fmt::Arguments<'_>) {
    if ERR_FAILED.load(Ordering::Relaxed) {
        return;
    }
    let mut o = std::io::stderr().lock();
    if o.write_fmt(args).and_then(|()| o.write_all(b"\n")).is_err() {
        ERR_FAILED.store(true, Ordering::Relaxed);
    }
}

fn failed(e: &std::io::Error) {
    let _ = FAILED.set(e.to_string());
    if let Ok(s) = STOP.lock() {
        if let Some(stop) = s.as_ref() {
            stop.store(true, Ordering::SeqCst);
        }
    }
}

/// Flushes standard output; the first write that failed, if one did.
pub fn finish() -> Option<String> {
    if FAILED.get().is_none() {
        if let Err(e) = std::io::stdout().lock().flush() {
            failed(&e);
        }
    }
    FAILED.get().cloned()
}

/// `println!` that cannot panic (see the module).
macro_rules! outln {
    () => {
        $crate::out::write(format_args!(""), true)
    };
    ($($t:tt)*) => {
        $crate::out::write(format_args!($($t)*), true)
    };
}

/// `print!` that cannot panic.
macro_rules! out {
    ($($t:tt)*) => {
        $crate::out::write(format_args!($($t)*), false)
    };
}

/// `eprintln!` that cannot panic.
macro_rules! errln {
    () => {
        $crate::out::write_err(format_args!(""))
    };
    ($($t:tt)*) => {
        $crate::out::write_err(format_args!($($t)*))
    };
}
