//! Attributes and durability through a lanefs mount: O_SYNC direct writes, thousands of xattrs
//! and 64 KiB values across a remount, the atime options the daemon applies, and fallocate.
//! Each needs root, /dev/fuse and fusermount3.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

#[test]
fn o_sync_direct_writes_are_durable_once_acknowledged() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &["-o", "checkpoint_secs=0"]);
    // The kernel sends no FSYNC after a direct-I/O write, O_SYNC or not (generic/737): the
    // daemon makes each one durable before it answers. O_DSYNC too, and with a new name.
    let mut expect = Vec::new();
    for (name, flag) in [("osync", libc::O_SYNC), ("odsync", libc::O_DSYNC)] {
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | flag)
            .open(m.mp.join(name))
            .unwrap();
        let mut buf = AlignedBuf::new(1 << 20);
        buf.as_mut().copy_from_slice(&data(11, 1 << 20));
        f.write_all_at(buf.as_ref(), 0).unwrap();
        expect.push((name, buf.as_ref().to_vec()));
    }
    let mut flags = ioctls::NOLOGFLUSH;
    ioctl_on(&m.mp, ioctls::GOINGDOWN, &mut flags).unwrap();
    m.umount();
    let m = Mounted::daemon(&img, &mp, &[]);
    for (name, want) in expect {
        assert!(fs::read(m.mp.join(name)).unwrap() == want, "{name}: not durable when its write returned");
    }
    m.umount();
    fsck_clean(&img);
}

/// The value of xattr `i` in the xattr test: eight of 64 KiB (the kernel's XATTR_SIZE_MAX),
/// the rest from empty to a few KiB.
fn xattr_value(i: usize, round: u64) -> Vec<u8> {
    let len = if i % 250 == 7 { 65_536 } else { [0, 3, 16, 90, 700, 2500][i % 6] };
    data(round * 100_000 + i as u64, len)
}

/// Every (name, value) of `p` through listxattr(2) and getxattr(2), with the size probes a
/// program makes: a call with no buffer for the length, then a buffer of exactly that size (and
/// one byte less, which must be ERANGE).
fn xattrs_probed(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let size = rustix::fs::listxattr_query(p).expect("listxattr size");
    let mut names = vec![0u8; size];
    if size > 0 {
        let mut short = vec![0u8; size - 1];
        assert_eq!(rustix::fs::listxattr(p, &mut short), Err(rustix::io::Errno::RANGE), "short list buffer");
    }
    assert_eq!(rustix::fs::listxattr(p, &mut names).expect("listxattr"), size);
    names
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|name| {
            let name = String::from_utf8(name.to_vec()).unwrap();
            let len = rustix::fs::getxattr_query(p, name.as_str()).expect("getxattr size");
            let mut v = vec![0u8; len];
            if len > 0 {
                let mut short = vec![0u8; len - 1];
                assert_eq!(rustix::fs::getxattr(p, name.as_str(), &mut short), Err(rustix::io::Errno::RANGE));
            }
            assert_eq!(rustix::fs::getxattr(p, name.as_str(), &mut v).expect("getxattr"), len);
            (name, v)
        })
        .collect()
}

/// Compares two xattr sets, naming the first difference (never printing megabytes of values).
fn same_xattrs(got: &BTreeMap<String, Vec<u8>>, want: &BTreeMap<String, Vec<u8>>, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: number of xattrs");
    for ((gn, gv), (wn, wv)) in got.iter().zip(want) {
        assert_eq!(gn, wn, "{what}: names");
        assert!(gv == wv, "{what}: {gn} holds {} bytes, want {} (or other bytes)", gv.len(), wv.len());
    }
}

#[test]
fn two_thousand_xattrs_and_64k_values_through_the_mount_survive_remount() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    let f = m.mp.join("f");
    fs::write(&f, b"data").unwrap();
    let d = m.mp.join("d");
    fs::create_dir(&d).unwrap();
    let mut want: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for i in 0..2000 {
        let (name, v) = (format!("user.attribute_{i:04}"), xattr_value(i, 0));
        rustix::fs::setxattr(&f, name.as_str(), &v, rustix::fs::XattrFlags::CREATE).unwrap();
        want.insert(name, v);
    }
    assert_eq!(want.values().filter(|v| v.len() == 65_536).count(), 8);
    for i in 0..200 {
        rustix::fs::setxattr(
            &d,
            format!("user.dir_{i}").as_str(),
            &xattr_value(i, 5),
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
    }
    // What the kernel and lanefs answer at the edges.
    let too_big = vec![0u8; 65_537];
    assert_eq!(
        rustix::fs::setxattr(&f, "user.too_big", &too_big, rustix::fs::XattrFlags::empty()),
        Err(rustix::io::Errno::TOOBIG)
    );
    assert_eq!(
        rustix::fs::setxattr(&f, "user.attribute_0001", b"x", rustix::fs::XattrFlags::CREATE),
        Err(rustix::io::Errno::EXIST)
    );
    assert_eq!(
        rustix::fs::setxattr(&f, "user.none", b"x", rustix::fs::XattrFlags::REPLACE),
        Err(rustix::io::Errno::NODATA)
    );
    same_xattrs(&xattrs_probed(&f), &want, "after setting");
    // Replace a third (with other sizes), remove a quarter, fsync.
    for i in (0..2000).step_by(3) {
        let (name, v) = (format!("user.attribute_{i:04}"), xattr_value(i + 1, 1));
        rustix::fs::setxattr(&f, name.as_str(), &v, rustix::fs::XattrFlags::REPLACE).unwrap();
        want.insert(name, v);
    }
    for i in (1..2000).step_by(4) {
        let name = format!("user.attribute_{i:04}");
        rustix::fs::removexattr(&f, name.as_str()).unwrap();
        want.remove(&name);
    }
    File::open(&f).unwrap().sync_all().unwrap();
    same_xattrs(&xattrs_probed(&f), &want, "after changes");
    m.umount();
    fsck_clean(&img);
    let (code, out, err) = lanefs(&[os("inspect"), img.as_os_str()]);
    assert_eq!(code, Some(0), "inspect: {err}");
    let line = out.lines().find(|l| l.starts_with("valid blocks")).expect("inspect shows the blocks by kind");
    let xattr_blocks: u64 =
        line.split(", ").find_map(|w| w.strip_suffix(" xattr")?.parse().ok()).expect(line);
    assert!(xattr_blocks > 100, "the set's stream lives in xattr blocks: {line}");

    let m = Mounted::daemon(&img, &mp, &[]);
    let f = m.mp.join("f");
    same_xattrs(&xattrs_probed(&f), &want, "after remount");
    assert_eq!(xattrs_probed(&m.mp.join("d")).len(), 200);
    assert_eq!(fs::read(&f).unwrap(), b"data");
    fs::remove_file(&f).unwrap();
    m.umount();
    fsck_clean(&img);
}

/// The mount's line in /proc/self/mounts (per-mount and superblock options together).
fn proc_mounts_options(mp: &Path) -> Vec<String> {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let want = mp.to_str().unwrap();
    let line =
        mounts.lines().rev().find(|l| l.split(' ').nth(1) == Some(want)).expect("in /proc/self/mounts");
    line.split(' ').nth(3).unwrap().split(',').map(String::from).collect()
}

fn atime_of(p: &Path) -> std::time::SystemTime {
    fs::metadata(p).unwrap().accessed().unwrap()
}

/// Sets `p`'s atime and mtime long ago (its ctime becomes now).
fn age(p: &Path) {
    let old = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let f = File::options().write(true).open(p).unwrap();
    f.set_times(fs::FileTimes::new().set_accessed(old).set_modified(old)).unwrap();
}

/// fstests generic/003 in short: the kernel keeps no atime for a FUSE file system, so the
/// daemon applies the mount's atime options on reads and listings, and the mount table shows
/// the options as it does for a kernel file system's mount.
#[test]
fn atime_options_are_applied_by_the_daemon_and_shown_in_the_mount_table() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    let opts = proc_mounts_options(&m.mp);
    assert!(opts.iter().any(|o| o == "relatime"), "relatime by default: {opts:?}");
    let (f, d) = (m.mp.join("f"), m.mp.join("d"));
    fs::write(&f, b"aaa").unwrap();
    fs::create_dir(&d).unwrap();
    age(&f);
    tick();
    fs::read(&f).unwrap();
    let a1 = atime_of(&f);
    assert!(a1 > std::time::UNIX_EPOCH + Duration::from_secs(1_000_000), "relatime: first read updates");
    tick();
    fs::read(&f).unwrap();
    assert_eq!(atime_of(&f), a1, "relatime: no change since the last read, no update");
    m.umount();
    assert_eq!(
        Mounted::daemon(&img, &mp, &["-o", "ro"]).mp.join("f").metadata().unwrap().accessed().unwrap(),
        a1,
        "the update is durable"
    );
    run(&[os("umount"), mp.as_os_str()], Duration::from_secs(60));

    let m = Mounted::daemon(&img, &mp, &["-o", "strictatime,nodiratime,lazytime"]);
    let opts = proc_mounts_options(&m.mp);
    assert!(!opts.iter().any(|o| o == "relatime" || o == "noatime"), "strictatime: {opts:?}");
    assert!(opts.iter().any(|o| o == "nodiratime") && opts.iter().any(|o| o == "lazytime"), "{opts:?}");
    tick();
    fs::read(&f).unwrap();
    let a2 = atime_of(&f);
    tick();
    fs::read(&f).unwrap();
    let a3 = atime_of(&f);
    assert!(a1 < a2 && a2 < a3, "strictatime: every read updates ({a1:?} {a2:?} {a3:?})");
    let d0 = atime_of(&d);
    tick();
    fs::read_dir(&d).unwrap().for_each(drop);
    assert_eq!(atime_of(&d), d0, "nodiratime");
    m.umount();

    let m = Mounted::daemon(&img, &mp, &["-o", "noatime"]);
    assert!(proc_mounts_options(&m.mp).iter().any(|o| o == "noatime"));
    assert_eq!(atime_of(&f), a3, "lazytime: written out at unmount");
    age(&f);
    let old = atime_of(&f);
    tick();
    fs::read(&f).unwrap();
    fs::read_dir(&d).unwrap().for_each(drop);
    assert_eq!(atime_of(&f), old, "noatime");
    m.umount();
    fsck_clean(&img);
}

/// fallocate through the mount. Zero range (with and without KEEP_SIZE, partial pages, past the
/// end) zeroes the bytes, pages the kernel has cached included, and keeps them allocated;
/// collapse, insert and unshare give EOPNOTSUPP. Preallocation beyond the free space is ENOSPC
/// with nothing changed, and a preallocated range stays writable after another file fills the
/// file system. Everything holds after a remount, and fsck finds the image clean.
#[test]
fn fallocate_reserves_space_and_zero_range_zeroes_through_the_mount() {
    use rustix::fs::{fallocate, FallocateFlags as F};
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    mkfs_sized(&img, "256M");
    let m = Mounted::daemon(&img, &mp, &[]);
    let open = |name: &str| {
        OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.mp.join(name)).unwrap()
    };
    let read_all = |name: &str| fs::read(m.mp.join(name)).unwrap();
    let free = || {
        let s = rustix::fs::statvfs(&m.mp).unwrap();
        s.f_bavail * s.f_frsize
    };

    // Zero range on a file whose pages the kernel has cached (read just before).
    let z = open("z");
    let mut model = data(1, 40_960);
    z.write_all_at(&model, 0).unwrap();
    z.sync_all().unwrap();
    assert_eq!(read_all("z"), model);
    fallocate(&z, F::ZERO_RANGE, 5000, 10_000).unwrap();
    model[5000..15_000].fill(0);
    assert_eq!(read_all("z"), model, "zero range within the size");
    fallocate(&z, F::ZERO_RANGE | F::KEEP_SIZE, 40_000, 20_000).unwrap();
    model[40_000..].fill(0);
    let md = z.metadata().unwrap();
    assert_eq!(md.len(), 40_960, "KEEP_SIZE keeps the size");
    assert!(md.blocks() >= 60_000 / 512, "zero range past the end allocates ({} sectors)", md.blocks());
    assert_eq!(read_all("z"), model);
    fallocate(&z, F::ZERO_RANGE, 70_000, 5_000).unwrap();
    model.resize(75_000, 0);
    assert_eq!(z.metadata().unwrap().len(), 75_000, "zero range past the end grows the file");
    assert_eq!(read_all("z"), model);
    z.write_all_at(b"after", 9000).unwrap();
    model[9000..9005].copy_from_slice(b"after");
    assert_eq!(read_all("z"), model, "a write into zeroed blocks");
    for (mode, name) in
        [(F::COLLAPSE_RANGE, "collapse"), (F::INSERT_RANGE, "insert"), (F::UNSHARE_RANGE, "unshare")]
    {
        assert_eq!(fallocate(&z, mode, 0, 4096), Err(rustix::io::Errno::OPNOTSUPP), "{name}");
    }
    assert_eq!(read_all("z"), model);

    // Preallocation: beyond the free space, then within it.
    let f = open("f");
    let before = free();
    assert_eq!(fallocate(&f, F::empty(), 0, before + (16 << 20)), Err(rustix::io::Errno::NOSPC));
    let md = f.metadata().unwrap();
    assert_eq!((md.len(), md.blocks()), (0, 0), "ENOSPC changed the file");
    let len = 16u64 << 20;
    // (Free space grows a little whenever a checkpoint retires what dirty inodes may need.)
    let before = free();
    fallocate(&f, F::KEEP_SIZE, 0, len).unwrap();
    let md = f.metadata().unwrap();
    assert_eq!(md.len(), 0);
    assert!(md.blocks() >= len / 512);
    let after = free();
    assert!(
        after + len <= before + (1 << 20),
        "statfs counts the preallocation as free: {before} -> {after}"
    );
    // Another file takes everything else.
    let g = open("g");
    let chunk = data(2, 1 << 20);
    let mut off = 0u64;
    // With `-o writeback_cache` a write(2) only fills the kernel's page cache and ENOSPC comes
    // when the pages are written back, at the latest from fsync: this holds in both modes.
    let full = loop {
        if let Err(e) = g.write_all_at(&chunk, off).and_then(|()| g.sync_data()) {
            break e;
        }
        off += chunk.len() as u64;
        assert!(off < 1 << 30, "the file system never filled");
    };
    assert_eq!(full.raw_os_error(), Some(libc::ENOSPC), "filling g: {full}");
    assert!(off > 100 << 20, "only {off} bytes fit beside the preallocation");
    let h = open("h");
    assert_eq!(fallocate(&h, F::empty(), 0, 1 << 20), Err(rustix::io::Errno::NOSPC));
    // The preallocated range is still writable.
    let want = data(3, len as usize);
    for (k, piece) in want.chunks(1 << 20).enumerate() {
        f.write_all_at(piece, (k as u64) << 20)
            .unwrap_or_else(|e| panic!("write into the preallocation at {k} MiB: {e}"));
    }
    f.sync_all().unwrap();
    assert!(read_all("f") == want, "f reads back what was written into its preallocation");
    drop((z, f, g, h));
    umount_settled(m);
    fsck_clean(&img);
    let m = Mounted::daemon(&img, &mp, &[]);
    assert_eq!(fs::read(m.mp.join("z")).unwrap(), model, "z after remount");
    assert!(fs::read(m.mp.join("f")).unwrap() == want, "f after remount");
    umount_settled(m);
    fsck_clean(&img);
}

/// statx's birth time comes through the mount (FUSE_STATX): set when the inode is made, kept
/// by later writes and renames, and the same after a remount.
#[test]
fn statx_gives_the_birth_time_through_the_mount() {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    if !fuse_available() {
        return;
    }
    let btime = |p: &Path| {
        let x =
            statx(rustix::fs::CWD, p, AtFlags::empty(), StatxFlags::BASIC_STATS | StatxFlags::BTIME).unwrap();
        assert!(
            StatxFlags::from_bits_retain(x.stx_mask).contains(StatxFlags::BTIME),
            "no birth time in {:#x}",
            x.stx_mask
        );
        (x.stx_btime.tv_sec, x.stx_btime.tv_nsec)
    };
    let (_dir, img, mp) = scratch_image();
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let m = Mounted::daemon(&img, &mp, &[]);
    fs::write(m.mp.join("f"), b"one").unwrap();
    let born = btime(&m.mp.join("f"));
    assert!(born.0 >= before - 1 && born.0 <= before + 60, "birth time {born:?}, mounted at {before}");
    std::thread::sleep(Duration::from_millis(20));
    fs::write(m.mp.join("f"), b"two").unwrap();
    fs::rename(m.mp.join("f"), m.mp.join("g")).unwrap();
    assert_eq!(btime(&m.mp.join("g")), born, "a write and a rename keep the birth time");
    let mtime = fs::metadata(m.mp.join("g")).unwrap().mtime_nsec();
    assert!(mtime != born.1 as i64 || fs::metadata(m.mp.join("g")).unwrap().mtime() != born.0);
    m.umount();
    let m = Mounted::daemon(&img, &mp, &[]);
    assert_eq!(btime(&m.mp.join("g")), born, "the birth time after a remount");
    m.umount();
}

/// The engine's checkpoint count, from the mount's root.
fn checkpoints(m: &Mounted) -> u64 {
    lanefs_fuse::stats::read_engine(&m.mp).unwrap().get("checkpoints").unwrap()
}

/// Waits (boundedly) until `n` more checkpoints than `since` have run.
fn wait_checkpoints(m: &Mounted, since: u64, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while checkpoints(m) < since + n {
        assert!(std::time::Instant::now() < deadline, "no checkpoint in 60 s with checkpoint_secs=1");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An inode the kernel holds outlives its name and its open files, as on ext4: through an
/// `O_PATH` descriptor (which opens nothing in the engine) it can be stat'ed and its times set
/// after checkpoints, and the mount's syncfs(2) then succeeds. The kernel's lookup count keeps
/// it (`Fs::remember`); before, a checkpoint deleted it, the kernel's request got ENOENT, and the
/// kernel kept that as a writeback error that the next syncfs reported (what the kernel's own
/// SETATTR of the ctime after an unlink met when a checkpoint came between the two).
#[test]
fn an_unlinked_inode_the_kernel_holds_survives_checkpoints_and_syncfs_succeeds() {
    use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags, Timespec, Timestamps};
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &["-o", "checkpoint_secs=1"]);
    let p = m.mp.join("f");
    fs::write(&p, b"twelve bytes").unwrap();
    let held = rustix::fs::open(&p, OFlags::PATH, Mode::empty()).unwrap();
    fs::remove_file(&p).unwrap();
    let before = checkpoints(&m);
    // Two: the first may have begun before the unlink.
    wait_checkpoints(&m, before, 2);
    let st = rustix::fs::statx(
        &held,
        "",
        AtFlags::EMPTY_PATH | AtFlags::STATX_FORCE_SYNC,
        StatxFlags::BASIC_STATS,
    )
    .expect("stat of the held inode after checkpoints");
    assert_eq!((st.stx_nlink, st.stx_size), (0, 12));
    let t = Timespec { tv_sec: 1_600_000_000, tv_nsec: 0 };
    rustix::fs::utimensat(
        &held,
        "",
        &Timestamps { last_access: t, last_modification: t },
        AtFlags::EMPTY_PATH,
    )
    .expect("times of the held inode");
    let root = File::open(&m.mp).unwrap();
    rustix::fs::syncfs(&root).expect("syncfs after requests for the held inode");
    drop(held);
    // The kernel forgets the inode once the descriptor goes: the next checkpoint deletes it.
    let before = checkpoints(&m);
    wait_checkpoints(&m, before, 2);
    rustix::fs::syncfs(&root).expect("syncfs after the inode went");
    drop(root);
    m.umount();
    use lanefs::device::{DeviceOptions, FileDevice};
    let info = lanefs::inspect(&FileDevice::open_read_only(&img, DeviceOptions::default()).unwrap()).unwrap();
    assert_eq!(info.orphans, 0, "the held inode was deleted: {info:?}");
    fsck_clean(&img);
}
