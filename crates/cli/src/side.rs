//! Side files a run writes besides its report (`--csv`, `--html`, `--histogram`): each path is
//! checked before the run, and written after the report is printed, so that a bad path never
//! costs the report (`rfc2544 … --json --csv /proc/x` ran every trial, then exited 1 with an
//! empty standard output).

use std::path::Path;

use anyhow::anyhow;

use crate::Failure;

/// Refuses, before the run, a side file that cannot be written: a directory, a device or FIFO
/// (a FIFO with no reader would hold the run at its end; `/dev/null` is allowed, to discard),
/// a file without write permission, a directory that does not exist or is not writable. A
/// path that does not exist is created and removed again (nothing is left of the probe).
pub fn check(flag: &str, path: &Path) -> Result<(), Failure> {
    let bad = |why: String| {
        Failure::usage(anyhow!(
            "{flag} {}: {why}; give a file in a writable directory",
            path.display()
        ))
    };
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(bad("is a directory".into())),
        Ok(m) if m.is_file() => std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map(drop)
            .map_err(|e| bad(format!("cannot write it ({e})"))),
        Ok(_) if path == Path::new("/dev/null") => Ok(()),
        Ok(_) => Err(bad("is a device, FIFO or socket, not a file".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .and_then(|f| {
                drop(f);
                std::fs::remove_file(path)
            })
            .map_err(|e| bad(format!("cannot create it ({e})"))),
        Err(e) => Err(bad(format!("cannot reach it ({e})"))),
    }
}

/// The side files' writes after the report: every one is tried, each failure said.
#[derive(Debug, Default)]
pub struct Writes {
    failed: Vec<String>,
}

impl Writes {
    /// Writes `bytes` to `path` (for `flag`), or keeps why not.
    pub fn write(&mut self, flag: &str, path: &Path, bytes: impl AsRef<[u8]>) {
        if let Err(e) = std::fs::write(path, bytes) {
            self.failed
                .push(format!("{flag} {}: cannot write it: {e}", path.display()));
        }
    }

    /// A side file with nothing to hold (e.g. no latency was measured).
    pub fn nothing(&mut self, flag: &str, path: &Path, why: &str) {
        self.failed
            .push(format!("{flag} {}: {why}", path.display()));
    }

    /// Ok when every write succeeded; else each failure said on stderr, and a runtime
    /// failure (exit 1) naming the first.
    pub fn done(self) -> Result<(), Failure> {
        let Some(first) = self.failed.first().cloned() else {
            return Ok(());
        };
        for f in &self.failed[1..] {
            errln!("flowlane: error: {f}");
        }
        Err(Failure::runtime(anyhow!(
            "{first} (the report above is complete)"
        )))
    }
}
