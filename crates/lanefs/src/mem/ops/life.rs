//! An inode's life after its last name: orphan while something holds it, dead after.
//!
//! An inode with no name lives on while something still holds it by number: an open handle
//! (`Engine::open_file` to `Engine::release`) or a kernel's reference through a mount
//! (`Engine::remember_with` to `Engine::forget`: FUSE's lookup count). Until then it is an orphan,
//! on `Memfs::orphans`, which every checkpoint records so that recovery deletes it after a
//! crash. With its last hold gone it dies (`Memfs::bury`), and the next checkpoint deletes it.
//!
//! Why a kernel's references count as holds: a kernel that holds an inode may send requests for
//! it after its last name is gone and its last file is closed. Linux's FUSE does so on every
//! unlink under the writeback cache (a SETATTR of the new ctime, from `fuse_flush_time_update`),
//! and an `O_PATH` descriptor, which opens nothing here, may stat the inode or set its times. Had
//! a checkpoint deleted the inode meanwhile, the answer would be ENOENT, which the kernel records
//! as a writeback error of the whole file system: the next syncfs(2) on the mount fails. ext4
//! does the same: an inode with no link stays on its orphan list until its last reference goes.
//!
//! The orphan list has a bound (every checkpoint records it): a kernel's references alone keep
//! an inode only while the list is at most half full (`Memfs::kernel_may_hold`).
//!
//! Invariant: whether an inode with no name is an orphan or dead is decided under its meta lock
//! (`Engine::settle_locked`), after every change of its names and holds that may end its life,
//! and every new kernel reference is taken under that lock too, refused once the inode is dead.
//! Of two changes that race (an unlink and the last FORGET, or the last release), the later
//! decides with both seen: an inode on the orphan list is never dead, and no kernel holds a dead
//! one.

use super::*;
use crate::format::layout::ORPHAN_CAPACITY;
use crate::mem::mnode::MetaGuard;

/// Room the orphan list keeps beyond what [`Engine::admit_orphan`] lets in: the check and the
/// removal it admits are not one step, so removals racing each other may all pass it.
const ORPHAN_ADMIT_MARGIN: u32 = 256;

impl Engine {
    /// Decides `m`'s life after a change that may have ended it: dead if it has no name and
    /// nothing holds it, an orphan if it has no name and is held. The caller holds the
    /// semaphore shared and `m`'s meta lock (`meta`).
    pub(super) fn settle_locked(&self, m: &Arc<MNode>, meta: &MetaGuard<'_>) {
        if meta.nlink > 0 || m.dead.load(Ordering::Acquire) {
            return;
        }
        // A kernel's references keep it only while the orphan list has room for them
        // (`Memfs::kernel_may_hold`); one already on the list stays.
        let kernel = m.lookups.load(Ordering::Acquire) > 0
            && (m.orphaned.load(Ordering::Acquire) || self.mem.kernel_may_hold());
        if m.open.load(Ordering::Acquire) > 0 || kernel {
            self.mem.orphan(m);
            return;
        }
        self.mem.unorphan(m);
        self.mem.mark_dirty(m);
        self.mem.bury(m);
        debug_assert!(m.dead.load(Ordering::Acquire) && !m.orphaned.load(Ordering::Acquire));
    }

    /// Refuses, with ENOSPC, to make one more orphan (the last name of an open `m` removed, or
    /// an O_TMPFILE file made) when the orphan list is nearly full, as F2FS refuses it: every
    /// checkpoint records the list, which holds `ORPHAN_CAPACITY`, and a checkpoint that could
    /// not would stop the file system. A kernel's references alone never count here: past
    /// `Memfs::kernel_may_hold` they no longer keep an unlinked inode.
    pub(super) fn admit_orphan(&self, m: Option<&MNode>) -> Result<()> {
        let n = self.mem.orphan_count.load(Ordering::Relaxed);
        if n < (ORPHAN_CAPACITY - ORPHAN_ADMIT_MARGIN) as usize {
            return Ok(());
        }
        if let Some(m) = m {
            let last = m.is_dir() || m.meta.stat().nlink <= 1;
            if m.open.load(Ordering::Acquire) == 0 || !last {
                return Ok(());
            }
        }
        Err(Error::errno(
            libc::ENOSPC,
            format!("{n} files have no name and are still open (the most lanefs keeps); close some first"),
        ))
    }

    /// [`Engine::settle_locked`], taking the meta lock.
    pub(super) fn settle(&self, m: &Arc<MNode>) {
        let meta = m.meta.lock();
        self.settle_locked(m, &meta);
    }

    /// A kernel took one more reference to `ino` (an entry reply it got): the inode stays
    /// alive, as for an open handle, until [`Engine::forget`] gives the reference back; returns
    /// what `f` makes of it (its attributes for the reply). ENOENT if it died already (its last
    /// name went while nothing held it): the kernel must not get an inode that the next
    /// checkpoint deletes. (No reference count of the mnode is taken: a READDIRPLUS of a
    /// directory that two cores list would share each entry's.)
    pub fn remember_with<R>(&self, ino: u32, f: impl FnOnce(&Arc<MNode>) -> R) -> Result<R> {
        let _g = self.mem.pass.shared();
        self.with_mnode(ino, |m| {
            {
                let _meta = m.meta.lock();
                if m.dead.load(Ordering::Acquire) {
                    return Err(enoent("inode was removed"));
                }
                let before = m.lookups.fetch_add(1, Ordering::AcqRel);
                debug_assert!(before < u64::MAX / 2, "inode {ino}: {before} kernel references");
            }
            Ok(f(m))
        })?
    }

    /// A kernel gave back `n` references to `ino` (FORGET); with the last one, an inode with
    /// no name and no open handle dies. EINVAL, after giving back what there was, if that is
    /// more than it took: a count lost somewhere, which only ever frees an inode early.
    pub fn forget(&self, ino: u32, n: u64) -> Result<()> {
        let _g = self.mem.pass.shared();
        let m = self.mnode(ino)?;
        // The closure always gives a value: Ok and Err both carry the count before.
        let before = m
            .lookups
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(n)))
            .unwrap_or_else(|v| v);
        if before <= n {
            self.settle(&m);
        }
        if before < n {
            return Err(Error::errno(
                libc::EINVAL,
                format!("inode {ino}: {n} kernel references given back, {before} taken"),
            ));
        }
        Ok(())
    }

    /// Every kernel reference is gone at once (the mount's session ended: a kernel sends no
    /// FORGET for what it still holds when the connection goes). Returns how many inodes held
    /// some. One pass over the inodes, for unmount.
    pub fn forget_all(&self) -> usize {
        let _g = self.mem.pass.shared();
        let mut held = Vec::new();
        self.mem.cells.for_each(|_, m| {
            if m.lookups.load(Ordering::Acquire) > 0 {
                held.push(m.clone());
            }
        });
        for m in &held {
            self.capture_if_owed(m);
            m.lookups.store(0, Ordering::Release);
            self.settle(m);
        }
        held.len()
    }
}
