//! One run: a workload with N threads against one target for S seconds.
//!
//! Sequence: sync the target (what earlier runs left dirty is not this run's) and note how full
//! it is, make a fresh run directory, prepare the files, build each thread's worker (all
//! untimed), then release the threads together. They run a warm-up (caches, allocator, journal
//! reach a steady state; nothing recorded), then the timed phase; the main thread flips the phase
//! for all of them at once and measures the phase's length itself. The target's write counters
//! ([`Target::io_counters`], lanefs through the library) are read when the threads are released
//! and after the last op, so their difference covers warm-up and timed phase. The FUSE request
//! counters of a lanefs mount ([`Target::fuse_requests`]) are read when the timed phase starts
//! and after the last op, so that requests per op compare like with like. An op is counted
//! when it started inside the timed phase. Finally the run directory is removed through the
//! target, also when the run failed or was interrupted.

use crate::hist::Histogram;
use crate::progress::say;
use crate::target::{remove_tree, IoCounters, Target};
use crate::workload::{prepare, Env, Plan, Step, Workload};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// Set by SIGINT/SIGTERM/SIGHUP once [`install_signal_handlers`] ran; runs stop at the next check and
/// everything set up is cleaned up on the way out.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Makes Ctrl-C, SIGTERM and SIGHUP (a closed terminal) request a clean stop instead of killing
/// the process, so that run directories, mounts and loop devices are removed. Idempotent.
pub fn install_signal_handlers() -> Result<(), String> {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        // The handler only stores `true` to the flag; the runs poll it.
        signal_hook::flag::register(sig, std_flag())
            .map_err(|e| format!("cannot handle signal {sig}: {e}"))?;
    }
    Ok(())
}

/// The flag the signal handlers set (signal-hook takes an `Arc<AtomicBool>`).
fn std_flag() -> std::sync::Arc<AtomicBool> {
    static FLAG: std::sync::OnceLock<std::sync::Arc<AtomicBool>> = std::sync::OnceLock::new();
    FLAG.get_or_init(|| std::sync::Arc::new(AtomicBool::new(false))).clone()
}

/// Whether a stop was requested (signal, or [`request_stop`]).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed) || std_flag().load(Ordering::Relaxed)
}

/// Asks running and future runs to stop, as a signal would.
pub fn request_stop() {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Length and sizing of one run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Timed phase.
    pub seconds: f64,
    /// Untimed phase before it.
    pub warmup: f64,
    /// Fraction of the default file-set sizes; 1.0 for real measurements, smaller for smoke
    /// tests.
    pub scale: f64,
}

impl RunConfig {
    /// The warm-up used when none is given: a quarter of the timed phase, between 50 ms and 2 s.
    pub fn default_warmup(seconds: f64) -> f64 {
        (seconds / 4.0).clamp(0.05, 2.0)
    }
}

/// The outcome of one run.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The target's label (its spec, or the reference name in --compare).
    pub target: String,
    pub fs_type: String,
    pub workload: Workload,
    pub threads: usize,
    /// Measured length of the timed phase.
    pub seconds: f64,
    pub ops: u64,
    /// Sum over threads of ops / (timed phase - that thread's housekeeping time).
    pub ops_per_sec: f64,
    /// Latency of every counted op, all threads merged.
    pub latency: Histogram,
    /// Sync latency (fsync, or O_DSYNC writes for oltp) for workloads that sync.
    pub fsync: Option<Histogram>,
    pub notes: Vec<String>,
    /// Fraction of the target's capacity in use when the run started ([`Target::space`]).
    pub fill: Option<f64>,
    /// The target's write counters over the warm-up and the timed phase (lanefs through the
    /// library only): from the release of the threads to the end of the last op.
    pub io: Option<IoCounters>,
    /// The FUSE requests served in the timed phase, by opcode (a lanefs mount only).
    pub requests: Option<Vec<(String, u64)>>,
    /// lanefs's contended lock acquisitions over the timed phase, per class (lanefs through
    /// the library only; the process's counts, and one target runs at a time).
    pub census: Option<lanefs::sync::Census>,
}

const WARM: u8 = 0;
const TIMED: u8 = 1;
const STOP: u8 = 2;

#[derive(Default)]
struct ThreadOut {
    ops: u64,
    /// Housekeeping intervals that may touch the timed phase; only their overlap with it is kept
    /// out of the rate (one that began in the warm-up, or ran past the end, counts only in part).
    maintained: Vec<(Instant, Instant)>,
    latency: Histogram,
    fsync: Histogram,
}

/// How much of the intervals falls inside [start, end].
fn overlap(intervals: &[(Instant, Instant)], start: Instant, end: Instant) -> Duration {
    intervals.iter().map(|&(a, b)| b.min(end).saturating_duration_since(a.max(start))).sum()
}

/// Removes the run directory when dropped, so that an error or a panic cleans up as well.
struct RunDir<'a> {
    target: &'a dyn Target,
    path: PathBuf,
    armed: bool,
}

impl RunDir<'_> {
    fn finish(mut self) -> Result<(), String> {
        self.armed = false;
        remove_tree(self.target, &self.path).map_err(|e| format!("cleanup of {}: {e}", self.path.display()))
    }
}

impl Drop for RunDir<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = remove_tree(self.target, &self.path) {
                say(&format!("lanefs bench: cleanup of {}: {e}", self.path.display()));
            }
        }
    }
}

/// A name no earlier run of this process (or a crashed one with another pid) used.
fn make_run_dir(t: &dyn Target) -> Result<PathBuf, String> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    for _ in 0..100 {
        let p = PathBuf::from(format!(
            "lanefs-bench-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match t.mkdir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("{}: cannot create a run directory: {e}", t.spec())),
        }
    }
    Err(format!("{}: cannot find a free run directory name", t.spec()))
}

/// One benchmark thread: builds its worker, meets the others at `barrier`, then runs
/// operations until `phase` says stop, timing those of the timed phase. Any error stops every
/// thread.
fn worker_thread(
    plan: &Plan,
    env: &Env,
    tid: usize,
    phase: &AtomicU8,
    barrier: &Barrier,
) -> std::io::Result<ThreadOut> {
    let worker = plan.worker(env, tid);
    // Every thread reaches the barrier, even one whose setup failed, so that
    // nobody waits forever; the failure stops the others right after.
    barrier.wait();
    let mut worker = match worker {
        Ok(wk) => wk,
        Err(e) => {
            phase.store(STOP, Ordering::SeqCst);
            return Err(e);
        }
    };
    let mut out = ThreadOut::default();
    let mut scratch = Histogram::new();
    loop {
        let p = phase.load(Ordering::Relaxed);
        if p == STOP {
            break;
        }
        let timed = p == TIMED;
        let t0 = Instant::now();
        let step = match worker.op(if timed { &mut out.fsync } else { &mut scratch }) {
            Ok(s) => s,
            Err(e) => {
                phase.store(STOP, Ordering::SeqCst);
                return Err(e);
            }
        };
        if timed && step != Step::Uncounted {
            out.latency.record(t0.elapsed());
            out.ops += 1;
        }
        if step == Step::Maintain {
            let m0 = Instant::now();
            if let Err(e) = worker.maintain() {
                phase.store(STOP, Ordering::SeqCst);
                return Err(e);
            }
            if phase.load(Ordering::Relaxed) != WARM {
                out.maintained.push((m0, Instant::now()));
            }
        }
    }
    Ok(out)
}

/// The threads' results as one: merged histograms, operations, and the throughput (each
/// thread's operations over the time it was not maintaining its files, summed). The first
/// failed thread's error, with its index, instead.
fn merge_threads(
    outs: Vec<std::io::Result<ThreadOut>>,
    t0: Instant,
    elapsed: Duration,
) -> Result<(Histogram, Histogram, u64, f64), (usize, std::io::Error)> {
    let mut latency = Histogram::new();
    let mut fsync = Histogram::new();
    let (mut ops, mut rate) = (0u64, 0.0f64);
    for (tid, o) in outs.into_iter().enumerate() {
        let o = o.map_err(|e| (tid, e))?;
        latency.merge(&o.latency);
        fsync.merge(&o.fsync);
        ops += o.ops;
        let active =
            elapsed.saturating_sub(overlap(&o.maintained, t0, t0 + elapsed)).max(Duration::from_micros(100));
        rate += o.ops as f64 / active.as_secs_f64();
    }
    Ok((latency, fsync, ops, rate))
}

/// Runs `w` with `threads` threads against `t`. `label` names the target in the result.
pub fn run_one(
    t: &dyn Target,
    label: &str,
    w: Workload,
    threads: usize,
    cfg: &RunConfig,
) -> Result<RunResult, String> {
    if threads == 0 {
        return Err("threads must be at least 1".into());
    }
    if interrupted() {
        return Err("interrupted".into());
    }
    let ctx = |e: std::io::Error| format!("{label} {w} {threads}T: {e}");
    // What earlier runs left dirty (their removed files included) is settled first: it is not
    // this run's fill, and its writing is not this run's device traffic.
    t.sync().map_err(|e| format!("{label} {w} {threads}T: sync before the run: {e}"))?;
    let fill = t
        .space()
        .ok()
        .filter(|&(total, _)| total > 0)
        .map(|(total, free)| total.saturating_sub(free) as f64 / total as f64);
    let dir = RunDir { target: t, path: make_run_dir(t)?, armed: true };
    let env =
        Env { target: t, dir: dir.path.clone(), threads, scale: cfg.scale, notes: Mutex::new(Vec::new()) };
    let plan = prepare(w, &env).map_err(ctx)?;

    let phase = AtomicU8::new(WARM);
    let barrier = Barrier::new(threads + 1);
    let (outs, elapsed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|tid| {
                let (plan, env, phase, barrier) = (&plan, &env, &phase, &barrier);
                s.spawn(move || worker_thread(plan, env, tid, phase, barrier))
            })
            .collect();
        barrier.wait();
        // Workers built their state before the barrier: the counters cover warm-up and
        // timed phase (and whatever background writing happens meanwhile).
        let io0 = t.io_counters();
        let wait = |secs: f64| {
            let end = Instant::now() + Duration::from_secs_f64(secs);
            while Instant::now() < end && phase.load(Ordering::Relaxed) != STOP && !interrupted() {
                std::thread::sleep(
                    Duration::from_millis(5).min(end.saturating_duration_since(Instant::now())),
                );
            }
        };
        wait(cfg.warmup);
        // Warm-up over (unless a thread failed): start the clock for everyone at once.
        let req0 = t.fuse_requests();
        let census0 = t.lock_census();
        let t0 = Instant::now();
        let _ = phase.compare_exchange(WARM, TIMED, Ordering::SeqCst, Ordering::SeqCst);
        wait(cfg.seconds);
        phase.store(STOP, Ordering::SeqCst);
        let elapsed = t0.elapsed();
        let census = census0.and_then(|a| Some(t.lock_census()?.since(&a)));
        let outs: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("benchmark thread panicked"))))
            .collect();
        let io = match (io0, t.io_counters()) {
            (Some(a), Some(b)) => Some(b.since(&a)),
            _ => None,
        };
        let requests = match (req0, t.fuse_requests()) {
            (Some(a), Some(b)) => Some(lanefs_fuse::stats::since(&b, &a)),
            _ => None,
        };
        (outs, (t0, elapsed, io, requests, census))
    });
    let (t0, elapsed, io, requests, census) = elapsed;

    let (latency, fsync, ops, rate) = merge_threads(outs, t0, elapsed)
        .map_err(|(tid, e)| format!("{label} {w} {threads}T, thread {tid}: {e}"))?;
    if interrupted() {
        return Err("interrupted".into());
    }
    let notes = env.notes.into_inner().unwrap_or_else(|e| e.into_inner());
    dir.finish()?;
    Ok(RunResult {
        target: label.to_string(),
        fs_type: t.fs_type(),
        workload: w,
        threads,
        seconds: elapsed.as_secs_f64(),
        ops,
        ops_per_sec: rate,
        latency,
        fsync: w.has_fsync().then_some(fsync),
        notes,
        fill,
        io,
        requests,
        census,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn housekeeping_counts_only_inside_the_timed_phase() {
        let s = Instant::now() + Duration::from_secs(10);
        let ms = Duration::from_millis;
        let e = s + ms(100);
        // Begun in the warm-up, inside, run past the end, entirely before, entirely after.
        let iv = [
            (s - ms(50), s + ms(10)),
            (s + ms(20), s + ms(30)),
            (s + ms(90), e + ms(500)),
            (s - ms(90), s - ms(80)),
            (e + ms(1), e + ms(2)),
        ];
        assert_eq!(overlap(&iv, s, e), ms(10) + ms(10) + ms(10));
        assert_eq!(overlap(&[], s, e), Duration::ZERO);
    }
}
