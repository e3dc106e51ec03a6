//! fsyncs of new files in one shared directory, from several threads at once (a mail spool).
//!
//! Each fsync of a new file journals its create, which lives in the shared directory's log
//! beside every other thread's creates, renames and unlinks; whichever fsync collects first
//! writes them, and the others depend on its write. Flushes collect one after the other and
//! write side by side (`crate::flush`, `sync::ticket`), so this checks what that must keep:
//! after a crash at any flush point, every file whose fsync had returned is there with its
//! data; with any subset of the writes in flight after that point landed as well (one
//! transaction without another it depends on), the image still mounts and fsck finds it
//! consistent. The device holds back every other write batch for 2 ms before it
//! reaches the recorder, so that flushes which collected later often finish their own writes
//! first.

use lanefs::device::{BlockDevice, IoMode, MemDevice, ReadReq, WriteReq};

use lanefs::rng::Rng;
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use lanefs_crashtest::{flush_points, in_flight_after, state_with_subset, CrashDevice};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const THREADS: usize = 4;
const FILES: usize = 30;

/// An acknowledged fsync: after a crash at or after device flush event `flush` (the last one
/// logged when the fsync returned, so at or after the one that made it durable), `path` holds
/// `data`.
struct Promise {
    flush: usize,
    path: String,
    data: Vec<u8>,
}

/// The recording device, slow on every other write batch (the fault injected: a write that
/// takes 2 ms).
struct Slow {
    crash: Arc<CrashDevice<MemDevice>>,
    writes: AtomicU64,
}

impl BlockDevice for Slow {
    fn block_count(&self) -> u64 {
        self.crash.block_count()
    }
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> std::io::Result<()> {
        self.crash.read_batch(reqs)
    }
    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> std::io::Result<()> {
        if self.writes.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        self.crash.write_batch(reqs)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.crash.flush()
    }
    fn io_mode(&self) -> IoMode {
        self.crash.io_mode()
    }
    fn discard(&self, addr: u64, blocks: u64) -> std::io::Result<()> {
        self.crash.discard(addr, blocks)
    }
}

/// No background checkpoint: every flush point of the log is an fsync's (or a checkpoint an
/// fsync took when its journal filled).
fn opts() -> FsOptions {
    FsOptions { checkpoint_interval: None, journal_blocks_limit: u64::MAX / 4, ..Default::default() }
}

fn page(t: usize, k: usize, v: u8) -> Vec<u8> {
    (0..4096).map(|i| (i as u8) ^ (t as u8 * 31) ^ (k as u8) ^ v).collect()
}

/// One thread's work: per round a scratch file that never reaches an fsync (created, written,
/// sometimes renamed, unlinked: records that other threads' fsyncs take or absorb), then a
/// file that is written and fsynced, every other round after a pause.
fn spool(fs: &Fs, crash: &CrashDevice<MemDevice>, dir: u64, t: usize) -> Vec<Promise> {
    let mut out = Vec::with_capacity(FILES);
    for k in 0..FILES {
        let tmp = format!("tmp{t}-{k}");
        let a = fs.create(dir, tmp.as_bytes(), 0o644, 0, 0).unwrap();
        fs.write_at(a.ino, 0, &page(t, k, 1)).unwrap();
        if k % 3 == 0 {
            let moved = format!("moved{t}-{k}");
            fs.rename(dir, tmp.as_bytes(), dir, moved.as_bytes(), lanefs::RenameFlags::empty()).unwrap();
            fs.unlink(dir, moved.as_bytes()).unwrap();
        } else {
            fs.unlink(dir, tmp.as_bytes()).unwrap();
        }
        let name = format!("m{t}-{k}");
        let f = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap();
        let data = page(t, k, 2);
        fs.write_at(f.ino, 0, &data).unwrap();
        if k % 2 == 1 {
            // Often another thread's fsync takes this create meanwhile: this one then depends
            // on that one's write.
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        fs.fsync(f.ino, false).unwrap();
        let flush = *crash.flush_points().last().expect("the fsync flushed");
        out.push(Promise { flush, path: format!("/spool/{name}"), data });
    }
    out
}

/// Mounts a crash state, checks the promises made by flush event `upto`, unmounts and runs fsck.
fn verify(image: Vec<u8>, upto: usize, promises: &[Promise], what: &str) -> usize {
    let dev = Arc::new(MemDevice::from_bytes(image));
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts())
        .unwrap_or_else(|e| panic!("{what}: mount failed: {e}"));
    let mut kept = 0;
    for p in promises.iter().filter(|p| p.flush <= upto) {
        let a = fs.resolve(&p.path).unwrap_or_else(|e| panic!("{what}: fsynced {} is gone: {e}", p.path));
        let mut got = vec![0u8; 4096];
        assert_eq!(fs.read_at(a.ino, 0, &mut got).unwrap(), 4096, "{what}: {}", p.path);
        assert!(got == p.data, "{what}: {} does not hold what was fsynced", p.path);
        kept += 1;
    }
    fs.unmount().unwrap();
    let r = fsck(&*dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "{what}: fsck after recovery: {:#?}", r.problems);
    kept
}

#[test]
fn fsyncs_in_one_shared_directory_keep_every_acknowledged_file_at_every_crash_point() {
    let dev = MemDevice::new(64 << 20);
    Fs::format(&dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    let base = dev.snapshot();
    let crash = Arc::new(CrashDevice::new(dev));
    // A crash, not an unmount, ends the run: the file system is never dropped.
    let slow = Arc::new(Slow { crash: crash.clone(), writes: AtomicU64::new(0) });
    let fs: &'static Fs = Box::leak(Box::new(Fs::open(slow as Arc<dyn BlockDevice>, opts()).unwrap()));
    let dir = fs.mkdir(ROOT, b"spool", 0o755, 0, 0).unwrap().ino;
    fs.fsync(dir, false).unwrap();
    let promises: Vec<Promise> = std::thread::scope(|s| {
        let crash = &*crash;
        let hs: Vec<_> = (0..THREADS).map(|t| s.spawn(move || spool(fs, crash, dir, t))).collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(promises.len(), THREADS * FILES);
    let events = crash.events();
    let flushes = flush_points(&events);
    let mut rng = Rng::new(0x5b00_1e55);
    // Every fsync flushed the device before it returned: the last flush point keeps them all.
    let last = *flushes.last().unwrap();
    let img = state_with_subset(&base, &events, Some(last), &[]).unwrap();
    assert_eq!(verify(img, usize::MAX, &promises, "the last flush"), promises.len());
    let mut states = 1;
    // The flush points where a promise starts to count: a flush that counted too early shows
    // there first. Each also with half the writes in flight after it landed.
    let points: std::collections::BTreeSet<usize> = promises.iter().map(|p| p.flush).collect();
    for (n, &f) in points.iter().enumerate() {
        let what = format!("flush event {f} ({n} of {} points)", points.len());
        let img = state_with_subset(&base, &events, Some(f), &[]).unwrap();
        verify(img, f, &promises, &what);
        states += 1;
        let inflight = in_flight_after(&events, Some(f));
        if n % 3 == 0 && inflight.len() > 1 {
            let subset: Vec<usize> = inflight.iter().copied().filter(|_| rng.next_u64() & 1 == 0).collect();
            let what = format!("{what} + {} of {} in flight", subset.len(), inflight.len());
            let img = state_with_subset(&base, &events, Some(f), &subset).unwrap();
            verify(img, f, &promises, &what);
            states += 1;
        }
    }
    assert!(states > 20, "only {states} crash states checked");
}
