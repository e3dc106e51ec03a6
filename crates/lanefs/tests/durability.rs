//! The durability contract (DESIGN.md 1-4) under crashes: a workload runs on a recording device;
//! then the device is rebuilt at every flush point, and with random subsets of the writes in
//! flight after it (a volatile write cache persists any subset, in any order), mounted, and
//! checked: every fsync acknowledged before the crash kept its data, size and name; fsck finds
//! the recovered image consistent.

use lanefs::crashtest::rng::Rng;
use lanefs::device::{flush_points, in_flight_after, state_with_subset, BlockDevice, CrashDevice, MemDevice};
use lanefs::fsck::{check, FsckOptions};
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use std::sync::Arc;

/// What an acknowledged fsync promised: once `after_event` events are on the log, `path` holds
/// `data` — or any later version of the file from before the crash (a checkpoint may have made
/// later writes durable too).
struct Promise {
    after_event: usize,
    path: String,
    data: Vec<u8>,
}

/// Every version of every file: (path, event count when the change began, contents after it).
type History = Vec<(String, usize, Vec<u8>)>;

fn opts() -> FsOptions {
    FsOptions { checkpoint_interval: None, journal_blocks_limit: 64, ..Default::default() }
}

fn run_workload(seed: u64) -> (Vec<u8>, Arc<CrashDevice<MemDevice>>, Vec<Promise>, History) {
    let dev = MemDevice::new(64 << 20);
    Fs::format(&dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    let base = dev.snapshot();
    let crash = Arc::new(CrashDevice::new(dev));
    let fs = Fs::open(crash.clone() as Arc<dyn BlockDevice>, opts()).unwrap();
    let mut rng = Rng::new(seed);
    let mut promises = Vec::new();
    let d1 = fs.mkdir(ROOT, b"d1", 0o755, 0, 0).unwrap().ino;
    let d2 = fs.mkdir(d1, b"d2", 0o755, 0, 0).unwrap().ino;
    let dirs = [(ROOT, "/"), (d1, "/d1/"), (d2, "/d1/d2/")];
    let mut files: Vec<(u64, String, Vec<u8>)> = Vec::new();
    let mut history: History = Vec::new();
    for i in 0..60 {
        let r = rng.next_u64();
        match r % 10 {
            0..=3 => {
                let (d, dp) = dirs[(r >> 8) as usize % dirs.len()];
                let name = format!("f{i}");
                let a = fs.create(d, name.as_bytes(), 0o644, 0, 0).unwrap();
                let len = (r >> 16) as usize % 20_000;
                let data: Vec<u8> = (0..len).map(|k| (k as u64 ^ r) as u8).collect();
                let at = crash.event_count();
                fs.write_at(a.ino, 0, &data).unwrap();
                history.push((format!("{dp}{name}"), at, data.clone()));
                files.push((a.ino, format!("{dp}{name}"), data));
            }
            4..=5 if !files.is_empty() => {
                let k = (r >> 8) as usize % files.len();
                let (ino, path, data) = &mut files[k];
                let at = crash.event_count();
                let off = (r >> 20) % 30_000;
                let chunk: Vec<u8> = (0..1 + (r >> 40) % 6000).map(|x| (x ^ off) as u8).collect();
                fs.write_at(*ino, off, &chunk).unwrap();
                let end = off as usize + chunk.len();
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[off as usize..end].copy_from_slice(&chunk);
                history.push((path.clone(), at, data.clone()));
            }
            6 if !files.is_empty() => {
                let k = (r >> 8) as usize % files.len();
                let (ino, path, data) = &mut files[k];
                let at = crash.event_count();
                let size = (r >> 24) as usize % 25_000;
                fs.truncate(*ino, size as u64).unwrap();
                data.resize(size, 0);
                history.push((path.clone(), at, data.clone()));
            }
            7 => fs.fsync(dirs[(r >> 8) as usize % dirs.len()].0, false).unwrap(),
            8 if r.is_multiple_of(7) => fs.sync().unwrap(),
            _ if !files.is_empty() => {
                let k = (r >> 8) as usize % files.len();
                let (ino, path, data) = &files[k];
                fs.fsync(*ino, false).unwrap();
                promises.push(Promise {
                    after_event: crash.event_count(),
                    path: path.clone(),
                    data: data.clone(),
                });
            }
            _ => {}
        }
    }
    // A crash, not an unmount: no final checkpoint.
    std::mem::forget(fs);
    (base, crash, promises, history)
}

fn verify(image: Vec<u8>, upto: usize, promises: &[Promise], history: &History, what: &str) {
    let dev = Arc::new(MemDevice::from_bytes(image));
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts())
        .unwrap_or_else(|e| panic!("{what}: mount failed: {e}"));
    // The newest promise for each path that the crash point covers.
    let mut latest: std::collections::BTreeMap<&str, &Promise> = Default::default();
    for p in promises.iter().filter(|p| p.after_event <= upto) {
        latest.insert(&p.path, p);
    }
    for (path, p) in latest {
        let a = fs.resolve(path).unwrap_or_else(|e| panic!("{what}: fsynced {path} is gone: {e}"));
        let mut got = vec![0u8; a.size as usize];
        fs.read_at(a.ino, 0, &mut got).unwrap();
        let later = history.iter().filter(|(hp, at, _)| hp == path && *at >= p.after_event && *at < upto);
        let ok = got == p.data || later.clone().any(|(_, _, d)| *d == got);
        assert!(ok, "{what}: {path} ({} bytes) matches neither the fsynced version ({} bytes) nor any of {} later ones", got.len(), p.data.len(), later.count());
    }
    fs.unmount().unwrap();
    let r = check(&*dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "{what}: fsck after recovery: {:#?}", r.problems);
}

#[test]
fn fsynced_data_survives_a_crash_at_every_flush_point() {
    let mut states = 0;
    for seed in [3u64, 11, 29] {
        let (base, crash, promises, history) =
            run_workload(0xABCD_EF01 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        assert!(!promises.is_empty());
        let events = crash.events();
        let flushes = flush_points(&events);
        let mut rng = Rng::new(seed + 1);
        for (n, &f) in flushes.iter().enumerate() {
            let img = state_with_subset(&base, &events, Some(f), &[]).unwrap();
            verify(img, f + 1, &promises, &history, &format!("seed {seed} flush {n}/{}", flushes.len()));
            states += 1;
            // The writes in flight after this flush, persisted partly and out of order.
            let inflight = in_flight_after(&events, Some(f));
            if !inflight.is_empty() {
                for _ in 0..2 {
                    let subset: Vec<usize> =
                        inflight.iter().copied().filter(|_| rng.next_u64().is_multiple_of(2)).collect();
                    let img = state_with_subset(&base, &events, Some(f), &subset).unwrap();
                    verify(
                        img,
                        f + 1,
                        &promises,
                        &history,
                        &format!("seed {seed} flush {n} + {} of {} in flight", subset.len(), inflight.len()),
                    );
                    states += 1;
                }
            }
        }
    }
    assert!(states > 100, "only {states} crash states checked");
}
