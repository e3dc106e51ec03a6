//! Workloads: what runs on the recording device, and the recording it leaves.
//!
//! With [`Knobs::nvm`] the file system is mounted with a persistent-memory region (a scratch
//! file in /dev/shm, a copy of the base image's region, removed when the run ends) whose
//! recorder shares an [`EventClock`] with the [`CrashDevice`]: every position the history
//! notes (an operation's start, an fsync's return) is then a point of that one timeline of
//! device and region events, not an index in the device log.

use super::exec::Exec;
use super::nvm::{region_options, Scratch};
use super::ops::{parse_script, script, Op};
use super::oracle::{walk, Acked, History};
use super::overlay::{Overlay, WriteLog};
use crate::crash_device::{CrashDevice, FaultPlan};
use lanefs::device::{BlockDevice, EventClock, IoMode, MemDevice, ReadReq, WriteReq};
use lanefs::testing::pmem::RegionTrace;
use lanefs::{Fs, FsOptions, MkfsOptions};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::Duration;

/// Image size of every workload: large enough that random mixes do not run out of segments.
pub const IMAGE_BYTES: u64 = 64 << 20;
/// Lanes of every image: two, so that two threads can work in different lanes.
pub const LANES: u32 = 2;

/// What the image holds before a workload starts (durable: written and unmounted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setup {
    /// The root directory alone.
    Empty,
    /// CrashMonkey's ACE file set: directories A, B, A/C and files with data and an xattr.
    Ace,
}

impl Setup {
    /// The setup's name in workload ids.
    pub fn name(self) -> &'static str {
        match self {
            Setup::Empty => "empty",
            Setup::Ace => "ace",
        }
    }

    /// The setup named `s`, if any.
    pub fn parse(s: &str) -> Option<Setup> {
        match s {
            "empty" => Some(Setup::Empty),
            "ace" => Some(Setup::Ace),
            _ => None,
        }
    }

    /// The operations that build it.
    pub fn ops(self) -> Vec<Op> {
        let s = match self {
            Setup::Empty => "",
            Setup::Ace => {
                "mkdir /A; mkdir /B; mkdir /A/C; create /foo; write /foo 0 8192 1; \
                 create /A/foo; write /A/foo 0 5000 2; create /A/bar; \
                 create /B/bar; write /B/bar 0 12288 3; setxattr /B/bar user.x 24 4"
            }
        };
        parse_script(s).expect("setup scripts parse")
    }
}

/// A device fault to inject (counted from the first call after mount, from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The nth write call fails and writes nothing.
    FailWrite(u64),
    /// The nth write call lands only its first `blocks` blocks.
    ShortWrite(u64, usize),
    /// The nth write call lands `blocks` blocks and `bytes` bytes of the next.
    TornWrite(u64, usize, usize),
    /// The nth flush fails.
    FailFlush(u64),
}

impl Fault {
    /// The device fault plan that injects this fault.
    pub fn plan(self) -> FaultPlan {
        match self {
            Fault::FailWrite(n) => FaultPlan::new().fail_write(n),
            Fault::ShortWrite(n, b) => FaultPlan::new().short_write(n, b),
            Fault::TornWrite(n, b, bytes) => FaultPlan::new().torn_write(n, b, bytes),
            Fault::FailFlush(n) => FaultPlan::new().fail_flush(n),
        }
    }
}

impl Fault {
    /// Parses the script form: `fault fail-write N`, `fault short-write N BLOCKS`,
    /// `fault torn-write N BLOCKS BYTES`, `fault fail-flush N`.
    pub fn parse(s: &str) -> Result<Fault, String> {
        let w: Vec<&str> = s.split_whitespace().collect();
        let n = |i: usize| -> Result<u64, String> {
            w.get(i).and_then(|x| x.parse().ok()).ok_or_else(|| format!("`{s}`: missing or bad number"))
        };
        match w.get(1).copied() {
            Some("fail-write") => Ok(Fault::FailWrite(n(2)?)),
            Some("short-write") => Ok(Fault::ShortWrite(n(2)?, n(3)? as usize)),
            Some("torn-write") => Ok(Fault::TornWrite(n(2)?, n(3)? as usize, n(4)? as usize)),
            Some("fail-flush") => Ok(Fault::FailFlush(n(2)?)),
            _ => Err(format!("`{s}`: expected fault fail-write|short-write|torn-write|fail-flush ...")),
        }
    }

    /// The script form.
    pub fn script(self) -> String {
        match self {
            Fault::FailWrite(n) => format!("fault fail-write {n}"),
            Fault::ShortWrite(n, b) => format!("fault short-write {n} {b}"),
            Fault::TornWrite(n, b, bytes) => format!("fault torn-write {n} {b} {bytes}"),
            Fault::FailFlush(n) => format!("fault fail-flush {n}"),
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::FailWrite(n) => write!(f, "write call {n} fails (EIO)"),
            Fault::ShortWrite(n, b) => write!(f, "write call {n} is short ({b} blocks land, EIO)"),
            Fault::TornWrite(n, b, bytes) => {
                write!(f, "write call {n} is torn ({b} blocks and {bytes} bytes of the next land, EIO)")
            }
            Fault::FailFlush(n) => write!(f, "flush call {n} fails (EIO)"),
        }
    }
}

/// Mount options of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    /// Page cache size (small: writeback runs during the workload).
    pub cache_bytes: u64,
    /// Journal size that kicks a background checkpoint.
    pub journal_blocks_limit: u64,
    /// Mount with a persistent-memory region (`lanefs crashtest --nvm`): NAT and lane journals
    /// in the region, crash states from the merged timeline of device and region events.
    pub nvm: bool,
    /// Test-only fault: the device acknowledges flushes without making anything durable (a
    /// lying write cache), so a region commit can outrun the data it maps. Generated workloads
    /// never set it; it exists to show that the harness sees such a bug.
    #[doc(hidden)]
    pub lying_flushes: bool,
    /// Test-only fault: crash states are built as if the region never persisted anything
    /// (any store may be lost, a commit word may land without its entry). Never set by
    /// generated workloads.
    #[doc(hidden)]
    pub lying_persists: bool,
}

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs {
            cache_bytes: 256 << 20,
            journal_blocks_limit: 1 << 20,
            nvm: false,
            lying_flushes: false,
            lying_persists: false,
        }
    }
}

impl Knobs {
    /// The mount options these knobs ask for.
    pub fn options(self) -> FsOptions {
        FsOptions {
            cache_bytes: self.cache_bytes,
            checkpoint_interval: None,
            journal_blocks_limit: self.journal_blocks_limit,
            ..Default::default()
        }
    }
}

/// One workload: a setup, one operation list per thread, mount options, maybe a fault.
#[derive(Debug, Clone)]
pub struct Workload {
    /// `family:seed`, enough to generate it again (`lanefs crashtest --replay`).
    pub id: String,
    /// The files the workload starts from.
    pub setup: Setup,
    /// One operation list per thread.
    pub threads: Vec<Vec<Op>>,
    /// Mount options and modes.
    pub knobs: Knobs,
    /// The device fault to inject, if any.
    pub fault: Option<Fault>,
}

impl Workload {
    /// A single-threaded workload from a script (see [`super::ops`]). Besides operations, the
    /// script may hold a `fault ...` item ([`Fault::parse`]) and the mount options
    /// `cache-bytes N`, `journal-limit N` and `nvm` (mount with a persistent-memory region).
    pub fn from_script(setup: Setup, text: &str) -> Result<Workload, String> {
        let mut fault = None;
        let mut knobs = Knobs::default();
        let mut rest = Vec::new();
        for item in text.split(['\n', ';']) {
            let item = item.trim();
            let num = |s: &str| s.trim().parse::<u64>().map_err(|_| format!("`{item}`: bad number"));
            if item.starts_with("fault ") {
                fault = Some(Fault::parse(item)?);
            } else if let Some(n) = item.strip_prefix("cache-bytes ") {
                knobs.cache_bytes = num(n)?;
            } else if let Some(n) = item.strip_prefix("journal-limit ") {
                knobs.journal_blocks_limit = num(n)?;
            } else if item == "nvm" {
                knobs.nvm = true;
            } else {
                rest.push(item);
            }
        }
        Ok(Workload {
            id: "script".into(),
            setup,
            threads: vec![parse_script(&rest.join("; "))?],
            knobs,
            fault,
        })
    }

    /// The mount options and fault as script items (empty when defaults).
    fn script_prefix(&self) -> String {
        let mut items = Vec::new();
        let d = Knobs::default();
        if self.knobs.cache_bytes != d.cache_bytes {
            items.push(format!("cache-bytes {}", self.knobs.cache_bytes));
        }
        if self.knobs.journal_blocks_limit != d.journal_blocks_limit {
            items.push(format!("journal-limit {}", self.knobs.journal_blocks_limit));
        }
        if self.knobs.nvm {
            items.push("nvm".into());
        }
        if let Some(f) = self.fault {
            items.push(f.script());
        }
        items.iter().map(|i| format!("{i}; ")).collect()
    }

    /// The workload as text: setup, fault, and each thread's script (for one thread, a script
    /// that `lanefs crashtest --setup S --script` runs again, mount options included).
    pub fn describe(&self) -> String {
        let mut s = format!("setup {}", self.setup.name());
        if let Some(f) = self.fault {
            s.push_str(&format!(", fault: {f}"));
        }
        for (t, ops) in self.threads.iter().enumerate() {
            let prefix = if t == 0 { self.script_prefix() } else { String::new() };
            s.push_str(&format!("\n    thread {t}: {prefix}{}", script(ops)));
        }
        s
    }
}

/// A base image and its history.
pub struct BaseImage {
    /// The image's bytes.
    pub image: Arc<Vec<u8>>,
    /// The bytes of its persistent-memory region (built with [`Knobs::nvm`]): the image's
    /// checkpoint is flagged, so it mounts only with them.
    pub region: Option<Arc<Vec<u8>>>,
    /// What building it did, the oracle's starting point.
    pub hist: History,
}

type BaseCell = OnceLock<Result<Arc<BaseImage>, String>>;

/// Base images, built on first use: per setup, without and with a region.
#[derive(Default)]
pub struct Bases {
    empty: [BaseCell; 2],
    ace: [BaseCell; 2],
}

impl Bases {
    /// The base image of setup `s` (without a region), built on first use.
    pub fn get(&self, s: Setup) -> Result<Arc<BaseImage>, String> {
        self.get_for(s, false)
    }

    /// The base of `s`, with a region when `nvm`.
    pub fn get_for(&self, s: Setup, nvm: bool) -> Result<Arc<BaseImage>, String> {
        let cell = match s {
            Setup::Empty => &self.empty[nvm as usize],
            Setup::Ace => &self.ace[nvm as usize],
        };
        cell.get_or_init(|| build_base(s, nvm).map(Arc::new)).clone()
    }
}

fn build_base(setup: Setup, nvm: bool) -> Result<BaseImage, String> {
    let dev = Arc::new(MemDevice::new(IMAGE_BYTES));
    Fs::format(&*dev, &MkfsOptions { lanes: LANES, ..Default::default() })
        .map_err(|e| format!("mkfs: {e}"))?;
    // With a region: the first mount creates and seeds it (its checkpoint flags the image).
    let scratch = if nvm { Some(Scratch::empty("base")?) } else { None };
    let with_region = |o: FsOptions, s: &Option<Scratch>| match s {
        Some(s) => FsOptions { nvm: Some(s.path().to_path_buf()), ..region_options(o, None) },
        None => o,
    };
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, with_region(Knobs::default().options(), &scratch))
        .map_err(|e| format!("mount of a new image: {e}"))?;
    let hist = Mutex::new(History::default());
    let findings = Mutex::new(Vec::new());
    let exec = Exec {
        fs: &fs,
        events: &|| 0,
        io_errors: &|| 0,
        hist: &hist,
        thread: 0,
        findings: &findings,
        handles: Default::default(),
    };
    for op in setup.ops() {
        exec.run(&op).map_err(|e| format!("setup `{op}`: {e}"))?;
    }
    fs.unmount().map_err(|e| format!("unmount after setup: {e}"))?;
    let image = Arc::new(dev.snapshot());
    let region = match &scratch {
        Some(s) => Some(Arc::new(s.read()?)),
        None => None,
    };
    // Read back from a copy (the region's too), as every crash state will be.
    let copy = match &region {
        Some(r) => Some(Scratch::with_bytes("base-check", r)?),
        None => None,
    };
    let ov = Arc::new(Overlay::new(image.clone()));
    let fs = Fs::open(ov as Arc<dyn BlockDevice>, with_region(Knobs::default().options(), &copy))
        .map_err(|e| format!("mount of the base image: {e}"))?;
    let rec = walk(&fs);
    drop(fs);
    if !rec.problems.is_empty() {
        return Err(format!("walk of the base image: {}", rec.problems.join("; ")));
    }
    Ok(BaseImage { image, region, hist: History::from_recovered(&rec) })
}

/// A device whose flushes return success and do nothing ([`Knobs::lying_flushes`]).
struct LyingFlushes(Arc<dyn BlockDevice>);

impl BlockDevice for LyingFlushes {
    fn block_count(&self) -> u64 {
        self.0.block_count()
    }
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        self.0.read_batch(reqs)
    }
    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> io::Result<()> {
        self.0.write_batch(reqs)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn io_mode(&self) -> IoMode {
        self.0.io_mode()
    }
    fn describe(&self) -> String {
        format!("lying flushes over {}", self.0.describe())
    }
}

/// Counts calls to a device and the errors it returns.
pub struct Probe {
    inner: Arc<dyn BlockDevice>,
    /// Write batches passed down.
    pub writes: AtomicU64,
    /// Flushes passed down.
    pub flushes: AtomicU64,
    /// Calls that returned an error.
    pub errors: AtomicU64,
}

impl Probe {
    /// Counts the calls to `inner`.
    pub fn new(inner: Arc<dyn BlockDevice>) -> Probe {
        Probe { inner, writes: AtomicU64::new(0), flushes: AtomicU64::new(0), errors: AtomicU64::new(0) }
    }
    fn count<T>(&self, r: io::Result<T>) -> io::Result<T> {
        if r.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

impl BlockDevice for Probe {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        let r = self.inner.read_batch(reqs);
        self.count(r)
    }
    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let r = self.inner.write_batch(reqs);
        self.count(r)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let r = self.inner.flush();
        self.count(r)
    }
    fn io_mode(&self) -> IoMode {
        self.inner.io_mode()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// What running a workload left: the write log and the history.
pub struct Recording {
    /// The workload run.
    pub workload: Workload,
    /// The base image it started from.
    pub base: Arc<Vec<u8>>,
    /// Every block write and flush that reached the device, in order.
    pub log: WriteLog,
    /// What it did, for the oracle.
    pub hist: History,
    /// Problems seen while it ran (not tied to a crash state).
    pub findings: Vec<String>,
    /// Log length when the workload ended (the crash), before the unmount's writes.
    pub crash_at: usize,
    /// Device write and flush calls the run made.
    pub write_calls: u64,
    /// Device flush calls the run made.
    pub flush_calls: u64,
    /// With [`Knobs::nvm`]: the region's side of the timeline.
    pub region: Option<RegionRun>,
}

/// What the region of an nvm run recorded, and where the device's events fall on the shared
/// timeline.
pub struct RegionRun {
    /// Region events with their positions on the timeline.
    pub trace: RegionTrace,
    /// Position on the timeline of each device event (indexed as [`Recording::log`]).
    pub dev_seqs: Vec<u64>,
    /// Events on the timeline in all (device and region), unmount included.
    pub end: u64,
}

/// Pins the calling thread to the `k`-th CPU it may run on (best effort: lanes follow the CPU).
fn pin(k: usize) {
    if let Ok(allowed) = rustix::thread::sched_getaffinity(None) {
        let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c)).collect();
        if cpus.len() > 1 {
            let mut set = rustix::thread::CpuSet::new();
            set.set(cpus[k % cpus.len()]);
            let _ = rustix::thread::sched_setaffinity(None, &set);
        }
    }
}

/// Whether the workload `id` runs with `FsOptions::nvm_inline_pages` (half of them, by id).
fn inline_pages(id: &str) -> bool {
    crc32c::crc32c(id.as_bytes()) % 2 == 1
}

/// Runs `w` on a recording device over its base image (shared, written over privately). The
/// run ends in a crash (the log is what reached the device) followed by an unmount whose writes
/// are logged too, so crash states during the final checkpoint are checked and the last state
/// must hold everything.
pub fn record(w: &Workload, bases: &Bases) -> Result<Recording, String> {
    let nvm = w.knobs.nvm;
    let base = bases.get_for(w.setup, nvm)?;
    // The base is shared, not copied: a copy of the whole image per workload was half of a
    // run's time (page faults and memmove of two 50 MiB copies).
    let clock = EventClock::new();
    let crash = Arc::new(CrashDevice::with_clock(Overlay::new(base.image.clone()), clock.clone()));
    let below: Arc<dyn BlockDevice> = if w.knobs.lying_flushes {
        Arc::new(LyingFlushes(crash.clone() as Arc<dyn BlockDevice>))
    } else {
        crash.clone()
    };
    let probe = Arc::new(Probe::new(below));
    // Removed when the recording is done: crash states write their own region files.
    let scratch = match &base.region {
        Some(r) => Some(Scratch::with_bytes("run", r)?),
        None if nvm => return Err("the base image has no region".into()),
        None => None,
    };
    let opts = run_options(w, scratch.as_ref(), &clock);
    let fs = Fs::open(probe.clone() as Arc<dyn BlockDevice>, opts)
        .map_err(|e| format!("mount of the base image: {e}"))?;
    let recording = match (nvm, fs.nvm().and_then(|n| n.region().recording())) {
        (true, None) => return Err("the mount kept no recorded region".into()),
        (_, r) => r,
    };
    if let Some(f) = w.fault {
        crash.set_fault_plan(f.plan());
        probe.writes.store(0, Ordering::Relaxed);
        probe.flushes.store(0, Ordering::Relaxed);
    }
    // The base image is durable as a whole.
    let mut h0 = base.hist.clone();
    let all = h0.promise_all();
    h0.acked.push(Acked { ev_end: 0, op: "setup (the base image)".into(), promises: all });
    let hist = Mutex::new(h0);
    let findings = Mutex::new(Vec::new());
    // Positions in the history: device log indices, or points of the shared timeline (the
    // clock counts both logs' events) with a region.
    let events = || if nvm { clock.now() as usize } else { crash.event_count() };
    let errors = || probe.errors.load(Ordering::Relaxed);
    run_threads(w, &fs, &events, &errors, &hist, &findings);
    let mut findings = findings.into_inner();
    let mut hist = hist.into_inner();
    let live = walk(&fs);
    findings.extend(hist.compare_live(&live).into_iter().map(|m| format!("before the crash: {m}")));
    let crash_at = events();
    unmount(fs, &mut hist, &mut findings, (&events, &errors), w.fault.is_none());
    let dev_events = crash.events();
    let log = WriteLog::from_events(&dev_events);
    let region = recording.map(|r| RegionRun {
        trace: if w.knobs.lying_persists { r.trace().without_persists() } else { r.trace() },
        dev_seqs: dev_events.iter().map(|e| e.seq).collect(),
        end: clock.now(),
    });
    drop(scratch);
    Ok(Recording {
        workload: w.clone(),
        base: base.image.clone(),
        log,
        hist,
        findings,
        crash_at,
        write_calls: probe.writes.load(Ordering::Relaxed),
        flush_calls: probe.flushes.load(Ordering::Relaxed),
        region,
    })
}

/// The mount options of `w`'s run: with a region (the scratch copy of the base's), small
/// fsyncs' pages go inline in every other workload.
fn run_options(w: &Workload, scratch: Option<&Scratch>, clock: &EventClock) -> FsOptions {
    match scratch {
        Some(s) => FsOptions {
            nvm: Some(s.path().to_path_buf()),
            // Every other workload logs small fsyncs' pages inline in the region.
            nvm_inline_pages: Some(if inline_pages(&w.id) { 4 } else { 0 }),
            ..region_options(w.knobs.options(), Some(clock.clone()))
        },
        None => w.knobs.options(),
    }
}

/// Runs `w`'s operations on `fs`, one thread per op list (pinned, started together), each
/// recorded in `hist`.
fn run_threads(
    w: &Workload,
    fs: &Fs,
    events: &(dyn Fn() -> usize + Sync),
    errors: &(dyn Fn() -> u64 + Sync),
    hist: &Mutex<History>,
    findings: &Mutex<Vec<String>>,
) {
    if w.threads.len() == 1 {
        let exec =
            Exec { fs, events, io_errors: errors, hist, thread: 0, findings, handles: Default::default() };
        for op in &w.threads[0] {
            let _ = exec.run(op);
        }
        return;
    }
    let barrier = Barrier::new(w.threads.len());
    std::thread::scope(|s| {
        for (t, ops) in w.threads.iter().enumerate() {
            let barrier = &barrier;
            s.spawn(move || {
                pin(t);
                let exec = Exec {
                    fs,
                    events,
                    io_errors: errors,
                    hist,
                    thread: t,
                    findings,
                    handles: Default::default(),
                };
                barrier.wait();
                for op in ops {
                    let _ = exec.run(op);
                }
            });
        }
    });
}

/// Unmounts `fs` at the end of a run; its checkpoint makes everything durable (contract 3),
/// so a clean unmount is acknowledged as promising all. `expect_ok`: a failure is a finding
/// (no fault was injected).
fn unmount(
    fs: Fs,
    hist: &mut History,
    findings: &mut Vec<String>,
    (events, errors): (&dyn Fn() -> usize, &dyn Fn() -> u64),
    expect_ok: bool,
) {
    let promises = hist.promise_all();
    let errs = errors();
    match fs.unmount() {
        Ok(()) if errors() > errs => {
            findings.push("unmount: the device returned an error, but unmount succeeded".into())
        }
        Ok(()) => hist.acked.push(Acked { ev_end: events(), op: "unmount".into(), promises }),
        Err(e) if expect_ok => findings.push(format!("unmount failed: {e}")),
        Err(_) => {}
    }
}

/// How long one crash state may take before the harness calls it a hang.
pub const STATE_TIMEOUT: Duration = Duration::from_secs(60);
