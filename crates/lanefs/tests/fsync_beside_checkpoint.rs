//! fsync and writeback beside a checkpoint's write phase (issue 18).
//!
//! A checkpoint holds the gate exclusively only for its snapshot; fsyncs of files it did not
//! capture go on while it writes. Here a device holds the checkpoint's first metadata write
//! (its NAT, SIT or pack: nothing else writes below the main area) while threads create,
//! write and fsync files in directories the checkpoint captured, and unlink files it captured.
//! Those fsyncs must complete while the checkpoint is held, and two crash images must recover
//! every fsynced byte: one taken while the checkpoint is held (recovery from the previous
//! checkpoint replays them), one taken after it committed while more fsyncs ran (recovery from
//! it). A second test does the same with fsyncs of files the checkpoint *captured* (dirty at its
//! snapshot: pages never fsynced, a truncation, an xattr, a mode), which journal the
//! checkpoint's bridge instead of waiting for it. A third holds the checkpoint at its first
//! data write, before it installed the files: their fsyncs install them themselves (Son's
//! cooperative checkpoint, `cp_helped`). A fourth runs fsyncs against checkpoints taken back to
//! back, then checks a crash image and a clean remount. A fifth links and fsyncs an O_TMPFILE
//! file the checkpoint captured with no name, which must wait for it rather than journal its
//! bridge. Every recovered image passes fsck.

use lanefs::device::{BlockDevice, IoMode, MemDevice, ReadReq, WriteReq};
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Hold {
    #[default]
    Off,
    Armed,
    /// Holds the first write batch of the thread in `cp_thread`, whatever it writes.
    ArmedThread,
    Holding,
    Released,
}

/// A `MemDevice` that holds the first write batch below the main area (checkpoint metadata)
/// once armed, or the first of one thread's (`ArmedThread`), until released.
struct MetaHoldDevice {
    inner: MemDevice,
    main_start: AtomicU64,
    cp_thread: Mutex<Option<std::thread::ThreadId>>,
    hold: Mutex<Hold>,
    cv: Condvar,
}

impl MetaHoldDevice {
    fn set(&self, h: Hold) {
        *self.hold.lock().unwrap() = h;
        self.cv.notify_all();
    }

    /// Starts a checkpoint (`Fs::sync`) on a thread of its own and returns once it is held at
    /// its first metadata write; join the handle after `set(Hold::Released)`.
    fn hold_checkpoint(&self, fs: &Arc<Fs>) -> std::thread::JoinHandle<()> {
        self.set(Hold::Armed);
        let fs = fs.clone();
        let cp = std::thread::spawn(move || fs.sync().unwrap());
        self.wait_for(Hold::Holding);
        cp
    }

    /// Starts a checkpoint on a thread of its own and returns once it is held at the first
    /// write that thread makes after its snapshot (its first batch of data). Nothing is dirty
    /// enough here for early writeback (64 pages), which would write before the snapshot.
    fn hold_checkpoint_first_write(self: &Arc<Self>, fs: &Arc<Fs>) -> std::thread::JoinHandle<()> {
        self.set(Hold::ArmedThread);
        let (fs, dev) = (fs.clone(), self.clone());
        let cp = std::thread::spawn(move || {
            *dev.cp_thread.lock().unwrap() = Some(std::thread::current().id());
            fs.sync().unwrap()
        });
        self.wait_for(Hold::Holding);
        cp
    }

    /// Waits (bounded) until `done` reaches `want` while the checkpoint is held; releases it and
    /// fails if it does not: one stuck past the deadline is what the tests look for.
    fn expect_done_while_held(&self, done: &AtomicU64, want: u64, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while done.load(Ordering::Acquire) < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let n = done.load(Ordering::Acquire);
        if n < want {
            self.set(Hold::Released);
            panic!("only {n} of {want} {what} completed while the checkpoint was held");
        }
    }

    fn wait_for(&self, want: Hold) {
        let g = self.hold.lock().unwrap();
        let (_g, t) = self.cv.wait_timeout_while(g, Duration::from_secs(30), |h| *h != want).unwrap();
        assert!(!t.timed_out(), "the device never reached {want:?}");
    }
}

impl BlockDevice for MetaHoldDevice {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> std::io::Result<()> {
        self.inner.read_batch(reqs)
    }
    fn write_batch(&self, reqs: &[WriteReq<'_>]) -> std::io::Result<()> {
        let main = self.main_start.load(Ordering::Acquire);
        let mut g = self.hold.lock().unwrap();
        let mine = || *self.cp_thread.lock().unwrap() == Some(std::thread::current().id());
        if (*g == Hold::Armed && reqs.iter().any(|r| r.addr < main)) || (*g == Hold::ArmedThread && mine()) {
            *g = Hold::Holding;
            self.cv.notify_all();
            let (_g, t) =
                self.cv.wait_timeout_while(g, Duration::from_secs(60), |h| *h != Hold::Released).unwrap();
            assert!(!t.timed_out(), "the test never released the checkpoint");
        } else {
            drop(g);
        }
        self.inner.write_batch(reqs)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn io_mode(&self) -> IoMode {
        self.inner.io_mode()
    }
}

/// No background checkpoint: the test takes them.
fn opts() -> FsOptions {
    FsOptions { checkpoint_interval: None, journal_blocks_limit: u64::MAX / 4, ..Default::default() }
}

/// The bytes of version `v` of file `name` (`len` bytes: not page-aligned, so sizes count).
fn content(name: &str, v: u32, len: usize) -> Vec<u8> {
    let seed = name.bytes().fold(v.wrapping_mul(2_654_435_761), |a, b| a.rotate_left(5) ^ b as u32);
    (0..len).map(|i| (seed.wrapping_add(i as u32).wrapping_mul(0x9E37_79B1) >> 13) as u8).collect()
}

/// What a thread made durable: path -> bytes its last acknowledged fsync covered.
type Durable = BTreeMap<String, Vec<u8>>;

/// Creates `dir/name`, writes it and fsyncs it; records it as durable.
fn create_synced(fs: &Fs, dir: u64, dpath: &str, name: &str, v: u32, durable: &mut Durable) {
    let ino = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
    let bytes = content(name, v, 5000 + (v as usize % 7) * 3000);
    fs.write_at(ino, 0, &bytes).unwrap();
    fs.fsync(ino, false).unwrap();
    durable.insert(format!("{dpath}/{name}"), bytes);
}

/// Mounts the crash image `img` (recovery runs), checks every durable file, unmounts and
/// runs fsck.
fn check_image(img: Vec<u8>, durable: &Durable, what: &str) {
    let mem = Arc::new(MemDevice::from_bytes(img));
    let fs = Fs::open(mem.clone(), opts()).unwrap();
    for (path, want) in durable {
        let ino =
            fs.resolve(path).unwrap_or_else(|e| panic!("{what}: {path} is gone after recovery: {e}")).ino;
        let mut got = vec![0u8; want.len() + 4096];
        let n = fs.read_at(ino, 0, &mut got).unwrap();
        assert_eq!(n, want.len(), "{what}: {path}: size after recovery");
        assert!(got[..n] == want[..], "{what}: {path}: contents after recovery differ from its last fsync");
    }
    fs.unmount().unwrap();
    let report = fsck(&*mem, &FsckOptions::default()).unwrap();
    assert!(report.is_clean(), "{what}: fsck after recovery: {:?}", report.problems);
}

#[test]
fn fsyncs_complete_while_a_checkpoint_writes_and_survive_a_crash_on_either_side_of_it() {
    let (dev, fs) = held_fs();
    const THREADS: usize = 3;
    let dirs: Vec<u64> =
        (0..THREADS).map(|k| fs.mkdir(ROOT, format!("t{k}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    fs.sync().unwrap();

    // Phase A: each thread's directory and files change, so the checkpoint captures them.
    let mut durable: Vec<Durable> = vec![Durable::new(); THREADS];
    for (k, d) in dirs.iter().enumerate() {
        for i in 0..12 {
            create_synced(&fs, *d, &format!("/t{k}"), &format!("a{i}"), i, &mut durable[k]);
        }
    }
    // A file written but not fsynced: the checkpoint takes its pages (it is captured).
    let lazy = fs.create(dirs[0], b"lazy", 0o644, 0, 0).unwrap().ino;
    fs.write_at(lazy, 0, &content("lazy", 1, 9000)).unwrap();

    // The checkpoint, held at its first metadata write: its data and nodes are written.
    let cp = dev.hold_checkpoint(&fs);

    // Phase B, while it is held: new files in the captured directories, files it captured
    // unlinked (their records go out with the next fsync of the directory's closure).
    let done_during = Arc::new(AtomicU64::new(0));
    let phase_b: Vec<_> = dirs
        .iter()
        .enumerate()
        .map(|(k, &d)| {
            let (fs, done) = (fs.clone(), done_during.clone());
            let mut mine = durable[k].clone();
            std::thread::spawn(move || {
                for i in 0..10u32 {
                    if i % 3 == 0 {
                        fs.unlink(d, format!("a{i}").as_bytes()).unwrap();
                        mine.remove(&format!("/t{k}/a{i}"));
                    }
                    create_synced(&fs, d, &format!("/t{k}"), &format!("b{i}"), 100 + i, &mut mine);
                    done.fetch_add(1, Ordering::AcqRel);
                }
                mine
            })
        })
        .collect();
    // Bounded: every fsync above is of a file the held checkpoint did not capture, so none
    // waits for it; a thread stuck past the deadline is the failure this test looks for.
    let deadline = Instant::now() + Duration::from_secs(20);
    while done_during.load(Ordering::Acquire) < (THREADS * 10) as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let done = done_during.load(Ordering::Acquire);
    if done < (THREADS * 10) as u64 {
        dev.set(Hold::Released);
        panic!("only {done} of {} fsyncs completed while the checkpoint was held", THREADS * 10);
    }
    durable = phase_b.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(fs.io_stats().cp_waits, 0, "no fsync waited for the checkpoint");
    assert!(!cp.is_finished() && *dev.hold.lock().unwrap() == Hold::Holding, "the checkpoint was still held");
    // Crash 1: the checkpoint's pack never landed; recovery starts from the previous one.
    let before_commit = dev.inner.snapshot();

    dev.set(Hold::Released);
    cp.join().unwrap();
    assert_eq!(fs.cp_exclusive_work().phases, 2, "two snapshots since mount, both counted");

    // Phase C, after the commit: rewrites of files written during the write phase.
    for (k, d) in dirs.iter().enumerate() {
        for i in [1u32, 4, 7] {
            let name = format!("b{i}");
            let ino = fs.lookup(*d, name.as_bytes()).unwrap().ino;
            let bytes = content(&name, 200 + i, 7000);
            fs.truncate(ino, 0).unwrap();
            fs.write_at(ino, 0, &bytes).unwrap();
            fs.fsync(ino, true).unwrap();
            durable[k].insert(format!("/t{k}/{name}"), bytes);
        }
    }
    // Crash 2: recovery from the new checkpoint replays what came after its stamp.
    let after_commit = dev.inner.snapshot();
    let all: Durable = durable.iter().flat_map(|d| d.clone()).collect();
    // Crash 1 holds everything fsynced before it: phase A and B, not C.
    let upto_b: Durable = all
        .iter()
        .filter(|(p, _)| !["/b1", "/b4", "/b7"].iter().any(|s| p.ends_with(s)))
        .map(|(p, b)| (p.clone(), b.clone()))
        .collect();
    check_image(before_commit, &upto_b, "crash during the checkpoint's write phase");
    check_image(after_commit, &all, "crash after the checkpoint");
    drop(fs);
}

/// A device that holds the checkpoint's first metadata write, formatted and mounted.
fn held_fs() -> (Arc<MetaHoldDevice>, Arc<Fs>) {
    let dev = Arc::new(MetaHoldDevice {
        inner: MemDevice::new(256 << 20),
        main_start: AtomicU64::new(0),
        cp_thread: Mutex::default(),
        hold: Mutex::default(),
        cv: Condvar::new(),
    });
    Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    let g = lanefs::testing::checkpoint::read_superblock(&*dev).unwrap().sb.geometry;
    dev.main_start.store(g.main_blkaddr, Ordering::Release);
    let fs = Arc::new(Fs::open(dev.clone(), opts()).unwrap());
    (dev, fs)
}

#[test]
fn fsyncs_of_captured_files_finish_while_the_checkpoint_is_held_and_recover_on_either_side() {
    let (dev, fs) = held_fs();
    const THREADS: usize = 3;
    let dirs: Vec<u64> =
        (0..THREADS).map(|k| fs.mkdir(ROOT, format!("c{k}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    fs.sync().unwrap();

    // Phase A: every file changes after its last fsync, so the snapshot takes what no journal
    // holds: pages never fsynced, a truncation and a write past it, an xattr, a mode.
    let mut durable: Vec<Durable> = vec![Durable::new(); THREADS];
    let mut files: Vec<Vec<(String, u64)>> = vec![Vec::new(); THREADS];
    for (k, &d) in dirs.iter().enumerate() {
        let dpath = format!("/c{k}");
        for i in 0..6u32 {
            let name = format!("f{i}");
            create_synced(&fs, d, &dpath, &name, i, &mut durable[k]);
            let ino = fs.lookup(d, name.as_bytes()).unwrap().ino;
            let path = format!("{dpath}/{name}");
            let bytes = durable[k].get_mut(&path).unwrap();
            match i % 3 {
                // Appended, not fsynced.
                0 => {
                    let more = content(&name, 10 + i, 6000);
                    fs.write_at(ino, bytes.len() as u64, &more).unwrap();
                    bytes.extend_from_slice(&more);
                }
                // Truncated into its first block, then written past the old end: a hole between.
                1 => {
                    fs.truncate(ino, 1000).unwrap();
                    bytes.truncate(1000);
                    let more = content(&name, 20 + i, 3000);
                    fs.write_at(ino, 16384, &more).unwrap();
                    bytes.resize(16384, 0);
                    bytes.extend_from_slice(&more);
                }
                // Attributes only.
                _ => {
                    fs.setxattr(ino, b"user.k", format!("v{i}").as_bytes(), lanefs::XattrFlags::empty())
                        .unwrap();
                    fs.setattr(ino, &lanefs::SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
                }
            }
            files[k].push((name, ino));
        }
        // Never fsynced at all before the snapshot.
        let ino = fs.create(d, b"lazy", 0o644, 0, 0).unwrap().ino;
        let bytes = content("lazy", k as u32, 9000);
        fs.write_at(ino, 0, &bytes).unwrap();
        durable[k].insert(format!("{dpath}/lazy"), bytes);
        files[k].push(("lazy".into(), ino));
    }

    // The checkpoint, held at its first metadata write: it has installed every inode.
    let cp = dev.hold_checkpoint(&fs);

    // Phase B, while it is held: every captured file is fsynced, half after another append.
    let done_during = Arc::new(AtomicU64::new(0));
    let phase_b: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(k, mine)| {
            let (fs, done, mine) = (fs.clone(), done_during.clone(), mine.clone());
            let mut bytes_of = durable[k].clone();
            std::thread::spawn(move || {
                for (j, (name, ino)) in mine.iter().enumerate() {
                    let path = format!("/c{k}/{name}");
                    if j % 2 == 1 {
                        let b = bytes_of.get_mut(&path).unwrap();
                        let more = content(name, 300 + j as u32, 2500);
                        fs.write_at(*ino, b.len() as u64, &more).unwrap();
                        b.extend_from_slice(&more);
                    }
                    fs.fsync(*ino, j % 3 == 0).unwrap();
                    done.fetch_add(1, Ordering::AcqRel);
                }
                bytes_of
            })
        })
        .collect();
    let want = files.iter().map(Vec::len).sum::<usize>() as u64;
    // Each fsync waits only until the checkpoint installed its inode, which it did before its
    // metadata write.
    dev.expect_done_while_held(&done_during, want, "fsyncs of captured files");
    durable = phase_b.into_iter().map(|h| h.join().unwrap()).collect();
    let io = fs.io_stats();
    assert_eq!(io.cp_waits, 0, "no fsync of a captured file waited for the checkpoint");
    assert_eq!(io.cp_bridges, want, "each captured file's first fsync journaled the bridge");
    assert!(!cp.is_finished() && *dev.hold.lock().unwrap() == Hold::Holding, "the checkpoint was still held");
    // Crash 1: the pack never landed; recovery from the previous checkpoint needs the bridges.
    let before_commit = dev.inner.snapshot();

    dev.set(Hold::Released);
    cp.join().unwrap();
    // Phase C, after the commit: one more append to each captured file (no bridge now).
    for (k, mine) in files.iter().enumerate() {
        for (name, ino) in mine.iter().step_by(2) {
            let path = format!("/c{k}/{name}");
            let b = durable[k].get_mut(&path).unwrap();
            let more = content(name, 400, 1234);
            fs.write_at(*ino, b.len() as u64, &more).unwrap();
            fs.fsync(*ino, false).unwrap();
            b.extend_from_slice(&more);
        }
    }
    let after_commit = dev.inner.snapshot();
    let upto_b: Durable = {
        // Phase C's appends are not in crash 1: cut each file back to what phase B synced.
        let mut d: Durable = durable.iter().flat_map(|d| d.clone()).collect();
        for (k, mine) in files.iter().enumerate() {
            for (name, _) in mine.iter().step_by(2) {
                let b = d.get_mut(&format!("/c{k}/{name}")).unwrap();
                b.truncate(b.len() - 1234);
            }
        }
        d
    };
    let all: Durable = durable.iter().flat_map(|d| d.clone()).collect();
    for (img, want, what) in [
        (before_commit, &upto_b, "crash while the checkpoint is held"),
        (after_commit, &all, "crash after the checkpoint"),
    ] {
        check_image(img.clone(), want, what);
        // The attributes the bridges carry.
        let fs = Fs::open(Arc::new(MemDevice::from_bytes(img)), opts()).unwrap();
        for k in 0..THREADS {
            for i in (2..6).step_by(3) {
                let ino = fs.resolve(&format!("/c{k}/f{i}")).unwrap().ino;
                assert_eq!(fs.getxattr(ino, b"user.k").unwrap(), format!("v{i}").as_bytes(), "{what}: xattr");
                assert_eq!(fs.getattr(ino).unwrap().mode & 0o7777, 0o600, "{what}: mode");
            }
        }
        fs.unmount().unwrap();
    }
}

#[test]
fn fsyncs_install_captured_files_the_held_checkpoint_has_not_reached() {
    let (dev, fs) = held_fs();
    let d = fs.mkdir(ROOT, b"c", 0o755, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    // The checkpoint installs its inodes in inode order, in batches of about 32 blocks: the
    // decoy's 48 dirty pages end the batch it is in, which the device holds. Files numbered
    // after it are still unclaimed then; those before it may be in the held batch.
    let decoy = fs.create(ROOT, b"decoy", 0o644, 0, 0).unwrap().ino;
    fs.write_at(decoy, 0, &content("decoy", 0, 48 * 4096)).unwrap();
    let mut durable = Durable::new();
    let mut files = Vec::new();
    for i in 0..24u32 {
        let name = format!("f{i}");
        create_synced(&fs, d, "/c", &name, i, &mut durable);
        // Appended after the fsync: the snapshot takes pages no journal holds.
        let ino = fs.lookup(d, name.as_bytes()).unwrap().ino;
        let b = durable.get_mut(&format!("/c/{name}")).unwrap();
        let more = content(&name, 50 + i, 7000);
        fs.write_at(ino, b.len() as u64, &more).unwrap();
        b.extend_from_slice(&more);
        files.push((name, ino));
    }
    let (after, before): (Vec<_>, Vec<_>) = files.iter().cloned().partition(|(_, ino)| *ino > decoy);
    assert!(after.len() >= 8, "only {} files numbered after the decoy: the test needs more", after.len());

    let cp = dev.hold_checkpoint_first_write(&fs);
    let done = Arc::new(AtomicU64::new(0));
    let syncer = {
        let (fs, done, after) = (fs.clone(), done.clone(), after.clone());
        std::thread::spawn(move || {
            for (_, ino) in &after {
                fs.fsync(*ino, false).unwrap();
                done.fetch_add(1, Ordering::AcqRel);
            }
        })
    };
    let want = after.len() as u64;
    // An fsync that waits for the held checkpoint instead of installing its file never ends.
    dev.expect_done_while_held(&done, want, "fsyncs of unreached captured files");
    syncer.join().unwrap();
    let io = fs.io_stats();
    assert_eq!(io.cp_helped, want, "each file the checkpoint had not reached was installed by its fsync");
    assert_eq!(io.cp_waits, 0, "no fsync waited for the checkpoint");
    assert_eq!(io.cp_bridges, want, "each then journaled the bridge");
    assert!(!cp.is_finished() && *dev.hold.lock().unwrap() == Hold::Holding, "the checkpoint was still held");
    // Crash 1: the checkpoint never committed; the helpers' installs are garbage, the bridges
    // they left carry the captured pages.
    let upto_hold: Durable = durable
        .iter()
        .filter(|(p, _)| after.iter().any(|(n, _)| **p == format!("/c/{n}")))
        .map(|(p, b)| (p.clone(), b.clone()))
        .collect();
    let during = dev.inner.snapshot();
    dev.set(Hold::Released);
    cp.join().unwrap();
    for (_, ino) in &before {
        fs.fsync(*ino, false).unwrap();
    }
    check_image(during, &upto_hold, "crash while the checkpoint is held, after helped fsyncs");
    // Crash 2: after the checkpoint, which holds the helpers' installs.
    check_image(dev.inner.snapshot(), &durable, "crash after a checkpoint that fsyncs helped install");
}

#[test]
fn fsyncs_against_back_to_back_checkpoints_keep_every_fsynced_byte() {
    let mem = Arc::new(MemDevice::new(256 << 20));
    Fs::format(&*mem, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    // A small cache: writeback runs beside the checkpoints too.
    let fs = Arc::new(Fs::open(mem.clone(), FsOptions { cache_bytes: 1 << 20, ..opts() }).unwrap());
    const THREADS: usize = 4;
    let dirs: Vec<u64> =
        (0..THREADS).map(|k| fs.mkdir(ROOT, format!("w{k}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    fs.sync().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let checkpoints = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            // Bounded by the workers, which set `stop` when done.
            while !stop.load(Ordering::Acquire) {
                fs.sync().unwrap();
                n += 1;
            }
            n
        })
    };
    let workers: Vec<_> = dirs
        .iter()
        .enumerate()
        .map(|(k, &d)| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut mine = Durable::new();
                let dpath = format!("/w{k}");
                for i in 0..300u32 {
                    let name = format!("f{}", i % 40);
                    match i % 5 {
                        // Replace a file (varmail's delete and create).
                        0 if mine.contains_key(&format!("{dpath}/{name}")) => {
                            fs.unlink(d, name.as_bytes()).unwrap();
                            mine.remove(&format!("{dpath}/{name}"));
                            create_synced(&fs, d, &dpath, &name, i, &mut mine);
                        }
                        // Append to a file and fdatasync it.
                        1 | 2 if mine.contains_key(&format!("{dpath}/{name}")) => {
                            let path = format!("{dpath}/{name}");
                            let ino = fs.lookup(d, name.as_bytes()).unwrap().ino;
                            let more = content(&name, i, 3000);
                            let old = mine.get_mut(&path).unwrap();
                            fs.write_at(ino, old.len() as u64, &more).unwrap();
                            fs.fsync(ino, true).unwrap();
                            old.extend_from_slice(&more);
                        }
                        _ if !mine.contains_key(&format!("{dpath}/{name}")) => {
                            create_synced(&fs, d, &dpath, &name, i, &mut mine)
                        }
                        // A large unsynced write: writeback and the checkpoint carry it.
                        _ => {
                            let big = fs.create(d, format!("big{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                            fs.write_at(big, 0, &content("big", i, 256 << 10)).unwrap();
                        }
                    }
                }
                mine
            })
        })
        .collect();
    let durable: Durable = workers.into_iter().flat_map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Release);
    let n = checkpoints.join().unwrap();
    assert!(n >= 3, "only {n} checkpoints ran beside the fsyncs");
    // One more fsynced change after the last checkpoint, then the crash.
    let last = fs.create(dirs[0], b"last", 0o644, 0, 0).unwrap().ino;
    fs.write_at(last, 0, b"after every checkpoint").unwrap();
    fs.fsync(last, false).unwrap();
    let mut with_last = durable.clone();
    with_last.insert("/w0/last".into(), b"after every checkpoint".to_vec());
    check_image(mem.snapshot(), &with_last, "crash after fsyncs beside back-to-back checkpoints");
    // And a clean remount of the image as the run left it.
    Arc::into_inner(fs).expect("the only handle").unmount().unwrap();
    check_image(mem.snapshot(), &with_last, "clean remount");
}

/// An O_TMPFILE file the checkpoint captured with no name, linked and fsynced while the
/// checkpoint is held: its name's record is a `Create` stamped after the checkpoint's snapshot,
/// so a bridge (stamped at the snapshot) would replay before the inode exists on the previous
/// checkpoint. Its fsync must not count as durable before the checkpoint is: whenever it
/// returns, a crash image taken then holds its name and bytes.
#[test]
fn a_tmpfile_captured_unnamed_and_linked_during_the_write_phase_keeps_its_fsynced_bytes() {
    let (dev, fs) = held_fs();
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let (_, h) = fs.tmpfile(d, &lanefs::New { mode: 0o600, ..Default::default() }).unwrap();
    let first = content("t", 1, 30_000);
    h.write_at(0, &first).unwrap();
    // Captured with no name (an orphan) and its pages, then held at its metadata.
    let cp = dev.hold_checkpoint(&fs);
    let more = content("t", 2, 7000);
    h.write_at(20_000, &more).unwrap();
    let mut want = first.clone();
    want[20_000..27_000].copy_from_slice(&more);
    fs.link(h.ino(), d, b"t").unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let h = Arc::new(h);
    let syncer = {
        let (h, done) = (h.clone(), done.clone());
        std::thread::spawn(move || {
            h.fsync(false).unwrap();
            done.store(true, Ordering::Release);
        })
    };
    // Time to return if it would; the image is taken only if it did.
    let deadline = Instant::now() + Duration::from_millis(500);
    while !done.load(Ordering::Acquire) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let during = done.load(Ordering::Acquire).then(|| dev.inner.snapshot());
    dev.set(Hold::Released);
    cp.join().unwrap();
    syncer.join().unwrap();
    let after = dev.inner.snapshot();
    let durable: Durable = [("/d/t".to_string(), want)].into_iter().collect();
    if let Some(img) = during {
        check_image(img, &durable, "fsync returned while the checkpoint was held");
    }
    check_image(after, &durable, "after the checkpoint");
    drop(h);
    Arc::try_unwrap(fs).ok().expect("one owner").unmount().unwrap();
}
