//! Page map tests: shards made lazily, copy-on-write snapshots that stay stable, the dirty
//! and logged lists through writes, takes, truncates and restores (a page truncated in flight
//! is not restored), bounded takes, and the shard spread of strided pages. `PageMap::check`
//! asserts the list invariants of the module doc, beyond what the contents show.

use super::*;

/// Writes with a zero base (a hole), as the engine does for a page with no block.
fn w(m: &PageMap, idx: u64, off: usize, bytes: &[u8]) {
    assert!(m.write(idx, off, bytes, Some(&[0; PAGE_SIZE])));
}

#[test]
fn a_map_makes_its_shards_only_for_its_first_page() {
    let stats = Arc::new(CacheStats::default());
    let m = PageMap::new(stats.clone());
    // Looking, taking, settling and truncating find nothing and make nothing.
    assert!(m.get(5).is_none());
    assert!(!m.is_cached(5));
    assert!(!m.settle(5));
    assert!(!m.truncate_one(5));
    assert!(m.take_dirty().is_empty());
    assert!(m.truncate(0).is_empty());
    assert_eq!(m.evict_clean(10), 0);
    assert_eq!(m.dirty_unmapped(|_| false), 0);
    // A cached-only write (the fast path, no base page) finds no page to update either.
    assert!(!m.write_cached(5, 0, b"y"));
    assert!(m.shards.get().is_none(), "no page, no shards");
    w(&m, 5, 0, b"x");
    assert!(m.shards.get().is_some());
    assert_eq!(m.get(5).expect("cached")[0], b'x');
    assert_eq!(m.take_dirty().len(), 1);
}

#[test]
fn copy_on_write_keeps_snapshots_stable() {
    let stats = Arc::new(CacheStats::default());
    let m = PageMap::new(stats.clone());
    w(&m, 3, 10, b"hello");
    let snap = m.take_dirty();
    assert_eq!(snap.len(), 1);
    assert_eq!(m.dirty_count(), 0);
    w(&m, 3, 10, b"HELLO");
    assert_eq!(&snap[0].1[10..15], b"hello", "snapshot must not see the later write");
    assert_eq!(&m.get(3).unwrap()[10..15], b"HELLO");
    assert_eq!(m.dirty_count(), 1);
    assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 1);
    m.truncate(0);
    assert_eq!(stats.cached_pages.load(Ordering::Relaxed), 0);
    assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 0);
}

#[test]
fn partial_write_needs_a_base_and_full_write_does_not() {
    let m = PageMap::new(Arc::default());
    assert!(m.write(0, 0, &[1u8; PAGE_SIZE], None), "a full page needs no base");
    assert!(!m.write(1, 5, b"x", None), "a partial page that is not cached needs its base");
    assert!(m.get(1).is_none(), "a refused write changes nothing");
    assert_eq!(m.dirty_count(), 1);
    assert!(m.write(1, 5, b"x", Some(&[7u8; PAGE_SIZE])));
    let p = m.get(1).unwrap();
    assert_eq!((p[4], p[5], p[6]), (7, b'x', 7));
    // Cached now: a later partial write needs no base, and a base given is ignored.
    assert!(m.write(1, 6, b"y", None));
    assert!(m.write(1, 7, b"z", Some(&[9u8; PAGE_SIZE])));
    let p = m.get(1).unwrap();
    assert_eq!(&p[4..9], &[7, b'x', b'y', b'z', 7]);
}

impl PageMap {
    fn check(&self) {
        let mask = self.dirty_shards.load(Ordering::Acquire);
        for (i, s) in self.all().iter().enumerate() {
            let s = s.lock();
            s.check();
            assert!(
                s.dirty.is_empty() || mask & (1 << i) != 0,
                "shard {i} lists dirty pages but is not marked"
            );
        }
    }
}

#[test]
fn dirty_list_tracks_writes_takes_truncates_and_restores() {
    let m = Arc::new(PageMap::new(Arc::default()));
    let hs: Vec<_> = (0..4u64)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                let mut rng = crate::rng::Rng::new(t * 7919 + 1);
                for _ in 0..3000 {
                    let x = rng.next_u64();
                    let idx = (x >> 33) % 200;
                    match (x >> 20) % 11 {
                        10 => {
                            // An fsync that logged its pages inline in the region.
                            let taken = m.take_unsynced();
                            m.settle_logged(&taken);
                        }
                        0 => {
                            let taken = m.take_dirty();
                            assert!(taken.windows(2).all(|w| w[0].0 < w[1].0), "index order, each once");
                            if x & (1 << 40) == 0 {
                                m.restore_dirty(&taken);
                            } else {
                                taken.iter().for_each(|(i, _)| {
                                    m.settle(*i);
                                });
                            }
                        }
                        1 => drop(m.truncate(idx)),
                        2 => {
                            m.truncate_one(idx);
                        }
                        3 => w(&m, idx, 100, &[0u8; PAGE_SIZE - 100]),
                        4 => {
                            m.evict_clean(5);
                        }
                        _ => w(&m, idx, 0, &[t as u8; 8]),
                    }
                }
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    m.check();
    let listed = m.dirty_count() + m.logged_count();
    assert_eq!(m.stats.dirty_pages.load(Ordering::Relaxed), listed as i64);
    let taken = m.take_dirty();
    assert_eq!(taken.len() as u64, listed, "the counters agree with the lists");
    assert_eq!((m.dirty_count(), m.logged_count()), (0, 0));
    assert_eq!(m.stats.dirty_pages.load(Ordering::Relaxed), 0);
    assert!(m.take_dirty().is_empty());
    m.check();
}

#[test]
fn logged_pages_are_skipped_by_fsync_and_taken_by_the_checkpoint() {
    let stats = Arc::new(CacheStats::default());
    let m = PageMap::new(stats.clone());
    w(&m, 1, 0, b"a");
    w(&m, 2, 0, b"b");
    let taken = m.take_unsynced();
    assert_eq!(taken.len(), 2);
    w(&m, 2, 0, b"B");
    m.settle_logged(&taken);
    // Page 1 is logged; page 2 was written again meanwhile and stays dirty.
    assert_eq!((m.dirty_count(), m.logged_count()), (1, 1));
    assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 2);
    assert_eq!(m.evict_clean(10), 0, "a logged page is owed to the device");
    let again = m.take_unsynced();
    assert_eq!(again.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2], "fsync skips logged pages");
    m.settle_logged(&again);
    w(&m, 1, 0, b"A");
    assert_eq!((m.dirty_count(), m.logged_count()), (1, 1), "a logged page written again is dirty");
    // Page 1 is dirty and still has a stale entry in the logged list: counted once.
    assert_eq!(m.dirty_unmapped(|_| false), 2);
    assert_eq!(m.dirty_unmapped(|i| i == 2), 1);
    m.check();
    let all = m.take_dirty();
    assert_eq!(all.iter().map(|p| (p.0, p.1[0])).collect::<Vec<_>>(), vec![(1, b'A'), (2, b'B')]);
    assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 0);
    assert!(m.take_dirty().is_empty(), "stale logged entries are skipped");
}

#[test]
fn truncate_hands_back_the_pages_it_drops_and_counts_them_out() {
    let stats = Arc::new(CacheStats::default());
    let m = PageMap::new(stats.clone());
    // Sixteen shards' worth of pages, dirty and clean, on both sides of the cut.
    for i in 0..64u64 {
        w(&m, i, 0, &[i as u8; 8]);
    }
    let taken = m.take_dirty();
    assert_eq!(taken.len(), 64);
    for i in (0..64u64).step_by(2) {
        m.settle(i);
    }
    m.restore_dirty(&taken.iter().filter(|(i, _)| i & 1 == 1).cloned().collect::<Vec<_>>());
    let before = stats.cached_pages.load(Ordering::Relaxed);
    let gone = m.truncate(40);
    assert_eq!(gone.len(), 24, "pages 40..64");
    assert_eq!(gone.iter().filter(|p| p.dirty).count(), 12, "the odd ones were dirty");
    let mut firsts: Vec<u8> = gone.iter().map(|p| p.data[0]).collect();
    firsts.sort_unstable();
    assert_eq!(firsts, (40..64).collect::<Vec<u8>>(), "each dropped page handed back once");
    assert_eq!(stats.cached_pages.load(Ordering::Relaxed), before - 24, "counted out at once");
    assert_eq!(m.dirty_count(), 20);
    assert!((0..40).all(|i| m.get(i).is_some()) && (40..64).all(|i| m.get(i).is_none()));
    m.check();
    let rest = m.truncate(0);
    assert_eq!(rest.len(), 40);
    assert_eq!((m.dirty_count(), stats.cached_pages.load(Ordering::Relaxed)), (0, before - 64));
    assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 0);
    m.check();
}

#[test]
fn a_page_truncated_in_flight_is_not_restored() {
    let stats = Arc::new(CacheStats::default());
    let m = PageMap::new(stats.clone());
    w(&m, 0, 0, b"keep");
    w(&m, 5, 0, b"cut");
    let taken = m.take_unsynced();
    assert_eq!(taken.len(), 2);
    m.truncate(3);
    // The fsync that took them fails and gives them back.
    m.restore_dirty(&taken);
    assert!(m.get(5).is_none(), "a truncated page came back");
    assert_eq!(&m.get(0).unwrap()[..4], b"keep");
    assert_eq!(m.dirty_count(), 1);
    assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 1);
    assert_eq!(stats.cached_pages.load(Ordering::Relaxed), 1);
    m.check();
}

#[test]
fn bounded_takes_leave_the_rest_dirty_or_logged() {
    let stats = Arc::new(CacheStats::default());
    let m = PageMap::new(stats.clone());
    // 40 pages over every shard: 0..20 logged, 20..40 dirty.
    for i in 0..40u64 {
        w(&m, i, 0, &[i as u8 + 1]);
    }
    let first = m.take_unsynced();
    let logged: Vec<_> = first.iter().filter(|p| p.0 < 20).cloned().collect();
    m.restore_dirty(&first.iter().filter(|p| p.0 >= 20).cloned().collect::<Vec<_>>());
    m.settle_logged(&logged);
    assert_eq!((m.dirty_count(), m.logged_count()), (20, 20));
    let mut seen = Vec::new();
    // Bounded: 40 pages, at least one per take.
    for round in 0..40 {
        let part = m.take_dirty_upto(7);
        if part.is_empty() {
            break;
        }
        assert!(part.len() <= 7, "round {round}: took {}", part.len());
        m.check();
        for (idx, buf) in &part {
            assert_eq!(buf[0], *idx as u8 + 1);
            assert!(m.settle(*idx));
        }
        seen.extend(part.into_iter().map(|p| p.0));
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..40).collect::<Vec<_>>(), "every page taken exactly once");
    assert_eq!((m.dirty_count(), m.logged_count()), (0, 0));
    assert_eq!(stats.dirty_pages.load(Ordering::Relaxed), 0);
    // A page written after a bounded take left others behind is found by the next one.
    for i in 0..20u64 {
        w(&m, i, 0, b"x");
    }
    assert_eq!(m.take_dirty_upto(5).len(), 5);
    w(&m, 100, 0, b"y");
    assert_eq!(m.take_unsynced().len(), 16);
    m.check();
}

#[test]
fn strided_and_neighbouring_pages_spread_over_every_shard() {
    // Threads writing their own 8 MiB (DWOM), 1 MiB or 4 KiB-apart regions of one file:
    // 16 of them use 16 shards.
    for stride in [1u64, 2, 256, 2048, 4096, 1 << 20, 1 << 33] {
        for base in [0u64, stride - 1, 48 * stride, 48 * stride + stride / 2] {
            let mut seen: Vec<usize> = (0..16).map(|x| shard_of(base + x * stride)).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), 16, "stride {stride} from {base}: shards {seen:?}");
        }
    }
    assert!((0..1u64 << 16).all(|i| shard_of(i) < SHARDS));
    // The dirty mask follows the shard, not the index.
    let m = PageMap::new(Arc::default());
    for x in 0..16u64 {
        w(&m, x * 2048, 0, b"t");
    }
    assert_eq!(m.dirty_shards.load(Ordering::Acquire), 0xffff);
    assert_eq!(
        m.take_unsynced().iter().map(|p| p.0).collect::<Vec<_>>(),
        (0..16).map(|x| x * 2048).collect::<Vec<_>>()
    );
    m.check();
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
                    w(&m, idx, 0, &[t as u8 + 1; PAGE_SIZE]);
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
