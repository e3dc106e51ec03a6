//! The FUSE requests a mount serves: counted by opcode in the daemon, published as the
//! `lanefs.requests` xattr of the mount's root and by `lanefs inspect MNT`, and how many each
//! common operation costs (the kernel decides what it sends; the adapter's replies decide how
//! much of it the kernel may cache). Needs root, /dev/fuse and fusermount3, as every FUSE test.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Duration;

fn counts(mp: &Path) -> BTreeMap<String, u64> {
    lanefs_fuse::stats::read(mp).unwrap().into_iter().collect()
}

/// The requests `f` made the mount serve, by opcode (zeros left out).
///
/// The kernel sends a close's RELEASE in the background, after close(2) has returned: the
/// counts are read once RELEASE has stopped changing for a while (at most 2 s), so that a
/// window holds its own RELEASEs and the next one none of them.
fn served(mp: &Path, f: impl FnOnce()) -> BTreeMap<String, u64> {
    let before = counts(mp);
    f();
    let mut after = counts(mp);
    // Bounded: 100 rounds of 20 ms.
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(20));
        let now = counts(mp);
        if now.get("RELEASE") == after.get("RELEASE") {
            break;
        }
        after = now;
    }
    after.into_iter().map(|(k, n)| (k.clone(), n - before[&k])).filter(|(_, n)| *n > 0).collect()
}

fn total(c: &BTreeMap<String, u64>) -> u64 {
    c.values().sum()
}

#[test]
fn requests_are_counted_by_opcode_and_published_on_the_root() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    let first = counts(&m.mp);
    // Every opcode the adapter serves is listed, zeros included; reading them is not counted.
    for op in ["LOOKUP", "GETATTR", "CREATE", "WRITE", "UNLINK", "RENAME", "FORGET", "FLUSH", "RELEASEDIR"] {
        assert!(first.contains_key(op), "{op} missing from {first:?}");
    }
    assert_eq!(counts(&m.mp), first, "reading the counters changed them");
    fs::create_dir(m.mp.join("d")).unwrap();
    let made = served(&m.mp, || {
        for i in 0..50 {
            File::create(m.mp.join(format!("d/f{i}"))).unwrap();
        }
    });
    assert_eq!(made.get("CREATE"), Some(&50), "{made:?}");
    assert_eq!(made.get("RELEASE"), Some(&50), "{made:?}");
    let gone = served(&m.mp, || {
        for i in 0..50 {
            fs::remove_file(m.mp.join(format!("d/f{i}"))).unwrap();
        }
    });
    assert_eq!(gone.get("UNLINK"), Some(&50), "{gone:?}");

    // The name is the adapter's: not listed, not settable, answered on the root only.
    let names = rustix::fs::listxattr(&m.mp, &mut [0u8; 4096][..]).unwrap();
    assert_eq!(names, 0, "the root lists no xattr");
    for p in [m.mp.clone(), m.mp.join("d")] {
        assert_eq!(
            rustix::fs::setxattr(&p, "lanefs.requests", b"0", rustix::fs::XattrFlags::empty()),
            Err(rustix::io::Errno::OPNOTSUPP)
        );
        assert_eq!(rustix::fs::removexattr(&p, "lanefs.other"), Err(rustix::io::Errno::OPNOTSUPP));
    }
    assert_eq!(
        rustix::fs::getxattr(m.mp.join("d"), "lanefs.requests", &mut [0u8; 64][..]),
        Err(rustix::io::Errno::NODATA)
    );

    // `lanefs inspect MNT`, in text and JSON; and the image's inspect names its mount.
    let out = run(&[os("inspect"), m.mp.as_os_str()], Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["CREATE", "50"]), "{text}");
    let out = run(&[os("inspect"), os("--json"), m.mp.as_os_str()], Duration::from_secs(30));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["requests"]["by_opcode"]["UNLINK"], 50, "{v}");
    assert!(v["requests"]["total"].as_u64().unwrap() >= 150, "{v}");
    let out = run(&[os("inspect"), img.as_os_str()], Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("mounted at") && text.contains("UNLINK"), "{text}");
    m.umount();
    // Unmounted: a plain directory is neither image nor mount.
    let out = run(&[os("inspect"), mp.as_os_str()], Duration::from_secs(30));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("neither a lanefs image nor a lanefs mount point"));
    fsck_clean(&img);
}

/// The engine's counters (`lanefs.engine` on the root): bytes, fsync flushes, checkpoints and
/// their pauses, and the contention census, read as the bench and `lanefs inspect MNT` read them.
#[test]
fn engine_counters_are_published_on_the_root_and_by_inspect() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    let before = lanefs_fuse::stats::read_engine(&m.mp).unwrap();
    let f = File::create(m.mp.join("f")).unwrap();
    f.write_all_at(&vec![3u8; 1 << 20], 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let after = lanefs_fuse::stats::read_engine(&m.mp).unwrap();
    let grew = |k: &str| after.get(k).unwrap() - before.get(k).unwrap();
    assert!(grew("user_bytes") >= 1 << 20, "{after:?}");
    assert!(grew("device_bytes") >= 1 << 20, "fsync wrote the data: {after:?}");
    assert!(grew("fsync_flushes") >= 1, "{after:?}");
    for k in [
        "checkpoints",
        "cp_exclusive_us_max",
        "cp_write_phase_us_max",
        "cp_waits",
        "cleaning_bytes",
        "segments_cleaned",
    ] {
        assert!(after.get(k).is_some(), "{k} missing: {after:?}");
    }
    let classes = after.values.iter().filter(|(k, _)| k.starts_with("contended.")).count();
    assert_eq!(classes, lanefs::sync::Rank::COUNT, "every lock class listed: {after:?}");
    assert!(after.census().total() >= before.census().total());
    // Answered on the root only, and not settable.
    assert_eq!(
        rustix::fs::getxattr(m.mp.join("f"), "lanefs.engine", &mut [0u8; 64][..]),
        Err(rustix::io::Errno::NODATA)
    );
    assert_eq!(
        rustix::fs::setxattr(&m.mp, "lanefs.engine", b"0", rustix::fs::XattrFlags::empty()),
        Err(rustix::io::Errno::OPNOTSUPP)
    );

    let out = run(&[os("inspect"), m.mp.as_os_str()], Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.lines().any(|l| l.starts_with("checkpoints") && l.contains("longest exclusive phase")),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("contention")), "{text}");
    let out = run(&[os("inspect"), os("--json"), m.mp.as_os_str()], Duration::from_secs(30));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["engine"]["counters"]["user_bytes"].as_u64().unwrap() >= 1 << 20, "{v}");
    assert!(v["engine"]["counters"]["cp_exclusive_us_max"].is_u64(), "{v}");
    assert!(v["engine"]["contended"].is_object(), "{v}");
    let out = run(&[os("inspect"), os("--json"), img.as_os_str()], Duration::from_secs(30));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["mount"]["engine"]["counters"]["fsync_flushes"].as_u64().unwrap() >= 1, "{v}");
    m.umount();
    fsck_clean(&img);
}

/// What a create, a stat, a write, a rename and an unlink cost in requests, each done many
/// times (the kernel's caches are warm after the first), with the writeback cache (the default)
/// and without. The bounds are this kernel's floor with FUSE and `default_permissions`: see
/// `lanefs_fuse::adapter` for why each request comes.
#[test]
fn common_operations_cost_the_fewest_requests_the_kernel_allows() {
    if !fuse_available() {
        return;
    }
    for cached in [true, false] {
        let (_dir, img, mp) = scratch_image();
        let mode = if cached { "writeback_cache=on" } else { "writeback_cache=off" };
        let m = Mounted::daemon(&img, &mp, &["-o", mode]);
        let d = m.mp.join("d");
        fs::create_dir(&d).unwrap();
        const N: u64 = 200;
        let per_op = |c: &BTreeMap<String, u64>| total(c) as f64 / N as f64;

        let create = served(&m.mp, || {
            for i in 0..N {
                OpenOptions::new().write(true).create_new(true).open(d.join(format!("f{i}"))).unwrap();
            }
        });
        // LOOKUP of the new name, GETATTR of the directory (its attributes went stale with the
        // previous create), CREATE, RELEASE at close; FLUSH at the first close only (answered
        // ENOSYS, which the kernel remembers).
        assert!(per_op(&create) <= 4.05, "{mode}: create: {create:?}");
        assert_eq!(create.get("CREATE"), Some(&N));

        let stat_all = || {
            for i in 0..N {
                fs::metadata(d.join(format!("f{i}"))).unwrap();
            }
        };
        // (With the writeback cache the kernel takes st_blocks as stale after a close, and the
        // first stat after it is a GETATTR.) Later ones are answered from its cache.
        let first = served(&m.mp, stat_all);
        assert!(per_op(&first) <= 1.05, "{mode}: first stat after close: {first:?}");
        let stat = served(&m.mp, stat_all);
        assert!(per_op(&stat) <= 0.05, "{mode}: stat of cached names and attributes: {stat:?}");

        let f = OpenOptions::new().write(true).open(d.join("f0")).unwrap();
        let write = served(&m.mp, || {
            for i in 0..N {
                f.write_all_at(&[7u8; 4096], i * 4096).unwrap();
            }
        });
        // One WRITE each without the writeback cache, none with it (until writeback); no
        // GETXATTR("security.capability") either way.
        let bound = if cached { 0.05 } else { 1.05 };
        assert!(per_op(&write) <= bound, "{mode}: write: {write:?}");
        drop(f);

        let rename = served(&m.mp, || {
            for i in 0..N {
                fs::rename(d.join(format!("f{i}")), d.join(format!("g{i}"))).unwrap();
            }
        });
        assert_eq!(rename.get("RENAME"), Some(&N));
        // LOOKUP of the new name, GETATTR of the directory, RENAME; with the writeback cache
        // a SETATTR of the ctime the kernel gave the file.
        let bound = if cached { 4.05 } else { 3.05 };
        assert!(per_op(&rename) <= bound, "{mode}: rename: {rename:?}");

        let unlink = served(&m.mp, || {
            for i in 0..N {
                fs::remove_file(d.join(format!("g{i}"))).unwrap();
            }
        });
        assert_eq!(unlink.get("UNLINK"), Some(&N));
        // GETATTR of the directory, UNLINK, FORGET of the inode; with the writeback cache a
        // SETATTR of the ctime.
        let bound = if cached { 4.05 } else { 3.05 };
        assert!(per_op(&unlink) <= bound, "{mode}: unlink: {unlink:?}");
        m.umount();
        fsck_clean(&img);
    }
}

/// A name that does not exist is cached as such (a negative entry): a second stat of it costs
/// nothing and a create of it needs no LOOKUP; every change through the mount still shows at
/// once. `negative_timeout=0` and `cache_timeout=1` give the old behaviour back, and
/// `writeback_cache=off` the WRITE per write.
#[test]
fn names_that_do_not_exist_are_cached_and_changes_still_show() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    const N: u64 = 100;
    let missing = |d: &Path| {
        for i in 0..N {
            let e = fs::metadata(d.join(format!("n{i}"))).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        }
    };
    let m = Mounted::daemon(&img, &mp, &[]);
    let d = m.mp.join("d");
    fs::create_dir(&d).unwrap();
    let first = served(&m.mp, || missing(&d));
    assert_eq!(first.get("LOOKUP"), Some(&N), "{first:?}");
    let again = served(&m.mp, || missing(&d));
    assert!(again.is_empty(), "cached negative entries: {again:?}");
    // O_CREAT without O_EXCL: the kernel trusts the negative entry. (With O_EXCL it looks the
    // name up again whatever the TTL: fuse_dentry_revalidate, fs/fuse/dir.c.)
    let create = served(&m.mp, || {
        for i in 0..N {
            File::create(d.join(format!("n{i}"))).unwrap();
        }
    });
    assert_eq!(create.get("LOOKUP"), None, "{create:?}");
    assert_eq!(create.get("CREATE"), Some(&N), "{create:?}");
    let excl = served(&m.mp, || {
        for i in 0..N {
            let e =
                OpenOptions::new().write(true).create_new(true).open(d.join(format!("n{i}"))).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        }
    });
    // O_EXCL makes the kernel look a cached name up again too: one LOOKUP each, nothing more.
    assert_eq!(excl.get("LOOKUP"), Some(&N), "{excl:?}");
    assert!(total(&excl) <= N + 1, "{excl:?}");
    // What the mount itself changes shows at once, cached or not.
    fs::rename(d.join("n0"), d.join("moved")).unwrap();
    assert_eq!(fs::metadata(d.join("n0")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    assert!(fs::metadata(d.join("moved")).unwrap().is_file());
    fs::remove_file(d.join("n1")).unwrap();
    assert_eq!(fs::metadata(d.join("n1")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    fs::hard_link(d.join("n2"), d.join("n1")).unwrap();
    assert_eq!(fs::metadata(d.join("n2")).unwrap().nlink(), 2);
    fs::create_dir(d.join("n0")).unwrap();
    assert!(fs::metadata(d.join("n0")).unwrap().is_dir());
    m.umount();

    let m = Mounted::daemon(&img, &mp, &["-o", "cache_timeout=1,negative_timeout=0,writeback_cache=off"]);
    let d = m.mp.join("d");
    let f = OpenOptions::new().write(true).open(d.join("n3")).unwrap();
    let write = served(&m.mp, || {
        for i in 0..N {
            f.write_all_at(&[9u8; 4096], i * 4096).unwrap();
        }
    });
    assert_eq!(write.get("WRITE"), Some(&N), "{write:?}");
    assert!(total(&write) <= N + 1, "no GETXATTR per write: {write:?}");
    drop(f);
    let missing = |d: &Path| {
        for i in 0..N {
            assert!(fs::metadata(d.join(format!("x{i}"))).is_err());
        }
    };
    missing(&d);
    let again = served(&m.mp, || missing(&d));
    assert_eq!(again.get("LOOKUP"), Some(&N), "negative entries not cached: {again:?}");
    m.umount();
    fsck_clean(&img);
}

/// `-o writeback_cache`: a buffered write is no request until fsync, which sends the dirty pages
/// in few large WRITEs; the FLUSH the kernel then sends at close is answered ENOSYS once and
/// not sent again. SEEK_DATA and SEEK_HOLE see data still in the kernel's cache: the daemon
/// has it written back before it answers LSEEK.
#[test]
fn with_the_writeback_cache_a_write_is_no_request_until_fsync() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &["-o", "writeback_cache"]);
    const N: u64 = 200;
    let f = File::create(m.mp.join("f")).unwrap();
    // The kernel's background writeback (FUSE's small dirty limit) may send some of the pages
    // before the fsync does: the WRITEs are counted over one window around both.
    let (mut write, mut synced) = Default::default();
    let both = served(&m.mp, || {
        write = served(&m.mp, || {
            for i in 0..N {
                f.write_all_at(&[7u8; 4096], i * 4096).unwrap();
            }
        });
        synced = served(&m.mp, || f.sync_all().unwrap());
    });
    assert!(total(&write) <= N / 20, "write: {write:?}");
    assert_eq!(synced.get("FSYNC"), Some(&1), "{synced:?}");
    let writes = both.get("WRITE").copied().unwrap_or(0);
    assert!((1..=N / 4).contains(&writes), "{N} pages in {writes} WRITEs: {write:?}, then {synced:?}");
    // A hole, then data past it, not written back yet.
    f.write_all_at(b"tail", (N + 100) * 4096).unwrap();
    use rustix::fs::{seek, SeekFrom};
    let seeks = served(&m.mp, || {
        assert_eq!(seek(&f, SeekFrom::Data(4096 * N)), Ok((N + 100) * 4096), "the cached tail is data");
        assert_eq!(seek(&f, SeekFrom::Hole(0)), Ok(4096 * N), "the hole before it");
    });
    assert_eq!(seeks.get("LSEEK"), Some(&2), "{seeks:?}");
    assert!(seeks.contains_key("WRITE"), "the tail written back first: {seeks:?}");
    drop(f);
    let closes = served(&m.mp, || {
        for i in 0..N {
            File::create(m.mp.join(format!("c{i}"))).unwrap();
        }
    });
    assert!(closes.get("FLUSH").copied().unwrap_or(0) <= 1, "{closes:?}");
    m.umount();
    let m = Mounted::daemon(&img, &mp, &[]);
    let mut want = vec![7u8; N as usize * 4096];
    want.resize((N as usize + 100) * 4096, 0);
    want.extend_from_slice(b"tail");
    assert!(fs::read(m.mp.join("f")).unwrap() == want, "f after the remount");
    m.umount();
    fsck_clean(&img);
}

/// Every mount names its FUSE transport, and why, in `lanefs.transport`: /dev/fuse when asked
/// for, io_uring when the kernel offers it, and otherwise the reason it does not (the switch
/// the administrator has not turned, or a kernel without it).
#[test]
fn the_mount_names_its_transport_and_why() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &["-o", "transport=dev"]);
    let said = lanefs_fuse::stats::read_transport(&m.mp).unwrap();
    assert_eq!(said, "/dev/fuse (asked for with -o transport=dev)");
    m.umount();
    let m = Mounted::daemon(&img, &mp, &["-o", "transport=uring"]);
    let said = lanefs_fuse::stats::read_transport(&m.mp).unwrap();
    let switch = fs::read_to_string("/sys/module/fuse/parameters/enable_uring").ok();
    match switch.as_deref().map(str::trim) {
        Some("Y") => assert!(said.starts_with("io_uring ("), "{said}"),
        Some(_) => assert!(said.contains("echo Y > /sys/module/fuse/parameters/enable_uring"), "{said}"),
        None => assert!(said.contains("no FUSE over io_uring"), "{said}"),
    }
    // Requests are served either way (the ring workers serve all but FORGET and INTERRUPT).
    fs::write(m.mp.join("f"), b"ring").unwrap();
    assert_eq!(fs::read(m.mp.join("f")).unwrap(), b"ring");
    m.umount();
}

/// The names of directory `d` as getdents gives them, "." and ".." included, with their inode
/// numbers.
fn listing(d: &Path) -> BTreeMap<String, u64> {
    let fd = rustix::fs::open(
        d,
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let mut dir = rustix::fs::Dir::read_from(&fd).unwrap();
    let mut out = BTreeMap::new();
    // Bounded by the directory's size: getdents ends.
    while let Some(e) = dir.read() {
        let e = e.unwrap();
        out.insert(e.file_name().to_string_lossy().into_owned(), e.ino());
    }
    out
}

/// The kernel keeps a directory's listing (FOPEN_CACHE_DIR): listing an unchanged directory
/// again asks the daemon for no entries, only to open and close it, and every change shows at
/// once: a new name, a removed one, and the new ".." of a directory moved to another parent.
/// The access time still moves (`strictatime`: at every listing).
#[test]
fn directory_listings_are_kept_by_the_kernel_and_changes_still_show() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &["-o", "strictatime"]);
    let d = m.mp.join("d");
    fs::create_dir(&d).unwrap();
    for i in 0..300 {
        File::create(d.join(format!("f{i}"))).unwrap();
    }
    let entries =
        |c: &BTreeMap<String, u64>| c.get("READDIR").unwrap_or(&0) + c.get("READDIRPLUS").unwrap_or(&0);
    let mut want = listing(&d);
    assert_eq!(want.len(), 302, "300 files, . and ..");
    let again = served(&m.mp, || assert_eq!(listing(&d), want));
    assert_eq!(entries(&again), 0, "an unchanged directory is listed from the kernel's copy: {again:?}");
    // (rustix's `Dir` opens the directory again through its descriptor: two OPENDIRs.)
    let only = ["OPENDIR", "RELEASEDIR", "GETATTR"];
    assert!(again.keys().all(|k| only.contains(&k.as_str())), "only opened and closed: {again:?}");
    let before = fs::metadata(&d).unwrap().accessed().unwrap();
    tick();
    listing(&d);
    assert!(
        fs::metadata(&d).unwrap().accessed().unwrap() > before,
        "a listing from the kernel's copy is an access"
    );

    let f = File::create(d.join("new")).unwrap();
    want.insert("new".into(), f.metadata().unwrap().ino());
    drop(f);
    let changed = served(&m.mp, || assert_eq!(listing(&d), want));
    assert!(entries(&changed) > 0, "a change drops the kernel's copy: {changed:?}");
    fs::remove_file(d.join("f7")).unwrap();
    want.remove("f7");
    assert_eq!(listing(&d), want);

    // A directory moved to another parent: its ".." is the new parent.
    let (a, b) = (m.mp.join("a"), m.mp.join("b"));
    fs::create_dir_all(a.join("sub")).unwrap();
    fs::create_dir(&b).unwrap();
    let (ia, ib) = (fs::metadata(&a).unwrap().ino(), fs::metadata(&b).unwrap().ino());
    assert_eq!(listing(&a.join("sub"))[".."], ia);
    assert_eq!(listing(&a.join("sub"))[".."], ia);
    fs::rename(a.join("sub"), b.join("sub")).unwrap();
    assert_eq!(listing(&b.join("sub"))[".."], ib, "the moved directory's .. is its new parent");
    // Exchanged across parents, both.
    fs::create_dir(a.join("x")).unwrap();
    assert_eq!(listing(&a.join("x"))[".."], ia);
    assert_eq!(listing(&b.join("sub"))[".."], ib);
    rustix::fs::renameat_with(
        rustix::fs::CWD,
        a.join("x"),
        rustix::fs::CWD,
        b.join("sub"),
        rustix::fs::RenameFlags::EXCHANGE,
    )
    .unwrap();
    assert_eq!(listing(&a.join("x"))[".."], ia, "now the former sub, moved back under a");
    assert_eq!(listing(&b.join("sub"))[".."], ib, "now the former x, moved under b");
    m.umount();
    fsck_clean(&img);
}
