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
    /// flowlane's own traffic: a lab (namespaces, veth, software RSS onto the load CPUs) with
    /// `serve` (a worker per load CPU, sink mode) and `blast` (a thread per load CPU) at
    /// `net_rate` or unpaced: the receive path's softirqs and the workers.
    Net,
}

impl LoadKind {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            LoadKind::Cpu => "cpu",
            LoadKind::Vm => "vm",
            LoadKind::Io => "io",
            LoadKind::Net => "net",
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
    /// The net load's datagrams per second (`None`: unpaced).
    #[serde(default)]
    pub net_rate: Option<f64>,
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
    net: Option<NetLoad>,
}

/// The net load while it runs: its lab, and the server's and client's threads.
struct NetLoad {
    lab: String,
    stop: Arc<AtomicBool>,
    serve: JoinHandle<Result<crate::serve::ServeReport, String>>,
    blast: JoinHandle<Result<crate::blast::BlastReport, String>>,
}

impl std::fmt::Debug for NetLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetLoad")
            .field("lab", &self.lab)
            .finish_non_exhaustive()
    }
}

impl NetLoad {
    /// Brings up a lab steering onto `cpus`, starts serve in it and blast towards it.
    fn start(spec: &LoadSpec) -> Result<NetLoad, ToolError> {
        use flowlane_lab::setup;
        if !flowlane_lab::can_create_namespaces() {
            return Err(ToolError::privilege(
                "--load net builds a lab in network namespaces and needs root (CAP_SYS_ADMIN, \
                 CAP_NET_ADMIN)",
            ));
        }
        let name = format!("fllat{}", std::process::id() % 100_000);
        let n = spec.cpus.len().max(1) as u32;
        let mut cfg = setup::LabConfig::new(
            &name,
            n,
            setup::Steer::Rss,
            &flowlane_rss::Key::MICROSOFT,
            n,
        );
        cfg.queue_cpus = spec.cpus.iter().map(|&c| c as u32).collect();
        setup::up(&cfg).map_err(|e| ToolError::runtime(format!("--load net: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let to: std::net::SocketAddr = format!("{}:9000", setup::LAB_DUT_V4)
            .parse()
            .map_err(|_| ToolError::runtime("the lab's address"))?;
        let (gen, dut) = (
            flowlane_lab::Netns::existing(&cfg.gen_ns()),
            flowlane_lab::Netns::existing(&cfg.dut_ns()),
        );
        let mut scfg = crate::serve::ServeConfig::new(to, spec.cpus.clone());
        scfg.mode = crate::serve::ServeMode::Sink;
        scfg.interval_s = 3600.0;
        let (s2, ready_tx) = (stop.clone(), std::sync::mpsc::channel());
        let (ready_tx, ready_rx) = ready_tx;
        let serve = std::thread::spawn(move || {
            dut.run(move || {
                crate::serve::run(&scfg, &s2, &mut |e| {
                    if let crate::serve::ServeEvent::Started(_) = e {
                        let _ = ready_tx.send(());
                    }
                })
                .map_err(|e| e.message)
            })
            .map_err(|e| e.to_string())?
        });
        let up = ready_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .is_ok();
        let mut bcfg = crate::blast::BlastConfig::new(to, spec.cpus[0]);
        bcfg.cpus = spec.cpus.clone();
        bcfg.flows = (2 * spec.cpus.len()) as u32;
        bcfg.rate = spec.net_rate.map(crate::blast::Rate::Pps);
        bcfg.interval_s = 3600.0;
        let b2 = stop.clone();
        let blast = std::thread::spawn(move || {
            if !up {
                return Err("the load's server did not start".to_string());
            }
            gen.run(move || crate::blast::run(&bcfg, &b2, &mut |_| {}).map_err(|e| e.message))
                .map_err(|e| e.to_string())?
        });
        Ok(NetLoad {
            lab: name,
            stop,
            serve,
            blast,
        })
    }

    /// Stops both, takes the lab down: (datagrams sent, datagrams the server got, an error).
    fn finish(self) -> (u64, u64, Option<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let b = self
            .blast
            .join()
            .map_err(|_| "blast panicked".to_string())
            .and_then(|r| r);
        let s = self
            .serve
            .join()
            .map_err(|_| "serve panicked".to_string())
            .and_then(|r| r);
        let _ = flowlane_lab::setup::down(&self.lab);
        let sent = b
            .as_ref()
            .map_or(0, |r| r.steps.iter().map(|s| s.tx_packets).sum());
        let got = s.as_ref().map_or(0, |r| r.total.rx_packets);
        (sent, got, b.err().or(s.err()))
    }
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
            net: None,
        };
        if spec.kinds.contains(&LoadKind::Net) {
            load.net = Some(NetLoad::start(spec)?);
        }
        let dir = spec.io_dir.clone().unwrap_or_else(std::env::temp_dir);
        for &cpu in &spec.cpus {
            for t in 0..spec.threads.max(1) {
                for &kind in spec.kinds.iter().filter(|&&k| k != LoadKind::Net) {
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
                                (LoadKind::Io, None) | (LoadKind::Net, _) => {}
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
        let net = self.net.take().map(NetLoad::finish);
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
            net_sent: net.as_ref().map(|n| n.0),
            net_received: net.as_ref().map(|n| n.1),
            net_error: net.and_then(|n| n.2),
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
        if let Some(n) = self.net.take() {
            n.finish();
        }
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
