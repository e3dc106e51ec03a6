//! O_TMPFILE: a regular file made without a name, open and orphaned from birth, that one link
//! may name later.
//!
//! Invariants: the inode is on the orphan list (as an unlinked file still open) from its birth
//! until its first link or its last close, so a checkpoint writes it as an orphan and the mount
//! after a crash deletes it. Its first link logs a `Create` (not a `Link`): replay must make
//! the inode when no checkpoint holds it, and adopts the orphan when one does
//! (`recovery::replay`). Only that first link may give it a name while it has none
//! (`MNode::linkable`, Linux's I_LINKABLE); an inode whose names were all removed stays
//! unlinkable.

use super::*;

impl Engine {
    /// A regular file in directory `parent` with no name and one open count (the caller's
    /// handle; [`Engine::release`] drops it), made as `create_node` makes a file: the mode
    /// masked by the umask or the directory's default ACL, inherited flags, the owner given.
    pub fn create_unnamed(&self, parent: u32, new: NewInode) -> Result<Arc<MNode>> {
        self.check_writable()?;
        // As a create: its node block at the next checkpoint, which writes it as an orphan.
        self.admit(2)?;
        if new.mode & S_IFMT != S_IFREG {
            return Err(Error::errno(
                libc::EINVAL,
                format!("O_TMPFILE of mode {:o}: regular files only", new.mode),
            ));
        }
        let _g = self.mem.pass.shared();
        self.with_dir(parent, |d| self.create_unnamed_in(d, &new))
    }

    /// [`Engine::create_unnamed`] in directory `d`, pinned.
    fn create_unnamed_in(&self, d: &MNode, new: &NewInode) -> Result<Arc<MNode>> {
        let dir = d.dir().expect("dir");
        if dir.dead.load(Ordering::Acquire) {
            return Err(enoent("directory was removed"));
        }
        refuse(d.iflags(), InodeFlags::IMMUTABLE, "create")?;
        // Born an orphan.
        self.admit_orphan(None)?;
        let (mode, xattrs) = self.inherit(d, new.mode, new.umask)?;
        let (_, cpu) = self.disk.lane();
        let ino =
            self.disk.nat.alloc_nid(cpu).map_err(|_| Error::errno(libc::ENOSPC, "no free inode numbers"))?;
        let t = now();
        let mut meta = Meta {
            mode,
            uid: new.uid,
            gid: new.gid,
            nlink: 0,
            crtime: t,
            rdev: 0,
            generation: self.mem.generations.take(),
            xattrs: Default::default(),
            symlink: Vec::new(),
        };
        for (n, v) in xattrs {
            Arc::make_mut(&mut meta.xattrs.set).set(&n, v);
            self.mem.xattr_changed(&mut meta.xattrs, &n);
        }
        let flags = InodeFlags(d.iflags()).inherited_by(mode).bits();
        let m = MNode::new(ino, meta, 0, Stamps { flags, ..Stamps::at(t) }, &self.mem.cache);
        m.parent.store(d.ino, Ordering::Relaxed);
        m.linkable.store(true, Ordering::Relaxed);
        m.unnamed_birth.store(true, Ordering::Relaxed);
        // Open before anyone can see it: an inode with no link and no open count is dead.
        m.open.store(1, Ordering::Relaxed);
        let (m, fresh) = self.mem.cells.insert_if_absent(ino as u64, || m);
        debug_assert!(fresh, "a newly allocated inode number has no mnode");
        // Within the pass-through semaphore, so a checkpoint's snapshot sees it dirty and on
        // the orphan list together, or neither.
        self.mem.orphan(&m);
        self.ckpt.requests.count_op();
        self.mem.mark_dirty(&m);
        Ok(m)
    }

    /// The records of the first link of O_TMPFILE inode `m` as `name` in `dir`, stamped
    /// `stamp`: its `Create` with `attr`, and its ACLs, which must come with its first name
    /// as a create's do (`Engine::create_node`). Each ACL goes as its own record: the whole
    /// set would replace, on an inode a checkpoint took, attributes the link does not carry.
    pub(super) fn tmpfile_link_records(
        stamp: crate::journal::Stamp,
        dir: u32,
        name: &[u8],
        ino: u32,
        attr: InodeAttr,
        acls: &[(Vec<u8>, Vec<u8>)],
    ) -> Vec<Arc<LoggedOp>> {
        let mut ops = vec![LoggedOp::new(Record::Create {
            stamp,
            dir,
            name: name.to_vec(),
            ino,
            attr,
            symlink: Vec::new(),
        })];
        ops.extend(
            acls.iter().map(|(n, v)| {
                LoggedOp::new(Record::SetXattr { stamp, ino, name: n.clone(), value: v.clone() })
            }),
        );
        ops
    }

    /// The POSIX ACLs of `meta`'s inode, as its first link logs them.
    pub(super) fn acls_of(meta: &Meta) -> Vec<(Vec<u8>, Vec<u8>)> {
        [crate::acl::ACCESS, crate::acl::DEFAULT]
            .iter()
            .filter_map(|n| meta.xattrs.set.get(n).map(|v| (n.to_vec(), v.to_vec())))
            .collect()
    }
}
