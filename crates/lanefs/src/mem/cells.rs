//! File cells (Max, ATC'21): the mnode table, sharded by inode number, with lock-free reads.
//!
//! One global inode table would put every open, create and unlink on one lock and one cache line.
//! [`Cells<T>`] splits it into `N` cells (a power of two, at least four per possible CPU), each a
//! concurrent hash map (papaya) from inode number to `Arc<T>`. The cell is a pure function of the
//! inode number, so an operation on one inode touches exactly one cell.
//!
//! Readers take no lock: [`Cells::with`] pins the calling thread's epoch (a thread-local store)
//! and reads the map, so a path walk or stat writes no cache line that another thread reads or
//! writes, not even a reference count. Writers of different inodes update different buckets
//! with one compare-and-swap each; nothing a reader does delays them. A removed entry is freed
//! only once every reader pinned before the removal has unpinned, so its `T` may outlive the
//! removal by a little: nothing may rely on a removed value being dropped at once.
//!
//! Invariants:
//! - An inode number lives in exactly one cell, [`Cells::cell_of`], for the table's lifetime.
//! - `insert_if_absent` is atomic per key: concurrent callers for one inode all get the same
//!   `Arc`, and exactly one of them is told it inserted.
//! - No callback supplied by a caller runs under a lock of the table (it holds none), so
//!   callbacks may use the table freely; a callback of [`Cells::with`] keeps its thread pinned
//!   and must be short.

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crossbeam::utils::CachePadded;

/// Inode numbers are integers handed out by our own allocator, not attacker-chosen keys, so a
/// cheap integer mixer is enough and SipHash would only cost time.
#[derive(Default, Clone, Copy)]
struct InoHasher(u64);

impl Hasher for InoHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not used for u64 keys; kept total so that the hasher is correct for any key type.
        for &b in bytes {
            self.0 = mix(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = mix(self.0 ^ n);
    }
}

/// splitmix64's finaliser: every input bit affects every output bit, so both the cell index
/// (high bits) and the in-cell bucket (low bits) spread inode numbers allocated in runs.
#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What a value does when the table lets go of it. A removed value is freed only once the
/// readers pinned before its removal are gone, which may be a while (reclamation runs in
/// batches): whatever its drop would give back that others count (cached dirty pages, for a
/// dead mnode) it gives back here, at once.
pub trait Resident {
    /// Called once per removal, after the value left the table.
    fn removed(&self) {}
}

type Cell<T> = CachePadded<papaya::HashMap<u64, Arc<T>, BuildHasherDefault<InoHasher>>>;

/// Removals a thread retires before its batch goes to reclamation, for all cells of a table
/// together. Each batch costs one `membarrier` (an interrupt on every CPU the process runs on,
/// seize's heavy barrier): with seize's default of 32 per cell, dropping the dead inodes of a
/// checkpoint that followed 4096 unlinks took 6% of the checkpoint thread's samples in that
/// barrier (MWUM, 2 threads), and interrupted the workers as often. One collector per table
/// with a batch of 256 keeps the most a thread may hold back where it was (8 cells x 32 on a
/// 2-CPU machine) and barriers 8 times less often there (more on larger machines, whose
/// tables have more cells). What a removed mnode holds that others count is given back at
/// removal anyway ([`Resident::removed`]).
const RETIRE_BATCH: usize = 256;

/// The mnode table: inode number -> `Arc<T>`, sharded into cells.
pub struct Cells<T> {
    /// Every cell's map reclaims through one collector (see [`RETIRE_BATCH`]). Dropping a map
    /// on a shared collector frees every retirement pending on it, which is safe only once no
    /// thread reads any of the maps: the cells are dropped only with the whole table, which a
    /// reader borrows.
    cells: Box<[Cell<T>]>,
    /// `cells.len() - 1`; the length is a power of two.
    mask: usize,
}

impl<T: Resident + Send + Sync + 'static> Cells<T> {
    /// A table with the next power of two at or above `4 * possible_cpus()` cells.
    pub fn new() -> Self {
        Self::with_cells(4 * crate::sync::percpu::possible_cpus())
    }

    /// A table with `n` rounded up to a power of two (at least 1) cells.
    pub fn with_cells(n: usize) -> Self {
        // Cap far above any real core count; keeps the allocation bounded whatever `n` is.
        let n = n.clamp(1, 1 << 16).next_power_of_two();
        let collector = Arc::new(seize::Collector::new().batch_size(RETIRE_BATCH));
        let cells = (0..n)
            .map(|_| {
                CachePadded::new(
                    papaya::HashMap::builder()
                        .hasher(BuildHasherDefault::<InoHasher>::default())
                        .shared_collector(collector.clone())
                        .build(),
                )
            })
            .collect();
        Cells { cells, mask: n - 1 }
    }

    /// Number of cells.
    #[cfg(test)]
    pub fn cell_count(&self) -> usize {
        self.cells.len()
    }

    /// The cell that holds inode `ino`.
    #[inline]
    pub fn cell_of(&self, ino: u64) -> usize {
        // Bits 32.. of the mixed value pick the cell; the in-cell map uses the others.
        (mix(ino) >> 32) as usize & self.mask
    }

    #[inline]
    fn cell(&self, ino: u64) -> &Cell<T> {
        &self.cells[self.cell_of(ino)]
    }

    /// Runs `f` on the mnode for `ino`, if present, without a lock or a reference-count
    /// change: the path walk's and stat's way in. `f` runs pinned; keep it short.
    #[inline]
    pub fn with<R>(&self, ino: u64, f: impl FnOnce(&Arc<T>) -> R) -> Option<R> {
        self.cell(ino).pin().get(&ino).map(f)
    }

    /// The mnode for `ino`, if present (one reference-count increment; no lock).
    pub fn get(&self, ino: u64) -> Option<Arc<T>> {
        self.with(ino, Arc::clone)
    }

    /// True if `ino` is present.
    #[cfg(test)]
    pub fn contains(&self, ino: u64) -> bool {
        self.cell(ino).pin().contains_key(&ino)
    }

    /// Returns the mnode for `ino`, creating it with `make` if absent, and whether this call
    /// inserted it. Racing callers for one absent key may each run `make`, but exactly one
    /// value is inserted and every caller gets that one; keep `make` cheap.
    pub fn insert_if_absent(&self, ino: u64, make: impl FnOnce() -> T) -> (Arc<T>, bool) {
        let map = self.cell(ino).pin();
        if let Some(v) = map.get(&ino) {
            return (v.clone(), false);
        }
        match map.try_insert(ino, Arc::new(make())) {
            Ok(v) => (v.clone(), true),
            Err(e) => (e.current.clone(), false),
        }
    }

    /// Removes and returns the mnode for `ino`.
    pub fn remove(&self, ino: u64) -> Option<Arc<T>> {
        let v = self.cell(ino).pin().remove(&ino).cloned();
        if let Some(v) = &v {
            v.removed();
        }
        v
    }

    /// Removes `ino` only if it still maps to `expected` (the same allocation). For eviction:
    /// a mnode replaced since the caller looked it up is left alone.
    pub fn remove_if_same(&self, ino: u64, expected: &Arc<T>) -> bool {
        let gone =
            matches!(self.cell(ino).pin().remove_if(&ino, |_, v| Arc::ptr_eq(v, expected)), Ok(Some(_)));
        if gone {
            expected.removed();
        }
        gone
    }

    /// Calls `f` for every mnode, one cell at a time. Each cell's entries are copied out (as
    /// `Arc`s) and `f` runs unpinned, so `f` may use the table and block; entries inserted or
    /// removed meanwhile may or may not be visited.
    pub fn for_each(&self, mut f: impl FnMut(u64, &Arc<T>)) {
        let mut batch: Vec<(u64, Arc<T>)> = Vec::new();
        for cell in self.cells.iter() {
            batch.extend(cell.pin().iter().map(|(&k, v)| (k, v.clone())));
            for (k, v) in batch.drain(..) {
                f(k, &v);
            }
        }
    }

    /// Number of mnodes (a sum over cells, not a snapshot).
    pub fn len(&self) -> usize {
        self.cells.iter().map(|c| c.len()).sum()
    }

    /// True if no cell holds a mnode (not a snapshot).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.cells.iter().all(|c| c.is_empty())
    }
}

impl<T: Resident + Send + Sync + 'static> Default for Cells<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Resident + Send + Sync + 'static> std::fmt::Debug for Cells<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cells").field("cells", &self.cells.len()).field("len", &self.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Barrier;

    impl Resident for u32 {}
    impl Resident for u64 {}
    impl Resident for usize {}
    impl Resident for String {}
    impl Resident for Counted {}

    #[test]
    fn cell_count_is_power_of_two_and_at_least_4x_cpus() {
        let c: Cells<u32> = Cells::new();
        assert!(c.cell_count().is_power_of_two());
        assert!(c.cell_count() >= 4 * crate::sync::percpu::possible_cpus());
        assert_eq!(Cells::<u32>::with_cells(0).cell_count(), 1);
        assert_eq!(Cells::<u32>::with_cells(5).cell_count(), 8);
    }

    #[test]
    fn basic_operations() {
        let c: Cells<String> = Cells::with_cells(8);
        assert!(c.get(1).is_none());
        let (a, ins) = c.insert_if_absent(1, || "one".into());
        assert!(ins);
        let (b, ins) = c.insert_if_absent(1, || "uno".into());
        assert!(!ins);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*c.get(1).unwrap(), "one");
        assert!(c.contains(1));
        let other = Arc::new(String::from("x"));
        assert!(!c.remove_if_same(1, &other));
        assert!(c.remove_if_same(1, &a));
        assert!(c.remove(1).is_none());
        assert!(c.is_empty());
    }

    #[test]
    fn inodes_spread_over_cells_and_for_each_visits_all() {
        let c: Cells<u64> = Cells::with_cells(16);
        for ino in 0..1600u64 {
            c.insert_if_absent(ino, || ino * 2);
        }
        assert_eq!(c.len(), 1600);
        let mut per_cell = vec![0usize; 16];
        for ino in 0..1600u64 {
            per_cell[c.cell_of(ino)] += 1;
        }
        // Sequential numbers must not pile into a few cells.
        assert!(per_cell.iter().all(|&n| n > 50), "{per_cell:?}");
        let mut seen = 0u64;
        c.for_each(|k, v| {
            assert_eq!(**v, k * 2);
            // The table is usable from inside the callback.
            assert!(c.get(k).is_some());
            seen += 1;
        });
        assert_eq!(seen, 1600);
    }

    #[test]
    fn concurrent_insert_if_absent_yields_one_value() {
        const THREADS: usize = 8;
        let c: Cells<usize> = Cells::with_cells(4);
        let made = AtomicUsize::new(0);
        let inserted = AtomicUsize::new(0);
        for round in 0..200u64 {
            let start = Barrier::new(THREADS);
            let got: Vec<Arc<usize>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let (c, made, inserted, start) = (&c, &made, &inserted, &start);
                        s.spawn(move || {
                            start.wait();
                            let (v, ins) = c.insert_if_absent(round, || {
                                made.fetch_add(1, SeqCst);
                                t
                            });
                            if ins {
                                inserted.fetch_add(1, SeqCst);
                            }
                            v
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(got.iter().all(|v| Arc::ptr_eq(v, &got[0])), "round {round}: two values");
            // Racing callers may each build a value; only one is ever inserted.
            assert!(made.load(SeqCst) > round as usize);
            assert_eq!(inserted.load(SeqCst), round as usize + 1, "round {round}: not exactly one insert");
        }
        assert_eq!(c.len(), 200);
    }

    /// A value that counts its drops, to check that removed entries are freed (eventually) and
    /// exactly once.
    struct Counted(u64, Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn lock_free_readers_see_whole_values_while_writers_churn_and_every_value_is_freed_once() {
        const WRITERS: u64 = 4;
        const READERS: usize = 4;
        const KEYS: u64 = 64;
        const ROUNDS: u64 = 3000;
        let drops = Arc::new(AtomicUsize::new(0));
        let made = AtomicUsize::new(0);
        let c: Cells<Counted> = Cells::with_cells(4);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..READERS {
                let (c, stop) = (&c, &stop);
                s.spawn(move || {
                    let mut seen = 0u64;
                    while !stop.load(SeqCst) {
                        for k in 0..KEYS * WRITERS {
                            // A value found under key k was made for key k, and is alive.
                            if let Some(v) = c.with(k, |v| v.0) {
                                assert_eq!(v, k, "key {k} maps to another key's value");
                                seen += 1;
                            }
                            if let Some(a) = c.get(k) {
                                assert_eq!(a.0, k);
                            }
                        }
                    }
                    seen
                });
            }
            let writers: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let (c, drops, made) = (&c, &drops, &made);
                    s.spawn(move || {
                        // Each writer owns its keys: the table must end with exactly what it left.
                        let mut present = std::collections::HashSet::new();
                        for r in 0..ROUNDS {
                            let k = w * KEYS + (r * 7919) % KEYS;
                            if present.contains(&k) {
                                let v = if r % 2 == 0 { c.remove(k) } else { c.get(k) };
                                let v = v.expect("own key present");
                                assert_eq!(v.0, k);
                                if r % 2 == 1 {
                                    assert!(c.remove_if_same(k, &v));
                                }
                                present.remove(&k);
                            } else {
                                let (v, ins) = c.insert_if_absent(k, || {
                                    made.fetch_add(1, SeqCst);
                                    Counted(k, drops.clone())
                                });
                                assert!(ins, "own key {k} was absent");
                                assert_eq!(v.0, k);
                                present.insert(k);
                            }
                        }
                        present
                    })
                })
                .collect();
            let left: usize = writers.into_iter().map(|h| h.join().unwrap().len()).sum();
            stop.store(true, SeqCst);
            assert_eq!(c.len(), left);
        });
        let left = c.len();
        drop(c);
        // Every value made was freed exactly once: the removed ones by reclamation, the rest
        // with the table.
        assert_eq!(drops.load(SeqCst), made.load(SeqCst), "{left} left at the end");
    }
}
