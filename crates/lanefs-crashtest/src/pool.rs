//! A family run on detached worker threads, watched for hangs.
//!
//! Workers take whole workloads until the family's budget of states is spent. A worker stuck
//! in one state past `workload::STATE_TIMEOUT` is reported with the threads' stacks, left
//! behind (a thread cannot be killed) and replaced, a bounded number of times, so a hang
//! costs the run one thread and never stops it.

use super::states::{Density, Prepared};
use super::workload::{record, Bases};
use lanefs::rng::derive;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ids::{family_key, make_workload, workload_id};
use super::{
    check_recording, density, workload, workload_report, Budget, Config, Event, Family, FamilySummary, Sink,
};

/// What the workers of a family share.
struct FamilyShared {
    cfg: Config,
    family: Family,
    bases: Arc<Bases>,
    budget: Budget,
    density: Density,
    next: AtomicU64,
    workloads: AtomicU64,
    states_done: AtomicU64,
    exhausted: AtomicBool,
}

/// What a worker tells the watchdog.
enum Msg {
    /// A report and the number of violations in it.
    Violation(u64, String),
    /// The worker with this id ended.
    Done(usize),
}

/// What a worker is doing, and since when (None: between workloads or done).
type Slot = Arc<Mutex<Option<(Instant, String)>>>;

/// Most hangs a family survives: each leaves a thread behind.
const MAX_HANGS: usize = 4;

/// Takes workloads until the budget is spent, and checks all their states.
fn family_worker(
    sh: &FamilyShared,
    slot: &Mutex<Option<(Instant, String)>>,
    tx: &std::sync::mpsc::Sender<Msg>,
) {
    let f = sh.family;
    // Bounded by the budget: each round takes a new workload index.
    while !sh.exhausted.load(Ordering::Relaxed) && sh.states_done.load(Ordering::Relaxed) < sh.budget.states {
        let i = sh.next.fetch_add(1, Ordering::Relaxed);
        let key = family_key(f, sh.cfg.seed, i);
        *slot.lock() = Some((Instant::now(), format!("{} (generating and recording)", workload_id(f, key))));
        let w = match make_workload(f, key, &sh.bases, &sh.cfg.avoid, sh.cfg.nvm) {
            Ok(Some(w)) => w,
            Ok(None) => {
                sh.exhausted.store(true, Ordering::Relaxed);
                break;
            }
            Err(e) => {
                let _ = tx.send(Msg::Violation(
                    1,
                    format!("VIOLATION {}: could not run: {e}", workload_id(f, key)),
                ));
                continue;
            }
        };
        let rec = match record(&w, &sh.bases) {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.send(Msg::Violation(1, format!("VIOLATION {}: could not run: {e}", w.id)));
                continue;
            }
        };
        sh.workloads.fetch_add(1, Ordering::Relaxed);
        let findings = rec.findings.clone();
        let p = Prepared::new(rec, derive(key, 0x57A7E), sh.density);
        let (_, bad) = check_recording(&p, None, slot, &sh.states_done);
        if !bad.is_empty() || !findings.is_empty() {
            let n = (bad.len() + findings.len()) as u64;
            let _ = tx.send(Msg::Violation(n, workload_report(&p, &findings, &bad)));
        }
    }
    super::nvm::drop_state_file();
    *slot.lock() = None;
}

/// Runs one family on detached worker threads watched for hangs: a worker stuck in one state
/// longer than [`workload::STATE_TIMEOUT`] is reported (with thread stacks), left behind, and
/// replaced, up to [`MAX_HANGS`] times.
pub(super) fn run_family(cfg: &Config, f: Family, bases: &Arc<Bases>, sink: Sink) -> FamilySummary {
    let start = Instant::now();
    let budget = f.budget(cfg.quick, cfg.nvm);
    sink(Event::Family { family: f, target: budget.states.min(1 << 40) });
    let sh = Arc::new(FamilyShared {
        cfg: cfg.clone(),
        family: f,
        bases: bases.clone(),
        budget,
        density: density(cfg.quick),
        next: AtomicU64::new(0),
        workloads: AtomicU64::new(0),
        states_done: AtomicU64::new(0),
        exhausted: AtomicBool::new(false),
    });
    let (tx, rx) = std::sync::mpsc::channel::<Msg>();
    let mut violations = 0u64;
    let mut live: Vec<(usize, Slot)> = Vec::new();
    let mut next_id = 0usize;
    let spawn = |id: usize| -> std::io::Result<Slot> {
        let slot: Slot = Arc::new(Mutex::new(None));
        let (sh, slot2, tx) = (sh.clone(), slot.clone(), tx.clone());
        std::thread::Builder::new().name(format!("crashtest-{}", f.name())).spawn(move || {
            family_worker(&sh, &slot2, &tx);
            let _ = tx.send(Msg::Done(id));
        })?;
        Ok(slot)
    };
    for _ in 0..cfg.threads.max(1) {
        match spawn(next_id) {
            Ok(slot) => live.push((next_id, slot)),
            Err(e) => {
                violations += 1;
                sink(Event::Violation(&format!("VIOLATION {}: could not start a worker: {e}", f.name())));
            }
        }
        next_id += 1;
    }
    let mut hangs = 0usize;
    // Bounded: every worker ends (budget) or is left behind (at most MAX_HANGS replacements).
    while !live.is_empty() {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Msg::Violation(n, text)) => {
                violations += n;
                sink(Event::Violation(&text));
            }
            Ok(Msg::Done(id)) => live.retain(|(i, _)| *i != id),
            Err(_) => {}
        }
        sink(Event::Progress { states: sh.states_done.load(Ordering::Relaxed), violations });
        let stuck: Vec<(usize, String)> = live
            .iter()
            .filter_map(|(id, slot)| {
                slot.lock().as_ref().and_then(|(t, what)| {
                    (t.elapsed() > workload::STATE_TIMEOUT).then(|| (*id, what.clone()))
                })
            })
            .collect();
        for (id, what) in stuck {
            violations += 1;
            hangs += 1;
            sink(Event::Violation(&format!(
                "VIOLATION hang: {what} did not finish within {} s (its thread is left behind){}",
                workload::STATE_TIMEOUT.as_secs(),
                thread_stacks()
            )));
            live.retain(|(i, _)| *i != id);
            if hangs <= MAX_HANGS {
                if let Ok(slot) = spawn(next_id) {
                    live.push((next_id, slot));
                }
                next_id += 1;
            } else {
                sink(Event::Note(&format!("{}: too many hangs, family stopped", f.name())));
                sh.exhausted.store(true, Ordering::Relaxed);
            }
        }
    }
    FamilySummary {
        family: f,
        workloads: sh.workloads.load(Ordering::Relaxed),
        states: sh.states_done.load(Ordering::Relaxed),
        violations,
        elapsed: start.elapsed(),
    }
}

/// The stacks of this process's threads, by gdb if it is installed (best effort, for the
/// report of a hang; only lanefs frames are kept).
fn thread_stacks() -> String {
    let pid = std::process::id().to_string();
    let out = std::process::Command::new("timeout")
        .args(["30", "gdb", "-p", &pid, "-batch", "-ex", "thread apply all bt 40"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    let Ok(out) = out else { return String::new() };
    let text = String::from_utf8_lossy(&out.stdout);
    let keep: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("Thread ") || (l.starts_with('#') && l.contains("lanefs::")))
        .map(|l| l.split(" at /").next().unwrap_or(l))
        .collect();
    if keep.is_empty() {
        String::new()
    } else {
        format!("\n  thread stacks (gdb):\n    {}", keep.join("\n    "))
    }
}
