//! Crash states of a run with a persistent-memory region (`lanefs crashtest --nvm`).
//!
//! The device ([`crate::CrashDevice`]) and the region's recorder
//! (`lanefs::testing::pmem::RegionRecording`) number their events from one
//! [`lanefs::device::EventClock`], so the two logs form one timeline ([`RegionRun`]). A crash
//! state is a cut `c` of that timeline — every event numbered below `c` happened, none after
//! — and a choice of what of the volatile part survived:
//!
//! - device: everything up to its last flush below `c` is durable; any subset of the writes
//!   logged after that flush and below `c` may have landed, in any order;
//! - region: the content persisted by the persists below `c`; any subset of the words stored
//!   since their line was last persisted may hold any of the values stored since (aligned
//!   8-byte stores are never torn; `lanefs::testing::pmem::PmemCrash`).
//!
//! A cut never puts a region event before a device event that preceded it in real time: a
//! number is taken after the event happened and before its call returned, so a persist that
//! commits an fsync, issued after the flush of the fsync's data returned, is numbered after
//! that flush, and any cut that keeps the persist keeps the flush.
//!
//! Cuts are taken just before and just after every device flush and every region persist
//! (just before: the writes and stores since the last one are all in flight, the stored but
//! unpersisted TAIL word of an append included), at the start and at the end. The mount that
//! precedes the first operation resets the lane journals the same way for every workload of a
//! setup, so its cuts are checked for one workload in eight (chosen by the seed). Per cut the
//! [`Density`] bounds the states: device-only and region-only variants (prefixes, random
//! subsets, all but one, every subset of small windows; for the region also "only the newest
//! word", the commit word without its entry, and "all but the newest"), and a few mixed ones.
//!
//! The oracle counts positions on the same timeline: an fsync whose return was noted at
//! position `e` is honoured in every state cut at `c >= e`, and an object may show a version
//! made by an operation that started before the last event the state contains.
//!
//! Each state writes its region image over its worker's scratch file in /dev/shm
//! ([`Scratch`], removed when the worker ends), mounts the device overlay with it (recovery
//! runs, read-write, so the journals are replayed and reset by a checkpoint), walks the tree,
//! checks it, unmounts and runs fsck with the region. One state in four is first mounted
//! read-only (recovery into memory: it must read the same tree), and one in four is mounted
//! again after fsck (the tree must not change).

use super::oracle::{check, walk, Recovered};
use super::overlay::{Overlay, WriteLog};
use super::states::{panic_text, Density, StateSpec};
use super::workload::RegionRun;
use lanefs::device::{BlockDevice, EventClock};
use lanefs::rng::{derive, Rng};
use lanefs::testing::pmem::{RegionEvent, MIN_REGION_SIZE};
use lanefs::FsckOptions;
use lanefs::RegionOptions;
use lanefs::{Fs, FsOptions};
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Mount options with a region of the smallest size (the 64 MiB images fit it), recorded
/// with `clock` when given.
pub fn region_options(o: FsOptions, clock: Option<EventClock>) -> FsOptions {
    FsOptions {
        nvm_size: Some(MIN_REGION_SIZE),
        nvm_region: RegionOptions { record: clock.is_some(), clock, ..Default::default() },
        ..o
    }
}

/// A region file of the harness, removed on drop.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

/// Numbers scratch files of this process.
static NEXT_SCRATCH: AtomicU64 = AtomicU64::new(0);

impl Scratch {
    /// A name for a file that does not exist yet (a mount creates the region there).
    pub fn empty(what: &str) -> Result<Scratch, String> {
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() { dir.to_path_buf() } else { std::env::temp_dir() };
        let n = NEXT_SCRATCH.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("lanefs-crashtest-{}-{n}-{what}.nvm", std::process::id()));
        // A leftover of an earlier process with the same pid: ours to replace.
        let _ = std::fs::remove_file(&path);
        Ok(Scratch { path })
    }

    /// A file holding `bytes`.
    pub fn with_bytes(what: &str, bytes: &[u8]) -> Result<Scratch, String> {
        let s = Scratch::empty(what)?;
        s.write(bytes)?;
        Ok(s)
    }

    /// Replaces the file's contents with `bytes`, writing over the pages it has: a file
    /// written again at the same size keeps them all (truncating first would free and allocate
    /// them again).
    pub fn write(&self, bytes: &[u8]) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        let err = |e: std::io::Error| format!("{}: {e}", self.path.display());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .map_err(err)?;
        f.write_all_at(bytes, 0).map_err(err)?;
        f.set_len(bytes.len() as u64).map_err(err)
    }

    /// The file's contents.
    pub fn read(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.path).map_err(|e| format!("{}: {e}", self.path.display()))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Pending words at a cut: (offset, [(value, position of its store)]), in offset order (the
/// order of `PmemCrash::pending`).
type Pending = Vec<(usize, Vec<(u64, u64)>)>;

/// What a state keeps of the volatile part: device writes, region words (pending index, value
/// index).
type Choice = (Vec<usize>, Vec<(usize, usize)>);

/// The pending words at each of `cuts` (increasing), in one pass over the region's events.
fn pending_at(run: &RegionRun, cuts: &[u64]) -> Vec<Pending> {
    let mut out = Vec::with_capacity(cuts.len());
    let mut pending = lanefs::testing::pmem::crash::PendingWords::default();
    let mut events = run.trace.events().iter().peekable();
    for &c in cuts {
        // Bounded: each round consumes one event.
        while let Some(&&(seq, e)) = events.peek() {
            if seq >= c {
                break;
            }
            events.next();
            pending.apply(seq, e, |_, _| {});
        }
        out.push(pending.0.iter().map(|(&o, v)| (o, v.clone())).collect());
    }
    out
}

/// The crash states of an nvm recording (see the module comment). Cuts strictly between 0 and
/// `skip_below` are left out: the mount before the first operation (journal resets) is the
/// same for every workload of a setup, so only some workloads check it again.
pub fn plan(log: &WriteLog, run: &RegionRun, seed: u64, d: Density, skip_below: u64) -> Vec<StateSpec> {
    let flushes = log.flush_points();
    let seq = |i: usize| run.dev_seqs.get(i).copied().unwrap_or(u64::MAX);
    let mut cuts: BTreeSet<u64> = [0, run.end].into_iter().collect();
    for &f in &flushes {
        cuts.extend([seq(f), seq(f) + 1]);
    }
    for &(s, e) in run.trace.events() {
        if matches!(e, RegionEvent::Persist { .. }) {
            cuts.extend([s, s + 1]);
        }
    }
    let cuts: Vec<u64> = cuts.into_iter().filter(|&c| c <= run.end && (c == 0 || c >= skip_below)).collect();
    let pend = pending_at(run, &cuts);
    let mut rng = Rng::new(derive(seed, 0x004E_564D));
    let mut out = Vec::new();
    for (&c, pending) in cuts.iter().zip(&pend) {
        let k = flushes.partition_point(|&f| seq(f) < c);
        let flush = k.checked_sub(1);
        let win: Vec<usize> = log.window(flush.map(|k| flushes[k])).filter(|&i| seq(i) < c).collect();
        let mut seen: BTreeSet<Choice> = BTreeSet::new();
        let mut push = |extra: Vec<usize>, region: Vec<(usize, usize)>, what: &'static str| {
            if seen.insert((extra.clone(), region.clone())) {
                out.push(StateSpec { flush, extra, what, cut: Some(c), region });
            }
        };
        push(vec![], vec![], "exact");
        // Device variants, the region as persisted.
        let n = win.len();
        if n > 0 {
            if n <= d.exhaustive_up_to {
                for mask in 1u32..(1 << n) {
                    push((0..n).filter(|i| mask & (1 << i) != 0).map(|i| win[i]).collect(), vec![], "subset");
                }
            }
            push(win.clone(), vec![], "all");
            for _ in 0..d.prefixes {
                push(win[..1 + rng.index(n)].to_vec(), vec![], "prefix");
            }
            for _ in 0..d.subsets {
                push(random_writes(&win, &mut rng), vec![], "reordered subset");
            }
            for _ in 0..d.drop_one {
                if n > 1 {
                    let skip = rng.index(n);
                    push((0..n).filter(|&i| i != skip).map(|i| win[i]).collect(), vec![], "all but one");
                }
            }
        }
        // Region variants, the device as flushed.
        let m = pending.len();
        if m > 0 {
            let latest = |i: usize| (i, pending[i].1.len() - 1);
            if m <= d.exhaustive_up_to {
                for mask in 1u32..(1 << m) {
                    push(vec![], (0..m).filter(|i| mask & (1 << i) != 0).map(latest).collect(), "words");
                }
            }
            push(vec![], (0..m).map(latest).collect(), "all words");
            // The word stored last (the TAIL of an append, a COMMIT word) alone, and all but it.
            let newest = (0..m).max_by_key(|&i| pending[i].1.last().map_or(0, |x| x.1)).unwrap_or(0);
            push(vec![], vec![latest(newest)], "newest word only");
            push(vec![], (0..m).filter(|&i| i != newest).map(latest).collect(), "all but the newest word");
            for _ in 0..d.subsets {
                push(vec![], random_words(pending, &mut rng), "random words");
            }
            for _ in 0..d.drop_one {
                if m > 1 {
                    let skip = rng.index(m);
                    push(vec![], (0..m).filter(|&i| i != skip).map(latest).collect(), "all words but one");
                }
            }
        }
        // Both.
        if n > 0 && m > 0 {
            push(win.clone(), (0..m).map(|i| (i, pending[i].1.len() - 1)).collect(), "everything");
            for _ in 0..d.subsets {
                push(random_writes(&win, &mut rng), random_words(pending, &mut rng), "mixed");
            }
        }
    }
    out
}

/// A random subset of `win` in random order.
fn random_writes(win: &[usize], rng: &mut Rng) -> Vec<usize> {
    let mut extra: Vec<usize> = win.iter().copied().filter(|_| rng.chance(1, 2)).collect();
    rng.shuffle(&mut extra);
    extra
}

/// A random subset of the pending words, each with one of its values.
fn random_words(pending: &Pending, rng: &mut Rng) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (i, (_, values)) in pending.iter().enumerate() {
        if rng.chance(1, 2) {
            out.push((i, rng.index(values.len())));
        }
    }
    out
}

/// Extra mounts of a state, beyond the read-write recovery every state gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extra {
    /// Only the read-write recovery.
    None,
    /// A read-only mount first (recovery into memory), which must show the same tree.
    ReadOnlyFirst,
    /// After fsck, a read-write remount, which must show the same tree, and fsck again.
    Remount,
}

impl Extra {
    /// The extra mounts of the `k`-th state of a recording.
    pub fn for_state(k: usize) -> Extra {
        match k % 4 {
            1 => Extra::ReadOnlyFirst,
            3 => Extra::Remount,
            _ => Extra::None,
        }
    }
}

/// The tree as a reader sees it (what two mounts of one state must agree on).
fn same_tree(a: &Recovered, b: &Recovered) -> bool {
    a.entries == b.entries && a.files == b.files && a.kinds == b.kinds
}

fn options(region: &Path, read_only: bool) -> FsOptions {
    FsOptions {
        checkpoint_interval: None,
        read_only,
        nvm: Some(region.to_path_buf()),
        ..region_options(FsOptions::default(), None)
    }
}

fn fsck_lines(dev: &Overlay, region: &Path, when: &str) -> Option<String> {
    let opts = FsckOptions { nvm: Some(region.to_path_buf()), ..Default::default() };
    match lanefs::fsck(dev, &opts) {
        Ok(r) if r.is_clean() => None,
        Ok(r) => {
            let ps: Vec<String> =
                r.problems.iter().take(6).map(|p| format!("{}: {}", p.structure, p.message)).collect();
            Some(format!("fsck {when}: {} problem(s): {}", r.problems.len(), ps.join("; ")))
        }
        Err(e) => Some(format!("fsck {when} could not run: {e}")),
    }
}

/// Checks one nvm crash state: `dev` and the region image `region` (written to a scratch file
/// here); `durable` and `upper` as for [`check`].
pub fn check_state(
    hist: &super::oracle::History,
    dev: Arc<Overlay>,
    region: &[u8],
    durable: usize,
    upper: usize,
    extra: Extra,
) -> Vec<String> {
    // One file per worker thread, written over in place: a new file per state cost a tenth of
    // a run in page-cache allocation and truncation. A state that panics may leak a mount still
    // mapping the file, so its file is not handed to the next state.
    let scratch = match STATE_FILE.with(|f| f.borrow_mut().take()).map_or_else(|| Scratch::empty("state"), Ok)
    {
        Ok(s) => s,
        Err(e) => return vec![format!("could not make the region image: {e}")],
    };
    if let Err(e) = scratch.write(region) {
        return vec![format!("could not write the region image: {e}")];
    }
    let path = scratch.path();
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut v = Vec::new();
        let mut ro_tree = None;
        if extra == Extra::ReadOnlyFirst {
            // Read-only: replays into memory, writes neither the device nor the region.
            match Fs::open(dev.clone() as Arc<dyn BlockDevice>, options(path, true)) {
                Ok(fs) => {
                    let got = walk(&fs);
                    drop(fs);
                    v.extend(
                        check(hist, &got, durable, upper).into_iter().map(|m| format!("read-only: {m}")),
                    );
                    ro_tree = Some(got);
                }
                Err(e) => return vec![format!("read-only mount failed: {e}")],
            }
        }
        let fs = match Fs::open(dev.clone() as Arc<dyn BlockDevice>, options(path, false)) {
            Ok(f) => f,
            Err(e) => {
                v.push(format!("mount failed: {e}"));
                return v;
            }
        };
        // A panic below leaks the mount rather than unwinding through its Drop (a second panic
        // there would abort the whole run).
        let fs = std::mem::ManuallyDrop::new(fs);
        let got = walk(&fs);
        v.extend(check(hist, &got, durable, upper));
        if ro_tree.as_ref().is_some_and(|t| !same_tree(t, &got)) {
            v.push("the read-only mount showed another tree than the read-write one".into());
        }
        if let Err(e) = std::mem::ManuallyDrop::into_inner(fs).unmount() {
            v.push(format!("unmount after recovery failed: {e}"));
        }
        v.extend(fsck_lines(&dev, path, "after recovery"));
        if extra == Extra::Remount {
            match Fs::open(dev.clone() as Arc<dyn BlockDevice>, options(path, false)) {
                Ok(fs) => {
                    let fs = std::mem::ManuallyDrop::new(fs);
                    let again = walk(&fs);
                    if !same_tree(&got, &again) {
                        let mut d = check(hist, &again, durable, upper);
                        d.truncate(3);
                        v.push(format!("the remount showed another tree: {}", d.join("; ")));
                    }
                    if let Err(e) = std::mem::ManuallyDrop::into_inner(fs).unmount() {
                        v.push(format!("unmount after the remount failed: {e}"));
                    }
                    v.extend(fsck_lines(&dev, path, "after the remount"));
                }
                Err(e) => v.push(format!("remount failed: {e}")),
            }
        }
        v
    }));
    match r {
        Ok(v) => {
            STATE_FILE.with(|f| *f.borrow_mut() = Some(scratch));
            v
        }
        Err(p) => vec![format!("panic: {}", panic_text(&*p))],
    }
}

/// Removes this thread's region file now: a worker calls it when it is done, since the
/// process may end before a finished thread's thread-local destructors have run.
pub fn drop_state_file() {
    STATE_FILE.with(|f| drop(f.borrow_mut().take()));
}

thread_local! {
    /// The region file [`check_state`] reuses on this thread (removed by [`drop_state_file`],
    /// or when the thread ends).
    static STATE_FILE: std::cell::RefCell<Option<Scratch>> = const { std::cell::RefCell::new(None) };
}

/// A damaged region of the corruption sweep.
#[derive(Debug, Clone)]
pub struct RegionDamage {
    /// What was done, for the report.
    pub what: String,
    /// (offset, new word) pairs.
    pub words: Vec<(usize, u64)>,
}

/// The reference of the region corruption sweep: the device and the region as a crash left
/// them, with records in the lane journals to replay, and the offsets of every word the run
/// stored (the live structures: control words, NAT entries and log, journal entries).
pub struct RegionReference {
    /// The device image (shared by every case: each mounts an overlay of it).
    pub device: Arc<Vec<u8>>,
    /// The region's bytes as the crash left them.
    pub region: Vec<u8>,
    /// Offsets of the words the run stored.
    pub stored: Vec<usize>,
}

/// Records the corruption reference workload with a region and keeps its crash state.
pub fn region_reference(bases: &super::workload::Bases) -> Result<RegionReference, String> {
    use super::workload::{record, Knobs, Setup, Workload};
    let ops = super::ops::parse_script(super::corrupt::REFERENCE_OPS)?;
    let w = Workload {
        id: "corrupt-region-reference".into(),
        setup: Setup::Ace,
        threads: vec![ops],
        knobs: Knobs { nvm: true, ..Knobs::default() },
        fault: None,
    };
    let rec = record(&w, bases)?;
    let run = rec.region.as_ref().ok_or("the reference run recorded no region")?;
    let cut = rec.crash_at as u64;
    let device = Overlay::new(rec.base.clone());
    let upto: Vec<usize> = (0..rec.log.len()).filter(|&i| run.dev_seqs[i] < cut).collect();
    device.apply_log(&rec.log, &upto);
    let region = run.trace.model_before(cut).everything();
    let stored: BTreeSet<usize> = run
        .trace
        .events()
        .iter()
        .filter(|(q, _)| *q < cut)
        .filter_map(|(_, e)| match e {
            RegionEvent::Store { offset, .. } => Some(*offset),
            RegionEvent::Persist { .. } => None,
        })
        .collect();
    Ok(RegionReference { device: Arc::new(device.image()), region, stored: stored.into_iter().collect() })
}

/// `n` damages of the reference's region: a live word set to a random value, to an extreme
/// one, or with one bit flipped; a live 64-byte line zeroed; a random word of the data area.
pub fn region_damages(r: &RegionReference, rng: &mut Rng, n: usize) -> Vec<RegionDamage> {
    let word = |o: usize| u64::from_le_bytes(r.region[o..o + 8].try_into().expect("8 bytes"));
    let data_words = (r.region.len() - lanefs::testing::pmem::HEADER_BYTES) / 8;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if r.stored.is_empty() {
            break;
        }
        let o = *rng.pick(&r.stored);
        let d = match rng.below(5) {
            0 => RegionDamage {
                what: format!("word {o} set to a random value"),
                words: vec![(o, rng.next_u64())],
            },
            1 => {
                let v = *rng.pick(&[0, u64::MAX, u32::MAX as u64, 1 << 63, (u32::MAX as u64) << 32]);
                RegionDamage { what: format!("word {o} set to {v:#x}"), words: vec![(o, v)] }
            }
            2 => {
                let bit = rng.index(64);
                RegionDamage {
                    what: format!("word {o} bit {bit} flipped"),
                    words: vec![(o, word(o) ^ (1 << bit))],
                }
            }
            3 => {
                let line = o & !(lanefs::testing::pmem::LINE - 1);
                let words = (0..lanefs::testing::pmem::LINE / 8).map(|k| (line + 8 * k, 0)).collect();
                RegionDamage { what: format!("line {line} zeroed"), words }
            }
            _ => {
                let o = lanefs::testing::pmem::HEADER_BYTES + 8 * rng.index(data_words);
                RegionDamage {
                    what: format!("data-area word {o} set to a random value"),
                    words: vec![(o, rng.next_u64())],
                }
            }
        };
        out.push(d);
    }
    out
}

/// What one damaged region did: `None` if it hung, else (mounted, violations).
pub fn run_region_case(r: &RegionReference, d: &RegionDamage) -> Option<(bool, Vec<String>)> {
    let mut img = r.region.clone();
    for &(o, v) in &d.words {
        if let Some(w) = img.get_mut(o..o + 8) {
            w.copy_from_slice(&v.to_le_bytes());
        }
    }
    let scratch = match Scratch::with_bytes("corrupt", &img) {
        Ok(s) => s,
        Err(e) => return Some((false, vec![format!("could not write the region: {e}")])),
    };
    let path = scratch.path().to_path_buf();
    let dev = Arc::new(Overlay::new(r.device.clone()));
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("crashtest-corrupt-region".into()).spawn(move || {
        let r = catch_unwind(AssertUnwindSafe(|| {
            let mut v = Vec::new();
            let mounted = match Fs::open(dev.clone() as Arc<dyn BlockDevice>, options(&path, false)) {
                Ok(fs) => {
                    let fs = std::mem::ManuallyDrop::new(fs);
                    let _ = walk(&fs);
                    let _ = std::mem::ManuallyDrop::into_inner(fs).unmount();
                    true
                }
                Err(e) => {
                    if e.to_string().trim().is_empty() {
                        v.push("mount refused the region with an empty message".into());
                    }
                    false
                }
            };
            let _ = lanefs::fsck(&*dev, &FsckOptions { nvm: Some(path.clone()), ..Default::default() });
            (mounted, v)
        }));
        let _ = tx.send(r.unwrap_or_else(|p| (false, vec![format!("panic: {}", panic_text(&*p))])));
    });
    if let Err(e) = spawned {
        return Some((false, vec![format!("could not start a thread: {e}")]));
    }
    // The scratch file outlives a hung case's thread only until this returns; the thread then
    // sees a removed file, which it has open already.
    rx.recv_timeout(super::corrupt::CASE_TIMEOUT).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::Prepared;
    use crate::workload::{record, Bases, Setup, Workload};

    fn nvm_workload(script: &str) -> Workload {
        Workload::from_script(Setup::Ace, &format!("nvm; {script}")).unwrap()
    }

    /// The timeline is one: device and region events interleave, the region persist that
    /// commits an fsync comes after the flush of its data, and the plan cuts before and after
    /// every flush and persist.
    #[test]
    fn one_timeline_orders_the_flush_before_the_commit() {
        let bases = Bases::default();
        let w = nvm_workload("create /A/x; write /A/x 0 5000 1; fsync /A/x");
        let rec = record(&w, &bases).unwrap();
        let run = rec.region.as_ref().expect("an nvm run records its region");
        let mut all: Vec<u64> = run.dev_seqs.clone();
        all.extend(run.trace.events().iter().map(|e| e.0));
        all.sort_unstable();
        assert_eq!(all, (0..run.end).collect::<Vec<_>>(), "every position is one event");
        // The fsync: its ack, the last device flush before it and the last persist before it.
        let ack = rec.hist.acked.iter().find(|a| a.op.starts_with("fsync")).expect("the fsync");
        let flushes = rec.log.flush_points();
        let flush = flushes.iter().map(|&f| run.dev_seqs[f]).filter(|&s| s < ack.ev_end as u64).max();
        let persist = run.trace.last_persist_before(ack.ev_end as u64);
        let (flush, persist) = (flush.expect("a data flush"), persist.expect("a commit"));
        assert!(flush < persist, "flush at {flush}, commit at {persist}");
        let states = plan(&rec.log, run, 1, Density::QUICK, 0);
        for c in [flush, flush + 1, persist, persist + 1] {
            assert!(states.iter().any(|s| s.cut == Some(c)), "no cut at {c}");
        }
    }

    /// Every state of a few fsyncs and a rename is clean, with the extra mounts.
    #[test]
    fn nvm_states_of_fsyncs_are_clean() {
        let bases = Bases::default();
        let w = nvm_workload(
            "create /A/x; write /A/x 0 5000 1; fsync /A/x; chmod /A/x 0600; fsync /A/x; \
             rename /A/x /B/y; fsync /B; write /foo 4096 100 7; fdatasync /foo",
        );
        let p = Prepared::new(record(&w, &bases).unwrap(), 1, Density::QUICK);
        assert!(p.rec.findings.is_empty(), "{:?}", p.rec.findings);
        assert!(p.states.len() > 20, "{} states", p.states.len());
        for k in 0..p.states.len() {
            let v = p.check_indexed(k);
            assert!(v.is_empty(), "state {k} {:?}: {v:?}", p.states[k]);
        }
    }

    /// Damaged regions are refused or mounted, never a panic.
    #[test]
    fn damaged_regions_never_panic() {
        let r = region_reference(&Bases::default()).unwrap();
        assert!(r.stored.len() > 50, "{} live words", r.stored.len());
        let mut rng = Rng::new(3);
        let (mut mounted, mut refused) = (0, 0);
        for d in region_damages(&r, &mut rng, 40) {
            let (m, v) = run_region_case(&r, &d).expect("no hang");
            assert!(v.is_empty(), "{}: {v:?}", d.what);
            if m {
                mounted += 1;
            } else {
                refused += 1;
            }
        }
        assert!(mounted > 0 && refused > 0, "{mounted} mounted, {refused} refused");
    }

    /// The harness sees a broken ordering: on a device that acknowledges flushes without
    /// making anything durable, a region commit outruns the data it maps, and acknowledged
    /// fsyncs are lost in some crash states.
    #[test]
    fn nvm_mode_sees_a_commit_before_its_data() {
        let bases = Bases::default();
        let mut w =
            nvm_workload("create /A/x; write /A/x 0 5000 1; fsync /A/x; write /foo 0 9000 2; fsync /foo");
        w.knobs.lying_flushes = true;
        let p = Prepared::new(record(&w, &bases).unwrap(), 1, Density::QUICK);
        let bad: Vec<Vec<String>> =
            (0..p.states.len()).map(|k| p.check_indexed(k)).filter(|v| !v.is_empty()).collect();
        assert!(!bad.is_empty(), "no violation in {} states", p.states.len());
        assert!(bad.iter().flatten().any(|m| m.contains("/A/x") || m.contains("/foo")), "{bad:?}");
        eprintln!("lying flushes: {} of {} states violate, e.g. {:?}", bad.len(), p.states.len(), bad[0]);
        // A region whose persists are lies: a crash may keep the TAIL of an append without its
        // entry, or lose the whole transaction of an acknowledged fsync.
        w.knobs.lying_flushes = false;
        w.knobs.lying_persists = true;
        let p = Prepared::new(record(&w, &bases).unwrap(), 1, Density::QUICK);
        let bad: Vec<Vec<String>> =
            (0..p.states.len()).map(|k| p.check_indexed(k)).filter(|v| !v.is_empty()).collect();
        assert!(!bad.is_empty(), "no violation in {} states", p.states.len());
        eprintln!("lying persists: {} of {} states violate, e.g. {:?}", bad.len(), p.states.len(), bad[0]);
        // And the same workload on an honest device and region is clean.
        w.knobs.lying_persists = false;
        w.knobs.lying_flushes = false;
        let p = Prepared::new(record(&w, &bases).unwrap(), 1, Density::QUICK);
        for k in 0..p.states.len() {
            let v = p.check_indexed(k);
            assert!(v.is_empty(), "state {k}: {v:?}");
        }
    }
}
