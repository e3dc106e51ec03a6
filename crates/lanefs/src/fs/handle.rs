//! An open file ([`Handle`]): reads, writes and fsyncs without a lookup by inode number, and
//! the open count released when it is dropped.
//!
//! Invariants: a handle holds one open count of its inode from `Fs::open_file` until it is
//! dropped; every call but `size` fails with EIO after a shutdown (`Disk::check_live`).

use super::Ino;
use crate::engine::Engine;
use crate::error::Result;
use crate::mem::mnode::MNode;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// An open file. Dropping it releases the open count.
pub struct Handle {
    pub(super) engine: Arc<Engine>,
    pub(super) m: Arc<MNode>,
}

impl Handle {
    /// The inode this handle is open on.
    pub fn ino(&self) -> Ino {
        self.m.ino as Ino
    }

    /// [`Fs::read_at`](crate::Fs::read_at) on this handle's inode.
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.engine.disk.check_live()?;
        self.engine.read_mnode(&self.m, off, buf)
    }

    /// [`Fs::write_at`](crate::Fs::write_at) on this handle's inode.
    pub fn write_at(&self, off: u64, data: &[u8]) -> Result<usize> {
        self.engine.disk.check_live()?;
        self.engine.write_mnode(&self.m, off, data)
    }

    /// [`Fs::fsync`](crate::Fs::fsync) of this handle's inode.
    pub fn fsync(&self, datasync: bool) -> Result<()> {
        self.engine.disk.check_live()?;
        self.engine.fsync_mnode(&self.m, datasync)
    }

    /// The file's size now.
    pub fn size(&self) -> u64 {
        self.m.size.load(Ordering::Acquire)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Err(e) = self.engine.release(self.m.ino) {
            tracing::error!("lanefs: releasing inode {}: {e}", self.m.ino);
        }
    }
}
