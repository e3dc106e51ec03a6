//! Whole-file-system controls on real image files: the shutdown (`Fs::shutdown`, a crash at a
//! chosen instant), the label, and FITRIM.
//!
//! Shutdown: what was fsynced before it is there after the next mount, what was not is not
//! (no checkpoint, writeback or journal commit happens at or after it, unmount included),
//! every later operation gets EIO, not one byte of the image (or of the persistent-memory
//! region) changes from the moment it returns, and fsck finds the image consistent before and
//! after recovery. FITRIM: it punches holes where segments are free and only there, so that
//! whatever the checkpoint or a recovery still needs reads back intact; arguments are checked
//! as ext4 checks them.

use lanefs::device::{BlockDevice, DeviceOptions, FileDevice, IoChoice, BLOCK_SIZE};
use lanefs::format::SegNo;
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, MkfsOptions, TrimRange, ROOT};
use lanefs::{RenameFlags, XattrFlags};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A temporary directory (in /dev/shm when there is one) holding a formatted image `disk.img`.
fn image(size: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap();
    let path = dir.path().join("disk.img");
    lanefs::device::create_image(&path, size).unwrap();
    let dev = open_dev(&path);
    Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    (dir, path)
}

fn open_dev(path: &Path) -> Arc<dyn BlockDevice> {
    Arc::new(FileDevice::open(path, DeviceOptions { io: IoChoice::Sync }).unwrap())
}

/// No timer: a checkpoint only when asked for (or a bound is passed), so what is durable is
/// exactly what the test made durable.
fn opts() -> FsOptions {
    FsOptions { checkpoint_interval: None, ..Default::default() }
}

fn mount(path: &Path) -> Fs {
    Fs::open(open_dev(path), opts()).unwrap()
}

fn assert_fsck_clean(path: &Path, when: &str) {
    let r = fsck(&*open_dev(path), &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "fsck {when}: {:#?}", r.problems);
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn read_all(fs: &Fs, path: &str) -> Vec<u8> {
    let a = fs.resolve(path).unwrap();
    let mut buf = vec![0u8; a.size as usize];
    assert_eq!(fs.read_at(a.ino, 0, &mut buf).unwrap(), buf.len());
    buf
}

fn eio<T: std::fmt::Debug>(what: &str, r: lanefs::Result<T>) {
    match r {
        Err(e) => {
            assert_eq!(e.to_errno(), libc::EIO, "{what}: {e}");
            assert!(e.is_shut_down(), "{what}: {e}");
        }
        Ok(v) => panic!("{what} succeeded after the shutdown: {v:?}"),
    }
}

#[test]
fn shutdown_keeps_what_was_fsynced_and_writes_nothing_more() {
    let (_dir, path) = image(256 << 20);
    let fs = mount(&path);
    let synced = bytes(1, 300_000);
    let a = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap();
    fs.write_at(a.ino, 0, &synced).unwrap();
    fs.fsync(a.ino, false).unwrap();
    let d = fs.mkdir(ROOT, b"kept", 0o755, 0, 0).unwrap();
    let c = fs.create(d.ino, b"c", 0o600, 0, 0).unwrap();
    fs.write_at(c.ino, 0, b"fsynced in a new directory").unwrap();
    fs.fsync(c.ino, false).unwrap();
    fs.fsync(d.ino, false).unwrap();
    // Not fsynced: a change to `a` after its fsync, a new file, a new directory, a rename.
    fs.write_at(a.ino, 1000, b"NOT SYNCED").unwrap();
    let b = fs.create(ROOT, b"b", 0o644, 0, 0).unwrap();
    fs.write_at(b.ino, 0, b"never fsynced").unwrap();
    fs.mkdir(ROOT, b"lost", 0o755, 0, 0).unwrap();
    fs.rename(d.ino, b"c", ROOT, b"c-moved", RenameFlags::empty()).unwrap();
    let handle = fs.open_file(a.ino).unwrap();

    fs.shutdown().unwrap();
    assert!(fs.is_shut_down());
    let at_shutdown = std::fs::read(&path).unwrap();

    let mut buf = [0u8; 16];
    eio("getattr", fs.getattr(ROOT));
    eio("lookup", fs.lookup(ROOT, b"a"));
    eio("read", fs.read_at(a.ino, 0, &mut buf));
    eio("write", fs.write_at(a.ino, 0, b"x"));
    eio("create", fs.create(ROOT, b"new", 0o644, 0, 0));
    eio("mkdir", fs.mkdir(ROOT, b"newdir", 0o755, 0, 0));
    eio("unlink", fs.unlink(ROOT, b"a"));
    eio("rename", fs.rename(ROOT, b"a", ROOT, b"z", RenameFlags::empty()));
    eio("truncate", fs.truncate(a.ino, 0));
    eio("setxattr", fs.setxattr(a.ino, b"user.x", b"1", XattrFlags::empty()));
    eio("getxattr", fs.getxattr(a.ino, b"user.x"));
    eio("readdir", fs.readdir(ROOT, 0, 10));
    eio("fsync", fs.fsync(a.ino, false));
    eio("fsync of the unsynced file", fs.fsync(b.ino, false));
    eio("sync", fs.sync());
    eio("clean", fs.clean());
    eio("label", fs.label());
    eio("set_label", fs.set_label(b"x"));
    eio("trim", fs.trim(TrimRange { start: 0, len: u64::MAX, minlen: 0 }));
    eio("handle read", handle.read_at(0, &mut buf));
    eio("handle write", handle.write_at(0, b"x"));
    eio("handle fsync", handle.fsync(false));
    fs.shutdown().unwrap();
    drop(handle);
    fs.unmount().unwrap();
    assert!(std::fs::read(&path).unwrap() == at_shutdown, "the image changed after the shutdown returned");
    assert_fsck_clean(&path, "after the shutdown, before recovery");

    let fs = mount(&path);
    let r = fs.recovery();
    assert!(r.transactions > 0, "the fsyncs are in the journal: {r:?}");
    // What the mount logs: the lanes, the bytes and the journal blocks read.
    assert!(r.replayed() && r.lanes >= 1 && r.lanes <= 2, "{r:?}");
    assert!(r.bytes as usize >= r.records_replayed, "{r:?}");
    assert!(r.journal_blocks >= r.transactions as u64, "{r:?}");
    let line = r.to_string();
    assert!(line.starts_with(&format!("recovered {} transactions", r.transactions)), "{line}");
    assert_eq!(read_all(&fs, "/a"), synced, "a: the fsynced data, without the later change");
    assert_eq!(read_all(&fs, "/kept/c"), b"fsynced in a new directory");
    assert_eq!(fs.getattr(fs.resolve("/kept/c").unwrap().ino).unwrap().mode & 0o7777, 0o600);
    for gone in ["/b", "/lost", "/c-moved"] {
        assert_eq!(fs.resolve(gone).unwrap_err().to_errno(), libc::ENOENT, "{gone} was never made durable");
    }
    // The recovered file system works, and keeps what it is given.
    let e = fs.create(ROOT, b"after", 0o644, 0, 0).unwrap();
    fs.write_at(e.ino, 0, b"after recovery").unwrap();
    fs.unmount().unwrap();
    assert_fsck_clean(&path, "after recovery");
    let fs = mount(&path);
    assert_eq!(read_all(&fs, "/after"), b"after recovery");
    assert_eq!(read_all(&fs, "/a"), synced);
    fs.unmount().unwrap();
}

/// Version `n` of a writer's file: `n` in its first 4 bytes, then a pattern of `n`.
fn version(n: u32, len: usize) -> Vec<u8> {
    let mut v = bytes(n as u8, len);
    v[..4].copy_from_slice(&n.to_le_bytes());
    v
}

#[test]
fn shutdown_under_concurrent_fsyncs_keeps_every_acknowledged_one() {
    let (_dir, path) = image(256 << 20);
    let fs = Arc::new(mount(&path));
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Each writer rewrites its file with version n and fsyncs it, until the shutdown stops it.
    // The last version whose fsync returned Ok must be there after recovery (or a later one,
    // whose fsync was cut short after its commit reached the device).
    let writers: Vec<_> = (0..4usize)
        .map(|w| {
            let fs = fs.clone();
            let started = started.clone();
            std::thread::spawn(move || {
                let name = format!("w{w}");
                let ino = fs.create(ROOT, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
                let mut acked = 0u32;
                // Bounded: the shutdown ends it (the test's main thread waits for every writer
                // to have one fsync acknowledged, then shuts down).
                for n in 1.. {
                    if fs.write_at(ino, 0, &version(n, 20_000 + w * 3000)).is_err() {
                        break;
                    }
                    match fs.fsync(ino, false) {
                        Ok(()) => {
                            if acked == 0 {
                                started.fetch_add(1, Ordering::SeqCst);
                            }
                            acked = n
                        }
                        Err(e) => {
                            assert_eq!(e.to_errno(), libc::EIO, "{e}");
                            break;
                        }
                    }
                }
                (name, acked)
            })
        })
        .collect();
    // Every writer has an acknowledged fsync, and is in the middle of others.
    let t = std::time::Instant::now();
    while started.load(Ordering::SeqCst) < 4 {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "writers did not start");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs.shutdown().unwrap();
    let at_shutdown = std::fs::read(&path).unwrap();
    let acked: Vec<(String, u32)> = writers.into_iter().map(|h| h.join().unwrap()).collect();
    Arc::try_unwrap(fs).ok().expect("writers are done").unmount().unwrap();
    assert!(std::fs::read(&path).unwrap() == at_shutdown, "the image changed after the shutdown returned");

    let fs = mount(&path);
    for (w, (name, n)) in acked.iter().enumerate() {
        assert!(*n > 0, "{name}: no fsync before the shutdown");
        let got = read_all(&fs, &format!("/{name}"));
        let v = u32::from_le_bytes(got[..4].try_into().unwrap());
        assert!(v >= *n, "{name}: version {v}, older than its last acknowledged fsync ({n})");
        assert!(v <= n + 1, "{name}: version {v}, never written");
        assert!(got == version(v, 20_000 + w * 3000), "{name}: version {v} is torn");
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&path, "after recovery");
}

#[test]
fn shutdown_leaves_the_region_alone_too() {
    let (dir, path) = image(256 << 20);
    let region = dir.path().join("disk.nvm");
    let nvm_opts = || FsOptions { nvm: Some(region.clone()), ..opts() };
    let fs = Fs::open(open_dev(&path), nvm_opts()).unwrap();
    let a = fs.create(ROOT, b"a", 0o644, 0, 0).unwrap();
    fs.write_at(a.ino, 0, b"committed to the region").unwrap();
    fs.fsync(a.ino, false).unwrap();
    assert!(fs.io_stats().nvm_journal_bytes > 0, "the fsync went to the region");
    let b = fs.create(ROOT, b"b", 0o644, 0, 0).unwrap();
    fs.write_at(b.ino, 0, b"not synced").unwrap();
    fs.shutdown().unwrap();
    let (img, reg) = (std::fs::read(&path).unwrap(), std::fs::read(&region).unwrap());
    eio("fsync", fs.fsync(b.ino, false));
    fs.unmount().unwrap();
    assert!(std::fs::read(&path).unwrap() == img, "the image changed after the shutdown returned");
    assert!(std::fs::read(&region).unwrap() == reg, "the region changed after the shutdown returned");

    let fs = Fs::open(open_dev(&path), nvm_opts()).unwrap();
    assert_eq!(read_all(&fs, "/a"), b"committed to the region");
    assert_eq!(fs.resolve("/b").unwrap_err().to_errno(), libc::ENOENT);
    fs.unmount().unwrap();
}

#[test]
fn norecovery_mounts_the_checkpoint_alone_and_only_read_only() {
    let (_dir, path) = image(256 << 20);
    let fs = mount(&path);
    let a = fs.create(ROOT, b"checkpointed", 0o644, 0, 0).unwrap();
    fs.write_at(a.ino, 0, b"in the checkpoint").unwrap();
    fs.sync().unwrap();
    let b = fs.create(ROOT, b"journaled", 0o644, 0, 0).unwrap();
    fs.write_at(b.ino, 0, b"in the journal only").unwrap();
    fs.fsync(b.ino, false).unwrap();
    fs.shutdown().unwrap();
    fs.unmount().unwrap();

    let e =
        Fs::open(open_dev(&path), FsOptions { no_recovery: true, ..opts() }).err().expect("rw norecovery");
    assert_eq!(e.to_errno(), libc::EINVAL, "{e}");
    let ro = FsOptions { no_recovery: true, read_only: true, ..opts() };
    let fs = Fs::open(open_dev(&path), ro).unwrap();
    assert_eq!(read_all(&fs, "/checkpointed"), b"in the checkpoint");
    assert_eq!(fs.resolve("/journaled").unwrap_err().to_errno(), libc::ENOENT, "the journal was replayed");
    assert_eq!(
        fs.trim(TrimRange { start: 0, len: u64::MAX, minlen: 0 }).unwrap_err().to_errno(),
        libc::EROFS
    );
    fs.unmount().unwrap();
    // The journal is still there for a mount that recovers.
    let fs = mount(&path);
    assert_eq!(read_all(&fs, "/journaled"), b"in the journal only");
    fs.unmount().unwrap();
}

#[test]
fn the_label_is_set_in_both_superblocks_and_checked() {
    let (_dir, path) = image(128 << 20);
    let fs = mount(&path);
    assert_eq!(fs.label().unwrap(), b"");
    fs.set_label(b"scratch.492").unwrap();
    assert_eq!(fs.label().unwrap(), b"scratch.492");
    let longest = vec![b'o'; lanefs::format::superblock::LABEL_MAX];
    fs.set_label(&longest).unwrap();
    assert_eq!(fs.label().unwrap(), longest);
    let mut too_long = longest.clone();
    too_long.push(b'o');
    assert_eq!(fs.set_label(&too_long).unwrap_err().to_errno(), libc::EINVAL);
    assert_eq!(fs.set_label(b"a\0b").unwrap_err().to_errno(), libc::EINVAL);
    assert_eq!(fs.label().unwrap(), longest, "a refused label changes nothing");
    fs.set_label(b"kept").unwrap();
    fs.unmount().unwrap();

    // Both copies carry it, so either one alone still gives it.
    let dev = open_dev(&path);
    let sbr = lanefs::testing::checkpoint::read_superblock(&*dev).unwrap();
    assert_eq!(sbr.sb.label_str(), "kept");
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_block(1, &mut b).unwrap();
    assert_eq!(lanefs::format::Superblock::decode(&b, Some(1)).unwrap().label_str(), "kept");
    dev.write_block(0, &vec![0u8; BLOCK_SIZE]).unwrap();
    let fs = mount(&path);
    assert_eq!(fs.label().unwrap(), b"kept");
    fs.set_label(b"").unwrap();
    fs.unmount().unwrap();
    assert_fsck_clean(&path, "after the label writes repaired copy A");
    let fs = Fs::open(open_dev(&path), FsOptions { read_only: true, ..opts() }).unwrap();
    assert_eq!(fs.label().unwrap(), b"");
    assert_eq!(fs.set_label(b"x").unwrap_err().to_errno(), libc::EROFS);
    fs.unmount().unwrap();
}

/// The segments free in the image's newest checkpoint: no valid block, no log's active one.
fn free_on_disk(path: &Path) -> Vec<SegNo> {
    let dev = open_dev(path);
    let g = lanefs::testing::checkpoint::read_superblock(&*dev).unwrap().sb.geometry;
    let cp = lanefs::testing::checkpoint::read_checkpoint(&*dev, &g).unwrap().cp;
    let sit = lanefs::testing::checkpoint::read_sit(&*dev, &g, &cp).unwrap();
    let active: Vec<SegNo> = cp.lanes.iter().flat_map(|l| l.logs.iter().map(|c| c.segno)).collect();
    g.segments().filter(|&s| sit[s.index()].valid_blocks == 0 && !active.contains(&s)).collect()
}

const SEG: u64 = 512 * BLOCK_SIZE as u64;

#[test]
fn fitrim_discards_every_free_segment_but_the_cleaners_reserve() {
    let (_dir, path) = image(512 << 20);
    mount(&path).unmount().unwrap();
    let g = lanefs::testing::checkpoint::read_superblock(&*open_dev(&path)).unwrap().sb.geometry;
    let seg_off = |s: SegNo| g.seg_start(s) * BLOCK_SIZE as u64;
    // Free segments hold nothing the file system reads: fill them with a pattern, so that
    // afterwards a discarded one reads as zeros (a hole in the image file) and any other not.
    let free = free_on_disk(&path);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let pattern = vec![0xCDu8; SEG as usize];
        for &s in &free {
            f.write_all_at(&pattern, seg_off(s)).unwrap();
        }
    }
    let fs = mount(&path);
    let trimmed = fs.trim(TrimRange { start: 0, len: u64::MAX, minlen: 0 }).unwrap();
    let user = fs.statfs().blocks * BLOCK_SIZE as u64;
    fs.shutdown().unwrap();
    fs.unmount().unwrap();
    let image = std::fs::read(&path).unwrap();
    let zeroed: Vec<SegNo> = free
        .iter()
        .copied()
        .filter(|&s| image[seg_off(s) as usize..(seg_off(s) + SEG) as usize].iter().all(|&b| b == 0))
        .collect();
    assert_eq!(trimmed, zeroed.len() as u64 * SEG, "the bytes reported are the segments discarded");
    let keep = g.reserved_segments.max(8) as usize;
    // The mount may have moved logs onto a few of the lowest free segments.
    let moved = 2 * 6;
    assert!(
        zeroed.len() + keep + moved >= free.len(),
        "{} of {} free segments discarded",
        zeroed.len(),
        free.len()
    );
    assert!(free.len() - zeroed.len() >= keep, "the reserve's {keep} lowest free segments are left alone");
    let lowest: Vec<SegNo> = free.iter().copied().filter(|s| !zeroed.contains(s)).take(keep).collect();
    assert!(
        lowest.iter().all(|s| zeroed.iter().all(|z| z > s)),
        "the lowest free segments are the ones kept"
    );
    assert!(trimmed <= user, "trimmed {trimmed} bytes of a file system of {user}");
    assert_fsck_clean(&path, "after the trim");
}

#[test]
fn fitrim_checks_its_arguments_as_ext4_does() {
    let (_dir, path) = image(256 << 20);
    let fs = mount(&path);
    let g = lanefs::testing::checkpoint::read_superblock(&*open_dev(&path)).unwrap().sb.geometry;
    let dev_bytes = g.total_blocks * BLOCK_SIZE as u64;
    for (r, why) in [
        (TrimRange { start: 0, len: 0, minlen: 0 }, "empty range"),
        (TrimRange { start: 0, len: 100, minlen: 0 }, "range under a block"),
        (TrimRange { start: dev_bytes, len: 1 << 20, minlen: 0 }, "start at the end of the device"),
        (TrimRange { start: dev_bytes * 2, len: u64::MAX, minlen: 0 }, "start past the device"),
        (TrimRange { start: u64::MAX, len: 1 << 20, minlen: 0 }, "start 2^64-1"),
        (TrimRange { start: 0, len: u64::MAX, minlen: dev_bytes }, "minlen over the file system"),
    ] {
        assert_eq!(fs.trim(r).unwrap_err().to_errno(), libc::EINVAL, "{why}");
    }
    let all = fs.trim(TrimRange { start: 0, len: u64::MAX, minlen: 0 }).unwrap();
    assert!(all > 0 && all.is_multiple_of(SEG), "{all}");
    // A range takes the free segments inside it only; the end of the device has none.
    let part =
        fs.trim(TrimRange { start: g.main_blkaddr * BLOCK_SIZE as u64, len: 32 * SEG, minlen: 0 }).unwrap();
    assert!(part <= 32 * SEG && part < all, "{part} of {all}");
    // The last block: in the main area's last segment, free, so trimmed alone.
    assert_eq!(fs.trim(TrimRange { start: dev_bytes - 4096, len: 1 << 30, minlen: 0 }).unwrap(), 4096);
    assert_eq!(
        fs.trim(TrimRange { start: dev_bytes - 4095, len: 1 << 30, minlen: 0 }).unwrap(),
        0,
        "no whole block"
    );
    // minlen longer than any free run: nothing.
    let none =
        fs.trim(TrimRange { start: 0, len: u64::MAX, minlen: g.main_blocks() * BLOCK_SIZE as u64 }).unwrap();
    assert_eq!(none, 0);
    fs.unmount().unwrap();
    let fs = Fs::open(open_dev(&path), FsOptions { read_only: true, ..opts() }).unwrap();
    assert_eq!(
        fs.trim(TrimRange { start: 0, len: u64::MAX, minlen: 0 }).unwrap_err().to_errno(),
        libc::EROFS
    );
    fs.unmount().unwrap();
}

#[test]
fn fitrim_never_discards_what_the_checkpoint_or_a_recovery_needs() {
    let (_dir, path) = image(512 << 20);
    let fs = mount(&path);
    // Files written and checkpointed, one partly overwritten (its old blocks die), one deleted,
    // one fsynced after the last checkpoint (its journal and data must stay); a trim after
    // every step, and a crash at the end.
    let all = TrimRange { start: 0, len: u64::MAX, minlen: 0 };
    let big = bytes(7, 40 << 20);
    let keep = fs.create(ROOT, b"keep", 0o644, 0, 0).unwrap();
    fs.write_at(keep.ino, 0, &big).unwrap();
    let gone = fs.create(ROOT, b"gone", 0o644, 0, 0).unwrap();
    fs.write_at(gone.ino, 0, &bytes(9, 30 << 20)).unwrap();
    fs.trim(all).unwrap();
    fs.sync().unwrap();
    fs.trim(all).unwrap();
    fs.unlink(ROOT, b"gone").unwrap();
    fs.write_at(keep.ino, 0, &bytes(8, 20 << 20)).unwrap();
    fs.trim(all).unwrap();
    fs.sync().unwrap();
    fs.trim(all).unwrap();
    let late = fs.create(ROOT, b"late", 0o644, 0, 0).unwrap();
    let late_data = bytes(5, 6 << 20);
    fs.write_at(late.ino, 0, &late_data).unwrap();
    fs.fsync(late.ino, false).unwrap();
    fs.write_at(keep.ino, 30 << 20, &bytes(4, 4 << 20)).unwrap();
    fs.fsync(keep.ino, false).unwrap();
    fs.trim(all).unwrap();
    fs.sync().unwrap();
    fs.trim(all).unwrap();
    fs.write_at(late.ino, 0, &bytes(3, 1 << 20)).unwrap();
    fs.fsync(late.ino, false).unwrap();
    fs.trim(all).unwrap();
    let mut want_keep = big.clone();
    want_keep[..20 << 20].copy_from_slice(&bytes(8, 20 << 20));
    want_keep[30 << 20..34 << 20].copy_from_slice(&bytes(4, 4 << 20));
    let mut want_late = late_data.clone();
    want_late[..1 << 20].copy_from_slice(&bytes(3, 1 << 20));

    fs.shutdown().unwrap();
    fs.unmount().unwrap();
    assert_fsck_clean(&path, "after the trims and a crash");
    let fs = mount(&path);
    assert!(fs.recovery().transactions > 0);
    assert_eq!(read_all(&fs, "/keep"), want_keep, "the checkpointed file lost data to a trim");
    assert_eq!(read_all(&fs, "/late"), want_late, "the journaled file lost data to a trim");
    assert!(fs.resolve("/gone").is_err());
    fs.trim(all).unwrap();
    fs.unmount().unwrap();
    assert_fsck_clean(&path, "after recovery");
    let fs = mount(&path);
    assert_eq!(read_all(&fs, "/keep"), want_keep);
    assert_eq!(read_all(&fs, "/late"), want_late);
    fs.unmount().unwrap();
}
