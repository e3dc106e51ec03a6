//! What a benchmark runs against: a [`Target`] is a file system reached through a small set of
//! POSIX-shaped calls.
//!
//! Workloads only ever speak this interface, so one workload definition measures a kernel file
//! system through a directory (`dir:PATH`), lanefs through its library API (`lib:IMAGE`) and
//! lanefs through FUSE (`mount:IMAGE`) alike. Paths given to a target are relative to its root.
//! Adding the lanefs targets is one `impl Target` each plus one arm in [`open_target`].

use std::ffi::OsString;
use std::io;
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
    /// Captured files fsyncs and writebacks installed for a checkpoint instead of waiting.
    pub cp_helped: u64,
    /// Device flushes group commit issued for fsyncs (concurrent fsyncs share one).
    pub fsync_flushes: u64,
    /// fsyncs (and fdatasyncs) that needed a device flush, shared or not: `fsync_flushes`
    /// divided by this is the device flushes per fsync.
    pub fsyncs: u64,
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
            cp_helped: self.cp_helped.saturating_sub(earlier.cp_helped),
            fsync_flushes: self.fsync_flushes.saturating_sub(earlier.fsync_flushes),
            fsyncs: self.fsyncs.saturating_sub(earlier.fsyncs),
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
    /// `FsOptions::cooperative` off: fsyncs wait for the checkpoint to write the files it
    /// captured instead of writing them themselves, and each writes its own blocks before the
    /// shared flush instead of queueing them for a cooperative batch.
    pub no_cooperative: bool,
}

mod dir;
pub mod library;
pub mod mount;
pub(crate) use dir::unescape_mount;
pub use dir::{fs_type_of, space_of, DirTarget};

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
        TargetSpec::Lib(p) => Ok(Box::new(crate::target::library::LibTarget::open_with(
            &crate::target::library::image_path(p),
            opts,
        )?)),
        TargetSpec::Mount(p) => {
            Ok(Box::new(crate::target::mount::MountTarget::open(&crate::target::library::image_path(p))?))
        }
    }
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
}
