//! Path walks through the library: `Fs::walk` (and `Fs::resolve` on it) ends where a chain of
//! `Fs::lookup`s ends, with the same errors, and stays right while other threads rename the
//! directories it walks through.

use lanefs::device::{BlockDevice, MemDevice};
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
    let renamer = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) && n < 20_000 {
                let (from, to): (&[u8], &[u8]) = if n & 1 == 0 { (b"d0", b"d1") } else { (b"d1", b"d0") };
                fs.rename(ROOT, from, ROOT, to, 0).unwrap();
                n += 1;
            }
            n
        })
    };
    let walkers: Vec<_> = (0..3)
        .map(|_| {
            let fs = fs.clone();
            std::thread::spawn(move || {
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
    assert!(renamer.join().unwrap() > 0);
    assert!(found > 0, "no walk ever found the file");
    // Afterwards the tree is whole: one of the two names holds it.
    let end =
        fs.walk(ROOT, names(&["d0", "sub", "f"])).or_else(|_| fs.walk(ROOT, names(&["d1", "sub", "f"])));
    assert_eq!(end.unwrap().ino, f.ino);
}
