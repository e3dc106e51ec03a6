//! Cooperative commit (issue 18, `disk/commit.rs`): many threads fsyncing at once queue their
//! data and journal blocks, and whichever finds no batch in flight submits everyone's in one
//! batch and one flush. Checked here: every fsync that returned is durable at every crash
//! point the recording device offers (with any subset of the writes in flight), also after a
//! batch that failed to write; the device flushes and submissions are at most the fsyncs; and
//! with `cooperative: false` the old path runs (no batch submitted by the queue).

use lanefs::device::{BlockDevice, DeviceOptions, FileDevice, MemDevice};
use lanefs::rng::Rng;
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use lanefs_crashtest::{flush_points, in_flight_after, state_with_subset, CrashDevice, FaultPlan};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const THREADS: usize = 6;

/// No background checkpoint: the journal and its marks carry every fsync.
fn opts(cooperative: bool) -> FsOptions {
    FsOptions { checkpoint_interval: None, journal_blocks_limit: 1 << 20, cooperative, ..Default::default() }
}

/// Version `v` of thread `t`'s file: sizes that change, bytes that name both.
fn version(t: usize, v: usize) -> Vec<u8> {
    let len = 1000 + (v * 2347 + t * 611) % 14_000;
    (0..len).map(|i| (i as u64 ^ (t as u64) << 5 ^ (v as u64) << 9) as u8).collect()
}

/// An fsync that returned: the file's version, and how many device events had been issued
/// when it returned (a crash after them must keep it).
#[derive(Clone, Copy)]
struct Promise {
    thread: usize,
    version: usize,
    at: usize,
}

/// Each thread creates its file in a shared directory and writes and fsyncs `rounds` versions
/// of it; returns the promises and how many fsyncs were called. An fsync that fails is allowed
/// (a fault plan may fail a batch) and makes no promise; its version stays pending and the
/// next fsync covers it.
fn run(
    fs: &Fs,
    dir: u64,
    rounds: usize,
    events: &(dyn Fn() -> usize + Sync),
) -> (Vec<Promise>, usize, usize) {
    let promises = Mutex::new(Vec::new());
    let (calls, failed) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (promises, calls, failed) = (&promises, &calls, &failed);
            s.spawn(move || {
                let f = fs.create(dir, format!("t{t}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                for v in 0..rounds {
                    let data = version(t, v);
                    fs.write_at(f, 0, &data).unwrap();
                    fs.truncate(f, data.len() as u64).unwrap();
                    calls.fetch_add(1, Ordering::Relaxed);
                    match fs.fsync(f, false) {
                        Ok(()) => {
                            promises.lock().unwrap().push(Promise { thread: t, version: v, at: events() })
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    (promises.into_inner().unwrap(), calls.into_inner(), failed.into_inner())
}

/// Mounts `image` and checks that each thread's file holds its newest promised version or a
/// later one (a later write may have landed too), then that fsck finds it clean.
fn verify(image: Vec<u8>, promises: &[&Promise], rounds: usize, what: &str) {
    let dev = Arc::new(MemDevice::from_bytes(image));
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts(true))
        .unwrap_or_else(|e| panic!("{what}: mount: {e}"));
    let mut newest = [None::<usize>; THREADS];
    for p in promises {
        newest[p.thread] = newest[p.thread].max(Some(p.version));
    }
    for (t, v) in newest.iter().enumerate() {
        let Some(v) = *v else { continue };
        let a = fs.resolve(&format!("/d/t{t}")).unwrap_or_else(|e| panic!("{what}: t{t} gone: {e}"));
        let mut got = vec![0u8; a.size as usize];
        fs.read_at(a.ino, 0, &mut got).unwrap();
        assert!(
            (v..rounds).any(|w| version(t, w) == got),
            "{what}: t{t} ({} bytes) is neither its fsynced version {v} nor a later one",
            got.len()
        );
    }
    fs.unmount().unwrap();
    let r = fsck(&*dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "{what}: fsck: {:#?}", r.problems);
}

/// Runs the threads on a recording device (with `faults`), then checks crash states at up to
/// `points` flush points, each with a random subset of the writes in flight after it.
fn crash_run(faults: FaultPlan, rounds: usize, points: usize, seed: u64) -> (lanefs::IoStats, usize, usize) {
    let dev = MemDevice::new(128 << 20);
    Fs::format(&dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    let base = dev.snapshot();
    let crash = Arc::new(CrashDevice::new(dev));
    let fs = Fs::open(crash.clone() as Arc<dyn BlockDevice>, opts(true)).unwrap();
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    fs.fsync(d, false).unwrap();
    let stats_before = fs.io_stats();
    crash.set_fault_plan(faults);
    let (promises, calls, failed) = run(&fs, d, rounds, &|| crash.event_count());
    let stats = fs.io_stats();
    let events = crash.events();
    // The crash: the file system is never unmounted.
    std::mem::forget(fs);
    let flushes = flush_points(&events);
    assert!(!flushes.is_empty());
    let step = flushes.len().div_ceil(points).max(1);
    let mut rng = Rng::new(seed);
    let mut chosen: Vec<Option<usize>> = flushes.iter().step_by(step).map(|&f| Some(f)).collect();
    chosen.push(flushes.last().copied());
    for f in chosen {
        let in_flight = in_flight_after(&events, f);
        let mask = rng.next_u64();
        let extra: Vec<usize> = in_flight
            .iter()
            .enumerate()
            .filter(|(i, _)| mask >> (i % 64) & 1 == 1)
            .map(|(_, &e)| e)
            .collect();
        let image = state_with_subset(&base, &events, f, &extra).unwrap();
        // Returned before the event after the flush was issued: the flush covers it.
        let cut = f.map_or(0, |f| f + 1);
        let kept: Vec<&Promise> = promises.iter().filter(|p| p.at <= cut).collect();
        verify(
            image,
            &kept,
            rounds,
            &format!("crash after event {cut} ({} of {} in flight)", extra.len(), in_flight.len()),
        );
    }
    let d = |a: u64, b: u64| a - b;
    let delta = lanefs::IoStats {
        fsync_flushes: d(stats.fsync_flushes, stats_before.fsync_flushes),
        fsync_device_flushes: d(stats.fsync_device_flushes, stats_before.fsync_device_flushes),
        fsync_batches: d(stats.fsync_batches, stats_before.fsync_batches),
        ..Default::default()
    };
    (delta, calls, failed)
}

#[test]
fn concurrent_fsyncs_are_durable_at_every_crash_point_and_share_batches() {
    let (s, calls, failed) = crash_run(FaultPlan::new(), 25, 30, 7);
    assert_eq!(failed, 0);
    // Each fsync queues at most one request (none when it had nothing to write) and each
    // batch holds at least one: submissions and flushes never outnumber the calls.
    assert!(
        s.fsync_batches >= 1 && s.fsync_batches as usize <= calls,
        "{} batches for {calls} fsyncs",
        s.fsync_batches
    );
    assert!(s.fsync_device_flushes <= s.fsync_batches, "one flush per batch at most: {s:?}");
    assert!(s.fsync_flushes as usize <= calls, "{s:?}");
}

#[test]
fn a_batch_that_fails_to_write_fails_its_callers_and_the_chain_stays_whole() {
    // Write calls 3, 9 and 15 after the threads start fail (whole, torn, short): each a batch
    // of one or more fsyncs, whose lanes' chains go back while others' requests may be queued
    // behind. Every fsync that returned afterwards must still be found.
    let plan = FaultPlan::new().fail_write(3).torn_write(9, 1, 100).short_write(15, 1);
    let (s, calls, failed) = crash_run(plan, 20, 25, 11);
    assert!(failed >= 3, "{failed} fsyncs failed of {calls}: each failed batch fails its callers");
    assert!(s.fsync_batches as usize <= calls);
}

/// Off, or on a device whose flush is free (a `MemDevice`, an image in tmpfs), every fsync
/// submits its own writes: a shared batch would save no flush there and only make each lane
/// wait for the others' writes. (On, with a flush that costs, the queue is used: the crash runs
/// above on the recording device, and the image file below.)
#[test]
fn the_queue_is_used_only_when_asked_for_and_where_a_flush_costs_something() {
    for cooperative in [false, true] {
        let dev = Arc::new(MemDevice::new(128 << 20));
        assert!(dev.flush_is_free());
        Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
        let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts(cooperative)).unwrap();
        let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
        let flushes_before = dev.flush_count();
        let (promises, calls, failed) = run(&fs, d, 15, &|| 0);
        assert_eq!((failed, promises.len()), (0, calls));
        let s = fs.io_stats();
        let device_flushes = dev.flush_count() - flushes_before;
        assert_eq!(s.fsync_batches, 0, "cooperative={cooperative}: the queue is never used: {s:?}");
        assert!(device_flushes as usize <= calls + 1, "{device_flushes} device flushes for {calls} fsyncs");
        fs.unmount().unwrap();
        let all: Vec<&Promise> = promises.iter().collect();
        verify(dev.snapshot(), &all, 15, &format!("cooperative={cooperative}"));
    }
}

#[test]
fn an_image_file_keeps_every_fsync_across_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("coop.img");
    lanefs::create_image(&path, 128 << 20).unwrap();
    let dev = Arc::new(FileDevice::open(&path, DeviceOptions::default()).unwrap());
    Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts(true)).unwrap();
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    fs.fsync(d, false).unwrap();
    let (promises, calls, failed) = run(&fs, d, 10, &|| 0);
    assert_eq!((failed, promises.len()), (0, calls));
    let s = fs.io_stats();
    assert!(s.fsync_batches >= 1 && s.fsync_batches as usize <= calls + 1, "{s:?}");
    // A crash: the file system is never unmounted; what the file holds now is remounted.
    std::mem::forget(fs);
    let image = std::fs::read(&path).unwrap();
    let all: Vec<&Promise> = promises.iter().collect();
    verify(image, &all, 10, "image file");
}
