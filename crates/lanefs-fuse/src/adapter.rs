//! The FUSE request handlers: each one translates a kernel request into one `lanefs::Fs` call
//! (a few into two) and its result into a reply. Nothing here decides anything the engine
//! decides; the only state is the `Fs` handle, so every worker thread serves any request.
//!
//! Inode numbers are lanefs inode numbers (the root is 1, FUSE_ROOT_ID), so the kernel's
//! lookup counts need no table: `forget` has nothing to drop. Every entry reply carries the
//! inode's generation, which changes when a number is reused, so the kernel's file handles
//! (number, generation) stay valid across mounts and go stale when their inode does. Open file
//! handles are not used (0): the engine keeps an unlinked file alive from `open_ino` to
//! `release`.
//!
//! Each handler that calls the engine marks its request in flight for its duration (see
//! [`crate::inflight`]), so that a request that never returns shows in the log.
//!
//! Permissions: the kernel checks them (`default_permissions`) and, with FUSE_POSIX_ACL, enforces
//! POSIX ACLs from the xattrs it reads here. What the kernel then leaves to a server, the engine
//! does for every caller (`lanefs::acl`: ACL inheritance without the umask, which FUSE_DONT_MASK
//! hands over; the mode kept in step with the access ACL). With FUSE_HANDLE_KILLPRIV_V2 the
//! server also drops set-ID bits on a write, truncate, fallocate or chown (`lanefs::perm`); each
//! request's process is a `ReqCaller`, and the kernel is told when a mode it caches went stale.

use crate::inflight::{Inflight, Op};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use lanefs::format::node::Timespec;
use lanefs::fs_seek::Seek;
use lanefs::{Attr, FileKind, Fs, InodeFlags, SetAttr, TrimRange};
use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache what the adapter tells it (`-o cache_timeout=S`,
/// `-o negative_timeout=S`).
///
/// lanefs is the only writer of its image and every change goes through this mount, so the
/// kernel's caches stay right however long it keeps them: the kernel itself drops what its own
/// requests change (a directory's attributes after a create, an inode's after a write, link,
/// rename or setxattr; a name after unlink or rename; atime after a READ or READDIR), and the
/// adapter tells it of the rest, the changes the engine makes on its own: set-ID bits dropped by
/// a write (`ReqCaller::dropped`) and inode flags set by ioctl (`attributes_changed`). A long
/// TTL saves a GETATTR per stat and a LOOKUP per path component once a second; a negative entry
/// (a LOOKUP answered with node id 0 and a TTL, not ENOENT) saves the LOOKUP of a name that does
/// not exist on every later stat, and lets the CREATE of such a name come without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttl {
    /// Names and attributes of existing inodes (one value: fuser's CREATE and READDIRPLUS
    /// replies carry one TTL for both).
    pub cache: Duration,
    /// Names that do not exist (0: ENOENT, not cached).
    pub negative: Duration,
}

/// Default of both TTLs: an hour.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);

impl Default for Ttl {
    fn default() -> Ttl {
        Ttl { cache: DEFAULT_TTL, negative: DEFAULT_TTL }
    }
}

/// Largest write (and read) negotiated with the kernel, before the kernel's own cap.
pub const MAX_WRITE: u32 = 1 << 20;

/// Entries asked of the engine per round of a readdir reply.
const DIR_BATCH: usize = 64;

/// Largest copy_file_range answered in one request (the reply carries a u32).
const MAX_COPY: u64 = 1 << 30;

/// The inode-attribute ioctls (x86-64 and every other Linux ABI with the generic `_IOC`
/// layout). The kernel sends them itself, as restricted FUSE_IOCTLs, from its
/// `fileattr_get`/`fileattr_set` (fs/fuse/ioctl.c): FS_IOC_GETFLAGS/SETFLAGS with a 4-byte
/// argument, FS_IOC_FSGETXATTR/FSSETXATTR with a `struct fsxattr`. Before a set it reads the
/// old flags with FSGETXATTR and checks CAP_LINUX_IMMUTABLE for a change of `i` or `a`.
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601; // _IOR('f', 1, long)
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602; // _IOW('f', 2, long)
pub const FS_IOC_FSGETXATTR: u32 = 0x801c_581f; // _IOR('X', 31, struct fsxattr)
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820; // _IOW('X', 32, struct fsxattr)
/// `struct fsxattr`: xflags, extsize, nextents, projid, cowextsize (u32 each), 8 bytes of pad.
const FSXATTR_LEN: usize = 28;

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
    dont_mask: bool,
    /// Tells the kernel of changes it did not ask for (set once the session exists).
    notifier: Arc<OnceLock<fuser::Notifier>>,
    ttl: Ttl,
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
            dont_mask: false,
            notifier: Arc::new(OnceLock::new()),
            ttl: Ttl::default(),
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
    /// permissions (`access` is never sent then). But fuser 0.18 compares the uid of each
    /// request with the daemon's own unless the session allows everyone
    /// (`SessionACL::All`, i.e. `allow_other`), and answers EACCES when they differ: with a
    /// session limited to its owner, every lookup would fail. So the caller asks for this
    /// only with `default_permissions` and `allow_other` both in force.
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

    /// Where the session's notifier goes once the session exists (`fuser::Session::notifier`).
    pub fn notifier_slot(&self) -> Arc<OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    /// Drops the kernel's cached attributes of `ino` (not its pages: offset -1, so it takes
    /// no lock of the inode, which the kernel holds while it waits for a FUSE_IOCTL). A flag
    /// change by ioctl changes the ctime, and the kernel refreshes nothing after a FUSE_IOCTL.
    fn attributes_changed(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
    }

    /// The process behind `req`; `fsetid` if the request says whether it has CAP_FSETID.
    fn caller<'a>(&'a self, req: &Request, fsetid: Option<bool>) -> ReqCaller<'a> {
        ReqCaller {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
            fsetid,
            status: OnceCell::new(),
            notifier: &self.notifier,
        }
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

/// The process behind one request, as the engine asks about it (`lanefs::Caller`). The kernel
/// sends its file-system uid and gid and its (thread) id; whether it has CAP_FSETID and its
/// supplementary groups come from /proc/PID/status, read once and only when the engine asks
/// (for a file with set-ID bits). A WRITE says it up front: the kernel sets
/// FUSE_WRITE_KILL_SUIDGID exactly when the writer lacks CAP_FSETID. A process gone by then
/// counts as uid 0 having CAP_FSETID and no supplementary groups.
///
/// On an idmapped mount the kernel sends `FUSE_INVALID_UIDGID` (u32::MAX) as the uid and gid
/// of every request that creates nothing. The ids are then taken from /proc (the file-system
/// ids of the process there, which are the mount's view only when the idmapping is the
/// identity: a best effort for the set-group-ID rule, the one place they matter).
struct ReqCaller<'a> {
    uid: u32,
    gid: u32,
    pid: u32,
    fsetid: Option<bool>,
    status: OnceCell<Option<ProcStatus>>,
    notifier: &'a OnceLock<fuser::Notifier>,
}

/// What /proc/PID/status says of a process's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProcStatus {
    /// Effective capabilities.
    cap_eff: u64,
    /// File-system gid (the fourth field of `Gid:`).
    fsgid: u32,
    groups: Vec<u32>,
}

/// What the kernel sends as uid and gid when it has none for the request (idmapped mounts).
const FUSE_INVALID_UIDGID: u32 = u32::MAX;

const CAP_FSETID: u32 = 4;
const CAP_LINUX_IMMUTABLE: u32 = 9;
const CAP_SYS_ADMIN: u32 = 21;

/// Whether the process behind `req` has capability `cap` in effect, as /proc/TID/status says.
/// The kernel sends no capabilities, and on a mount that allows idmapping the uid of most
/// requests is `FUSE_INVALID_UIDGID`, so the uid cannot stand for them. A process gone by
/// the time it is asked counts as privileged only if the request came from uid 0.
fn capable(req: &Request, cap: u32) -> bool {
    proc_status(req.pid()).map_or(req.uid() == 0, |s| s.has(cap))
}

/// The credentials of task `pid` (a thread id works too); None once it is gone.
fn proc_status(pid: u32) -> Option<ProcStatus> {
    parse_status(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

impl ProcStatus {
    /// Whether capability `cap` is in the effective set.
    fn has(&self, cap: u32) -> bool {
        self.cap_eff & (1 << cap) != 0
    }
}

/// The credentials in a /proc/PID/status text (None if a line is missing or malformed).
fn parse_status(text: &str) -> Option<ProcStatus> {
    let mut cap_eff = None;
    let mut groups = None;
    let mut fsgid = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Gid:") {
            fsgid = v.split_whitespace().nth(3).and_then(|f| f.parse::<u32>().ok());
        } else if let Some(v) = line.strip_prefix("CapEff:") {
            cap_eff = u64::from_str_radix(v.trim(), 16).ok();
        } else if let Some(v) = line.strip_prefix("Groups:") {
            groups = v.split_whitespace().map(|g| g.parse().ok()).collect::<Option<Vec<u32>>>();
        }
    }
    Some(ProcStatus { cap_eff: cap_eff?, fsgid: fsgid?, groups: groups? })
}

impl ReqCaller<'_> {
    fn status(&self) -> Option<&ProcStatus> {
        self.status.get_or_init(|| proc_status(self.pid)).as_ref()
    }
}

impl lanefs::Caller for ReqCaller<'_> {
    fn fsetid(&self) -> bool {
        self.fsetid.unwrap_or_else(|| match self.status() {
            Some(s) => s.has(CAP_FSETID),
            None => self.uid == 0,
        })
    }

    fn in_group(&self, gid: u32) -> bool {
        if self.gid == FUSE_INVALID_UIDGID {
            return self.status().is_some_and(|s| s.fsgid == gid || s.groups.contains(&gid));
        }
        gid == self.gid || self.status().is_some_and(|s| s.groups.contains(&gid))
    }

    fn dropped(&self, ino: u64, _mode: u32) {
        // The kernel keeps a file's mode for the attribute TTL, and a write does not make it
        // ask again: until then it would still see set-ID bits on exec. Attributes only
        // (offset -1): no page is touched, so this cannot wait on the request being served.
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
    }
}

/// Open directory handles and their listings.
///
/// A listing bounds what one pass over a directory returns to the entries that existed when it
/// started (`lanefs::Listing`), so that `readdir` ends even while the caller renames what it
/// reads (fstests generic/736). A pass starts at offset 0: after OPENDIR, and again after
/// `rewinddir`, which must then see the directory as it is. Handles are numbered from 1; the
/// table is sharded by handle so that parallel OPENDIRs rarely share a lock, and no lock of it
/// is held while the engine is called.
struct DirHandles {
    next: std::sync::atomic::AtomicU64,
    shards: Box<[DirShard]>,
}

/// Open directory handles whose number is the shard's index modulo [`DIR_HANDLE_SHARDS`].
type DirShard = lanefs::sync::Mutex<HashMap<u64, Arc<lanefs::Listing>>>;

const DIR_HANDLE_SHARDS: u64 = 16;

impl DirHandles {
    fn new() -> DirHandles {
        DirHandles {
            next: std::sync::atomic::AtomicU64::new(1),
            shards: (0..DIR_HANDLE_SHARDS)
                .map(|_| lanefs::sync::Mutex::new(lanefs::sync::Rank::DirHandles, HashMap::new()))
                .collect(),
        }
    }

    fn shard(&self, fh: u64) -> &DirShard {
        &self.shards[(fh % DIR_HANDLE_SHARDS) as usize]
    }

    fn open(&self, listing: lanefs::Listing) -> u64 {
        let fh = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.shard(fh).lock().insert(fh, Arc::new(listing));
        fh
    }

    /// The listing of handle `fh` (none for a handle this table did not give out).
    fn get(&self, fh: u64) -> Option<Arc<lanefs::Listing>> {
        self.shard(fh).lock().get(&fh).cloned()
    }

    fn close(&self, fh: u64) {
        self.shard(fh).lock().remove(&fh);
    }

    /// The entries of handle `fh`'s listing after `offset`, starting a new pass at offset 0.
    fn read(
        &self,
        fs: &Fs,
        ino: u64,
        fh: u64,
        offset: u64,
        max: usize,
    ) -> lanefs::Result<Vec<lanefs::DirEntry>> {
        let listing = match self.get(fh) {
            // A new pass over the directory: the listing starts again from now.
            Some(_) if offset == 0 => {
                let l = Arc::new(fs.listing(ino)?);
                self.shard(fh).lock().insert(fh, l.clone());
                Some(l)
            }
            l => l,
        };
        match listing {
            Some(l) => fs.readdir_listing(&l, offset, max),
            // Not opened through OPENDIR (the kernel always does; a handle of 0 otherwise).
            None => fs.readdir(ino, offset, max),
        }
    }
}

/// 1 MiB, capped by what the kernel allows (/proc/sys/fs/fuse/max_pages_limit pages).
pub fn max_write() -> u32 {
    let page = 4096u64;
    let limit = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(256);
    (limit.saturating_mul(page)).clamp(page, MAX_WRITE as u64) as u32
}

fn errno(e: lanefs::Error) -> Errno {
    let n = e.to_errno();
    // After a shutdown every request gets EIO, by design: no line for each.
    if (n == libc::EIO && !e.is_shut_down()) || n == libc::EUCLEAN {
        // The caller sees only the number: say why (on the daemon's stderr).
        eprintln!("lanefs: {e}");
    }
    Errno::from_i32(n)
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn system_time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec.min(999_999_999))
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            if d.subsec_nanos() == 0 {
                Timespec { sec: -(d.as_secs() as i64), nsec: 0 }
            } else {
                Timespec { sec: -(d.as_secs() as i64) - 1, nsec: 1_000_000_000 - d.subsec_nanos() }
            }
        }
    }
}

fn time_or_now(t: TimeOrNow) -> Timespec {
    match t {
        TimeOrNow::SpecificTime(t) => timespec(t),
        TimeOrNow::Now => timespec(SystemTime::now()),
    }
}

/// The attributes of a negative entry (node id 0), which the kernel does not read.
const NO_ENTRY: FileAttr = FileAttr {
    ino: INodeNo(0),
    size: 0,
    blocks: 0,
    atime: UNIX_EPOCH,
    mtime: UNIX_EPOCH,
    ctime: UNIX_EPOCH,
    crtime: UNIX_EPOCH,
    kind: FileType::RegularFile,
    perm: 0,
    nlink: 0,
    uid: 0,
    gid: 0,
    rdev: 0,
    blksize: 0,
    flags: 0,
};

/// stat(2) attributes as FUSE sends them.
pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.crtime),
        kind: kind(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The generation the kernel knows `a` by. The kernel makes its root inode with generation 0
/// and marks an inode bad when a reply gives its node id another generation; the root's is 0
/// on every image (mkfs), and stays so here whatever the image says.
fn generation(a: &Attr) -> Generation {
    if a.ino == lanefs::ROOT {
        Generation(0)
    } else {
        Generation(a.generation as u64)
    }
}

fn name(n: &OsStr) -> &[u8] {
    n.as_bytes()
}

thread_local! {
    /// Per-worker read buffer, reused so that a 1 MiB read costs no allocation.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
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

    fn entry(&self, r: lanefs::Result<Attr>, reply: ReplyEntry) {
        match r {
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

    fn open_flags(flags: i32) -> FopenFlags {
        // Writes reach the engine as they are made, so close has nothing to flush: no FLUSH
        // round trip on every close (the kernel still sends it when its writeback cache holds
        // dirty pages).
        let f = FopenFlags::FOPEN_NOFLUSH;
        if flags & libc::O_DIRECT != 0 {
            // Direct I/O skips the kernel's inode lock on writes, so writers of disjoint ranges
            // of one file reach the range lock together.
            f | FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        } else {
            f
        }
    }

    /// FS_IOC_GETFLAGS / SETFLAGS / FSGETXATTR / FSSETXATTR on `ino`: the reply's data, exactly
    /// `out_size` bytes as the kernel expects. Changing the immutable or append flag needs
    /// CAP_LINUX_IMMUTABLE, which the kernel has checked before it sends the request; FUSE
    /// passes no capabilities, so the caller's effective set in /proc stands for it here
    /// ([`capable`]; library callers say it in `Fs::set_flags`).
    fn inode_ioctl(
        &self,
        req: &Request,
        ino: u64,
        cmd: u32,
        input: &[u8],
        out_size: u32,
    ) -> Result<Vec<u8>, Errno> {
        let word = |at: usize| -> Result<u32, Errno> {
            let b = input.get(at..at + 4).ok_or(Errno::EINVAL)?;
            Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
        };
        let privileged = capable(req, CAP_LINUX_IMMUTABLE);
        let mut out = vec![0u8; out_size as usize];
        match cmd {
            FS_IOC_GETFLAGS => {
                let f = self.fs.get_flags(ino).map_err(errno)?;
                let v = f.bits().to_le_bytes();
                let n = out.len().min(4);
                out[..n].copy_from_slice(&v[..n]);
            }
            FS_IOC_SETFLAGS => {
                self.fs.set_flags(ino, InodeFlags(word(0)?), privileged).map_err(errno)?;
                self.attributes_changed(ino);
            }
            FS_IOC_FSGETXATTR => {
                let f = self.fs.get_flags(ino).map_err(errno)?;
                let mut x = [0u8; FSXATTR_LEN];
                x[..4].copy_from_slice(&f.xflags().to_le_bytes());
                let n = out.len().min(FSXATTR_LEN);
                out[..n].copy_from_slice(&x[..n]);
            }
            FS_IOC_FSSETXATTR => {
                if input.len() < FSXATTR_LEN {
                    return Err(Errno::EINVAL);
                }
                // No project quotas: only project 0. (Extent size hints need FS_XFLAG_EXTSIZE,
                // which from_xflags refuses.)
                if word(12)? != 0 {
                    return Err(Errno::from_i32(libc::EOPNOTSUPP));
                }
                let mut f = InodeFlags::from_xflags(word(0)?).map_err(errno)?;
                // fsx_xflags cannot say DIRSYNC: it stays as it was.
                let old = self.fs.get_flags(ino).map_err(errno)?;
                f = InodeFlags(f.bits() | (old.bits() & InodeFlags::DIRSYNC.bits()));
                self.fs.set_flags(ino, f, privileged).map_err(errno)?;
                self.attributes_changed(ino);
            }
            _ => return Err(Errno::from_i32(libc::ENOTTY)),
        }
        Ok(out)
    }

    fn copy_range(
        &self,
        caller: &ReqCaller,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> lanefs::Result<u64> {
        let len = len.min(MAX_COPY);
        let efbig = || lanefs::Error::errno(libc::EFBIG, "copy range past the largest offset");
        off_in.checked_add(len).ok_or_else(efbig)?;
        off_out.checked_add(len).ok_or_else(efbig)?;
        let mut buf = vec![0u8; (self.max_write as u64).min(len.max(1)) as usize];
        let mut done = 0u64;
        while done < len {
            let want = ((len - done) as usize).min(buf.len());
            let n = self.fs.read_at(ino_in, off_in + done, &mut buf[..want])?;
            if n == 0 {
                break;
            }
            if self.killpriv {
                self.fs.write_at_as(ino_out, off_out + done, &buf[..n], caller)?;
            } else {
                self.fs.write_at(ino_out, off_out + done, &buf[..n])?;
            }
            done += n as u64;
        }
        Ok(done)
    }
}

/// ioctl commands lanefs answers (linux/fs.h, xfs_fs.h, ext4.h).
pub mod ioctl {
    /// `_IOR('X', 125, __u32)`: XFS_IOC_GOINGDOWN, the same number as EXT4_IOC_SHUTDOWN.
    pub const GOINGDOWN: u32 = 0x8004_587d;
    /// `_IOWR('X', 121, struct fstrim_range)`.
    pub const FITRIM: u32 = 0xc018_5879;
    /// `_IOR(0x94, 49, char[FSLABEL_MAX])`.
    pub const FS_IOC_GETFSLABEL: u32 = 0x8100_9431;
    /// `_IOW(0x94, 50, char[FSLABEL_MAX])`.
    pub const FS_IOC_SETFSLABEL: u32 = 0x4100_9432;
    /// The label buffer of the label ioctls.
    pub const FSLABEL_MAX: usize = 256;
    /// GOINGDOWN flags: make everything durable first (DEFAULT, LOGFLUSH), or not (NOLOGFLUSH).
    pub const GOING_FLAGS_DEFAULT: u32 = 0;
    pub const GOING_FLAGS_LOGFLUSH: u32 = 1;
    pub const GOING_FLAGS_NOLOGFLUSH: u32 = 2;
}

impl LaneFuse {
    /// XFS_IOC_GOINGDOWN / EXT4_IOC_SHUTDOWN. The kernel passes no input for this `_IOR`
    /// command, so the flags are read from the caller (`crate::caller`); when they cannot be,
    /// it is NOLOGFLUSH: a crash, the durability contract's test. With DEFAULT or LOGFLUSH,
    /// what was done is made durable first (a sync: more than XFS's log force, which keeps
    /// metadata only, and what a caller asking for it expects to find).
    fn going_down(&self, req: &Request, cmd: u32) -> Result<(), Errno> {
        if !capable(req, CAP_SYS_ADMIN) {
            return Err(Errno::EPERM);
        }
        if self.fs.is_shut_down() {
            return Ok(());
        }
        let flags = crate::caller::ioctl_u32_input(req.pid(), cmd).unwrap_or(ioctl::GOING_FLAGS_NOLOGFLUSH);
        match flags {
            ioctl::GOING_FLAGS_DEFAULT | ioctl::GOING_FLAGS_LOGFLUSH => {
                if let Err(e) = self.fs.sync() {
                    // Going down all the same, as XFS does when its log force fails.
                    eprintln!("lanefs: sync before the shutdown failed: {e}");
                }
            }
            ioctl::GOING_FLAGS_NOLOGFLUSH => {}
            _ => return Err(Errno::EINVAL),
        }
        self.fs.shutdown().map_err(errno)?;
        crate::syslog::open();
        crate::syslog::warning(&format!(
            "shut down by pid {} ({}): nothing more is written; unmount, and the next mount recovers",
            req.pid(),
            if flags == ioctl::GOING_FLAGS_NOLOGFLUSH { "no flush, as a crash" } else { "after a sync" }
        ));
        Ok(())
    }

    /// FITRIM: `struct fstrim_range { u64 start, len, minlen }` in, the bytes trimmed in `len`
    /// out.
    fn fitrim(&self, req: &Request, input: &[u8]) -> Result<Vec<u8>, Errno> {
        if !capable(req, CAP_SYS_ADMIN) {
            return Err(Errno::EPERM);
        }
        let word = |i: usize| -> Result<u64, Errno> {
            input
                .get(i * 8..i * 8 + 8)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
                .ok_or(Errno::EINVAL)
        };
        let range = TrimRange { start: word(0)?, len: word(1)?, minlen: word(2)? };
        let trimmed = self.fs.trim(range).map_err(errno)?;
        let mut out = input[..24].to_vec();
        out[8..16].copy_from_slice(&trimmed.to_ne_bytes());
        Ok(out)
    }

    /// FS_IOC_SETFSLABEL: a NUL-terminated label in a 256-byte buffer.
    fn set_label(&self, req: &Request, input: &[u8]) -> Result<(), Errno> {
        if !capable(req, CAP_SYS_ADMIN) {
            return Err(Errno::EPERM);
        }
        // As btrfs: a buffer with no NUL holds no valid label.
        let end = input.iter().position(|&c| c == 0).ok_or(Errno::EINVAL)?;
        self.fs.set_label(&input[..end]).map_err(errno)
    }
}

impl Filesystem for LaneFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let caps = config.capabilities();
        let mut want = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            // Node ids are inode numbers and every reply carries the inode's generation, both
            // stable across mounts: the kernel may hand out file handles (name_to_handle_at,
            // NFS export) and resolve them with LOOKUP "." and "..".
            | InitFlags::FUSE_EXPORT_SUPPORT;
        if self.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if self.idmap {
            want |= InitFlags::FUSE_ALLOW_IDMAP;
        }
        // The engine drops set-ID bits itself (no GETXATTR("security.capability") before each
        // write), inherits default ACLs (so the umask is ours to apply) and keeps the mode in
        // step with ACLs the kernel then enforces.
        want |= InitFlags::FUSE_HANDLE_KILLPRIV_V2 | InitFlags::FUSE_DONT_MASK;
        if self.posix_acl {
            want |= InitFlags::FUSE_POSIX_ACL;
        }
        // Ask only for what this kernel offers; a missing optional feature is not an error.
        let got = want & caps;
        let _ = config.add_capabilities(got);
        self.killpriv = got.contains(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        self.writeback_cache_on = got.contains(InitFlags::FUSE_WRITEBACK_CACHE);
        self.dont_mask = got.contains(InitFlags::FUSE_DONT_MASK);
        let _ = config.set_max_write(self.max_write);
        let _ = config.set_max_readahead(self.max_write);
        // Background requests (readahead, async direct I/O) in flight at once.
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        let _busy = self.inflight.enter(Op::Lookup, parent.0, req.pid());
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

    fn forget(&self, _req: &Request, _ino: INodeNo, _nlookup: u64) {
        // Nothing to drop: inode numbers are lanefs's own and no per-lookup state is kept. (Not
        // marked in flight, nor are FLUSH and RELEASEDIR: they cannot wait on anything.)
        // fuser passes a BATCH_FORGET on as one call per inode (its `ForgetOne` cannot be
        // named outside the crate to override that): this counts inodes forgotten.
        self.inflight.count(Op::Forget);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _busy = self.inflight.enter(Op::Getattr, ino.0, req.pid());
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&self.ttl.cache, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _busy = self.inflight.enter(Op::Setattr, ino.0, req.pid());
        let now = |t: &Option<TimeOrNow>| t.as_ref().is_none_or(|t| matches!(t, TimeOrNow::Now));
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            times_now: now(&atime) && now(&mtime),
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(timespec),
        };
        // The kernel asks us to drop set-ID bits on a truncate by a caller without CAP_FSETID and
        // on every chown (FATTR_KILL_SUIDGID, which fuser does not pass on: the engine applies
        // the kernel's own rule for the caller, which is what that flag stands for).
        let r = if self.killpriv {
            self.fs.setattr_as(ino.0, &a, &self.caller(req, None))
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
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _busy = self.inflight.enter(Op::Rename, parent.0, req.pid());
        let known =
            RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT;
        if !known.contains(flags) {
            return reply.error(Errno::EINVAL);
        }
        let mut f = 0;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            f |= lanefs::fs::RENAME_NOREPLACE;
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            f |= lanefs::fs::RENAME_EXCHANGE;
        }
        // The whiteout (overlayfs asks for one) is a new inode in `parent`, owned as any other:
        // the kernel sends the caller's ids with this request (mapped, on an idmapped mount).
        let (uid, gid) = if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            f |= lanefs::fs::RENAME_WHITEOUT;
            match self.new_owner(req, parent, libc::S_IFCHR) {
                Ok((uid, gid, _)) => (uid, gid),
                Err(e) => return reply.error(e),
            }
        } else {
            (0, 0)
        };
        self.empty(self.fs.rename_as(parent.0, name(n), newparent.0, name(newname), f, uid, gid), reply)
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _busy = self.inflight.enter(Op::Link, ino.0, req.pid());
        self.entry(self.fs.link(ino.0, newparent.0, name(newname)), reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _busy = self.inflight.enter(Op::Open, ino.0, req.pid());
        // The kernel does not see the inode flags: the engine refuses write opens they forbid.
        match self.fs.open_with(ino.0, flags.0) {
            Ok(_) => reply.opened(FileHandle(0), Self::open_flags(flags.0)),
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
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _busy = self.inflight.enter(Op::Read, ino.0, req.pid());
        READ_BUF.with(|b| {
            let mut b = b.borrow_mut();
            let size = (size as usize).min(self.max_write as usize);
            if b.len() < size {
                b.resize(size, 0);
            }
            match self.fs.read_at(ino.0, offset, &mut b[..size]) {
                Ok(n) => reply.data(&b[..n]),
                Err(e) => reply.error(errno(e)),
            }
        })
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _busy = self.inflight.enter(Op::Write, ino.0, req.pid());
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let caller = self.killpriv.then(|| self.caller(req, Some(!kill)));
        let caller = caller.as_ref().map(|c| c as &dyn lanefs::perm::Caller);
        // With the writeback cache the kernel keeps a regular file's mtime and ctime: it
        // stamped them at write(2), direct I/O included, and sends them in SETATTR. Stamping
        // the time a WRITE arrives would show another time after the inode is read afresh.
        let r = match (self.writeback_cache_on, caller) {
            (true, caller) => self.fs.write_keep_times(ino.0, offset, data, caller),
            (false, Some(c)) => self.fs.write_at_as(ino.0, offset, data, c),
            (false, None) => self.fs.write_at(ino.0, offset, data),
        };
        let n = match r {
            Ok(n) => n,
            Err(e) => return reply.error(errno(e)),
        };
        // O_SYNC / O_DSYNC (the kernel sets them in the request from the file and the call):
        // after a buffered write the kernel sends FSYNC itself, after a direct-I/O one it does
        // not, so such a write is made durable here before it is acknowledged.
        if flags.0 & libc::O_DIRECT != 0 && flags.0 & libc::O_DSYNC != 0 {
            let datasync = flags.0 & libc::O_SYNC != libc::O_SYNC;
            if let Err(e) = self.fs.fsync(ino.0, datasync) {
                return reply.error(errno(e));
            }
        }
        reply.written(n as u32)
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _owner: LockOwner, reply: ReplyEmpty) {
        // WRITEs reach the engine as they come, so a close has nothing to push here. With
        // FOPEN_NOFLUSH the kernel sends no FLUSH, but with its writeback cache it does on
        // every close (after writing the dirty pages back itself): ENOSYS makes it stop for
        // good (fc->no_flush; fs/fuse/file.c, fuse_flush), which costs nothing: lanefs takes no
        // POSIX locks (no FUSE_POSIX_LOCKS), the other thing FLUSH is for.
        self.inflight.count(Op::Flush);
        reply.error(Errno::ENOSYS)
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _busy = self.inflight.enter(Op::Release, ino.0, req.pid());
        self.empty(self.fs.release(ino.0), reply)
    }

    fn fsync(&self, req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Fsync, ino.0, req.pid());
        self.empty(self.fs.fsync(ino.0, datasync), reply)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _busy = self.inflight.enter(Op::Opendir, ino.0, req.pid());
        match self.fs.getattr(ino.0) {
            Ok(a) if a.kind == FileKind::Dir => match self.fs.listing(ino.0) {
                Ok(l) => reply.opened(FileHandle(self.dirs.open(l)), FopenFlags::empty()),
                Err(e) => reply.error(errno(e)),
            },
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let _busy = self.inflight.enter(Op::Readdir, ino.0, req.pid());
        let mut cookie = offset;
        loop {
            let batch = match self.dirs.read(&self.fs, ino.0, fh.0, cookie, DIR_BATCH) {
                Ok(b) => b,
                Err(e) => return reply.error(errno(e)),
            };
            for e in &batch {
                // ".." of the root is the root itself.
                let target = if e.ino == 0 { ino.0 } else { e.ino };
                if reply.add(INodeNo(target), e.cookie, kind(e.kind), OsStr::from_bytes(&e.name)) {
                    return reply.ok();
                }
                cookie = e.cookie;
            }
            if batch.len() < DIR_BATCH {
                return reply.ok();
            }
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _busy = self.inflight.enter(Op::Readdirplus, ino.0, req.pid());
        let mut cookie = offset;
        loop {
            let batch = match self.dirs.read(&self.fs, ino.0, fh.0, cookie, DIR_BATCH) {
                Ok(b) => b,
                Err(e) => return reply.error(errno(e)),
            };
            for e in &batch {
                // ".." of the root is the root itself.
                let target = if e.ino == 0 { ino.0 } else { e.ino };
                match self.fs.getattr(target) {
                    Ok(a) => {
                        let name = OsStr::from_bytes(&e.name);
                        if reply.add(
                            INodeNo(target),
                            e.cookie,
                            name,
                            &self.ttl.cache,
                            &file_attr(&a),
                            generation(&a),
                        ) {
                            return reply.ok();
                        }
                    }
                    // Removed since the listing: leave it out, as a later readdir would.
                    Err(err) if err.to_errno() == libc::ENOENT => {}
                    Err(err) => return reply.error(errno(err)),
                }
                cookie = e.cookie;
            }
            if batch.len() < DIR_BATCH {
                return reply.ok();
            }
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
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

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _busy = self.inflight.enter(Op::Setxattr, ino.0, req.pid());
        if name(n).starts_with(crate::stats::RESERVED_PREFIX) {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        // The kernel would say whether an ACL keeps set-group-ID only with FUSE_SETXATTR_EXT,
        // which fuser cannot parse: the engine asks the caller itself.
        self.empty(self.fs.setxattr_as(ino.0, name(n), value, flags, &self.caller(req, None)), reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        // The mount's request and engine counters (`crate::stats`); reading them is not counted.
        let r = if ino.0 == lanefs::ROOT && n.as_bytes() == crate::stats::REQUESTS_XATTR.as_bytes() {
            Ok(crate::stats::format(&self.inflight.requests()).into_bytes())
        } else if ino.0 == lanefs::ROOT && n.as_bytes() == crate::stats::ENGINE_XATTR.as_bytes() {
            Ok(crate::stats::format_engine(&self.fs.io_stats(), &self.fs.lock_census()).into_bytes())
        } else {
            let _busy = self.inflight.enter(Op::Getxattr, ino.0, req.pid());
            self.fs.getxattr(ino.0, name(n))
        };
        match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _busy = self.inflight.enter(Op::Listxattr, ino.0, req.pid());
        match self.fs.listxattr(ino.0) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32)
                } else if buf.len() > size as usize {
                    reply.error(Errno::from_i32(libc::ERANGE))
                } else {
                    reply.data(&buf)
                }
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Removexattr, ino.0, req.pid());
        if name(n).starts_with(crate::stats::RESERVED_PREFIX) {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        self.empty(self.fs.removexattr(ino.0, name(n)), reply)
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _busy = self.inflight.enter(Op::Access, ino.0, req.pid());
        // Only asked when the mount has no default_permissions; the caller's primary group
        // stands for its groups (FUSE does not send supplementary groups).
        let a = match self.fs.getattr(ino.0) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(e)),
        };
        let want = mask.bits() & 0o7;
        let ok = if req.uid() == 0 {
            // root may read and write anything, and execute what anyone may execute.
            want & 1 == 0 || a.mode & 0o111 != 0 || a.kind == FileKind::Dir
        } else {
            let bits = if req.uid() == a.uid {
                (a.mode >> 6) & 7
            } else if req.gid() == a.gid {
                (a.mode >> 3) & 7
            } else {
                a.mode & 7
            };
            bits as i32 & want == want
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
        match self.fs.open_ino(a.ino) {
            Ok(a) => reply.created(
                &self.ttl.cache,
                &file_attr(&a),
                generation(&a),
                FileHandle(0),
                Self::open_flags(flags),
            ),
            Err(e) => reply.error(errno(e)),
        }
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
        let _busy = self.inflight.enter(Op::Fallocate, ino.0, req.pid());
        // The kernel drops privileges before a fallocate only by a SETATTR it empties under
        // FUSE_HANDLE_KILLPRIV_V2; the request carries no flag, so the engine applies the
        // kernel's rule for the caller, as for a write.
        let r = if self.killpriv {
            self.fs.fallocate_as(ino.0, mode, offset, length, &self.caller(req, None))
        } else {
            self.fs.fallocate(ino.0, mode, offset, length)
        };
        self.empty(r, reply)
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
        let _busy = self.inflight.enter(Op::Lseek, ino.0, req.pid());
        // The kernel sends LSEEK without writing its dirty pages back first: with its writeback
        // cache the engine may not have seen data a reader would then skip as a hole (cp
        // copies with SEEK_DATA). ENOSYS makes the kernel answer from its own size for good
        // (fc->no_lseek): every byte is data, which is always a correct answer.
        if self.writeback_cache_on {
            return reply.error(Errno::ENOSYS);
        }
        let what = match whence {
            libc::SEEK_DATA => Seek::Data,
            libc::SEEK_HOLE => Seek::Hole,
            // The kernel answers SEEK_SET, SEEK_CUR and SEEK_END itself.
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(off) = u64::try_from(offset) else { return reply.error(Errno::ENXIO) };
        match self.fs.seek(ino.0, off, what) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _busy = self.inflight.enter(Op::Ioctl, ino.0, req.pid());
        let r = match cmd {
            ioctl::GOINGDOWN => self.going_down(req, cmd).map(|()| Vec::new()),
            ioctl::FITRIM => self.fitrim(req, in_data),
            ioctl::FS_IOC_GETFSLABEL => self.fs.label().map_err(errno).map(|mut l| {
                l.resize(ioctl::FSLABEL_MAX, 0);
                l
            }),
            ioctl::FS_IOC_SETFSLABEL => self.set_label(req, in_data).map(|()| Vec::new()),
            FS_IOC_GETFLAGS | FS_IOC_SETFLAGS | FS_IOC_FSGETXATTR | FS_IOC_FSSETXATTR => {
                self.inode_ioctl(req, ino.0, cmd, in_data, out_size)
            }
            // What the kernel's file systems say to a command they do not know.
            _ => Err(Errno::ENOTTY),
        };
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
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _busy = self.inflight.enter(Op::CopyFileRange, ino_in.0, req.pid());
        // The engine cannot share blocks between files, so this is a read + write loop in the
        // daemon: it saves the two kernel crossings per chunk that a user-space copy pays.
        let caller = self.caller(req, None);
        match self.copy_range(&caller, ino_in.0, offset_in, ino_out.0, offset_out, len) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_before_and_after_the_epoch() {
        for t in [
            Timespec { sec: 0, nsec: 0 },
            Timespec { sec: 1_700_000_000, nsec: 123_456_789 },
            Timespec { sec: -1, nsec: 500_000_000 },
            Timespec { sec: -86_400, nsec: 0 },
        ] {
            assert_eq!(timespec(system_time(t)), t);
        }
    }

    #[test]
    fn proc_status_gives_capabilities_and_groups() {
        let text = "Name:\tsh\nUid:\t4242\t4242\t4242\t4242\nGid:\t10\t11\t12\t13\n\
                    Groups:\t0 27 4243 \nCapInh:\t0000000000000000\nCapEff:\t0000000000000010\n";
        let s = parse_status(text).unwrap();
        assert_eq!(s, ProcStatus { cap_eff: 1 << CAP_FSETID, fsgid: 13, groups: vec![0, 27, 4243] });
        // No supplementary groups: an empty list, not a failure.
        let s = parse_status("Gid:\t5\t5\t5\t5\nGroups:\t\nCapEff:\t0000000000000000\n").unwrap();
        assert_eq!(s, ProcStatus { cap_eff: 0, fsgid: 5, groups: vec![] });
        assert_eq!(parse_status("Gid:\t5\t5\t5\t5\nGroups:\t1\n"), None, "no CapEff line");
        assert_eq!(parse_status("Gid:\t5\t5\t5\t5\nGroups:\tx\nCapEff:\t0\n"), None, "a bad group");
        assert_eq!(parse_status("Groups:\t1\nCapEff:\t0\n"), None, "no Gid line");
        // This process's own entry parses (the adapter reads the requester's the same way).
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(parse_status(&own).is_some());
    }

    #[test]
    fn max_write_is_a_whole_number_of_pages_up_to_one_mib() {
        let m = max_write();
        assert!((4096..=MAX_WRITE).contains(&m) && m.is_multiple_of(4096));
    }
}
