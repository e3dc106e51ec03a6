//! The engine against a reference: the same scripted workload runs on lanefs and on a directory
//! of the host file system, and the trees (names, types, sizes, contents, permission bits, link
//! counts, symlink targets) are compared after every step and after unmount and remount.
//!
//! With `LANEFS_TEST_NVM=1` every image gets a persistent-memory region (`nvm_mode`), used by
//! every mount and fsck of that image.
//!
//! Beside the comparison here, on the same images and helpers: `parallel` (threads against one
//! engine) and `checkpoint` (checkpoints as the engine takes them).

mod checkpoint;
#[path = "../nvm_mode/mod.rs"]
mod nvm_mode;
mod parallel;

use lanefs::device::{BlockDevice, MemDevice};
use lanefs::rng::Rng;
use lanefs::FileKind;
use lanefs::{fsck, FsckOptions};
use lanefs::{FallocMode, RenameFlags, XattrFlags};
use lanefs::{Fs, FsOptions, Ino, MkfsOptions, ROOT};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, PartialEq)]
enum Node {
    File { mode: u32, nlink: u32, data: Vec<u8> },
    Dir { mode: u32, nlink: u32, entries: BTreeMap<String, Node> },
    Symlink { target: Vec<u8> },
}

fn walk_host(p: &Path) -> Node {
    let md = std::fs::symlink_metadata(p).unwrap();
    if md.file_type().is_symlink() {
        return Node::Symlink {
            target: std::fs::read_link(p).unwrap().into_os_string().into_encoded_bytes(),
        };
    }
    if md.is_dir() {
        let mut entries = BTreeMap::new();
        for e in std::fs::read_dir(p).unwrap() {
            let e = e.unwrap();
            entries.insert(e.file_name().into_string().unwrap(), walk_host(&e.path()));
        }
        return Node::Dir { mode: md.mode() & 0o7777, nlink: md.nlink() as u32, entries };
    }
    Node::File { mode: md.mode() & 0o7777, nlink: md.nlink() as u32, data: std::fs::read(p).unwrap() }
}

fn walk_fs(fs: &Fs, ino: Ino) -> Node {
    let a = fs.getattr(ino).unwrap();
    match a.kind {
        FileKind::Symlink => Node::Symlink { target: fs.readlink(ino).unwrap() },
        FileKind::Dir => {
            let mut entries = BTreeMap::new();
            let mut cookie = 0;
            loop {
                let page = fs.readdir(ino, cookie, 7).unwrap();
                if page.is_empty() {
                    break;
                }
                for e in &page {
                    cookie = e.cookie;
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    let child = walk_fs(fs, e.ino);
                    assert!(
                        entries.insert(String::from_utf8(e.name.clone()).unwrap(), child).is_none(),
                        "name listed twice"
                    );
                }
            }
            Node::Dir { mode: a.mode & 0o7777, nlink: a.nlink, entries }
        }
        _ => {
            let mut data = vec![0u8; a.size as usize];
            let n = fs.read_at(ino, 0, &mut data).unwrap();
            assert_eq!(n as u64, a.size);
            Node::File { mode: a.mode & 0o7777, nlink: a.nlink, data }
        }
    }
}

/// A formatted in-memory image and, in nvm mode, its region (which lives as long as it does).
struct Image {
    dev: Arc<MemDevice>,
    region: Option<nvm_mode::Region>,
}

impl std::ops::Deref for Image {
    type Target = MemDevice;
    fn deref(&self) -> &MemDevice {
        &self.dev
    }
}

impl Image {
    /// After a simulated crash (`mem::forget` of the `Fs`, which keeps its region locked): the
    /// image goes on with a copy of its region as the crash left it.
    fn crashed(&mut self) {
        if let Some(r) = &self.region {
            self.region = Some(r.copy());
        }
    }
}

fn fresh(size: u64, lanes: u32) -> Image {
    let dev = Arc::new(MemDevice::new(size));
    Fs::format(&*dev, &MkfsOptions { lanes, ..Default::default() }).unwrap();
    Image { dev, region: nvm_mode::Region::if_enabled() }
}

fn mount(img: &Image, opts: FsOptions) -> Fs {
    let read_only = opts.read_only;
    let fs =
        Fs::open(img.dev.clone() as Arc<dyn BlockDevice>, nvm_mode::with_region(opts, img.region.as_ref()))
            .unwrap();
    // A read-only mount reads the region and keeps none.
    assert_eq!(
        fs.nvm().is_some(),
        img.region.is_some() && !read_only,
        "the NAT is in the region in nvm mode"
    );
    fs
}

/// fsck of the image (and its region). While it is mounted the region is locked by the mount,
/// so fsck reads a copy of it (the tests check a mounted image only when it is quiet: synced,
/// no operation running).
fn fsck_clean(img: &Image) {
    let check_with = |nvm: Option<&nvm_mode::Region>| {
        fsck(&*img.dev, &FsckOptions { nvm: nvm.map(|r| r.path().to_path_buf()), ..Default::default() })
    };
    let r = match check_with(img.region.as_ref()) {
        Err(lanefs::Error::Region { fault: lanefs::RegionFault::InUse, .. }) => {
            check_with(img.region.as_ref().map(|r| r.copy()).as_ref())
        }
        r => r,
    }
    .unwrap();
    assert!(r.is_clean(), "fsck: {:#?}", r.problems);
}

fn path_ino(fs: &Fs, rel: &Path) -> Ino {
    fs.resolve(rel.to_str().unwrap()).unwrap().ino
}

fn parent_and_name(rel: &Path) -> (PathBuf, Vec<u8>) {
    (rel.parent().unwrap().to_path_buf(), rel.file_name().unwrap().as_encoded_bytes().to_vec())
}

/// Runs one random operation on both; returns whether it succeeded (both must agree).
fn step(rng: &mut Rng, fs: &Fs, host: &Path, files: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) {
    let pick_dir = |rng: &mut Rng, dirs: &Vec<PathBuf>| dirs[rng.below(dirs.len() as u64) as usize].clone();
    let op = rng.below(100);
    let name = format!("n{}", rng.below(40));
    match op {
        0..=14 => {
            // create + write
            let d = pick_dir(rng, dirs);
            let rel = d.join(&name);
            let len = rng.below(20_000) as usize;
            let data: Vec<u8> = (0..len).map(|i| (i as u64 * 31 + op) as u8).collect();
            let h = std::fs::OpenOptions::new().write(true).create_new(true).open(hj(host, &rel));
            let (pd, n) = parent_and_name(&rel);
            let r = fs.create(path_ino(fs, &pd), &n, 0o640, 0, 0);
            assert_eq!(h.is_ok(), r.is_ok(), "create {rel:?}: host {h:?} lanefs {r:?}");
            if let (Ok(_), Ok(a)) = (h, r) {
                std::fs::write(hj(host, &rel), &data).unwrap();
                std::fs::set_permissions(hj(host, &rel), std::fs::Permissions::from_mode(0o640)).unwrap();
                fs.write_at(a.ino, 0, &data).unwrap();
                files.push(rel);
            }
        }
        15..=29 if !files.is_empty() => {
            // overwrite or extend at an offset
            let rel = files[rng.below(files.len() as u64) as usize].clone();
            let off = rng.below(30_000);
            let len = 1 + rng.below(9000) as usize;
            let data: Vec<u8> = (0..len).map(|i| (i as u64 ^ off) as u8).collect();
            let hp = hj(host, &rel);
            if hp.is_file() {
                use std::os::unix::fs::FileExt;
                std::fs::OpenOptions::new().write(true).open(&hp).unwrap().write_all_at(&data, off).unwrap();
                fs.write_at(path_ino(fs, &rel), off, &data).unwrap();
            }
        }
        30..=36 if !files.is_empty() => {
            let rel = files[rng.below(files.len() as u64) as usize].clone();
            let size = rng.below(25_000);
            let hp = hj(host, &rel);
            if hp.is_file() {
                std::fs::OpenOptions::new().write(true).open(&hp).unwrap().set_len(size).unwrap();
                fs.truncate(path_ino(fs, &rel), size).unwrap();
            }
        }
        37..=46 if !files.is_empty() => {
            let i = rng.below(files.len() as u64) as usize;
            let rel = files[i].clone();
            let h = std::fs::remove_file(hj(host, &rel));
            let (pd, n) = parent_and_name(&rel);
            let r = fs.unlink(path_ino(fs, &pd), &n);
            assert_eq!(h.is_ok(), r.is_ok(), "unlink {rel:?}: {h:?} {r:?}");
            files.swap_remove(i);
        }
        47..=56 => {
            let d = pick_dir(rng, dirs);
            let rel = d.join(format!("d{}", rng.below(8)));
            let h = std::fs::create_dir(hj(host, &rel));
            let (pd, n) = parent_and_name(&rel);
            let r = fs.mkdir(path_ino(fs, &pd), &n, 0o750, 0, 0);
            assert_eq!(h.is_ok(), r.is_ok(), "mkdir {rel:?}: {h:?} {r:?}");
            if h.is_ok() {
                std::fs::set_permissions(hj(host, &rel), std::fs::Permissions::from_mode(0o750)).unwrap();
                dirs.push(rel);
            }
        }
        57..=62 if dirs.len() > 1 => {
            let i = 1 + rng.below(dirs.len() as u64 - 1) as usize;
            let rel = dirs[i].clone();
            let h = std::fs::remove_dir(hj(host, &rel));
            let (pd, n) = parent_and_name(&rel);
            let r = fs.rmdir(path_ino(fs, &pd), &n);
            assert_eq!(h.is_ok(), r.is_ok(), "rmdir {rel:?}: {h:?} {r:?}");
            if let (Err(he), Err(le)) = (&h, &r) {
                assert_eq!(he.raw_os_error(), Some(le.to_errno()), "rmdir {rel:?}");
            }
            if h.is_ok() {
                dirs.swap_remove(i);
            }
        }
        63..=77 => {
            // rename a file or directory somewhere, maybe with flags
            let src = if rng.below(3) == 0 && dirs.len() > 1 {
                dirs[1 + rng.below(dirs.len() as u64 - 1) as usize].clone()
            } else if !files.is_empty() {
                files[rng.below(files.len() as u64) as usize].clone()
            } else {
                return;
            };
            let dst = pick_dir(rng, dirs).join(&name);
            let flags = match rng.below(6) {
                0 => RenameFlags::NOREPLACE,
                1 => RenameFlags::EXCHANGE,
                _ => RenameFlags::empty(),
            };
            let hs = std::ffi::CString::new(hj(host, &src).into_os_string().into_encoded_bytes()).unwrap();
            let hd = std::ffi::CString::new(hj(host, &dst).into_os_string().into_encoded_bytes()).unwrap();
            // SAFETY: two valid NUL-terminated paths; renameat2 reads them and nothing else.
            #[allow(unsafe_code)]
            let hr = unsafe {
                libc::renameat2(libc::AT_FDCWD, hs.as_ptr(), libc::AT_FDCWD, hd.as_ptr(), flags.bits())
            };
            let herr = (hr != 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap());
            let (sp, sn) = parent_and_name(&src);
            let (dp, dn) = parent_and_name(&dst);
            let dpi = fs.resolve(dp.to_str().unwrap()).map(|a| a.ino);
            let r = match dpi {
                Ok(dpi) => fs.rename(path_ino(fs, &sp), &sn, dpi, &dn, flags),
                Err(e) => Err(e),
            };
            assert_eq!(
                herr,
                r.as_ref().err().map(|e| e.to_errno()),
                "rename {src:?} -> {dst:?} flags {flags:#x}: {r:?}"
            );
            if herr.is_none() {
                // Rebuild the path lists from the host tree: renames move whole subtrees.
                relist(host, files, dirs);
            }
        }
        78..=83 if !files.is_empty() => {
            let rel = files[rng.below(files.len() as u64) as usize].clone();
            let dst = pick_dir(rng, dirs).join(format!("l{}", rng.below(20)));
            let h = std::fs::hard_link(hj(host, &rel), hj(host, &dst));
            let (dp, dn) = parent_and_name(&dst);
            let r = fs.link(path_ino(fs, &rel), path_ino(fs, &dp), &dn);
            assert_eq!(h.is_ok(), r.is_ok(), "link {rel:?} {dst:?}: {h:?} {r:?}");
            if h.is_ok() {
                files.push(dst);
            }
        }
        84..=88 => {
            let d = pick_dir(rng, dirs);
            let rel = d.join(format!("s{}", rng.below(10)));
            let target = format!("../target-{}", rng.below(1000));
            let h = std::os::unix::fs::symlink(&target, hj(host, &rel));
            let (pd, n) = parent_and_name(&rel);
            let r = fs.symlink(path_ino(fs, &pd), &n, target.as_bytes(), 0, 0);
            assert_eq!(h.is_ok(), r.is_ok(), "symlink {rel:?}: {h:?} {r:?}");
        }
        89..=93 if !files.is_empty() => {
            let rel = files[rng.below(files.len() as u64) as usize].clone();
            let mode = [0o600, 0o644, 0o755, 0o400][rng.below(4) as usize];
            let hp = hj(host, &rel);
            if hp.is_file() {
                std::fs::set_permissions(&hp, std::fs::Permissions::from_mode(mode)).unwrap();
                fs.setattr(path_ino(fs, &rel), &lanefs::SetAttr { mode: Some(mode), ..Default::default() })
                    .unwrap();
            }
        }
        _ => {
            // fsync something
            if let Some(rel) = files.first() {
                if hj(host, rel).is_file() {
                    fs.fsync(path_ino(fs, rel), false).unwrap();
                }
            }
        }
    }
}

/// The host path of a test path such as "/a/b" (never the real root).
fn hj(host: &Path, rel: &Path) -> PathBuf {
    let p = host.join(rel.strip_prefix("/").unwrap_or(rel));
    assert!(p.starts_with(host), "{p:?} escapes the test directory");
    p
}

fn relist(host: &Path, files: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) {
    files.clear();
    dirs.clear();
    dirs.push(PathBuf::from("/"));
    fn rec(host: &Path, rel: &Path, files: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(host.join(rel.strip_prefix("/").unwrap())).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                dirs.push(r.clone());
                rec(host, &r, files, dirs);
            } else if ft.is_file() {
                files.push(r);
            }
        }
    }
    rec(host, Path::new("/"), files, dirs);
}

fn compare(fs: &Fs, host: &Path, when: &str) {
    let a = walk_fs(fs, ROOT);
    let mut b = walk_host(host);
    // The host directory's own mode and link count come from the test's tempdir.
    if let (Node::Dir { mode: am, nlink: an, .. }, Node::Dir { mode, nlink, .. }) = (&a, &mut b) {
        *mode = *am;
        *nlink = *an;
    }
    if a != b {
        panic!("trees differ {when}:\nlanefs: {a:#?}\nhost: {b:#?}");
    }
}

#[test]
fn random_workload_matches_the_host_file_system_across_remounts() {
    for seed in [1u64, 7, 42] {
        let host_dir = tempfile::tempdir().unwrap();
        let host = host_dir.path();
        let dev = fresh(128 << 20, 2);
        let mut fs = mount(&dev, FsOptions { checkpoint_interval: None, ..Default::default() });
        let mut rng = Rng::new(0x9E37_79B9 ^ seed.wrapping_mul(0x1234_5678_9ABC));
        let mut files = Vec::new();
        let mut dirs = vec![PathBuf::from("/")];
        for i in 0..400 {
            step(&mut rng, &fs, host, &mut files, &mut dirs);
            if i % 25 == 0 {
                compare(&fs, host, &format!("after step {i} (seed {seed})"));
            }
            if i % 100 == 99 {
                fs.unmount().unwrap();
                fsck_clean(&dev);
                fs = mount(&dev, FsOptions { checkpoint_interval: None, ..Default::default() });
                compare(&fs, host, &format!("after remount at step {i} (seed {seed})"));
            }
            if i % 60 == 30 {
                fs.sync().unwrap();
                fsck_clean(&dev);
            }
        }
        compare(&fs, host, "at the end");
        fs.unmount().unwrap();
        fsck_clean(&dev);
    }
}

#[test]
fn errors_match_linux() {
    let dev = fresh(64 << 20, 1);
    let fs = mount(&dev, FsOptions::default());
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap();
    let f = fs.create(d.ino, b"f", 0o644, 0, 0).unwrap();
    let errno = |r: lanefs::Result<lanefs::Attr>| r.unwrap_err().to_errno();
    assert_eq!(errno(fs.create(d.ino, b"f", 0o644, 0, 0)), libc::EEXIST);
    assert_eq!(errno(fs.lookup(d.ino, b"nope")), libc::ENOENT);
    assert_eq!(errno(fs.create(f.ino, b"x", 0o644, 0, 0)), libc::ENOTDIR);
    assert_eq!(errno(fs.create(d.ino, &[b'a'; 256], 0o644, 0, 0)), libc::ENAMETOOLONG);
    assert_eq!(fs.rmdir(ROOT, b"d").unwrap_err().to_errno(), libc::ENOTEMPTY);
    assert_eq!(fs.unlink(ROOT, b"d").unwrap_err().to_errno(), libc::EISDIR);
    assert_eq!(fs.rmdir(d.ino, b"f").unwrap_err().to_errno(), libc::ENOTDIR);
    assert_eq!(errno(fs.link(d.ino, ROOT, b"dl")), libc::EPERM);
    assert_eq!(
        fs.rename(ROOT, b"d", d.ino, b"inside", RenameFlags::empty()).unwrap_err().to_errno(),
        libc::EINVAL
    );
    let e = fs.mkdir(ROOT, b"e", 0o755, 0, 0).unwrap();
    assert_eq!(
        fs.rename(d.ino, b"f", ROOT, b"e", RenameFlags::empty()).unwrap_err().to_errno(),
        libc::EISDIR
    );
    assert_eq!(
        fs.rename(ROOT, b"e", d.ino, b"f", RenameFlags::empty()).unwrap_err().to_errno(),
        libc::ENOTDIR
    );
    assert_eq!(
        fs.rename(ROOT, b"e", ROOT, b"d", RenameFlags::NOREPLACE).unwrap_err().to_errno(),
        libc::EEXIST
    );
    assert_eq!(
        fs.rename(ROOT, b"e", ROOT, b"zz", RenameFlags::EXCHANGE).unwrap_err().to_errno(),
        libc::ENOENT
    );
    assert_eq!(fs.getxattr(f.ino, b"user.x").unwrap_err().to_errno(), libc::ENODATA);
    assert_eq!(
        fs.setxattr(f.ino, b"user.x", b"v", XattrFlags::REPLACE).unwrap_err().to_errno(),
        libc::ENODATA
    );
    fs.setxattr(f.ino, b"user.x", b"v", XattrFlags::CREATE).unwrap();
    assert_eq!(fs.setxattr(f.ino, b"user.x", b"w", XattrFlags::CREATE).unwrap_err().to_errno(), libc::EEXIST);
    assert_eq!(
        fs.setxattr(f.ino, b"user.big", &vec![0; 70_000], XattrFlags::empty()).unwrap_err().to_errno(),
        libc::E2BIG
    );
    // Larger than an xattr node: the set moves to xattr blocks (tests/xattr.rs has the rest).
    fs.setxattr(f.ino, b"user.fill", &vec![0; 5000], XattrFlags::empty()).unwrap();
    assert_eq!(fs.getxattr(f.ino, b"user.fill").unwrap().len(), 5000);
    assert_eq!(fs.setxattr(f.ino, b"user.x", b"v", XattrFlags(3)).unwrap_err().to_errno(), libc::EINVAL);
    let mut buf = [0u8; 4];
    assert_eq!(fs.read_at(d.ino, 0, &mut buf).unwrap_err().to_errno(), libc::EISDIR);
    assert_eq!(fs.readlink(f.ino).unwrap_err().to_errno(), libc::EINVAL);
    assert_eq!(fs.getattr(999_999).unwrap_err().to_errno(), libc::ENOENT);
    assert_eq!(fs.write_at(f.ino, u64::MAX - 2, b"abc").unwrap_err().to_errno(), libc::EFBIG);
    let _ = e;
}

#[test]
fn xattrs_times_sparse_files_and_fallocate_survive_remount() {
    let dev = fresh(64 << 20, 2);
    let fs = mount(&dev, FsOptions::default());
    let f = fs.create(ROOT, b"sparse", 0o600, 7, 8).unwrap();
    fs.write_at(f.ino, 100 << 20, b"far away").unwrap();
    fs.write_at(f.ino, 5000, b"near").unwrap();
    fs.setxattr(f.ino, b"user.a", b"1", XattrFlags::empty()).unwrap();
    fs.setxattr(f.ino, b"user.b", b"22", XattrFlags::empty()).unwrap();
    fs.removexattr(f.ino, b"user.a").unwrap();
    let t = lanefs::format::Timespec { sec: 1_600_000_000, nsec: 123_456_789 };
    fs.setattr(f.ino, &lanefs::SetAttr { atime: Some(t), mtime: Some(t), ..Default::default() }).unwrap();
    let g = fs.create(ROOT, b"prealloc", 0o644, 0, 0).unwrap();
    fs.fallocate(g.ino, FallocMode::empty(), 0, 3 * 4096).unwrap();
    fs.write_at(g.ino, 0, &[9u8; 3 * 4096]).unwrap();
    fs.fallocate(g.ino, FallocMode::PUNCH_HOLE | FallocMode::KEEP_SIZE, 100, 2 * 4096).unwrap();
    let before = fs.getattr(f.ino).unwrap();
    fs.unmount().unwrap();
    fsck_clean(&dev);
    let fs = mount(&dev, FsOptions::default());
    let a = fs.getattr(f.ino).unwrap();
    assert_eq!(a.size, (100 << 20) + 8);
    assert_eq!((a.uid, a.gid, a.mode & 0o7777), (7, 8, 0o600));
    assert_eq!(a.mtime, t);
    assert_eq!(a.atime, t);
    assert_eq!(a.ctime, before.ctime);
    assert!(a.blocks <= 3 * 8, "sparse file allocates only what was written: {}", a.blocks);
    assert_eq!(fs.listxattr(f.ino).unwrap(), vec![b"user.b".to_vec()]);
    assert_eq!(fs.getxattr(f.ino, b"user.b").unwrap(), b"22");
    let mut buf = vec![0u8; 8];
    fs.read_at(f.ino, 100 << 20, &mut buf).unwrap();
    assert_eq!(&buf, b"far away");
    let mut hole = vec![1u8; 4096];
    fs.read_at(f.ino, 50 << 20, &mut hole).unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    let mut p = vec![0u8; 3 * 4096];
    fs.read_at(g.ino, 0, &mut p).unwrap();
    assert!(p[..100].iter().all(|&b| b == 9));
    assert!(p[100..100 + 2 * 4096].iter().all(|&b| b == 0), "punched range reads as zeros");
    assert!(p[100 + 2 * 4096..].iter().all(|&b| b == 9));
    fs.unmount().unwrap();
    fsck_clean(&dev);
}

#[test]
fn unlinked_open_file_lives_until_release_and_orphans_are_reclaimed() {
    let dev = fresh(64 << 20, 1);
    let fs = mount(&dev, FsOptions::default());
    let f = fs.create(ROOT, b"tmp", 0o600, 0, 0).unwrap();
    fs.open_ino(f.ino).unwrap();
    fs.write_at(f.ino, 0, &vec![5u8; 100_000]).unwrap();
    fs.unlink(ROOT, b"tmp").unwrap();
    fs.sync().unwrap();
    let mut b = vec![0u8; 10];
    assert_eq!(fs.read_at(f.ino, 0, &mut b).unwrap(), 10);
    assert_eq!(b, vec![5u8; 10]);
    // The checkpoint lists it as an orphan; fsck agrees it is consistent.
    fsck_clean(&dev);
    // Drop without release: as if the process died. Mount reclaims the orphan.
    drop(fs);
    let fs = mount(&dev, FsOptions::default());
    assert_eq!(fs.getattr(f.ino).unwrap_err().to_errno(), libc::ENOENT);
    let free_after = fs.statfs().bfree;
    fs.unmount().unwrap();
    fsck_clean(&dev);
    assert!(free_after > 0);
}

#[test]
fn data_set_three_times_the_cache_reads_back_exactly() {
    let dev = fresh(256 << 20, 2);
    let cache = 8u64 << 20;
    let fs = mount(&dev, FsOptions { cache_bytes: cache, checkpoint_interval: None, ..Default::default() });
    let total = 3 * cache;
    let files = 3u64;
    let mut inos = Vec::new();
    for i in 0..files {
        let a = fs.create(ROOT, format!("big{i}").as_bytes(), 0o644, 0, 0).unwrap();
        inos.push(a.ino);
    }
    let chunk = 64 * 1024u64;
    let per_file = total / files;
    for off in (0..per_file).step_by(chunk as usize) {
        for (i, &ino) in inos.iter().enumerate() {
            let data: Vec<u8> = (0..chunk).map(|k| ((off + k) / 4096 * 7 + i as u64 * 13) as u8).collect();
            fs.write_at(ino, off, &data).unwrap();
        }
    }
    for (i, &ino) in inos.iter().enumerate() {
        let mut buf = vec![0u8; chunk as usize];
        for off in (0..per_file).step_by(chunk as usize) {
            assert_eq!(fs.read_at(ino, off, &mut buf).unwrap(), chunk as usize);
            for (k, &b) in buf.iter().enumerate() {
                assert_eq!(
                    b,
                    ((off + k as u64) / 4096 * 7 + i as u64 * 13) as u8,
                    "file {i} offset {}",
                    off + k as u64
                );
            }
        }
    }
    fs.unmount().unwrap();
    fsck_clean(&dev);
}

#[test]
fn directory_size_is_the_same_before_and_after_remount() {
    let dev = fresh(64 << 20, 1);
    let fs = mount(&dev, FsOptions::default());
    let d = fs.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let empty = fs.getattr(d).unwrap().size;
    assert_eq!(empty, 4096);
    for i in 0..300 {
        fs.create(d, format!("file-{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let full = fs.getattr(d).unwrap();
    assert!(full.size > empty);
    fs.unmount().unwrap();
    let fs = mount(&dev, FsOptions::default());
    assert_eq!(fs.getattr(d).unwrap().size, full.size);
    assert_eq!(fs.getattr(d).unwrap().blocks, full.blocks);
    fs.unmount().unwrap();
    fsck_clean(&dev);
}

#[test]
fn read_only_mount_recovers_in_memory_and_writes_nothing() {
    let mut dev = fresh(64 << 20, 1);
    let fs = mount(&dev, FsOptions { checkpoint_interval: None, ..Default::default() });
    let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    fs.write_at(f.ino, 0, b"journaled, not checkpointed").unwrap();
    fs.fsync(f.ino, false).unwrap();
    std::mem::forget(fs); // a crash: only the journal has the file
    dev.crashed();
    let before = dev.snapshot();
    // In nvm mode the journal is the region's: the read-only mount must not write it either.
    let region_before = dev.region.as_ref().map(|r| r.bytes());
    let ro = mount(&dev, FsOptions { read_only: true, ..Default::default() });
    let a = ro.lookup(ROOT, b"f").unwrap();
    let mut buf = vec![0u8; a.size as usize];
    ro.read_at(a.ino, 0, &mut buf).unwrap();
    assert_eq!(buf, b"journaled, not checkpointed");
    assert_eq!(ro.create(ROOT, b"g", 0o644, 0, 0).unwrap_err().to_errno(), libc::EROFS);
    assert_eq!(ro.write_at(a.ino, 0, b"x").unwrap_err().to_errno(), libc::EROFS);
    assert_eq!(ro.unlink(ROOT, b"f").unwrap_err().to_errno(), libc::EROFS);
    ro.fsync(a.ino, false).unwrap();
    ro.sync().unwrap();
    ro.unmount().unwrap();
    assert!(dev.snapshot() == before, "a read-only mount wrote to the device");
    if let (Some(r), Some(b)) = (&dev.region, &region_before) {
        assert!(!b.is_empty(), "the first mount created the region");
        assert!(r.bytes() == *b, "a read-only mount wrote to the region");
    }
    // A read-write mount afterwards still recovers the file from the journal.
    let rw = mount(&dev, FsOptions::default());
    assert_eq!(rw.lookup(ROOT, b"f").unwrap().size, 27);
    rw.unmount().unwrap();
    fsck_clean(&dev);
}
