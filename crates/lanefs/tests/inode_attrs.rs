//! Access times and inode flags through the library: when reads update atime under each policy,
//! when the update is durable (checkpoint, fsync, not fdatasync; lazytime only on fsync, sync
//! or unmount), and what the immutable and append-only flags refuse, how flags are inherited,
//! and that they survive a remount and a crash after fsync.
//!
//! A crash here is the device's contents at that moment, opened by a second file system while
//! the first is still mounted (its background checkpoints are off, so it writes nothing more
//! unless asked).

use lanefs::device::{BlockDevice, MemDevice};
use lanefs::format::Timespec;
use lanefs::FallocMode;
use lanefs::{AtimeMode, AtimePolicy, Fs, FsOptions, InodeFlags, MkfsOptions, SetAttr, ROOT};
use lanefs::{RenameFlags, XattrFlags};
use std::sync::Arc;
use std::time::Duration;

fn image() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(64 << 20));
    Fs::format(&*dev, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
    dev
}

fn opts(atime: AtimePolicy) -> FsOptions {
    FsOptions { atime, checkpoint_interval: None, ..Default::default() }
}

fn open(dev: &Arc<MemDevice>, o: FsOptions) -> Fs {
    Fs::open(dev.clone() as Arc<dyn BlockDevice>, o).unwrap()
}

/// The image as a crash now would leave it, mounted (recovery runs).
fn crashed(dev: &MemDevice) -> Fs {
    let copy = Arc::new(MemDevice::from_bytes(dev.snapshot()));
    Fs::open(copy as Arc<dyn BlockDevice>, opts(AtimePolicy::default())).unwrap()
}

/// Longer than a tick of the coarse clock that stamps times.
fn tick() {
    std::thread::sleep(Duration::from_millis(30));
}

const OLD: Timespec = Timespec { sec: 1_000_000, nsec: 0 };

fn policy(mode: AtimeMode) -> AtimePolicy {
    AtimePolicy { mode, ..Default::default() }
}

/// A file "f" with a few bytes whose atime and mtime are long ago (ctime is now).
fn old_file(fs: &Fs) -> u64 {
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    fs.write_at(f.ino, 0, b"hello").unwrap();
    fs.setattr(f.ino, &SetAttr { atime: Some(OLD), mtime: Some(OLD), ..Default::default() }).unwrap();
    f.ino
}

fn read(fs: &Fs, ino: u64) {
    let mut b = [0u8; 16];
    fs.read_at(ino, 0, &mut b).unwrap();
}

#[test]
fn relatime_updates_once_after_each_change_or_a_day() {
    let dev = image();
    let fs = open(&dev, opts(AtimePolicy::default()));
    let f = old_file(&fs);
    tick();
    read(&fs, f);
    let a1 = fs.getattr(f).unwrap();
    assert!(a1.atime > a1.ctime, "atime before the ctime: the read updates it ({a1:?})");
    tick();
    read(&fs, f);
    assert_eq!(fs.getattr(f).unwrap().atime, a1.atime, "read since the last change: no update");
    tick();
    fs.write_at(f, 5, b"!").unwrap();
    tick();
    read(&fs, f);
    let a2 = fs.getattr(f).unwrap();
    assert!(a2.atime > a2.mtime, "a write since the last read: updated");
    // A day old: updated even with no change since.
    let day_ago = Timespec { sec: a2.mtime.sec - 2 * 86_400, nsec: 0 };
    fs.setattr(f, &SetAttr { atime: Some(day_ago), mtime: Some(day_ago), ..Default::default() }).unwrap();
    let ctime = fs.getattr(f).unwrap().ctime;
    fs.setattr(f, &SetAttr { atime: Some(Timespec { sec: ctime.sec + 1, nsec: 0 }), ..Default::default() })
        .unwrap();
    tick();
    read(&fs, f);
    let a3 = fs.getattr(f).unwrap();
    assert_eq!(a3.atime.sec, ctime.sec + 1, "after the ctime and not a day old: kept");
    fs.unmount().unwrap();
}

#[test]
fn strictatime_updates_every_read_noatime_and_the_noatime_flag_never() {
    let dev = image();
    let fs = open(&dev, opts(policy(AtimeMode::Always)));
    let f = old_file(&fs);
    tick();
    read(&fs, f);
    let a1 = fs.getattr(f).unwrap().atime;
    tick();
    read(&fs, f);
    let a2 = fs.getattr(f).unwrap().atime;
    assert!(a2 > a1, "strictatime: every read ({a1:?} then {a2:?})");
    // The noatime flag wins over the policy.
    fs.set_flags(f, InodeFlags::NOATIME, false).unwrap();
    tick();
    read(&fs, f);
    assert_eq!(fs.getattr(f).unwrap().atime, a2, "NOATIME flag");
    fs.set_flags(f, InodeFlags::default(), false).unwrap();
    // Switched to noatime (a remount): never.
    fs.set_atime_policy(policy(AtimeMode::Never));
    fs.setattr(f, &SetAttr { atime: Some(OLD), ..Default::default() }).unwrap();
    tick();
    read(&fs, f);
    assert_eq!(fs.getattr(f).unwrap().atime, OLD, "noatime");
    fs.unmount().unwrap();
}

#[test]
fn listings_update_directories_unless_nodiratime() {
    let dev = image();
    let fs = open(&dev, opts(AtimePolicy::default()));
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    fs.create(d, b"x", 0o644, 0, 0).unwrap();
    fs.setattr(d, &SetAttr { atime: Some(OLD), mtime: Some(OLD), ..Default::default() }).unwrap();
    fs.set_atime_policy(AtimePolicy { dirs: false, ..Default::default() });
    tick();
    fs.readdir(d, 0, 10).unwrap();
    assert_eq!(fs.getattr(d).unwrap().atime, OLD, "nodiratime");
    fs.set_atime_policy(AtimePolicy::default());
    fs.readdir(d, 0, 10).unwrap();
    let a = fs.getattr(d).unwrap();
    assert!(a.atime > a.ctime, "a listing is an access: {a:?}");
    // A lookup in it is not.
    fs.setattr(d, &SetAttr { atime: Some(OLD), ..Default::default() }).unwrap();
    fs.set_atime_policy(policy(AtimeMode::Always));
    tick();
    fs.lookup(d, b"x").unwrap();
    assert_eq!(fs.getattr(d).unwrap().atime, OLD, "lookup");
    fs.unmount().unwrap();
}

#[test]
fn explicit_atime_survives_and_a_read_only_mount_never_updates() {
    let dev = image();
    let fs = open(&dev, opts(policy(AtimeMode::Always)));
    let f = old_file(&fs);
    fs.unmount().unwrap();
    let ro = open(&dev, FsOptions { read_only: true, ..opts(policy(AtimeMode::Always)) });
    assert_eq!(ro.getattr(f).unwrap().atime, OLD, "utimensat's atime is durable");
    tick();
    read(&ro, f);
    ro.readdir(ROOT, 0, 10).unwrap();
    assert_eq!(ro.getattr(f).unwrap().atime, OLD, "read-only: no update");
    ro.unmount().unwrap();
}

/// Not lazytime: an update is an inode change — the next checkpoint writes it, and so does an
/// fsync; an fdatasync does not (as ext4).
#[test]
fn atime_goes_out_with_checkpoints_and_fsync_but_not_fdatasync() {
    let dev = image();
    let fs = open(&dev, opts(policy(AtimeMode::Always)));
    let f = old_file(&fs);
    fs.fsync(f, false).unwrap();
    tick();
    read(&fs, f);
    let a = fs.getattr(f).unwrap().atime;
    assert!(a > OLD);
    fs.fsync(f, true).unwrap();
    assert_eq!(crashed(&dev).getattr(f).unwrap().atime, OLD, "fdatasync does not force the atime");
    fs.fsync(f, false).unwrap();
    assert_eq!(crashed(&dev).getattr(f).unwrap().atime, a, "fsync does");
    tick();
    read(&fs, f);
    let b = fs.getattr(f).unwrap().atime;
    assert!(b > a);
    checkpoint_not_sync(&fs);
    assert_eq!(crashed(&dev).getattr(f).unwrap().atime, b, "the checkpoint wrote it");
    fs.unmount().unwrap();
}

/// A checkpoint as the background timer takes it (not a `sync`): `Fs::clean` takes one when
/// something is dirty, here a new file.
fn checkpoint_not_sync(fs: &Fs) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    fs.create(ROOT, format!("scratch{n}").as_bytes(), 0o644, 0, 0).unwrap();
    let before = fs.io_stats().checkpoints_durable;
    fs.clean().unwrap();
    assert!(fs.io_stats().checkpoints_durable > before, "Fs::clean took no checkpoint");
}

#[test]
fn lazytime_keeps_atime_in_memory_until_fsync_sync_or_unmount() {
    let dev = image();
    let lazy = AtimePolicy { mode: AtimeMode::Always, lazy: true, ..Default::default() };
    let fs = open(&dev, opts(lazy));
    let f = old_file(&fs);
    fs.fsync(f, false).unwrap();
    // Clean: a checkpoint that finds the inode dirty for another change writes its atime too.
    checkpoint_not_sync(&fs);
    tick();
    read(&fs, f);
    let a = fs.getattr(f).unwrap().atime;
    assert!(a > OLD);
    checkpoint_not_sync(&fs);
    assert_eq!(crashed(&dev).getattr(f).unwrap().atime, OLD, "lazytime: a checkpoint leaves it");
    fs.fsync(f, true).unwrap();
    assert_eq!(crashed(&dev).getattr(f).unwrap().atime, OLD, "nor does fdatasync");
    fs.fsync(f, false).unwrap();
    assert_eq!(crashed(&dev).getattr(f).unwrap().atime, a, "fsync writes it");
    tick();
    read(&fs, f);
    let b = fs.getattr(f).unwrap().atime;
    fs.sync().unwrap();
    assert_eq!(crashed(&dev).getattr(f).unwrap().atime, b, "sync writes it");
    tick();
    read(&fs, f);
    let c = fs.getattr(f).unwrap().atime;
    // With the inode's next other change.
    fs.setattr(f, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    checkpoint_not_sync(&fs);
    assert_eq!(crashed(&dev).getattr(f).unwrap().atime, c, "another change carries it");
    tick();
    read(&fs, f);
    let d = fs.getattr(f).unwrap().atime;
    fs.unmount().unwrap();
    assert_eq!(open(&dev, opts(lazy)).getattr(f).unwrap().atime, d, "unmount writes it");
}

fn errno(r: lanefs::Result<impl std::fmt::Debug>) -> i32 {
    r.expect_err("refused").to_errno()
}

#[test]
fn immutable_refuses_every_change_and_only_a_privileged_caller_clears_it() {
    let dev = image();
    let fs = open(&dev, opts(AtimePolicy::default()));
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_at(f, 0, b"data").unwrap();
    fs.setxattr(f, b"user.x", b"1", XattrFlags::empty()).unwrap();
    assert_eq!(errno(fs.set_flags(f, InodeFlags::IMMUTABLE, false)), libc::EPERM, "unprivileged");
    let before = fs.getattr(f).unwrap();
    tick();
    fs.set_flags(f, InodeFlags::IMMUTABLE, true).unwrap();
    let after = fs.getattr(f).unwrap();
    assert!(after.ctime > before.ctime, "chattr changes the ctime");
    assert_eq!(fs.get_flags(f).unwrap(), InodeFlags::IMMUTABLE);
    let eperm = libc::EPERM;
    assert_eq!(errno(fs.write_at(f, 0, b"x")), eperm, "write");
    assert_eq!(errno(fs.write_at(f, 4, b"x")), eperm, "append");
    assert_eq!(errno(fs.truncate(f, 0)), eperm, "truncate");
    assert_eq!(errno(fs.fallocate(f, FallocMode::empty(), 0, 8192)), eperm, "fallocate");
    for a in [
        SetAttr { mode: Some(0o600), ..Default::default() },
        SetAttr { uid: Some(1), ..Default::default() },
        SetAttr { atime: Some(OLD), ..Default::default() },
        SetAttr { mtime: Some(OLD), ..Default::default() },
        SetAttr { size: Some(1), ..Default::default() },
    ] {
        assert_eq!(errno(fs.setattr(f, &a)), eperm, "setattr {a:?}");
    }
    assert_eq!(errno(fs.setxattr(f, b"user.y", b"2", XattrFlags::empty())), eperm, "setxattr");
    assert_eq!(errno(fs.removexattr(f, b"user.x")), eperm, "removexattr");
    assert_eq!(errno(fs.link(f, ROOT, b"l")), eperm, "link");
    assert_eq!(errno(fs.unlink(d, b"f")), eperm, "unlink");
    assert_eq!(errno(fs.rename(d, b"f", d, b"g", RenameFlags::empty())), eperm, "rename");
    let other = fs.create(d, b"o", 0o644, 0, 0).unwrap().ino;
    assert_eq!(errno(fs.rename(d, b"o", d, b"f", RenameFlags::empty())), eperm, "rename over it");
    assert_eq!(errno(fs.open_with(f, libc::O_WRONLY)), eperm, "open for writing");
    assert_eq!(errno(fs.open_with(f, libc::O_RDONLY | libc::O_TRUNC)), eperm, "open with O_TRUNC");
    fs.open_with(f, libc::O_RDONLY).unwrap();
    fs.release(f).unwrap();
    let mut b = [0u8; 4];
    assert_eq!(fs.read_at(f, 0, &mut b).unwrap(), 4, "reads go on");
    assert_eq!(
        errno(fs.set_flags(f, InodeFlags(InodeFlags::IMMUTABLE.bits() | InodeFlags::NODUMP.bits()), true)),
        eperm,
        "an immutable inode's other flags do not change"
    );
    // An immutable directory: no entry comes or goes; its files stay writable.
    fs.set_flags(f, InodeFlags::default(), true).unwrap();
    fs.set_flags(d, InodeFlags::IMMUTABLE, true).unwrap();
    assert_eq!(errno(fs.create(d, b"n", 0o644, 0, 0)), eperm, "create in it");
    assert_eq!(errno(fs.mkdir(d, b"n", 0o755, 0, 0)), eperm, "mkdir in it");
    assert_eq!(errno(fs.symlink(d, b"n", b"t", 0, 0)), eperm, "symlink in it");
    assert_eq!(errno(fs.link(other, d, b"n")), eperm, "link into it");
    assert_eq!(errno(fs.unlink(d, b"o")), eperm, "unlink from it");
    assert_eq!(errno(fs.rename(d, b"o", ROOT, b"o", RenameFlags::empty())), eperm, "rename out of it");
    assert_eq!(errno(fs.rmdir(ROOT, b"d")), eperm, "rmdir of it");
    fs.write_at(f, 0, b"DATA").unwrap();
    fs.set_flags(d, InodeFlags::default(), true).unwrap();
    fs.unlink(d, b"f").unwrap();
    fs.unmount().unwrap();
}

#[test]
fn append_only_takes_writes_at_the_end_only_and_keeps_its_names() {
    let dev = image();
    let fs = open(&dev, opts(AtimePolicy::default()));
    let f = fs.create(ROOT, b"log", 0o644, 0, 0).unwrap().ino;
    fs.write_at(f, 0, b"one\n").unwrap();
    assert_eq!(errno(fs.set_flags(f, InodeFlags::APPEND, false)), libc::EPERM, "unprivileged");
    fs.set_flags(f, InodeFlags::APPEND, true).unwrap();
    let eperm = libc::EPERM;
    assert_eq!(errno(fs.write_at(f, 0, b"xxx")), eperm, "overwrite");
    assert_eq!(errno(fs.write_at(f, 10, b"xxx")), eperm, "past the end");
    fs.write_at(f, 4, b"two\n").unwrap();
    let h = fs.open_file(f).unwrap();
    h.write_at(8, b"three\n").unwrap();
    assert_eq!(errno(h.write_at(0, b"x")), eperm, "through a handle too");
    drop(h);
    assert_eq!(errno(fs.truncate(f, 0)), eperm, "truncate");
    assert_eq!(errno(fs.truncate(f, 100)), eperm, "extend by truncate");
    assert_eq!(errno(fs.fallocate(f, FallocMode::PUNCH_HOLE | FallocMode::KEEP_SIZE, 0, 4)), eperm, "punch");
    fs.fallocate(f, FallocMode::KEEP_SIZE, 0, 1 << 16).unwrap();
    assert_eq!(errno(fs.setattr(f, &SetAttr { mode: Some(0o600), ..Default::default() })), eperm, "chmod");
    assert_eq!(errno(fs.unlink(ROOT, b"log")), eperm, "unlink");
    assert_eq!(errno(fs.rename(ROOT, b"log", ROOT, b"log2", RenameFlags::empty())), eperm, "rename");
    assert_eq!(errno(fs.link(f, ROOT, b"l")), eperm, "link");
    assert_eq!(errno(fs.open_with(f, libc::O_WRONLY)), eperm, "open without O_APPEND");
    assert_eq!(errno(fs.open_with(f, libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC)), eperm, "O_TRUNC");
    fs.open_with(f, libc::O_WRONLY | libc::O_APPEND).unwrap();
    fs.release(f).unwrap();
    let mut b = vec![0u8; 64];
    let n = fs.read_at(f, 0, &mut b).unwrap();
    assert_eq!(&b[..n], b"one\ntwo\nthree\n");
    // An append-only directory takes new entries and loses none.
    let d = fs.mkdir(ROOT, b"spool", 0o755, 0, 0).unwrap().ino;
    fs.set_flags(d, InodeFlags::APPEND, true).unwrap();
    fs.create(d, b"m1", 0o644, 0, 0).unwrap();
    assert_eq!(errno(fs.unlink(d, b"m1")), eperm, "unlink from it");
    assert_eq!(errno(fs.rename(d, b"m1", ROOT, b"m1", RenameFlags::empty())), eperm, "rename out of it");
    fs.create(ROOT, b"m2", 0o644, 0, 0).unwrap();
    fs.rename(ROOT, b"m2", d, b"m2", RenameFlags::empty()).unwrap();
    fs.create(ROOT, b"m3", 0o644, 0, 0).unwrap();
    assert_eq!(errno(fs.rename(ROOT, b"m3", d, b"m2", RenameFlags::empty())), eperm, "rename over an entry");
    fs.unmount().unwrap();
}

/// A cache that keeps times itself (the kernel's FUSE writeback cache) writes back with
/// `write_keep_times`: mtime and ctime stay what the cache last set, and, since it writes whole
/// pages, an append-only file takes a write that repeats its bytes before appending, never one
/// that changes them.
#[test]
fn cached_writes_keep_times_and_may_repeat_an_append_only_files_bytes() {
    let dev = image();
    let fs = open(&dev, opts(AtimePolicy::default()));
    let f = old_file(&fs);
    let at = |fs: &Fs| {
        let a = fs.getattr(f).unwrap();
        (a.mtime, a.ctime)
    };
    fs.setattr(f, &SetAttr { ctime: Some(OLD), ..Default::default() }).unwrap();
    assert_eq!(at(&fs), (OLD, OLD));
    tick();
    assert_eq!(fs.write_keep_times(f, 0, b"HELLO, world", None).unwrap(), 12);
    assert_eq!(at(&fs), (OLD, OLD), "a cached write leaves the times");
    fs.write_at(f, 0, b"h").unwrap();
    assert!(at(&fs).0 > OLD && at(&fs).1 > OLD, "write_at stamps both");

    fs.set_flags(f, InodeFlags::APPEND, true).unwrap();
    assert_eq!(errno(fs.write_keep_times(f, 0, b"hELLO, WORLD!", None)), libc::EPERM, "changes a byte");
    assert_eq!(errno(fs.write_keep_times(f, 20, b"!", None)), libc::EPERM, "past the end");
    assert_eq!(fs.write_keep_times(f, 0, b"hELLO, world!", None).unwrap(), 13, "repeats, then appends");
    assert_eq!(fs.write_keep_times(f, 4, b"O, world!?", None).unwrap(), 10);
    let mut b = [0u8; 32];
    let n = fs.read_at(f, 0, &mut b).unwrap();
    assert_eq!(&b[..n], b"hELLO, world!?");
    fs.unmount().unwrap();
}

#[test]
fn flags_are_inherited_as_ext4_does_and_unsupported_ones_refused() {
    let dev = image();
    let fs = open(&dev, opts(AtimePolicy::default()));
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let inherit = InodeFlags(
        InodeFlags::NOATIME.bits()
            | InodeFlags::NODUMP.bits()
            | InodeFlags::DAX.bits()
            | InodeFlags::DIRSYNC.bits()
            | InodeFlags::SYNC.bits(),
    );
    fs.set_flags(d, inherit, false).unwrap();
    let sub = fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino;
    let file = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    let link = fs.symlink(d, b"s", b"f", 0, 0).unwrap().ino;
    assert_eq!(fs.get_flags(sub).unwrap(), inherit, "a directory takes them all");
    assert_eq!(
        fs.get_flags(file).unwrap().bits(),
        inherit.bits() & !InodeFlags::DIRSYNC.bits(),
        "a file: not DIRSYNC"
    );
    assert_eq!(fs.get_flags(link).unwrap().bits(), InodeFlags::NOATIME.bits() | InodeFlags::NODUMP.bits());
    fs.set_flags(d, InodeFlags::IMMUTABLE, true).unwrap();
    fs.set_flags(d, InodeFlags::default(), true).unwrap();
    fs.set_flags(d, InodeFlags::APPEND, true).unwrap();
    let f2 = fs.create(d, b"g", 0o644, 0, 0).unwrap().ino;
    assert_eq!(fs.get_flags(f2).unwrap(), InodeFlags::default(), "append is never inherited");
    // Compression ('c') is no lanefs flag.
    assert_eq!(errno(fs.set_flags(f2, InodeFlags(0x4), true)), libc::EOPNOTSUPP);
    // A rename keeps an inode's flags (mv), wherever it goes.
    fs.set_flags(d, InodeFlags::default(), true).unwrap();
    fs.rename(d, b"f", ROOT, b"f", RenameFlags::empty()).unwrap();
    assert!(fs.get_flags(file).unwrap().contains(InodeFlags::DAX));
    fs.unmount().unwrap();
}

#[test]
fn flags_survive_remount_and_a_crash_after_fsync() {
    let dev = image();
    let fs = open(&dev, opts(AtimePolicy::default()));
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let g = fs.create(ROOT, b"g", 0o644, 0, 0).unwrap().ino;
    fs.fsync(ROOT, false).unwrap();
    fs.set_flags(f, InodeFlags(InodeFlags::IMMUTABLE.bits() | InodeFlags::NODUMP.bits()), true).unwrap();
    fs.fsync(f, false).unwrap();
    fs.set_flags(g, InodeFlags::APPEND, true).unwrap();
    fs.fsync(g, false).unwrap();
    let after_crash = crashed(&dev);
    assert_eq!(
        after_crash.get_flags(f).unwrap().bits(),
        InodeFlags::IMMUTABLE.bits() | InodeFlags::NODUMP.bits()
    );
    assert_eq!(after_crash.get_flags(g).unwrap(), InodeFlags::APPEND);
    assert_eq!(
        after_crash.unlink(ROOT, b"f").unwrap_err().to_errno(),
        libc::EPERM,
        "enforced after recovery"
    );
    drop(after_crash);
    fs.set_flags(f, InodeFlags::default(), true).unwrap();
    fs.unmount().unwrap();
    let fs = open(&dev, opts(AtimePolicy::default()));
    assert_eq!(fs.get_flags(f).unwrap(), InodeFlags::default());
    assert_eq!(fs.get_flags(g).unwrap(), InodeFlags::APPEND);
    fs.set_flags(g, InodeFlags::default(), true).unwrap();
    fs.unmount().unwrap();
}
