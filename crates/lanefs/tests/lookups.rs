//! A kernel's references (`Fs::remember` / `Fs::forget`, FUSE's lookup counts): an inode a
//! kernel holds outlives its last name as an open one does, across checkpoints, until its last
//! reference goes; then it is deleted. Raced against unlinks and releases, every inode ends
//! either named or deleted, never on the orphan list for good (`mem::ops::life`).

use lanefs::device::{BlockDevice, MemDevice};
use lanefs::{fsck, inspect, Fs, FsOptions, FsckOptions, MkfsOptions, SetAttr, Timespec, ROOT};
use std::sync::{Arc, Barrier};

fn opts() -> FsOptions {
    FsOptions { checkpoint_interval: None, ..Default::default() }
}

fn fresh() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(128 << 20));
    Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    dev
}

fn mount(dev: &Arc<MemDevice>) -> Fs {
    Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts()).unwrap()
}

fn fsck_clean(dev: &MemDevice, what: &str) {
    let r = fsck(dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "{what}: fsck: {:#?}", r.problems);
}

fn errno<T: std::fmt::Debug>(r: lanefs::Result<T>) -> i32 {
    r.expect_err("an error").to_errno()
}

#[test]
fn a_remembered_inode_outlives_its_name_across_checkpoints_until_forgotten() {
    let dev = fresh();
    let fs = mount(&dev);
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    fs.write_at(f.ino, 0, b"still here").unwrap();
    assert_eq!(fs.remember(f.ino).unwrap().ino, f.ino);
    assert_eq!(fs.remember(f.ino).unwrap().nlink, 1);
    fs.unlink(ROOT, b"f").unwrap();
    fs.sync().unwrap();
    fs.sync().unwrap();
    // What a kernel sends for an inode it holds: a stat, the times its writeback cache kept.
    let a = fs.getattr(f.ino).unwrap();
    assert_eq!((a.nlink, a.size), (0, 10));
    let t = Timespec { sec: 1_700_000_000, nsec: 5 };
    let set = SetAttr { mtime: Some(t), ctime: Some(t), ..Default::default() };
    assert_eq!(fs.setattr(f.ino, &set).unwrap().mtime, t);
    let mut buf = [0u8; 10];
    assert_eq!(fs.read_at(f.ino, 0, &mut buf).unwrap(), 10);
    assert_eq!(&buf, b"still here");
    fs.forget(f.ino, 1).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 0, "one reference left");
    fs.forget(f.ino, 1).unwrap();
    fs.sync().unwrap();
    assert_eq!(errno(fs.getattr(f.ino)), libc::ENOENT, "deleted with its last reference");
    assert_eq!(errno(fs.forget(f.ino, 1)), libc::ENOENT);
    fs.unmount().unwrap();
    assert_eq!(inspect(&*dev).unwrap().orphans, 0);
    fsck_clean(&dev, "after the last reference");
}

#[test]
fn a_dead_inode_cannot_be_remembered_and_too_many_forgets_are_refused() {
    let dev = fresh();
    let fs = mount(&dev);
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    fs.unlink(ROOT, b"f").unwrap();
    // Dead (no name, nothing held) but not yet deleted by a checkpoint: a kernel must not get it.
    assert_eq!(errno(fs.remember(f.ino)), libc::ENOENT);
    fs.sync().unwrap();
    assert_eq!(errno(fs.remember(f.ino)), libc::ENOENT);
    let g = fs.create(ROOT, b"g", 0o644, 0, 0).unwrap();
    fs.remember(g.ino).unwrap();
    assert_eq!(errno(fs.forget(g.ino, 2)), libc::EINVAL, "one taken, two given back");
    // All given back: the unlink now deletes it.
    fs.unlink(ROOT, b"g").unwrap();
    fs.sync().unwrap();
    assert_eq!(errno(fs.getattr(g.ino)), libc::ENOENT);
    fs.unmount().unwrap();
    fsck_clean(&dev, "refused references");
}

#[test]
fn a_held_orphan_at_a_crash_is_deleted_by_recovery_and_forget_all_frees_them_at_unmount() {
    let dev = fresh();
    let fs = mount(&dev);
    let held = fs.create(ROOT, b"held", 0o644, 0, 0).unwrap();
    fs.write_at(held.ino, 0, &[7u8; 8192]).unwrap();
    fs.remember(held.ino).unwrap();
    fs.unlink(ROOT, b"held").unwrap();
    fs.sync().unwrap();
    // The image as the last checkpoint left it: what a crash of the mount would leave.
    let crashed = Arc::new(MemDevice::new(128 << 20));
    let mut block = vec![0u8; 4096];
    for b in 0..(128u64 << 20) / 4096 {
        dev.read_block(b, &mut block).unwrap();
        crashed.write_block(b, &block).unwrap();
    }
    assert_eq!(inspect(&*crashed).unwrap().orphans, 1, "the checkpoint lists it");
    let again = mount(&crashed);
    assert_eq!(again.recovery().orphans_removed, 1, "{:?}", again.recovery());
    assert_eq!(errno(again.getattr(held.ino)), libc::ENOENT);
    again.unmount().unwrap();
    fsck_clean(&crashed, "recovered orphan");
    // The session's end gives every reference back: the final checkpoint deletes it.
    let named = fs.create(ROOT, b"named", 0o644, 0, 0).unwrap();
    fs.remember(named.ino).unwrap();
    assert_eq!(fs.forget_all(), 2, "the orphan and the named inode were held");
    assert_eq!(fs.forget_all(), 0);
    fs.unmount().unwrap();
    assert_eq!(inspect(&*dev).unwrap().orphans, 0);
    let fs = mount(&dev);
    assert_eq!(fs.recovery().orphans_removed, 0);
    assert_eq!(fs.lookup(ROOT, b"named").unwrap().ino, named.ino);
    fs.unmount().unwrap();
    fsck_clean(&dev, "after forget_all");
}

/// Many threads race the three ways an inode's life can end (its last name, its last open
/// handle, its last kernel reference) while checkpoints run; afterwards every inode is deleted
/// and none is left on the orphan list.
#[test]
fn unlinks_releases_and_forgets_racing_leave_no_orphan_and_no_inode() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 300;
    let dev = fresh();
    let fs = Arc::new(mount(&dev));
    let inos: Vec<Vec<u64>> = (0..ROUNDS)
        .map(|r| {
            (0..THREADS)
                .map(|t| {
                    let name = format!("f{r}-{t}");
                    let a = fs.create(ROOT, name.as_bytes(), 0o644, 0, 0).unwrap();
                    a.ino
                })
                .collect()
        })
        .collect();
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (fs, barrier, inos) = (fs.clone(), barrier.clone(), inos.clone());
            std::thread::spawn(move || {
                for (r, round) in inos.iter().enumerate() {
                    // Each round every thread takes a hold on every file of the round, then
                    // all let go at once: thread t removes file t's name, gives back its
                    // reference to each file and closes its handle of each, in an order
                    // that differs by thread and round.
                    let handles: Vec<_> = round.iter().map(|&i| fs.open_file(i).unwrap()).collect();
                    for &i in round {
                        fs.remember(i).unwrap();
                    }
                    barrier.wait();
                    let name = format!("f{r}-{t}");
                    let order = (r + t) % 3;
                    if order == 0 {
                        fs.unlink(ROOT, name.as_bytes()).unwrap();
                    }
                    for &i in round {
                        fs.forget(i, 1).unwrap();
                    }
                    if order == 1 {
                        fs.unlink(ROOT, name.as_bytes()).unwrap();
                    }
                    drop(handles);
                    if order == 2 {
                        fs.unlink(ROOT, name.as_bytes()).unwrap();
                    }
                    barrier.wait();
                }
            })
        })
        .collect();
    let cp = {
        let fs = fs.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        (
            std::thread::spawn(move || {
                let mut n = 0u32;
                while !s.load(std::sync::atomic::Ordering::Acquire) {
                    fs.sync().unwrap();
                    n += 1;
                }
                n
            }),
            stop,
        )
    };
    for _ in 0..ROUNDS {
        barrier.wait();
        barrier.wait();
    }
    for w in workers {
        w.join().unwrap();
    }
    cp.1.store(true, std::sync::atomic::Ordering::Release);
    assert!(cp.0.join().unwrap() > 0, "checkpoints ran during the races");
    fs.sync().unwrap();
    for &i in inos.iter().flatten() {
        assert_eq!(errno(fs.getattr(i)), libc::ENOENT, "inode {i} outlived its name and its holds");
    }
    assert_eq!(fs.forget_all(), 0, "no reference left");
    Arc::try_unwrap(fs).ok().expect("the last handle").unmount().unwrap();
    let info = inspect(&*dev).unwrap();
    assert_eq!(info.orphans, 0, "{info:?}");
    fsck_clean(&dev, "after the races");
}

/// The orphan list is bounded (every checkpoint records it): a kernel's references alone keep
/// unlinked inodes only while it is at most half full, so that a flood of them can never make a
/// checkpoint fail; open files unlinked still get the other half.
#[test]
fn kernel_references_keep_unlinked_inodes_only_while_the_orphan_list_has_room() {
    const HALF: usize = lanefs::format::layout::ORPHAN_CAPACITY as usize / 2;
    let dev = Arc::new(MemDevice::new(512 << 20));
    Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    let fs = mount(&dev);
    let inos: Vec<u64> = (0..HALF + 10)
        .map(|i| {
            let a = fs.create(ROOT, format!("k{i}").as_bytes(), 0o644, 0, 0).unwrap();
            fs.remember(a.ino).unwrap();
            a.ino
        })
        .collect();
    let open: Vec<_> = (0..10)
        .map(|i| {
            let a = fs.create(ROOT, format!("o{i}").as_bytes(), 0o644, 0, 0).unwrap();
            fs.open_file(a.ino).unwrap()
        })
        .collect();
    for i in 0..HALF + 10 {
        fs.unlink(ROOT, format!("k{i}").as_bytes()).unwrap();
    }
    for i in 0..10 {
        fs.unlink(ROOT, format!("o{i}").as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    assert_eq!(inspect(&*dev).unwrap().orphans, HALF + 10, "the checkpoint lists the kept and the open");
    for (i, &ino) in inos.iter().enumerate() {
        let r = fs.getattr(ino);
        if i < HALF {
            assert_eq!(r.unwrap().nlink, 0, "inode {i} of the first half is kept");
        } else {
            assert_eq!(
                errno(r),
                libc::ENOENT,
                "inode {i}: past half the list, a kernel's hold does not keep it"
            );
            assert_eq!(errno(fs.remember(ino)), libc::ENOENT);
        }
    }
    for h in &open {
        assert_eq!(fs.getattr(h.ino()).unwrap().nlink, 0, "an open file is kept whatever the list holds");
    }
    // What the kernel gives back for the inodes that were not kept finds them gone.
    for &ino in &inos[HALF..] {
        assert_eq!(errno(fs.forget(ino, 1)), libc::ENOENT);
    }
    for &ino in &inos[..HALF] {
        fs.forget(ino, 1).unwrap();
    }
    drop(open);
    fs.sync().unwrap();
    fs.unmount().unwrap();
    assert_eq!(inspect(&*dev).unwrap().orphans, 0);
    fsck_clean(&dev, "after a flood of held orphans");
}

/// Files unlinked while open are orphans too, and the list is bounded: near full, removing the
/// last name of an open file (by unlink or by a rename over it) or making an O_TMPFILE file is
/// refused with ENOSPC, as F2FS refuses it, instead of a checkpoint that cannot record the list
/// stopping the file system. Closing some makes room again.
#[test]
fn unlinking_open_files_past_the_orphan_lists_room_is_refused_with_enospc() {
    const CAPACITY: usize = lanefs::format::layout::ORPHAN_CAPACITY as usize;
    let dev = Arc::new(MemDevice::new(512 << 20));
    Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    let fs = mount(&dev);
    let mut open = Vec::new();
    let mut refused = None;
    for i in 0..CAPACITY {
        let name = format!("o{i}");
        let a = fs.create(ROOT, name.as_bytes(), 0o644, 0, 0).unwrap();
        open.push(fs.open_file(a.ino).unwrap());
        match fs.unlink(ROOT, name.as_bytes()) {
            Ok(()) => {}
            Err(e) => {
                assert_eq!(e.to_errno(), libc::ENOSPC, "{e}");
                refused = Some(i);
                break;
            }
        }
    }
    let first_refused = refused.expect("the list filled up");
    assert!((CAPACITY / 2..CAPACITY).contains(&first_refused), "refused at {first_refused}");
    let last = format!("o{first_refused}");
    assert!(fs.lookup(ROOT, last.as_bytes()).is_ok(), "a refused unlink leaves the name");
    // A rename over an open file would orphan it too; one over a closed file would not.
    let other = fs.create(ROOT, b"other", 0o644, 0, 0).unwrap();
    assert_eq!(errno(fs.rename(ROOT, b"other", ROOT, last.as_bytes(), Default::default())), libc::ENOSPC);
    let closed = fs.create(ROOT, b"closed", 0o644, 0, 0).unwrap();
    fs.rename(ROOT, b"other", ROOT, b"closed", Default::default()).unwrap();
    assert_eq!(fs.lookup(ROOT, b"closed").unwrap().ino, other.ino);
    let new = lanefs::New { mode: 0o600, rdev: 0, uid: 0, gid: 0, umask: 0 };
    assert_eq!(errno(fs.tmpfile(ROOT, &new).map(|_| ())), libc::ENOSPC);
    // The checkpoint records the list: it fits.
    fs.sync().unwrap();
    assert_eq!(errno(fs.getattr(closed.ino)), libc::ENOENT, "the file renamed over was closed: deleted");
    assert_eq!(inspect(&*dev).unwrap().orphans, first_refused);
    // Closing frees the orphans, and the unlink goes through.
    open.truncate(open.len() - 300);
    fs.unlink(ROOT, last.as_bytes()).unwrap();
    drop(open);
    fs.sync().unwrap();
    fs.unmount().unwrap();
    assert_eq!(inspect(&*dev).unwrap().orphans, 0);
    fsck_clean(&dev, "after the orphan list filled");
}
