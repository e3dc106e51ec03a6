//! The FUSE request handlers: each one translates a kernel request into one `lanefs::Fs` call
//! (a few into two) and its result into a reply. Nothing here decides anything the engine
//! decides; the only state is the `Fs` handle, so every worker thread serves any request.
//!
//! Inode numbers are lanefs inode numbers (the root is 1, FUSE_ROOT_ID). The kernel's lookup
//! counts are the engine's to keep (`Fs::remember` for every entry reply the kernel counts,
//! `Fs::forget` for FORGET), because they keep an inode alive: the kernel sends requests for an
//! inode it holds after its last name is gone and its files are closed (a SETATTR of the ctime
//! after each unlink under the writeback cache; a stat through an `O_PATH` descriptor), which
//! must not find it deleted by a checkpoint in between. Every entry reply carries the inode's
//! generation, which changes when a number is reused, so the kernel's file handles (number,
//! generation) stay valid across mounts and go stale when their inode does. Open file handles
//! are not used (0): the engine keeps an unlinked file alive from `open_ino` to `release`.
//!
//! The handlers are here, one per request; the data path's (READ, WRITE, FALLOCATE, LSEEK)
//! hand their work to `data`, where the writeback cache's effects on them are kept together.
//! What several share lives beside them: `init` (what INIT negotiates, the TTLs), `convert`
//! (errors, kinds, times, attributes), `process` (the requester's credentials and
//! capabilities), `dir` (directory handles and READDIR replies), `ioctl` and `copy`.
//!
//! Each handler that calls the engine marks its request in flight for its duration (see
//! [`crate::inflight`]), so that a request that never returns shows in the log.
//!
//! Permissions: the kernel checks them (`default_permissions`) and, with FUSE_POSIX_ACL, enforces
//! POSIX ACLs from the xattrs it reads here. What the kernel then leaves to a server, the engine
//! does for every caller (`lanefs::testing::acl`: ACL inheritance without the umask, which FUSE_DONT_MASK
//! hands over; the mode kept in step with the access ACL). With FUSE_HANDLE_KILLPRIV_V2 the
//! server also drops set-ID bits on a write, truncate, fallocate or chown (`lanefs::perm`); each
//! request's process is a `ReqCaller`, and the kernel is told when a mode it caches went stale.

mod convert;
mod copy;
mod ctime;
mod data;
mod dir;
mod init;
pub mod ioctl;
mod process;
mod xattr;

pub use convert::file_attr;
pub use init::{max_write, Ttl, DEFAULT_TTL, MAX_WRITE};

use crate::inflight::{Inflight, Op};
use crate::proto::abi::fopen;
use crate::proto::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, Notifier, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr, Request, SetattrIn, TimeOrNow,
};
use convert::{errno, generation, name, time_or_now, NO_ENTRY};
use dir::DirHandles;
use lanefs::{Attr, FileKind, Fs, InodeFlags, SetAttr};
use process::ReqCaller;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use xattr::reply_sized;

/// The FUSE file system: a shared handle on a mounted lanefs.
pub struct LaneFuse {
    fs: Arc<Fs>,
    /// The listing of each open directory handle (see [`DirHandles`]).
    dirs: DirHandles,
    max_write: u32,
    writeback_cache: bool,
    /// Offer idmapped mounts (`FUSE_ALLOW_IDMAP`); see [`LaneFuse::allow_idmap`].
    idmap: bool,
    inflight: Arc<Inflight>,
    /// Whether to offer FUSE_POSIX_ACL (which turns on `default_permissions`).
    posix_acl: bool,
    /// What INIT agreed on.
    killpriv: bool,
    /// The kernel agreed to keep a writeback cache (FUSE_WRITEBACK_CACHE): it owns regular
    /// files' mtime and ctime.
    writeback_cache_on: bool,
    /// The kernel agreed to FUSE_DIRECT_IO_ALLOW_MMAP, with which its FOPEN_DIRECT_IO path
    /// writes the range's dirty cached pages back before each direct read or write and drops
    /// them before a direct write (see `open_flags`).
    direct_io_flushes_cache: bool,
    dont_mask: bool,
    /// Tells the kernel of changes it did not ask for (set once the session exists).
    notifier: Arc<OnceLock<Notifier>>,
    /// Regular files whose ctime the kernel holds older than the engine's (`ctime`).
    kernel_ctime: ctime::KernelCtime,
    /// The transport in use and why (the `lanefs.transport` xattr of the root).
    transport: Arc<OnceLock<String>>,
    ttl: Ttl,
    /// A name whose lookup panics (`LANEFS_TEST_PANIC_LOOKUP`, for the tests of what a
    /// panicking handler does to the mount); unset, nothing does.
    panic_lookup: Option<std::ffi::OsString>,
}

impl LaneFuse {
    /// Serves `fs`; `writeback_cache` asks the kernel to cache writes (see the crate docs);
    /// requests are marked in flight in `inflight`, which needs a slot per worker thread.
    pub fn new(fs: Arc<Fs>, writeback_cache: bool, inflight: Arc<Inflight>) -> LaneFuse {
        LaneFuse {
            fs,
            dirs: DirHandles::new(),
            max_write: max_write(),
            writeback_cache,
            idmap: false,
            inflight,
            posix_acl: true,
            killpriv: false,
            writeback_cache_on: false,
            direct_io_flushes_cache: false,
            dont_mask: false,
            notifier: Arc::new(OnceLock::new()),
            kernel_ctime: ctime::KernelCtime::new(),
            transport: Arc::new(OnceLock::new()),
            ttl: Ttl::default(),
            panic_lookup: std::env::var_os("LANEFS_TEST_PANIC_LOOKUP"),
        }
    }

    /// How long the kernel may cache names, attributes and names that do not exist.
    pub fn with_ttl(mut self, ttl: Ttl) -> LaneFuse {
        self.ttl = ttl;
        self
    }

    /// Lets the kernel create idmapped mounts of this file system (`mount_setattr` with
    /// `MOUNT_ATTR_IDMAP`, as containers and overlayfs use), by negotiating `FUSE_ALLOW_IDMAP`.
    ///
    /// The kernel then checks permissions itself (it refuses the flag without
    /// `default_permissions`), sends the caller's ids, mapped to the file system's, with the
    /// requests that create an inode (mknod, mkdir, symlink, create, and rename with a
    /// whiteout), and sends `FUSE_INVALID_UIDGID` (u32::MAX) as uid and gid with every other
    /// request. Nothing here reads the ids of another request when the kernel checks
    /// permissions (`access` is never sent then). An idmapped mount serves other users than
    /// the daemon's, so the caller asks for this only with `default_permissions` and
    /// `allow_other` both in force.
    pub fn allow_idmap(mut self, on: bool) -> LaneFuse {
        self.idmap = on;
        self
    }

    /// Whether the kernel enforces POSIX ACLs (FUSE_POSIX_ACL); only on a mount with
    /// `default_permissions`, which it would otherwise turn on.
    pub fn with_posix_acl(mut self, on: bool) -> LaneFuse {
        self.posix_acl = on;
        self
    }

    /// Where the session's notifier goes once the session exists (`Session::notifier`).
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// Where the session says which transport it serves with, once INIT has settled it.
    pub fn transport_slot(&self) -> Arc<OnceLock<String>> {
        self.transport.clone()
    }

    /// Whether a SETATTR sets the times it names to the current time (utime with NULL, touch),
    /// which an append-only file allows and explicit times it refuses. Without the writeback
    /// cache the kernel says so with FATTR_ATIME_NOW and FATTR_MTIME_NOW. With it the kernel owns
    /// a regular file's mtime and sends "now" for it as an explicit time, its own reading of the
    /// clock (fs/fuse/dir.c, `iattr_to_fattr` with `trust_local_cmtime`), while the atime still
    /// comes as FATTR_ATIME_NOW with that same reading: an mtime equal to it is that "now". The
    /// one call this mistakes for a touch is utimensat with UTIME_NOW for the atime and an
    /// explicit mtime equal to the kernel's clock to the nanosecond.
    fn times_now(&self, s: &SetattrIn) -> bool {
        let atime_now = s.atime.as_ref().is_none_or(|t| matches!(t, TimeOrNow::Now));
        let mtime_now = match s.mtime {
            None | Some(TimeOrNow::Now) => true,
            Some(TimeOrNow::Specific(m)) => {
                self.writeback_cache_on && s.atime == Some(TimeOrNow::Now) && m == s.atime_sent
            }
        };
        atime_now && mtime_now
    }

    /// The process behind `req`; `fsetid` if the request says whether it has CAP_FSETID.
    fn caller<'a>(&'a self, req: &Request, fsetid: Option<bool>) -> ReqCaller<'a> {
        ReqCaller::new(req, fsetid, &self.notifier)
    }

    /// The umask to apply to a new inode: the request's, if the kernel left it to us.
    fn umask(&self, umask: u32) -> u32 {
        if self.dont_mask {
            umask
        } else {
            0
        }
    }
}

impl LaneFuse {
    /// Owner of a new inode in `parent`: the caller, except that a set-group-ID directory
    /// passes its group on (and, to a new directory, the set-group-ID bit), as on ext4.
    fn new_owner(&self, req: &Request, parent: INodeNo, mode: u32) -> Result<(u32, u32, u32), Errno> {
        let p = self.fs.getattr(parent.0).map_err(errno)?;
        if p.mode & libc::S_ISGID != 0 {
            let mode = if mode & libc::S_IFMT == libc::S_IFDIR { mode | libc::S_ISGID } else { mode };
            Ok((req.uid(), p.gid, mode))
        } else {
            Ok((req.uid(), req.gid(), mode))
        }
    }

    /// An entry reply: the kernel counts it as a lookup of the inode, so the engine takes a
    /// reference first (and the attributes it gives then).
    fn entry(&self, r: lanefs::Result<Attr>, reply: ReplyEntry) {
        match r.and_then(|a| self.fs.remember(a.ino)) {
            Ok(a) => reply.entry(&self.ttl.cache, &file_attr(&a), generation(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn empty(&self, r: lanefs::Result<()>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// The answer to a CREATE or TMPFILE: the new inode, opened with `flags`.
    /// Counted as a lookup, as [`LaneFuse::entry`]'s reply is.
    fn created(&self, r: lanefs::Result<Attr>, flags: i32, reply: ReplyCreate) {
        match r.and_then(|a| self.fs.remember(a.ino)) {
            Ok(a) => reply.created(
                &self.ttl.cache,
                &file_attr(&a),
                generation(&a),
                FileHandle(0),
                self.open_flags(flags),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open_flags(&self, flags: i32) -> FopenFlags {
        // Writes reach the engine as they are made, so close has nothing to flush: no FLUSH
        // round trip on every close (the kernel still sends it when its writeback cache holds
        // dirty pages).
        let f = fopen::NOFLUSH;
        if flags & libc::O_DIRECT != 0 && (!self.writeback_cache_on || self.direct_io_flushes_cache) {
            // Direct I/O skips the kernel's inode lock on writes, so writers of disjoint ranges
            // of one file reach the range lock together. Under the writeback cache another
            // descriptor's writes may sit dirty in the kernel's pages; with
            // DIRECT_IO_ALLOW_MMAP agreed, the kernel's FOPEN_DIRECT_IO path writes the range
            // back before each direct read or write and drops it before a direct write, as a
            // disk file system's direct I/O does. What it leaves is the size, which its dirty
            // appends move first: `size_may_lag`.
            FopenFlags(f | fopen::DIRECT_IO | fopen::PARALLEL_DIRECT_WRITES)
        } else {
            // A kernel without DIRECT_IO_ALLOW_MMAP would send direct I/O past its dirty pages
            // (a read missing them, a write they later overwrite). Its generic direct I/O path
            // writes the range back and drops it instead; direct writes to one file then take
            // the inode lock in turn.
            FopenFlags(f)
        }
    }
}

impl Filesystem for LaneFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) {
        self.negotiate(config);
    }

    fn panicked(&self, what: &str) {
        let said = format!(
            "a request handler panicked: {what}; the file system shuts down (unmount, then mount again to recover)"
        );
        // A daemon's standard error goes nowhere: the system log has it too.
        eprintln!("lanefs: {said}");
        crate::syslog::open();
        crate::syslog::warning(&said);
        if let Err(e) = self.fs.shutdown() {
            eprintln!("lanefs: shutting down after the panic: {e}");
        }
    }

    fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        let _busy = self.inflight.enter(Op::Lookup, parent.0, req.pid());
        // Fault injection for the mount's tests (`LANEFS_TEST_PANIC_LOOKUP`): a handler that
        // panics, as a bug would.
        if self.panic_lookup.as_deref().is_some_and(|p| p.as_bytes() == name(n)) {
            panic!("LANEFS_TEST_PANIC_LOOKUP: lookup of {n:?}");
        }
        // The kernel asks for "." of a node (of any type) to open a file handle whose inode it
        // does not hold, and for ".." of a directory to connect one (FUSE_EXPORT_SUPPORT); it
        // then compares the generation. A removed inode answers ENOENT, which it turns into
        // ESTALE. Each answer counts as a lookup for the kernel, like any other: `forget` has
        // nothing to drop either way.
        if name(n) == b"." {
            return self.entry(self.fs.lookup_ino(parent.0), reply);
        }
        match self.fs.lookup(parent.0, name(n)) {
            // A name that does not exist, cached by the kernel as such: node id 0 (its
            // attributes are not looked at).
            Err(e) if e.to_errno() == libc::ENOENT && !self.ttl.negative.is_zero() && name(n) != b".." => {
                reply.entry(&self.ttl.negative, &NO_ENTRY, Generation(0))
            }
            r => self.entry(r, reply),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // (Not marked in flight, nor are FLUSH and RELEASEDIR: they cannot wait on anything.)
        // A BATCH_FORGET comes as one call per inode: this counts inodes forgotten.
        self.inflight.count(Op::Forget);
        if ino.0 == lanefs::ROOT {
            // The kernel counts one lookup of the root that no reply gave (its mount's root
            // inode), and the root never dies: its count is not kept.
            return;
        }
        // ENOENT: the inode died while the kernel held it, which the engine allows only with
        // its orphan list half full (`Fs::remember`). Any other error means a count went wrong
        // here (the kernel gives back only what it got).
        match self.fs.forget(ino.0, nlookup) {
            Err(e) if e.to_errno() != libc::ENOENT => {
                eprintln!("lanefs: FORGET of inode {} ({nlookup} lookups): {e}", ino.0)
            }
            _ => {}
        }
        // The kernel evicted it (it forgets only then): its next copy is read afresh.
        self.kernel_ctime.forgotten(ino.0);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _busy = self.inflight.enter(Op::Getattr, ino.0, req.pid());
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&self.ttl.cache, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn statx(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, _mask: u32, reply: ReplyStatx) {
        // What GETATTR gives, and the birth time (statx's STATX_BTIME, which GETATTR cannot
        // carry). The kernel sends it when a caller asks for the birth time.
        let _busy = self.inflight.enter(Op::Statx, ino.0, req.pid());
        // The inode flags statx reports share their bits with FS_IOC_GETFLAGS's
        // (STATX_ATTR_IMMUTABLE is FS_IMMUTABLE_FL, and so on).
        const SHOWN: u64 = (InodeFlags::IMMUTABLE.0 | InodeFlags::APPEND.0 | InodeFlags::NODUMP.0) as u64;
        let r = self.fs.getattr(ino.0).and_then(|a| Ok((a, self.fs.get_flags(ino.0)?)));
        match r {
            Ok((a, f)) => reply.statx(&self.ttl.cache, &file_attr(&a), a.crtime, f.0 as u64 & SHOWN, SHOWN),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(&self, req: &Request, ino: INodeNo, s: &SetattrIn, reply: ReplyAttr) {
        let _busy = self.inflight.enter(Op::Setattr, ino.0, req.pid());
        let a = SetAttr {
            mode: s.mode,
            uid: s.uid,
            gid: s.gid,
            size: s.size,
            times_now: self.times_now(s),
            atime: s.atime.map(time_or_now),
            mtime: s.mtime.map(time_or_now),
            ctime: s.ctime.map(|c| self.kernel_ctime(ino.0, c)),
        };
        // The kernel asks us to drop set-ID bits on a truncate by a caller without CAP_FSETID and
        // on every chown (FATTR_KILL_SUIDGID): the engine applies the kernel's own rule for the
        // caller, which is what that flag stands for. On a truncate alone the flag is that
        // capability, said up front (fs/fuse/dir.c, `fuse_do_setattr`), as a WRITE's is; a
        // chown sets it whatever the caller may, so there the engine asks /proc if it must.
        let truncate_only = s.size.is_some() && s.uid.is_none() && s.gid.is_none();
        let fsetid = truncate_only.then_some(!s.kill_suidgid);
        let r = if self.killpriv {
            self.fs.setattr_as(ino.0, &a, &self.caller(req, fsetid))
        } else {
            self.fs.setattr(ino.0, &a)
        };
        match r {
            Ok(a) => reply.attr(&self.ttl.cache, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _busy = self.inflight.enter(Op::Readlink, ino.0, req.pid());
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _busy = self.inflight.enter(Op::Mknod, parent.0, req.pid());
        if mode & libc::S_IFMT == libc::S_IFDIR {
            return reply.error(Errno::EINVAL);
        }
        match self.new_owner(req, parent, mode) {
            Ok((uid, gid, mode)) => {
                let new = lanefs::New { mode, rdev: rdev as u64, uid, gid, umask: self.umask(umask) };
                self.entry(self.fs.make(parent.0, name(n), &new), reply)
            }
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, n: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let _busy = self.inflight.enter(Op::Mkdir, parent.0, req.pid());
        match self.new_owner(req, parent, libc::S_IFDIR | (mode & 0o7777)) {
            Ok((uid, gid, mode)) => {
                let new = lanefs::New { mode, rdev: 0, uid, gid, umask: self.umask(umask) };
                self.entry(self.fs.make(parent.0, name(n), &new), reply)
            }
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Unlink, parent.0, req.pid());
        self.empty(self.fs.unlink(parent.0, name(n)), reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Rmdir, parent.0, req.pid());
        self.empty(self.fs.rmdir(parent.0, name(n)), reply)
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link: &OsStr, target: &Path, reply: ReplyEntry) {
        let _busy = self.inflight.enter(Op::Symlink, parent.0, req.pid());
        match self.new_owner(req, parent, libc::S_IFLNK | 0o777) {
            Ok((uid, gid, _)) => self
                .entry(self.fs.symlink(parent.0, name(link), target.as_os_str().as_bytes(), uid, gid), reply),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let _busy = self.inflight.enter(Op::Rename, parent.0, req.pid());
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if flags & !known != 0 {
            return reply.error(Errno::EINVAL);
        }
        let mut f = lanefs::RenameFlags::empty();
        if flags & libc::RENAME_NOREPLACE != 0 {
            f |= lanefs::RenameFlags::NOREPLACE;
        }
        if flags & libc::RENAME_EXCHANGE != 0 {
            f |= lanefs::RenameFlags::EXCHANGE;
        }
        // The whiteout (overlayfs asks for one) is a new inode in `parent`, owned as any other:
        // the kernel sends the caller's ids with this request (mapped, on an idmapped mount).
        let (uid, gid) = if flags & libc::RENAME_WHITEOUT != 0 {
            f |= lanefs::RenameFlags::WHITEOUT;
            match self.new_owner(req, parent, libc::S_IFCHR) {
                Ok((uid, gid, _)) => (uid, gid),
                Err(e) => return reply.error(e),
            }
        } else {
            (0, 0)
        };
        // A directory moved to another parent has a new "..", which a listing the kernel keeps
        // of it (CACHE_DIR, see `opendir`) would not show: the kernel drops its cached listing
        // only when the directory's own entries change.
        let moved = |p: INodeNo, n: &OsStr| -> Option<u64> {
            let a = self.fs.lookup(p.0, name(n)).ok()?;
            (a.kind == FileKind::Dir).then_some(a.ino)
        };
        let mut moved_dirs = Vec::new();
        if parent != newparent {
            moved_dirs.extend(moved(parent, n));
            if flags & libc::RENAME_EXCHANGE != 0 {
                moved_dirs.extend(moved(newparent, newname));
            }
        }
        let r = self.fs.rename_as(parent.0, name(n), newparent.0, name(newname), f, uid, gid);
        if r.is_ok() {
            for d in moved_dirs {
                self.drop_cached_listing(d);
            }
        }
        self.empty(r, reply)
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _busy = self.inflight.enter(Op::Link, ino.0, req.pid());
        self.entry(self.fs.link(ino.0, newparent.0, name(newname)), reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: i32, reply: ReplyOpen) {
        let _busy = self.inflight.enter(Op::Open, ino.0, req.pid());
        // The kernel does not see the inode flags: the engine refuses write opens they forbid.
        match self.fs.open_with(ino.0, flags) {
            Ok(_) => reply.opened(FileHandle(0), self.open_flags(flags)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        read_flags: u32,
        flags: i32,
        reply: ReplyData,
    ) {
        self.read_data(req, ino, offset, size, read_flags, flags, reply)
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: u32,
        flags: i32,
        reply: ReplyWrite,
    ) {
        self.write_data(req, ino, offset, data, write_flags, flags, reply)
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, reply: ReplyEmpty) {
        // WRITEs reach the engine as they come, so a close has nothing to push here. With
        // FOPEN_NOFLUSH the kernel sends no FLUSH, but with its writeback cache it does on
        // every close (after writing the dirty pages back itself): ENOSYS makes it stop for
        // good (fc->no_flush; fs/fuse/file.c, fuse_flush), which costs nothing: lanefs takes no
        // POSIX locks (no FUSE_POSIX_LOCKS), the other thing FLUSH is for.
        self.inflight.count(Op::Flush);
        reply.error(Errno::ENOSYS)
    }

    fn release(&self, req: &Request, ino: INodeNo, _fh: FileHandle, _flags: i32, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Release, ino.0, req.pid());
        self.empty(self.fs.release(ino.0), reply);
        self.released(ino.0);
    }

    fn fsync(&self, req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Fsync, ino.0, req.pid());
        self.empty(self.fs.fsync(ino.0, datasync), reply)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: i32, reply: ReplyOpen) {
        let _busy = self.inflight.enter(Op::Opendir, ino.0, req.pid());
        match self.fs.getattr(ino.0) {
            // The kernel may keep the listing and serve later ones from it (see `dir`). Such a
            // listing never reaches the engine, so the access time is taken when the listing
            // starts (`Fs::listing`); the kernel, which refreshes a directory's attributes after
            // a listing it asked for, is told when that moved it.
            Ok(a) if a.kind == FileKind::Dir => match self.fs.listing(ino.0) {
                Ok(l) => {
                    if self.fs.getattr(ino.0).is_ok_and(|now| now.atime != a.atime) {
                        if let Some(n) = self.notifier.get() {
                            // Attributes only (offset -1): no lock of the inode is taken.
                            let _ = n.inval_inode(ino, -1, 0);
                        }
                    }
                    reply.opened(
                        FileHandle(self.dirs.open(l)),
                        FopenFlags(fopen::CACHE_DIR | fopen::KEEP_CACHE),
                    )
                }
                Err(e) => reply.error(errno(e)),
            },
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        let _busy = self.inflight.enter(Op::Readdir, ino.0, req.pid());
        self.fill_readdir(ino, fh, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let _busy = self.inflight.enter(Op::Readdirplus, ino.0, req.pid());
        self.fill_readdirplus(ino, fh, offset, reply)
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: i32, reply: ReplyEmpty) {
        self.inflight.count(Op::Releasedir);
        self.dirs.close(fh.0);
        reply.ok()
    }

    fn fsyncdir(&self, req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Fsyncdir, ino.0, req.pid());
        self.empty(self.fs.fsync(ino.0, datasync), reply)
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let _busy = self.inflight.enter(Op::Statfs, ino.0, req.pid());
        let s = self.fs.statfs();
        reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize)
    }

    fn setxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, value: &[u8], flags: i32, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Setxattr, ino.0, req.pid());
        if name(n).starts_with(crate::stats::RESERVED_PREFIX) {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        // The kernel would say whether an ACL keeps set-group-ID only with FUSE_SETXATTR_EXT,
        // which is not negotiated: the engine asks the caller itself.
        // XATTR_* bits are Linux's; the engine refuses any other with EINVAL.
        let flags = lanefs::XattrFlags(flags as u32);
        self.empty(self.fs.setxattr_as(ino.0, name(n), value, flags, &self.caller(req, None)), reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        reply_sized(self.xattr_value(req, ino.0, n), size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _busy = self.inflight.enter(Op::Listxattr, ino.0, req.pid());
        reply_sized(self.fs.listxattr(ino.0).map(xattr::name_list), size, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Removexattr, ino.0, req.pid());
        if name(n).starts_with(crate::stats::RESERVED_PREFIX) {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        self.empty(self.fs.removexattr(ino.0, name(n)), reply)
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: u32, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Access, ino.0, req.pid());
        // Only asked when the mount has no default_permissions.
        let ok = match self.fs.getattr(ino.0) {
            Ok(a) => process::may_access(req, &a, mask),
            Err(e) => return reply.error(errno(e)),
        };
        if ok {
            reply.ok()
        } else {
            reply.error(Errno::EACCES)
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _busy = self.inflight.enter(Op::Create, parent.0, req.pid());
        let (uid, gid, mode) = match self.new_owner(req, parent, libc::S_IFREG | (mode & 0o7777)) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        let new = lanefs::New { mode, rdev: 0, uid, gid, umask: self.umask(umask) };
        let a = match self.fs.make(parent.0, name(n), &new) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(e)),
        };
        self.created(self.fs.open_ino(a.ino), flags, reply)
    }

    fn tmpfile(&self, req: &Request, parent: INodeNo, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let _busy = self.inflight.enter(Op::Tmpfile, parent.0, req.pid());
        // As a create's: owner and group (a set-group-ID directory's), umask or default ACL.
        // The kernel checked write and search on the directory, and keeps O_EXCL itself (it
        // never links a file opened so).
        let (uid, gid, mode) = match self.new_owner(req, parent, libc::S_IFREG | (mode & 0o7777)) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        let new = lanefs::New { mode, rdev: 0, uid, gid, umask: self.umask(umask) };
        // The open count it carries is the handle's: RELEASE gives it back.
        self.created(self.fs.tmpfile_open(parent.0, &new), flags, reply)
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.fallocate_data(req, ino, offset, length, mode, reply)
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.seek_data(req, ino, offset, whence, reply)
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: u32,
        cmd: u32,
        arg: u64,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _busy = self.inflight.enter(Op::Ioctl, ino.0, req.pid());
        let r = self.ioctl_reply(req, ino.0, cmd, arg, in_data, out_size);
        match r {
            // The kernel takes at most `out_size` bytes back (EIO for more).
            Ok(out) if out.len() <= out_size as usize => reply.ioctl(0, &out),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        reply: ReplyWrite,
    ) {
        let _busy = self.inflight.enter(Op::CopyFileRange, ino_in.0, req.pid());
        let caller = self.caller(req, None);
        match self.copy_range(&caller, ino_in.0, offset_in, ino_out.0, offset_out, len) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }
}
