//! The loads `latency --load` runs beside the measurement, flowlane's own (stress's mix without
//! stress): CPU hogs, memory-bandwidth hogs and disk hogs, a thread of each asked kind on each
//! load CPU, at normal priority.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use super::LoadReport;
use crate::ToolError;

/// A load to run beside the measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadKind {
    /// Arithmetic in a loop (`stress -c`).
    Cpu,
    /// Writing through a large buffer again and again (`stress -m --vm-bytes`): memory
    /// bandwidth and the caches.
    Vm,
    /// Writing 1 MiB blocks to a file, each followed by fdatasync (`stress -d --hdd-bytes 1M`):
    /// the block layer, its interrupts and the page cache.
    Io,
}

impl LoadKind {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            LoadKind::Cpu => "cpu",
            LoadKind::Vm => "vm",
            LoadKind::Io => "io",
        }
    }
}

/// What a load is asked to be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadSpec {
    /// The kinds.
    pub kinds: Vec<LoadKind>,
    /// The CPUs its threads run on.
    pub cpus: Vec<usize>,
    /// Threads of each kind per CPU.
    pub threads: usize,
    /// Each memory hog's buffer, bytes.
    pub vm_bytes: usize,
    /// Where the disk hogs write their files (default: the system's temporary directory).
    pub io_dir: Option<PathBuf>,
}

/// A load while it runs; [`Load::finish`] stops it and says what it did.
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    cpu_loops: Arc<AtomicU64>,
    vm_bytes: Arc<AtomicU64>,
    io_bytes: Arc<AtomicU64>,
    files: Vec<PathBuf>,
    spec: LoadSpec,
}

/// A CPU hog: dependent arithmetic, counted in loops of 1 024 steps.
fn cpu_hog(stop: &AtomicBool, done: &AtomicU64) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..1024 {
            x = x.rotate_left(5) ^ x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        }
        std::hint::black_box(x);
        done.fetch_add(1, Ordering::Relaxed);
    }
}

/// A memory hog: writes its whole buffer, one pass after another.
fn vm_hog(stop: &AtomicBool, done: &AtomicU64, bytes: usize) {
    let mut buf = vec![0u8; bytes.max(4096)];
    let mut v = 0u8;
    while !stop.load(Ordering::Relaxed) {
        v = v.wrapping_add(1);
        // A page at a time, so a stop is seen within one page's writing.
        for chunk in buf.chunks_mut(1 << 16) {
            chunk.fill(v);
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        std::hint::black_box(&buf);
        done.fetch_add(buf.len() as u64, Ordering::Relaxed);
    }
}

/// A disk hog: 1 MiB blocks, each synced, the file rewound every 64 MiB.
fn io_hog(stop: &AtomicBool, done: &AtomicU64, mut f: std::fs::File) {
    use std::io::Seek;
    let block = vec![0x5au8; 1 << 20];
    let mut written = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if f.write_all(&block).is_err() || f.sync_data().is_err() {
            // A full or failing disk ends this hog; the report shows what it wrote.
            return;
        }
        done.fetch_add(block.len() as u64, Ordering::Relaxed);
        written += block.len() as u64;
        if written >= 64 << 20 {
            written = 0;
            if f.rewind().is_err() {
                return;
            }
        }
    }
}

impl Load {
    /// Starts every thread of `spec`, each pinned to its CPU.
    pub fn start(spec: &LoadSpec) -> Result<Load, ToolError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (cpu_loops, vm_bytes, io_bytes) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let mut load = Load {
            stop: stop.clone(),
            threads: Vec::new(),
            cpu_loops: cpu_loops.clone(),
            vm_bytes: vm_bytes.clone(),
            io_bytes: io_bytes.clone(),
            files: Vec::new(),
            spec: spec.clone(),
        };
        let dir = spec.io_dir.clone().unwrap_or_else(std::env::temp_dir);
        for &cpu in &spec.cpus {
            for t in 0..spec.threads.max(1) {
                for &kind in &spec.kinds {
                    let file = match kind {
                        LoadKind::Io => {
                            let path = dir.join(format!(
                                "flowlane-latency-io-{}-{cpu}-{t}",
                                std::process::id()
                            ));
                            let f = std::fs::OpenOptions::new()
                                .write(true)
                                .create_new(true)
                                .open(&path)
                                .map_err(|e| {
                                    ToolError::usage(format!(
                                        "--load io: cannot create {} ({e}); give --io-dir a \
                                         writable directory on the disk to load",
                                        path.display()
                                    ))
                                })?;
                            load.files.push(path);
                            Some(f)
                        }
                        _ => None,
                    };
                    let (stop, c, v, i) = (
                        stop.clone(),
                        cpu_loops.clone(),
                        vm_bytes.clone(),
                        io_bytes.clone(),
                    );
                    let bytes = spec.vm_bytes;
                    let h = std::thread::Builder::new()
                        .name(format!("flowlane-load-{}", kind.name()))
                        .spawn(move || {
                            // A hog that cannot be pinned still loads the machine.
                            let _ = flowlane_io::os::pin_current_thread(cpu);
                            match (kind, file) {
                                (LoadKind::Cpu, _) => cpu_hog(&stop, &c),
                                (LoadKind::Vm, _) => vm_hog(&stop, &v, bytes),
                                (LoadKind::Io, Some(f)) => io_hog(&stop, &i, f),
                                (LoadKind::Io, None) => {}
                            }
                        })
                        .map_err(|e| ToolError::runtime(format!("a load thread: {e}")))?;
                    load.threads.push(h);
                }
            }
        }
        Ok(load)
    }

    /// Stops every thread, removes the disk hogs' files, and says what the load did.
    pub fn finish(mut self) -> LoadReport {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for f in self.files.drain(..) {
            let _ = std::fs::remove_file(f);
        }
        LoadReport {
            kinds: self
                .spec
                .kinds
                .iter()
                .map(|k| k.name().to_string())
                .collect(),
            cpus: self.spec.cpus.clone(),
            threads: self.spec.threads.max(1),
            cpu_loops: self.cpu_loops.load(Ordering::Relaxed),
            vm_bytes_written: self.vm_bytes.load(Ordering::Relaxed),
            vm_bytes: self.spec.vm_bytes as u64,
            io_bytes_written: self.io_bytes.load(Ordering::Relaxed),
            io_dir: self.spec.kinds.contains(&LoadKind::Io).then(|| {
                self.spec
                    .io_dir
                    .clone()
                    .unwrap_or_else(std::env::temp_dir)
                    .display()
                    .to_string()
            }),
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        // A run that ends on an error still stops its hogs and removes their files.
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for f in self.files.drain(..) {
            let _ = std::fs::remove_file(f);
        }
    }
}
