//! `lib:IMAGE`: lanefs through its library API, in the benchmark's own process.
//!
//! Paths are resolved component by component from the root on every call, as the kernel's
//! path walk does for a mounted file system; files are used through `lanefs::Handle`s, which
//! skip the inode table on every read and write. A missing image is created (sparse, 8 GiB) and
//! formatted; an existing lanefs image is mounted as it is.

use crate::target::{File, IoCounters, OpenOptions, Stat, Target, TargetOptions};
use lanefs::device::{create_image, DeviceOptions, FileDevice};
use lanefs::{FileKind, Fs, FsOptions, Handle, Ino, MkfsOptions, ROOT};
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Size of an image `lib:` creates when the file does not exist.
pub const DEFAULT_IMAGE_BYTES: u64 = 8 << 30;

pub struct LibTarget {
    fs: Arc<Fs>,
    spec: String,
    /// Page cache when it is not lanefs's default (shown in the file system type).
    cache: Option<u64>,
}

fn err(e: lanefs::Error) -> io::Error {
    e.into()
}

impl LibTarget {
    pub fn open(image: &Path) -> Result<LibTarget, String> {
        Self::open_with(image, &TargetOptions::default())
    }

    /// As [`LibTarget::open`], with a page cache of `o.lib_cache` bytes instead of lanefs's
    /// default ([`FsOptions::cache_bytes`]; dirty pages beyond half of it are written back), and
    /// the persistent-memory region `o.nvm` (`FsOptions::nvm`, with
    /// `FsOptions::nvm_inline_pages` = `o.nvm_inline_pages`) if given, and cooperative
    /// checkpoints off if `o.no_cooperative`.
    pub fn open_with(image: &Path, o: &TargetOptions) -> Result<LibTarget, String> {
        let spec = format!("lib:{}", image.display());
        create_if_missing(image).map_err(|e| format!("{spec}: {e}"))?;
        let dev = FileDevice::open(image, DeviceOptions::default()).map_err(|e| format!("{spec}: {e}"))?;
        let mut opts = FsOptions {
            nvm: o.nvm.clone(),
            nvm_inline_pages: o.nvm_inline_pages,
            cooperative: !o.no_cooperative,
            ..FsOptions::default()
        };
        let cache = o.lib_cache.filter(|&c| c != opts.cache_bytes);
        if let Some(c) = cache {
            opts.cache_bytes = c;
        }
        let fs = Fs::open(Arc::new(dev), opts).map_err(|e| format!("{spec}: {e}"))?;
        Ok(LibTarget { fs: Arc::new(fs), spec, cache })
    }

    /// The inode of the directory holding `path`, and the last component: one walk of the
    /// library over the components before it (`Fs::walk`), with no allocation, as a kernel
    /// resolves the parent of a name it creates, removes or renames. A lookup per component
    /// would enter the engine once per directory and compute each one's attributes.
    fn parent_of<'p>(&self, path: &'p Path) -> io::Result<(Ino, &'p [u8])> {
        if path
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::RootDir | Component::CurDir))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: unsupported path", path.display()),
            ));
        }
        let names = || {
            path.components().filter_map(|c| match c {
                Component::Normal(n) => Some(n.as_encoded_bytes()),
                _ => None,
            })
        };
        let count = names().count();
        let last =
            names().next_back().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty path"))?;
        let dir =
            if count == 1 { ROOT } else { self.fs.walk(ROOT, names().take(count - 1)).map_err(err)?.ino };
        Ok((dir, last))
    }

    /// The attributes of what `path` names: the walk's last step returns them, as a kernel's
    /// stat(2) takes them from the inode its walk ends on.
    /// The attributes of what `path` names, in one walk of the library (as a kernel's stat(2)
    /// walks the path and takes the attributes of the inode it ends on).
    fn attr_of(&self, path: &Path) -> io::Result<lanefs::Attr> {
        let mut bad = None;
        let names = path.components().filter_map(|c| match c {
            Component::Normal(n) => Some(n.as_encoded_bytes()),
            Component::RootDir | Component::CurDir => None,
            _ => {
                bad = Some(c);
                None
            }
        });
        let a = self.fs.walk(ROOT, names);
        if bad.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: unsupported path", path.display()),
            ));
        }
        a.map_err(err)
    }

    fn ino_of(&self, path: &Path) -> io::Result<Ino> {
        Ok(self.attr_of(path)?.ino)
    }
}

struct LibFile {
    fs: Arc<Fs>,
    h: Handle,
    dsync: bool,
}

impl File for LibFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.h.read_at(off, buf).map_err(err)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<usize> {
        let n = self.h.write_at(off, buf).map_err(err)?;
        if self.dsync {
            self.h.fsync(true).map_err(err)?;
        }
        Ok(n)
    }
    fn fsync(&self) -> io::Result<()> {
        self.h.fsync(false).map_err(err)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.fs.truncate(self.h.ino(), len).map_err(err)
    }
    fn set_times(&self, atime: std::time::SystemTime, mtime: std::time::SystemTime) -> io::Result<()> {
        let a =
            lanefs::SetAttr { atime: Some(atime.into()), mtime: Some(mtime.into()), ..Default::default() };
        self.fs.setattr(self.h.ino(), &a).map(drop).map_err(err)
    }
}

impl Target for LibTarget {
    fn spec(&self) -> String {
        self.spec.clone()
    }

    fn fs_type(&self) -> String {
        match self.cache {
            None => "lanefs-lib".into(),
            Some(c) if c % (1 << 20) == 0 => format!("lanefs-lib (cache {} MiB)", c >> 20),
            Some(c) => format!("lanefs-lib (cache {} KiB)", c >> 10),
        }
    }

    fn open(&self, path: &Path, o: OpenOptions) -> io::Result<Box<dyn File>> {
        let (d, name) = self.parent_of(path)?;
        let ino = match self.fs.lookup(d, name) {
            Ok(a) => {
                if o.create && o.exclusive {
                    return Err(io::Error::from_raw_os_error(libc::EEXIST));
                }
                if a.kind == FileKind::Dir {
                    return Err(io::Error::from_raw_os_error(libc::EISDIR));
                }
                if o.truncate {
                    self.fs.truncate(a.ino, 0).map_err(err)?;
                }
                a.ino
            }
            Err(e) if e.to_errno() == libc::ENOENT && o.create => {
                self.fs.create(d, name, 0o644, 0, 0).map_err(err)?.ino
            }
            Err(e) => return Err(err(e)),
        };
        let h = self.fs.open_file(ino).map_err(err)?;
        Ok(Box::new(LibFile { fs: self.fs.clone(), h, dsync: o.dsync }))
    }

    fn mkdir(&self, path: &Path) -> io::Result<()> {
        let (d, name) = self.parent_of(path)?;
        self.fs.mkdir(d, name, 0o755, 0, 0).map(|_| ()).map_err(err)
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        let (d, name) = self.parent_of(path)?;
        self.fs.rmdir(d, name).map_err(err)
    }

    fn unlink(&self, path: &Path) -> io::Result<()> {
        let (d, name) = self.parent_of(path)?;
        self.fs.unlink(d, name).map_err(err)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (fd, fname) = self.parent_of(from)?;
        let (td, tname) = self.parent_of(to)?;
        self.fs.rename(fd, fname, td, tname, lanefs::RenameFlags::empty()).map_err(err)
    }

    fn readdir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        let ino = self.ino_of(path)?;
        let mut out = Vec::new();
        let mut cookie = 2;
        // Bounded: each page advances the cookie; an empty page ends the listing.
        loop {
            let page = self.fs.readdir(ino, cookie, 512).map_err(err)?;
            let Some(last) = page.last() else { break };
            cookie = last.cookie;
            out.extend(page.into_iter().map(|e| OsString::from_vec(e.name)));
        }
        Ok(out)
    }

    fn space(&self) -> io::Result<(u64, u64)> {
        let s = self.fs.statfs();
        Ok((s.blocks * s.bsize as u64, s.bavail * s.bsize as u64))
    }

    fn sync(&self) -> io::Result<()> {
        self.fs.sync().map_err(err)
    }

    fn io_counters(&self) -> Option<IoCounters> {
        let s = self.fs.io_stats();
        Some(IoCounters {
            user_bytes: s.user_bytes,
            device_bytes: s.device_bytes(),
            cleaning_bytes: s.cleaning_bytes,
            segments_cleaned: s.segments_cleaned,
            checkpoints: s.checkpoints_durable,
            cp_exclusive_us_max: self.fs.take_cp_exclusive_peak_us(),
            cp_waits: s.cp_waits,
            cp_helped: s.cp_helped,
            fsync_flushes: s.fsync_device_flushes,
            fsyncs: s.fsync_flushes,
        })
    }

    fn lock_census(&self) -> Option<lanefs::sync::Census> {
        Some(self.fs.lock_census())
    }

    fn stat(&self, path: &Path) -> io::Result<Stat> {
        let a = self.attr_of(path)?;
        Ok(Stat { size: a.size, is_dir: a.kind == FileKind::Dir })
    }
}

/// Creates `image` (sparse, [`DEFAULT_IMAGE_BYTES`]) and formats it with the default geometry
/// (one lane per core) when it does not exist; an existing file is left alone. Returns whether
/// it created the image. A half-made image (format failed) is removed again. Shared by `lib:`
/// and `mount:` targets.
pub fn create_if_missing(image: &Path) -> Result<bool, String> {
    if image.exists() {
        return Ok(false);
    }
    create_image(image, DEFAULT_IMAGE_BYTES).map_err(|e| e.to_string())?;
    let formatted =
        FileDevice::open(image, DeviceOptions::default()).map_err(|e| e.to_string()).and_then(|dev| {
            let lanes =
                std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1).clamp(1, 64);
            Fs::format(&dev, &MkfsOptions { lanes, ..Default::default() }).map_err(|e| e.to_string())
        });
    if let Err(e) = formatted {
        let _ = std::fs::remove_file(image);
        return Err(format!("cannot format a new image: {e}"));
    }
    Ok(true)
}

/// Where `lib:` and `mount:` targets put their image when given a directory instead of a file.
pub fn image_path(p: &Path) -> PathBuf {
    if p.is_dir() {
        p.join("lanefs-bench.img")
    } else {
        p.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::{open_target, open_target_with};

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
}
