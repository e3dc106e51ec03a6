//! rmdir (and rename over an empty directory) against creates in the directory being removed.
//!
//! rmdir marks the directory dead, then checks it is empty; a create checks the mark under its
//! name's shard lock, then counts its name. Without taking each shard's lock in the emptiness
//! check, a create that read the mark just before rmdir set it could count its name just after
//! rmdir read the count, leaving a name in a removed directory. Here threads create and unlink
//! names in a directory while another removes it (or renames an empty directory over it): a
//! create that returns success after the removal returned is a name the removal should have
//! seen, and the file system must check clean at the end. The unlink that follows each create
//! must succeed too, even when the directory it emptied is removed, and its inode reaped by a
//! checkpoint, before the unlink's DIRSYNC check runs (`Fs::dirsync`; it failed with ENOENT
//! under CPU load until 75b358b).

use lanefs::device::{BlockDevice, MemDevice};
use lanefs::{fsck, FsckOptions};
use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

const ROUNDS: usize = 1000;
const CREATORS: usize = 3;

/// Creates and unlinks names in `x` until `x` is gone; counts creates that succeeded although
/// the removal had already returned.
fn churn(fs: &Fs, x: u64, t: usize, removed: &AtomicBool, late: &AtomicUsize) {
    // Bounded: the remover's loop ends with the directory removed, and then every create here
    // fails; the bound only catches a remover that never succeeds.
    for i in 0..1_000_000 {
        let name = format!("f{t}-{i}");
        match fs.create(x, name.as_bytes(), 0o644, 0, 0) {
            Ok(_) => {
                if removed.load(Ordering::SeqCst) {
                    late.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                fs.unlink(x, name.as_bytes()).unwrap();
            }
            Err(e) if e.to_errno() == libc::ENOENT => return,
            Err(e) => panic!("create {name}: {e}"),
        }
    }
    panic!("the directory was never removed");
}

#[test]
fn a_directory_removed_under_concurrent_creates_keeps_no_name() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    Fs::format(&*dev, &MkfsOptions::default()).unwrap();
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, FsOptions::default()).unwrap();
    let late = AtomicUsize::new(0);
    for round in 0..ROUNDS {
        let x = fs.mkdir(ROOT, b"x", 0o755, 0, 0).unwrap().ino;
        // Every other round the directory goes by a rename of an empty one over it.
        let by_rename = round % 2 == 1;
        if by_rename {
            fs.mkdir(ROOT, b"y", 0o755, 0, 0).unwrap();
        }
        let removed = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..CREATORS {
                let (fs, removed, late) = (&fs, &removed, &late);
                s.spawn(move || churn(fs, x, t, removed, late));
            }
            // Bounded by the creators: each unlinks what it created, so the directory is empty
            // again and again.
            loop {
                let r = if by_rename {
                    fs.rename(ROOT, b"y", ROOT, b"x", lanefs::RenameFlags::empty())
                } else {
                    fs.rmdir(ROOT, b"x")
                };
                match r {
                    Ok(()) => break,
                    Err(e) if e.to_errno() == libc::ENOTEMPTY => std::thread::yield_now(),
                    Err(e) => panic!("round {round}: removing x: {e}"),
                }
            }
            removed.store(true, Ordering::SeqCst);
        });
        if by_rename {
            fs.rmdir(ROOT, b"x").unwrap();
        }
        assert_eq!(
            late.load(Ordering::Relaxed),
            0,
            "round {round}: a create succeeded in a removed directory"
        );
    }
    fs.unmount().unwrap();
    let r = fsck(&*dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "fsck: {:#?}", r.problems);
}
