//! Where an mnode's data lives on disk ([`DiskState`]), behind its own lock, and the
//! [`Bridge`] a checkpoint leaves for the fsyncs that run beside its write phase.
//!
//! Only fsync, writeback, truncate and the checkpoint touch the state, each for a short,
//! I/O-free critical section. A block that leaves the current mapping and is in no
//! checkpoint tree goes to `garbage`, to be made invalid at the next gated moment; a lock-free
//! count of mapped blocks is republished by each guard as it drops.

use crate::format::node::NEW_ADDR;
use crate::mem::cowmap::CowMap;
use crate::mem::pages::CacheStats;
use crate::mem::reserve::Reserved;
use crate::node::{BlockMap, InodeTree};
use crate::sync::rank::{Mutex, MutexGuard, Rank};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Where an mnode's data lives on disk. Only fsync, writeback, truncate and the checkpoint
/// touch it, each holding the lock for a short, I/O-free critical section.
pub struct DiskState {
    /// The node tree of the last checkpoint (empty if the inode was never checkpointed).
    pub tree: Option<InodeTree>,
    /// The data mapping that tree records.
    pub tree_map: BlockMap,
    /// The current mapping: `tree_map` plus blocks written by fsync or writeback since.
    /// Copy-on-write, so that the checkpoint's snapshot of it is O(1) (`mem::cowmap`).
    pub cur_map: CowMap,
    /// Blocks written by writeback, in `cur_map` but not yet in any journal record:
    /// logical index -> (address, crc32c).
    pub unjournaled: BTreeMap<u64, (u32, u32)>,
    /// Smallest truncation point (in blocks) not yet journaled.
    pub truncated_from: Option<u64>,
    /// Blocks that left `cur_map` and are in no checkpoint tree: invalid once the next gated
    /// moment (fsync, writeback or checkpoint) processes them.
    pub garbage: Vec<u32>,
    /// The xattr node and blocks of the checkpoint.
    pub xattr: XattrDisk,
    /// A directory's on-disk dentry layout (loaded with the directory).
    pub dentries: Option<crate::diskdir::DiskDir>,
    /// Bumped whenever a mapped block is replaced or dropped (after which it may be freed
    /// and reused): a reader that read a block outside the lock checks it is unchanged.
    pub map_gen: u64,
    /// Data blocks the cleaner asked to move: (logical index, address it saw). The next
    /// checkpoint copies each one still mapped there to a new block.
    pub relocate: Vec<(u64, u32)>,
    /// Logical blocks preallocated and not yet written: each maps to `NEW_ADDR` and no dirty
    /// page covers it (see `mem::reserve`). Every change of `cur_map` keeps this a subset of
    /// its `NEW_ADDR` entries.
    pub reserved: Reserved,
    /// What the checkpoint in progress took from this inode that no journal holds, once it
    /// has written and installed it (`Engine::install_inode`): journaled by the inode's first
    /// fsync before that checkpoint is durable, so recovery from the previous one is complete.
    pub bridge: Option<Bridge>,
}

/// A captured inode's state at a checkpoint's snapshot beyond what the journal holds, for
/// fsyncs during that checkpoint's write phase (docs/ARCHITECTURE.md, "Checkpoints beside
/// fsync"). Its records carry the snapshot's stamp: replay on top of the previous checkpoint
/// applies them before everything written after the snapshot; on top of this checkpoint, which
/// holds them, it skips them.
pub struct Bridge {
    /// The checkpoint (sequence number) that captured the inode.
    pub seq: u64,
    /// The checkpoint's stamp.
    pub stamp: crate::journal::Stamp,
    /// The attributes at the snapshot.
    pub attr: crate::journal::InodeAttr,
    /// A truncation not journaled before the snapshot.
    pub truncated_from: Option<u64>,
    /// Writeback's unjournaled blocks at the snapshot: index -> (address, crc32c).
    pub blocks: BTreeMap<u64, (u32, u32)>,
    /// The snapshot's dirty pages and the blocks the checkpoint wrote them to (their crc is
    /// computed only if an fsync journals them).
    pub pages: Vec<(u64, u32, crate::mem::pages::PageBuf)>,
    /// Extended attributes changed and not journaled at the snapshot: name -> value (None:
    /// removed).
    pub xattrs: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// An fsync journaled it already (one transaction suffices: fsyncs of an inode are
    /// serialized, and each flushes after the previous one's blocks were written).
    pub journaled: bool,
}

impl Bridge {
    /// The bridge's records: the truncation first, then the attributes, the xattrs and the
    /// mapping (pages over the writeback blocks they superseded).
    pub fn records(&self, ino: u32) -> Vec<crate::journal::Record> {
        use crate::journal::Record;
        let stamp = self.stamp;
        let mut out = Vec::new();
        if let Some(from) = self.truncated_from {
            out.push(Record::Truncate { stamp, ino, from_block: from });
        }
        out.push(Record::SetAttr { stamp, ino, attr: self.attr });
        for (name, v) in &self.xattrs {
            out.push(match v {
                Some(value) => Record::SetXattr { stamp, ino, name: name.clone(), value: value.clone() },
                None => Record::RemoveXattr { stamp, ino, name: name.clone() },
            });
        }
        let mut map = self.blocks.clone();
        for (idx, addr, buf) in &self.pages {
            map.insert(*idx, (*addr, crc32c::crc32c(&buf[..])));
        }
        out.extend(Record::map_runs(ino, stamp, &map));
        out
    }
}

impl DiskState {
    /// An empty state whose reservations count toward `stats.reserved_blocks`.
    pub fn new(stats: Arc<CacheStats>) -> DiskState {
        DiskState {
            tree: None,
            tree_map: BlockMap::new(),
            cur_map: CowMap::new(),
            unjournaled: BTreeMap::new(),
            truncated_from: None,
            garbage: Vec::new(),
            xattr: XattrDisk::default(),
            dentries: None,
            map_gen: 0,
            relocate: Vec::new(),
            reserved: Reserved::new(stats),
            bridge: None,
        }
    }

    /// Points logical block `idx` at `addr` (0: hole; `NEW_ADDR`: unwritten, reserved). The
    /// replaced block is garbage unless the checkpoint tree still holds it (then the next
    /// checkpoint drops it); a reservation it held is given back (a block written there draws
    /// on it, a hole drops it).
    pub fn remap(&mut self, idx: u64, addr: u32) {
        self.map_gen += 1;
        self.reserved.remove(idx);
        let old = if addr == 0 { self.cur_map.remove(&idx) } else { self.cur_map.insert(idx, addr) };
        if addr == NEW_ADDR {
            self.reserved.insert(idx);
        }
        if let Some(old) = old {
            self.forget_block(idx, old);
        }
    }

    /// fallocate of a block that has no mapping: unwritten and reserved, journaled by the next
    /// fsync. The caller checked that no page covers it.
    pub fn preallocate(&mut self, idx: u64) {
        debug_assert!(!self.cur_map.contains_key(&idx));
        self.map_gen += 1;
        self.cur_map.insert(idx, NEW_ADDR);
        self.reserved.insert(idx);
        self.unjournaled.insert(idx, (NEW_ADDR, 0));
    }

    /// Zero range of a whole block whose page the caller dropped: unwritten and reserved,
    /// whatever it held, and journaled (so that replay also drops a page an earlier fsync
    /// logged inline). Nothing changes for a block that is unwritten already.
    pub fn unwrite(&mut self, idx: u64) {
        if self.reserved.contains(idx) {
            debug_assert_eq!(self.cur_map.get(&idx), Some(&NEW_ADDR));
            return;
        }
        self.remap(idx, NEW_ADDR);
        self.unjournaled.insert(idx, (NEW_ADDR, 0));
    }

    /// A write reaches block `idx`: if it was reserved, the reservation passes to the dirty
    /// page the caller creates now (under this lock). Returns whether it was reserved (the
    /// page's old bytes are zeros then).
    pub fn draw(&mut self, idx: u64) -> bool {
        let drawn = self.reserved.remove(idx);
        debug_assert!(!drawn || self.cur_map.get(&idx) == Some(&NEW_ADDR));
        drawn
    }

    /// Drops every mapping at or after `from`, and returns them: a large file's are freed by
    /// the caller after the pass-through semaphore (as `PageMap::truncate`'s pages).
    pub fn truncate(&mut self, from: u64) -> CowMap {
        self.map_gen += 1;
        self.reserved.remove_from(from);
        let gone = self.cur_map.split_off(&from);
        // One merged walk of the two sorted maps, not a tree search per block (`forget_block`):
        // 16,384 searches were a millisecond under the semaphore for a 64 MiB file.
        let mut tree = self.tree_map.range(from..).peekable();
        let garbage_before = self.garbage.len();
        for (&idx, &addr) in gone.iter() {
            while tree.next_if(|&(&t, _)| t < idx).is_some() {}
            let in_tree = tree.peek().is_some_and(|&(&t, &a)| t == idx && a == addr);
            if !in_tree && addr != NEW_ADDR {
                self.garbage.push(addr);
            }
        }
        debug_assert!(self.garbage.len() - garbage_before <= gone.len());
        debug_assert!(self.cur_map.range(from..).next().is_none());
        drop(self.unjournaled.split_off(&from));
        self.truncated_from = Some(self.truncated_from.map_or(from, |t| t.min(from)));
        gone
    }

    fn forget_block(&mut self, idx: u64, addr: u32) {
        let in_tree = self.tree_map.get(&idx) == Some(&addr);
        if !in_tree && addr != NEW_ADDR {
            self.garbage.push(addr);
        }
    }
}

/// An inode's [`DiskState`] behind its mutex, with the number of mapped blocks mirrored in an
/// atomic: stat's `st_blocks` of a file with nothing dirty reads it without the lock that
/// fsync, writeback and the checkpoint take.
///
/// Invariant: whenever the mutex is free, `mapped == cur_map.len()`. Every guard publishes it
/// as it drops, still holding the mutex (a store only when the count changed).
pub struct DiskLock {
    inner: Mutex<DiskState>,
    mapped: AtomicU64,
}

/// A held [`DiskLock`].
pub struct DiskGuard<'a> {
    guard: MutexGuard<'a, DiskState>,
    mapped: &'a AtomicU64,
}

impl DiskLock {
    pub fn new(d: DiskState) -> DiskLock {
        let mapped = AtomicU64::new(d.cur_map.len() as u64);
        DiskLock { inner: Mutex::new(Rank::Disk, d), mapped }
    }

    pub fn lock(&self) -> DiskGuard<'_> {
        DiskGuard { guard: self.inner.lock(), mapped: &self.mapped }
    }

    /// Blocks in the current mapping as of the last unlock (lock-free).
    pub fn mapped_blocks(&self) -> u64 {
        self.mapped.load(Ordering::Acquire)
    }
}

impl std::ops::Deref for DiskGuard<'_> {
    type Target = DiskState;
    fn deref(&self) -> &DiskState {
        &self.guard
    }
}

impl std::ops::DerefMut for DiskGuard<'_> {
    fn deref_mut(&mut self) -> &mut DiskState {
        &mut self.guard
    }
}

impl Drop for DiskGuard<'_> {
    fn drop(&mut self) {
        let n = self.guard.cur_map.len() as u64;
        if self.mapped.load(Ordering::Relaxed) != n {
            self.mapped.store(n, Ordering::Release);
        }
    }
}

/// Where an inode's xattrs live in the checkpoint (`format::xattr`).
#[derive(Default)]
pub struct XattrDisk {
    /// Node id of the xattr node (0: none).
    pub nid: u32,
    /// The xattr blocks it lists, in stream order (empty: the set is inline in the node).
    pub blocks: Vec<u32>,
    /// The stream those blocks hold, so that the next checkpoint rewrites only the blocks
    /// whose bytes changed.
    pub stream: Vec<u8>,
    /// Blocks the cleaner asked to move: (index, address it saw). The next checkpoint that
    /// writes the set copies each one still there.
    pub relocate: Vec<(u32, u32)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn truncate_makes_garbage_of_exactly_the_blocks_no_tree_holds() {
        let mut d = DiskState::new(Arc::new(CacheStats::default()));
        // The checkpoint tree holds blocks 0..8 at 100+i; the current mapping replaced the odd
        // ones past 4 (fsync), and added 8..12 (journal only) and an unwritten 12.
        for i in 0..8u64 {
            d.tree_map.insert(i, 100 + i as u32);
            d.cur_map.insert(i, 100 + i as u32);
        }
        for i in (5..8u64).step_by(2) {
            d.cur_map.insert(i, 200 + i as u32);
        }
        for i in 8..12u64 {
            d.cur_map.insert(i, 300 + i as u32);
        }
        d.preallocate(12);
        let gen = d.map_gen;
        let gone = d.truncate(4);
        assert_eq!(gone.iter().map(|(&i, _)| i).collect::<Vec<_>>(), (4..13).collect::<Vec<_>>());
        let mut garbage = d.garbage.clone();
        garbage.sort_unstable();
        // Tree blocks (4, 6) die with the next tree; the unwritten one has no block.
        assert_eq!(garbage, vec![205, 207, 308, 309, 310, 311]);
        assert_eq!(d.cur_map.len(), 4);
        assert!(d.unjournaled.is_empty(), "the preallocation's record went with it");
        assert_eq!(d.truncated_from, Some(4));
        assert!(d.map_gen > gen);
        assert!(!d.reserved.contains(12));
    }

    /// Threads remap and truncate blocks under `disk` while others read the lock-free count:
    /// every count read is one the mapping had, and once all guards are gone it is the
    /// mapping's length.
    #[test]
    fn mapped_block_mirror_matches_the_mapping_after_every_unlock() {
        let d = DiskLock::new(DiskState::new(Arc::new(CacheStats::default())));
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    assert!(d.mapped_blocks() <= 4 * 256, "more blocks than ever mapped");
                    reads += 1;
                }
                reads
            });
            let writers: Vec<_> = (0..4u64)
                .map(|t| {
                    let d = &d;
                    s.spawn(move || {
                        for round in 0..200u64 {
                            let mut g = d.lock();
                            for i in 0..256 {
                                g.remap(t * 256 + i, (round * 1000 + i) as u32 + 1);
                            }
                            drop(g);
                            assert!(d.mapped_blocks() >= 256 || t != 0 || round == 0);
                            if round % 3 == 0 {
                                let mut g = d.lock();
                                for i in 0..256 {
                                    g.remap(t * 256 + i, 0);
                                }
                            }
                        }
                    })
                })
                .collect();
            writers.into_iter().for_each(|w| w.join().unwrap());
            stop.store(true, Ordering::Relaxed);
            assert!(reader.join().unwrap() > 0);
        });
        assert_eq!(d.mapped_blocks(), d.lock().cur_map.len() as u64);
        assert_eq!(d.mapped_blocks(), 4 * 256, "round 199 left every thread's blocks mapped");
    }
}
