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

impl Engine {
    /// Called after a write, outside the pass-through semaphore.
    pub(crate) fn after_write(&self, m: &MNode) -> Result<()> {
        let limit = self.opts.cache_bytes;
        let dirty = self.cache.dirty_pages.load(Ordering::Relaxed).max(0) as u64 * PAGE_SIZE as u64;
        if dirty > limit / 2 {
            self.writeback(m)?;
        }
        let cached = self.cache.cached_pages.load(Ordering::Relaxed).max(0) as u64 * PAGE_SIZE as u64;
        if cached > limit {
            let want = ((cached - limit * 3 / 4) / PAGE_SIZE as u64) as usize;
            if let Some((pages, _)) = m.pages() {
                pages.evict_clean(want);
            }
        }
        Ok(())
    }

    /// Writes `m`'s dirty pages to new blocks (no journal, no flush).
    pub(crate) fn writeback(&self, m: &MNode) -> Result<()> {
        let Some((pages, _)) = m.pages() else { return Ok(()) };
        let _gate = self.gate.read();
        // Placed blocks are journaled by the inode's next fsync, which must find them.
        let _order = m.fsync_order.lock();
        let dirty = pages.take_dirty();
        if dirty.is_empty() {
            return Ok(());
        }
        let (lane, _) = self.lane();
        let mtime = self.elapsed_secs();
        let mut writes = Vec::with_capacity(dirty.len());
        let mut placed = Vec::with_capacity(dirty.len());
        for (idx, buf) in &dirty {
            let owner = SummaryEntry { kind: SummaryKind::Data, nid: m.ino, ofs: *idx as u32 };
            match self.lanes.alloc(lane, crate::format::LogType::WarmData, owner, mtime) {
                Ok(addr) => {
                    placed.push((*idx, addr as u32, crc32c::crc32c(&buf[..])));
                    writes.push((addr, buf.to_vec()));
                }
                Err(e) => {
                    pages.restore_dirty(&dirty);
                    for (_, a, _) in placed {
                        self.table.invalidate(a as u64)?;
                    }
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.write_all(&writes, crate::engine::WriteKind::Writeback) {
            pages.restore_dirty(&dirty);
            for (_, a, _) in placed {
                self.table.invalidate(a as u64)?;
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
                self.table.invalidate(addr as u64)?;
            }
        }
        for a in std::mem::take(&mut disk.garbage) {
            self.table.invalidate(a as u64)?;
        }
        Ok(())
    }
}
