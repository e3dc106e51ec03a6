//! Path walks through the library: `Fs::walk` (and `Fs::resolve` on it) ends where a chain of
//! `Fs::lookup`s ends, with the same errors, and stays right while other threads rename the
//! directories it walks through.

use lanefs::device::{BlockDevice, MemDevice};
use lanefs::RenameFlags;
use lanefs::{Fs, FsOptions, Ino, MkfsOptions, ROOT};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn fs() -> Fs {
    let dev = Arc::new(MemDevice::new(64 << 20));
    Fs::format(&*dev, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
    Fs::open(dev as Arc<dyn BlockDevice>, FsOptions::default()).unwrap()
}

fn errno<T: std::fmt::Debug>(r: lanefs::Result<T>) -> i32 {
    r.expect_err("an error").to_errno()
}

fn names<'a>(p: &'a [&'a str]) -> impl Iterator<Item = &'a [u8]> {
    p.iter().map(|s| s.as_bytes())
}

#[test]
fn walk_ends_where_lookups_end_with_the_same_errors() {
    let fs = fs();
    let a = fs.mkdir(ROOT, b"a", 0o755, 0, 0).unwrap();
    let b = fs.mkdir(a.ino, b"b", 0o755, 0, 0).unwrap();
    let f = fs.create(b.ino, b"f", 0o644, 0, 0).unwrap();
    fs.symlink(a.ino, b"link", b"b", 0, 0).unwrap();

    // The same attributes as the last lookup of the chain, and as resolve.
    let by_walk = fs.walk(ROOT, names(&["a", "b", "f"])).unwrap();
    assert_eq!(by_walk, fs.lookup(b.ino, b"f").unwrap());
    assert_eq!(fs.resolve("/a/b/f").unwrap(), by_walk);
    assert_eq!(by_walk.ino, f.ino);
    // No names: the start itself. "." and ".." as lookup takes them.
    assert_eq!(fs.walk(b.ino, names(&[])).unwrap().ino, b.ino);
    assert_eq!(fs.walk(ROOT, names(&["a", ".", "b", "..", "b", "f"])).unwrap().ino, f.ino);
    assert_eq!(fs.walk(ROOT, names(&["a", "b", "..", ".."])).unwrap().ino, ROOT);

    // Errors, each as lookup gives it at the step that fails.
    assert_eq!(errno(fs.walk(ROOT, names(&["a", "nope", "f"]))), libc::ENOENT);
    assert_eq!(errno(fs.walk(ROOT, names(&["a", "b", "f", "x"]))), libc::ENOTDIR);
    assert_eq!(errno(fs.lookup(f.ino, b"x")), libc::ENOTDIR);
    // A symlink on the way is not followed.
    assert_eq!(errno(fs.walk(ROOT, names(&["a", "link", "f"]))), libc::ENOTDIR);
    assert_eq!(fs.walk(ROOT, names(&["a", "link"])).unwrap().kind, lanefs::FileKind::Symlink);
    let long = "x".repeat(256);
    assert_eq!(errno(fs.walk(ROOT, [long.as_bytes()])), errno(fs.lookup(ROOT, long.as_bytes())));
    assert_eq!(errno(fs.walk(ROOT, [&b""[..]])), errno(fs.lookup(ROOT, b"")));
    assert_eq!(errno(fs.walk(Ino::MAX, names(&["a"]))), errno(fs.lookup(Ino::MAX, b"a")));
}

/// Walkers and a renamer race: every walk finds the file under one of the two names its
/// directory has in turn, or ENOENT in neither case a lookup would not give, and never
/// another inode.
#[test]
fn walks_beside_renames_find_the_file_or_enoent() {
    let fs = Arc::new(fs());
    let d = fs.mkdir(ROOT, b"d0", 0o755, 0, 0).unwrap();
    let sub = fs.mkdir(d.ino, b"sub", 0o755, 0, 0).unwrap();
    let f = fs.create(sub.ino, b"f", 0o644, 0, 0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Renames done so far: the walkers start only once the renamer runs, so that on two cores
    // they cannot all finish before it is first scheduled.
    let renames = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let renamer = {
        let (fs, stop, renames) = (fs.clone(), stop.clone(), renames.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while n == 0 || (!stop.load(Ordering::Relaxed) && n < 20_000) {
                let (from, to): (&[u8], &[u8]) = if n & 1 == 0 { (b"d0", b"d1") } else { (b"d1", b"d0") };
                fs.rename(ROOT, from, ROOT, to, RenameFlags::empty()).unwrap();
                n += 1;
                renames.store(n, Ordering::Release);
            }
            n
        })
    };
    let walkers: Vec<_> = (0..3)
        .map(|_| {
            let (fs, renames) = (fs.clone(), renames.clone());
            std::thread::spawn(move || {
                // Bounded: the renamer's first rename takes finite time.
                while renames.load(Ordering::Acquire) == 0 {
                    std::thread::yield_now();
                }
                let (mut found, mut missing) = (0u32, 0u32);
                for i in 0..20_000 {
                    let top = if i & 1 == 0 { "d0" } else { "d1" };
                    match fs.walk(ROOT, names(&[top, "sub", "f"])) {
                        Ok(a) => {
                            assert_eq!(a.ino, f.ino, "a walk found another inode");
                            found += 1;
                        }
                        Err(e) => {
                            assert_eq!(e.to_errno(), libc::ENOENT, "{e}");
                            missing += 1;
                        }
                    }
                }
                (found, missing)
            })
        })
        .collect();
    let mut found = 0;
    for w in walkers {
        let (f, m) = w.join().unwrap();
        assert_eq!(f + m, 20_000);
        found += f;
    }
    stop.store(true, Ordering::Relaxed);
    // The renamer's own renames all succeeded (it unwraps each), and it ran beside the walks.
    assert!(renamer.join().unwrap() >= 1);
    assert!(found > 0, "no walk ever found the file");
    // Afterwards the tree is whole: one of the two names holds it.
    let end =
        fs.walk(ROOT, names(&["d0", "sub", "f"])).or_else(|_| fs.walk(ROOT, names(&["d1", "sub", "f"])));
    assert_eq!(end.unwrap().ino, f.ino);
}

/// Walks remember each name's mnode in its directory slot (`mem::dir`). Walkers race a
/// churner that replaces every name with a new inode (created under a temporary name, then
/// renamed over it), unlinks and recreates names, and checkpoints so that freed inode numbers
/// are given out again. Every walk must end on an inode made for that name, and afterwards every
/// walk must agree with the directory listing and the inode table: no walk may keep using a
/// mnode its name no longer has.
#[test]
fn remembered_mnodes_follow_their_names_through_replacement_and_reuse() {
    use std::collections::{HashMap, HashSet};
    use std::sync::Mutex;
    const NAMES: usize = 16;
    const MIN_ROUNDS: usize = 60;
    // A small image has few inode numbers, so that the churn comes round to reuse them.
    let dev = Arc::new(MemDevice::new(40 << 20));
    Fs::format(&*dev, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
    let fs = Arc::new(Fs::open(dev as Arc<dyn BlockDevice>, FsOptions::default()).unwrap());
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap();
    let sub = fs.mkdir(d.ino, b"sub", 0o755, 0, 0).unwrap();
    // (ino, generation) pairs ever given to each name, registered before the name shows them.
    type Made = Vec<Mutex<HashSet<(Ino, u32)>>>;
    let made: Arc<Made> = Arc::new((0..NAMES).map(|_| Mutex::new(HashSet::new())).collect());
    for k in 0..NAMES {
        let a = fs.create(sub.ino, format!("f{k}").as_bytes(), 0o644, 0, 0).unwrap();
        made[k].lock().unwrap().insert((a.ino, a.generation));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let walkers: Vec<_> = (0..3)
        .map(|t| {
            let (fs, made, stop) = (fs.clone(), made.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut walks = 0u64;
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let k = i % NAMES;
                    i += 1;
                    let f = format!("f{k}");
                    match fs.walk(ROOT, names(&["d", "sub", &f])) {
                        Ok(a) => {
                            assert!(
                                made[k].lock().unwrap().contains(&(a.ino, a.generation)),
                                "{f}: a walk ended on inode {} (generation {}), never made for it",
                                a.ino,
                                a.generation
                            );
                            walks += 1;
                        }
                        Err(e) => assert_eq!(e.to_errno(), libc::ENOENT, "{e}"),
                    }
                }
                walks
            })
        })
        .collect();
    let mut seen = HashSet::new();
    let mut reused = false;
    let mut round = 0;
    while round < MIN_ROUNDS || !reused {
        assert!(round < 5000, "no inode number came back in {round} rounds");
        for k in 0..NAMES {
            let f = format!("f{k}");
            if (round + k) % 3 == 0 {
                fs.unlink(sub.ino, f.as_bytes()).unwrap();
                let a = fs.create(sub.ino, b"tmp", 0o644, 0, 0).unwrap();
                made[k].lock().unwrap().insert((a.ino, a.generation));
                reused |= !seen.insert(a.ino);
                fs.rename(sub.ino, b"tmp", sub.ino, f.as_bytes(), RenameFlags::empty()).unwrap();
            } else {
                let a = fs.create(sub.ino, b"tmp", 0o644, 0, 0).unwrap();
                made[k].lock().unwrap().insert((a.ino, a.generation));
                reused |= !seen.insert(a.ino);
                fs.rename(sub.ino, b"tmp", sub.ino, f.as_bytes(), RenameFlags::empty()).unwrap();
            }
        }
        if round % 5 == 4 {
            // Deleted inodes leave the table; their numbers come back for later creates.
            fs.sync().unwrap();
        }
        round += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let walks: u64 = walkers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(walks > 0, "no walk completed");
    // Every name walks to what the listing and the inode table say it is now.
    let listed: HashMap<Vec<u8>, Ino> =
        fs.readdir(sub.ino, 0, 1000).unwrap().into_iter().map(|e| (e.name, e.ino)).collect();
    for k in 0..NAMES {
        let f = format!("f{k}");
        let a = fs.walk(ROOT, names(&["d", "sub", &f])).unwrap();
        assert_eq!(Some(&a.ino), listed.get(f.as_bytes()), "{f}: walk and listing disagree");
        let by_ino = fs.lookup_ino(a.ino).unwrap();
        assert_eq!((a.generation, a.nlink), (by_ino.generation, 1), "{f}: a stale mnode");
        assert_eq!(fs.lookup(sub.ino, f.as_bytes()).unwrap(), a);
    }
}
