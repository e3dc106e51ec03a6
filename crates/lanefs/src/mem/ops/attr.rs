//! Attributes: setattr, extended attributes and the blocks a stat reports.

use super::*;

impl Engine {
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
            let _g = self.mem.pass.shared();
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
        let _g = self.mem.pass.shared();
        // Held since the lookup above only by reference: a snapshot may have come between.
        self.capture_if_owed(&m);
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
                self.mem.chmod_acl(&mut meta);
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
        self.mem.mark_dirty(&m);
        Ok(m)
    }

    pub fn getxattr(&self, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        let _g = self.mem.pass.shared();
        let m = self.mnode(ino)?;
        // The set is shared, not copied: the value is copied without the lock.
        let set = m.meta.lock().xattrs.set.clone();
        set.get(name)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| Error::errno(libc::ENODATA, String::from_utf8_lossy(name)))
    }

    /// The names of an inode's xattrs, in byte order.
    pub fn listxattr(&self, ino: u32) -> Result<Vec<Vec<u8>>> {
        let _g = self.mem.pass.shared();
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
        let owed_now = self.mem.cells.get(ino as u64).map_or(0, |m| {
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
                let _g = self.mem.pass.shared();
                self.mnode(ino)?
            };
            // An ACL is an attribute change like any other (t_immutable's add_acl).
            refuse(m.iflags(), InodeFlags::PRIVILEGED, "set an ACL")?;
            return self.set_acl(&m, name, value, caller);
        }
        let _g = self.mem.pass.shared();
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
        self.mem.xattr_changed(x, name);
        drop(meta);
        m.touch_ctime(now());
        self.mem.mark_dirty(&m);
        Ok(())
    }

    pub fn removexattr(&self, ino: u32, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        let _g = self.mem.pass.shared();
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
        self.mem.xattr_changed(x, name);
        drop(meta);
        m.touch_ctime(now());
        self.mem.mark_dirty(&m);
        Ok(())
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
