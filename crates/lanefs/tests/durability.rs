//! The durability contract (ARCHITECTURE.md 1-4) under crashes: a workload runs on a recording device;
//! then the device is rebuilt at every flush point, and with random subsets of the writes in
//! flight after it (a volatile write cache persists any subset, in any order), mounted, and
//! checked with the crash harness's oracle (`lanefs_crashtest::oracle`, the model of the
//! contract `lanefs crashtest` checks with): every fsync and sync
//! acknowledged before the crash kept what it promised (a file's data, size, mode, times and
//! xattrs, its name and its reachability; a directory's entries), nothing shows a state the
//! workload never made or one begun after the crash; fsck finds the recovered image consistent.
//!
//! With `LANEFS_TEST_NVM=1` the file system keeps its NAT and lane journals in a region
//! (`nvm_mode`) opened with the crash model, and every crash state pairs the device state with
//! the region as a crash at that moment leaves it: the region's events up to the moment the
//! device takes its next write or flush (or the next flush, with writes in flight), then its
//! persisted content plus none, all or a random subset of the stores not yet persisted.

mod nvm_mode;

use lanefs::device::{BlockDevice, IoMode, MemDevice, ReadReq, WriteReq};

use lanefs::rng::Rng;
use lanefs::testing::pmem::{PmemRegion, RegionOptions, MIN_REGION_SIZE};
use lanefs::{fsck, FsckOptions};
use lanefs::{Attr, FileKind, Fs, FsOptions, MkfsOptions, ROOT};
use lanefs_crashtest::oracle::{check, read_file_state, walk, Acked, History, Id};
use lanefs_crashtest::{flush_points, in_flight_after, state_with_subset, CrashDevice};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// A point of the run: how many events the device and the region (0 without one) had then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Point {
    dev: usize,
    region: usize,
}

/// The run's clock for the oracle's history: every point at which the workload noted the time,
/// in order. The history's "log length" of an operation is its index here, so that a crash
/// moment, which covers a prefix of these points (they only grow, in both coordinates),
/// becomes the oracle's pair of bounds (`Moment::bounds`).
struct Clock {
    points: Vec<Point>,
}

impl Clock {
    /// Notes `p`; returns its index.
    fn tick(&mut self, p: Point) -> usize {
        self.points.push(p);
        self.points.len() - 1
    }
}

/// When a crash happened.
#[derive(Debug, Clone, Copy)]
enum Moment {
    /// Without a region: right after device flush `upto - 1` (promises made before the device
    /// saw event `upto` count), with the writes in flight after it up to event `landed - 1`
    /// landed (changes begun before event `landed` may show: `landed` is at least `upto`).
    Flush { upto: usize, landed: usize },
    /// With one: right before the device was handed its event `dev` and the region recorded
    /// its event `region + 1`.
    Both { dev: usize, region: usize },
}

impl Moment {
    /// Whether a promise made at `p` must hold after this crash.
    fn promised(&self, p: Point) -> bool {
        match *self {
            Moment::Flush { upto, .. } => p.dev <= upto,
            Moment::Both { dev, region } => p.dev <= dev && p.region <= region,
        }
    }

    /// Whether a change begun at `p` may have landed.
    fn begun(&self, p: Point) -> bool {
        match *self {
            Moment::Flush { landed, .. } => p.dev < landed,
            Moment::Both { .. } => self.promised(p),
        }
    }

    /// The oracle's bounds on the clock's indices (`oracle::check`): promises acknowledged at an
    /// index up to the first are kept, changes begun below the second may show. Index 0 is the
    /// clock's start, before anything happened, which every moment covers.
    fn bounds(&self, clock: &Clock) -> (usize, usize) {
        let promised = clock.points.partition_point(|&p| self.promised(p));
        let begun = clock.points.partition_point(|&p| self.begun(p));
        // The points only grow, so each predicate holds on a prefix; a moment that broke that
        // would make the bounds wrong, not just loose.
        assert!(clock.points[promised..].iter().all(|&p| !self.promised(p)), "{self:?}: not a prefix");
        assert!(clock.points[begun..].iter().all(|&p| !self.begun(p)), "{self:?}: not a prefix");
        assert!(promised > 0, "{self:?} before the clock started");
        (promised - 1, begun)
    }
}

/// Mount options; `nvm`: the region file (nvm mode), small so that its lane journals fill and
/// fsyncs take checkpoints now and then.
fn opts(nvm: Option<&Path>) -> FsOptions {
    FsOptions {
        checkpoint_interval: None,
        journal_blocks_limit: 64,
        nvm: nvm.map(Path::to_path_buf),
        nvm_size: Some(MIN_REGION_SIZE),
        ..Default::default()
    }
}

/// nvm mode: the crash device, tapped so that each of its events knows how many events the
/// region had recorded when the device was handed it (the region belongs to the `Fs`, which is
/// leaked at the crash, so a `'static` reference to it is sound).
struct Tap {
    crash: Arc<CrashDevice<MemDevice>>,
    region: OnceLock<&'static PmemRegion>,
    /// `marks[i]`: region events recorded before device event `i` was issued.
    marks: Mutex<Vec<usize>>,
}

impl Tap {
    fn issue<R>(&self, op: impl FnOnce(&CrashDevice<MemDevice>) -> R) -> R {
        // One device operation at a time, so the marks follow the device's event order.
        let mut marks = self.marks.lock().unwrap();
        let k = self.region.get().map_or(0, |r| r.recorded_events());
        let r = op(&self.crash);
        let n = self.crash.event_count();
        marks.resize(n, k);
        r
    }
}

impl BlockDevice for Tap {
    fn block_count(&self) -> u64 {
        self.crash.block_count()
    }
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> std::io::Result<()> {
        self.crash.read_batch(reqs)
    }
    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> std::io::Result<()> {
        self.issue(|d| d.write_batch(reqs))
    }
    fn flush(&self) -> std::io::Result<()> {
        self.issue(|d| d.flush())
    }
    fn io_mode(&self) -> IoMode {
        self.crash.io_mode()
    }
    fn discard(&self, addr: u64, blocks: u64) -> std::io::Result<()> {
        self.crash.discard(addr, blocks)
    }
}

/// What a run leaves for the crash states: the device before it, its events, and in nvm mode
/// the tap and the region.
struct Run {
    base: Vec<u8>,
    crash: Arc<CrashDevice<MemDevice>>,
    nvm: Option<(Arc<Tap>, &'static PmemRegion)>,
    /// Device events issued while the file system was opening (before the region was known).
    open_events: usize,
    /// nvm mode: region events recorded by then.
    region_at_open: usize,
}

impl Run {
    /// nvm mode: the region's events recorded before the device was handed its event `dev`
    /// (all of them when it never was).
    fn region_events_before(&self, dev: usize) -> usize {
        let (tap, region) = self.nvm.as_ref().expect("nvm mode");
        tap.marks.lock().unwrap().get(dev).copied().unwrap_or_else(|| region.recorded_events())
    }

    /// nvm mode: how many device events had been issued before the region recorded its event
    /// `k + 1` (those whose mark is at most `k`; marks never decrease).
    fn device_events_by(&self, k: usize) -> usize {
        let (tap, _) = self.nvm.as_ref().expect("nvm mode");
        tap.marks.lock().unwrap().partition_point(|&m| m <= k)
    }
}

/// Runs the workload, recording in the oracle's history what it did and what each fsync and
/// sync promised (`oracle`: the crash harness's model of the durability contract).
fn run_workload(seed: u64, region: Option<&nvm_mode::Region>) -> (Run, History, Clock) {
    let mut dev = MemDevice::new(64 << 20);
    Fs::format(&dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    if let Some(r) = region {
        // The first mount with a region seeds it and flags the image; the crashes come after.
        let _ = std::fs::remove_file(r.path());
        let d = Arc::new(dev);
        Fs::open(d.clone() as Arc<dyn BlockDevice>, opts(Some(r.path()))).unwrap().unmount().unwrap();
        dev = MemDevice::from_bytes(d.snapshot());
    }
    let base = dev.snapshot();
    let crash = Arc::new(CrashDevice::new(dev));
    let (fs, nvm, open_events) = match region {
        None => (Fs::open(crash.clone() as Arc<dyn BlockDevice>, opts(None)).unwrap(), None, 0),
        Some(r) => {
            let tap = Arc::new(Tap {
                crash: crash.clone(),
                region: OnceLock::new(),
                marks: Mutex::new(Vec::new()),
            });
            let record = FsOptions {
                nvm_region: RegionOptions { record: true, ..Default::default() },
                ..opts(Some(r.path()))
            };
            let fs = Fs::open(tap.clone() as Arc<dyn BlockDevice>, record).unwrap();
            let open_events = crash.event_count();
            (fs, Some(tap), open_events)
        }
    };
    // A crash, not an unmount, ends the run: the file system is never dropped.
    let fs: &'static Fs = Box::leak(Box::new(fs));
    let nvm = nvm.map(|tap| {
        let region = fs.nvm().expect("the NAT is in the region").region();
        assert!(tap.region.set(region).is_ok());
        (tap, region)
    });
    let region_events = nvm.as_ref().map(|(_, r)| *r);
    let region_at_open = region_events.map_or(0, |r| r.recorded_events());
    let now = || Point { dev: crash.event_count(), region: region_events.map_or(0, |r| r.recorded_events()) };
    // Index 0: before the workload, which every crash state holds (the base image).
    let mut clock = Clock { points: vec![Point { dev: 0, region: 0 }] };
    let start = walk(fs);
    assert!(start.problems.is_empty(), "{:?}", start.problems);
    let mut h = History::from_recovered(&start);
    let root = start.root;
    let state = |a: &Attr| read_file_state(fs, &fs.getattr(a.ino).unwrap()).unwrap();
    let mut rng = Rng::new(seed);
    let mkdir = |h: &mut History, clock: &mut Clock, parent: (u64, Id), name: &[u8]| {
        let ev = clock.tick(now());
        let a = fs.mkdir(parent.0, name, 0o755, 0, 0).unwrap();
        h.new_inode(Id::of(&a), FileKind::Dir);
        h.set_entry(ev, parent.1, name, Some(Id::of(&a)));
        (a.ino, Id::of(&a))
    };
    let d1 = mkdir(&mut h, &mut clock, (ROOT, root), b"d1");
    let d2 = mkdir(&mut h, &mut clock, d1, b"d2");
    let dirs = [((ROOT, root), "/"), (d1, "/d1/"), (d2, "/d1/d2/")];
    // Each file: its inode, identity and path.
    let mut files: Vec<(Attr, String)> = Vec::new();
    for i in 0..60 {
        let r = rng.next_u64();
        match r % 10 {
            0..=3 => {
                let ((d, did), dp) = dirs[(r >> 8) as usize % dirs.len()];
                let name = format!("f{i}");
                let ev = clock.tick(now());
                let a = fs.create(d, name.as_bytes(), 0o644, 0, 0).unwrap();
                h.new_inode(Id::of(&a), FileKind::File);
                h.set_entry(ev, did, name.as_bytes(), Some(Id::of(&a)));
                h.set_file(ev, Id::of(&a), state(&a));
                let len = (r >> 16) as usize % 20_000;
                let data: Vec<u8> = (0..len).map(|k| (k as u64 ^ r) as u8).collect();
                let ev = clock.tick(now());
                fs.write_at(a.ino, 0, &data).unwrap();
                h.set_file(ev, Id::of(&a), state(&a));
                files.push((a, format!("{dp}{name}")));
            }
            4..=5 if !files.is_empty() => {
                let k = (r >> 8) as usize % files.len();
                let a = &files[k].0;
                let ev = clock.tick(now());
                let off = (r >> 20) % 30_000;
                let chunk: Vec<u8> = (0..1 + (r >> 40) % 6000).map(|x| (x ^ off) as u8).collect();
                fs.write_at(a.ino, off, &chunk).unwrap();
                h.set_file(ev, Id::of(a), state(a));
            }
            6 if !files.is_empty() => {
                let k = (r >> 8) as usize % files.len();
                let a = &files[k].0;
                let ev = clock.tick(now());
                let size = (r >> 24) as usize % 25_000;
                fs.truncate(a.ino, size as u64).unwrap();
                h.set_file(ev, Id::of(a), state(a));
            }
            7 => {
                let ((d, did), dp) = dirs[(r >> 8) as usize % dirs.len()];
                let promises = h.promise_fsync(did, false);
                fs.fsync(d, false).unwrap();
                h.acked.push(Acked { ev_end: clock.tick(now()), op: format!("fsync {dp}"), promises });
            }
            8 if r.is_multiple_of(7) => {
                let promises = h.promise_all();
                fs.sync().unwrap();
                h.acked.push(Acked { ev_end: clock.tick(now()), op: "sync".into(), promises });
            }
            _ if !files.is_empty() => {
                let k = (r >> 8) as usize % files.len();
                let (a, path) = &files[k];
                let promises = h.promise_fsync(Id::of(a), false);
                fs.fsync(a.ino, false).unwrap();
                h.acked.push(Acked { ev_end: clock.tick(now()), op: format!("fsync {path}"), promises });
            }
            _ => {}
        }
    }
    (Run { base, crash, nvm, open_events, region_at_open }, h, clock)
}

/// Mounts a crash state (the device image, and in nvm mode the region image written to
/// `region`), checks it against the history with the oracle, unmounts and runs fsck.
fn verify(
    image: Vec<u8>,
    region: Option<(&Path, Vec<u8>)>,
    moment: Moment,
    (history, clock): (&History, &Clock),
    what: &str,
) {
    let nvm = region.map(|(path, bytes)| {
        std::fs::write(path, bytes).unwrap();
        path
    });
    let dev = Arc::new(MemDevice::from_bytes(image));
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts(nvm))
        .unwrap_or_else(|e| panic!("{what}: mount failed: {e}"));
    let (durable, upper) = moment.bounds(clock);
    let problems = check(history, &walk(&fs), durable, upper);
    assert!(problems.is_empty(), "{what}: the durability contract is broken:\n  {}", problems.join("\n  "));
    fs.unmount().unwrap();
    let r = fsck(&*dev, &FsckOptions { nvm: nvm.map(Path::to_path_buf), ..Default::default() }).unwrap();
    assert!(r.is_clean(), "{what}: fsck after recovery: {:#?}", r.problems);
}

#[test]
fn fsynced_data_survives_a_crash_at_every_flush_point() {
    let region = nvm_mode::Region::if_enabled();
    let crashed = region.as_ref().map(|r| r.sibling("crashed.nvm"));
    let mut states = 0;
    let mut region_states = [0usize; 3];
    let mut region_moments = 0;
    for seed in [3u64, 11, 29] {
        let (run, history, clock) =
            run_workload(0xABCD_EF01 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), region.as_ref());
        assert!(history.acked.iter().any(|a| a.op.starts_with("fsync /") && !a.op.ends_with('/')));
        let model = (&history, &clock);
        let events = run.crash.events();
        let flushes = flush_points(&events);
        let mut rng = Rng::new(seed + 1);
        let mut region_rng = Rng::new(seed + 2);
        // nvm mode: the region as a crash leaves it after its first `k` events: persisted only,
        // everything stored, or a random subset of the words not persisted.
        let mut region_image = |k: usize, what: &mut String| {
            let (_, r) = run.nvm.as_ref()?;
            let cm = r.crash_model_at(k).expect("the region records");
            let pick = if cm.pending().is_empty() { 0 } else { region_rng.below(3) as usize };
            region_states[pick] += 1;
            what.push_str(&format!(
                ", region after {k} events, {} of {} pending words",
                ["none", "all", "some"][pick],
                cm.pending().len()
            ));
            let mask = region_rng.next_u64();
            Some(match pick {
                0 => cm.image_with(|_, _| None),
                1 => cm.everything(),
                _ => cm.image_with(|i, w| (mask >> (i % 64) & 1 != 0).then(|| w.values.len() - 1)),
            })
        };
        // The moment right before the device is handed event `dev`.
        let before = |dev: usize| match &run.nvm {
            None => Moment::Flush { upto: dev, landed: dev },
            Some(_) => Moment::Both { dev, region: run.region_events_before(dev) },
        };
        for (n, &f) in flushes.iter().enumerate() {
            if f < run.open_events {
                // nvm mode: the mount's own flushes, before the region could be tapped.
                continue;
            }
            let mut what = format!("seed {seed} flush {n}/{}", flushes.len());
            let img = state_with_subset(&run.base, &events, Some(f), &[]).unwrap();
            let moment = before(f + 1);
            let r = match moment {
                Moment::Both { region, .. } => region_image(region, &mut what),
                Moment::Flush { .. } => None,
            };
            verify(img, crashed.as_deref().zip(r), moment, model, &what);
            states += 1;
            // The writes in flight after this flush, persisted partly and out of order (with a
            // region: a crash right before the next flush).
            let inflight = in_flight_after(&events, Some(f));
            if !inflight.is_empty() {
                let next_flush = flushes.get(n + 1).copied().unwrap_or(events.len());
                for _ in 0..2 {
                    let subset: Vec<usize> =
                        inflight.iter().copied().filter(|_| rng.next_u64().is_multiple_of(2)).collect();
                    let mut what =
                        format!("seed {seed} flush {n} + {} of {} in flight", subset.len(), inflight.len());
                    let img = state_with_subset(&run.base, &events, Some(f), &subset).unwrap();
                    let moment = match before(next_flush) {
                        // A write in flight that landed may be a later fsync's transaction,
                        // which recovery replays: what began before it may show.
                        Moment::Flush { .. } => Moment::Flush {
                            upto: f + 1,
                            landed: subset.iter().max().map_or(f + 1, |&w| (w + 1).max(f + 1)),
                        },
                        m => m,
                    };
                    let r = match moment {
                        Moment::Both { region, .. } => region_image(region, &mut what),
                        Moment::Flush { .. } => None,
                    };
                    verify(img, crashed.as_deref().zip(r), moment, model, &what);
                    states += 1;
                }
            }
        }
        // nvm mode: crashes between region events too (inside an fsync's commit, a checkpoint's
        // NAT log and journal reset), with every device write issued by then landed.
        if let Some((_, r)) = &run.nvm {
            let (first, total) = (run.region_at_open, r.recorded_events());
            assert!(total > first, "seed {seed}: the region saw no event");
            for _ in 0..40 {
                let k = first + rng.below((total - first + 1) as u64) as usize;
                let dev = run.device_events_by(k);
                let last_flush = flushes.iter().copied().rfind(|&f| f < dev);
                let landed: Vec<usize> =
                    in_flight_after(&events, last_flush).into_iter().filter(|&i| i < dev).collect();
                let img = state_with_subset(&run.base, &events, last_flush, &landed).unwrap();
                let mut what = format!("seed {seed} region event {k} of {total}, device events {dev}");
                let r = region_image(k, &mut what);
                verify(img, crashed.as_deref().zip(r), Moment::Both { dev, region: k }, model, &what);
                states += 1;
                region_moments += 1;
            }
        }
    }
    assert!(states > 100, "only {states} crash states checked");
    if region.is_some() {
        eprintln!(
            "nvm mode: {states} crash states ({region_moments} between region events); region persisted \
             only / everything / a subset: {region_states:?}"
        );
        assert!(region_states.iter().all(|&n| n > 0), "every kind of region state: {region_states:?}");
    }
}
