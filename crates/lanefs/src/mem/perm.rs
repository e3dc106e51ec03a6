//! The engine's side of [`crate::perm`] and [`crate::acl`]: privileges a change drops, ACLs a
//! new inode inherits, and the mode kept in step with the access ACL.
//!
//! Each rule changes an mnode's `meta` under one hold of its lock, so no one sees the mode and
//! the ACL disagree, or a new inode without what it inherits (it gets its ACLs before its name
//! is visible). Privileges are dropped before the change that drops them is made: whoever sees
//! new data sees the set-ID bits gone. A [`Caller`] is asked its part with no lock held (it may
//! read /proc), then the bits are cleared (only cleared: a bit set meanwhile by a chmod stays
//! set, as if the chmod came after).

use super::mnode::{MNode, Meta, S_IFDIR, S_IFLNK, S_IFREG};
use super::xattr::XattrSet;
use super::Memfs;
use crate::acl::{self, Acl};
use crate::engine::{now, Engine};
use crate::error::{Error, Result};
use crate::format::node::S_IFMT;
use crate::format::xattr::MAX_XATTR_STREAM;
use crate::perm::{self, Caller, Change, S_ISGID};
use std::sync::Arc;

type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// What a change takes from an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loss {
    /// Set-ID bits to clear.
    setid: u32,
    /// Whether `security.capability` goes.
    capability: bool,
}

/// Whether a new inode's inherited xattrs fit in its xattr set (as `setxattr` checks).
fn fits(x: &Xattrs) -> Result<()> {
    if XattrSet::from_entries(x.clone()).stream_len() > MAX_XATTR_STREAM {
        return Err(Error::errno(libc::ENOSPC, "no room for more extended attributes on this inode"));
    }
    Ok(())
}

impl Memfs {
    /// After a chmod: the access ACL's mirrored entries rewritten to the new mode. A stored
    /// value that does not decode (written before ACLs were checked) is left as it is.
    pub(crate) fn chmod_acl(&self, meta: &mut Meta) {
        let Some(Ok(Some(mut a))) = meta.xattrs.set.get(acl::ACCESS).map(Acl::decode) else { return };
        a.chmod(meta.mode);
        Arc::make_mut(&mut meta.xattrs.set).set(acl::ACCESS, a.encode());
        self.xattr_changed(&mut meta.xattrs, acl::ACCESS);
    }
}

impl Engine {
    /// setxattr of an ACL: validated; an access ACL sets the mode's permission bits and is kept
    /// only if it says more than they do, and drops set-group-ID unless `caller` is in the
    /// file's group or privileged; a default ACL only on a directory. An empty ACL removes it.
    /// (Flags are ignored, as the kernel ignores them for ACLs.)
    pub(crate) fn set_acl(
        &self,
        m: &Arc<MNode>,
        name: &[u8],
        value: &[u8],
        caller: &dyn Caller,
    ) -> Result<()> {
        debug_assert!(name == acl::ACCESS || name == acl::DEFAULT);
        let new = Acl::decode(value)?;
        if m.file_type == S_IFLNK {
            return Err(Error::errno(libc::EOPNOTSUPP, "symlinks have no ACLs"));
        }
        if name == acl::DEFAULT && !m.is_dir() {
            return match new {
                Some(_) => Err(Error::errno(libc::EACCES, "a default ACL on a non-directory")),
                None => Ok(()),
            };
        }
        let drop_sgid = name == acl::ACCESS && new.is_some() && {
            let (mode, gid) = {
                let meta = m.meta.lock();
                (meta.mode, meta.gid)
            };
            mode & S_ISGID != 0 && !perm::acl_keeps_sgid(gid, caller)
        };
        let g = self.mem.pass.shared();
        self.capture_if_owed(m);
        let mode = {
            let mut meta = m.meta.lock();
            let mut mode = meta.mode;
            let value = match &new {
                Some(a) if name == acl::ACCESS => {
                    let (m2, extended) = a.equiv_mode(mode);
                    mode = if drop_sgid { m2 & !S_ISGID } else { m2 };
                    extended.then(|| a.encode())
                }
                Some(a) => Some(a.encode()),
                None => None,
            };
            let x = &mut meta.xattrs;
            let changed = match value {
                Some(v) => {
                    if x.set.stream_len_with(name, v.len()) > MAX_XATTR_STREAM {
                        return Err(Error::errno(
                            libc::ENOSPC,
                            "no room for more extended attributes on this inode",
                        ));
                    }
                    Arc::make_mut(&mut x.set).set(name, v);
                    true
                }
                None => Arc::make_mut(&mut x.set).remove(name),
            };
            if changed {
                self.mem.xattr_changed(x, name);
            }
            meta.mode = mode;
            mode
        };
        m.touch_ctime(now());
        self.mem.mark_dirty(m);
        drop(g);
        if drop_sgid {
            caller.dropped(m.ino as u64, mode);
        }
        Ok(())
    }

    /// The mode and xattrs of a new inode created with `mode` (type and permission bits) in
    /// directory `dir`, by a process whose umask is `umask`: masked by the directory's default
    /// ACL if it has one (and then not by the umask), which a new directory also inherits.
    pub(crate) fn inherit(&self, dir: &MNode, mode: u32, umask: u32) -> Result<(u32, Xattrs)> {
        let masked = mode & !(umask & 0o777);
        if mode & S_IFMT == S_IFLNK {
            return Ok((mode, Vec::new()));
        }
        // No attribute at all, so no default ACL: answered without the directory's mutex, which
        // every create in the directory would take (`MetaLock::has_xattrs`).
        if !dir.meta.has_xattrs() {
            return Ok((masked, Vec::new()));
        }
        let default = dir.meta.lock().xattrs.set.get(acl::DEFAULT).map(<[u8]>::to_vec);
        let Some(bytes) = default else { return Ok((masked, Vec::new())) };
        // A stored value that does not decode (from before ACLs were checked) counts as none.
        let Ok(Some(default)) = Acl::decode(&bytes) else { return Ok((masked, Vec::new())) };
        let mut access = default.clone();
        let (mode, extended) = access.create_masq(mode);
        let mut x = Vec::new();
        if extended {
            x.push((acl::ACCESS.to_vec(), access.encode()));
        }
        if mode & S_IFMT == S_IFDIR {
            x.push((acl::DEFAULT.to_vec(), default.encode()));
        }
        fits(&x)?;
        Ok((mode, x))
    }

    /// What `change` by `caller` takes from `m`; asks the caller with no lock held.
    fn loss(&self, m: &MNode, change: Change, caller: &dyn Caller) -> Loss {
        let (mode, gid, capability) = {
            let meta = m.meta.lock();
            (meta.mode, meta.gid, meta.xattrs.set.contains(perm::SECURITY_CAPABILITY))
        };
        let capability = capability && (change == Change::Owner || m.file_type == S_IFREG);
        Loss { setid: perm::setid_to_drop(mode, gid, change, caller), capability }
    }

    /// Drops what `change` by `caller` takes from `m`: its set-ID bits and file capabilities
    /// (see [`crate::perm`]). Called before the change is made.
    pub fn drop_privs(&self, m: &Arc<MNode>, change: Change, caller: &dyn Caller) -> Result<()> {
        let loss = self.loss(m, change, caller);
        if loss.setid == 0 && !loss.capability {
            return Ok(());
        }
        self.check_writable()?;
        let mode = {
            let _g = self.mem.pass.shared();
            self.capture_if_owed(m);
            let mode = {
                let mut meta = m.meta.lock();
                meta.mode &= !loss.setid;
                if loss.capability && Arc::make_mut(&mut meta.xattrs.set).remove(perm::SECURITY_CAPABILITY) {
                    self.mem.xattr_changed(&mut meta.xattrs, perm::SECURITY_CAPABILITY);
                }
                meta.mode
            };
            m.touch_ctime(now());
            self.mem.mark_dirty(m);
            mode
        };
        // Told with nothing held: the adapter writes to the kernel.
        if loss.setid != 0 {
            caller.dropped(m.ino as u64, mode);
        }
        Ok(())
    }
}

impl Engine {
    /// [`Engine::write_mnode`] by `caller`, who first loses what a write takes (see
    /// [`crate::perm`]).
    pub fn write_mnode_as(
        &self,
        m: &Arc<MNode>,
        off: u64,
        data: &[u8],
        caller: &dyn Caller,
    ) -> Result<usize> {
        self.drop_privs_for_write(m, data, caller)?;
        self.write_mnode(m, off, data)
    }

    /// What `caller` loses before writing `data` to `m`.
    pub fn drop_privs_for_write(&self, m: &Arc<MNode>, data: &[u8], caller: &dyn Caller) -> Result<()> {
        // A write of nothing changes nothing, and takes nothing (as the VFS).
        if !data.is_empty() && m.pages().is_some() {
            self.drop_privs(m, Change::Data, caller)?;
        }
        Ok(())
    }
}
