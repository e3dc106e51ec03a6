//! File pages in memory: a sparse, sharded map from page index to a 4 KiB buffer.
//!
//! Writers to different pages of one file lock different shards (page index modulo the shard
//! count), so disjoint ranges written in parallel rarely meet; byte-level exclusion between
//! overlapping writers is the range lock's job, not this map's. Buffers are shared with
//! copy-on-write (`Arc::make_mut`): fsync and the checkpoint take a reference to a dirty page and
//! write it out while a writer that arrives meanwhile copies the page instead of waiting.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

pub const PAGE_SIZE: usize = 4096;
const SHARDS: usize = 16;

/// One page's bytes.
pub type PageBuf = Arc<[u8; PAGE_SIZE]>;

/// A cached page.
#[derive(Clone)]
pub struct Page {
    pub data: PageBuf,
    /// Changed since it was last written to the device.
    pub dirty: bool,
    /// Taken by fsync, writeback or a checkpoint whose new block address is not installed yet:
    /// the device does not hold this data where the mapping says, so it must stay cached.
    pub in_flight: bool,
}

/// Bytes cached and dirty across every file, for the cache limit.
#[derive(Default)]
pub struct CacheStats {
    pub cached_pages: AtomicI64,
    pub dirty_pages: AtomicI64,
}

/// The pages of one file.
pub struct PageMap {
    shards: Box<[Mutex<HashMap<u64, Page>>]>,
    dirty: AtomicU64,
    stats: Arc<CacheStats>,
}

impl PageMap {
    pub fn new(stats: Arc<CacheStats>) -> PageMap {
        PageMap {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            dirty: AtomicU64::new(0),
            stats,
        }
    }

    fn shard(&self, idx: u64) -> &Mutex<HashMap<u64, Page>> {
        &self.shards[(idx % SHARDS as u64) as usize]
    }

    /// The cached page `idx`, if any.
    pub fn get(&self, idx: u64) -> Option<PageBuf> {
        self.shard(idx).lock().get(&idx).map(|p| p.data.clone())
    }

    /// Number of dirty pages of this file.
    pub fn dirty_count(&self) -> u64 {
        self.dirty.load(Ordering::Relaxed)
    }

    /// Writes `bytes` at `off` within page `idx`. If the page is not cached, `load` supplies its
    /// current contents (zeros for a hole; the device block otherwise) unless the write covers
    /// the whole page.
    pub fn write<E>(
        &self,
        idx: u64,
        off: usize,
        bytes: &[u8],
        load: impl FnOnce() -> Result<[u8; PAGE_SIZE], E>,
    ) -> Result<(), E> {
        debug_assert!(off + bytes.len() <= PAGE_SIZE && !bytes.is_empty());
        let mut shard = self.shard(idx).lock();
        let page = match shard.entry(idx) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                // Loading under the shard lock keeps two writers of one page from loading twice;
                // the read is of a block this file already owns, so it cannot wait on this file.
                let base = if off == 0 && bytes.len() == PAGE_SIZE { [0u8; PAGE_SIZE] } else { load()? };
                self.stats.cached_pages.fetch_add(1, Ordering::Relaxed);
                v.insert(Page { data: Arc::new(base), dirty: false, in_flight: false })
            }
        };
        Arc::make_mut(&mut page.data)[off..off + bytes.len()].copy_from_slice(bytes);
        if !page.dirty {
            page.dirty = true;
            self.dirty.fetch_add(1, Ordering::Relaxed);
            self.stats.dirty_pages.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Caches a clean page read from the device (no effect if the page is cached already).
    pub fn insert_clean(&self, idx: u64, data: [u8; PAGE_SIZE]) -> PageBuf {
        let mut shard = self.shard(idx).lock();
        let p = shard.entry(idx).or_insert_with(|| {
            self.stats.cached_pages.fetch_add(1, Ordering::Relaxed);
            Page { data: Arc::new(data), dirty: false, in_flight: false }
        });
        p.data.clone()
    }

    /// Every dirty page (index order), each marked clean and in flight. A writer that changes
    /// one of them afterwards copies it and marks it dirty again; the caller owns the snapshot
    /// it got, and calls [`PageMap::settle`] once the page's new address is known.
    pub fn take_dirty(&self) -> Vec<(u64, PageBuf)> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let mut s = s.lock();
            for (&idx, p) in s.iter_mut().filter(|(_, p)| p.dirty) {
                p.dirty = false;
                p.in_flight = true;
                out.push((idx, p.data.clone()));
            }
        }
        let n = out.len() as u64;
        self.dirty.fetch_sub(n, Ordering::Relaxed);
        self.stats.dirty_pages.fetch_sub(n as i64, Ordering::Relaxed);
        out.sort_unstable_by_key(|p| p.0);
        out
    }

    /// Whether page `idx` is cached (a truncate or punch removes it).
    pub fn is_cached(&self, idx: u64) -> bool {
        self.shard(idx).lock().contains_key(&idx)
    }

    /// Ends page `idx`'s flight; returns whether the page still exists (a truncate or punch
    /// removed it otherwise, and its new block must not be mapped).
    pub fn settle(&self, idx: u64) -> bool {
        match self.shard(idx).lock().get_mut(&idx) {
            Some(p) => {
                p.in_flight = false;
                true
            }
            None => false,
        }
    }

    /// Puts back pages whose write failed so that a later fsync retries them; a page changed
    /// since is dirty already and keeps its newer contents.
    pub fn restore_dirty(&self, pages: &[(u64, PageBuf)]) {
        for (idx, buf) in pages {
            let mut s = self.shard(*idx).lock();
            match s.get_mut(idx) {
                Some(p) if !p.dirty => {
                    p.dirty = true;
                    p.in_flight = false;
                    p.data = buf.clone();
                    self.dirty.fetch_add(1, Ordering::Relaxed);
                    self.stats.dirty_pages.fetch_add(1, Ordering::Relaxed);
                }
                Some(p) => p.in_flight = false,
                None => {
                    s.insert(*idx, Page { data: buf.clone(), dirty: true, in_flight: false });
                    self.dirty.fetch_add(1, Ordering::Relaxed);
                    self.stats.dirty_pages.fetch_add(1, Ordering::Relaxed);
                    self.stats.cached_pages.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Drops pages at or after `from` (truncate), dirty or not.
    pub fn truncate(&self, from: u64) {
        for s in self.shards.iter() {
            let mut s = s.lock();
            let gone: Vec<u64> = s.keys().copied().filter(|&i| i >= from).collect();
            for i in gone {
                let p = s.remove(&i).expect("listed");
                self.forget(&p);
            }
        }
    }

    /// Drops page `idx`, dirty or not (a punched hole).
    pub fn truncate_one(&self, idx: u64) {
        if let Some(p) = self.shard(idx).lock().remove(&idx) {
            self.forget(&p);
        }
    }

    /// Dirty pages for which `mapped` is false (not yet given a block).
    pub fn dirty_unmapped(&self, mapped: impl Fn(u64) -> bool) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().iter().filter(|(&i, p)| p.dirty && !mapped(i)).count() as u64)
            .sum()
    }

    /// Zeroes bytes [off, PAGE_SIZE) of page `idx` if it is cached (the tail of a truncated page).
    pub fn zero_tail(&self, idx: u64, off: usize) {
        let mut s = self.shard(idx).lock();
        if let Some(p) = s.get_mut(&idx) {
            Arc::make_mut(&mut p.data)[off..].fill(0);
            if !p.dirty {
                p.dirty = true;
                self.dirty.fetch_add(1, Ordering::Relaxed);
                self.stats.dirty_pages.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Drops clean pages to free memory; returns how many were dropped.
    pub fn evict_clean(&self, max: usize) -> usize {
        let mut n = 0;
        for s in self.shards.iter() {
            let mut s = s.lock();
            let clean: Vec<u64> =
                s.iter().filter(|(_, p)| !p.dirty && !p.in_flight).map(|(&i, _)| i).take(max - n).collect();
            for i in clean {
                let p = s.remove(&i).expect("listed");
                self.forget(&p);
                n += 1;
            }
            if n >= max {
                break;
            }
        }
        n
    }

    fn forget(&self, p: &Page) {
        self.stats.cached_pages.fetch_sub(1, Ordering::Relaxed);
        if p.dirty {
            self.dirty.fetch_sub(1, Ordering::Relaxed);
            self.stats.dirty_pages.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for PageMap {
    fn drop(&mut self) {
        for s in self.shards.iter() {
            for p in s.lock().values() {
                self.forget(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zero() -> Result<[u8; PAGE_SIZE], ()> {
        Ok([0; PAGE_SIZE])
    }

    #[test]
    fn copy_on_write_keeps_snapshots_stable() {
        let stats = Arc::new(CacheStats::default());
        let m = PageMap::new(stats.clone());
        m.write(3, 10, b"hello", zero).unwrap();
        let snap = m.take_dirty();
        assert_eq!(snap.len(), 1);
        assert_eq!(m.dirty_count(), 0);
        m.write(3, 10, b"HELLO", zero).unwrap();
        assert_eq!(&snap[0].1[10..15], b"hello", "snapshot must not see the later write");
        assert_eq!(&m.get(3).unwrap()[10..15], b"HELLO");
        assert_eq!(m.dirty_count(), 1);
        assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 1);
        m.truncate(0);
        assert_eq!(stats.cached_pages.load(Ordering::Relaxed), 0);
        assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn partial_write_loads_base_and_full_write_does_not() {
        let m = PageMap::new(Arc::default());
        m.write(0, 0, &[1u8; PAGE_SIZE], || -> Result<_, ()> { panic!("full page needs no load") }).unwrap();
        let r: Result<(), &str> = m.write(1, 5, b"x", || Err("load failed"));
        assert_eq!(r, Err("load failed"));
        assert!(m.get(1).is_none());
        m.write(1, 5, b"x", || -> Result<_, ()> { Ok([7u8; PAGE_SIZE]) }).unwrap();
        let p = m.get(1).unwrap();
        assert_eq!((p[4], p[5], p[6]), (7, b'x', 7));
    }

    #[test]
    fn parallel_writers_of_disjoint_pages() {
        let m = Arc::new(PageMap::new(Arc::default()));
        let hs: Vec<_> = (0..8u64)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for i in 0..500u64 {
                        let idx = i * 8 + t;
                        m.write(idx, 0, &[t as u8 + 1; PAGE_SIZE], zero).unwrap();
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(m.dirty_count(), 4000);
        for idx in 0..4000u64 {
            assert_eq!(m.get(idx).unwrap()[100], (idx % 8) as u8 + 1);
        }
        assert_eq!(m.evict_clean(10), 0, "dirty pages are never evicted");
        let taken = m.take_dirty();
        assert_eq!(m.evict_clean(10), 0, "pages in flight are never evicted");
        for (idx, _) in &taken {
            assert!(m.settle(*idx));
        }
        assert_eq!(m.evict_clean(10), 10);
        m.truncate(0);
        assert!(!m.settle(5), "a truncated page is gone");
    }
}
