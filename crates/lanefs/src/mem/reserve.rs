//! Preallocation: the space fallocate promises a file, and how a log-structured file system
//! keeps that promise.
//!
//! lanefs never writes in place, so "allocating" a block ahead of its data cannot mean picking
//! its address: the address is chosen when the data is written, in whatever segment the log is
//! filling then. A preallocated block is instead a *promise*: the file maps the logical block to
//! [`NEW_ADDR`] (allocated, unwritten, reads as zeros) and the block is counted as reserved. The
//! file system then keeps, at every moment,
//!
//! ```text
//!   valid blocks + blocks dirty data will take + reserved blocks <= user blocks
//! ```
//!
//! (`Engine::space_left`): statfs reports what is left after the reserved blocks, and an
//! ordinary writer (one that needs a new block) is admitted only while the inequality holds, so
//! no other file can take the space. A write into a reserved block *draws* on the promise: the
//! block leaves the reserved count and joins the dirty pages in one step, the sum is unchanged,
//! and the write needs no space of its own, however full the file system is otherwise. Writing
//! it again later is an overwrite, which needs a free block only until the next checkpoint (the
//! old copy dies with it). Truncate, punch and zero range over a reserved block, and the
//! deletion of its file, give the promise back.
//!
//! Why the cleaner and the checkpoint need nothing more: "user blocks" is the main area less
//! the cleaner's reserve and one open segment per log of every lane (`Geometry::user_blocks`).
//! Reservations are counted against user blocks only, never against that reserve, so the
//! cleaner always has its own free segments to move blocks with, and since valid plus reserved
//! blocks never exceed the user blocks, the segments hold enough invalid or free blocks for
//! every reserved block to be written once cleaning has gathered them into free segments.
//!
//! Persistence. The promise is file state and lives where the file's mapping lives: NEW_ADDR
//! entries in the inode's node tree (checkpoints) and in `Map` records (fsync journals), as
//! before. What is new is the count: a checkpoint records the number of reserved blocks of its
//! snapshot (`Checkpoint::reserved_blocks`), mount starts from it, and recovery adjusts it as it
//! replays the journals, because every replayed change goes through [`Reserved`] as a live
//! change does. Invariant at every checkpoint snapshot (every operation drained, fsync and
//! writeback held at the gate): a file's reserved blocks are exactly its NEW_ADDR entries that
//! no dirty page covers, and the snapshot writes every dirty page to a real block, so the
//! count it records equals the NEW_ADDR entries in its trees. fsck checks exactly that.
//!
//! [`NEW_ADDR`]: crate::format::node::NEW_ADDR

use super::pages::CacheStats;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One file's reserved logical blocks, as disjoint, non-adjacent ranges, and its share of the
/// file system's count (`CacheStats::reserved_blocks`), kept equal to the sum over files.
pub struct Reserved {
    /// start -> end (exclusive).
    ranges: BTreeMap<u64, u64>,
    len: u64,
    stats: Arc<CacheStats>,
}

impl Reserved {
    pub fn new(stats: Arc<CacheStats>) -> Reserved {
        Reserved { ranges: BTreeMap::new(), len: 0, stats }
    }

    /// How many blocks are reserved.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The range holding `idx`, as (start, end).
    fn find(&self, idx: u64) -> Option<(u64, u64)> {
        self.ranges.range(..=idx).next_back().map(|(&s, &e)| (s, e)).filter(|&(_, e)| idx < e)
    }

    pub fn contains(&self, idx: u64) -> bool {
        self.find(idx).is_some()
    }

    /// Reserves `idx`; false if it was reserved already.
    pub fn insert(&mut self, idx: u64) -> bool {
        if !self.insert_uncounted(idx) {
            return false;
        }
        self.stats.reserved_blocks.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Records `idx` as reserved without adding it to the file system's count, which holds it
    /// already: a file loaded from the checkpoint that counted its NEW_ADDR entries.
    pub fn adopt(&mut self, idx: u64) {
        self.insert_uncounted(idx);
    }

    fn insert_uncounted(&mut self, idx: u64) -> bool {
        if self.contains(idx) {
            return false;
        }
        let end = idx + 1;
        let mut start = idx;
        let mut stop = end;
        // Merge with a range ending at idx and one starting at idx + 1.
        if let Some((s, e)) = self.ranges.range(..idx).next_back().map(|(&s, &e)| (s, e)) {
            if e == idx {
                self.ranges.remove(&s);
                start = s;
            }
        }
        if let Some(e) = self.ranges.remove(&end) {
            stop = e;
        }
        self.ranges.insert(start, stop);
        self.len += 1;
        true
    }

    /// Gives back `idx`'s reservation; false if it had none.
    pub fn remove(&mut self, idx: u64) -> bool {
        let Some((s, e)) = self.find(idx) else { return false };
        self.ranges.remove(&s);
        if s < idx {
            self.ranges.insert(s, idx);
        }
        if idx + 1 < e {
            self.ranges.insert(idx + 1, e);
        }
        self.len -= 1;
        self.uncount(1);
        true
    }

    /// Gives back every reservation at or after `from`; returns how many.
    pub fn remove_from(&mut self, from: u64) -> u64 {
        let mut gone = 0;
        if let Some((s, e)) = self.find(from) {
            if s < from {
                self.ranges.insert(s, from);
                gone += e - from;
            }
        }
        let tail = self.ranges.split_off(&from);
        gone += tail.iter().map(|(s, e)| e - s).sum::<u64>();
        self.len -= gone;
        self.uncount(gone);
        gone
    }

    /// Gives back every reservation (the file is deleted); returns how many.
    pub fn clear(&mut self) -> u64 {
        self.remove_from(0)
    }

    /// Reserved blocks among `first..=last`.
    #[cfg(test)]
    pub fn count_in(&self, first: u64, last: u64) -> u64 {
        if last < first {
            return 0;
        }
        let mut n = 0;
        if let Some((s, e)) = self.find(first) {
            n += e.min(last + 1) - first.max(s);
        }
        use std::ops::Bound::{Excluded, Included};
        for (&s, &e) in self.ranges.range((Excluded(first), Included(last))) {
            n += e.min(last + 1) - s;
        }
        n
    }

    fn uncount(&self, n: u64) {
        if n == 0 {
            return;
        }
        // Saturating: an image written before the count existed has unwritten blocks that no
        // checkpoint counted (fsck reports it; a repair sets the count).
        let _ = self
            .stats
            .reserved_blocks
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(n)));
    }

    /// The reserved blocks, in order (tests and invariant checks).
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(|(&s, &e)| s..e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> (Reserved, Arc<CacheStats>) {
        let stats = Arc::new(CacheStats::default());
        (Reserved::new(stats.clone()), stats)
    }

    fn ranges(r: &Reserved) -> Vec<(u64, u64)> {
        r.ranges.iter().map(|(&s, &e)| (s, e)).collect()
    }

    #[test]
    fn inserts_merge_and_removes_split() {
        let (mut r, stats) = set();
        for i in [5, 7, 6, 3, 4, 10] {
            assert!(r.insert(i));
        }
        assert!(!r.insert(6), "a second reservation of one block counts once");
        assert_eq!(ranges(&r), vec![(3, 8), (10, 11)]);
        assert_eq!((r.len(), stats.reserved_blocks.load(Ordering::Relaxed)), (6, 6));
        assert!(r.remove(5));
        assert!(!r.remove(5));
        assert!(!r.remove(9));
        assert_eq!(ranges(&r), vec![(3, 5), (6, 8), (10, 11)]);
        assert_eq!(r.count_in(4, 10), 4);
        assert_eq!(r.count_in(0, 2), 0);
        assert_eq!(r.count_in(7, 7), 1);
        assert_eq!(r.remove_from(7), 2);
        assert_eq!(ranges(&r), vec![(3, 5), (6, 7)]);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![3, 4, 6]);
        assert_eq!((r.len(), stats.reserved_blocks.load(Ordering::Relaxed)), (3, 3));
        assert_eq!(r.clear(), 3);
        assert!(r.is_empty());
        assert_eq!(stats.reserved_blocks.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn adopted_blocks_are_not_counted_twice_and_the_count_never_wraps() {
        let (mut r, stats) = set();
        r.adopt(1);
        r.adopt(2);
        assert_eq!(stats.reserved_blocks.load(Ordering::Relaxed), 0);
        stats.reserved_blocks.store(1, Ordering::Relaxed);
        assert_eq!(r.clear(), 2);
        assert_eq!(stats.reserved_blocks.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn matches_a_plain_set_under_random_operations() {
        let (mut r, stats) = set();
        let mut model = std::collections::BTreeSet::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let idx = x % 64;
            match (x >> 8) % 8 {
                0..=3 => assert_eq!(r.insert(idx), model.insert(idx)),
                4..=6 => assert_eq!(r.remove(idx), model.remove(&idx)),
                _ => {
                    let gone = model.split_off(&idx).len() as u64;
                    assert_eq!(r.remove_from(idx), gone);
                }
            }
            assert_eq!(r.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
            assert_eq!(r.len(), model.len() as u64);
            assert_eq!(stats.reserved_blocks.load(Ordering::Relaxed), model.len() as u64);
            let (a, b) = (idx / 2, idx);
            assert_eq!(r.count_in(a, b), model.range(a..=b).count() as u64);
            // Ranges stay disjoint and apart (merged).
            let v = ranges(&r);
            assert!(v.windows(2).all(|w| w[0].1 < w[1].0) && v.iter().all(|(s, e)| s < e));
        }
    }
}
