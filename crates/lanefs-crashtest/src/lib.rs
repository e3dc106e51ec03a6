//! lanefs's crash-consistency and fault harness: the search behind `lanefs crashtest`. It runs
//! generated workloads on a lanefs whose device (and persistent-memory region) record every
//! write, flush and persist, rebuilds every image a crash could leave, and checks that each
//! one mounts, keeps what the durability contract (docs/ARCHITECTURE.md) promised and passes
//! fsck. The CLI's `crashtest` command, the fuzz targets and the engine's crash tests (a
//! dev-dependency of `lanefs`) use it; the engine itself never does.
//!
//! # What is here and what stayed in the engine
//!
//! Everything that only *uses* the engine through its traits and API lives here: the search
//! (workload generation, crash-state enumeration, the oracle, the corruption sweeps) and the
//! crash-recording block device [`CrashDevice`], which is just another
//! [`lanefs::BlockDevice`]. What stays in the engine is what the engine itself calls into:
//! the region's recorder (`pmem/crash.rs`), which the region's store and persist paths feed
//! and which must see every 8-byte store as it happens, with its crash model beside it (the
//! engine's own unit tests of the region's NAT and journal protocols enumerate crash images
//! with it, and they cannot name a type from a crate that depends on the engine); and the
//! [`lanefs::device::EventClock`] that recorder shares with [`CrashDevice`]. The engine
//! internals the harness needs come through the hidden `lanefs::testing` module (its module
//! doc lists them): batch validation for the device, the checkpoint reader and journal decoder
//! for the corruption sweep, and the region's crash model for `--nvm`.
//!
//! # How it works
//!
//! Workloads run on a lanefs mounted over a [`CrashDevice`] (a [`lanefs::MemDevice`] inside),
//! which logs every block write and flush. For every flush
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
//! ([`lanefs::device::EventClock`]); a number is taken after the event happened and before
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
//!
//! This file holds what a run is given and reports, and the check of one recording's states
//! that every way of running shares; each way of running has a child: `ids` (each family's
//! workloads, derived from the seed and named by an id that reproduces them), `pool` (a family
//! on worker threads watched for hangs), `sweep` (the corruption sweeps) and `replay` (one
//! workload, verbosely: a replayed id, a script, a regression check).

pub mod corrupt;
pub mod crash_device;
pub mod exec;
pub mod gen;
mod ids;
pub mod nvm;
pub mod ops;
pub mod oracle;
pub mod overlay;
mod pool;
mod replay;
pub mod states;
mod sweep;
pub mod workload;

pub use crash_device::{
    flush_points, in_flight_after, state_at, state_with_subset, CrashDevice, CrashEvent, EventKind,
    FaultPlan, WriteFault,
};
pub use ids::{make_workload, parse_id, BG_CHECKPOINT};
pub use replay::{check_script, check_workload, replay, run_script};

use parking_lot::Mutex;
use states::{Density, Prepared};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::Bases;

use pool::run_family;
use sweep::{run_corrupt, run_corrupt_region};

/// A family of workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// `seq1`: ACE-style sequences of one operation and its persistence point.
    Seq1,
    /// `seq2`: ACE-style sequences of two.
    Seq2,
    /// `random`: longer random mixes, some with a small cache or journal.
    Random,
    /// `mt-lanes`: threads on different lanes fsyncing concurrently.
    MtLanes,
    /// `mt-rename`: cross-directory renames racing with fsyncs.
    MtRename,
    /// `mt-cp`: fsyncs beside back-to-back checkpoints.
    MtCheckpoint,
    /// `gc`: large files rewritten with the cleaner run between.
    Gc,
    /// `faults`: a random mix with one device fault.
    Faults,
    /// `corrupt`: the deterministic corruption sweep.
    Corrupt,
}

impl Family {
    /// Every family, in the order a full run takes them.
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

    /// The family's name on the command line.
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

    /// The family named `s`, if any.
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
    /// Fewer workloads and crash states per family (CI's `--quick`).
    pub quick: bool,
    /// Seed every workload and state choice derives from.
    pub seed: u64,
    /// The families to run.
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
    Family {
        /// The family.
        family: Family,
        /// How many states (or corruption cases) it aims at, for a progress bar.
        target: u64,
    },
    /// States checked so far in the current family.
    Progress {
        /// Crash states checked.
        states: u64,
        /// Violations found.
        violations: u64,
    },
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
    /// The family.
    pub family: Family,
    /// Workloads run.
    pub workloads: u64,
    /// Crash states checked.
    pub states: u64,
    /// Violations found.
    pub violations: u64,
    /// Time taken.
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
    /// Per family, in the order run.
    pub families: Vec<FamilySummary>,
    /// Crash states checked in all.
    pub states: u64,
    /// Violations found in all.
    pub violations: u64,
    /// Time taken.
    pub elapsed: Duration,
}

impl Summary {
    /// The last line of the report.
    pub fn last_line(&self) -> String {
        format!("crashtest: {} states, {} violations", self.states, self.violations)
    }
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
