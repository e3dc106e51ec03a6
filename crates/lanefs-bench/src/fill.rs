//! `--fill F`: runs on a file system that is already F full.
//!
//! A log-structured file system is fast while it has free segments and pays for cleaning once
//! it does not, so its figures mean little without the utilisation they were measured at.
//! [`Filled`] wraps a target: before any run it writes filler files into a directory of its own
//! ([`FILL_DIR`], at the target's root) until F of the target's capacity ([`Target::space`]) is
//! in use, counting what was in use already, and makes them durable; closing or dropping the
//! target removes them again. Every other call goes through to the wrapped target unchanged.

use crate::progress::say;
use crate::runner::interrupted;
use crate::target::{remove_tree, File, IoCounters, OpenOptions, Stat, Target};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The filler's directory, at the root of the target.
pub const FILL_DIR: &str = "lanefs-bench-fill";
/// The largest fill accepted: above it a run has too little room to measure anything but
/// ENOSPC.
pub const MAX_FILL: f64 = 0.97;
/// Size of each filler file.
const FILL_FILE: u64 = 64 << 20;
/// Size of each filler write.
const FILL_IO: usize = 1 << 20;
/// Rounds of (measure, write what is missing, sync): file systems that account space late
/// (btrfs, after its commit) may need a second one.
const FILL_PASSES: usize = 8;

/// A target with filler files in [`FILL_DIR`] that take it to a given utilisation.
pub struct Filled {
    inner: Box<dyn Target>,
    /// Whether [`FILL_DIR`] exists and is ours to remove.
    present: AtomicBool,
    /// Bytes of filler written.
    written: u64,
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1 << 20) as f64)
}

fn is_enospc(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC) || e.kind() == io::ErrorKind::StorageFull
}

impl Filled {
    /// Fills `inner` until `fraction` of its capacity is in use (nothing is written when that
    /// much is in use already). A leftover [`FILL_DIR`] (from a run that was killed) is removed
    /// first. On failure the partial filler is removed, the target is closed and the error is
    /// one line.
    pub fn new(inner: Box<dyn Target>, fraction: f64) -> Result<Filled, String> {
        let mut f = Filled { inner, present: AtomicBool::new(false), written: 0 };
        match f.fill(fraction) {
            Ok(()) => Ok(f),
            Err(e) => {
                let mut msg = format!("{}: --fill {fraction}: {e}", f.inner.spec());
                if let Err(c) = f.close() {
                    msg += &format!("; cleanup: {c}");
                }
                Err(msg)
            }
        }
    }

    /// Bytes of filler written.
    pub fn written(&self) -> u64 {
        self.written
    }

    fn fill(&mut self, fraction: f64) -> Result<(), String> {
        if !(0.0..=MAX_FILL).contains(&fraction) {
            return Err(format!("the fill must be between 0 and {MAX_FILL}"));
        }
        let t = &*self.inner;
        let dir = Path::new(FILL_DIR);
        let space = || t.space().map_err(|e| format!("cannot read the free space: {e}"));
        if t.stat(dir).is_ok() {
            say(&format!("note: {}: removing {FILL_DIR}, left by an earlier run", t.spec()));
            remove_tree(t, dir).map_err(|e| format!("cannot remove the leftover {FILL_DIR}: {e}"))?;
        }
        let (total, free) = space()?;
        let goal = (fraction * total as f64).ceil() as u64;
        let mut used = total.saturating_sub(free);
        if used >= goal {
            if fraction > 0.0 {
                say(&format!(
                    "note: {}: {:.1} % in use already, no filler needed for {:.1} %",
                    t.spec(),
                    100.0 * used as f64 / total.max(1) as f64,
                    100.0 * fraction
                ));
            }
            return Ok(());
        }
        t.mkdir(dir).map_err(|e| format!("cannot create {FILL_DIR}: {e}"))?;
        self.present.store(true, Ordering::SeqCst);
        say(&format!(
            "{}: filling to {:.1} % of {} ({} in use): writing about {}",
            t.spec(),
            100.0 * fraction,
            mib(total),
            mib(used),
            mib(goal - used)
        ));
        let buf = vec![0xF1u8; FILL_IO];
        let mut files = 0u64;
        for _ in 0..FILL_PASSES {
            // Whole blocks: a partial one takes a block anyway.
            let need = (goal - used).div_ceil(4096) * 4096;
            let mut left = need;
            while left > 0 {
                let len = left.min(FILL_FILE);
                let path: PathBuf = dir.join(format!("f{files}"));
                files += 1;
                write_file(t, &path, len, &buf, &mut self.written).map_err(|e| {
                    if is_enospc(&e) {
                        let now = t.space().map(|(tt, f)| tt.saturating_sub(f)).unwrap_or(used);
                        format!(
                            "no space left after {} of filler ({} of {} in use, {:.1} %): the fill cannot be reached",
                            mib(self.written),
                            mib(now),
                            mib(total),
                            100.0 * now as f64 / total.max(1) as f64
                        )
                    } else {
                        format!("{}: {e}", path.display())
                    }
                })?;
                left -= len;
            }
            t.sync().map_err(|e| format!("sync: {e}"))?;
            let (total_now, free_now) = space()?;
            let before = used;
            used = total_now.saturating_sub(free_now);
            if used >= goal {
                return Ok(());
            }
            if used <= before {
                return Err(format!(
                    "{} of filler did not change the space in use ({}): cannot fill this file system",
                    mib(need),
                    mib(used)
                ));
            }
        }
        Err(format!(
            "{} in use of {} after {FILL_PASSES} passes: the fill cannot be reached",
            mib(used),
            mib(total)
        ))
    }

    /// Removes the filler, if it is there; idempotent.
    fn remove(&self) -> Result<(), String> {
        if !self.present.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        remove_tree(&*self.inner, Path::new(FILL_DIR))
            .map_err(|e| format!("{}: removing {FILL_DIR}: {e}", self.inner.spec()))
    }
}

/// Writes `len` bytes to a new file in `buf`-sized writes (adding them to `written`) and fsyncs
/// it.
fn write_file(t: &dyn Target, path: &Path, len: u64, buf: &[u8], written: &mut u64) -> io::Result<()> {
    let f: Box<dyn File> = t.open(path, OpenOptions::create_new())?;
    let mut off = 0;
    while off < len {
        if interrupted() {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"));
        }
        let n = (len - off).min(buf.len() as u64) as usize;
        f.write_all_at(&buf[..n], off)?;
        off += n as u64;
        *written += n as u64;
    }
    f.fsync()
}

impl Drop for Filled {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            say(&format!("lanefs bench: {e}"));
        }
    }
}

impl Target for Filled {
    fn spec(&self) -> String {
        self.inner.spec()
    }
    fn fs_type(&self) -> String {
        self.inner.fs_type()
    }
    fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Box<dyn File>> {
        self.inner.open(path, opts)
    }
    crate::target::forward_namespace!(inner);
    fn create(&self, path: &Path) -> io::Result<()> {
        self.inner.create(path)
    }
    fn space(&self) -> io::Result<(u64, u64)> {
        self.inner.space()
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn io_counters(&self) -> Option<IoCounters> {
        self.inner.io_counters()
    }
    fn fuse_requests(&self) -> Option<Vec<(String, u64)>> {
        self.inner.fuse_requests()
    }
    fn lock_census(&self) -> Option<lanefs::sync::Census> {
        self.inner.lock_census()
    }
    /// Removes the filler, then closes the wrapped target (a mount unmounts).
    fn close(&self) -> Result<(), String> {
        let removed = self.remove();
        let closed = self.inner.close();
        match (removed, closed) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(a), Ok(())) | (Ok(()), Err(a)) => Err(a),
            (Err(a), Err(b)) => Err(format!("{a}; {b}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::DirTarget;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    /// A directory that claims `total` bytes of capacity, counts what is written through it as
    /// used, and fails writes with ENOSPC beyond `real` bytes.
    struct Tiny {
        dir: DirTarget,
        total: u64,
        real: u64,
        used: Arc<AtomicU64>,
    }

    struct TinyFile {
        f: Box<dyn File>,
        real: u64,
        used: Arc<AtomicU64>,
    }

    impl File for TinyFile {
        fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
            self.f.read_at(buf, off)
        }
        fn write_at(&self, buf: &[u8], off: u64) -> io::Result<usize> {
            if self.used.load(Ordering::SeqCst) + buf.len() as u64 > self.real {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.used.fetch_add(buf.len() as u64, Ordering::SeqCst);
            self.f.write_at(buf, off)
        }
        fn fsync(&self) -> io::Result<()> {
            self.f.fsync()
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.f.set_len(len)
        }
        fn set_times(&self, atime: std::time::SystemTime, mtime: std::time::SystemTime) -> io::Result<()> {
            self.f.set_times(atime, mtime)
        }
    }

    impl Target for Tiny {
        fn spec(&self) -> String {
            "tiny:".into()
        }
        fn fs_type(&self) -> String {
            "tiny".into()
        }
        fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<Box<dyn File>> {
            let f = self.dir.open(path, opts)?;
            Ok(Box::new(TinyFile { f, real: self.real, used: self.used.clone() }))
        }
        crate::target::forward_namespace!(dir);
        fn space(&self) -> io::Result<(u64, u64)> {
            Ok((self.total, self.total - self.used.load(Ordering::SeqCst).min(self.total)))
        }
    }

    fn tiny(d: &Path, total: u64, real: u64, used: u64) -> Box<dyn Target> {
        let dir = DirTarget::new(d).unwrap();
        Box::new(Tiny { dir, total, real, used: Arc::new(AtomicU64::new(used)) })
    }

    #[test]
    fn fills_up_to_the_fraction_counting_what_is_used() {
        let d = tempfile::tempdir().unwrap();
        // 100 MiB, 10 in use: 0.75 takes 65 MiB more, in two files of at most 64 MiB.
        let f = Filled::new(tiny(d.path(), 100 << 20, 200 << 20, 10 << 20), 0.75).unwrap();
        assert_eq!(f.written(), 65 << 20);
        let (total, free) = f.space().unwrap();
        assert_eq!(total - free, 75 << 20);
        let mut names = f.readdir(Path::new(FILL_DIR)).unwrap();
        names.sort();
        assert_eq!(names, vec![OsString::from("f0"), OsString::from("f1")]);
        assert_eq!(f.stat(&Path::new(FILL_DIR).join("f1")).unwrap().size, 1 << 20);
        f.close().unwrap();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "close removes the filler");
        f.close().unwrap();

        // Already fuller than asked: nothing is written, nothing made.
        let f = Filled::new(tiny(d.path(), 100 << 20, 200 << 20, 80 << 20), 0.5).unwrap();
        assert_eq!(f.written(), 0);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        drop(f);

        // Dropping removes it too, and a leftover from a killed run is replaced.
        std::fs::create_dir(d.path().join(FILL_DIR)).unwrap();
        std::fs::write(d.path().join(FILL_DIR).join("old"), b"x").unwrap();
        let f = Filled::new(tiny(d.path(), 10 << 20, 20 << 20, 0), 0.3).unwrap();
        assert_eq!(f.readdir(Path::new(FILL_DIR)).unwrap(), vec![OsString::from("f0")]);
        drop(f);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "drop removes the filler");
    }

    #[test]
    fn a_fill_that_runs_out_of_space_is_one_line_and_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        // Claims 100 MiB, holds 40.
        let e = Filled::new(tiny(d.path(), 100 << 20, 40 << 20, 0), 0.9).err().unwrap();
        assert!(e.starts_with("tiny:: --fill 0.9: no space left after 40 MiB of filler"), "{e}");
        assert!(e.contains("cannot be reached") && !e.contains('\n'), "{e}");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
