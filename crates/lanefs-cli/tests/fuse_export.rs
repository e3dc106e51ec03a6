//! File handles, RENAME_WHITEOUT and idmapped mounts through a real FUSE mount.
//!
//! - `name_to_handle_at` / `open_by_handle_at` (FUSE_EXPORT_SUPPORT): handles open their files
//!   with the kernel's inode cache dropped (so the kernel asks the daemon for "." of the node
//!   and ".." of its parent), again after an unmount and mount, and give ESTALE once their
//!   inode is removed, also when its number belongs to a new file by then.
//! - renameat2 with RENAME_WHITEOUT: the source becomes a character device 0:0 owned by the
//!   caller (the group of a set-group-ID directory), with the errors of ext4, and stays after a
//!   remount.
//! - An idmapped mount (FUSE_ALLOW_IDMAP, negotiated with `allow_other`): files created
//!   through it are owned by the mapped ids, a chown through it stores mapped ids, and stat
//!   through it shows them mapped back.
//!
//! The three system calls that have no safe wrapper (the handle calls and the mount API's
//! open_tree / mount_setattr / move_mount) live in the `sys` module below. Every test needs
//! root, /dev/fuse and fusermount3 (see `fuse_available`).

mod common;

use common::*;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The system calls these tests need that neither std nor rustix wraps: the only module of
/// the tests that exists for unsafe, and the only one allowed it.
#[allow(unsafe_code)]
mod sys {
    use std::ffi::CString;
    use std::fs::File;
    use std::io;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    /// MAX_HANDLE_SZ in the kernel.
    const MAX_HANDLE: usize = 128;

    /// A file handle as name_to_handle_at gives it: `struct file_handle` (handle_bytes u32,
    /// handle_type i32) followed by the opaque bytes. Kept as u32 words so that the struct is
    /// aligned.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Handle(Vec<u32>);

    impl Handle {
        /// The opaque bytes (FUSE: node id high and low words, then the generation).
        pub fn words(&self) -> &[u32] {
            let n = self.0[0] as usize / 4;
            &self.0[2..2 + n]
        }
    }

    fn cpath(p: &Path) -> CString {
        CString::new(p.as_os_str().as_bytes()).expect("no NUL in test paths")
    }

    /// name_to_handle_at(AT_FDCWD, path, .., flags).
    pub fn name_to_handle(path: &Path, flags: i32) -> io::Result<Handle> {
        let mut buf = vec![0u32; 2 + MAX_HANDLE / 4];
        buf[0] = MAX_HANDLE as u32;
        let mut mount_id: libc::c_int = 0;
        let p = cpath(path);
        // SAFETY: `buf` is a u32-aligned buffer of 8 + MAX_HANDLE bytes, laid out as struct
        // file_handle whose handle_bytes says MAX_HANDLE bytes follow it; `p` is a valid C
        // string and `mount_id` a valid int, both living across the call.
        let r = unsafe {
            libc::name_to_handle_at(
                libc::AT_FDCWD,
                p.as_ptr(),
                buf.as_mut_ptr().cast::<libc::file_handle>(),
                &mut mount_id,
                flags,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Handle(buf))
    }

    /// open_by_handle_at(mount_fd, handle, flags).
    pub fn open_by_handle(mount: &File, h: &Handle, flags: i32) -> io::Result<File> {
        use std::os::fd::AsRawFd;
        let mut buf = h.0.clone();
        // SAFETY: `buf` is a copy of a handle name_to_handle_at filled (struct file_handle and
        // handle_bytes of data, u32-aligned); the kernel only reads it. The returned
        // descriptor, if any, is new and owned by nobody else.
        let fd = unsafe {
            libc::open_by_handle_at(mount.as_raw_fd(), buf.as_mut_ptr().cast::<libc::file_handle>(), flags)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by the kernel and is not owned elsewhere.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

    /// `struct mount_attr` of mount_setattr(2).
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }

    /// Mounts a copy of the mount at `src` on `target`, idmapped through the user namespace
    /// `userns` (open_tree, mount_setattr with MOUNT_ATTR_IDMAP, move_mount).
    pub fn mount_idmapped(src: &Path, target: &Path, userns: &File) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let (s, t, empty) = (cpath(src), cpath(target), CString::new("").expect("empty"));
        // SAFETY: open_tree reads the C string `s` and returns a new descriptor or -1.
        let tree = unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                s.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
            )
        };
        if tree < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `tree` is the descriptor just returned, owned by nobody else.
        let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.as_raw_fd() as u64,
        };
        // SAFETY: `attr` is a valid struct mount_attr of the size passed, `empty` a valid C
        // string; the kernel only reads them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_EMPTY_PATH,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both paths are valid C strings; the kernel only reads them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_FDCWD,
                t.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

use sys::{mount_idmapped, name_to_handle, open_by_handle, Handle};

/// AT_HANDLE_CONNECTABLE: a handle that also names the parent (the kernel reconnects the
/// file's dentry through LOOKUP ".." of it).
const AT_HANDLE_CONNECTABLE: i32 = 0x002;

/// Drops the kernel's unused dentries and inodes, so that a handle's inode is not found in its
/// cache and the kernel must ask the daemon.
fn drop_inode_cache() {
    fs::write("/proc/sys/vm/drop_caches", "2").expect("drop_caches (needs root)");
}

fn data(i: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|k| (k.wrapping_mul(31).wrapping_add(i * 7919) % 251) as u8).collect()
}

fn mount_fd(m: &Mounted) -> File {
    File::open(&m.mp).unwrap()
}

fn read_handle(m: &File, h: &Handle) -> io::Result<Vec<u8>> {
    let mut f = open_by_handle(m, h, libc::O_RDONLY)?;
    let mut v = Vec::new();
    io::Read::read_to_end(&mut f, &mut v)?;
    Ok(v)
}

fn is_estale<T: std::fmt::Debug>(r: io::Result<T>) -> bool {
    match r {
        Err(e) => e.raw_os_error() == Some(libc::ESTALE),
        Ok(v) => panic!("opened by a stale handle: {v:?}"),
    }
}

#[test]
fn file_handles_open_their_files_across_a_remount_and_go_stale_with_their_inode() {
    if !fuse_available() {
        return;
    }
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    let d = m.mp.join("d");
    fs::create_dir(&d).unwrap();
    let mut handles = Vec::new();
    for i in 0..8u64 {
        let p = d.join(format!("f{i}"));
        fs::write(&p, data(i, 5000 + i as usize * 999)).unwrap();
        let h = name_to_handle(&p, 0).unwrap();
        // FUSE's handle: node id (high, low) and generation; the node id is the inode number.
        let ino = fs::metadata(&p).unwrap().ino();
        assert_eq!(((h.words()[0] as u64) << 32) | h.words()[1] as u64, ino, "{h:?}");
        assert_ne!(h.words()[2], 0, "a new file has generation 0");
        handles.push((i, p, h));
    }
    let dir_handle = name_to_handle(&d, 0).unwrap();
    let connectable = name_to_handle(&d.join("f0"), AT_HANDLE_CONNECTABLE).unwrap();
    assert_eq!(connectable.words().len(), 6, "a connectable handle names the parent too: {connectable:?}");
    let check_all = |m: &Mounted| {
        let mfd = mount_fd(m);
        drop_inode_cache();
        for (i, p, h) in &handles {
            if p.exists() {
                assert_eq!(
                    read_handle(&mfd, h).unwrap(),
                    data(*i, 5000 + *i as usize * 999),
                    "{}",
                    p.display()
                );
            }
        }
        let df = open_by_handle(&mfd, &dir_handle, libc::O_RDONLY | libc::O_DIRECTORY).unwrap();
        assert_eq!(df.metadata().unwrap().ino(), fs::metadata(m.mp.join("d")).unwrap().ino());
        drop_inode_cache();
        assert_eq!(read_handle(&mfd, &connectable).unwrap(), data(0, 5000));
    };
    check_all(&m);
    m.umount();

    // Node ids and generations are the image's: the handles still work on a new mount.
    let m = Mounted::daemon(&img, &mp, &[]);
    check_all(&m);
    let mfd = mount_fd(&m);
    // Renamed, and moved to another directory: the handle names the inode, not the path.
    fs::create_dir(m.mp.join("e")).unwrap();
    fs::rename(d.join("f2"), m.mp.join("e/moved")).unwrap();
    // Hard-linked, then the first name removed: the inode lives on.
    fs::hard_link(d.join("f3"), m.mp.join("e/link")).unwrap();
    fs::remove_file(d.join("f3")).unwrap();
    // Removed: stale, whether the kernel still caches the inode or has to ask.
    fs::remove_file(d.join("f1")).unwrap();
    assert!(is_estale(read_handle(&mfd, &handles[1].2)));
    drop_inode_cache();
    assert!(is_estale(read_handle(&mfd, &handles[1].2)));
    assert_eq!(read_handle(&mfd, &handles[2].2).unwrap(), data(2, 5000 + 2 * 999));
    assert_eq!(read_handle(&mfd, &handles[3].2).unwrap(), data(3, 5000 + 3 * 999));
    // A removed directory's handle is stale too.
    let gone = m.mp.join("gone");
    fs::create_dir(&gone).unwrap();
    let gh = name_to_handle(&gone, 0).unwrap();
    fs::remove_dir(&gone).unwrap();
    drop_inode_cache();
    assert!(is_estale(open_by_handle(&mfd, &gh, libc::O_RDONLY | libc::O_DIRECTORY)));
    drop(mfd);
    umount_settled(m);
    // After a remount, a removed file's handle is still stale, the others still open.
    let m = Mounted::daemon(&img, &mp, &[]);
    let mfd = mount_fd(&m);
    drop_inode_cache();
    assert!(is_estale(read_handle(&mfd, &handles[1].2)));
    assert_eq!(read_handle(&mfd, &handles[2].2).unwrap(), data(2, 5000 + 2 * 999));
    drop(mfd);
    umount_settled(m);
    fsck_clean(&img);
}

#[test]
fn a_handle_to_a_removed_file_is_stale_once_its_inode_number_is_reused() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("small.img");
    let mp = dir.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    // A small image: few inode numbers, so they come around again soon.
    mkfs_sized(&img, "80M");
    let m = Mounted::daemon(&img, &mp, &[]);
    let victim = m.mp.join("victim");
    fs::write(&victim, b"the old file").unwrap();
    let vh = name_to_handle(&victim, 0).unwrap();
    let vino = fs::metadata(&victim).unwrap().ino();
    fs::remove_file(&victim).unwrap();
    // Create and remove files until one gets the victim's number (ids are freed by the
    // checkpoints that deletions bring about, and handed out again after a lap of the NAT).
    let mut reused = None;
    for i in 0..200_000u32 {
        let p = m.mp.join(format!("n{i}"));
        File::create(&p).unwrap();
        if fs::metadata(&p).unwrap().ino() == vino {
            reused = Some(p);
            break;
        }
        fs::remove_file(&p).unwrap();
    }
    let reused = reused.expect("the victim's inode number was never handed out again");
    fs::write(&reused, b"the new file").unwrap();
    let nh = name_to_handle(&reused, 0).unwrap();
    assert_eq!(nh.words()[..2], vh.words()[..2], "same node id");
    assert_ne!(nh.words()[2], vh.words()[2], "a reused inode number kept its generation");
    let mfd = mount_fd(&m);
    // The new file is in the kernel's cache (just written): the generation tells them apart.
    assert!(is_estale(read_handle(&mfd, &vh)));
    // Not cached: the kernel looks the number up ("."), gets the new generation, says stale.
    drop_inode_cache();
    assert!(is_estale(read_handle(&mfd, &vh)));
    assert_eq!(read_handle(&mfd, &nh).unwrap(), b"the new file");
    drop(mfd);
    umount_settled(m);
    let m = Mounted::daemon(&img, &mp, &[]);
    let mfd = mount_fd(&m);
    drop_inode_cache();
    assert!(is_estale(read_handle(&mfd, &vh)));
    assert_eq!(read_handle(&mfd, &nh).unwrap(), b"the new file");
    drop(mfd);
    umount_settled(m);
    fsck_clean(&img);
}

fn renameat2(from: &Path, to: &Path, flags: rustix::fs::RenameFlags) -> rustix::io::Result<()> {
    rustix::fs::renameat_with(rustix::fs::CWD, from, rustix::fs::CWD, to, flags)
}

#[test]
fn rename_whiteout_leaves_a_character_device_0_0() {
    if !fuse_available() {
        return;
    }
    use rustix::fs::RenameFlags as F;
    let (_dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    let a = m.mp.join("a");
    let b = m.mp.join("b");
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    fs::write(a.join("src"), b"moved").unwrap();
    fs::write(b.join("dst"), b"replaced").unwrap();
    let src_ino = fs::metadata(a.join("src")).unwrap().ino();
    renameat2(&a.join("src"), &b.join("dst"), F::WHITEOUT).unwrap();
    let check = |mp: &Path| {
        let w = fs::symlink_metadata(mp.join("a/src")).unwrap();
        assert!(w.file_type().is_char_device(), "{w:?}");
        assert_eq!((w.rdev(), w.mode() & 0o7777, w.uid(), w.gid(), w.nlink()), (0, 0, 0, 0, 1));
        assert_eq!(fs::metadata(mp.join("b/dst")).unwrap().ino(), src_ino);
        assert_eq!(fs::read(mp.join("b/dst")).unwrap(), b"moved");
    };
    check(&m.mp);
    // The whiteout of a set-group-ID directory takes the directory's group, as any new inode.
    std::os::unix::fs::chown(&b, None, Some(4321)).unwrap();
    fs::set_permissions(&b, fs::Permissions::from_mode(0o2777)).unwrap();
    renameat2(&b.join("dst"), &a.join("back"), F::WHITEOUT).unwrap();
    assert_eq!(fs::symlink_metadata(b.join("dst")).unwrap().gid(), 4321);
    // ext4's errors, and nothing changed by them.
    fs::write(a.join("x"), b"x").unwrap();
    let e = renameat2(&a.join("x"), &a.join("back"), F::WHITEOUT | F::EXCHANGE).unwrap_err();
    assert_eq!(e, rustix::io::Errno::INVAL);
    let e = renameat2(&a.join("x"), &a.join("back"), F::WHITEOUT | F::NOREPLACE).unwrap_err();
    assert_eq!(e, rustix::io::Errno::EXIST);
    assert_eq!(fs::read(a.join("x")).unwrap(), b"x");
    assert_eq!(fs::read(a.join("back")).unwrap(), b"moved");
    // A directory with its contents.
    fs::create_dir(a.join("tree")).unwrap();
    fs::write(a.join("tree/leaf"), b"leaf").unwrap();
    renameat2(&a.join("tree"), &b.join("tree"), F::WHITEOUT).unwrap();
    assert!(fs::symlink_metadata(a.join("tree")).unwrap().file_type().is_char_device());
    assert_eq!(fs::read(b.join("tree/leaf")).unwrap(), b"leaf");
    // The whiteout goes like any file; a rename over a whiteout replaces it.
    fs::remove_file(a.join("tree")).unwrap();
    fs::rename(a.join("x"), b.join("dst")).unwrap();
    umount_settled(m);
    fsck_clean(&img);

    let m = Mounted::daemon(&img, &mp, &[]);
    assert!(fs::symlink_metadata(m.mp.join("a/src")).unwrap().file_type().is_char_device());
    assert_eq!(fs::read(m.mp.join("b/dst")).unwrap(), b"x");
    assert!(!m.mp.join("a/tree").exists());
    assert_eq!(fs::read(m.mp.join("b/tree/leaf")).unwrap(), b"leaf");
    umount_settled(m);
    fsck_clean(&img);
}

/// A user namespace whose uid and gid maps are `map` (lines "inside outside count"): a child
/// `unshare --user` process, killed by its PID when this is dropped.
struct UserNs {
    child: std::process::Child,
    ns: File,
}

impl UserNs {
    fn new(map: &str) -> UserNs {
        let mut child = Command::new("unshare")
            .args(["--user", "sleep", "60"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("unshare (util-linux)");
        let pid = child.id();
        // The child enters its namespace right after it starts: wait until it has one of its own.
        let own = fs::read_link("/proc/self/ns/user").unwrap();
        let start = std::time::Instant::now();
        while fs::read_link(format!("/proc/{pid}/ns/user")).ok().is_none_or(|l| l == own) {
            assert!(start.elapsed() < Duration::from_secs(10), "unshare --user did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        let maps = fs::write(format!("/proc/{pid}/uid_map"), map)
            .and_then(|()| fs::write(format!("/proc/{pid}/setgroups"), "deny"))
            .and_then(|()| fs::write(format!("/proc/{pid}/gid_map"), map));
        if let Err(e) = maps {
            let _ = child.kill();
            let _ = child.wait();
            panic!("writing the maps of user namespace {pid}: {e}");
        }
        let ns = File::open(format!("/proc/{pid}/ns/user")).unwrap();
        UserNs { child, ns }
    }
}

impl Drop for UserNs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Unmounts `target` (an idmapped mount of the test's) by its exact path when dropped.
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0).stderr(Stdio::null()).status();
    }
}

/// Set to "FROM\nTO" for the `whiteout_worker` process.
const WHITEOUT_WORKER: &str = "LANEFS_WHITEOUT_WORKER";

/// Not a test by itself: the process another test starts (as another user) to rename FROM to
/// TO with RENAME_WHITEOUT.
#[test]
fn whiteout_worker() {
    let Ok(spec) = std::env::var(WHITEOUT_WORKER) else { return };
    let (from, to) = spec.split_once('\n').expect("FROM\\nTO");
    renameat2(Path::new(from), Path::new(to), rustix::fs::RenameFlags::WHITEOUT).expect("renameat2");
}

/// Runs `script` with `sh -c` in `dir` as uid and gid `id`.
fn sh_as(id: u32, dir: &Path, script: &str) {
    let st = Command::new("sh").args(["-c", script]).current_dir(dir).uid(id).gid(id).status().unwrap();
    assert!(st.success(), "`{script}` as {id} in {}: {st}", dir.display());
}

#[test]
fn an_idmapped_mount_creates_and_chowns_with_mapped_ids() {
    if !fuse_available() {
        return;
    }
    let (dir, img, mp) = scratch_image();
    // Other users walk through it to the idmapped mount.
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // FUSE_ALLOW_IDMAP is negotiated with allow_other (fuser checks the owner of every
    // request otherwise, and idmapped mounts send no owner with most of them).
    let m = Mounted::daemon(&img, &mp, &["-o", "allow_other"]);
    let src = m.mp.join("src");
    fs::create_dir(&src).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o777)).unwrap();
    let target = dir.path().join("idmapped");
    fs::create_dir(&target).unwrap();
    // File-system ids 1000..1009 appear as 5000..5009 on the idmapped mount; root is root.
    let ns = UserNs::new("0 0 1\n1000 5000 10\n");
    mount_idmapped(&src, &target, &ns.ns).expect("idmapped mount of a lanefs mount");
    let _undo = Unmount(&target);
    // As uid/gid 5001 on the idmapped mount: stored as 1001.
    sh_as(5001, &target, "touch f && mkdir d && ln -s f s && mkfifo p");
    for n in ["f", "d", "s", "p"] {
        let on_disk = fs::symlink_metadata(src.join(n)).unwrap();
        assert_eq!((on_disk.uid(), on_disk.gid()), (1001, 1001), "{n} as stored");
        let seen = fs::symlink_metadata(target.join(n)).unwrap();
        assert_eq!((seen.uid(), seen.gid()), (5001, 5001), "{n} through the idmapped mount");
    }
    // A whiteout made through it (the rename carries the caller's mapped ids) is the
    // caller's too.
    sh_as(5002, &target, "touch w");
    let st = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "whiteout_worker", "--quiet", "--test-threads", "1"])
        .env(WHITEOUT_WORKER, format!("{}\n{}", target.join("w").display(), target.join("w2").display()))
        .uid(5002)
        .gid(5002)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "whiteout rename as uid 5002 through the idmapped mount: {st}");
    let w = fs::symlink_metadata(src.join("w")).unwrap();
    assert!(w.file_type().is_char_device() && w.rdev() == 0, "{w:?}");
    assert_eq!((w.uid(), w.gid()), (1002, 1002), "the whiteout as stored");
    assert_eq!(fs::metadata(src.join("w2")).unwrap().uid(), 1002);
    // chown through the idmapped mount stores the file-system ids.
    std::os::unix::fs::chown(target.join("f"), Some(5003), Some(5004)).unwrap();
    let f = fs::metadata(src.join("f")).unwrap();
    assert_eq!((f.uid(), f.gid()), (1003, 1004));
    assert_eq!(
        (fs::metadata(target.join("f")).unwrap().uid(), fs::metadata(target.join("f")).unwrap().gid()),
        (5003, 5004)
    );
    // Ids with no mapping cannot be stored through it.
    let e = std::os::unix::fs::chown(target.join("f"), Some(7000), None).unwrap_err();
    assert!(matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOVERFLOW)), "{e:?}");
    drop(_undo);
    drop(ns);
    umount_settled(m);
    fsck_clean(&img);
}

#[test]
fn a_mount_without_allow_other_still_serves_every_request() {
    if !fuse_available() {
        return;
    }
    // Without allow_other no idmapping is offered (see the test above): the kernel refuses to
    // idmap the mount, and requests keep their owner, which fuser checks.
    let (dir, img, mp) = scratch_image();
    let m = Mounted::daemon(&img, &mp, &[]);
    let src = m.mp.join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"f").unwrap();
    assert_eq!(fs::read(src.join("f")).unwrap(), b"f");
    let target = dir.path().join("idmapped");
    fs::create_dir(&target).unwrap();
    let ns = UserNs::new("0 0 1\n1000 5000 10\n");
    let r = mount_idmapped(&src, &target, &ns.ns);
    let _undo = Unmount(&target);
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EINVAL));
    drop(_undo);
    drop(ns);
    assert_eq!(fs::read_dir(&src).unwrap().count(), 1);
    umount_settled(m);
    fsck_clean(&img);
}
