//! MEMFS operations: the namespace and file data, changed in memory only.
//!
//! Every operation enters through the pass-through semaphore (shared), so a checkpoint's
//! snapshot sees no operation half done. A directory change locks only the shard of the names
//! it touches, takes its timestamp and appends its log record inside that critical section (its
//! linearization point), and registers with `inflight` so that a merge stamped later waits for
//! it. File data is written under the range lock of the bytes written, never a file lock.

use super::iflags::{refuse, InodeFlags};
use super::mnode::{ts_to_ns, Content, DiskState, MNode, Meta, Stamps, S_IFDIR, S_IFLNK, S_IFREG};
use super::pages::{PageMap, PAGE_SIZE};
use super::range_lock::LockMode;
use super::xattr::XattrState;
use crate::device::BLOCK_SIZE;
use crate::engine::{now, Engine};
use crate::error::{Error, Result};
use crate::format::dentry::dtype_of;
use crate::format::dentry::validate_name;
use crate::format::node::{Timespec, ADDRS_PER_NODE, NEW_ADDR, S_IFMT};
use crate::format::tree::MAX_FILE_BLOCKS;
use crate::format::xattr::{blocks_for, stream_entry_len, MAX_XATTR_STREAM};
use crate::journal::{InodeAttr, Record};
use crate::oplog::dirlog::LoggedOp;
use crate::perm::{Caller, Change};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Largest file size in bytes.
pub const MAX_FILE_SIZE: u64 = MAX_FILE_BLOCKS * BLOCK_SIZE as u64;
pub use crate::format::xattr::{XATTR_NAME_MAX, XATTR_SIZE_MAX};
pub const XATTR_CREATE: i32 = 1;
pub const XATTR_REPLACE: i32 = 2;
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
/// Leave a whiteout (a character device 0:0) at the source name, as overlayfs asks.
pub const RENAME_WHITEOUT: u32 = 4;
pub const FALLOC_FL_KEEP_SIZE: i32 = 1;
pub const FALLOC_FL_PUNCH_HOLE: i32 = 2;
pub const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

fn enoent(what: impl Into<String>) -> Error {
    Error::errno(libc::ENOENT, what)
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > crate::format::node::MAX_NAME_LEN {
        return Err(Error::errno(libc::ENAMETOOLONG, String::from_utf8_lossy(name)));
    }
    validate_name(name).map_err(|why| Error::errno(libc::EINVAL, why))
}

/// Inside a directory shard's critical section: why a new name cannot be added (it exists, or
/// the directory is being removed), as the update's answer, or None if it can.
#[allow(clippy::type_complexity)]
fn refuse_new_name(
    dir: &super::mnode::DirState,
    name: &[u8],
    old: Option<super::dir::DirEntry>,
) -> Option<(Option<(u32, u8)>, Result<()>)> {
    if let Some(e) = old {
        return Some((
            Some((e.ino, e.file_type)),
            Err(Error::errno(libc::EEXIST, String::from_utf8_lossy(name))),
        ));
    }
    if dir.dead.load(Ordering::Acquire) {
        return Some((None, Err(enoent("directory was removed"))));
    }
    None
}

/// Whether a write stamps the file's mtime and ctime (not the journal's `Stamp`, which orders
/// records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteTimes {
    /// Now, as write(2) does.
    Now,
    /// Left as they are: the bytes come from a cache that keeps the times itself and sends them
    /// in a later setattr (the kernel's FUSE writeback cache, whose WRITEs arrive at writeback,
    /// after the write(2) that set the time the caller saw).
    Keep,
}

/// What a name in a directory is (`Engine::named`).
enum Named<'p> {
    /// ".".
    Itself,
    /// "..".
    Parent,
    /// Any other name, valid while the pin it was read under lives.
    Slot(&'p crate::mem::dir::Slot),
}

/// What a truncate took out of a file: its cached pages and its mapping past the new end,
/// freed when this drops, after the caller let go of the pass-through semaphore.
#[derive(Default)]
struct Truncated {
    pages: Vec<super::pages::Page>,
    map: super::cowmap::CowMap,
}

/// A rename's two directories (pinned, `Engine::with_dir`) and the rest of its arguments.
struct RenameArgs<'a> {
    sd: &'a MNode,
    sname: &'a [u8],
    dd: &'a MNode,
    dname: &'a [u8],
    flags: u32,
    owner: (u32, u32),
}

/// What a new inode is.
pub struct NewInode<'a> {
    /// Type and permission bits, as asked for: the parent's default ACL or else `umask` masks
    /// them.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub symlink: &'a [u8],
    /// The creating process's umask (0: none).
    pub umask: u32,
}

impl MNode {
    /// The attributes a journal record carries (all but nlink).
    pub fn attr_record(&self, meta: &Meta) -> InodeAttr {
        InodeAttr {
            mode: meta.mode,
            uid: meta.uid,
            gid: meta.gid,
            size: self.size.load(Ordering::Acquire),
            atime: self.atime(),
            mtime: self.mtime(),
            ctime: self.ctime(),
            crtime: meta.crtime,
            rdev: meta.rdev,
            flags: self.iflags(),
            generation: meta.generation,
        }
    }
}

impl Engine {
    /// A directory's mnode, or ENOTDIR / ENOENT.
    pub(crate) fn dir_mnode(&self, ino: u32) -> Result<Arc<MNode>> {
        let m = self.mnode(ino)?;
        if !m.is_dir() {
            return Err(Error::errno(libc::ENOTDIR, format!("inode {ino}")));
        }
        Ok(m)
    }

    /// Runs `f` on directory `ino`'s mnode (ENOTDIR or ENOENT as [`Engine::dir_mnode`]) without
    /// taking a reference: creates, unlinks and renames of distinct names in one directory
    /// would otherwise all write its reference count, a cache line every core then bounces.
    /// `f` runs pinned to the mnode table (`Cells::with`): it may lock and allocate, but must
    /// not wait for another operation.
    pub(crate) fn with_dir<R>(&self, ino: u32, f: impl FnOnce(&MNode) -> Result<R>) -> Result<R> {
        self.with_mnode(ino, |d| {
            if !d.is_dir() {
                return Err(Error::errno(libc::ENOTDIR, format!("inode {ino}")));
            }
            f(d)
        })?
    }

    /// Looks `name` up in directory `parent` and runs `f` on its mnode: the path walk's step.
    /// Neither mnode's reference count is touched, and no lock is taken that a writer of
    /// another name takes (the directory map's read is lock-free, `mem::dir`).
    pub fn lookup_with<R>(&self, parent: u32, name: &[u8], f: impl FnOnce(&MNode) -> R) -> Result<R> {
        self.walk_with(parent, [name], f)
    }

    /// Looks each of `names` up in turn from directory `dir` and runs `f` on the mnode the walk
    /// ends on (`dir`'s own for no names): a whole path walk in one entry of the pass-through
    /// semaphore, computing nothing for the directories it passes through and touching no
    /// reference count, as a kernel's RCU walk. Symbolic links are not followed (one on the
    /// way is ENOTDIR). Each step is one mnode-table read and one directory-map read.
    pub fn walk_with<'n, R>(
        &self,
        dir: u32,
        names: impl IntoIterator<Item = &'n [u8]>,
        f: impl FnOnce(&MNode) -> R,
    ) -> Result<R> {
        let _g = self.pass.shared();
        let mut names = names.into_iter();
        let mut f = Some(f);
        // The fast walk: one pin of the directory maps for every directory on the way, each
        // step from the directory's slot straight to the child's mnode (`mem::dir`). It hands
        // over to the step-by-step walk only for what it does not take (".."), having read
        // but changed nothing.
        let fast = self.with_mnode(dir, |start| {
            let pin = crate::mem::dir::guard();
            let mut cur = start;
            let mut pending = None;
            for name in names.by_ref() {
                match self.slot_step(cur, name, &pin) {
                    Ok(Some(child)) => cur = child,
                    Ok(None) => {
                        pending = Some((cur.ino, name));
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            match pending {
                None => Ok(Ok((f.take().expect("called once"))(cur))),
                Some(at) => Ok(Err(at)),
            }
        })??;
        let (mut cur, name) = match fast {
            Ok(r) => return Ok(r),
            Err(at) => at,
        };
        for name in std::iter::once(name).chain(names) {
            cur = self.with_mnode(cur, |d| Self::step(d, name))??;
        }
        self.with_mnode(cur, f.take().expect("not called"))
    }

    /// The fast walk's step: the mnode `name` names in directory `d`, taken from the name's
    /// slot (fetched from the mnode table and remembered there the first time), valid while
    /// `pin` lives. `None` for "..", which the slots do not hold. Errors as [`Engine::step`].
    #[inline]
    fn slot_step<'p>(
        &self,
        d: &'p MNode,
        name: &[u8],
        pin: &'p crate::mem::dir::Guard,
    ) -> Result<Option<&'p MNode>> {
        Ok(match Self::named(d, name, pin)? {
            Named::Itself => Some(d),
            Named::Parent => None,
            Named::Slot(slot) => Some(match slot.child() {
                Some(c) => c,
                None => slot.remember(self.mnode(slot.entry().ino)?),
            }),
        })
    }

    /// The inode `name` names in directory `d`. The checks and their order are
    /// `Engine::lookup`'s: ENOTDIR, then the name.
    fn step(d: &MNode, name: &[u8]) -> Result<u32> {
        let pin = crate::mem::dir::guard();
        Ok(match Self::named(d, name, &pin)? {
            Named::Itself => d.ino,
            Named::Parent => d.parent.load(Ordering::Acquire),
            Named::Slot(slot) => slot.entry().ino,
        })
    }

    /// What `name` is in directory `d`, checked in `Engine::lookup`'s order (ENOTDIR, then the
    /// name): both steps of a walk, by inode number and by slot, go through it.
    #[inline]
    fn named<'p>(d: &MNode, name: &[u8], pin: &'p crate::mem::dir::Guard) -> Result<Named<'p>> {
        let Some(dir) = d.dir() else {
            return Err(Error::errno(libc::ENOTDIR, format!("inode {}", d.ino)));
        };
        Ok(match name {
            b"." => Named::Itself,
            b".." => Named::Parent,
            _ => {
                check_name(name)?;
                Named::Slot(dir.map.slot(name, pin).ok_or_else(|| enoent(String::from_utf8_lossy(name)))?)
            }
        })
    }

    pub fn lookup(&self, parent: u32, name: &[u8]) -> Result<Arc<MNode>> {
        let _g = self.pass.shared();
        let d = self.dir_mnode(parent)?;
        self.mnode(Self::step(&d, name)?)
    }

    /// Creates a file, directory, symlink or special file named `name` in `parent`.
    pub fn create_node(&self, parent: u32, name: &[u8], new: NewInode) -> Result<Arc<MNode>> {
        self.check_writable()?;
        // Room for the new inode's node block and a directory block at the next checkpoint:
        // an inode created without it fails that checkpoint, and with it the file system.
        self.admit(2)?;
        check_name(name)?;
        let ftype = new.mode & S_IFMT;
        if !matches!(ftype, 0o010000 | 0o020000 | 0o040000 | 0o060000 | 0o100000 | 0o120000 | 0o140000) {
            return Err(Error::errno(libc::EINVAL, format!("mode {:o} has no file type", new.mode)));
        }
        if ftype == S_IFLNK && (new.symlink.is_empty() || new.symlink.len() > crate::journal::MAX_SYMLINK_LEN)
        {
            return Err(Error::errno(libc::ENAMETOOLONG, "symlink target"));
        }
        let _g = self.pass.shared();
        self.with_dir(parent, |d| self.create_in(d, name, &new))
    }

    /// [`Engine::create_node`] in directory `d`, pinned, with the arguments checked.
    fn create_in(&self, d: &MNode, name: &[u8], new: &NewInode) -> Result<Arc<MNode>> {
        let parent = d.ino;
        let ftype = new.mode & S_IFMT;
        let dir = d.dir().expect("dir");
        if dir.map.lookup(name).is_some() {
            return Err(Error::errno(libc::EEXIST, String::from_utf8_lossy(name)));
        }
        refuse(d.iflags(), InodeFlags::IMMUTABLE, "create")?;
        // Its ACLs go in with it, before its name is visible.
        let (mode, xattrs) = self.inherit(d, new.mode, new.umask)?;
        let (_, cpu) = self.lane();
        let ino = self.nat.alloc_nid(cpu).map_err(|_| Error::errno(libc::ENOSPC, "no free inode numbers"))?;
        let t = now();
        let inherited = !xattrs.is_empty();
        let logged_xattrs = xattrs.clone();
        let meta = Meta {
            mode,
            uid: new.uid,
            gid: new.gid,
            nlink: if ftype == S_IFDIR { 2 } else { 1 },
            crtime: t,
            rdev: new.rdev,
            generation: self.generations.take(),
            xattrs: Default::default(),
            symlink: new.symlink.to_vec(),
        };
        let mut meta = meta;
        for (n, v) in xattrs {
            Arc::make_mut(&mut meta.xattrs.set).set(&n, v);
            self.xattr_changed(&mut meta.xattrs, &n);
        }
        let size = if ftype == S_IFLNK { new.symlink.len() as u64 } else { 0 };
        let flags = InodeFlags(d.iflags()).inherited_by(new.mode).bits();
        let m = MNode::new(ino, meta, size, Stamps { flags, ..Stamps::at(t) }, &self.cache);
        m.parent.store(parent, Ordering::Relaxed);
        if ftype == S_IFDIR {
            m.disk.lock().dentries = Some(Default::default());
        }
        let attr = m.attr_record(&m.meta.lock());
        let (m, _) = self.cells.insert_if_absent(ino as u64, || m);
        let dtype = dtype_of(mode);
        let r = dir.map.update(name, |old| {
            if let Some(refused) = refuse_new_name(dir, name, old) {
                return refused;
            }
            let op = self.inflight.begin();
            let stamp = self.clock.stamp_of(op.timestamp());
            let rec = Record::Create {
                stamp,
                dir: parent,
                name: name.to_vec(),
                ino,
                attr,
                symlink: new.symlink.to_vec(),
            };
            // Counted before it is visible in the log, so a flush never uncounts it first.
            m.note_pending(parent, 1);
            if inherited {
                // Its ACLs go with its name: an fsync of the directory alone makes the name
                // durable, and the name without the ACL would give the owning group the mask's
                // rights, which the mode's group bits show.
                let acls = Record::Xattrs { stamp, ino, attrs: logged_xattrs.clone() };
                dir.log.push_all([LoggedOp::new(rec), LoggedOp::new(acls)]);
            } else {
                dir.log.push(LoggedOp::new(rec));
            }
            drop(op);
            (Some((ino, dtype)), Ok(()))
        });
        if let Err(e) = r {
            self.cells.remove(ino as u64);
            let _ = self.nat.free_nid(ino);
            return Err(e);
        }
        if ftype == S_IFDIR {
            d.add_nlink(1);
        }
        d.touch(t);
        self.count_op();
        self.mark_dirty(d);
        self.mark_dirty(&m);
        Ok(m)
    }

    pub fn link(&self, ino: u32, parent: u32, name: &[u8]) -> Result<Arc<MNode>> {
        self.check_writable()?;
        self.admit(2)?;
        check_name(name)?;
        let _g = self.pass.shared();
        let m = self.mnode(ino)?;
        if m.is_dir() {
            return Err(Error::errno(libc::EPERM, "hard link to a directory"));
        }
        refuse(m.iflags(), InodeFlags::PRIVILEGED, "link")?;
        self.with_dir(parent, |d| self.link_in(&m, d, name))?;
        Ok(m)
    }

    /// [`Engine::link`] of `m` into directory `d`, pinned, with the arguments checked.
    fn link_in(&self, m: &MNode, d: &MNode, name: &[u8]) -> Result<()> {
        let (ino, parent) = (m.ino, d.ino);
        refuse(d.iflags(), InodeFlags::IMMUTABLE, "link into a directory")?;
        let dir = d.dir().expect("dir");
        {
            let meta = m.meta.lock();
            if meta.nlink == 0 {
                return Err(enoent("inode was removed"));
            }
            if meta.nlink >= u32::MAX - 1 {
                return Err(Error::errno(libc::EMLINK, "too many links"));
            }
        }
        let dtype = dtype_of(m.file_type);
        dir.map.update(name, |old| {
            if let Some(refused) = refuse_new_name(dir, name, old) {
                return refused;
            }
            let op = self.inflight.begin();
            let stamp = self.clock.stamp_of(op.timestamp());
            m.note_pending(parent, 1);
            dir.log.push(LoggedOp::new(Record::Link {
                stamp,
                dir: parent,
                name: name.to_vec(),
                ino,
                file_type: dtype,
            }));
            m.add_nlink(1);
            drop(op);
            (Some((ino, dtype)), Ok(()))
        })?;
        let t = now();
        m.touch_ctime(t);
        d.touch(t);
        self.note_name_dir(m, parent);
        self.count_op();
        self.mark_dirty(d);
        self.mark_dirty(m);
        Ok(())
    }

    /// Remembers the directory of `m`'s latest name: for a directory its parent, which ".."
    /// and the loop check use.
    fn note_name_dir(&self, m: &MNode, dir: u32) {
        m.parent.store(dir, Ordering::Release);
    }

    /// Removes a non-directory name.
    pub fn unlink(&self, parent: u32, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, false)
    }

    pub fn rmdir(&self, parent: u32, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, true)
    }

    fn remove_name(&self, parent: u32, name: &[u8], want_dir: bool) -> Result<()> {
        self.check_writable()?;
        self.admit_freeing(2)?;
        if want_dir && name == b"." {
            return Err(Error::errno(libc::EINVAL, "rmdir of ."));
        }
        if want_dir && name == b".." {
            return Err(Error::errno(libc::ENOTEMPTY, "rmdir of .."));
        }
        check_name(name)?;
        let _g = self.pass.shared();
        self.with_dir(parent, |d| self.remove_in(d, name, want_dir))
    }

    /// [`Engine::remove_name`] in directory `d`, pinned, with the name checked.
    fn remove_in(&self, d: &MNode, name: &[u8], want_dir: bool) -> Result<()> {
        let parent = d.ino;
        let dir = d.dir().expect("dir");
        let e = dir.map.lookup(name).ok_or_else(|| enoent(String::from_utf8_lossy(name)))?;
        let child = self.mnode(e.ino)?;
        refuse(d.iflags(), InodeFlags::PRIVILEGED, "remove an entry")?;
        refuse(child.iflags(), InodeFlags::PRIVILEGED, "remove")?;
        if child.is_dir() != want_dir {
            return Err(if want_dir {
                Error::errno(libc::ENOTDIR, String::from_utf8_lossy(name))
            } else {
                Error::errno(libc::EISDIR, String::from_utf8_lossy(name))
            });
        }
        if want_dir {
            let cd = child.dir().expect("dir");
            // Mark dead first so no create slips in after the emptiness check; undo if not empty.
            cd.dead.store(true, Ordering::Release);
            if !cd.map.is_empty() {
                cd.dead.store(false, Ordering::Release);
                return Err(Error::errno(libc::ENOTEMPTY, String::from_utf8_lossy(name)));
            }
        }
        let ino = e.ino;
        let r = dir.map.update(name, |cur| match cur {
            Some(c) if c.ino == ino => {
                let op = self.inflight.begin();
                let stamp = self.clock.stamp_of(op.timestamp());
                child.note_pending(parent, 1);
                dir.log.push(LoggedOp::new(Record::Unlink { stamp, dir: parent, name: name.to_vec(), ino }));
                drop(op);
                (None, Ok(()))
            }
            other => (
                other.map(|c| (c.ino, c.file_type)),
                Err(Error::errno(libc::ENOENT, "name changed meanwhile")),
            ),
        });
        if let Err(e) = r {
            if want_dir {
                child.dir().expect("dir").dead.store(false, Ordering::Release);
            }
            return Err(e);
        }
        let t = now();
        self.drop_link(&child, want_dir, t);
        if want_dir {
            d.add_nlink(-1);
        }
        d.touch(t);
        self.count_op();
        self.mark_dirty(d);
        Ok(())
    }

    /// One name of `child` is gone.
    fn drop_link(&self, child: &MNode, is_dir: bool, t: Timespec) {
        let nlink = {
            let mut meta = child.meta.lock();
            meta.nlink = if is_dir { 0 } else { meta.nlink.saturating_sub(1) };
            meta.nlink
        };
        child.touch_ctime(t);
        let open = nlink == 0 && child.open.load(Ordering::Acquire) > 0;
        if nlink == 0 {
            self.count_deleted();
            if open {
                self.orphans.lock().insert(child.ino);
            }
        }
        self.mark_dirty(child);
        if nlink == 0 && !open {
            self.bury(child);
        }
    }

    /// rename(2) with RENAME_NOREPLACE, RENAME_EXCHANGE or RENAME_WHITEOUT (which may come with
    /// RENAME_NOREPLACE). A whiteout is owned by `owner` (uid, gid); the rename and its whiteout
    /// are one logged operation, so they are durable together or not at all.
    ///
    /// In steps: the arguments here; both directories pinned (`Engine::with_dir`: no
    /// reference count of a directory is written); the names looked up and checked
    /// (`rename_pinned`); the two names changed together (`rename_commit`); links, parents
    /// and times settled (`rename_settle`).
    pub fn rename(
        &self,
        sp: u32,
        sname: &[u8],
        dp: u32,
        dname: &[u8],
        flags: u32,
        owner: (u32, u32),
    ) -> Result<()> {
        self.check_writable()?;
        let whiteout = flags & RENAME_WHITEOUT != 0;
        if whiteout {
            // A new inode, as a create: ENOSPC when the file system has no room for one.
            self.admit(8)?;
        } else {
            self.admit_freeing(6)?;
        }
        check_name(sname)?;
        check_name(dname)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0
            || (flags & RENAME_EXCHANGE != 0 && flags & (RENAME_NOREPLACE | RENAME_WHITEOUT) != 0)
        {
            return Err(Error::errno(libc::EINVAL, "rename flags"));
        }
        let _g = self.pass.shared();
        self.with_dir(sp, |sd| {
            self.with_dir(dp, |dd| self.rename_pinned(&RenameArgs { sd, sname, dd, dname, flags, owner }))
        })
    }

    /// [`Engine::rename`] with both directories pinned: looks both names up and checks the
    /// rename as ext4 does (may_delete and may_create, loops, a directory replaced only when
    /// empty), then commits it. A directory about to be replaced is marked dead (no create
    /// slips in after its emptiness check) and unmarked if the rename fails after all.
    fn rename_pinned(&self, a: &RenameArgs) -> Result<()> {
        let (sp, dp, flags) = (a.sd.ino, a.dd.ino, a.flags);
        let se =
            a.sd.dir()
                .expect("dir")
                .map
                .lookup(a.sname)
                .ok_or_else(|| enoent(String::from_utf8_lossy(a.sname)))?;
        let src = self.mnode(se.ino)?;
        // Both names are removed from their directory (an exchange) or one is removed and one
        // added: ext4's may_delete and may_create.
        refuse(a.sd.iflags(), InodeFlags::PRIVILEGED, "rename out of a directory")?;
        refuse(src.iflags(), InodeFlags::PRIVILEGED, "rename")?;
        refuse(a.dd.iflags(), InodeFlags::IMMUTABLE, "rename into a directory")?;
        // Moving a directory to another directory can create a loop: one at a time, globally
        // (the only global lock ScaleFS and Max allow on this path).
        let _rl = (src.is_dir() && sp != dp || flags & RENAME_EXCHANGE != 0).then(|| self.rename_lock.lock());
        let de = a.dd.dir().expect("dir").map.lookup(a.dname);
        if flags & RENAME_NOREPLACE != 0 && de.is_some() {
            return Err(Error::errno(libc::EEXIST, String::from_utf8_lossy(a.dname)));
        }
        if flags & RENAME_EXCHANGE != 0 && de.is_none() {
            return Err(enoent(String::from_utf8_lossy(a.dname)));
        }
        if src.is_dir() && sp != dp && self.is_ancestor(src.ino, dp)? {
            return Err(Error::errno(libc::EINVAL, "cannot move a directory into itself"));
        }
        if de.is_some_and(|de| de.ino == src.ino) {
            // The same inode under both names (or one name twice): POSIX says do nothing.
            return Ok(());
        }
        let dst = de.map(|e| self.mnode(e.ino)).transpose()?;
        if let Some(dst) = &dst {
            refuse(a.dd.iflags(), InodeFlags::APPEND, "replace an entry")?;
            refuse(dst.iflags(), InodeFlags::PRIVILEGED, "replace")?;
        }
        if let (Some(dst), true) = (&dst, flags & RENAME_EXCHANGE == 0) {
            match (src.is_dir(), dst.is_dir()) {
                (true, false) => return Err(Error::errno(libc::ENOTDIR, String::from_utf8_lossy(a.dname))),
                (false, true) => return Err(Error::errno(libc::EISDIR, String::from_utf8_lossy(a.dname))),
                (true, true) => {
                    let dm = dst.dir().expect("dir");
                    dm.dead.store(true, Ordering::Release);
                    if !dm.map.is_empty() {
                        dm.dead.store(false, Ordering::Release);
                        return Err(Error::errno(libc::ENOTEMPTY, String::from_utf8_lossy(a.dname)));
                    }
                }
                _ => {}
            }
        }
        if flags & RENAME_EXCHANGE != 0 {
            if let Some(dst) = &dst {
                if dst.is_dir() && sp != dp && self.is_ancestor(dst.ino, sp)? {
                    return Err(Error::errno(libc::EINVAL, "cannot move a directory into itself"));
                }
            }
        }
        let wh = self.rename_commit(a, &src, dst.as_deref());
        let wh = match wh {
            Ok(wh) => wh,
            Err(e) => {
                // The directory it would replace is not being removed after all.
                if let Some(dm) = dst.as_ref().and_then(|d| d.dir()) {
                    dm.dead.store(false, Ordering::Release);
                }
                return Err(e);
            }
        };
        self.rename_settle(a, &src, dst.as_deref(), wh.as_deref());
        Ok(())
    }

    /// Changes both names of a checked rename at once, under both names' shard locks (taken in
    /// the global order), with its record logged at that linearization point; makes the
    /// whiteout first when one is asked for, and returns it. On an error nothing changed (a
    /// whiteout made for it is gone again).
    fn rename_commit(&self, a: &RenameArgs, src: &MNode, dst: Option<&MNode>) -> Result<Option<Arc<MNode>>> {
        let (sp, dp) = (a.sd.ino, a.dd.ino);
        let exchange = a.flags & RENAME_EXCHANGE != 0;
        let replaced = dst.map(|d| d.ino).unwrap_or(0);
        // The whiteout's inode exists (in the inode table, not yet named) before the names
        // change, as a create's does, so that a lookup that finds its name finds it.
        let wh = (a.flags & RENAME_WHITEOUT != 0).then(|| self.new_whiteout(sp, a.owner)).transpose()?;
        let wh_rec =
            wh.as_ref().map(|w| crate::journal::Whiteout { ino: w.ino, attr: w.attr_record(&w.meta.lock()) });
        let sdir = a.sd.dir().expect("dir");
        let ddir = a.dd.dir().expect("dir");
        let result = crate::mem::dir::update_two(
            (sp, &sdir.map, a.sname),
            (dp, &ddir.map, a.dname),
            |s_cur, d_cur| {
                if s_cur.map(|e| e.ino) != Some(src.ino) || d_cur.map(|e| e.ino).unwrap_or(0) != replaced {
                    return Err(Error::errno(libc::EAGAIN, "names changed meanwhile; retry"));
                }
                if ddir.dead.load(Ordering::Acquire) && replaced == 0 {
                    return Err(enoent("directory was removed"));
                }
                let op = self.inflight.begin();
                let stamp = self.clock.stamp_of(op.timestamp());
                let rec = Record::Rename {
                    stamp,
                    src_dir: sp,
                    src_name: a.sname.to_vec(),
                    dst_dir: dp,
                    dst_name: a.dname.to_vec(),
                    ino: src.ino,
                    replaced,
                    exchange,
                    whiteout: wh_rec,
                };
                for (x, d) in crate::oplog::dirlog::names(&rec) {
                    if x == src.ino {
                        src.note_pending(d, 1);
                    } else if let Some(w) = wh.as_ref().filter(|w| w.ino == x) {
                        w.note_pending(d, 1);
                    } else if let Some(t) = dst {
                        t.note_pending(d, 1);
                    }
                }
                let logged = LoggedOp::new(rec);
                sdir.log.push(logged.clone());
                if sp != dp {
                    ddir.log.push(logged);
                }
                drop(op);
                let s_new = match &wh {
                    Some(w) => Some((w.ino, dtype_of(w.file_type))),
                    None if exchange => d_cur.map(|e| (e.ino, e.file_type)),
                    None => None,
                };
                let d_new = Some((src.ino, s_cur.expect("checked").file_type));
                Ok((s_new, d_new))
            },
        );
        if let Err(e) = result {
            if let Some(w) = &wh {
                self.cells.remove(w.ino as u64);
                let _ = self.nat.free_nid(w.ino);
            }
            return Err(e);
        }
        Ok(wh)
    }

    /// After a committed rename: link counts and parents of moved directories, the replaced
    /// inode's lost name, times, and the dirty set.
    fn rename_settle(&self, a: &RenameArgs, src: &MNode, dst: Option<&MNode>, wh: Option<&MNode>) {
        let (sd, dd, sp, dp) = (a.sd, a.dd, a.sd.ino, a.dd.ino);
        let exchange = a.flags & RENAME_EXCHANGE != 0;
        let t = now();
        if src.is_dir() && sp != dp {
            src.parent.store(dp, Ordering::Release);
            if !exchange || !dst.is_some_and(|d| d.is_dir()) {
                sd.add_nlink(-1);
                dd.add_nlink(1);
            }
        }
        if exchange {
            let dst = dst.expect("exchange has a target");
            if dst.is_dir() && sp != dp {
                dst.parent.store(sp, Ordering::Release);
                if !src.is_dir() {
                    dd.add_nlink(-1);
                    sd.add_nlink(1);
                }
            }
            dst.touch_ctime(t);
            self.note_name_dir(dst, sp);
            self.mark_dirty(dst);
        } else if let Some(dst) = dst {
            if dst.is_dir() {
                dd.add_nlink(-1);
            }
            self.drop_link(dst, dst.is_dir(), t);
        }
        src.touch_ctime(t);
        self.note_name_dir(src, dp);
        sd.touch(t);
        dd.touch(t);
        self.count_op();
        self.mark_dirty(src);
        self.mark_dirty(sd);
        self.mark_dirty(dd);
        if let Some(w) = wh {
            self.mark_dirty(w);
        }
    }

    /// A whiteout inode for a rename out of directory `dir`, in the inode table but not yet
    /// named: a character device 0:0 with no permission bits (as ext4 makes one).
    fn new_whiteout(&self, dir: u32, (uid, gid): (u32, u32)) -> Result<Arc<MNode>> {
        let (_, cpu) = self.lane();
        let ino = self.nat.alloc_nid(cpu).map_err(|_| Error::errno(libc::ENOSPC, "no free inode numbers"))?;
        let t = now();
        let meta = Meta {
            mode: crate::journal::WHITEOUT_TYPE,
            uid,
            gid,
            nlink: 1,
            crtime: t,
            rdev: 0,
            generation: self.generations.take(),
            xattrs: Default::default(),
            symlink: Vec::new(),
        };
        let m = MNode::new(ino, meta, 0, Stamps::at(t), &self.cache);
        m.parent.store(dir, Ordering::Relaxed);
        let (m, fresh) = self.cells.insert_if_absent(ino as u64, || m);
        debug_assert!(fresh, "a newly allocated inode number has no mnode");
        Ok(m)
    }

    /// Whether directory `anc` is `dir` or one of its ancestors.
    fn is_ancestor(&self, anc: u32, mut dir: u32) -> Result<bool> {
        // Bounded by the number of directories: a walk longer than that is a loop (corruption).
        for _ in 0..=self.g.max_nid {
            if dir == anc {
                return Ok(true);
            }
            if dir == crate::format::ROOT_INO {
                return Ok(false);
            }
            dir = self.dir_mnode(dir)?.parent.load(Ordering::Acquire);
        }
        Err(Error::corrupt(crate::error::Structure::Dentry, None, "directory parents form a loop"))
    }

    pub fn open_file(&self, ino: u32) -> Result<Arc<MNode>> {
        let _g = self.pass.shared();
        let m = self.mnode(ino)?;
        m.open.fetch_add(1, Ordering::AcqRel);
        Ok(m)
    }

    /// open(2) of an existing inode with open(2) `flags` (the access mode, O_APPEND, O_TRUNC):
    /// refuses, with EPERM, a write open of an immutable inode and one of an append-only inode
    /// without O_APPEND or with O_TRUNC (ext4's `may_open`); else as [`Engine::open_file`].
    pub fn open_checked(&self, ino: u32, flags: i32) -> Result<Arc<MNode>> {
        let m = {
            let _g = self.pass.shared();
            self.mnode(ino)?
        };
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if writes {
            let f = m.iflags();
            refuse(f, InodeFlags::IMMUTABLE, "open for writing")?;
            if f & InodeFlags::APPEND.0 != 0 && (flags & libc::O_APPEND == 0 || flags & libc::O_TRUNC != 0) {
                return Err(Error::errno(libc::EPERM, "open: inode is append-only; open it with O_APPEND"));
            }
        }
        self.open_file(ino)
    }

    /// The inode's flags (FS_IOC_GETFLAGS).
    pub fn get_flags(&self, ino: u32) -> Result<InodeFlags> {
        let _g = self.pass.shared();
        Ok(InodeFlags(self.mnode(ino)?.iflags()))
    }

    /// Sets the inode's flags (FS_IOC_SETFLAGS), checked as ext4 checks them (see
    /// `mem::iflags`); `privileged`: the caller holds CAP_LINUX_IMMUTABLE. A change of the
    /// flags is an attribute change (ctime).
    pub fn set_flags(&self, ino: u32, flags: InodeFlags, privileged: bool) -> Result<Arc<MNode>> {
        self.check_writable()?;
        if flags.bits() & !InodeFlags::SUPPORTED.bits() != 0 {
            return Err(Error::errno(
                libc::EOPNOTSUPP,
                format!("inode flags {:#x} not supported", flags.bits() & !InodeFlags::SUPPORTED.bits()),
            ));
        }
        let _g = self.pass.shared();
        let m = self.mnode(ino)?;
        let new = flags.for_type(m.file_type);
        // Every write, truncate and fallocate checks the flags under the range lock: with all of
        // it held, none is under way, and each that follows sees the new flags.
        {
            let _r = m.pages().map(|(_, r)| r.lock_exclusive(0, u64::MAX));
            // Serialises changes of the flags, so each one checks the flags it replaces.
            let _meta = m.meta.lock();
            super::iflags::check_change(InodeFlags(m.iflags()), new, privileged)?;
            m.flags.store(new.bits(), Ordering::Release);
        }
        m.touch_ctime(now());
        self.mark_dirty(&m);
        Ok(m)
    }

    pub fn release(&self, ino: u32) -> Result<()> {
        let _g = self.pass.shared();
        let m = self.mnode(ino)?;
        let prev = m.open.fetch_sub(1, Ordering::AcqRel);
        if prev == 0 {
            m.open.store(0, Ordering::Release);
            return Err(Error::errno(libc::EBADF, "release without open"));
        }
        if prev == 1 && m.meta.lock().nlink == 0 {
            self.orphans.lock().remove(&m.ino);
            self.mark_dirty(&m);
            self.bury(&m);
        }
        Ok(())
    }

    /// Reads up to `buf.len()` bytes at `off`; returns how many (0 at or past the end).
    pub fn read_at(&self, ino: u32, off: u64, buf: &mut [u8]) -> Result<usize> {
        let m = {
            let _g = self.pass.shared();
            self.mnode(ino)?
        };
        self.read_mnode(&m, off, buf)
    }

    /// Reads from an mnode the caller holds (an open handle: no inode-table lookup). A read
    /// of at least one byte asked for is an access (`mem::atime`), also at the end of the file.
    pub fn read_mnode(&self, m: &MNode, off: u64, buf: &mut [u8]) -> Result<usize> {
        let _g = self.pass.shared();
        let n = self.read_range(m, off, buf)?;
        if !buf.is_empty() {
            self.touch_atime(m);
        }
        Ok(n)
    }

    /// The read itself, under the range lock (the caller holds the semaphore).
    fn read_range(&self, m: &MNode, off: u64, buf: &mut [u8]) -> Result<usize> {
        let (pages, range) = m.pages().ok_or_else(|| {
            Error::errno(if m.is_dir() { libc::EISDIR } else { libc::EINVAL }, "not a regular file")
        })?;
        if buf.is_empty() {
            return Ok(0);
        }
        let end = off.saturating_add(buf.len() as u64);
        // Within one page: page-level, sharing no line with readers and writers of other pages
        // (`mem::page_lock`); a page-level hold is a shared hold of the whole page.
        let _r = range.lock_fast(off, end, LockMode::Shared);
        let size = m.size.load(Ordering::Acquire);
        if off >= size {
            return Ok(0);
        }
        let end = end.min(size);
        // Every page cached (the common case for a hot file): a cached page holds the current
        // bytes (writes go to it, and only clean pages are evicted), so the read needs neither
        // the mapping nor the inode's lock, which every reader of the file would share.
        if let Some(n) = read_cached(pages, off, end, buf) {
            return Ok(n);
        }
        let first = off / PAGE_SIZE as u64;
        let last = (end - 1) / PAGE_SIZE as u64;
        // Pages not cached: find their blocks, then read them all in one batch, outside the
        // inode's lock. An fsync, checkpoint or cleaning move may replace a block meanwhile, and
        // a replaced block may be freed and reused: the batch counts only if the mapping did
        // not change under it (else again; the last try reads under the lock).
        let mut missing: Vec<(u64, u32)> = Vec::new();
        let mut cached: Vec<Option<crate::mem::pages::PageBuf>> = Vec::new();
        let mut fetched = Vec::new();
        for attempt in 0..4 {
            missing.clear();
            cached.clear();
            let disk = m.disk.lock();
            for idx in first..=last {
                let p = pages.get(idx);
                if p.is_none() {
                    if let Some(&a) = disk.cur_map.get(&idx) {
                        if a != NEW_ADDR {
                            missing.push((idx, a));
                        }
                    }
                }
                cached.push(p);
            }
            let addrs: Vec<u64> = missing.iter().map(|x| x.1 as u64).collect();
            if attempt == 3 {
                fetched = crate::checkpoint::read_blocks(&*self.dev, &addrs)?;
                break;
            }
            let gen = disk.map_gen;
            drop(disk);
            fetched = crate::checkpoint::read_blocks(&*self.dev, &addrs)?;
            if missing.is_empty() || m.disk.lock().map_gen == gen {
                break;
            }
        }
        let keep = (self.cache.cached_pages.load(Ordering::Relaxed).max(0) as u64) * (PAGE_SIZE as u64)
            < self.opts.cache_bytes;
        for (k, (idx, _)) in missing.iter().enumerate() {
            let data: [u8; PAGE_SIZE] = fetched[k * PAGE_SIZE..(k + 1) * PAGE_SIZE].try_into().expect("page");
            let slot = (idx - first) as usize;
            cached[slot] = Some(if keep { pages.insert_clean(*idx, data) } else { Arc::new(data) });
        }
        let done = copy_pages(off, end, buf, |idx| Some(cached[(idx - first) as usize].clone()));
        Ok(done.expect("every page is cached or a hole"))
    }

    /// Writes `data` at `off`; returns the bytes written.
    pub fn write_at(&self, ino: u32, off: u64, data: &[u8]) -> Result<usize> {
        let m = {
            let _g = self.pass.shared();
            self.mnode(ino)?
        };
        self.write_mnode(&m, off, data)
    }

    /// Writes to an mnode the caller holds (an open handle: no inode-table lookup).
    pub fn write_mnode(&self, m: &Arc<MNode>, off: u64, data: &[u8]) -> Result<usize> {
        self.write_mnode_with(m, off, data, WriteTimes::Now)
    }

    /// [`Engine::write_mnode`], stamping mtime and ctime or not (`times`).
    pub fn write_mnode_with(
        &self,
        m: &Arc<MNode>,
        off: u64,
        whole: &[u8],
        times: WriteTimes,
    ) -> Result<usize> {
        self.check_writable()?;
        let (off, data) = match times {
            WriteTimes::Keep => self.cached_append(m, off, whole)?,
            WriteTimes::Now => (off, whole),
        };
        let short = data.len().div_ceil(PAGE_SIZE) as u64 + 1;
        self.admit_with(short, || self.new_blocks(m, off, data.len() as u64))?;
        {
            let _g = self.pass.shared();
            self.write_locked(m, off, data, times)?;
        }
        // Outside the semaphore: writeback takes the gate, which a checkpoint holding the gate
        // and waiting for the semaphore to drain must not find us holding.
        self.after_write(m)?;
        if m.iflags() & InodeFlags::SYNC.0 != 0 {
            // The SYNC flag: the write is durable when it returns (O_DSYNC for every write).
            self.fsync_mnode(m, true)?;
        }
        Ok(whole.len())
    }

    /// What a cached write to an append-only file appends. A cache writes back whole pages,
    /// the bytes already in the file included: those must be what the file holds (append-only
    /// forbids changing them) and are left out; the rest is the append. Any other file: all of
    /// it, as given.
    fn cached_append<'a>(&self, m: &MNode, off: u64, data: &'a [u8]) -> Result<(u64, &'a [u8])> {
        let size = m.size.load(Ordering::Acquire);
        if m.iflags() & InodeFlags::APPEND.0 == 0 || off >= size {
            return Ok((off, data));
        }
        let n = data.len().min(usize::try_from(size - off).unwrap_or(usize::MAX));
        let mut held = vec![0u8; n];
        let got = {
            let _g = self.pass.shared();
            self.read_range(m, off, &mut held)?
        };
        if got != n || held[..] != data[..n] {
            return Err(Error::errno(libc::EPERM, "write: inode is append-only, and this changes its bytes"));
        }
        Ok((off + n as u64, &data[n..]))
    }

    fn write_locked(&self, m: &MNode, off: u64, data: &[u8], times: WriteTimes) -> Result<()> {
        let (pages, range) = m.pages().ok_or_else(|| {
            Error::errno(if m.is_dir() { libc::EISDIR } else { libc::EINVAL }, "not a regular file")
        })?;
        if data.is_empty() {
            return Ok(());
        }
        let end = off
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::errno(libc::EFBIG, "write past the largest file size"))?;
        // Within one page: page-level (`mem::page_lock`), an exclusive hold of the whole page,
        // which excludes what the range lock would: other holders of the page, and truncates,
        // fallocates, punches and flag changes over it. Extending the file needs nothing more:
        // the size grows by an atomic max, and what reads or truncates past the old size
        // overlaps this page.
        let _r = range.lock_fast(off, end, LockMode::Exclusive);
        // Under the range lock: a flag change waits for this write (`Engine::set_flags`).
        let flags = m.iflags();
        refuse(flags, InodeFlags::IMMUTABLE, "write")?;
        if flags & InodeFlags::APPEND.0 != 0 && off != m.size.load(Ordering::Acquire) {
            return Err(Error::errno(libc::EPERM, "write: inode is append-only, and this is not at its end"));
        }
        for (idx, po, n, at) in page_spans(off, end) {
            self.write_page(m, pages, idx, po, &data[at..at + n])?;
        }
        if end > m.size.load(Ordering::Acquire) {
            m.size.fetch_max(end, Ordering::AcqRel);
        }
        if times == WriteTimes::Now {
            m.touch(now());
        }
        self.io.user.add(data.len() as u64);
        self.mark_dirty(m);
        Ok(())
    }

    /// Blocks a write of `len` bytes at `off` takes for good (admission when space is short):
    /// one per page that has neither a block nor a cached page (overwrites and writes into
    /// reserved blocks take none), and one for the node that maps them.
    fn new_blocks(&self, m: &MNode, off: u64, len: u64) -> u64 {
        let Some((pages, _)) = m.pages() else { return 0 };
        if len == 0 {
            return 0;
        }
        let first = off / PAGE_SIZE as u64;
        let last = (off.saturating_add(len) - 1) / PAGE_SIZE as u64;
        let disk = m.disk.lock();
        let new = (first..=last).filter(|&i| !disk.cur_map.contains_key(&i) && !pages.is_cached(i)).count();
        new as u64 + u64::from(new > 0)
    }

    /// Writes `bytes` at `po` within page `idx` of `m`.
    ///
    /// A partial write of a page that is not cached needs the page's current contents. They
    /// are read with no lock held, then installed under the inode's `disk` lock only if the
    /// mapping did not change meanwhile: a replaced block may have been freed and reused, or
    /// the page may have been written, written back and evicted since (which replaces its
    /// block). Lock order is `disk`, then the page shard (`sync::rank`); the reverse, a shard
    /// held while the loader takes `disk`, deadlocked against readers and writeback (issue 14).
    ///
    /// A page of a preallocated block starts only under `disk`, in the same critical section
    /// that takes the block's reservation (`DiskState::draw`): the reservation passes to the
    /// dirty page, and never both or neither hold the space.
    fn write_page(&self, m: &MNode, pages: &PageMap, idx: u64, po: usize, bytes: &[u8]) -> Result<()> {
        let written = if m.preallocated.load(Ordering::Acquire) {
            pages.write_cached(idx, po, bytes)
        } else {
            pages.write(idx, po, bytes, None)
        };
        if written {
            return Ok(());
        }
        // Bounded: each miss means a fsync, writeback, checkpoint or cleaning move replaced
        // this page's block during our read (or a fallocate reserved it).
        for _ in 0..LOAD_TRIES {
            let (addr, gen) = {
                let mut disk = m.disk.lock();
                if self.write_reserved(m, &mut disk, pages, idx, po, bytes) {
                    return Ok(());
                }
                (disk.cur_map.get(&idx).copied(), disk.map_gen)
            };
            let base = self.read_mapped(addr)?;
            let disk = m.disk.lock();
            if disk.map_gen == gen {
                let done = pages.write(idx, po, bytes, Some(&base));
                debug_assert!(done, "a page with a base is always written");
                return Ok(());
            }
        }
        // The mapping moved under every try: read under the lock, once. A device read waits
        // for no lock, so this holds up the inode's other users for one read, never a cycle.
        let mut disk = m.disk.lock();
        if self.write_reserved(m, &mut disk, pages, idx, po, bytes) {
            return Ok(());
        }
        let base = self.read_mapped(disk.cur_map.get(&idx).copied())?;
        let done = pages.write(idx, po, bytes, Some(&base));
        debug_assert!(done, "a page with a base is always written");
        Ok(())
    }

    /// Under `disk`: writes a page whose block is reserved (its bytes are zeros), drawing on the
    /// reservation. False, writing nothing, if the block is not reserved.
    fn write_reserved(
        &self,
        m: &MNode,
        disk: &mut DiskState,
        pages: &PageMap,
        idx: u64,
        po: usize,
        bytes: &[u8],
    ) -> bool {
        if disk.reserved.is_empty() {
            m.note_reserved(disk);
            return false;
        }
        if !disk.draw(idx) {
            return false;
        }
        m.note_reserved(disk);
        let done = pages.write(idx, po, bytes, Some(&[0u8; PAGE_SIZE]));
        debug_assert!(done, "a page with a base is always written");
        true
    }

    /// Zeroes `n` bytes at `po` in page `idx` (a partial page of a truncate, punch or zero
    /// range). A page that reads as zeros already (a hole or an unwritten block, not cached) is
    /// left alone; with `allocate` (zero range) a hole becomes a preallocated block.
    fn zero_in_page(
        &self,
        m: &MNode,
        pages: &PageMap,
        idx: u64,
        po: usize,
        n: usize,
        allocate: bool,
    ) -> Result<()> {
        {
            let mut disk = m.disk.lock();
            if !pages.is_cached(idx) {
                match disk.cur_map.get(&idx) {
                    None => {
                        if allocate {
                            disk.preallocate(idx);
                            m.note_reserved(&disk);
                        }
                        return Ok(());
                    }
                    // Not cached, so not drawn on: reserved, zeros.
                    Some(&NEW_ADDR) => return Ok(()),
                    Some(_) => {}
                }
            }
        }
        self.write_page(m, pages, idx, po, &[0u8; PAGE_SIZE][..n])
    }

    /// The block at `addr` (zeros for a hole or a block not yet written).
    fn read_mapped(&self, addr: Option<u32>) -> Result<[u8; PAGE_SIZE]> {
        let mut b = [0u8; PAGE_SIZE];
        if let Some(a) = addr.filter(|&a| a != NEW_ADDR) {
            self.dev.read_block(a as u64, &mut b)?;
        }
        Ok(b)
    }

    /// Sets the size, dropping or zeroing what lies past it.
    pub fn truncate(&self, ino: u32, size: u64) -> Result<()> {
        self.check_writable()?;
        self.admit_freeing(1)?;
        let g = self.pass.shared();
        let m = self.mnode(ino)?;
        let dropped = self.truncate_locked(&m, size)?;
        drop(g);
        drop(dropped);
        Ok(())
    }

    /// Truncates `m` to `size` under the caller's pass-through semaphore. Returns the pages and
    /// mappings it dropped, for the caller to free after the semaphore: a checkpoint's
    /// exclusive phase waits for every holder, and freeing a large file's pages took
    /// milliseconds (DWSL's truncate of 64 MiB).
    fn truncate_locked(&self, m: &MNode, size: u64) -> Result<Truncated> {
        let (pages, range) = m.pages().ok_or_else(|| {
            Error::errno(if m.is_dir() { libc::EISDIR } else { libc::EINVAL }, "not a regular file")
        })?;
        if size > MAX_FILE_SIZE {
            return Err(Error::errno(libc::EFBIG, "size past the largest file"));
        }
        let old = m.size.load(Ordering::Acquire);
        let _r = range.lock_exclusive(old.min(size), u64::MAX);
        refuse(m.iflags(), InodeFlags::PRIVILEGED, "truncate")?;
        let mut dropped = Truncated::default();
        let old = m.size.load(Ordering::Acquire);
        if size <= old {
            let keep_pages = size.div_ceil(PAGE_SIZE as u64);
            let tail = (size % PAGE_SIZE as u64) as usize;
            if tail != 0 && size < old {
                // The partial page's tail reads as zeros from now on (loaded if not cached).
                let idx = size / PAGE_SIZE as u64;
                self.zero_in_page(m, pages, idx, tail, PAGE_SIZE - tail, false)?;
            }
            // Pages and their blocks go together, under the mapping's lock (as a punch does).
            // A checkpoint installing this inode in between found a page gone whose block the
            // mapping still named: it left the block out of its new tree and freed it, and the
            // mapping's drop then made it garbage, freed again by the next fsync ("block N
            // invalidated twice", found by tests/stress.rs). A truncate to the size itself
            // drops blocks preallocated past it (KEEP_SIZE), as ext4 does.
            let mut disk = m.disk.lock();
            if size < old || disk.cur_map.range(keep_pages..).next().is_some() {
                dropped.pages = pages.truncate(keep_pages);
                dropped.map = disk.truncate(keep_pages);
                m.note_reserved(&disk);
            }
        }
        m.size.store(size, Ordering::Release);
        m.touch(now());
        self.mark_dirty(m);
        Ok(dropped)
    }

    /// fallocate(2): mode 0 (allocate, the size may grow), KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE,
    /// and ZERO_RANGE with or without KEEP_SIZE. Other modes (COLLAPSE_RANGE, INSERT_RANGE,
    /// UNSHARE_RANGE, ...) are EOPNOTSUPP.
    ///
    /// Allocation reserves every block of the range that has neither a block nor a page
    /// (`mem::reserve`): ENOSPC, with nothing changed, when they do not fit in the space left.
    /// Zero range makes every whole block of the range unwritten and reserved (dropping what it
    /// held, cached pages included) and zeroes the bytes of the partial ones.
    pub fn fallocate(&self, ino: u32, mode: i32, off: u64, len: u64) -> Result<()> {
        self.check_writable()?;
        let punch = mode & FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & FALLOC_FL_ZERO_RANGE != 0;
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        // As vfs_fallocate: an unknown mode, two modes at once, or a punch that would change
        // the size.
        if mode & !(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0
            || (punch && zero)
            || (punch && !keep)
        {
            return Err(Error::errno(libc::EOPNOTSUPP, format!("fallocate mode {mode:#x}")));
        }
        if len == 0 {
            return Err(Error::errno(libc::EINVAL, "fallocate of zero bytes"));
        }
        let end = off
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| Error::errno(libc::EFBIG, "fallocate past the largest file"))?;
        let m = {
            let _g = self.pass.shared();
            self.mnode(ino)?
        };
        if m.pages().is_none() {
            return Err(Error::errno(
                if m.is_dir() { libc::EISDIR } else { libc::ENODEV },
                "not a regular file",
            ));
        }
        if punch {
            let _g = self.pass.shared();
            self.punch_locked(&m, off, end)?;
        } else {
            let first = off / PAGE_SIZE as u64;
            let last = (end - 1) / PAGE_SIZE as u64;
            // Claimed before anything changes, so that ENOSPC leaves the file as it was. An
            // upper bound: every block of the range without a mapping (a cached page of it
            // will need no reservation).
            let want = {
                let disk = m.disk.lock();
                (last - first + 1) - disk.cur_map.range(first..=last).count() as u64
            };
            let nodes = if want == 0 { 0 } else { want.div_ceil(ADDRS_PER_NODE as u64) + 1 };
            let _claim = if want > 0 { Some(self.claim(want + nodes, nodes)?) } else { None };
            let _g = self.pass.shared();
            if zero {
                self.zero_range_locked(&m, off, end)?;
            } else {
                self.allocate_locked(&m, first, last)?;
            }
            if !keep {
                m.size.fetch_max(end, Ordering::AcqRel);
            }
        }
        m.touch(now());
        self.mark_dirty(&m);
        Ok(())
    }

    /// Reserves every block of `first..=last` that has neither a mapping nor a page.
    fn allocate_locked(&self, m: &MNode, first: u64, last: u64) -> Result<()> {
        let (pages, range) = m.pages().expect("a regular file");
        let _r = range.lock_exclusive(first * PAGE_SIZE as u64, (last + 1) * PAGE_SIZE as u64);
        // ext4: nothing on an immutable file (checked under the range lock, which a flag
        // change takes whole).
        refuse(m.iflags(), InodeFlags::IMMUTABLE, "fallocate")?;
        let mut disk = m.disk.lock();
        for idx in first..=last {
            if !disk.cur_map.contains_key(&idx) && !pages.is_cached(idx) {
                disk.preallocate(idx);
            }
        }
        m.note_reserved(&disk);
        Ok(())
    }

    /// Punches `[off, end)` (bytes past the size are left alone): whole blocks become holes,
    /// the bytes of partial ones zeros.
    fn punch_locked(&self, m: &MNode, off: u64, end: u64) -> Result<()> {
        let (pages, range) = m.pages().expect("a regular file");
        let _r = range.lock_exclusive(off, end);
        // vfs_fallocate: only allocation that keeps every byte on an append-only file.
        refuse(m.iflags(), InodeFlags::PRIVILEGED, "fallocate")?;
        let size = m.size.load(Ordering::Acquire);
        let end = end.min(size);
        if off >= end {
            return Ok(());
        }
        // Partial pages at the edges: zero the bytes.
        for (idx, po, n, _) in page_spans(off, end) {
            if po != 0 || n != PAGE_SIZE {
                self.zero_in_page(m, pages, idx, po, n, false)?;
            }
        }
        // Whole pages: drop them and their blocks.
        let first_full = off.div_ceil(PAGE_SIZE as u64);
        let end_full = end / PAGE_SIZE as u64;
        let mut disk = m.disk.lock();
        for idx in first_full..end_full {
            let was_cached = pages.truncate_one(idx);
            if disk.cur_map.contains_key(&idx) {
                disk.remap(idx, 0);
                disk.unjournaled.insert(idx, (0, 0));
            } else if was_cached {
                // Never on the device, but perhaps in a journal: an fsync may have logged the
                // page inline (`Record::Data`), or be logging it now. The hole must replay
                // after it.
                disk.unjournaled.insert(idx, (0, 0));
            }
        }
        m.note_reserved(&disk);
        Ok(())
    }

    /// Zeroes `[off, end)`: whole blocks become unwritten and reserved, whatever they held
    /// (their cached pages go; the kernel drops its own copies after the call), partial ones
    /// get zero bytes, and a partial one that is a hole is preallocated.
    fn zero_range_locked(&self, m: &MNode, off: u64, end: u64) -> Result<()> {
        let (pages, range) = m.pages().expect("a regular file");
        let _r = range.lock_exclusive(off, end);
        refuse(m.iflags(), InodeFlags::PRIVILEGED, "fallocate")?;
        for (idx, po, n, _) in page_spans(off, end) {
            if po != 0 || n != PAGE_SIZE {
                self.zero_in_page(m, pages, idx, po, n, true)?;
            }
        }
        let first_full = off.div_ceil(PAGE_SIZE as u64);
        let end_full = end / PAGE_SIZE as u64;
        let mut disk = m.disk.lock();
        for idx in first_full..end_full {
            // Page and mapping change together, under the mapping's lock (as a punch does).
            pages.truncate_one(idx);
            disk.unwrite(idx);
        }
        m.note_reserved(&disk);
        Ok(())
    }

    /// Changes attributes; `size` truncates or extends. A mode change rewrites the access ACL
    /// to match. With a `caller`, a size change and a chown first drop the privileges they
    /// take from it (`crate::perm`); without one, nothing is dropped.
    #[allow(clippy::too_many_arguments)]
    pub fn setattr(
        &self,
        ino: u32,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<Timespec>,
        mtime: Option<Timespec>,
        ctime: Option<Timespec>,
        times_now: bool,
        caller: Option<&dyn Caller>,
    ) -> Result<Arc<MNode>> {
        self.check_writable()?;
        let m = {
            let _g = self.pass.shared();
            self.mnode(ino)?
        };
        // ext4 (notify_change): an immutable inode takes no change, an append-only one only
        // times set to now (touch).
        let times = atime.is_some() || mtime.is_some();
        if mode.is_some() || uid.is_some() || gid.is_some() || (times && !times_now) {
            refuse(m.iflags(), InodeFlags::PRIVILEGED, "change attributes")?;
        }
        if times {
            refuse(m.iflags(), InodeFlags::IMMUTABLE, "change times")?;
        }
        if size.is_some() && m.is_dir() {
            return Err(Error::errno(libc::EISDIR, "truncate of a directory"));
        }
        if let Some(c) = caller {
            if size.is_some() {
                self.drop_privs(&m, Change::Data, c)?;
            }
            if uid.is_some() || gid.is_some() {
                self.drop_privs(&m, Change::Owner, c)?;
            }
        }
        // Declared before the semaphore's guard, so dropped after it.
        let mut _dropped = Truncated::default();
        let _g = self.pass.shared();
        if let Some(s) = size {
            _dropped = self.truncate_locked(&m, s)?;
        }
        if let Some(a) = atime {
            m.atime.store(ts_to_ns(a), Ordering::Relaxed);
        }
        {
            let mut meta = m.meta.lock();
            if let Some(md) = mode {
                meta.mode = (meta.mode & S_IFMT) | (md & 0o7777);
                self.chmod_acl(&mut meta);
            }
            if let Some(u) = uid {
                meta.uid = u;
            }
            if let Some(g) = gid {
                meta.gid = g;
            }
        }
        if let Some(t) = mtime {
            m.mtime.store(ts_to_ns(t), Ordering::Relaxed);
        }
        m.touch_ctime(ctime.unwrap_or_else(now));
        self.mark_dirty(&m);
        Ok(m)
    }

    pub fn getxattr(&self, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        let _g = self.pass.shared();
        let m = self.mnode(ino)?;
        // The set is shared, not copied: the value is copied without the lock.
        let set = m.meta.lock().xattrs.set.clone();
        set.get(name)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| Error::errno(libc::ENODATA, String::from_utf8_lossy(name)))
    }

    /// The names of an inode's xattrs, in byte order.
    pub fn listxattr(&self, ino: u32) -> Result<Vec<Vec<u8>>> {
        let _g = self.pass.shared();
        let m = self.mnode(ino)?;
        let set = m.meta.lock().xattrs.set.clone();
        Ok(set.names().map(<[u8]>::to_vec).collect())
    }

    /// setxattr(2). An inode holds up to `MAX_XATTR_STREAM` bytes of xattrs (about 3.9 MiB of
    /// names and values): past that ENOSPC, as ext4 gives when an inode's xattr block is full.
    /// An ACL (`crate::acl`) is validated and kept in step with the mode, and `caller` decides
    /// whether an access ACL leaves set-group-ID.
    pub fn setxattr(
        &self,
        ino: u32,
        name: &[u8],
        value: &[u8],
        flags: i32,
        caller: &dyn Caller,
    ) -> Result<()> {
        self.check_writable()?;
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return Err(Error::errno(libc::ERANGE, "xattr name length"));
        }
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::errno(libc::E2BIG, "xattr value too large"));
        }
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 || flags == XATTR_CREATE | XATTR_REPLACE {
            return Err(Error::errno(libc::EINVAL, format!("setxattr flags {flags:#x}")));
        }
        // Room for what the next checkpoint writes: the set's blocks (all of them, if it is
        // not already owed) with the new value, and the nodes.
        let owed_now = self.cells.get(ino as u64).map_or(0, |m| {
            let meta = m.meta.lock();
            if meta.xattrs.cp_dirty {
                0
            } else {
                blocks_for(meta.xattrs.set.stream_len()) as u64
            }
        });
        self.admit(2 + owed_now + blocks_for(stream_entry_len(name.len(), value.len())) as u64)?;
        if name == crate::acl::ACCESS || name == crate::acl::DEFAULT {
            let m = {
                let _g = self.pass.shared();
                self.mnode(ino)?
            };
            // An ACL is an attribute change like any other (t_immutable's add_acl).
            refuse(m.iflags(), InodeFlags::PRIVILEGED, "set an ACL")?;
            return self.set_acl(&m, name, value, caller);
        }
        let _g = self.pass.shared();
        let m = self.mnode(ino)?;
        refuse(m.iflags(), InodeFlags::PRIVILEGED, "setxattr")?;
        let mut meta = m.meta.lock();
        let x = &mut meta.xattrs;
        match (x.set.contains(name), flags) {
            (true, XATTR_CREATE) => return Err(Error::errno(libc::EEXIST, String::from_utf8_lossy(name))),
            (false, XATTR_REPLACE) => return Err(Error::errno(libc::ENODATA, String::from_utf8_lossy(name))),
            _ => {}
        }
        if x.set.stream_len_with(name, value.len()) > MAX_XATTR_STREAM {
            return Err(Error::errno(libc::ENOSPC, "no room for more extended attributes on this inode"));
        }
        // Copies the set only if a checkpoint is writing it now.
        Arc::make_mut(&mut x.set).set(name, value.to_vec());
        self.xattr_changed(x, name);
        drop(meta);
        m.touch_ctime(now());
        self.mark_dirty(&m);
        Ok(())
    }

    pub fn removexattr(&self, ino: u32, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        let _g = self.pass.shared();
        let m = self.mnode(ino)?;
        refuse(m.iflags(), InodeFlags::PRIVILEGED, "removexattr")?;
        let mut meta = m.meta.lock();
        let x = &mut meta.xattrs;
        if !x.set.contains(name) {
            // Removing an ACL there is not is no error (as ext4).
            if name == crate::acl::ACCESS || name == crate::acl::DEFAULT {
                return Ok(());
            }
            return Err(Error::errno(libc::ENODATA, String::from_utf8_lossy(name)));
        }
        Arc::make_mut(&mut x.set).remove(name);
        self.xattr_changed(x, name);
        drop(meta);
        m.touch_ctime(now());
        self.mark_dirty(&m);
        Ok(())
    }

    /// Notes (under the inode's meta lock) that xattr `name` changed: the next fsync journals
    /// it, the next checkpoint writes the set, and the blocks that takes are owed until then.
    pub(crate) fn xattr_changed(&self, x: &mut XattrState, name: &[u8]) {
        x.unjournaled.insert(name.to_vec());
        x.cp_dirty = true;
        // An upper bound: a small set goes inline in its node, and a checkpoint rewrites only
        // the blocks that changed.
        let need = blocks_for(x.set.stream_len()) as u64;
        self.xattr_owed.fetch_add(need as i64 - x.owed as i64, Ordering::Relaxed);
        x.owed = need;
    }

    /// The blocks owed for `x` are no longer (a checkpoint took the set, or the inode is gone).
    pub(crate) fn xattr_settled(&self, x: &mut XattrState) {
        self.xattr_owed.fetch_sub(std::mem::take(&mut x.owed) as i64, Ordering::Relaxed);
    }

    /// Number of allocated 4 KiB blocks of a file (for st_blocks).
    pub(crate) fn allocated_blocks(&self, m: &MNode) -> u64 {
        match &m.content {
            Content::File { pages, .. } => {
                // Most files have nothing dirty: their count is the mapping's, which the disk
                // lock's mirror holds, so stat takes no lock fsync and writeback take. A page
                // dirtied concurrently may or may not be counted, as under the lock.
                if pages.dirty_count() == 0 && pages.logged_count() == 0 {
                    return m.disk.mapped_blocks();
                }
                let disk = m.disk.lock();
                let mapped = disk.cur_map.len() as u64;
                mapped + pages.dirty_unmapped(|i| disk.cur_map.contains_key(&i))
            }
            Content::Dir(d) => d.map.reported_size() / BLOCK_SIZE as u64,
            Content::Other => u64::from(m.file_type == S_IFLNK),
        }
    }
}

/// Reads of one page a partial write makes before it reads under the inode's `disk` lock.
const LOAD_TRIES: usize = 3;

const _: () = assert!(S_IFREG == 0o100000);

/// Copies bytes `[off, end)` of a file into `buf` if every page they touch is cached; `None`
/// (with `buf` partly written) as soon as one is not. The caller holds the range lock.
fn read_cached(pages: &PageMap, off: u64, end: u64, buf: &mut [u8]) -> Option<usize> {
    copy_pages(off, end, buf, |idx| pages.get(idx).map(Some))
}

/// Copies bytes `[off, end)` of a file into `buf`, page by page: `page(idx)` is `Some(Some(p))`
/// for a page's bytes, `Some(None)` for a hole (zeros), or `None`, which stops the copy and
/// returns `None` (with `buf` partly written).
fn copy_pages(
    off: u64,
    end: u64,
    buf: &mut [u8],
    mut page: impl FnMut(u64) -> Option<Option<crate::mem::pages::PageBuf>>,
) -> Option<usize> {
    debug_assert!(off < end && (end - off) as usize <= buf.len());
    for (idx, po, n, at) in page_spans(off, end) {
        match page(idx)? {
            Some(p) => buf[at..at + n].copy_from_slice(&p[po..po + n]),
            None => buf[at..at + n].fill(0),
        }
    }
    Some((end - off) as usize)
}

/// Bytes `[off, end)` of a file cut at page boundaries: for each piece, (page index, offset in
/// the page, length, offset from `off`). One piece per page the range touches.
fn page_spans(off: u64, end: u64) -> impl Iterator<Item = (u64, usize, usize, usize)> {
    let mut pos = off;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let idx = pos / PAGE_SIZE as u64;
        let po = (pos % PAGE_SIZE as u64) as usize;
        let n = (PAGE_SIZE - po).min((end - pos) as usize);
        let at = (pos - off) as usize;
        pos += n as u64;
        Some((idx, po, n, at))
    })
}
