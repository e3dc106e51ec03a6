//! Writeback: dirty pages of files nobody fsyncs go to disk when the cache passes its bound,
//! and clean pages are evicted, so a data set larger than `cache_bytes` works.
//!
//! Written pages are not journaled (no one asked for durability); their new addresses join the
//! file's current mapping and are journaled by the file's next fsync or made durable by the next
//! checkpoint, whichever comes first.

use crate::engine::Engine;
use crate::error::Result;
use crate::format::ssa::{SummaryEntry, SummaryKind};
use crate::mem::mnode::MNode;
use crate::mem::pages::PAGE_SIZE;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Engine {
    /// Called after a write, outside the pass-through semaphore.
    pub(crate) fn after_write(&self, m: &Arc<MNode>) -> Result<()> {
        let limit = self.opts.cache_bytes;
        let dirty = self.mem.cache.dirty_pages.load(Ordering::Relaxed).max(0) as u64 * PAGE_SIZE as u64;
        if dirty > limit / 2 {
            self.writeback(m)?;
        }
        let cached = self.mem.cache.cached_pages.load(Ordering::Relaxed).max(0) as u64 * PAGE_SIZE as u64;
        if cached > limit {
            let want = ((cached - limit * 3 / 4) / PAGE_SIZE as u64) as usize;
            if let Some((pages, _)) = m.pages() {
                pages.evict_clean(want);
            }
        }
        Ok(())
    }

    /// Writes `m`'s dirty pages to new blocks (no journal, no flush).
    pub(crate) fn writeback(&self, m: &Arc<MNode>) -> Result<()> {
        self.writeback_upto(m, usize::MAX)
    }

    /// Writes at most `max` of `m`'s dirty or logged pages to new blocks.
    pub(crate) fn writeback_upto(&self, m: &Arc<MNode>, max: usize) -> Result<()> {
        let Some((pages, _)) = m.pages() else { return Ok(()) };
        // Not while a checkpoint in progress holds the file (its pages and mapping are the
        // checkpoint's until it is durable; the blocks placed here are young otherwise).
        let _gate = self.enter_flush(m, false)?;
        // Placed blocks are journaled by the inode's next fsync, which must find them.
        let _order = m.fsync_order.lock();
        let dirty = pages.take_dirty_upto(max);
        if dirty.is_empty() {
            return Ok(());
        }
        let (lane, _) = self.disk.lane();
        let mtime = self.disk.elapsed_secs();
        let mut writes = Vec::with_capacity(dirty.len());
        let mut placed = Vec::with_capacity(dirty.len());
        for (idx, buf) in &dirty {
            let owner = SummaryEntry { kind: SummaryKind::Data, nid: m.ino, ofs: *idx as u32 };
            match self.disk.lanes.alloc_young(lane, crate::format::LogType::WarmData, owner, mtime) {
                Ok(addr) => {
                    placed.push((*idx, addr as u32, crc32c::crc32c(&buf[..])));
                    writes.push(crate::device::WriteReq { addr, data: &buf[..] });
                }
                Err(e) => {
                    pages.restore_dirty(&dirty);
                    for (_, a, _) in placed {
                        self.disk.table.invalidate(a as u64)?;
                    }
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.disk.write_reqs(&writes, crate::disk::WriteKind::Writeback) {
            pages.restore_dirty(&dirty);
            for (_, a, _) in placed {
                self.disk.table.invalidate(a as u64)?;
            }
            return Err(e);
        }
        let mut disk = m.disk.lock();
        for (idx, addr, crc) in placed {
            if pages.settle(idx) {
                disk.remap(idx, addr);
                disk.unjournaled.insert(idx, (addr, crc));
            } else {
                // Truncated while in flight: the block holds data no one may see.
                self.disk.table.invalidate(addr as u64)?;
            }
        }
        for a in std::mem::take(&mut disk.garbage) {
            self.disk.table.invalidate(a as u64)?;
        }
        Ok(())
    }

    /// Before a checkpoint takes the gate: files in the dirty set with at least
    /// [`EARLY_MIN_PAGES`] dirty or logged pages write them back now, in batches of
    /// [`EARLY_BATCH`] with the gate shared, so fsyncs go on meanwhile (each waits at most one
    /// batch for its file) and the checkpoint's exclusive phase writes only what changed since.
    /// Errors are left for the checkpoint, which writes whatever is still dirty itself.
    pub(crate) fn write_back_early(&self) {
        // Most dirty inodes owe few pages or none (every create and unlink dirties one):
        // those are passed over without taking a reference, which the checkpoint would
        // otherwise count up and down once per namespace operation.
        let owes_many =
            |m: &MNode| m.pages().is_some_and(|(p, _)| p.dirty_count() + p.logged_count() >= EARLY_MIN_PAGES);
        let mut files: Vec<Arc<MNode>> = Vec::new();
        for d in self.mem.dirty.iter() {
            files.extend(d.lock().values().filter(|m| owes_many(m)).cloned());
        }
        files.sort_unstable_by_key(|m| m.ino);
        files.dedup_by_key(|m| m.ino);
        for m in files {
            let ino = m.ino;
            let Some((pages, _)) = m.pages() else { continue };
            let owed = || pages.dirty_count() + pages.logged_count();
            // Bounded: what was owed at the start, batch by batch; pages dirtied meanwhile by
            // a writer that outpaces us are left to the checkpoint.
            let rounds = owed().div_ceil(EARLY_BATCH as u64);
            for _ in 0..rounds {
                if owed() < EARLY_MIN_PAGES {
                    break;
                }
                if let Err(e) = self.writeback_upto(&m, EARLY_BATCH) {
                    tracing::debug!("lanefs: early writeback of inode {ino}: {e}");
                    break;
                }
            }
        }
    }
}

/// Files owing fewer pages than this are left to the checkpoint's own batched writes.
const EARLY_MIN_PAGES: u64 = 64;
/// Pages one early writeback call takes (what an fsync of the same file may wait for).
const EARLY_BATCH: usize = 64;
