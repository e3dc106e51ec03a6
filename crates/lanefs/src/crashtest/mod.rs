//! Crash-consistency and fault harness (`lanefs crashtest`).
//!
//! Workloads run on a lanefs mounted over a [`crate::device::CrashDevice`] (a
//! [`crate::device::MemDevice`] inside), which logs every block write and flush. For every flush
//! point, and for subsets and reorderings of the writes in flight after it, the harness rebuilds
//! the device (a cheap [`overlay::Overlay`] over the shared base image), mounts it — recovery
//! runs — reads the whole tree back, checks it against the [`oracle`], unmounts, and runs fsck.
//!
//! Families of workloads:
//! - `seq1`, `seq2`: CrashMonkey ACE-style bounded sequences over creat, mkdir, link, unlink,
//!   rmdir, rename, write, falloc/punch, truncate, setxattr/removexattr, each followed by fsync
//!   or fdatasync of a file, fsync of a directory, or sync ([`gen`]).
//! - `random`: longer random mixes, some with a small page cache (writeback) or a small journal
//!   limit (background checkpoints during the workload).
//! - `mt-lanes`: two threads pinned to different CPUs (so different lanes), each in its own
//!   directory, fsyncing concurrently; `mt-cp`: the same with a third thread taking
//!   checkpoints (sync) over and over, so that crash states fall inside checkpoints' write
//!   phases while fsyncs run beside them; `mt-rename`: cross-directory renames racing with fsyncs
//!   of either directory. The oracle credits an fsync only with operations that returned
//!   before it was called.
//! - `gc`: files of a few MiB overwritten, replaced and truncated, with the segment cleaner run
//!   in between, so that crash states fall inside the checkpoints that move blocks.
//! - `faults`: a random mix with one device fault ([`workload::Fault`]): EIO on a write or a
//!   flush, a short write, a torn block. The call that hit it must fail; every state of the
//!   log, including the device as the run left it, must recover and keep every fsync
//!   acknowledged.
//! - `corrupt`: a deterministic corruption sweep over every kind of metadata block and over
//!   truncated images ([`corrupt`]); no panic, hang or unbounded allocation.
//!
//! With `--nvm` ([`Config::nvm`], [`nvm`]) every workload runs on a file system mounted with a
//! persistent-memory region (a scratch file in /dev/shm, NAT and lane journals in it, so an
//! fsync commits to the region instead of writing journal blocks). The device and the
//! region's recorder number their events from one shared clock
//! ([`crate::device::EventClock`]); a number is taken after the event happened and before
//! its call returned, so the merged order never puts a region persist before a device flush
//! that returned before the persist was issued. A crash state is a cut of that timeline: the
//! device durable up to its last flush below the cut plus subsets of the writes in flight,
//! and the region persisted up to the cut plus any subset of the 8-byte words stored since
//! their line was last persisted, each with any value it was given (torn stores of a
//! transaction, the TAIL word stored but not persisted). Cuts fall just before and after every
//! flush and every persist; the same [`Density`] bounds the states per cut. The history notes
//! positions on the same timeline, so "the fsync returned before the crash" means "before the
//! cut". Each state writes its region image to a scratch file, mounts (recovery runs), walks,
//! checks, unmounts and runs fsck with the region; one in four is first mounted read-only, one
//! in four remounted after fsck. There, `corrupt` damages the region of a crash state with
//! journal records instead (live words set to random or extreme values, bits flipped, lines
//! zeroed): mount must refuse it with an error or read it back, fsck must finish, never a
//! panic or a hang.
//!
//! Everything is derived from `--seed`; each violation prints the workload id and state index
//! that `--replay ID --state K` runs again (with `--nvm` if it was found with it). (Multi-threaded workloads replay the same operations,
//! not necessarily the same interleaving.)
//!
//! A crash state that does not finish within [`workload::STATE_TIMEOUT`] is a hang: the harness
//! reports it with the threads' stacks (by gdb, when installed), leaves the stuck thread
//! behind and goes on with a new one.
//!
//! A real-process crash (SIGKILL of the FUSE daemon, round after round on one image) is tested
//! through the mount, in `crates/lanefs-cli/tests/fuse_sigkill/`.

pub mod corrupt;
pub mod exec;
pub mod gen;
pub mod nvm;
pub mod ops;
pub mod oracle;
pub mod overlay;
pub mod states;
pub mod workload;

use crate::rng::{derive, Rng};
use parking_lot::Mutex;
use states::{Density, Prepared};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use workload::{record, Bases, Fault, Workload};

/// A family of workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    Seq1,
    Seq2,
    Random,
    MtLanes,
    MtRename,
    MtCheckpoint,
    Gc,
    Faults,
    Corrupt,
}

impl Family {
    pub const ALL: [Family; 9] = [
        Family::Seq1,
        Family::Seq2,
        Family::Random,
        Family::MtLanes,
        Family::MtRename,
        Family::MtCheckpoint,
        Family::Gc,
        Family::Faults,
        Family::Corrupt,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Seq1 => "seq1",
            Family::Seq2 => "seq2",
            Family::Random => "random",
            Family::MtLanes => "mt-lanes",
            Family::MtRename => "mt-rename",
            Family::MtCheckpoint => "mt-cp",
            Family::Gc => "gc",
            Family::Faults => "faults",
            Family::Corrupt => "corrupt",
        }
    }

    pub fn parse(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == s)
    }

    /// How much of the family a run covers: quick mode about a minute on two idle cores
    /// (at least 10,000 crash states without counting the corruption sweep), full mode over a
    /// million crash states. With a region (`nvm`) a workload has several times more crash
    /// states (a cut at every persist too) that are cheaper each, so quick mode takes twice
    /// the states of the bounded families, to check a reasonable number of workloads.
    fn budget(self, quick: bool, nvm: bool) -> Budget {
        let states = match (self, quick) {
            (Family::Seq1, _) | (Family::Corrupt, _) => u64::MAX,
            (Family::Seq2, true) => 4_000,
            (Family::Random, true) => 3_000,
            (Family::MtLanes, true) | (Family::MtRename, true) | (Family::MtCheckpoint, true) => 1_200,
            (Family::Faults, true) => 1_500,
            (Family::Gc, true) => 1_500,
            (Family::Gc, false) => 100_000,
            (Family::Seq2, false) => 450_000,
            (Family::Random, false) => 300_000,
            (Family::MtLanes, false) | (Family::MtRename, false) | (Family::MtCheckpoint, false) => 100_000,
            (Family::Faults, false) => 100_000,
        };
        let states = if quick && nvm { states.saturating_mul(2) } else { states };
        Budget { states }
    }
}

struct Budget {
    /// Stop taking new workloads once this many states were checked.
    states: u64,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub quick: bool,
    pub seed: u64,
    pub families: Vec<Family>,
    /// Worker threads (each takes whole workloads).
    pub threads: usize,
    /// Operation kinds left out of generated workloads ([`ops::Op::kind`]), to look past a
    /// known bug.
    pub avoid: Vec<String>,
    /// Mount every workload with a persistent-memory region ([`nvm`]).
    pub nvm: bool,
}

/// What the harness reports while it runs.
#[derive(Debug)]
pub enum Event<'a> {
    /// A family started.
    Family { family: Family, target: u64 },
    /// States checked so far in the current family.
    Progress { states: u64, violations: u64 },
    /// A violation (one or more lines of text).
    Violation(&'a str),
    /// Something worth saying that is not a violation.
    Note(&'a str),
}

/// Receives events; called from worker threads.
pub type Sink<'a> = &'a (dyn Fn(Event<'_>) + Sync);

/// Per-family figures.
#[derive(Debug, Clone)]
pub struct FamilySummary {
    pub family: Family,
    pub workloads: u64,
    pub states: u64,
    pub violations: u64,
    pub elapsed: Duration,
}

impl FamilySummary {
    /// Nothing run yet.
    pub fn empty(family: Family) -> FamilySummary {
        FamilySummary { family, workloads: 0, states: 0, violations: 0, elapsed: Duration::ZERO }
    }
}

/// The outcome of a run.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub families: Vec<FamilySummary>,
    pub states: u64,
    pub violations: u64,
    pub elapsed: Duration,
}

impl Summary {
    /// The last line of the report.
    pub fn last_line(&self) -> String {
        format!("crashtest: {} states, {} violations", self.states, self.violations)
    }
}

fn seq1_all() -> &'static Vec<Vec<ops::Op>> {
    static ALL: OnceLock<Vec<Vec<ops::Op>>> = OnceLock::new();
    ALL.get_or_init(gen::ace_seq1_all)
}

/// The key of the `i`-th workload of a family (an index for seq1, a seed otherwise).
fn family_key(f: Family, seed: u64, i: u64) -> u64 {
    match f {
        Family::Seq1 => {
            // A different order per seed, every workload once.
            let n = seq1_all().len() as u64;
            let mut order: Vec<u64> = (0..n).collect();
            Rng::new(seed).shuffle(&mut order);
            order.get(i as usize).copied().unwrap_or(u64::MAX)
        }
        _ => derive(seed, (f as u64) << 32 | i),
    }
}

fn workload_id(f: Family, key: u64) -> String {
    match f {
        Family::Seq1 => format!("seq1:{key}"),
        _ => format!("{}:{key:#x}", f.name()),
    }
}

/// Parses `family:key` (as printed in violations).
pub fn parse_id(id: &str) -> Result<(Family, u64), String> {
    let (f, k) = id.split_once(':').ok_or_else(|| format!("{id}: expected FAMILY:KEY"))?;
    let fam = Family::parse(f).ok_or_else(|| format!("{id}: unknown family {f}"))?;
    let key = match k.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => k.parse(),
    }
    .map_err(|_| format!("{id}: bad key {k}"))?;
    Ok((fam, key))
}

/// The `--avoid` name that leaves out the small journal limits under which background
/// checkpoints overlap a workload.
pub const BG_CHECKPOINT: &str = "bg-checkpoint";

/// Generates the workload `key` of family `f` (None: past the end of a finite family), without
/// the operation kinds in `avoid`, with a persistent-memory region when `nvm`.
pub fn make_workload(
    f: Family,
    key: u64,
    bases: &Bases,
    avoid: &[String],
    nvm: bool,
) -> Result<Option<Workload>, String> {
    let Some(mut w) = generate(f, key, bases, nvm)? else { return Ok(None) };
    for t in &mut w.threads {
        t.retain(|op| !avoid.iter().any(|a| a == op.kind()));
    }
    if avoid.iter().any(|a| a == BG_CHECKPOINT) {
        w.knobs.journal_blocks_limit = workload::Knobs::default().journal_blocks_limit;
    }
    Ok(Some(w))
}

fn generate(f: Family, key: u64, bases: &Bases, nvm: bool) -> Result<Option<Workload>, String> {
    let id = workload_id(f, key);
    let mut rng = Rng::new(key);
    let mut w = match f {
        Family::Seq1 => match seq1_all().get(key as usize) {
            Some(ops) => gen::ace_workload(id, ops.clone()),
            None => return Ok(None),
        },
        Family::Seq2 => gen::ace_workload(id, gen::ace_seq(2, &mut rng)),
        Family::Random => gen::random_workload(id, &mut rng),
        Family::MtLanes => gen::mt_lanes_workload(id, &mut rng),
        Family::MtRename => gen::mt_rename_workload(id, &mut rng),
        Family::MtCheckpoint => gen::mt_checkpoint_workload(id, &mut rng),
        Family::Gc => gen::gc_workload(id, &mut rng),
        Family::Faults => {
            let mut w = gen::fault_base(id, &mut rng);
            w.knobs.nvm = nvm;
            // A dry run counts the device calls, so the fault lands inside the workload.
            let dry = record(&w, bases)?;
            let writes = dry.write_calls.max(1);
            let flushes = dry.flush_calls.max(1);
            let mut r = Rng::new(derive(key, 0xFA17));
            let n = 1 + r.below(writes);
            w.fault = Some(match r.below(4) {
                0 => Fault::FailWrite(n),
                1 => Fault::ShortWrite(n, r.index(4)),
                2 => Fault::TornWrite(n, r.index(3), *r.pick(&[1, 512, 2048, 4000])),
                _ => Fault::FailFlush(1 + r.below(flushes)),
            });
            w
        }
        Family::Corrupt => return Err("corrupt cases are not workloads".into()),
    };
    w.knobs.nvm = nvm;
    Ok(Some(w))
}

fn density(quick: bool) -> Density {
    if quick {
        Density::QUICK
    } else {
        Density::FULL
    }
}

/// Text of one violating state.
fn state_line(p: &Prepared, k: usize, problems: &[String]) -> String {
    let s = &p.states[k];
    let mut line = format!("  state {k}/{} {}:", p.states.len(), s.describe(&p.flushes, p.window_len(s)));
    for m in problems.iter().take(8) {
        line.push_str("\n      - ");
        line.push_str(m);
    }
    if problems.len() > 8 {
        line.push_str(&format!("\n      - ... and {} more", problems.len() - 8));
    }
    line
}

/// Most states printed per workload (the count covers them all).
const MAX_PRINTED_STATES: usize = 40;

/// Checks every state of a recording; returns (states checked, violating states).
fn check_recording(
    p: &Prepared,
    only: Option<usize>,
    slot: &Mutex<Option<(Instant, String)>>,
    states_done: &AtomicU64,
) -> (u64, Vec<(usize, Vec<String>)>) {
    let mut bad = Vec::new();
    let mut n = 0;
    for k in 0..p.states.len() {
        if only.is_some_and(|o| o != k) {
            continue;
        }
        *slot.lock() = Some((Instant::now(), format!("{} state {k}", p.rec.workload.id)));
        let v = p.check_indexed(k);
        n += 1;
        states_done.fetch_add(1, Ordering::Relaxed);
        if !v.is_empty() {
            bad.push((k, v));
        }
    }
    *slot.lock() = None;
    (n, bad)
}

/// The report of one workload with violations.
fn workload_report(p: &Prepared, findings: &[String], bad: &[(usize, Vec<String>)]) -> String {
    let w = &p.rec.workload;
    let mut s = format!(
        "VIOLATION {}: {} violating state(s), {} finding(s)\n  workload: {}\n",
        w.id,
        bad.len(),
        findings.len(),
        w.describe()
    );
    for f in findings {
        s.push_str(&format!("  during the run: {f}\n"));
    }
    for (k, v) in bad.iter().take(MAX_PRINTED_STATES) {
        s.push_str(&state_line(p, *k, v));
        s.push('\n');
    }
    if bad.len() > MAX_PRINTED_STATES {
        s.push_str(&format!("  ... and {} more violating states\n", bad.len() - MAX_PRINTED_STATES));
    }
    let first = bad.first().map(|(k, _)| format!(" --state {k}")).unwrap_or_default();
    let nvm = if w.knobs.nvm { "--nvm " } else { "" };
    s.push_str(&format!("  replay: lanefs crashtest {nvm}--replay {}{first}", w.id));
    s
}

/// Runs the families of `cfg`. Returns the summary; the caller prints its last line.
pub fn run(cfg: &Config, sink: Sink) -> Summary {
    let start = Instant::now();
    let bases = Arc::new(Bases::default());
    let mut sum = Summary::default();
    for &f in &cfg.families {
        let fs = if f == Family::Corrupt && cfg.nvm {
            run_corrupt_region(cfg, &bases, sink, None)
        } else if f == Family::Corrupt {
            run_corrupt(cfg, &bases, sink, None)
        } else {
            run_family(cfg, f, &bases, sink)
        };
        sum.states += fs.states;
        sum.violations += fs.violations;
        sum.families.push(fs);
    }
    sum.elapsed = start.elapsed();
    sum
}

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
    *slot.lock() = None;
}

/// Runs one family on detached worker threads watched for hangs: a worker stuck in one state
/// longer than [`workload::STATE_TIMEOUT`] is reported (with thread stacks), left behind, and
/// replaced, up to [`MAX_HANGS`] times.
fn run_family(cfg: &Config, f: Family, bases: &Arc<Bases>, sink: Sink) -> FamilySummary {
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

/// The corruption sweep (sequential: one damaged image at a time, so that the memory check
/// measures that image alone). `only`: replay one case (reference name, index).
fn run_corrupt(cfg: &Config, bases: &Bases, sink: Sink, only: Option<(&str, usize)>) -> FamilySummary {
    let start = Instant::now();
    let mut out = FamilySummary::empty(Family::Corrupt);
    let refs = match corrupt::references(bases) {
        Ok(r) => r,
        Err(e) => {
            out.violations += 1;
            sink(Event::Violation(&format!("VIOLATION corrupt: could not build the reference images: {e}")));
            return out;
        }
    };
    let cases = corrupt_cases(cfg, &refs);
    sink(Event::Family { family: Family::Corrupt, target: cases.len() as u64 });
    let mut per_ref = vec![0usize; refs.len()];
    let (mut refused, mut mounted, mut walk_failed) = (0u64, 0u64, 0u64);
    for (ri, d) in cases {
        let idx = per_ref[ri];
        per_ref[ri] += 1;
        if let Some((name, k)) = only {
            if refs[ri].name != name || idx != k {
                continue;
            }
        }
        let dev = corrupt::damaged(&refs[ri], &d);
        out.states += 1;
        let id = format!("corrupt:{}:{idx}", refs[ri].name);
        match corrupt::run_case(dev) {
            corrupt::CaseResult::Done(o) => {
                match &o.mount_error {
                    Some(_) => refused += 1,
                    None => mounted += 1,
                }
                if o.walk_errors > 0 {
                    walk_failed += 1;
                }
                if only.is_some() {
                    sink(Event::Note(&format!(
                        "{id}: {d} ({} image): mount {}; {} walk errors; fsck {}",
                        refs[ri].name,
                        o.mount_error.as_deref().map_or("succeeded".to_string(), |e| format!("refused: {e}")),
                        o.walk_errors,
                        o.fsck
                    )));
                }
                if !o.violations.is_empty() {
                    out.violations += 1;
                    sink(Event::Violation(&format!(
                        "VIOLATION {id}: {d} ({} image): {}\n  replay: lanefs crashtest --replay {id}",
                        refs[ri].name,
                        o.violations.join("; ")
                    )));
                }
            }
            corrupt::CaseResult::Hang => {
                out.violations += 1;
                sink(Event::Violation(&format!(
                    "VIOLATION {id}: {d} ({} image): mount, walk or fsck did not finish within {} s (sweep stopped)\n  replay: lanefs crashtest --replay {id}",
                    refs[ri].name,
                    corrupt::CASE_TIMEOUT.as_secs()
                )));
                break;
            }
        }
        if out.states.is_multiple_of(16) {
            sink(Event::Progress { states: out.states, violations: out.violations });
        }
    }
    if only.is_none() {
        out.violations += run_decoder_cases(cfg, sink);
        note_corrupt_counts(&refs, out.states, (mounted, walk_failed, refused), sink);
    }
    out.elapsed = start.elapsed();
    out
}

/// The damaged images of the sweep, as (reference index, damage): each reference's
/// systematic sweep, then its random damage.
fn corrupt_cases(cfg: &Config, refs: &[corrupt::Reference]) -> Vec<(usize, corrupt::Damage)> {
    let mut cases: Vec<(usize, corrupt::Damage)> = Vec::new();
    for (ri, r) in refs.iter().enumerate() {
        cases.extend(corrupt::sweep(r, cfg.quick, cfg.seed).into_iter().map(|d| (ri, d)));
        let mut rng = Rng::new(derive(cfg.seed, 0xC0 + ri as u64));
        let n = if cfg.quick { 100 } else { 20_000 };
        cases.extend(corrupt::random_damage(r, &mut rng, n).into_iter().map(|d| (ri, d)));
    }
    cases
}

/// Structure-aware decoder cases (the entry point of the cargo-fuzz target): mutated blocks,
/// checksums fixed, through their decoders. Returns the violations (panics) found.
fn run_decoder_cases(cfg: &Config, sink: Sink) -> u64 {
    let n = if cfg.quick { 20_000 } else { 1_000_000 };
    let found = corrupt::decoder_cases(derive(cfg.seed, 0xDEC0), n);
    for v in &found {
        sink(Event::Violation(&format!("VIOLATION corrupt-decoder: {v}")));
    }
    sink(Event::Note(&format!(
        "corrupt: {n} mutated blocks (checksums fixed) through their decoders: {} panics",
        found.len()
    )));
    found.len() as u64
}

/// The sweep's closing note: how the `states` damaged images fared (mounted, of those with
/// read errors, refused) and the blocks of each kind the references hold.
fn note_corrupt_counts(
    refs: &[corrupt::Reference],
    states: u64,
    (mounted, walk_failed, refused): (u64, u64, u64),
    sink: Sink,
) {
    let kinds: Vec<String> = corrupt::Target::ALL
        .iter()
        .map(|t| {
            let n: usize = refs.iter().map(|r| r.blocks.iter().filter(|(k, _)| k == t).count()).sum();
            format!("{} {n}", t.name())
        })
        .collect();
    sink(Event::Note(&format!(
        "corrupt: {states} damaged images: {mounted} mounted and were read back ({walk_failed} with read errors), {refused} refused at mount; blocks found by kind: {}",
        kinds.join(", ")
    )));
}

/// The region corruption sweep of `--nvm` (the device images' sweep is the same as without a
/// region): damaged regions of a crash state with journal records, mounted, read back,
/// unmounted and checked by fsck; any outcome but a panic or a hang is fine. `only`: replay
/// one case.
fn run_corrupt_region(cfg: &Config, bases: &Bases, sink: Sink, only: Option<usize>) -> FamilySummary {
    let start = Instant::now();
    let mut out = FamilySummary::empty(Family::Corrupt);
    let r = match nvm::region_reference(bases) {
        Ok(r) => r,
        Err(e) => {
            out.violations += 1;
            sink(Event::Violation(&format!("VIOLATION corrupt-region: could not build the reference: {e}")));
            return out;
        }
    };
    let n = if cfg.quick { 300 } else { 10_000 };
    let cases = nvm::region_damages(&r, &mut Rng::new(derive(cfg.seed, 0xC0DE)), n);
    sink(Event::Family { family: Family::Corrupt, target: cases.len() as u64 });
    let (mut mounted, mut refused) = (0u64, 0u64);
    for (k, d) in cases.iter().enumerate() {
        if only.is_some_and(|o| o != k) {
            continue;
        }
        out.states += 1;
        let id = format!("corrupt-region:{k}");
        match nvm::run_region_case(&r, d) {
            Some((m, v)) => {
                if m {
                    mounted += 1;
                } else {
                    refused += 1;
                }
                if only.is_some() {
                    sink(Event::Note(&format!(
                        "{id}: {}: {}",
                        d.what,
                        if m { "mounted" } else { "refused" }
                    )));
                }
                if !v.is_empty() {
                    out.violations += 1;
                    sink(Event::Violation(&format!(
                        "VIOLATION {id}: {}: {}\n  replay: lanefs crashtest --nvm --replay {id}",
                        d.what,
                        v.join("; ")
                    )));
                }
            }
            None => {
                out.violations += 1;
                sink(Event::Violation(&format!(
                    "VIOLATION {id}: {}: mount, walk or fsck did not finish within {} s (sweep stopped)\n  replay: lanefs crashtest --nvm --replay {id}",
                    d.what,
                    corrupt::CASE_TIMEOUT.as_secs()
                )));
                break;
            }
        }
        if out.states.is_multiple_of(16) {
            sink(Event::Progress { states: out.states, violations: out.violations });
        }
    }
    sink(Event::Note(&format!(
        "corrupt (region): {} damaged regions ({} live words): {mounted} mounted and were read back, {refused} refused",
        out.states,
        r.stored.len()
    )));
    out.elapsed = start.elapsed();
    out
}

/// Runs one workload (by id, as printed in a violation) or one corruption case, verbosely.
/// `state`: only that crash state.
pub fn replay(cfg: &Config, id: &str, state: Option<usize>, sink: Sink) -> Summary {
    let start = Instant::now();
    let bases = Bases::default();
    let mut sum = Summary::default();
    if let Some(rest) = id.strip_prefix("corrupt-region:") {
        let Ok(k) = rest.parse::<usize>() else {
            sink(Event::Violation(&format!("VIOLATION {id}: expected corrupt-region:INDEX")));
            sum.violations = 1;
            return sum;
        };
        let fs = run_corrupt_region(cfg, &bases, sink, Some(k));
        sum.states = fs.states;
        sum.violations = fs.violations;
        sum.families.push(fs);
        sum.elapsed = start.elapsed();
        return sum;
    }
    if let Some(rest) = id.strip_prefix("corrupt:") {
        let Some((name, k)) = rest.split_once(':').and_then(|(n, k)| Some((n, k.parse::<usize>().ok()?)))
        else {
            sink(Event::Violation(&format!("VIOLATION {id}: expected corrupt:REFERENCE:INDEX")));
            sum.violations = 1;
            return sum;
        };
        let fs = run_corrupt(cfg, &bases, sink, Some((name, k)));
        sum.states = fs.states;
        sum.violations = fs.violations;
        sum.families.push(fs);
        sum.elapsed = start.elapsed();
        return sum;
    }
    let w = parse_id(id).and_then(|(f, key)| {
        make_workload(f, key, &bases, &cfg.avoid, cfg.nvm)?
            .ok_or_else(|| format!("{id}: no such workload"))
            .map(|w| (w, key))
    });
    match w {
        Ok((w, key)) => run_one(cfg, w, key, state, &bases, sink, &mut sum),
        Err(e) => {
            sink(Event::Violation(&format!("VIOLATION {id}: {e}")));
            sum.violations = 1;
        }
    }
    sum.elapsed = start.elapsed();
    sum
}

/// Runs a script (see [`ops`]) as a workload, verbosely.
pub fn run_script(cfg: &Config, setup: workload::Setup, text: &str, sink: Sink) -> Summary {
    let start = Instant::now();
    let bases = Bases::default();
    let mut sum = Summary::default();
    match Workload::from_script(setup, text) {
        Ok(mut w) => {
            w.knobs.nvm |= cfg.nvm;
            run_one(cfg, w, cfg.seed, None, &bases, sink, &mut sum)
        }
        Err(e) => {
            sink(Event::Violation(&format!("VIOLATION script: {e}")));
            sum.violations = 1;
        }
    }
    sum.elapsed = start.elapsed();
    sum
}

fn run_one(
    cfg: &Config,
    w: Workload,
    key: u64,
    state: Option<usize>,
    bases: &Bases,
    sink: Sink,
    sum: &mut Summary,
) {
    let rec = match record(&w, bases) {
        Ok(r) => r,
        Err(e) => {
            sink(Event::Violation(&format!("VIOLATION {}: could not run: {e}", w.id)));
            sum.violations += 1;
            return;
        }
    };
    let findings = rec.findings.clone();
    let p = Prepared::new(rec, derive(key, 0x57A7E), density(cfg.quick));
    let timeline = match &p.rec.region {
        Some(run) => format!(
            "\n  timeline: {} events ({} device, {} region), device flushes at positions {:?}; \
             history positions are timeline points",
            run.end,
            run.dev_seqs.len(),
            run.trace.events().len(),
            p.flushes.iter().map(|&f| run.dev_seqs[f]).collect::<Vec<_>>()
        ),
        None => String::new(),
    };
    sink(Event::Note(&format!(
        "{}: {}\n  write log: {} entries, flushes at {:?}, crash at {}{timeline}\n  {} crash states\n  operations:\n{}  file versions:\n{}",
        w.id,
        w.describe(),
        p.rec.log.len(),
        p.flushes,
        p.rec.crash_at,
        p.states.len(),
        p.rec.hist.listing(),
        p.rec.hist.file_listing()
    )));
    let slot = Mutex::new(None);
    let done = AtomicU64::new(0);
    let (n, bad) = check_recording(&p, state, &slot, &done);
    sum.states += n;
    if !bad.is_empty() || !findings.is_empty() {
        sum.violations += (bad.len() + findings.len()) as u64;
        sink(Event::Violation(&workload_report(&p, &findings, &bad)));
    }
}

/// Checks one workload given as a script, at the given density; returns every violation as
/// text (empty: none). For regression tests.
pub fn check_script(setup: workload::Setup, text: &str, quick: bool) -> Vec<String> {
    let cfg = Config { quick, seed: 1, families: vec![], threads: 1, avoid: vec![], nvm: false };
    let out = Mutex::new(Vec::new());
    let sink = |e: Event<'_>| {
        if let Event::Violation(v) = e {
            out.lock().push(v.to_string());
        }
    };
    run_script(&cfg, setup, text, &sink);
    out.into_inner()
}

/// As [`check_script`] for a workload of several threads or with a fault.
pub fn check_workload(w: Workload, quick: bool) -> Vec<String> {
    let cfg = Config { quick, seed: 1, families: vec![], threads: 1, avoid: vec![], nvm: false };
    let out = Mutex::new(Vec::new());
    let sink = |e: Event<'_>| {
        if let Event::Violation(v) = e {
            out.lock().push(v.to_string());
        }
    };
    let mut sum = Summary::default();
    run_one(&cfg, w, 1, None, &Bases::default(), &sink, &mut sum);
    out.into_inner()
}
