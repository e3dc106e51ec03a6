//! Recovery and the journal's flushed-through mark: a transaction that a later one proves
//! durable is replayed without reading its data back; one that nothing proves is checked, and
//! dropped (with everything after it) when its data did not reach the disk.
//!
//! Each test runs fsyncs on a one-lane image in memory, stops without unmounting (a crash after
//! the last fsync returned), edits the image where a crash could have left it different, and
//! mounts the result. Every fsync is a transaction of its own that maps one data block filled
//! with a pattern no other block has, so the image shows where each transaction's data went.

use lanefs::device::{BlockDevice, IoMode, MemDevice, ReadReq, WriteReq, BLOCK_SIZE};

use lanefs::RecoveryReport;
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use lanefs_crashtest::{flush_points, in_flight_after, state_with_subset, CrashDevice, EventKind};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Transactions each test writes.
const N: usize = 12;

fn opts() -> FsOptions {
    FsOptions { checkpoint_interval: None, ..Default::default() }
}

/// The block file `i` holds: its number in every word, never a block the image has otherwise.
fn pattern(i: usize) -> Vec<u8> {
    (0..BLOCK_SIZE / 8).flat_map(|_| (0x5eed_0000_0000_0000u64 | i as u64).to_le_bytes()).collect()
}

/// Creates /f0../f{N-1}, one block each, each file fsynced on its own (in order, one thread:
/// every fsync's flush completes before the next transaction is built), and returns the image
/// as the crash leaves it (all of it flushed).
fn crashed_image() -> Vec<u8> {
    let dev = Arc::new(MemDevice::new(64 << 20));
    Fs::format(&*dev, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts()).unwrap();
    for i in 0..N {
        let a = fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
        fs.write_at(a.ino, 0, &pattern(i)).unwrap();
        fs.fsync(a.ino, false).unwrap();
    }
    // The crash: the file system is never unmounted (nor dropped, which would unmount it).
    std::mem::forget(fs);
    dev.snapshot()
}

/// The block address of file `i`'s data in `image`.
fn block_of(image: &[u8], i: usize) -> usize {
    let p = pattern(i);
    let mut at = image.chunks(BLOCK_SIZE).enumerate().filter(|(_, b)| *b == p.as_slice()).map(|(a, _)| a);
    let a = at.next().unwrap_or_else(|| panic!("no block of f{i} in the image"));
    assert!(at.next().is_none(), "f{i}'s block is in the image twice");
    a
}

/// Overwrites block `addr` with `fill`: as the disk holds it when the write never got there (the
/// block's old contents) or was replaced by something else.
fn clobber(image: &mut [u8], addr: usize, fill: u8) {
    image[addr * BLOCK_SIZE..(addr + 1) * BLOCK_SIZE].fill(fill);
}

/// Mounts `image`, returns the recovery report and what each /f{i} holds (None: no such file).
fn recover(image: Vec<u8>) -> (RecoveryReport, Vec<Option<Vec<u8>>>) {
    let dev = Arc::new(MemDevice::from_bytes(image));
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts()).unwrap();
    let report = fs.recovery().clone();
    let files = (0..N)
        .map(|i| {
            let a = fs.resolve(&format!("/f{i}")).ok()?;
            let mut buf = vec![0u8; a.size as usize];
            assert_eq!(fs.read_at(a.ino, 0, &mut buf).unwrap(), buf.len());
            Some(buf)
        })
        .collect();
    fs.unmount().unwrap();
    let r = fsck(&*dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "fsck after recovery: {:#?}", r.problems);
    (report, files)
}

/// The crash as it happened: every transaction kept, and only the last one's data read back
/// (each earlier one is proven by the mark of the one after it).
#[test]
fn only_the_unproven_tail_is_read_back() {
    let (r, files) = recover(crashed_image());
    assert_eq!(r.torn_transactions, 0, "{r:?}");
    assert_eq!(r.transactions, N, "{r:?}");
    assert_eq!(r.data_blocks_checked, 1, "only the last transaction's block: {r:?}");
    assert_eq!(r.data_blocks, N as u64, "{r:?}");
    assert!(r.to_string().contains("1 data blocks checked"), "{r}");
    for (i, f) in files.iter().enumerate() {
        assert_eq!(f.as_deref(), Some(&pattern(i)[..]), "f{i}");
    }
}

/// The last transaction's data never reached the disk (its journal block did): recovery must
/// drop exactly that transaction, and keep every earlier fsynced byte.
#[test]
fn a_torn_last_transaction_is_dropped_and_the_rest_kept() {
    let mut image = crashed_image();
    let last = block_of(&image, N - 1);
    clobber(&mut image, last, 0);
    let (r, files) = recover(image);
    assert_eq!(r.torn_transactions, 1, "{r:?}");
    assert_eq!(r.transactions, N - 1, "{r:?}");
    assert_eq!(r.data_blocks, N as u64 - 1, "the torn transaction's block is not mapped: {r:?}");
    for (i, f) in files.iter().enumerate().take(N - 1) {
        assert_eq!(f.as_deref(), Some(&pattern(i)[..]), "f{i}, fsynced before the torn one");
    }
    assert!(
        files[N - 1].is_none(),
        "f{}'s create was in the torn transaction: {:?}",
        N - 1,
        files[N - 1].as_ref().map(Vec::len)
    );
}

/// Proof that a proven transaction is not read back: its data block is changed on the image
/// (which no crash does to a block a flush made durable), and recovery still keeps it and every
/// transaction after it; only the unproven tail is checked (and still dropped when torn).
#[test]
fn a_proven_transaction_is_not_read_back() {
    let mut image = crashed_image();
    let proven = block_of(&image, 3);
    clobber(&mut image, proven, 0xa5);
    let (r, files) = recover(image.clone());
    assert_eq!((r.transactions, r.torn_transactions, r.data_blocks_checked), (N, 0, 1), "{r:?}");
    assert_eq!(files[3].as_deref(), Some(&[0xa5u8; BLOCK_SIZE][..]), "replayed without a check");
    assert_eq!(files[N - 1].as_deref(), Some(&pattern(N - 1)[..]));

    let last = block_of(&image, N - 1);
    clobber(&mut image, last, 0);
    let (r, files) = recover(image);
    assert_eq!((r.transactions, r.torn_transactions), (N - 1, 1), "{r:?}");
    assert!(files[N - 1].is_none());
    assert_eq!(files[N - 2].as_deref(), Some(&pattern(N - 2)[..]));
}

/// A device whose flushes wait, once armed, until the test lets them go: an fsync's group
/// commit can be held between its batch and its flush while another fsync writes.
struct HeldFlush {
    inner: Arc<CrashDevice<MemDevice>>,
    /// (armed, flushes waiting).
    state: Mutex<(bool, usize)>,
    cv: Condvar,
}

impl HeldFlush {
    fn set_armed(&self, armed: bool) {
        self.state.lock().unwrap().0 = armed;
        self.cv.notify_all();
    }

    /// Waits (bounded) until `f` holds of the device's state.
    fn wait_for(&self, what: &str, f: impl Fn(&(bool, usize)) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut st = self.state.lock().unwrap();
        while !f(&st) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            st = self.cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
        }
    }
}

impl BlockDevice for HeldFlush {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> std::io::Result<()> {
        self.inner.read_batch(reqs)
    }
    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> std::io::Result<()> {
        self.inner.write_batch(reqs)
    }
    fn flush(&self) -> std::io::Result<()> {
        let mut st = self.state.lock().unwrap();
        st.1 += 1;
        self.cv.notify_all();
        while st.0 {
            st = self.cv.wait(st).unwrap();
        }
        st.1 -= 1;
        drop(st);
        self.inner.flush()
    }
    fn io_mode(&self) -> IoMode {
        self.inner.io_mode()
    }
}

/// Two fsyncs in one lane with the first one's flush still out: the second transaction must
/// not claim the first durable. The crash keeps both transactions' journal blocks and the second
/// one's data, not the first one's data: recovery must drop the first (its data is not there)
/// and the second after it, and keep the versions fsynced before. (A writer that marked what
/// was only written, not flushed, would have the first replayed unread over a block that never
/// got its data.)
#[test]
fn a_transaction_whose_flush_was_still_out_is_not_proven() {
    let mem = MemDevice::new(64 << 20);
    Fs::format(&mem, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
    let base = mem.snapshot();
    let crash = Arc::new(CrashDevice::new(mem));
    let dev = Arc::new(HeldFlush { inner: crash.clone(), state: Mutex::new((false, 0)), cv: Condvar::new() });
    // The old commit path: with cooperative commit b's transaction cannot be written while
    // a's flush is out (the next batch is taken only once the flush of the one in flight
    // ended), so the interleaving this test builds exists only with the switch off.
    let coop_off = FsOptions { cooperative: false, ..opts() };
    let fs: &'static Fs =
        Box::leak(Box::new(Fs::open(dev.clone() as Arc<dyn BlockDevice>, coop_off).unwrap()));
    let (a, b) =
        (fs.create(ROOT, b"a", 0o644, 0, 0).unwrap().ino, fs.create(ROOT, b"b", 0o644, 0, 0).unwrap().ino);
    for (ino, i) in [(a, 0), (b, 1)] {
        fs.write_at(ino, 0, &pattern(i)).unwrap();
        fs.fsync(ino, false).unwrap();
    }
    // a's fsync writes its transaction and stops in the flush; then b's writes its own and
    // waits for a's flush (group commit).
    dev.set_armed(true);
    fs.write_at(a, 0, &pattern(2)).unwrap();
    fs.write_at(b, 0, &pattern(3)).unwrap();
    let ta = std::thread::spawn(move || fs.fsync(a, false).unwrap());
    dev.wait_for("a's flush", |st| st.1 == 1);
    let tb = std::thread::spawn(move || fs.fsync(b, false).unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    let written = |i: usize| {
        let p = pattern(i);
        crash.with_events(|ev| {
            ev.iter().position(|e| matches!(&e.kind, EventKind::Write { data, .. } if *data == p))
        })
    };
    while written(3).is_none() {
        assert!(Instant::now() < deadline, "b's transaction was never written");
        std::thread::sleep(Duration::from_millis(5));
    }
    dev.set_armed(false);
    ta.join().unwrap();
    tb.join().unwrap();

    let events = crash.events();
    let a_data = written(2).expect("a's new block was written");
    let last_flush = flush_points(&events).into_iter().filter(|&f| f < a_data).max();
    let extra: Vec<usize> =
        in_flight_after(&events, last_flush).into_iter().filter(|&i| i != a_data).collect();
    assert!(extra.iter().any(|&i| Some(i) == written(3)), "b's data is in the same window");
    let image = state_with_subset(&base, &events, last_flush, &extra).unwrap();
    let (r, files) = {
        let dev = Arc::new(MemDevice::from_bytes(image));
        let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts()).unwrap();
        let r = fs.recovery().clone();
        let read = |name: &str| {
            let at = fs.resolve(name).unwrap();
            let mut buf = vec![0u8; at.size as usize];
            fs.read_at(at.ino, 0, &mut buf).unwrap();
            buf
        };
        let files = (read("/a"), read("/b"));
        fs.unmount().unwrap();
        assert!(fsck(&*dev, &FsckOptions::default()).unwrap().is_clean());
        (r, files)
    };
    assert_eq!(r.torn_transactions, 2, "a's transaction and b's after it: {r:?}");
    assert_eq!(files.0, pattern(0), "a: the version fsynced before");
    assert_eq!(files.1, pattern(1), "b: the version fsynced before");
}
