//! open(2) with O_TMPFILE through a mount (FUSE_TMPFILE): a file with no name that linkat(2)
//! names through /proc/self/fd, and that O_EXCL keeps from ever being named. Needs root,
//! /dev/fuse and fusermount3, as every FUSE test; without them it fails.

mod common;

use common::*;
use rustix::fs::{AtFlags, Mode, OFlags, CWD};
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

/// open(dir, O_TMPFILE | flags, 0600).
fn open_tmpfile(dir: &Path, flags: OFlags) -> std::io::Result<File> {
    let fd = rustix::fs::open(dir, OFlags::TMPFILE | flags | OFlags::CLOEXEC, Mode::from_raw_mode(0o600))?;
    Ok(File::from(fd))
}

/// linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, to, AT_SYMLINK_FOLLOW): how a process names
/// an O_TMPFILE file without CAP_DAC_READ_SEARCH.
fn link_fd(f: &File, to: &Path) -> std::io::Result<()> {
    let from = format!("/proc/self/fd/{}", f.as_raw_fd());
    Ok(rustix::fs::linkat(CWD, from.as_str(), CWD, to, AtFlags::SYMLINK_FOLLOW)?)
}

fn tmpfile_requests(mp: &Path) -> u64 {
    lanefs_fuse::stats::read(mp).unwrap().into_iter().find(|(k, _)| k == "TMPFILE").map_or(0, |(_, n)| n)
}

#[test]
fn o_tmpfile_is_named_by_linkat_and_o_excl_keeps_it_unnamed() {
    assert!(fuse_available(), "FUSE tests need root, /dev/fuse and fusermount3");
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    let d = m.mp.join("d");
    fs::create_dir(&d).unwrap();
    let before = tmpfile_requests(&m.mp);

    let f = open_tmpfile(&d, OFlags::RDWR).expect("open O_TMPFILE");
    assert_eq!(tmpfile_requests(&m.mp), before + 1, "the kernel sent FUSE_TMPFILE");
    let want = data(7, 300_000);
    f.write_all_at(&want, 0).unwrap();
    f.sync_all().unwrap();
    let st = f.metadata().unwrap();
    assert_eq!((st.nlink(), st.len(), st.mode() & 0o7777), (0, want.len() as u64, 0o600));
    assert_eq!(fs::read_dir(&d).unwrap().count(), 0, "no name before the link");
    let mut got = vec![0u8; want.len()];
    f.read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, want);
    link_fd(&f, &d.join("named")).expect("linkat of an O_TMPFILE file");
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    f.sync_all().unwrap();
    assert_eq!(fs::read(d.join("named")).unwrap(), want);
    assert_eq!(fs::metadata(d.join("named")).unwrap().ino(), st.ino());
    drop(f);

    // O_EXCL: the kernel refuses the link (no I_LINKABLE), whatever the server would do.
    let x = open_tmpfile(&d, OFlags::RDWR | OFlags::EXCL).expect("open O_TMPFILE | O_EXCL");
    x.write_all_at(b"never named", 0).unwrap();
    let e = link_fd(&x, &d.join("excl")).expect_err("O_EXCL makes it unlinkable");
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    assert!(!d.join("excl").exists());
    // Never linked, closed: gone.
    let ino = x.metadata().unwrap().ino();
    drop(x);
    let names: Vec<_> = fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["named"]);

    // In a set-group-ID directory it takes the directory's group, as a create does.
    let g = m.mp.join("g");
    fs::create_dir(&g).unwrap();
    std::os::unix::fs::chown(&g, None, Some(4321)).unwrap();
    fs::set_permissions(&g, std::os::unix::fs::PermissionsExt::from_mode(0o2777)).unwrap();
    let t = open_tmpfile(&g, OFlags::RDWR).unwrap();
    assert_eq!(t.metadata().unwrap().gid(), 4321);
    link_fd(&t, &g.join("t")).unwrap();
    drop(t);
    assert_eq!(fs::metadata(g.join("t")).unwrap().gid(), 4321);

    m.umount();
    fsck_clean_when(&img, "after the unmount");
    let m = Mounted::daemon(&img, &mp, &[]);
    assert_eq!(fs::read(m.mp.join("d/named")).unwrap(), want);
    let names: Vec<_> = fs::read_dir(m.mp.join("d")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["named"]);
    assert!(walk_inos(&m.mp).iter().all(|&i| i != ino), "the O_EXCL file's inode {ino} is reachable");
    m.umount();
    fsck_clean_when(&img, "after the remount");
}

fn walk_inos(dir: &Path) -> Vec<u64> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let md = e.metadata().unwrap();
        out.push(md.ino());
        if md.is_dir() {
            out.extend(walk_inos(&e.path()));
        }
    }
    out
}
