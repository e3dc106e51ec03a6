//! The namespace: lookups and path walks, create, link, unlink, rmdir and rename.

use super::*;

impl Engine {
    /// A directory's mnode, or ENOTDIR / ENOENT.
    pub(crate) fn dir_mnode(&self, ino: u32) -> Result<Arc<MNode>> {
        let m = self.mnode(ino)?;
        require_dir(&m)?;
        Ok(m)
    }

    /// Runs `f` on directory `ino`'s mnode (ENOTDIR or ENOENT as [`Engine::dir_mnode`]) without
    /// taking a reference: creates, unlinks and renames of distinct names in one directory
    /// would otherwise all write its reference count, a cache line every core then bounces.
    /// `f` runs pinned to the mnode table (`Cells::with`): it may lock and allocate, but must
    /// not wait for another operation.
    pub(crate) fn with_dir<R>(&self, ino: u32, f: impl FnOnce(&Arc<MNode>) -> Result<R>) -> Result<R> {
        self.with_mnode(ino, |d| {
            require_dir(d)?;
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
        let _g = self.mem.pass.shared();
        let mut names = names.into_iter();
        let mut f = Some(f);
        // The fast walk: one pin of the directory maps for every directory on the way, each
        // step from the directory's slot straight to the child's mnode (`mem::dir`). It hands
        // over to the step-by-step walk only for what it does not take (".."), having read
        // but changed nothing.
        let fast = self.with_mnode(dir, |start| {
            let pin = crate::mem::dir::guard();
            let mut cur: &MNode = start;
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
        let f = f.take().expect("not called");
        self.with_mnode(cur, |m| f(m))
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
        let _g = self.mem.pass.shared();
        self.with_dir(parent, |d| self.create_in(d, name, &new))
    }

    /// [`Engine::create_node`] in directory `d`, pinned, with the arguments checked.
    fn create_in(&self, d: &Arc<MNode>, name: &[u8], new: &NewInode) -> Result<Arc<MNode>> {
        let parent = d.ino;
        let ftype = new.mode & S_IFMT;
        let dir = d.dir().expect("dir");
        if dir.map.lookup(name).is_some() {
            return Err(Error::errno(libc::EEXIST, String::from_utf8_lossy(name)));
        }
        refuse(d.iflags(), InodeFlags::IMMUTABLE, "create")?;
        // Its ACLs go in with it, before its name is visible.
        let (mode, xattrs) = self.inherit(d, new.mode, new.umask)?;
        let (_, cpu) = self.disk.lane();
        let ino =
            self.disk.nat.alloc_nid(cpu).map_err(|_| Error::errno(libc::ENOSPC, "no free inode numbers"))?;
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
            generation: self.mem.generations.take(),
            xattrs: Default::default(),
            symlink: new.symlink.to_vec(),
        };
        let mut meta = meta;
        for (n, v) in xattrs {
            Arc::make_mut(&mut meta.xattrs.set).set(&n, v);
            self.mem.xattr_changed(&mut meta.xattrs, &n);
        }
        let size = if ftype == S_IFLNK { new.symlink.len() as u64 } else { 0 };
        let flags = InodeFlags(d.iflags()).inherited_by(new.mode).bits();
        let m = MNode::new(ino, meta, size, Stamps { flags, ..Stamps::at(t) }, &self.mem.cache);
        m.parent.store(parent, Ordering::Relaxed);
        if ftype == S_IFDIR {
            m.disk.lock().dentries = Some(Default::default());
        }
        let attr = m.attr_record(&m.meta.lock());
        let (m, _) = self.mem.cells.insert_if_absent(ino as u64, || m);
        let dtype = dtype_of(mode);
        let r = dir.map.update(name, |old| {
            if let Some(refused) = refuse_new_name(dir, name, old) {
                return refused;
            }
            let op = self.mem.inflight.begin();
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
            self.mem.cells.remove(ino as u64);
            let _ = self.disk.nat.free_nid(ino);
            return Err(e);
        }
        if ftype == S_IFDIR {
            d.add_nlink(1);
        }
        d.touch(t);
        self.ckpt.requests.count_op();
        self.mem.mark_dirty(d);
        self.mem.mark_dirty(&m);
        Ok(m)
    }

    pub fn link(&self, ino: u32, parent: u32, name: &[u8]) -> Result<Arc<MNode>> {
        self.check_writable()?;
        self.admit(2)?;
        check_name(name)?;
        let _g = self.mem.pass.shared();
        let m = self.mnode(ino)?;
        if m.is_dir() {
            return Err(Error::errno(libc::EPERM, "hard link to a directory"));
        }
        refuse(m.iflags(), InodeFlags::PRIVILEGED, "link")?;
        self.with_dir(parent, |d| self.link_in(&m, d, name))?;
        Ok(m)
    }

    /// [`Engine::link`] of `m` into directory `d`, pinned, with the arguments checked.
    fn link_in(&self, m: &Arc<MNode>, d: &Arc<MNode>, name: &[u8]) -> Result<()> {
        let (ino, parent) = (m.ino, d.ino);
        refuse(d.iflags(), InodeFlags::IMMUTABLE, "link into a directory")?;
        let dir = d.dir().expect("dir");
        // An O_TMPFILE inode's first name: its create as far as the journal knows.
        let first = {
            let meta = m.meta.lock();
            if meta.nlink == 0 {
                // Unlinked names stay gone (Linux refuses them unless I_LINKABLE); the swap
                // claims the one first link against a concurrent one.
                if !m.linkable.swap(false, Ordering::AcqRel) {
                    return Err(enoent("inode was removed"));
                }
                Some((m.attr_record(&meta), Self::acls_of(&meta)))
            } else if meta.nlink >= u32::MAX - 1 {
                return Err(Error::errno(libc::EMLINK, "too many links"));
            } else {
                None
            }
        };
        let dtype = dtype_of(m.file_type);
        let r = dir.map.update(name, |old| {
            if let Some(refused) = refuse_new_name(dir, name, old) {
                return refused;
            }
            let op = self.mem.inflight.begin();
            let stamp = self.clock.stamp_of(op.timestamp());
            m.note_pending(parent, 1);
            match &first {
                Some((attr, acls)) => {
                    dir.log.push_all(Self::tmpfile_link_records(stamp, parent, name, ino, *attr, acls));
                    // Named now, so no orphan; under the shard lock, before an unlink of the
                    // new name could put it back on the list.
                    self.mem.unorphan(m);
                }
                None => dir.log.push(LoggedOp::new(Record::Link {
                    stamp,
                    dir: parent,
                    name: name.to_vec(),
                    ino,
                    file_type: dtype,
                })),
            }
            m.add_nlink(1);
            drop(op);
            (Some((ino, dtype)), Ok(()))
        });
        if r.is_err() && first.is_some() {
            m.linkable.store(true, Ordering::Release);
        }
        r?;
        let t = now();
        m.touch_ctime(t);
        d.touch(t);
        self.note_name_dir(m, parent);
        self.ckpt.requests.count_op();
        self.mem.mark_dirty(d);
        self.mem.mark_dirty(m);
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
        let _g = self.mem.pass.shared();
        self.with_dir(parent, |d| self.remove_in(d, name, want_dir))
    }

    /// [`Engine::remove_name`] in directory `d`, pinned, with the name checked.
    fn remove_in(&self, d: &Arc<MNode>, name: &[u8], want_dir: bool) -> Result<()> {
        let parent = d.ino;
        let dir = d.dir().expect("dir");
        let e = dir.map.lookup(name).ok_or_else(|| enoent(String::from_utf8_lossy(name)))?;
        let child = self.mnode(e.ino)?;
        refuse(d.iflags(), InodeFlags::PRIVILEGED, "remove an entry")?;
        refuse(child.iflags(), InodeFlags::PRIVILEGED, "remove")?;
        self.admit_orphan(Some(&child))?;
        if child.is_dir() != want_dir {
            return Err(if want_dir {
                Error::errno(libc::ENOTDIR, String::from_utf8_lossy(name))
            } else {
                Error::errno(libc::EISDIR, String::from_utf8_lossy(name))
            });
        }
        if want_dir && !child.dir().expect("dir").mark_dead_if_empty() {
            return Err(Error::errno(libc::ENOTEMPTY, String::from_utf8_lossy(name)));
        }
        let ino = e.ino;
        let r = dir.map.update(name, |cur| match cur {
            Some(c) if c.ino == ino => {
                let op = self.mem.inflight.begin();
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
        self.ckpt.requests.count_op();
        self.mem.mark_dirty(d);
        Ok(())
    }

    /// One name of `child` is gone.
    fn drop_link(&self, child: &Arc<MNode>, is_dir: bool, t: Timespec) {
        child.touch_ctime(t);
        self.mem.mark_dirty(child);
        let mut meta = child.meta.lock();
        meta.nlink = if is_dir { 0 } else { meta.nlink.saturating_sub(1) };
        if meta.nlink == 0 {
            self.ckpt.requests.count_deleted();
            // An orphan if still held, else dead (`mem::ops::life`).
            self.settle_locked(child, &meta);
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
        let _g = self.mem.pass.shared();
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
        let _rl =
            (src.is_dir() && sp != dp || flags & RENAME_EXCHANGE != 0).then(|| self.mem.rename_lock.lock());
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
            if flags & RENAME_EXCHANGE == 0 {
                self.admit_orphan(Some(dst))?;
            }
        }
        if let (Some(dst), true) = (&dst, flags & RENAME_EXCHANGE == 0) {
            match (src.is_dir(), dst.is_dir()) {
                (true, false) => return Err(Error::errno(libc::ENOTDIR, String::from_utf8_lossy(a.dname))),
                (false, true) => return Err(Error::errno(libc::EISDIR, String::from_utf8_lossy(a.dname))),
                (true, true) if !dst.dir().expect("dir").mark_dead_if_empty() => {
                    return Err(Error::errno(libc::ENOTEMPTY, String::from_utf8_lossy(a.dname)));
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
        self.rename_settle(a, &src, dst.as_ref(), wh.as_ref());
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
                let op = self.mem.inflight.begin();
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
                self.mem.cells.remove(w.ino as u64);
                let _ = self.disk.nat.free_nid(w.ino);
            }
            return Err(e);
        }
        Ok(wh)
    }

    /// After a committed rename: link counts and parents of moved directories, the replaced
    /// inode's lost name, times, and the dirty set.
    fn rename_settle(
        &self,
        a: &RenameArgs,
        src: &Arc<MNode>,
        dst: Option<&Arc<MNode>>,
        wh: Option<&Arc<MNode>>,
    ) {
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
            self.mem.mark_dirty(dst);
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
        self.ckpt.requests.count_op();
        self.mem.mark_dirty(src);
        self.mem.mark_dirty(sd);
        self.mem.mark_dirty(dd);
        if let Some(w) = wh {
            self.mem.mark_dirty(w);
        }
    }

    /// A whiteout inode for a rename out of directory `dir`, in the inode table but not yet
    /// named: a character device 0:0 with no permission bits (as ext4 makes one).
    fn new_whiteout(&self, dir: u32, (uid, gid): (u32, u32)) -> Result<Arc<MNode>> {
        let (_, cpu) = self.disk.lane();
        let ino =
            self.disk.nat.alloc_nid(cpu).map_err(|_| Error::errno(libc::ENOSPC, "no free inode numbers"))?;
        let t = now();
        let meta = Meta {
            mode: crate::journal::WHITEOUT_TYPE,
            uid,
            gid,
            nlink: 1,
            crtime: t,
            rdev: 0,
            generation: self.mem.generations.take(),
            xattrs: Default::default(),
            symlink: Vec::new(),
        };
        let m = MNode::new(ino, meta, 0, Stamps::at(t), &self.mem.cache);
        m.parent.store(dir, Ordering::Relaxed);
        let (m, fresh) = self.mem.cells.insert_if_absent(ino as u64, || m);
        debug_assert!(fresh, "a newly allocated inode number has no mnode");
        Ok(m)
    }

    /// Whether directory `anc` is `dir` or one of its ancestors.
    fn is_ancestor(&self, anc: u32, mut dir: u32) -> Result<bool> {
        // Bounded by the number of directories: a walk longer than that is a loop (corruption).
        for _ in 0..=self.disk.g.max_nid {
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
}

/// ENOTDIR unless `m` is a directory ([`Engine::dir_mnode`], [`Engine::with_dir`]).
fn require_dir(m: &MNode) -> Result<()> {
    if m.is_dir() {
        Ok(())
    } else {
        Err(Error::errno(libc::ENOTDIR, format!("inode {}", m.ino)))
    }
}
