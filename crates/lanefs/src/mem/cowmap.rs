//! A file's current block mapping (logical block -> address), copy-on-write in chunks, so that a
//! checkpoint's snapshot of it is O(1) however large the file is.
//!
//! The checkpoint copies every dirty inode's mapping while every operation waits (the exclusive
//! phase, `flush::checkpoint`); a plain `BTreeMap` copy there cost milliseconds for a file of a
//! few hundred MiB. Here the mapping is a shared (`Arc`) ordered map of chunks, each a shared,
//! sorted vector of the entries of [`CHUNK`] consecutive logical blocks. A clone shares
//! everything; the first change after a clone copies the chunk index (one entry per chunk) and
//! the one chunk it changes (at most [`CHUNK`] entries), and later changes of that chunk are in
//! place again. The cost of a snapshot thus moves to the first writes after it, spread over the
//! chunks written, and outside every lock but the file's `disk` lock.
//!
//! Invariants: no chunk is empty; every entry of the chunk keyed `k` has `idx >> CHUNK_BITS ==
//! k`; entries of a chunk are sorted by index, without duplicates; `len` is the entry count.

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

/// log2 of the logical blocks one chunk covers: 4 MiB of file, at most 12 KiB of entries to copy.
const CHUNK_BITS: u32 = 10;
/// Logical blocks one chunk covers.
#[cfg(test)]
pub const CHUNK: u64 = 1 << CHUNK_BITS;

type Chunk = Arc<Vec<(u64, u32)>>;

/// See the module documentation. Iterates like a `BTreeMap<u64, u32>`, in index order.
#[derive(Clone, Default)]
pub struct CowMap {
    /// None while the map is empty and has never held an entry since it was made (or taken):
    /// every mnode starts with one, and most (the files a mail spool or a namespace benchmark
    /// creates and deletes) never map a block, so an empty map allocates nothing, and a dead
    /// inode's map costs its checkpoint nothing to free.
    chunks: Option<Arc<BTreeMap<u64, Chunk>>>,
    len: usize,
}

/// The chunk index of a map that never held an entry.
static NO_CHUNKS: BTreeMap<u64, Chunk> = BTreeMap::new();

fn chunk_of(idx: u64) -> u64 {
    idx >> CHUNK_BITS
}

impl CowMap {
    pub fn new() -> CowMap {
        CowMap::default()
    }

    /// The chunk index, read-only.
    #[inline]
    fn index(&self) -> &BTreeMap<u64, Chunk> {
        self.chunks.as_deref().unwrap_or(&NO_CHUNKS)
    }

    /// The chunk index, unshared (made on the first change, copied if a clone shares it).
    fn index_mut(&mut self) -> &mut BTreeMap<u64, Chunk> {
        Arc::make_mut(self.chunks.get_or_insert_with(Default::default))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, idx: &u64) -> Option<&u32> {
        let c = self.index().get(&chunk_of(*idx))?;
        c.binary_search_by_key(idx, |e| e.0).ok().map(|i| &c[i].1)
    }

    pub fn contains_key(&self, idx: &u64) -> bool {
        self.get(idx).is_some()
    }

    /// Maps `idx` to `addr`; returns what it mapped to before.
    pub fn insert(&mut self, idx: u64, addr: u32) -> Option<u32> {
        let c = Arc::make_mut(self.index_mut().entry(chunk_of(idx)).or_default());
        match c.binary_search_by_key(&idx, |e| e.0) {
            Ok(i) => Some(std::mem::replace(&mut c[i].1, addr)),
            Err(i) => {
                c.insert(i, (idx, addr));
                self.len += 1;
                None
            }
        }
    }

    /// Drops `idx`; returns what it mapped to. Copies nothing when it is not mapped.
    pub fn remove(&mut self, idx: &u64) -> Option<u32> {
        let k = chunk_of(*idx);
        let i = self.index().get(&k)?.binary_search_by_key(idx, |e| e.0).ok()?;
        let chunks = self.index_mut();
        let c = Arc::make_mut(chunks.get_mut(&k).expect("found above"));
        let (_, a) = c.remove(i);
        if c.is_empty() {
            chunks.remove(&k);
        }
        self.len -= 1;
        Some(a)
    }

    /// Splits off every entry at or after `from` and returns them.
    pub fn split_off(&mut self, from: &u64) -> CowMap {
        let k = chunk_of(*from);
        if self.chunks.is_none() {
            return CowMap::new();
        }
        let mut tail = self.index_mut().split_off(&k);
        // The chunk holding `from` may hold earlier entries too: those stay.
        if let Some(first) = tail.get_mut(&k) {
            let cut = first.partition_point(|e| e.0 < *from);
            if cut > 0 {
                let c = Arc::make_mut(first);
                let keep: Vec<(u64, u32)> = c.drain(..cut).collect();
                if c.is_empty() {
                    tail.remove(&k);
                }
                self.index_mut().insert(k, Arc::new(keep));
            }
        }
        let moved: usize = tail.values().map(|c| c.len()).sum();
        self.len -= moved;
        CowMap { chunks: Some(Arc::new(tail)), len: moved }
    }

    /// Entries in index order.
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &u32)> + '_ {
        self.index().values().flat_map(|c| c.iter().map(|(k, v)| (k, v)))
    }

    pub fn values(&self) -> impl Iterator<Item = &u32> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// Entries whose index lies in `r`, in index order.
    pub fn range<R: RangeBounds<u64>>(&self, r: R) -> impl Iterator<Item = (&u64, &u32)> + '_ {
        let lo = match r.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        // Inclusive upper end; None: the range is empty.
        let hi = match r.end_bound() {
            Bound::Included(&e) => Some(e),
            Bound::Excluded(&e) => e.checked_sub(1),
            Bound::Unbounded => Some(u64::MAX),
        };
        let span = match (lo, hi) {
            (Some(lo), Some(hi)) if lo <= hi => Some((lo, hi)),
            _ => None,
        };
        let chunks = span.map(|(lo, hi)| self.index().range(chunk_of(lo)..=chunk_of(hi)));
        chunks.into_iter().flatten().flat_map(move |(_, c)| {
            let (lo, hi) = span.expect("chunks only with a span");
            let a = c.partition_point(|e| e.0 < lo);
            let b = c.partition_point(|e| e.0 <= hi);
            c[a..b].iter().map(|(k, v)| (k, v))
        })
    }

    /// A plain ordered copy (O(n)): what the node tree writer takes.
    pub fn to_btree(&self) -> BTreeMap<u64, u32> {
        self.iter().map(|(&k, &v)| (k, v)).collect()
    }

    /// Whether `self` and `other` share their whole chunk index (a clone not changed since).
    #[cfg(test)]
    fn shares_with(&self, other: &CowMap) -> bool {
        match (&self.chunks, &other.chunks) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

impl FromIterator<(u64, u32)> for CowMap {
    fn from_iter<I: IntoIterator<Item = (u64, u32)>>(it: I) -> CowMap {
        let mut m = CowMap::new();
        for (k, v) in it {
            m.insert(k, v);
        }
        m
    }
}

impl From<&BTreeMap<u64, u32>> for CowMap {
    fn from(b: &BTreeMap<u64, u32>) -> CowMap {
        b.iter().map(|(&k, &v)| (k, v)).collect()
    }
}

impl<'a> IntoIterator for &'a CowMap {
    type Item = (&'a u64, &'a u32);
    type IntoIter = Box<dyn Iterator<Item = (&'a u64, &'a u32)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl IntoIterator for CowMap {
    type Item = (u64, u32);
    type IntoIter = std::vec::IntoIter<(u64, u32)>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>().into_iter()
    }
}

impl PartialEq for CowMap {
    fn eq(&self, other: &CowMap) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl std::fmt::Debug for CowMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        SplitOff(u64),
        Snapshot,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Indexes around a few chunk boundaries, so that chunks fill, empty and split.
        let idx = prop_oneof![0..3 * CHUNK, (5 * CHUNK - 8)..(5 * CHUNK + 8), Just(u64::MAX)];
        prop_oneof![
            6 => (idx.clone(), any::<u32>()).prop_map(|(i, a)| Op::Insert(i, a)),
            3 => idx.clone().prop_map(Op::Remove),
            1 => idx.prop_map(Op::SplitOff),
            1 => Just(Op::Snapshot),
        ]
    }

    fn same(m: &CowMap, b: &BTreeMap<u64, u32>) {
        assert_eq!(m.len(), b.len());
        assert!(m.iter().eq(b.iter()));
        for (lo, hi) in [(0, 10), (CHUNK - 3, CHUNK + 3), (2 * CHUNK, 5 * CHUNK), (5 * CHUNK, u64::MAX)] {
            assert!(m.range(lo..=hi).eq(b.range(lo..=hi)), "range {lo}..={hi}");
            assert!(m.range(lo..hi).eq(b.range(lo..hi)), "range {lo}..{hi}");
        }
        assert!(m.range(7..).eq(b.range(7..)));
        assert!(m.range(..7).eq(b.range(..7)));
        assert_eq!(m.range(0..0).count(), 0);
    }

    proptest! {
        /// Every operation agrees with a BTreeMap, and snapshots (clones) taken along the way
        /// keep their contents however the original changes afterwards.
        #[test]
        fn agrees_with_a_btreemap_and_snapshots_stay_put(ops in proptest::collection::vec(op(), 1..300)) {
            let (mut m, mut b) = (CowMap::new(), BTreeMap::new());
            let mut snaps: Vec<(CowMap, BTreeMap<u64, u32>)> = Vec::new();
            for o in ops {
                match o {
                    Op::Insert(i, a) => prop_assert_eq!(m.insert(i, a), b.insert(i, a)),
                    Op::Remove(i) => prop_assert_eq!(m.remove(&i), b.remove(&i)),
                    Op::SplitOff(i) => {
                        let (mt, bt) = (m.split_off(&i), b.split_off(&i));
                        same(&mt, &bt);
                    }
                    Op::Snapshot => {
                        let s = m.clone();
                        prop_assert!(s.shares_with(&m), "a clone copies nothing");
                        snaps.push((s, b.clone()));
                    }
                }
                for i in [0, CHUNK - 1, CHUNK, 5 * CHUNK, u64::MAX] {
                    prop_assert_eq!(m.get(&i), b.get(&i));
                    prop_assert_eq!(m.contains_key(&i), b.contains_key(&i));
                }
            }
            same(&m, &b);
            for (s, sb) in &snaps {
                same(s, sb);
            }
            prop_assert_eq!(m.to_btree(), b.clone());
            prop_assert_eq!(m.into_iter().collect::<Vec<_>>(), b.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn an_empty_map_allocates_nothing_until_its_first_entry() {
        let mut m = CowMap::new();
        assert!(m.chunks.is_none());
        assert_eq!(m.remove(&3), None);
        assert!(m.split_off(&0).chunks.is_none());
        assert!(m.chunks.is_none(), "reading or removing from an empty map allocates nothing");
        m.insert(3, 4);
        assert_eq!(m.get(&3), Some(&4));
        assert_eq!(m.remove(&3), Some(4));
        assert!(m.is_empty());
        assert!(std::mem::take(&mut m).chunks.is_some());
        assert!(m.chunks.is_none(), "a taken map starts empty again");
    }

    #[test]
    fn a_change_after_a_snapshot_copies_one_chunk() {
        let mut m: CowMap = (0..10 * CHUNK).map(|i| (i, i as u32 + 1)).collect();
        let snap = m.clone();
        m.insert(3 * CHUNK + 5, 7);
        let shared = m.index().iter().filter(|(k, c)| Arc::ptr_eq(c, &snap.index()[k])).count();
        assert_eq!(shared, 9, "only the changed chunk was copied");
        assert_eq!(snap.get(&(3 * CHUNK + 5)), Some(&(3 * CHUNK as u32 + 6)));
        assert_eq!(m.get(&(3 * CHUNK + 5)), Some(&7));
    }
}
