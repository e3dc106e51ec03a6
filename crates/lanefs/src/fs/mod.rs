//! The library API: a mounted lanefs with POSIX-shaped calls.
//!
//! [`Fs`] translates; it decides nothing. Inode numbers are the on-disk node ids (stable across
//! mounts); the root is [`ROOT`]. Errors carry an errno ([`Error::to_errno`]) and print as one
//! line. Permissions are not checked here: a library caller is trusted as the owner of the image,
//! and the FUSE adapter lets the kernel check them (`default_permissions`). What a change takes
//! from a file (set-ID bits, file capabilities) depends on who makes it: the plain calls act as
//! a privileged caller, the `_as` calls for a [`Caller`] (see [`crate::perm`]). POSIX ACLs are
//! the same for every caller: inherited from a directory's default ACL, and kept in step with
//! the mode (see [`crate::acl`]).
//!
//! # Example
//!
//! ```
//! use lanefs::device::MemDevice;
//! use lanefs::{Fs, FsOptions, MkfsOptions, ROOT};
//! use std::sync::Arc;
//!
//! let dev = Arc::new(MemDevice::new(64 << 20));
//! Fs::format(&*dev, &MkfsOptions { lanes: 1, ..Default::default() }).unwrap();
//! let fs = Fs::open(dev.clone(), FsOptions::default()).unwrap();
//! let dir = fs.mkdir(ROOT, b"docs", 0o755, 0, 0).unwrap();
//! let f = fs.create(dir.ino, b"hello.txt", 0o644, 0, 0).unwrap();
//! fs.write_at(f.ino, 0, b"hello, world").unwrap();
//! fs.fsync(f.ino, false).unwrap();
//! let mut buf = [0u8; 5];
//! assert_eq!(fs.read_at(f.ino, 7, &mut buf).unwrap(), 5);
//! assert_eq!(&buf, b"world");
//! fs.unmount().unwrap();
//!
//! let fs = Fs::open(dev, FsOptions::default()).unwrap();
//! assert_eq!(fs.resolve("/docs/hello.txt").unwrap().size, 12);
//! ```

use crate::device::BlockDevice;
use crate::engine::Engine;
pub use crate::engine::FsOptions;
use crate::error::{Error, Result};
use crate::flush::checkpoint::Background;
use crate::format::node::S_IFMT;
pub use crate::fsctl::TrimRange;
pub use crate::mem::atime::{AtimeMode, AtimePolicy};
pub use crate::mem::iflags::InodeFlags;
use crate::mem::mnode::MNode;
use crate::mem::ops::NewInode;
pub use crate::mkfs::MkfsOptions;
pub use crate::perm::{Caller, Privileged};
pub use crate::recovery::RecoveryReport;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use types::kind_of_dtype;

mod control;
mod flags;
mod handle;
mod names;
mod tmpfile;
mod types;

pub use flags::{FallocMode, RenameFlags, XattrFlags};

pub use handle::Handle;
pub use types::{Attr, DirEntry, FileKind, IoStats, Listing, New, SetAttr, StatFs};

/// An inode number.
pub type Ino = u64;
/// The root directory.
pub const ROOT: Ino = 1;

/// A mounted lanefs.
pub struct Fs {
    pub(crate) engine: Arc<Engine>,
    recovery: RecoveryReport,
    /// The checkpoint and cleaning thread (none on a read-only mount).
    background: Option<Background>,
}

pub(crate) fn ino32(ino: Ino) -> Result<u32> {
    u32::try_from(ino)
        .ok()
        .filter(|&i| i != 0)
        .ok_or_else(|| Error::errno(libc::ENOENT, format!("inode {ino}")))
}

impl Fs {
    /// Formats `dev` (the same as [`format_device`](crate::format_device), returning nothing).
    pub fn format(dev: &dyn BlockDevice, opts: &MkfsOptions) -> Result<()> {
        crate::mkfs::format_device(dev, opts).map(|_| ())
    }

    /// Mounts `dev`, recovering from a crash if needed.
    pub fn open(dev: Arc<dyn BlockDevice>, opts: FsOptions) -> Result<Fs> {
        let interval = opts.checkpoint_interval;
        let read_only = opts.read_only;
        let (engine, recovery) = crate::recovery::mount(dev, opts)?;
        let background = if read_only { None } else { Some(Background::start(engine.clone(), interval)?) };
        Ok(Fs { engine, recovery, background })
    }

    /// What mount-time recovery did.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The persistent-memory region holding the NAT (and the lane journals), when mounted with
    /// one (`FsOptions::nvm`).
    pub fn nvm(&self) -> Option<&crate::pmem::nat::NvmNat> {
        self.engine.disk.nvm.as_ref()
    }

    /// What stat reports of `m`. Reads the attributes' lock-free mirror (`MetaLock::stat`):
    /// no lock, and no store to a line other threads read.
    pub(crate) fn attr(&self, m: &MNode) -> Attr {
        let meta = m.meta.stat();
        // A directory's size is summed over its map's shards (`DirMap::len`): once, and its
        // blocks derived from it as `Engine::allocated_blocks` does.
        let (size, blocks) = match m.dir() {
            Some(d) => {
                let size = d.map.reported_size();
                (size, size / crate::device::BLOCK_SIZE as u64)
            }
            None => (m.size.load(Ordering::Acquire), self.engine.allocated_blocks(m)),
        };
        Attr {
            ino: m.ino as Ino,
            kind: FileKind::of(meta.mode),
            mode: meta.mode,
            nlink: meta.nlink,
            uid: meta.uid,
            gid: meta.gid,
            size,
            blocks: blocks * 8,
            atime: m.atime(),
            mtime: m.mtime(),
            ctime: m.ctime(),
            crtime: meta.crtime,
            rdev: meta.rdev,
            blksize: 4096,
            generation: meta.generation,
        }
    }

    /// The entry `name` in directory `parent` (lookup(2)'s step of a path walk); ENOENT if none.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        self.engine.disk.check_live()?;
        self.engine.lookup_with(ino32(parent)?, name, |m| self.attr(m))
    }

    /// The inode numbered `ino`, as a file handle names it: any type, and ENOENT once it has
    /// no name left (removed, even if still open). The caller compares [`Attr::generation`] with
    /// the handle's to tell a reused number from the inode the handle was made for.
    pub fn lookup_ino(&self, ino: Ino) -> Result<Attr> {
        let _g = self.engine.mem.pass.shared();
        let a = self.engine.with_mnode(ino32(ino)?, |m| self.attr(m))?;
        if a.nlink == 0 {
            return Err(Error::errno(libc::ENOENT, format!("inode {ino} was removed")));
        }
        Ok(a)
    }

    /// Looks up an absolute path such as `/a/b/c`.
    pub fn resolve(&self, path: &str) -> Result<Attr> {
        self.walk(ROOT, path.split('/').filter(|p| !p.is_empty()).map(str::as_bytes))
    }

    /// The attributes of what `names` lead to from directory `dir`, one component each (none:
    /// `dir` itself). The whole walk is one step of the engine: the directories passed
    /// through are read, not stat'ed. Symbolic links are not followed; one on the way, or any
    /// other non-directory, is ENOTDIR, and a missing name ENOENT.
    ///
    /// ```
    /// # use lanefs::{device::MemDevice, Fs, FsOptions, MkfsOptions, ROOT};
    /// # use std::sync::Arc;
    /// # let dev = Arc::new(MemDevice::new(64 << 20));
    /// # Fs::format(&*dev, &MkfsOptions::default()).unwrap();
    /// # let fs = Fs::open(dev, FsOptions::default()).unwrap();
    /// let a = fs.mkdir(ROOT, b"a", 0o755, 0, 0).unwrap();
    /// let b = fs.mkdir(a.ino, b"b", 0o755, 0, 0).unwrap();
    /// assert_eq!(fs.walk(ROOT, [&b"a"[..], b"b"]).unwrap().ino, b.ino);
    /// ```
    pub fn walk<'n>(&self, dir: Ino, names: impl IntoIterator<Item = &'n [u8]>) -> Result<Attr> {
        self.engine.disk.check_live()?;
        let a = self.engine.walk_with(ino32(dir)?, names, |m| self.attr(m))?;
        Ok(a)
    }

    /// The mnode of `ino` (kept alive by the caller's reference however it is unlinked).
    fn mnode(&self, ino: Ino) -> Result<Arc<MNode>> {
        self.engine.disk.check_live()?;
        let _g = self.engine.mem.pass.shared();
        self.engine.mnode(ino32(ino)?)
    }

    /// stat(2) of `ino`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.engine.disk.check_live()?;
        let _g = self.engine.mem.pass.shared();
        self.engine.with_mnode(ino32(ino)?, |m| self.attr(m))
    }

    /// Changes attributes (chmod, chown, truncate, utimes) as a privileged caller; returns
    /// the new attributes. See [`Fs::setattr_as`] for what a change drops.
    pub fn setattr(&self, ino: Ino, a: &SetAttr) -> Result<Attr> {
        self.set_attr(ino, a, None)
    }

    /// [`Fs::setattr`] by `caller`: a size change and a chown first drop the privileges they
    /// take (see `src/perm.rs`).
    pub fn setattr_as(&self, ino: Ino, a: &SetAttr, caller: &dyn Caller) -> Result<Attr> {
        self.set_attr(ino, a, Some(caller))
    }

    fn set_attr(&self, ino: Ino, a: &SetAttr, caller: Option<&dyn Caller>) -> Result<Attr> {
        self.engine.disk.check_live()?;
        let m = self.engine.setattr(
            ino32(ino)?,
            a.mode,
            a.uid,
            a.gid,
            a.size,
            a.atime,
            a.mtime,
            a.ctime,
            a.times_now,
            caller,
        )?;
        self.sync_if(&m, InodeFlags::SYNC)?;
        Ok(self.attr(&m))
    }

    /// The inode's flags, as `lsattr` shows them (FS_IOC_GETFLAGS).
    pub fn get_flags(&self, ino: Ino) -> Result<InodeFlags> {
        self.engine.disk.check_live()?;
        self.engine.get_flags(ino32(ino)?)
    }

    /// Sets the inode's flags (FS_IOC_SETFLAGS, `chattr`): EOPNOTSUPP for a flag lanefs does
    /// not support; EPERM for a change of [`InodeFlags::IMMUTABLE`] or [`InodeFlags::APPEND`]
    /// unless `privileged` (the caller holds CAP_LINUX_IMMUTABLE), and for any other change
    /// while the inode stays immutable. Updates the ctime. What each flag does is in
    /// [`InodeFlags`]; the engine enforces them for every caller, this API's included.
    ///
    /// ```
    /// # let dev = std::sync::Arc::new(lanefs::device::MemDevice::new(64 << 20));
    /// # lanefs::Fs::format(&*dev, &lanefs::MkfsOptions::default()).unwrap();
    /// # let fs = lanefs::Fs::open(dev, lanefs::FsOptions::default()).unwrap();
    /// use lanefs::{InodeFlags, ROOT};
    /// let f = fs.create(ROOT, b"log", 0o644, 0, 0).unwrap();
    /// fs.write_at(f.ino, 0, b"one\n").unwrap();
    /// fs.set_flags(f.ino, InodeFlags::APPEND, true).unwrap();
    /// assert_eq!(fs.write_at(f.ino, 0, b"two\n").unwrap_err().to_errno(), libc::EPERM);
    /// fs.write_at(f.ino, 4, b"two\n").unwrap(); // at the end: allowed
    /// assert_eq!(fs.unlink(ROOT, b"log").unwrap_err().to_errno(), libc::EPERM);
    /// ```
    pub fn set_flags(&self, ino: Ino, flags: InodeFlags, privileged: bool) -> Result<Attr> {
        self.engine.disk.check_live()?;
        let m = self.engine.set_flags(ino32(ino)?, flags, privileged)?;
        self.sync_if(&m, InodeFlags::SYNC)?;
        Ok(self.attr(&m))
    }

    /// The access-time policy in force ([`FsOptions::atime`] at mount).
    pub fn atime_policy(&self) -> AtimePolicy {
        self.engine.mem.atime_policy()
    }

    /// Changes the access-time policy (a remount with other atime options).
    pub fn set_atime_policy(&self, p: AtimePolicy) {
        self.engine.mem.set_atime_policy(p)
    }

    /// Makes `m`'s last change durable if its flags ask for it (`SYNC`, or `DIRSYNC` of a
    /// directory whose entries changed).
    fn sync_if(&self, m: &Arc<MNode>, which: InodeFlags) -> Result<()> {
        if InodeFlags(m.iflags()).intersects(which) {
            self.engine.fsync_mnode(m, false)?;
        }
        Ok(())
    }

    /// After an entry change in directory `dir`: durable now if it is DIRSYNC or SYNC.
    /// The flags are read pinned (`Engine::with_mnode`), and the mnode taken only when it must
    /// be synced: every create, unlink and rename ends here, and a reference taken each time
    /// would write the shared directory's count, a line every core bounces.
    ///
    /// The change has been made when this runs, so it never fails for want of the directory:
    /// between the change and this lookup another thread may remove the directory (emptied by
    /// this very unlink or rename) and a checkpoint reap its inode, and the lookup then finds
    /// no inode `dir`. Its flags are gone with it, so it is made durable as if it were
    /// DIRSYNC: the checkpoint that reaped it holds the change (the directory was removed
    /// after it), and the one taken here is durable only after that one.
    fn dirsync(&self, dir: Ino) -> Result<()> {
        let which = InodeFlags(InodeFlags::DIRSYNC.bits() | InodeFlags::SYNC.bits());
        let ino = ino32(dir)?;
        let m = {
            let _g = self.engine.mem.pass.shared();
            match self.engine.with_mnode(ino, |m| InodeFlags(m.iflags()).intersects(which)) {
                Ok(false) => return Ok(()),
                Ok(true) => self.engine.mnode(ino),
                Err(e) => Err(e),
            }
        };
        match m {
            Ok(m) => self.sync_if(&m, which),
            // Outside the semaphore: the checkpoint's snapshot takes it exclusive.
            Err(e) if e.to_errno() == libc::ENOENT => self.engine.checkpoint(false),
            Err(e) => Err(e),
        }
    }

    /// Creates a regular file (`mode`: permission bits).
    pub fn create(&self, parent: Ino, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mknod(parent, name, 0o100000 | (mode & 0o7777), 0, uid, gid)
    }

    /// Creates a file of any type (`mode` includes the type bits).
    pub fn mknod(&self, parent: Ino, name: &[u8], mode: u32, rdev: u64, uid: u32, gid: u32) -> Result<Attr> {
        let mode = if mode & S_IFMT == 0 { mode | 0o100000 } else { mode };
        if mode & S_IFMT == 0o040000 {
            return Err(Error::errno(libc::EINVAL, "use mkdir"));
        }
        self.make(parent, name, &New { mode, rdev, uid, gid, umask: 0 })
    }

    /// Creates directory `name` in `parent` with permission bits `mode`, owned by `uid`:`gid`.
    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.make(parent, name, &New { mode: 0o040000 | (mode & 0o7777), uid, gid, ..Default::default() })
    }

    /// Creates a file, directory or special file as `new` says (a process's create, mkdir or
    /// mknod, with its umask).
    pub fn make(&self, parent: Ino, name: &[u8], new: &New) -> Result<Attr> {
        self.engine.disk.check_live()?;
        let mode = if new.mode & S_IFMT == 0 { new.mode | 0o100000 } else { new.mode };
        if mode & S_IFMT == 0o120000 {
            return Err(Error::errno(libc::EINVAL, "use symlink"));
        }
        let m = self.engine.create_node(
            ino32(parent)?,
            name,
            NewInode { mode, uid: new.uid, gid: new.gid, rdev: new.rdev, symlink: &[], umask: new.umask },
        )?;
        self.dirsync(parent)?;
        Ok(self.attr(&m))
    }

    /// Creates symbolic link `name` in `parent` pointing to `target`, owned by `uid`:`gid`.
    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
        self.engine.disk.check_live()?;
        let m = self.engine.create_node(
            ino32(parent)?,
            name,
            NewInode { mode: 0o120777, uid, gid, rdev: 0, symlink: target, umask: 0 },
        )?;
        self.dirsync(parent)?;
        Ok(self.attr(&m))
    }

    /// The target of symlink `ino`; EINVAL for any other type.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.engine.disk.check_live()?;
        let _g = self.engine.mem.pass.shared();
        let m = self.engine.mnode(ino32(ino)?)?;
        if m.file_type != 0o120000 {
            return Err(Error::errno(libc::EINVAL, "not a symlink"));
        }
        let target = m.meta.lock().symlink.clone();
        self.engine.touch_atime(&m);
        Ok(target)
    }

    /// Gives inode `ino` the new name `newname` in `newparent` (link(2)); EPERM for a directory.
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        self.engine.disk.check_live()?;
        let m = self.engine.link(ino32(ino)?, ino32(newparent)?, newname)?;
        self.dirsync(newparent)?;
        Ok(self.attr(&m))
    }

    /// Removes the name `name` from `parent` (unlink(2)); the inode goes with its last name
    /// and last open reference.
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.unlink(ino32(parent)?, name)?;
        self.dirsync(parent)
    }

    /// Removes the empty directory `name` from `parent` (rmdir(2)); ENOTEMPTY otherwise.
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.rmdir(ino32(parent)?, name)?;
        self.dirsync(parent)
    }

    /// rename(2); `flags` may hold [`RenameFlags::NOREPLACE`], [`RenameFlags::EXCHANGE`] or
    /// [`RenameFlags::WHITEOUT`] (a whiteout made this way is owned by root; see
    /// [`Fs::rename_as`]).
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.rename_as(parent, name, newparent, newname, flags, 0, 0)
    }

    /// rename(2) as [`Fs::rename`], where a whiteout ([`RenameFlags::WHITEOUT`]) is owned by `uid`
    /// and `gid`, the caller's (a new inode's owner: `gid` already chosen for a set-group-ID
    /// directory). The rename and its whiteout are one operation: durable together or not at
    /// all. RENAME_WHITEOUT with RENAME_EXCHANGE is EINVAL; with no inode number left, ENOSPC
    /// and nothing renamed.
    #[allow(clippy::too_many_arguments)]
    pub fn rename_as(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
        uid: u32,
        gid: u32,
    ) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.rename(ino32(parent)?, name, ino32(newparent)?, newname, flags.bits(), (uid, gid))?;
        self.dirsync(parent)?;
        if newparent != parent {
            self.dirsync(newparent)?;
        }
        Ok(())
    }

    /// Opens an inode: keeps it alive after its last name is removed until [`Fs::release`].
    pub fn open_ino(&self, ino: Ino) -> Result<Attr> {
        self.engine.disk.check_live()?;
        let m = self.engine.open_file(ino32(ino)?)?;
        Ok(self.attr(&m))
    }

    /// Opens an inode as open(2) with `flags` (`libc::O_*`: the access mode, `O_APPEND`,
    /// `O_TRUNC`) would: EPERM for a write open of an immutable inode, and for one of an
    /// append-only inode without `O_APPEND` or with `O_TRUNC`. Else as [`Fs::open_ino`].
    pub fn open_with(&self, ino: Ino, flags: i32) -> Result<Attr> {
        self.engine.disk.check_live()?;
        let m = self.engine.open_checked(ino32(ino)?, flags)?;
        Ok(self.attr(&m))
    }

    /// Drops an open reference taken by [`Fs::open_ino`] or [`Fs::open_with`]: an unlinked
    /// inode is freed with its last one.
    pub fn release(&self, ino: Ino) -> Result<()> {
        self.engine.release(ino32(ino)?)
    }

    /// Takes one reference to `ino` for a kernel that serves it through a mount (FUSE's
    /// lookup count: call it for every entry reply the kernel counts) and returns its
    /// attributes. Like an open, the reference keeps the inode alive once its last name is
    /// removed, until [`Fs::forget`] gives it back: the kernel may still send requests for it.
    /// (Only while the orphan list, which every checkpoint records and which holds 4096, is at
    /// most half full; past that an unlinked inode no file has open dies at once, as if no
    /// reference had been taken.) ENOENT if the inode is gone (its last name was removed while
    /// nothing held it).
    ///
    /// ```
    /// # use lanefs::{device::MemDevice, Fs, FsOptions, MkfsOptions, ROOT};
    /// # use std::sync::Arc;
    /// # let dev = Arc::new(MemDevice::new(64 << 20));
    /// # Fs::format(&*dev, &MkfsOptions::default()).unwrap();
    /// # let fs = Fs::open(dev, FsOptions::default()).unwrap();
    /// let f = fs.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    /// fs.remember(f.ino).unwrap();
    /// fs.unlink(ROOT, b"f").unwrap();
    /// fs.sync().unwrap();
    /// assert_eq!(fs.getattr(f.ino).unwrap().nlink, 0, "held: not deleted");
    /// fs.forget(f.ino, 1).unwrap();
    /// fs.sync().unwrap();
    /// assert!(fs.getattr(f.ino).is_err(), "deleted with its last reference");
    /// ```
    pub fn remember(&self, ino: Ino) -> Result<Attr> {
        self.engine.disk.check_live()?;
        self.engine.remember_with(ino32(ino)?, |m| self.attr(m))
    }

    /// Gives back `n` references [`Fs::remember`] took (FUSE's FORGET); an inode with no name
    /// and no open handle is deleted with the last. EINVAL if that is more than were taken (they
    /// are all given back then).
    pub fn forget(&self, ino: Ino, n: u64) -> Result<()> {
        self.engine.forget(ino32(ino)?, n)
    }

    /// Gives back every reference [`Fs::remember`] took, as when a mount's kernel session ends
    /// (the kernel sends no FORGET for what it holds then); returns how many inodes had any.
    pub fn forget_all(&self) -> usize {
        self.engine.forget_all()
    }

    /// Opens a file for I/O through a [`Handle`], which skips the inode table on every call
    /// (the way a FUSE file handle or an application holding a descriptor works). The inode
    /// stays alive until the handle is dropped, even if its last name is removed.
    pub fn open_file(&self, ino: Ino) -> Result<Handle> {
        self.engine.disk.check_live()?;
        let m = self.engine.open_file(ino32(ino)?)?;
        Ok(Handle { engine: self.engine.clone(), m })
    }

    /// Reads up to `buf.len()` bytes at `off`; returns how many (0 at or past the end).
    pub fn read_at(&self, ino: Ino, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.engine.disk.check_live()?;
        self.engine.read_at(ino32(ino)?, off, buf)
    }

    /// Writes `data` at `off`, growing the file as needed; returns the bytes written. Durable
    /// after [`Fs::fsync`].
    pub fn write_at(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        self.engine.disk.check_live()?;
        self.engine.write_at(ino32(ino)?, off, data)
    }

    /// A write for a cache that owns the file's mtime and ctime (the kernel's FUSE writeback
    /// cache, which stamps them at write(2) and sends them with [`Fs::setattr`]): as
    /// [`Fs::write_at_as`] (or [`Fs::write_at`] without a `caller`), but the times are left
    /// alone. A cache writes back whole pages, so a write to an append-only file may repeat
    /// bytes the file holds before the ones it appends.
    pub fn write_keep_times(
        &self,
        ino: Ino,
        off: u64,
        data: &[u8],
        caller: Option<&dyn Caller>,
    ) -> Result<usize> {
        let m = self.mnode(ino)?;
        if let Some(c) = caller {
            self.engine.drop_privs_for_write(&m, data, c)?;
        }
        self.engine.write_mnode_with(&m, off, data, crate::mem::ops::WriteTimes::Keep)
    }

    /// [`Fs::write_at`] by `caller`, who first loses what a write takes (see `src/perm.rs`):
    /// no one sees the new bytes with the old set-ID bits.
    pub fn write_at_as(&self, ino: Ino, off: u64, data: &[u8], caller: &dyn Caller) -> Result<usize> {
        let m = self.mnode(ino)?;
        self.engine.write_mnode_as(&m, off, data, caller)
    }

    /// Sets the size of regular file `ino` to `size`: drops what lies past it, or extends with
    /// a hole.
    pub fn truncate(&self, ino: Ino, size: u64) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.truncate(ino32(ino)?, size)
    }

    /// fallocate(2): an empty mode or [`FallocMode::KEEP_SIZE`] (reserve the space: ENOSPC,
    /// with nothing changed, when it is not there), [`FallocMode::PUNCH_HOLE`] (with keep
    /// size), or [`FallocMode::ZERO_RANGE`] (with or without keep size). Other modes are
    /// EOPNOTSUPP.
    pub fn fallocate(&self, ino: Ino, mode: FallocMode, off: u64, len: u64) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.fallocate(ino32(ino)?, mode.bits() as i32, off, len)
    }

    /// [`Fs::fallocate`] by `caller`, who first loses what a write takes (any mode: the VFS
    /// treats an allocation, a punch and a zeroing alike).
    pub fn fallocate_as(
        &self,
        ino: Ino,
        mode: FallocMode,
        off: u64,
        len: u64,
        caller: &dyn Caller,
    ) -> Result<()> {
        let m = self.mnode(ino)?;
        if m.pages().is_some() {
            self.engine.drop_privs(&m, crate::perm::Change::Data, caller)?;
        }
        self.engine.fallocate(ino32(ino)?, mode.bits() as i32, off, len)
    }

    /// Up to `max` entries after `cookie` (0 starts; "." and ".." come first). Every call sees
    /// the directory as it is: a caller that renames entries as it lists them should use a
    /// [`Listing`] instead, or it may meet them again without end.
    pub fn readdir(&self, ino: Ino, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        self.read_dir(ino, cookie, max, None)
    }

    /// Starts a listing of directory `ino` (see [`Listing`]).
    ///
    /// ```
    /// # let dev = std::sync::Arc::new(lanefs::device::MemDevice::new(64 << 20));
    /// # lanefs::Fs::format(&*dev, &lanefs::MkfsOptions::default()).unwrap();
    /// # let fs = lanefs::Fs::open(dev, lanefs::FsOptions::default()).unwrap();
    /// use lanefs::ROOT;
    /// for n in 0..3 {
    ///     fs.create(ROOT, format!("f{n}").as_bytes(), 0o644, 0, 0).unwrap();
    /// }
    /// let listing = fs.listing(ROOT).unwrap();
    /// let (mut cookie, mut seen) = (0, 0);
    /// loop {
    ///     let batch = fs.readdir_listing(&listing, cookie, 2).unwrap();
    ///     for e in &batch {
    ///         if e.name.starts_with(b"f") {
    ///             // Renamed away and back: a new cookie, past the listing's horizon.
    ///             fs.rename(ROOT, &e.name, ROOT, b"tmp", lanefs::RenameFlags::empty()).unwrap();
    ///             fs.rename(ROOT, b"tmp", ROOT, &e.name, lanefs::RenameFlags::empty()).unwrap();
    ///             seen += 1;
    ///         }
    ///     }
    ///     match batch.last() {
    ///         Some(e) => cookie = e.cookie,
    ///         None => break,
    ///     }
    /// }
    /// assert_eq!(seen, 3, "each entry once, and the listing ends");
    /// ```
    pub fn listing(&self, ino: Ino) -> Result<Listing> {
        self.engine.disk.check_live()?;
        let _g = self.engine.mem.pass.shared();
        let d = self.engine.dir_mnode(ino32(ino)?)?;
        // Starting a listing is an access of the directory, as each read of it is: a mount's
        // kernel may serve the reads from its own cache of the listing, which the engine never
        // sees (`mem::atime` decides whether it changes anything).
        self.engine.touch_atime(&d);
        Ok(Listing { ino, horizon: d.dir().expect("dir").map.horizon() })
    }

    /// Up to `max` entries of `listing` after `cookie` (0 starts; "." and ".." come first).
    pub fn readdir_listing(&self, listing: &Listing, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        self.read_dir(listing.ino, cookie, max, Some(&listing.horizon))
    }

    fn read_dir(
        &self,
        ino: Ino,
        cookie: u64,
        max: usize,
        horizon: Option<&crate::mem::dir::Horizon>,
    ) -> Result<Vec<DirEntry>> {
        self.engine.disk.check_live()?;
        let _g = self.engine.mem.pass.shared();
        let d = self.engine.dir_mnode(ino32(ino)?)?;
        // A listing is an access of the directory (unless `nodiratime`), as getdents is.
        self.engine.touch_atime(&d);
        let mut out = Vec::new();
        if cookie < 1 && out.len() < max {
            out.push(DirEntry { name: b".".to_vec(), ino, kind: FileKind::Dir, cookie: 1 });
        }
        if cookie < 2 && out.len() < max {
            let p = d.parent.load(Ordering::Acquire) as Ino;
            out.push(DirEntry { name: b"..".to_vec(), ino: p, kind: FileKind::Dir, cookie: 2 });
        }
        let left = max - out.len();
        if left > 0 {
            for (name, e) in d.dir().expect("dir").map.list_after(cookie.max(2), left, horizon) {
                out.push(DirEntry {
                    name,
                    ino: e.ino as Ino,
                    kind: kind_of_dtype(e.file_type),
                    cookie: e.cookie,
                });
            }
        }
        Ok(out)
    }

    /// Space as statfs(2) reports it. The size is the main area less the cleaner's reserve and
    /// one open segment per log; free space is that less every valid block, what dirty data
    /// will take and the blocks preallocated and not yet written (`mem::reserve`), so invalid
    /// blocks count as free (cleaning gives them back); and of that, the share that data can
    /// fill beside the nodes that map it, so that a write or fallocate of up to `bfree` new
    /// blocks does not fail with ENOSPC.
    pub fn statfs(&self) -> StatFs {
        let e = &self.engine;
        let g = &e.disk.g;
        let usable = g.user_blocks();
        let free_blocks = e.free_data_blocks().min(usable);
        let used_nodes = self.engine.disk.nat.valid_nodes();
        StatFs {
            bsize: 4096,
            blocks: usable,
            bfree: free_blocks,
            bavail: free_blocks,
            files: g.max_nid as u64,
            ffree: (g.max_nid as u64).saturating_sub(used_nodes),
            namelen: 255,
        }
    }

    /// The value of extended attribute `name`; ENODATA if the inode has none of that name.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        self.engine.disk.check_live()?;
        self.engine.getxattr(ino32(ino)?, name)
    }

    /// `flags`: empty, [`XattrFlags::CREATE`] or [`XattrFlags::REPLACE`].
    /// An ACL (`system.posix_acl_access` or `_default`) must be valid; the access ACL then sets
    /// the mode's permission bits (see `src/acl.rs`).
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.setxattr(ino32(ino)?, name, value, flags.bits() as i32, &Privileged)
    }

    /// [`Fs::setxattr`] by `caller`: an access ACL drops set-group-ID unless the caller is in
    /// the file's group or privileged.
    pub fn setxattr_as(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
        caller: &dyn Caller,
    ) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.setxattr(ino32(ino)?, name, value, flags.bits() as i32, caller)
    }

    /// The names of the inode's extended attributes, in name order.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.engine.disk.check_live()?;
        self.engine.listxattr(ino32(ino)?)
    }

    /// Removes extended attribute `name`; ENODATA if there is none.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.removexattr(ino32(ino)?, name)
    }

    /// fsync(2) (`datasync`: fdatasync) of a file or directory.
    pub fn fsync(&self, ino: Ino, datasync: bool) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.fsync(ino32(ino)?, datasync)
    }

    /// sync(2): everything becomes durable (a checkpoint), lazytime access times included.
    pub fn sync(&self) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.mem.lazy_flush.store(true, Ordering::Release);
        self.engine.checkpoint(false)
    }

    /// Makes everything durable and stops the background thread. After [`Fs::shutdown`] it
    /// writes nothing: it only stops the thread, and the next mount recovers.
    pub fn unmount(mut self) -> Result<()> {
        self.stop()
    }

    /// Stops the background thread and takes the final checkpoint (none after a shutdown).
    fn stop(&mut self) -> Result<()> {
        // Read-only mounts have no background thread and write nothing.
        let Some(background) = self.background.take() else { return Ok(()) };
        // A panic in it is an error: then no final checkpoint (its state is unknown; what was
        // fsynced is in the journal).
        background.stop()?;
        if self.is_shut_down() {
            // The image stays as the shutdown left it: the next mount recovers.
            return Ok(());
        }
        self.engine.checkpoint(true)
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!("lanefs: final checkpoint failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    /// An unlink whose directory is removed, and its inode reaped by a checkpoint, between the
    /// unlink's change and its DIRSYNC check (a creator preempted there under load, while
    /// another thread removes the emptied directory: tests/rmdir_race.rs) has succeeded: the
    /// check must not report ENOENT for the vanished directory.
    #[test]
    fn the_dirsync_after_a_change_succeeds_when_the_directory_was_removed_meanwhile() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        Fs::format(&*dev, &crate::MkfsOptions::default()).unwrap();
        let fs = Fs::open(dev as Arc<dyn BlockDevice>, crate::FsOptions::default()).unwrap();
        let x = fs.mkdir(ROOT, b"x", 0o755, 0, 0).unwrap().ino;
        fs.create(x, b"f", 0o644, 0, 0).unwrap();
        // Fs::unlink in two halves, with the other thread's rmdir and a checkpoint between.
        fs.engine.unlink(ino32(x).unwrap(), b"f").unwrap();
        fs.rmdir(ROOT, b"x").unwrap();
        fs.sync().unwrap();
        assert_eq!(
            fs.engine.mnode(ino32(x).unwrap()).map(|_| ()).unwrap_err().to_errno(),
            libc::ENOENT,
            "the checkpoint reaped the removed directory"
        );
        fs.dirsync(x).unwrap();
        fs.unmount().unwrap();
    }
}
