//! Inode identity for file handles, and rename with RENAME_WHITEOUT, through the library.
//!
//! - Generations: every inode has one, it survives unmount and a crash, and an inode number
//!   handed out again comes with a different generation (what turns a file handle to a removed
//!   file into ESTALE instead of the new file). `Fs::lookup_ino` finds an inode by number, as
//!   the kernel's LOOKUP of "." does, and fails once it is removed.
//! - RENAME_WHITEOUT: the source name becomes a character device 0:0 owned by the caller, with
//!   the errors ext4 gives, ENOSPC (and nothing renamed) when there is no room for the whiteout,
//!   and at every crash state the harness builds, the rename and its whiteout are there together
//!   or not at all.

use lanefs::device::{BlockDevice, MemDevice};
use lanefs::FileKind;
use lanefs::RenameFlags;
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use lanefs_crashtest::check_script;
use lanefs_crashtest::workload::Setup;
use std::sync::Arc;

fn image(size: u64) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(size));
    Fs::format(&*dev, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
    dev
}

fn open(dev: &Arc<MemDevice>) -> Fs {
    Fs::open(dev.clone() as Arc<dyn BlockDevice>, FsOptions::default()).unwrap()
}

/// The image as a crash now would leave it (a memory device has no volatile cache).
fn crash_image(dev: &MemDevice) -> Arc<MemDevice> {
    Arc::new(MemDevice::from_bytes(dev.snapshot()))
}

fn fsck_clean(dev: &MemDevice) {
    let r = fsck(dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

fn errno(r: lanefs::Result<impl std::fmt::Debug>) -> i32 {
    r.expect_err("the call must fail").to_errno()
}

#[test]
fn generations_persist_and_change_when_an_inode_number_is_reused() {
    let dev = image(64 << 20);
    let fs = open(&dev);
    assert_eq!(fs.getattr(ROOT).unwrap().generation, 0, "the root keeps generation 0");
    let victim = fs.create(ROOT, b"victim", 0o644, 0, 0).unwrap();
    let other = fs.create(ROOT, b"other", 0o644, 0, 0).unwrap();
    assert_ne!(victim.generation, 0);
    assert_ne!(victim.generation, other.generation);
    assert_eq!(fs.lookup_ino(victim.ino).unwrap().generation, victim.generation);
    fs.unmount().unwrap();

    let fs = open(&dev);
    let again = fs.lookup_ino(victim.ino).unwrap();
    assert_eq!(
        (again.ino, again.generation),
        (victim.ino, victim.generation),
        "generation lost by a remount"
    );
    fs.unlink(ROOT, b"victim").unwrap();
    assert_eq!(errno(fs.lookup_ino(victim.ino)), libc::ENOENT, "a removed inode is still found by number");
    // Create and remove files until the number comes back (ids are freed by checkpoints and
    // handed out again once the allocator wraps around the NAT).
    let max_nid = 64 << 20 >> 12;
    let mut reused = None;
    for i in 0..3 * max_nid {
        let name = format!("n{i}");
        let a = fs.create(ROOT, name.as_bytes(), 0o644, 0, 0).unwrap();
        if a.ino == victim.ino {
            reused = Some(a);
            break;
        }
        fs.unlink(ROOT, name.as_bytes()).unwrap();
    }
    let reused = reused.expect("the victim's inode number was never handed out again");
    assert_ne!(reused.generation, victim.generation, "a reused inode number kept its generation");
    assert_eq!(fs.lookup_ino(victim.ino).unwrap().generation, reused.generation);
    fs.unmount().unwrap();
    fsck_clean(&dev);
}

#[test]
fn recovery_keeps_replayed_generations_and_starts_past_them() {
    let dev = image(64 << 20);
    let fs = open(&dev);
    fs.create(ROOT, b"old", 0o644, 0, 0).unwrap();
    // The checkpoint's counter covers this one; the two below only the journal knows of.
    fs.sync().unwrap();
    // Files until one has the last generation of its CPU slot's batch, so that the whiteout
    // below is the first of a new one: only the whiteout then tells recovery where to start.
    let batch = lanefs::testing::generation::BATCH as u32;
    let mut kept = fs.create(ROOT, b"kept", 0o644, 0, 0).unwrap();
    for i in 0..2 * batch {
        if kept.generation % batch == batch - 1 {
            break;
        }
        fs.rename(ROOT, b"kept", ROOT, format!("t{i}").as_bytes(), RenameFlags::empty()).unwrap();
        kept = fs.create(ROOT, b"kept", 0o644, 0, 0).unwrap();
    }
    fs.rename(ROOT, b"old", ROOT, b"new", RenameFlags::WHITEOUT).unwrap();
    let w = fs.lookup(ROOT, b"old").unwrap();
    fs.fsync(ROOT, false).unwrap();
    let crashed = crash_image(&dev);
    drop(fs);

    let fs = open(&crashed);
    // The checkpoint recovery ends with records a counter past every replayed generation.
    fsck_clean(&crash_image(&crashed));
    assert_eq!(fs.lookup(ROOT, b"kept").unwrap().generation, kept.generation, "replay changed a generation");
    assert_eq!(fs.lookup(ROOT, b"old").unwrap().generation, w.generation, "replay changed a whiteout's");
    let next = fs.create(ROOT, b"next", 0o644, 0, 0).unwrap();
    assert!(next.generation > kept.generation.max(w.generation), "{} handed out again", next.generation);
    fs.unmount().unwrap();
    // fsck checks the counter against every inode's generation.
    fsck_clean(&crashed);
}

#[test]
fn lookup_by_number_finds_any_type_until_it_is_removed() {
    let dev = image(64 << 20);
    let fs = open(&dev);
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap();
    let f = fs.create(d.ino, b"f", 0o644, 0, 0).unwrap();
    let s = fs.symlink(d.ino, b"s", b"f", 0, 0).unwrap();
    for a in [&d, &f, &s] {
        let got = fs.lookup_ino(a.ino).unwrap();
        assert_eq!((got.ino, got.kind, got.generation), (a.ino, a.kind, a.generation));
    }
    // ".." of a directory is its parent (the kernel connects a directory handle this way).
    assert_eq!(fs.lookup(d.ino, b"..").unwrap().ino, ROOT);
    assert_eq!(fs.lookup(ROOT, b"..").unwrap().ino, ROOT);
    // Open but removed: gone for a handle (the kernel holds an open file's inode itself).
    fs.open_ino(f.ino).unwrap();
    fs.unlink(d.ino, b"f").unwrap();
    assert_eq!(errno(fs.lookup_ino(f.ino)), libc::ENOENT);
    fs.release(f.ino).unwrap();
    fs.unlink(d.ino, b"s").unwrap();
    fs.rmdir(ROOT, b"d").unwrap();
    assert_eq!(errno(fs.lookup_ino(d.ino)), libc::ENOENT);
    assert_eq!(errno(fs.lookup_ino(0)), libc::ENOENT);
    assert_eq!(errno(fs.lookup_ino(u32::MAX as u64 - 1)), libc::ENOENT);
    fs.unmount().unwrap();
}

#[test]
fn rename_whiteout_leaves_a_character_device_0_0_owned_by_the_caller() {
    let dev = image(64 << 20);
    let fs = open(&dev);
    let a = fs.mkdir(ROOT, b"a", 0o755, 0, 0).unwrap();
    let b = fs.mkdir(ROOT, b"b", 0o755, 0, 0).unwrap();
    let f = fs.create(a.ino, b"f", 0o644, 0, 0).unwrap();
    fs.write_at(f.ino, 0, b"contents").unwrap();
    let old = fs.create(b.ino, b"old", 0o644, 0, 0).unwrap();

    // Across directories, over an existing file.
    fs.rename_as(a.ino, b"f", b.ino, b"old", RenameFlags::WHITEOUT, 1000, 1001).unwrap();
    let w = fs.lookup(a.ino, b"f").unwrap();
    assert_eq!(w.kind, FileKind::CharDevice);
    assert_eq!((w.rdev, w.mode & 0o7777, w.uid, w.gid, w.nlink), (0, 0, 1000, 1001, 1));
    assert!(w.ino != f.ino && w.ino != old.ino && w.generation != 0);
    assert_eq!(fs.lookup(b.ino, b"old").unwrap().ino, f.ino);
    assert_eq!(errno(fs.lookup_ino(old.ino)), libc::ENOENT, "the replaced file is gone");
    let mut buf = [0u8; 8];
    assert_eq!(fs.read_at(f.ino, 0, &mut buf).unwrap(), 8);
    assert_eq!(&buf, b"contents");

    // A directory, in one directory: its whiteout takes its place, link counts follow.
    let sub = fs.mkdir(a.ino, b"sub", 0o755, 0, 0).unwrap();
    fs.rename_as(a.ino, b"sub", b.ino, b"sub2", RenameFlags::WHITEOUT, 0, 0).unwrap();
    assert_eq!(fs.lookup(a.ino, b"sub").unwrap().kind, FileKind::CharDevice);
    assert_eq!(fs.lookup(b.ino, b"sub2").unwrap().ino, sub.ino);
    assert_eq!(fs.lookup(sub.ino, b"..").unwrap().ino, b.ino);
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(fs.getattr(b.ino).unwrap().nlink, 3);

    // The errors of ext4, with nothing changed.
    let g = fs.create(a.ino, b"g", 0o644, 0, 0).unwrap();
    assert_eq!(
        errno(fs.rename(a.ino, b"g", b.ino, b"old", RenameFlags::WHITEOUT | RenameFlags::EXCHANGE)),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs.rename(a.ino, b"g", b.ino, b"old", RenameFlags::WHITEOUT | RenameFlags::NOREPLACE)),
        libc::EEXIST
    );
    assert_eq!(errno(fs.rename(a.ino, b"none", b.ino, b"x", RenameFlags::WHITEOUT)), libc::ENOENT);
    assert_eq!(errno(fs.rename(a.ino, b"g", b.ino, b"sub2", RenameFlags::WHITEOUT)), libc::EISDIR);
    assert_eq!(fs.lookup(a.ino, b"g").unwrap().ino, g.ino);
    // With RENAME_NOREPLACE onto a free name it is a whiteout rename.
    fs.rename(a.ino, b"g", b.ino, b"g2", RenameFlags::WHITEOUT | RenameFlags::NOREPLACE).unwrap();
    assert_eq!(fs.lookup(a.ino, b"g").unwrap().kind, FileKind::CharDevice);
    let whiteouts = |fs: &Fs| {
        let mut v: Vec<(Vec<u8>, FileKind)> =
            fs.readdir(a.ino, 0, 100).unwrap().into_iter().map(|e| (e.name, e.kind)).collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let before = whiteouts(&fs);
    fs.unmount().unwrap();
    fsck_clean(&dev);
    let fs = open(&dev);
    assert_eq!(whiteouts(&fs), before);
    let w2 = fs.lookup(a.ino, b"f").unwrap();
    assert_eq!((w2.ino, w2.generation, w2.uid, w2.rdev), (w.ino, w.generation, 1000, 0));
    // A whiteout is an ordinary inode: it goes with unlink.
    fs.unlink(a.ino, b"f").unwrap();
    fs.unmount().unwrap();
    fsck_clean(&dev);
}

#[test]
fn rename_whiteout_without_room_for_the_whiteout_is_enospc_and_renames_nothing() {
    let dev = image(64 << 20);
    let fs = open(&dev);
    fs.create(ROOT, b"src", 0o644, 0, 0).unwrap();
    // Fill the file system with inodes (fstests generic/626 fills it, then creates files
    // until that fails).
    let mut n = 0u32;
    // Bounded by the inode numbers of a 64 MiB image.
    loop {
        match fs.create(ROOT, format!("fill{n}").as_bytes(), 0o644, 0, 0) {
            Ok(_) => n += 1,
            Err(e) => {
                assert_eq!(e.to_errno(), libc::ENOSPC, "{e}");
                break;
            }
        }
        assert!(n < 1 << 20, "creates never ran out of room");
    }
    let src = fs.lookup(ROOT, b"src").unwrap();
    assert_eq!(errno(fs.rename(ROOT, b"src", ROOT, b"dst", RenameFlags::WHITEOUT)), libc::ENOSPC);
    assert_eq!(fs.lookup(ROOT, b"src").unwrap().ino, src.ino);
    assert_eq!(errno(fs.lookup(ROOT, b"dst")), libc::ENOENT);
    // A rename that needs no new inode still works (and frees nothing it should keep).
    fs.rename(ROOT, b"src", ROOT, b"dst", RenameFlags::empty()).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&dev);
    let fs = open(&dev);
    assert_eq!(fs.lookup(ROOT, b"dst").unwrap().ino, src.ino);
    assert_eq!(errno(fs.lookup(ROOT, b"src")), libc::ENOENT);
    assert!(fs.lookup(ROOT, format!("fill{}", n - 1).as_bytes()).is_ok());
    fs.unmount().unwrap();
}

/// Every crash state of these workloads (cut at every device write and flush, with every
/// subset of the writes in flight) is checked by the crash harness's oracle: a whiteout rename
/// is all or nothing (the source's whiteout and the destination's new inode together), fsynced
/// names hold, fsck is clean.
#[test]
fn rename_whiteout_is_all_or_nothing_at_every_crash_state() {
    for script in [
        "whiteout /A/foo /A/moved; fsync /A",
        "whiteout /A/foo /B/bar; fsync /B",
        "whiteout /foo /B/new; fsync /B/new",
        "whiteout /A/C /B/C; fsync /B",
        "whiteout /A/bar /foo; sync",
        "whiteout /A/foo /A/x; unlink /A/foo; fsync /A",
        "whiteout /A/foo /A/x; whiteout /A/x /A/foo; fsync /A/foo",
    ] {
        let v = check_script(Setup::Ace, script, true);
        assert!(v.is_empty(), "{script}:\n{}", v.join("\n"));
    }
}
