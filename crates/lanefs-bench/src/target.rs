//! What a benchmark runs against: a [`Target`] is a file system reached through a small set of
//! POSIX-shaped calls.
//!
//! Workloads only ever speak this interface, so one workload definition measures a kernel file
//! system through a directory (`dir:PATH`), lanefs through its library API (`lib:IMAGE`) and
//! lanefs through FUSE (`mount:IMAGE`) alike. Paths given to a target are relative to its root.
//! Adding the lanefs targets is one `impl Target` each plus one arm in [`open_target`].

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// open(2) flags the workloads need. `direct` and `dsync` map to O_DIRECT and O_DSYNC; a target
/// that cannot honour `direct` fails the open with `InvalidInput` or `Unsupported`, and the
/// workload falls back to buffered I/O with a note.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    pub read: bool,
    pub write: bool,
    pub create: bool,
    /// With `create`: fail if the file exists (O_EXCL).
    pub exclusive: bool,
    pub truncate: bool,
    pub direct: bool,
    pub dsync: bool,
}

impl OpenOptions {
    pub fn read() -> Self {
        OpenOptions { read: true, ..Default::default() }
    }
    pub fn read_write() -> Self {
        OpenOptions { read: true, write: true, ..Default::default() }
    }
    /// Read-write, created when missing.
    pub fn create() -> Self {
        OpenOptions { read: true, write: true, create: true, ..Default::default() }
    }
    /// Read-write, a new file; fails when the name exists.
    pub fn create_new() -> Self {
        OpenOptions { read: true, write: true, create: true, exclusive: true, ..Default::default() }
    }
    pub fn direct(mut self, on: bool) -> Self {
        self.direct = on;
        self
    }
    pub fn dsync(mut self, on: bool) -> Self {
        self.dsync = on;
        self
    }
}

/// What a workload needs of stat(2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub size: u64,
    pub is_dir: bool,
}

/// An open file. Positioned I/O only, so that threads sharing nothing but the file never share
/// a file offset either (as FxMark's pread/pwrite).
pub trait File: Send + Sync {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize>;
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<usize>;
    fn fsync(&self) -> io::Result<()>;
    /// ftruncate(2): appending workloads wrap by truncating to 0 instead of growing forever.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// futimens(2) with both times given, as tar stamps what it unpacks.
    fn set_times(&self, atime: std::time::SystemTime, mtime: std::time::SystemTime) -> io::Result<()>;

    /// Writes all of `buf` at `off` (short writes continue, as write(2) loops do).
    fn write_all_at(&self, mut buf: &[u8], mut off: u64) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.write_at(buf, off)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"));
            }
            buf = &buf[n..];
            off += n as u64;
        }
        Ok(())
    }
}

/// A file system under test. Paths are relative to the target's root.
pub trait Target: Send + Sync {
    /// How the target was named on the command line (for reports), e.g. `dir:/mnt/x`.
    fn spec(&self) -> String;
    /// File system type of the root, e.g. `ext4`, `tmpfs`, `fuse.bindfs`, `lanefs`.
    fn fs_type(&self) -> String;
    fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Box<dyn File>>;
    fn mkdir(&self, path: &Path) -> io::Result<()>;
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    fn unlink(&self, path: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Names in a directory, without `.` and `..`.
    fn readdir(&self, path: &Path) -> io::Result<Vec<OsString>>;
    fn stat(&self, path: &Path) -> io::Result<Stat>;

    /// Creates an empty file (O_CREAT|O_EXCL, then close).
    fn create(&self, path: &Path) -> io::Result<()> {
        self.open(path, OpenOptions::create_new()).map(drop)
    }

    /// Capacity and free space of the file system under the root, in bytes: `(total, free)`,
    /// where `total - free` is what is in use. Kernel file systems report statvfs(2) as df
    /// does (capacity = used + available to unprivileged users); lanefs reports `Fs::statfs`
    /// (invalid blocks count as free: the cleaner gives them back).
    fn space(&self) -> io::Result<(u64, u64)> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "this target does not report its space"))
    }

    /// Makes everything written so far durable (syncfs(2); a checkpoint for lanefs). Files
    /// that must be durable through any target are fsynced one by one as well: a FUSE mount
    /// does not pass syncfs on to its daemon.
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    /// The file system's own write counters, where it has them (lanefs through the library,
    /// or a lanefs mount's `lanefs.engine` attribute): what users wrote against what reached
    /// the device. None for every other target.
    fn io_counters(&self) -> Option<IoCounters> {
        None
    }

    /// The FUSE requests its daemon served so far, by opcode (a lanefs mount only:
    /// `lanefs_fuse::stats`). Counters only grow; `lanefs_fuse::stats::since` gives a run's.
    fn fuse_requests(&self) -> Option<Vec<(String, u64)>> {
        None
    }

    /// lanefs's contention census (`lanefs::sync::census`: per lock class, acquisitions that
    /// had to wait, counted by the process that runs lanefs): the library's, or a lanefs
    /// mount's daemon's. None for every other target.
    fn lock_census(&self) -> Option<lanefs::sync::Census> {
        None
    }

    /// Undoes what opening the target set up (a `mount:` target unmounts and removes its mount
    /// point), so that a failure is reported; idempotent. Drop does the same on every other way
    /// out. Nothing for targets that set nothing up.
    fn close(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Bytes written since the file system was mounted, by cause (lanefs's `IoStats`, reduced to
/// what a benchmark reports). Counters only grow; [`IoCounters::since`] gives one run's share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Bytes passed to write calls.
    pub user_bytes: u64,
    /// Bytes written to the device for any cause: journal, writeback, checkpoints, cleaning.
    pub device_bytes: u64,
    /// The part of `device_bytes` that the cleaner moved.
    pub cleaning_bytes: u64,
    /// Segments the cleaner emptied.
    pub segments_cleaned: u64,
    /// Checkpoints made durable.
    pub checkpoints: u64,
    /// The longest a checkpoint's exclusive phase held operations out since the previous read
    /// of the counters (µs; a peak, not a running count: `since` keeps the later one). Through
    /// a mount, the longest since the mount: the daemon keeps no per-run peak.
    pub cp_exclusive_us_max: u64,
    /// fsyncs and writebacks that waited for a checkpoint in progress.
    pub cp_waits: u64,
}

impl IoCounters {
    /// What was counted between `earlier` and `self`.
    pub fn since(&self, earlier: &IoCounters) -> IoCounters {
        IoCounters {
            user_bytes: self.user_bytes.saturating_sub(earlier.user_bytes),
            device_bytes: self.device_bytes.saturating_sub(earlier.device_bytes),
            cleaning_bytes: self.cleaning_bytes.saturating_sub(earlier.cleaning_bytes),
            segments_cleaned: self.segments_cleaned.saturating_sub(earlier.segments_cleaned),
            checkpoints: self.checkpoints.saturating_sub(earlier.checkpoints),
            cp_exclusive_us_max: self.cp_exclusive_us_max,
            cp_waits: self.cp_waits.saturating_sub(earlier.cp_waits),
        }
    }

    /// Device bytes per user byte; None when users wrote nothing.
    pub fn write_amplification(&self) -> Option<f64> {
        (self.user_bytes > 0).then(|| self.device_bytes as f64 / self.user_bytes as f64)
    }
}

/// Removes `path` and everything below it through the target's own calls, so that cleanup
/// exercises (and works on) every kind of target.
pub fn remove_tree(t: &dyn Target, path: &Path) -> io::Result<()> {
    for name in t.readdir(path)? {
        let p = path.join(&name);
        if t.stat(&p)?.is_dir {
            remove_tree(t, &p)?;
        } else {
            t.unlink(&p)?;
        }
    }
    t.rmdir(path)
}

/// A parsed `--target` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// Any directory, reached through the kernel (std::fs).
    Dir(PathBuf),
    /// lanefs through its library API, in process.
    Lib(PathBuf),
    /// lanefs mounted through FUSE for the run.
    Mount(PathBuf),
}

impl std::str::FromStr for TargetSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, path) = s
            .split_once(':')
            .ok_or_else(|| format!("target {s:?}: expected dir:PATH, lib:IMAGE or mount:IMAGE"))?;
        if path.is_empty() {
            return Err(format!("target {s:?}: the path after {kind}: is empty"));
        }
        let path = PathBuf::from(path);
        match kind {
            "dir" => Ok(TargetSpec::Dir(path)),
            "lib" => Ok(TargetSpec::Lib(path)),
            "mount" => Ok(TargetSpec::Mount(path)),
            _ => Err(format!("target {s:?}: unknown kind {kind:?}; expected dir:, lib: or mount:")),
        }
    }
}

impl std::fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetSpec::Dir(p) => write!(f, "dir:{}", p.display()),
            TargetSpec::Lib(p) => write!(f, "lib:{}", p.display()),
            TargetSpec::Mount(p) => write!(f, "mount:{}", p.display()),
        }
    }
}

/// How targets are opened, beyond their spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetOptions {
    /// Page cache of `lib:` targets in bytes; None: lanefs's default.
    pub lib_cache: Option<u64>,
    /// Persistent-memory region of a `lib:` target (`FsOptions::nvm`).
    pub nvm: Option<PathBuf>,
    /// With `nvm`: `FsOptions::nvm_inline_pages` (None: lanefs's choice for the device).
    pub nvm_inline_pages: Option<usize>,
}

/// The namespace calls of [`Target`] (mkdir, rmdir, unlink, rename, readdir, stat), each
/// forwarded to the target in field `$inner`: for targets that wrap another one and change only
/// files, space or set-up. Used inside an `impl Target` block.
macro_rules! forward_namespace {
    ($inner:ident) => {
        fn mkdir(&self, path: &Path) -> io::Result<()> {
            self.$inner.mkdir(path)
        }
        fn rmdir(&self, path: &Path) -> io::Result<()> {
            self.$inner.rmdir(path)
        }
        fn unlink(&self, path: &Path) -> io::Result<()> {
            self.$inner.unlink(path)
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            self.$inner.rename(from, to)
        }
        fn readdir(&self, path: &Path) -> io::Result<Vec<OsString>> {
            self.$inner.readdir(path)
        }
        fn stat(&self, path: &Path) -> io::Result<Stat> {
            self.$inner.stat(path)
        }
    };
}
pub(crate) use forward_namespace;

/// Opens a target for benchmarking.
pub fn open_target(spec: &TargetSpec) -> Result<Box<dyn Target>, String> {
    open_target_with(spec, &TargetOptions::default())
}

/// Opens a target for benchmarking with `opts`.
pub fn open_target_with(spec: &TargetSpec, opts: &TargetOptions) -> Result<Box<dyn Target>, String> {
    match spec {
        TargetSpec::Dir(p) => Ok(Box::new(DirTarget::new(p)?)),
        TargetSpec::Lib(p) => {
            Ok(Box::new(crate::lib_target::LibTarget::open_with(&crate::lib_target::image_path(p), opts)?))
        }
        TargetSpec::Mount(p) => {
            Ok(Box::new(crate::mount_target::MountTarget::open(&crate::lib_target::image_path(p))?))
        }
    }
}

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

/// The file system type of `path`: the statfs magic number by name, refined for FUSE with the
/// subtype from /proc/self/mountinfo (`fuse.bindfs`), so that a report says what was measured.
pub fn fs_type_of(path: &Path) -> String {
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

    #[test]
    fn spec_parsing() {
        assert_eq!("dir:/tmp/x".parse::<TargetSpec>(), Ok(TargetSpec::Dir("/tmp/x".into())));
        assert_eq!("lib:a.img".parse::<TargetSpec>(), Ok(TargetSpec::Lib("a.img".into())));
        assert_eq!("mount:a.img".parse::<TargetSpec>(), Ok(TargetSpec::Mount("a.img".into())));
        assert!("/tmp/x".parse::<TargetSpec>().is_err());
        assert!("dir:".parse::<TargetSpec>().is_err());
        assert!("nfs:/x".parse::<TargetSpec>().is_err());
        assert_eq!(TargetSpec::Dir("/a b".into()).to_string(), "dir:/a b");
    }

    #[test]
    fn mount_target_without_lanefs_executable_fails_in_one_line() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("m.img");
        let e = crate::mount_target::MountTarget::open_with(&img, Path::new("/nonexistent/lanefs"))
            .err()
            .unwrap();
        assert!(e.starts_with(&format!("mount:{}: ", img.display())) && !e.contains('\n'), "{e}");
        assert!(!img.exists(), "no image is made for a mount that cannot happen");
        if std::env::var_os(crate::mount_target::BIN_ENV).is_none() {
            // This test binary is not `lanefs`: the error says how to name it.
            let e = open_target(&format!("mount:{}", img.display()).parse().unwrap()).err().unwrap();
            assert!(e.contains(crate::mount_target::BIN_ENV) && !e.contains('\n'), "{e}");
            assert!(!img.exists());
        }
    }

    #[test]
    fn lib_target_with_a_region_commits_fsync_there() {
        let d = tempfile::tempdir().unwrap();
        let shm = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let img = d.path().join("lib.img");
        let region = shm.path().join("lib.nvm");
        let opts = TargetOptions { nvm: Some(region.clone()), ..Default::default() };
        let t = open_target_with(&format!("lib:{}", img.display()).parse().unwrap(), &opts).unwrap();
        let f = t.open(Path::new("f"), OpenOptions::create()).unwrap();
        f.write_all_at(b"hello", 0).unwrap();
        f.fsync().unwrap();
        assert!(region.exists(), "the region is created by the first mount with it");
        drop((f, t));
        // The image needs its region from then on.
        assert!(open_target(&format!("lib:{}", img.display()).parse().unwrap()).is_err());
    }

    #[test]
    fn lib_target_works() {
        // lib: creates and formats a missing image, then serves the Target calls.
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("lib.img");
        let t = open_target(&format!("lib:{}", img.display()).parse().unwrap()).unwrap();
        t.mkdir(Path::new("a")).unwrap();
        let f = t.open(Path::new("a/f"), OpenOptions::create()).unwrap();
        f.write_all_at(b"hello", 4096).unwrap();
        f.fsync().unwrap();
        assert_eq!(t.stat(Path::new("a/f")).unwrap().size, 4101);
        assert!(t.stat(Path::new("a")).unwrap().is_dir);
        assert_eq!(t.readdir(Path::new("a")).unwrap(), vec![std::ffi::OsString::from("f")]);
        t.rename(Path::new("a/f"), Path::new("g")).unwrap();
        let mut buf = [0u8; 5];
        t.open(Path::new("g"), OpenOptions::read()).unwrap().read_at(&mut buf, 4096).unwrap();
        assert_eq!(&buf, b"hello");
        assert!(t.open(Path::new("g"), OpenOptions::create_new()).is_err());
        t.unlink(Path::new("g")).unwrap();
        t.rmdir(Path::new("a")).unwrap();
        assert!(t.readdir(Path::new("")).unwrap().is_empty());
    }

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
