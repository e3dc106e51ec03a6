//! O_TMPFILE (`Fs::tmpfile`): a file with no name, open, that a link may name once; after a
//! crash or an unmount it is gone unless a link named it, and once linked and fsynced it is a
//! created file's equal (durability contract 1).

use lanefs::device::{BlockDevice, MemDevice};

use lanefs::testing::acl::{self, Acl, Entry, Tag};
use lanefs::{fsck as check, Fs, FsOptions, FsckOptions, Handle, Ino, MkfsOptions, New, XattrFlags, ROOT};
use lanefs_crashtest::{flush_points, in_flight_after, state_with_subset, CrashDevice};
use std::sync::Arc;

mod region;

fn opts() -> FsOptions {
    FsOptions { checkpoint_interval: None, journal_blocks_limit: 64, ..Default::default() }
}

fn fresh(bytes: u64) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(bytes));
    Fs::format(&*dev, &MkfsOptions { lanes: 2, ..Default::default() }).unwrap();
    dev
}

fn mount(dev: &Arc<MemDevice>) -> Fs {
    Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts()).unwrap()
}

fn tmp(fs: &Fs, dir: Ino) -> Handle {
    let (a, h) = fs.tmpfile(dir, &New { mode: 0o640, uid: 7, gid: 8, umask: 0o022, rdev: 0 }).unwrap();
    assert_eq!((a.nlink, a.mode, a.uid, a.gid, a.size), (0, 0o100640, 7, 8, 0));
    assert_eq!(h.ino(), a.ino);
    h
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

fn read_all(fs: &Fs, path: &str) -> Vec<u8> {
    let a = fs.resolve(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut got = vec![0u8; a.size as usize];
    assert_eq!(fs.read_at(a.ino, 0, &mut got).unwrap(), got.len());
    got
}

fn names(fs: &Fs, dir: Ino) -> Vec<String> {
    let mut v: Vec<String> =
        fs.readdir(dir, 0, 10_000).unwrap().into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
    v.retain(|n| n != "." && n != "..");
    v.sort();
    v
}

fn fsck_clean(dev: &MemDevice, what: &str) {
    let r = check(dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "{what}: fsck: {:#?}", r.problems);
}

#[test]
fn a_tmpfile_reads_what_was_written_and_has_no_name() {
    let dev = fresh(64 << 20);
    let fs = mount(&dev);
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let h = tmp(&fs, d);
    let data = pattern(70_000, 3);
    assert_eq!(h.write_at(1000, &data).unwrap(), data.len());
    h.fsync(false).unwrap();
    h.fsync(true).unwrap();
    let mut got = vec![0u8; data.len()];
    assert_eq!(h.read_at(1000, &mut got).unwrap(), data.len());
    assert_eq!(got, data);
    let a = fs.getattr(h.ino()).unwrap();
    assert_eq!((a.size, a.nlink), (71_000, 0));
    assert!(names(&fs, d).is_empty(), "no name in its directory");
    assert!(fs.lookup_ino(h.ino()).is_err(), "a file handle does not reach it");
    // A directory's mode bits and a regular file's type only.
    assert!(fs.tmpfile(d, &New { mode: 0o040755, ..Default::default() }).is_err());
    let f = fs.create(d, b"plain", 0o644, 0, 0).unwrap().ino;
    assert!(fs.tmpfile(f, &New { mode: 0o600, ..Default::default() }).is_err(), "not a directory");
    drop(h);
    fs.unmount().unwrap();
    fsck_clean(&dev, "after unmount");
}

/// The mode and ACLs a create would give, and the ACLs go with its first name: after a crash
/// that an fsync of the directory alone preceded, the file has its access ACL.
#[test]
fn a_tmpfile_takes_the_umask_and_a_default_acl_as_a_create_does() {
    let dev = fresh(64 << 20);
    let fs = mount(&dev);
    let (a, h) = fs.tmpfile(ROOT, &New { mode: 0o666, umask: 0o027, ..Default::default() }).unwrap();
    assert_eq!(a.mode, 0o100640);
    drop(h);
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let named = Acl::new(vec![
        Entry { tag: Tag::UserObj, perm: 7, id: u32::MAX },
        Entry { tag: Tag::User, perm: 7, id: 1001 },
        Entry { tag: Tag::GroupObj, perm: 5, id: u32::MAX },
        Entry { tag: Tag::Mask, perm: 7, id: u32::MAX },
        Entry { tag: Tag::Other, perm: 5, id: u32::MAX },
    ])
    .unwrap();
    fs.setxattr(d, acl::DEFAULT, &named.encode(), XattrFlags::empty()).unwrap();
    fs.sync().unwrap();
    let (a, h) = fs.tmpfile(d, &New { mode: 0o666, umask: 0o022, ..Default::default() }).unwrap();
    // As for a create: no umask under a default ACL, the mask from the mode's group bits.
    assert_eq!(a.mode, 0o100664);
    let want = fs.getxattr(h.ino(), acl::ACCESS).expect("an access ACL from the default one");
    fs.link(h.ino(), d, b"f").unwrap();
    fs.fsync(d, false).unwrap();
    let crashed = Arc::new(MemDevice::from_bytes(dev.snapshot()));
    drop(h);
    fs.unmount().unwrap();
    let fs = mount(&crashed);
    let f = fs.resolve("/d/f").expect("the name the directory's fsync made durable");
    assert_eq!(f.mode, 0o100664);
    assert_eq!(fs.getxattr(f.ino, acl::ACCESS).expect("its ACL came with its name"), want);
    fs.unmount().unwrap();
    fsck_clean(&crashed, "after the crash");
}

#[test]
fn a_linked_tmpfile_keeps_its_name_and_data_across_a_remount() {
    let dev = fresh(64 << 20);
    let fs = mount(&dev);
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let h = tmp(&fs, d);
    let data = pattern(50_000, 9);
    h.write_at(0, &data).unwrap();
    let a = fs.link(h.ino(), d, b"named").unwrap();
    assert_eq!((a.ino, a.nlink), (h.ino(), 1));
    assert_eq!(fs.lookup(d, b"named").unwrap().nlink, 1);
    assert_eq!(read_all(&fs, "/d/named"), data);
    // A second name is an ordinary link.
    assert_eq!(fs.link(h.ino(), ROOT, b"again").unwrap().nlink, 2);
    drop(h);
    fs.unmount().unwrap();
    fsck_clean(&dev, "after unmount");
    let fs = mount(&dev);
    assert_eq!(read_all(&fs, "/d/named"), data);
    assert_eq!(fs.resolve("/again").unwrap().nlink, 2);
    fs.unmount().unwrap();
}

#[test]
fn an_unlinked_name_is_not_linked_again() {
    let dev = fresh(64 << 20);
    let fs = mount(&dev);
    // An ordinary file, open, its last name removed: ENOENT, as Linux without I_LINKABLE.
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let h = fs.open_file(f).unwrap();
    fs.unlink(ROOT, b"f").unwrap();
    let e = fs.link(f, ROOT, b"back").unwrap_err();
    assert_eq!(e.to_errno(), libc::ENOENT, "{e}");
    drop(h);
    // A tmpfile linked, then unlinked: its one first link is spent.
    let t = tmp(&fs, ROOT);
    fs.link(t.ino(), ROOT, b"t").unwrap();
    fs.unlink(ROOT, b"t").unwrap();
    let e = fs.link(t.ino(), ROOT, b"t2").unwrap_err();
    assert_eq!(e.to_errno(), libc::ENOENT, "{e}");
    // A first link that fails (the name is taken) leaves it linkable.
    let u = tmp(&fs, ROOT);
    fs.create(ROOT, b"taken", 0o644, 0, 0).unwrap();
    assert_eq!(fs.link(u.ino(), ROOT, b"taken").unwrap_err().to_errno(), libc::EEXIST);
    assert_eq!(fs.link(u.ino(), ROOT, b"free").unwrap().nlink, 1);
    drop((t, u));
    assert_eq!(names(&fs, ROOT), ["free", "taken"]);
    fs.unmount().unwrap();
    fsck_clean(&dev, "after unmount");
}

/// Never linked: gone after an unmount, and after a crash with the checkpoint that took it as
/// an orphan; either way fsck is clean and its blocks are free again.
#[test]
fn a_tmpfile_never_linked_is_gone_after_a_remount_or_a_crash() {
    let dev = fresh(64 << 20);
    let fs = mount(&dev);
    fs.sync().unwrap();
    let free_before = fs.statfs().bfree;
    let files_before = fs.statfs().ffree;
    let h = tmp(&fs, ROOT);
    h.write_at(0, &pattern(4 << 20, 1)).unwrap();
    h.fsync(false).unwrap();
    // The checkpoint writes it, as an orphan, with its 4 MiB.
    fs.sync().unwrap();
    assert!(fs.statfs().bfree + 1000 < free_before, "its blocks are in use while it is open");
    let ino = h.ino();
    // A crash now: the image as the device holds it, the file still open.
    let crashed = Arc::new(MemDevice::from_bytes(dev.snapshot()));
    drop(h);
    fs.unmount().unwrap();
    for (what, d) in [("unmount", &dev), ("crash", &crashed)] {
        fsck_clean(d, what);
        let fs = mount(d);
        assert!(fs.getattr(ino).is_err(), "{what}: inode {ino} is gone");
        fs.sync().unwrap();
        let s = fs.statfs();
        assert_eq!((s.bfree, s.ffree), (free_before, files_before), "{what}: blocks and inodes free again");
        assert!(names(&fs, ROOT).is_empty(), "{what}");
        fs.unmount().unwrap();
        fsck_clean(d, what);
    }
}

/// One file's fate, checked after every crash.
enum Expect {
    /// Promised at device event `at`: `path` holds `data`.
    Data { at: usize, path: &'static str, data: Vec<u8> },
    /// Promised at `at` (an fsync of the directory): `path` exists.
    Name { at: usize, path: &'static str },
}

/// Linked and fsynced, a tmpfile survives a crash at every flush point (and with writes in
/// flight after it), whether a checkpoint took it before its link (as an orphan) or not; one
/// never linked is never seen; fsck is clean every time.
#[test]
fn a_linked_and_fsynced_tmpfile_survives_a_crash_at_every_flush_point() {
    let dev = fresh(64 << 20);
    let base = dev.snapshot();
    let crash = Arc::new(CrashDevice::new(MemDevice::from_bytes(base.clone())));
    let fs: &'static Fs =
        Box::leak(Box::new(Fs::open(crash.clone() as Arc<dyn BlockDevice>, opts()).unwrap()));
    let now = || crash.event_count();
    let mut expect = Vec::new();
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    fs.fsync(ROOT, false).unwrap();
    // a: written, linked, fsynced; no checkpoint in between.
    let a = tmp(fs, d);
    let da = pattern(30_000, 1);
    a.write_at(0, &da).unwrap();
    fs.link(a.ino(), d, b"a").unwrap();
    a.fsync(false).unwrap();
    expect.push(Expect::Data { at: now(), path: "/d/a", data: da });
    // b: written and fsynced unnamed, taken by a checkpoint as an orphan, written again, then
    // linked and fsynced: the mount adopts the orphan.
    let b = tmp(fs, d);
    let mut db = pattern(20_000, 2);
    b.write_at(0, &db).unwrap();
    b.fsync(false).unwrap();
    // c: never linked, open throughout, fsynced: on the orphan list of every checkpoint.
    let c = tmp(fs, d);
    c.write_at(0, &pattern(12_000, 3)).unwrap();
    c.fsync(false).unwrap();
    fs.sync().unwrap();
    let more = pattern(9000, 4);
    b.write_at(15_000, &more).unwrap();
    db.resize(24_000, 0);
    db[15_000..].copy_from_slice(&more);
    fs.link(b.ino(), ROOT, b"b").unwrap();
    b.fsync(false).unwrap();
    expect.push(Expect::Data { at: now(), path: "/b", data: db });
    // e: linked, its directory fsynced (its name promised, not its data).
    let e = tmp(fs, d);
    e.write_at(0, &pattern(5000, 5)).unwrap();
    fs.link(e.ino(), d, b"e").unwrap();
    fs.fsync(d, false).unwrap();
    expect.push(Expect::Name { at: now(), path: "/d/e" });
    // f: linked and unlinked again before any fsync of it: never a name after a crash.
    let f = tmp(fs, d);
    f.write_at(0, &pattern(3000, 6)).unwrap();
    fs.link(f.ino(), d, b"f").unwrap();
    fs.unlink(d, b"f").unwrap();
    f.fsync(false).unwrap();
    fs.fsync(d, false).unwrap();
    drop(f);
    // g: linked after a checkpoint took it, and a checkpoint after its link.
    let g = tmp(fs, ROOT);
    let dg = pattern(8000, 7);
    g.write_at(0, &dg).unwrap();
    fs.sync().unwrap();
    fs.link(g.ino(), d, b"g").unwrap();
    fs.sync().unwrap();
    expect.push(Expect::Data { at: now(), path: "/d/g", data: dg });
    // h: fsynced unnamed (which has nothing to make durable), then linked and fsynced: its
    // blocks and size must come with its name, not stay behind in the unnamed fsync.
    let h = tmp(fs, d);
    let dh = pattern(11_000, 8);
    h.write_at(0, &dh).unwrap();
    h.fsync(false).unwrap();
    fs.link(h.ino(), d, b"h").unwrap();
    h.fsync(false).unwrap();
    expect.push(Expect::Data { at: now(), path: "/d/h", data: dh });
    // Still open at the crash (the file system is leaked, never unmounted).
    std::mem::forget((a, b, c, e, g, h));
    let events = crash.events();
    let flushes = flush_points(&events);
    assert!(flushes.len() > 10, "{} flushes", flushes.len());
    let mut rng = lanefs::rng::Rng::new(17);
    let mut states = 0;
    for (n, &fl) in flushes.iter().enumerate() {
        let inflight = in_flight_after(&events, Some(fl));
        let mut subsets = vec![Vec::new()];
        for _ in 0..2 {
            if !inflight.is_empty() {
                subsets.push(inflight.iter().copied().filter(|_| rng.next_u64().is_multiple_of(2)).collect());
            }
        }
        for subset in subsets {
            let what =
                format!("flush {n}/{} + {} of {} in flight", flushes.len(), subset.len(), inflight.len());
            let img = state_with_subset(&base, &events, Some(fl), &subset).unwrap();
            verify(img, fl + 1, &expect, &what);
            states += 1;
        }
    }
    assert!(states > 20, "{states} crash states");
}

/// Mounts a crash state after device event `upto - 1`'s flush and checks the promises made
/// by then, that no name but the linked ones shows, and fsck.
fn verify(image: Vec<u8>, upto: usize, expect: &[Expect], what: &str) {
    let dev = Arc::new(MemDevice::from_bytes(image));
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, opts())
        .unwrap_or_else(|e| panic!("{what}: mount: {e}"));
    for x in expect {
        match x {
            Expect::Data { at, path, data } if *at <= upto => {
                assert_eq!(&read_all(&fs, path), data, "{what}: {path}");
                assert_eq!(fs.resolve(path).unwrap().nlink, 1, "{what}: {path}");
            }
            Expect::Name { at, path } if *at <= upto => {
                assert!(fs.resolve(path).is_ok(), "{what}: {path} is gone");
            }
            _ => {}
        }
    }
    if let Ok(d) = fs.resolve("/d") {
        for n in names(&fs, d.ino) {
            assert!(["a", "e", "g", "h"].contains(&n.as_str()), "{what}: /d/{n} was never linked for good");
        }
    }
    for n in names(&fs, ROOT) {
        assert!(["d", "b"].contains(&n.as_str()), "{what}: /{n}");
    }
    fs.unmount().unwrap();
    fsck_clean(&dev, what);
}

/// Threads each making tmpfiles, writing them and linking them into one directory, some
/// fsynced: every name holds its data, before and after a remount.
#[test]
fn threads_link_tmpfiles_into_one_directory() {
    let dev = fresh(256 << 20);
    let fs = Arc::new(mount(&dev));
    let d = fs.mkdir(ROOT, b"shared", 0o755, 0, 0).unwrap().ino;
    const THREADS: usize = 4;
    const EACH: usize = 60;
    let data = |t: usize, i: usize| pattern(1 + (t * 7919 + i * 104_729) % 20_000, (t * EACH + i) as u8);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let fs = fs.clone();
            s.spawn(move || {
                for i in 0..EACH {
                    let (_, h) = fs.tmpfile(d, &New { mode: 0o600, ..Default::default() }).unwrap();
                    h.write_at(0, &data(t, i)).unwrap();
                    if i.is_multiple_of(3) {
                        h.fsync(false).unwrap();
                    }
                    fs.link(h.ino(), d, format!("t{t}-{i}").as_bytes()).unwrap();
                    if i.is_multiple_of(2) {
                        h.fsync(false).unwrap();
                    }
                    if i.is_multiple_of(17) {
                        fs.sync().unwrap();
                    }
                }
            });
        }
    });
    let check_all = |fs: &Fs, what: &str| {
        assert_eq!(names(fs, d).len(), THREADS * EACH, "{what}");
        for t in 0..THREADS {
            for i in 0..EACH {
                let path = format!("/shared/t{t}-{i}");
                assert_eq!(read_all(fs, &path), data(t, i), "{what}: {path}");
                assert_eq!(fs.resolve(&path).unwrap().nlink, 1, "{what}: {path}");
            }
        }
    };
    check_all(&fs, "mounted");
    Arc::try_unwrap(fs).ok().expect("the threads are done").unmount().unwrap();
    fsck_clean(&dev, "after unmount");
    let fs = mount(&dev);
    check_all(&fs, "remounted");
    fs.unmount().unwrap();
}

/// With region journals (`--nvm`): a tmpfile linked and fsynced, and one a checkpoint took
/// unnamed and that was linked and fsynced after, both come back from the region's journals
/// after a crash; one never linked does not.
#[test]
fn linked_tmpfiles_come_back_from_region_journals_after_a_crash() {
    let scratch = region::scratch();
    let (nvm, copy) = (scratch.path().join("r.nvm"), scratch.path().join("copy.nvm"));
    let mem = Arc::new(region::image());
    let fs = Fs::open(mem.clone() as Arc<dyn BlockDevice>, region::opts(Some(&nvm))).unwrap();
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let a = tmp(&fs, d);
    let da = pattern(40_000, 1);
    a.write_at(0, &da).unwrap();
    fs.link(a.ino(), d, b"a").unwrap();
    a.fsync(false).unwrap();
    let b = tmp(&fs, d);
    let mut db = pattern(30_000, 2);
    b.write_at(0, &db).unwrap();
    let c = tmp(&fs, d);
    c.write_at(0, &pattern(8000, 3)).unwrap();
    fs.sync().unwrap();
    let more = pattern(6000, 4);
    b.write_at(28_000, &more).unwrap();
    db.resize(34_000, 0);
    db[28_000..].copy_from_slice(&more);
    fs.link(b.ino(), d, b"b").unwrap();
    b.fsync(false).unwrap();
    // The crash: the device and the region as they are now.
    let img = mem.snapshot();
    std::fs::copy(&nvm, &copy).unwrap();
    let c_ino = c.ino();
    drop((a, b, c));
    fs.unmount().unwrap();
    let dev = Arc::new(MemDevice::from_bytes(img));
    let fs = Fs::open(dev.clone() as Arc<dyn BlockDevice>, region::opts(Some(&copy))).unwrap();
    assert!(fs.recovery().transactions > 0, "{:?}", fs.recovery());
    assert_eq!(read_all(&fs, "/d/a"), da);
    assert_eq!(read_all(&fs, "/d/b"), db);
    assert_eq!(names(&fs, d), ["a", "b"]);
    assert!(fs.getattr(c_ino).is_err(), "the unnamed one is gone");
    fs.unmount().unwrap();
    let r = check(&*dev, &FsckOptions { nvm: Some(copy), ..Default::default() }).unwrap();
    assert!(r.is_clean(), "fsck: {:#?}", r.problems);
}
