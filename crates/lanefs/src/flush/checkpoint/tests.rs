//! The captures after the exclusive phase: operations, fsyncs and reads that touch an inode
//! the phase left owed capture it first, so the checkpoint holds every inode as the phase
//! left it, whoever captured it and whenever.

use crate::device::{BlockDevice, MemDevice};
use crate::fs::{Fs, SetAttr};
use crate::{FsOptions, MkfsOptions, RenameFlags, ROOT};
use std::sync::Arc;

fn content(f: &Fs, ino: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 64];
    let n = f.read_at(ino, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Files and a directory changed before a checkpoint, then touched by every kind of change
/// after its exclusive phase and before its writer captured them: a crash right after the
/// checkpoint finds each as it was at the phase (and the one file fsynced after it as
/// fsynced), and the live file system keeps every change.
#[test]
fn inodes_touched_after_the_phase_are_checkpointed_as_the_phase_left_them() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    Fs::format(&*dev, &MkfsOptions::default()).unwrap();
    let opts = FsOptions { checkpoint_interval: None, ..Default::default() };
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts.clone()).unwrap();
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let d2 = fs.mkdir(ROOT, b"d2", 0o755, 0, 0).unwrap().ino;
    let mut ino = std::collections::BTreeMap::new();
    for (dir, n) in [(d, "a"), (d, "b"), (d, "c"), (d, "e"), (d, "g"), (d2, "f")] {
        let i = fs.create(dir, n.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write_at(i, 0, format!("old-{n}").as_bytes()).unwrap();
        ino.insert(n, i);
    }
    // Open before the phase: a write or read through a handle takes no inode lookup.
    let (ha, hg) = (fs.open_file(ino["a"]).unwrap(), fs.open_file(ino["g"]).unwrap());
    let phases = fs.cp_exclusive_work();
    let mut errors = Vec::new();
    fs.engine
        .checkpoint_between(false, || {
            // Every inode above is owed to this checkpoint now; each change below captures
            // what it touches first.
            let r = (|| -> crate::Result<()> {
                ha.write_at(0, b"new-a")?;
                fs.unlink(d, b"b")?;
                fs.rename(d, b"c", d, b"c2", RenameFlags::empty())?;
                fs.setattr(ino["e"], &SetAttr { mode: Some(0o600), ..Default::default() })?;
                let mut buf = [0u8; 5];
                hg.read_at(0, &mut buf)?;
                assert_eq!(&buf, b"old-g", "a read of an owed file");
                // A captured file's fsync installs it itself, then journals its own write.
                fs.write_at(ino["f"], 0, b"new-f")?;
                fs.fsync(ino["f"], false)?;
                Ok(())
            })();
            if let Err(e) = r {
                errors.push(e);
            }
        })
        .unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    drop((ha, hg));
    let work = fs.cp_exclusive_work();
    assert_eq!(work.phases - phases.phases, 1);
    assert_eq!(work.inodes - phases.inodes, 0, "the phase looked at no inode");
    // A crash right after the checkpoint: its picture, and the fsynced write after it.
    let crashed = Arc::new(MemDevice::from_bytes(dev.snapshot()));
    let after = Fs::open(crashed as Arc<dyn BlockDevice>, opts.clone()).unwrap();
    assert_eq!(content(&after, ino["a"]), b"old-a", "a's write came after the phase");
    assert_eq!(after.lookup(d, b"b").unwrap().ino, ino["b"], "b's unlink came after the phase");
    assert_eq!(content(&after, ino["b"]), b"old-b");
    assert_eq!(after.lookup(d, b"c").unwrap().ino, ino["c"], "c's rename came after the phase");
    assert_eq!(after.lookup(d, b"c2").map(|_| ()).unwrap_err().to_errno(), libc::ENOENT);
    assert_eq!(after.getattr(ino["e"]).unwrap().mode & 0o7777, 0o644, "e's chmod came after");
    assert_eq!(content(&after, ino["f"]), b"new-f", "f was fsynced");
    after.unmount().unwrap();
    // The live file system has every change, and keeps them across an unmount.
    fs.unmount().unwrap();
    let fs = Fs::open(dev as Arc<dyn BlockDevice>, opts).unwrap();
    assert_eq!(content(&fs, ino["a"]), b"new-a");
    assert_eq!(fs.lookup(d, b"b").map(|_| ()).unwrap_err().to_errno(), libc::ENOENT);
    assert_eq!(fs.lookup(d, b"c2").unwrap().ino, ino["c"]);
    assert_eq!(fs.getattr(ino["e"]).unwrap().mode & 0o7777, 0o600);
    assert_eq!(content(&fs, ino["f"]), b"new-f");
    fs.unmount().unwrap();
}

/// Many threads change owed files and directories while checkpoints come one after another,
/// so captures race: between the writer and the foreground, and between foreground threads
/// touching one directory. Debug builds check each capture against the phase's record of the
/// inode (`Fingerprint`); afterwards every thread's last write and every name are in place,
/// before and after a remount.
#[test]
fn captures_race_between_the_writer_and_many_threads() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 300;
    let dev = Arc::new(MemDevice::new(128 << 20));
    Fs::format(&*dev, &MkfsOptions::default()).unwrap();
    let opts = FsOptions { checkpoint_interval: None, ..Default::default() };
    let fs = Arc::new(Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts.clone()).unwrap());
    let shared = fs.mkdir(ROOT, b"shared", 0o755, 0, 0).unwrap().ino;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cp = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                fs.sync().unwrap();
                n += 1;
            }
            n
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mine = fs.create(shared, format!("w{t}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                for r in 0..ROUNDS {
                    let name = format!("t{t}-{r}");
                    let f = fs.create(shared, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
                    fs.write_at(f, 0, name.as_bytes()).unwrap();
                    fs.write_at(mine, 0, format!("{r:08}").as_bytes()).unwrap();
                    if r % 3 == 0 {
                        fs.unlink(shared, name.as_bytes()).unwrap();
                    } else if r % 3 == 1 {
                        fs.rename(
                            shared,
                            name.as_bytes(),
                            shared,
                            format!("{name}-r").as_bytes(),
                            RenameFlags::empty(),
                        )
                        .unwrap();
                    }
                    if r % 17 == 0 {
                        fs.fsync(mine, true).unwrap();
                    }
                }
                mine
            })
        })
        .collect();
    let mine: Vec<u64> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, std::sync::atomic::Ordering::Release);
    let checkpoints = cp.join().unwrap();
    assert!(checkpoints >= 2, "{checkpoints} checkpoints during the run");
    let want = |fs: &Fs| {
        for (t, &m) in mine.iter().enumerate() {
            assert_eq!(content(fs, m)[..8], format!("{:08}", ROUNDS - 1).into_bytes()[..], "thread {t}");
            for r in 0..ROUNDS {
                let name = format!("t{t}-{r}");
                let (plain, renamed) =
                    (fs.lookup(shared, name.as_bytes()), fs.lookup(shared, format!("{name}-r").as_bytes()));
                match r % 3 {
                    0 => assert!(plain.is_err() && renamed.is_err(), "{name} unlinked"),
                    1 => assert!(plain.is_err() && renamed.is_ok(), "{name} renamed"),
                    _ => assert_eq!(content(fs, plain.unwrap().ino), name.as_bytes(), "{name}"),
                }
            }
        }
    };
    want(&fs);
    Arc::try_unwrap(fs).ok().expect("one reference left").unmount().unwrap();
    let fs = Fs::open(dev as Arc<dyn BlockDevice>, opts).unwrap();
    want(&fs);
    fs.unmount().unwrap();
}
