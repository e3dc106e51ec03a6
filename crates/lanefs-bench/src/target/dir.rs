//! `dir:PATH`: any directory a kernel file system (or a FUSE mount) serves, through std::fs and
//! std::os::unix; also where a report finds what file system a path is on and its space.

use super::{File, OpenOptions, Stat, Target};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A directory of any kernel-visible file system, through std::fs and std::os::unix.
pub struct DirTarget {
    root: PathBuf,
    spec: String,
}

impl DirTarget {
    pub fn new(root: &Path) -> Result<DirTarget, String> {
        let md = fs::metadata(root).map_err(|e| format!("dir:{}: {e}", root.display()))?;
        if !md.is_dir() {
            return Err(format!("dir:{}: not a directory", root.display()));
        }
        Ok(DirTarget { root: root.to_path_buf(), spec: format!("dir:{}", root.display()) })
    }

    fn at(&self, p: &Path) -> PathBuf {
        self.root.join(p)
    }
}

struct DirFile(fs::File);

impl File for DirFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.0.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<usize> {
        self.0.write_at(buf, off)
    }
    fn fsync(&self) -> io::Result<()> {
        self.0.sync_all()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn set_times(&self, atime: std::time::SystemTime, mtime: std::time::SystemTime) -> io::Result<()> {
        self.0.set_times(fs::FileTimes::new().set_accessed(atime).set_modified(mtime))
    }
}

impl Target for DirTarget {
    fn spec(&self) -> String {
        self.spec.clone()
    }

    fn fs_type(&self) -> String {
        fs_type_of(&self.root)
    }

    fn open(&self, path: &Path, o: OpenOptions) -> io::Result<Box<dyn File>> {
        let mut flags = 0;
        if o.direct {
            flags |= libc::O_DIRECT;
        }
        if o.dsync {
            flags |= libc::O_DSYNC;
        }
        let mut oo = fs::OpenOptions::new();
        oo.read(o.read).write(o.write).truncate(o.truncate).custom_flags(flags).mode(0o644);
        if o.create && o.exclusive {
            oo.create_new(true);
        } else {
            oo.create(o.create);
        }
        Ok(Box::new(DirFile(oo.open(self.at(path))?)))
    }

    fn mkdir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(self.at(path))
    }
    fn rmdir(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir(self.at(path))
    }
    fn unlink(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(self.at(path))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(self.at(from), self.at(to))
    }
    fn readdir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        fs::read_dir(self.at(path))?.map(|e| e.map(|e| e.file_name())).collect()
    }
    fn space(&self) -> io::Result<(u64, u64)> {
        space_of(&self.root)
    }

    fn sync(&self) -> io::Result<()> {
        let d = fs::File::open(&self.root)?;
        rustix::fs::syncfs(&d).map_err(io::Error::from)
    }

    fn stat(&self, path: &Path) -> io::Result<Stat> {
        // stat(2), not lstat: path lookup through the whole chain is what MRPL/MRPM measure.
        let m = fs::metadata(self.at(path))?;
        Ok(Stat { size: m.len(), is_dir: m.is_dir() })
    }
}

/// statvfs(2) of `path` as `(total, free)` bytes, counted as df(1) does: free is what an
/// unprivileged user can still write (f_bavail), total is that plus what is in use, so that a
/// root reserve (ext4's 5 %) is neither capacity nor free space.
pub fn space_of(path: &Path) -> io::Result<(u64, u64)> {
    let s = rustix::fs::statvfs(path)?;
    let unit = if s.f_frsize > 0 { s.f_frsize } else { s.f_bsize };
    let used = s.f_blocks.saturating_sub(s.f_bfree);
    let free = s.f_bavail.min(s.f_blocks);
    Ok(((used + free) * unit, free * unit))
}

/// The file system type of `path` (as `fs_type_only` names it); for a lanefs mount, with the FUSE
/// transport its daemon serves with (`fuse.lanefs (io_uring)`), which the root's
/// `lanefs.transport` attribute names.
pub fn fs_type_of(path: &Path) -> String {
    let t = fs_type_only(path);
    match lanefs_fuse::stats::read_transport(path) {
        Ok(said) if t == "fuse.lanefs" => {
            let transport = said.split(" (").next().unwrap_or(&said).split(':').next().unwrap_or(&said);
            format!("{t} ({transport})")
        }
        _ => t,
    }
}

/// The file system type of `path`: the statfs magic number by name, refined for FUSE with the
/// subtype from /proc/self/mountinfo (`fuse.bindfs`), so that a report says what was measured.
pub fn fs_type_only(path: &Path) -> String {
    let magic = match rustix::fs::statfs(path) {
        Ok(s) => s.f_type as u64,
        Err(_) => return "unknown".into(),
    };
    let name = match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x6573_5546 => "fuse",
        0xF2F5_2010 => "f2fs",
        0x794C_7630 => "overlay",
        0x5346_544E => "ntfs",
        0x2FC1_2FC1 => "zfs",
        0x6969 => "nfs",
        0x8584_58F6 => "ramfs",
        _ => return mount_fs_type(path).unwrap_or_else(|| format!("0x{magic:x}")),
    };
    if name == "fuse" {
        if let Some(t) = mount_fs_type(path) {
            return t;
        }
    }
    name.to_string()
}

/// The type column of the /proc/self/mountinfo entry that holds `path` (the longest mount point
/// that is a prefix of it; the last such line wins, as later mounts cover earlier ones).
fn mount_fs_type(path: &Path) -> Option<String> {
    let canon = fs::canonicalize(path).ok()?;
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let (Some(mnt), Some(fstype)) = (left.split(' ').nth(4), right.split(' ').next()) else {
            continue;
        };
        let mnt = unescape_mount(mnt);
        if canon.starts_with(&mnt) {
            let len = mnt.as_os_str().len();
            let longer = match &best {
                Some((l, _)) => len >= *l,
                None => true,
            };
            if longer {
                best = Some((len, fstype.to_string()));
            }
        }
    }
    best.map(|(_, t)| t)
}

/// A mountinfo path field as a path (octal escapes decoded by lanefs-fuse's one implementation).
pub(crate) fn unescape_mount(s: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(OsString::from_vec(lanefs_fuse::mount::unescape_mountinfo(s)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::remove_tree;

    #[test]
    fn dir_target_calls() {
        let d = tempfile::tempdir().unwrap();
        let t = DirTarget::new(d.path()).unwrap();
        t.mkdir(Path::new("a")).unwrap();
        t.create(Path::new("a/f")).unwrap();
        assert!(t.create(Path::new("a/f")).is_err(), "exclusive create");
        let f = t.open(Path::new("a/f"), OpenOptions::read_write()).unwrap();
        f.write_all_at(b"hello", 3).unwrap();
        let mut b = [0u8; 8];
        assert_eq!(f.read_at(&mut b, 0).unwrap(), 8);
        assert_eq!(&b, b"\0\0\0hello");
        f.fsync().unwrap();
        f.set_len(2).unwrap();
        assert_eq!(t.stat(Path::new("a/f")).unwrap(), Stat { size: 2, is_dir: false });
        t.rename(Path::new("a/f"), Path::new("a/g")).unwrap();
        assert_eq!(t.readdir(Path::new("a")).unwrap(), vec![OsString::from("g")]);
        assert!(t.stat(Path::new("a")).unwrap().is_dir);
        t.mkdir(Path::new("a/sub")).unwrap();
        t.create(Path::new("a/sub/x")).unwrap();
        remove_tree(&t, Path::new("a")).unwrap();
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
        assert!(!t.fs_type().is_empty());
    }

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mount(r"/mnt/a\040b"), PathBuf::from("/mnt/a b"));
        assert_eq!(unescape_mount(r"/x\\"), PathBuf::from(r"/x\\"));
        // An escape that ends the field is decoded (space, tab, newline, backslash) ...
        assert_eq!(unescape_mount(r"/mnt/a\040"), PathBuf::from("/mnt/a "));
        assert_eq!(unescape_mount(r"/t\011\012\134"), PathBuf::from("/t\t\n\\"));
        assert_eq!(unescape_mount(r"\040"), PathBuf::from(" "));
        // ... and one cut short, or that is no byte (above \377), stays as it is, without a panic.
        assert_eq!(unescape_mount(r"/mnt/a\04"), PathBuf::from(r"/mnt/a\04"));
        assert_eq!(unescape_mount(r"/mnt/a\0"), PathBuf::from(r"/mnt/a\0"));
        assert_eq!(unescape_mount("/mnt/a\\"), PathBuf::from("/mnt/a\\"));
        assert_eq!(unescape_mount(r"/a\777"), PathBuf::from(r"/a\777"));
        assert_eq!(unescape_mount(r"/a\08x"), PathBuf::from(r"/a\08x"));
        // Bytes that are not UTF-8 come through as they are (\377).
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(unescape_mount(r"/a\377").as_os_str().as_bytes(), b"/a\xff");
    }
}
