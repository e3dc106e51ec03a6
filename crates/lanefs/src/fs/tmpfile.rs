//! O_TMPFILE through the library: a file with no name, open, that [`Fs::link`] may name once.
//!
//! Invariants: the file lives while it is open and has no name, as an unlinked open file
//! does; after a crash or an unmount it is gone unless a link named it first. Durability of
//! its name and data once linked is a created file's (contract 1 and 2).

use super::{ino32, Fs, Handle, Ino};
use crate::error::Result;
use crate::fs::types::{Attr, New};
use crate::mem::ops::NewInode;

impl Fs {
    /// open(2) of directory `parent` with O_TMPFILE: a regular file with no name, made as
    /// [`Fs::make`] makes one (`new.mode`'s permission bits under `new.umask` or the
    /// directory's default ACL, `new.uid` and `new.gid`), with link count 0 and one open count
    /// that [`Fs::release`] gives back (the last one deletes it unless [`Fs::link`] named it).
    /// EINVAL for a type other than a regular file; ENOENT in a removed directory.
    pub fn tmpfile_open(&self, parent: Ino, new: &New) -> Result<Attr> {
        self.engine.disk.check_live()?;
        let mode = if new.mode & crate::format::node::S_IFMT == 0 { new.mode | 0o100000 } else { new.mode };
        let m = self.engine.create_unnamed(
            ino32(parent)?,
            NewInode { mode, uid: new.uid, gid: new.gid, rdev: 0, symlink: &[], umask: new.umask },
        )?;
        Ok(self.attr(&m))
    }

    /// [`Fs::tmpfile_open`] with its open count in a [`Handle`] (dropping it releases it).
    pub fn tmpfile(&self, parent: Ino, new: &New) -> Result<(Attr, Handle)> {
        let a = self.tmpfile_open(parent, new)?;
        let m = {
            let _g = self.engine.mem.pass.shared();
            self.engine.mnode(ino32(a.ino)?)
        };
        match m {
            Ok(m) => Ok((a, Handle { engine: self.engine.clone(), m })),
            Err(e) => {
                let _ = self.engine.release(ino32(a.ino)?);
                Err(e)
            }
        }
    }
}
