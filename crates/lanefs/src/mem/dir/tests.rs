//! Directory map tests: single-threaded semantics, and the invariants the lock-free design
//! must keep under concurrency: pooled name maps start empty, listings resume without repeats
//! or skips, per-shard counts and touched bits lose no change, and a lookup never misses a
//! renamed name or sees a torn entry. The concurrent tests bound their work by counts, not
//! time, so a slow machine makes them slow, never wrong.

use super::*;
use std::collections::HashSet;
use std::sync::Arc;

#[test]
fn insert_lookup_remove() {
    let d = DirMap::new();
    assert!(d.insert(b"a", 5, 8).is_ok());
    assert_eq!(d.insert(b"a", 6, 8).unwrap_err().ino, 5);
    assert_eq!(d.lookup(b"a").unwrap().ino, 5);
    assert_eq!(d.len(), 1);
    assert_eq!(d.remove(b"a").unwrap().ino, 5);
    assert!(d.lookup(b"a").is_none());
    assert!(d.is_empty());
}

/// Directory maps made and dropped on many threads at once share the pooled name maps:
/// every new map starts empty, whatever map it was before, and sees only its own names,
/// while other threads look names up in a map that lives throughout.
#[test]
fn pooled_name_maps_start_empty_on_every_thread() {
    let keep = Arc::new(DirMap::new());
    for i in 0..64u32 {
        keep.insert(format!("k{i}").as_bytes(), i + 1, 8).unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let keep = &keep;
            s.spawn(move || {
                for round in 0..300u32 {
                    let d = DirMap::new();
                    assert!(d.is_empty() && d.entries().is_empty(), "a new map holds names");
                    assert!(d.lookup(b"x0").is_none(), "a new map finds another map's name");
                    for i in 0..(round % 40) {
                        d.insert(format!("x{i}").as_bytes(), t * 1000 + i + 1, 8).unwrap();
                    }
                    for i in 0..(round % 40) {
                        assert_eq!(d.lookup(format!("x{i}").as_bytes()).unwrap().ino, t * 1000 + i + 1);
                    }
                    let g = guard();
                    let i = round % 64;
                    assert_eq!(keep.lookup_in(format!("k{i}").as_bytes(), &g).unwrap().ino, i + 1);
                }
            });
        }
    });
    assert_eq!(keep.len(), 64);
    assert_eq!(keep.entries().len(), 64);
}

#[test]
fn listing_resumes_without_repeats_or_skips_under_churn() {
    let d = Arc::new(DirMap::new());
    for i in 0..2000u32 {
        d.insert(format!("stable-{i}").as_bytes(), i + 10, 8).unwrap();
    }
    let churn = {
        let d = d.clone();
        std::thread::spawn(move || {
            for round in 0..20 {
                for i in 0..200u32 {
                    let n = format!("churn-{round}-{i}");
                    d.insert(n.as_bytes(), 1, 8).unwrap();
                    if i % 2 == 0 {
                        d.remove(n.as_bytes());
                    }
                }
            }
        })
    };
    let mut seen = HashSet::new();
    let mut cookie = 2;
    loop {
        let page = d.list_after(cookie, 37, None);
        if page.is_empty() {
            break;
        }
        for (name, e) in &page {
            assert!(e.cookie > cookie, "cookies must increase");
            assert!(seen.insert(name.clone()), "{} listed twice", String::from_utf8_lossy(name));
        }
        cookie = page.last().unwrap().1.cookie;
    }
    churn.join().unwrap();
    for i in 0..2000u32 {
        assert!(seen.contains(format!("stable-{i}").as_bytes()), "stable-{i} skipped");
    }
}

#[test]
fn a_listing_within_its_horizon_ends_while_it_renames_what_it_reads() {
    // fstests generic/736: rename each entry away and back as it is read.
    let d = DirMap::new();
    for i in 0..500u32 {
        d.insert(format!("{i}").as_bytes(), i + 10, 8).unwrap();
    }
    let rename_away_and_back = |name: &[u8]| {
        let e = d.remove(name).expect("listed entry exists");
        d.insert(b"TEMPFILE", e.ino, e.file_type).unwrap();
        let t = d.remove(b"TEMPFILE").unwrap();
        d.insert(name, t.ino, t.file_type).unwrap();
    };
    // Without a horizon the listing meets renamed entries again: far more than 500 reads.
    let (mut cookie, mut reads) = (2, 0);
    while reads <= 3 * 500 {
        let page = d.list_after(cookie, 16, None);
        let Some(last) = page.last() else { break };
        cookie = last.1.cookie;
        reads += page.len();
        page.iter().for_each(|(n, _)| rename_away_and_back(n));
    }
    assert!(reads > 3 * 500, "an unbounded listing should keep meeting renamed entries");
    // Within a horizon: every entry exactly once, then the end. A name created during the
    // listing is not returned.
    let h = d.horizon();
    d.insert(b"late", 1, 8).unwrap();
    let (mut cookie, mut seen) = (2, HashSet::new());
    for _ in 0..=500 {
        let page = d.list_after(cookie, 16, Some(&h));
        let Some(last) = page.last() else { break };
        cookie = last.1.cookie;
        for (n, _) in &page {
            assert!(seen.insert(n.clone()), "{} listed twice", String::from_utf8_lossy(n));
            rename_away_and_back(n);
        }
    }
    assert!(d.list_after(cookie, 16, Some(&h)).is_empty(), "the listing ends");
    assert_eq!(seen.len(), 500);
    assert!(!seen.contains(b"late".as_slice()), "a name created during the listing");
    // A fresh horizon sees the directory as it is now (rewinddir).
    assert_eq!(d.list_after(2, 1000, Some(&d.horizon())).len(), 501);
}

#[test]
fn concurrent_creates_of_distinct_names_all_land() {
    let d = Arc::new(DirMap::new());
    let hs: Vec<_> = (0..8u32)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || {
                for i in 0..2000u32 {
                    d.insert(format!("t{t}-{i}").as_bytes(), t * 10_000 + i + 1, 8).unwrap();
                }
                // Same name from every thread: exactly one wins.
                d.insert(b"contended", t + 1, 8).is_ok()
            })
        })
        .collect();
    let winners = hs.into_iter().map(|h| h.join().unwrap()).filter(|&w| w).count();
    assert_eq!(winners, 1);
    assert_eq!(d.len(), 8 * 2000 + 1);
    assert_eq!(d.entries().len(), 8 * 2000 + 1);
    let cookies: HashSet<u64> = d.entries().iter().map(|e| e.1.cookie).collect();
    assert_eq!(cookies.len(), 8 * 2000 + 1, "cookies are unique");
}

/// The per-shard counts and the touched bits under many writers: threads create, remove
/// and rename their own names in one directory (every shard written by every thread) while
/// another takes the touched sets over and over, as checkpoints do. Afterwards the summed
/// count equals the entries, and the touched sets taken during the run and at its end hold,
/// for every name that changed, its final entry: no change was lost to a cleared bit.
#[test]
fn shard_counts_and_touched_bits_hold_under_concurrent_changes() {
    const T: u32 = 6;
    const N: u32 = 1500;
    let d = Arc::new(DirMap::new());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let taker = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen: HashMap<Box<[u8]>, Option<(u32, u8)>> = HashMap::new();
            while !stop.load(Ordering::Acquire) {
                for t in d.take_touched() {
                    seen.extend(t);
                }
            }
            seen
        })
    };
    let hs: Vec<_> = (0..T)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || {
                for i in 0..N {
                    let ino = t * 100_000 + i + 1;
                    d.insert(format!("c{t}-{i}").as_bytes(), ino, 8).unwrap();
                    if i % 3 == 0 {
                        assert!(d.remove(format!("c{t}-{i}").as_bytes()).is_some());
                    } else if i % 3 == 1 {
                        let (from, to) = (format!("c{t}-{i}"), format!("r{t}-{i}"));
                        update_two((1, &*d, from.as_bytes()), (1, &*d, to.as_bytes()), |a, b| {
                            assert!(b.is_none());
                            Ok::<_, ()>((None, a.map(|e| (e.ino, e.file_type))))
                        })
                        .unwrap();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Release);
    let mut seen = taker.join().unwrap();
    for t in d.take_touched() {
        seen.extend(t);
    }
    assert!(d.touched.iter().all(|w| w.load(Ordering::Relaxed) == 0), "nothing touched after the last take");
    let entries = d.entries();
    assert_eq!(d.len(), entries.len() as u64);
    assert_eq!(entries.len() as u32, T * (N - N.div_ceil(3)));
    for (i, c) in d.shards.iter().enumerate() {
        let listed = c.read().by_cookie.len() as u64;
        assert_eq!(c.len.load(Ordering::Relaxed), listed, "shard {i} counts what it lists");
    }
    // Every name ever used, with the entry it ended with.
    for t in 0..T {
        for i in 0..N {
            let ino = t * 100_000 + i + 1;
            let (c, r) = (format!("c{t}-{i}"), format!("r{t}-{i}"));
            let want_c = (i % 3 == 2).then_some((ino, 8));
            let want_r = (i % 3 == 1).then_some((ino, 8));
            assert_eq!(seen.get(c.as_bytes()).copied(), Some(want_c), "{c}");
            assert_eq!(d.lookup(c.as_bytes()).map(|e| (e.ino, e.file_type)), want_c, "{c}");
            if want_r.is_some() {
                assert_eq!(seen.get(r.as_bytes()).copied(), Some(want_r), "{r}");
            }
        }
    }
}

/// Renames old-i -> new-i (within one directory, and from one directory to another) while
/// readers look each pair up, old name first: a reader that finds the old name gone must
/// find the new one, since a rename inserts before it removes. Lookups also run against a
/// churn of creates and removes and must only ever see the entry made for their name.
#[test]
fn lock_free_lookups_never_lose_a_renamed_name_and_see_whole_entries() {
    const N: u32 = 3000;
    let a = Arc::new(DirMap::new());
    let b = Arc::new(DirMap::new());
    for i in 0..N {
        a.insert(format!("old-{i}").as_bytes(), i + 1, 8).unwrap();
        // Long names take the boxed path of `Name`.
        a.insert(format!("old-long-name-past-the-inline-limit-{i}").as_bytes(), N + i + 1, 8).unwrap();
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (a, b, stop) = (&a, &b, &stop);
                s.spawn(move || {
                    let mut checks = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for i in (0..N).step_by(7) {
                            if a.lookup(format!("old-{i}").as_bytes()).is_none() {
                                let e = a.lookup(format!("new-{i}").as_bytes()).expect("renamed name lost");
                                assert_eq!(e.ino, i + 1);
                                checks += 1;
                            }
                            let long = format!("old-long-name-past-the-inline-limit-{i}");
                            if a.lookup(long.as_bytes()).is_none() {
                                let e = b.lookup(format!("moved-{i}").as_bytes()).expect("moved name lost");
                                assert_eq!(e.ino, N + i + 1);
                            }
                            if let Some(e) = a.lookup(format!("churn-{i}").as_bytes()) {
                                assert_eq!(e.ino, 7 * N + i, "an entry made for another name");
                            }
                        }
                    }
                    checks
                })
            })
            .collect();
        let (a2, b2) = (&a, &b);
        let renamer = s.spawn(move || {
            for i in 0..N {
                let (o, n) = (format!("old-{i}"), format!("new-{i}"));
                update_two::<()>((1, a2, o.as_bytes()), (1, a2, n.as_bytes()), |x, y| {
                    assert!(y.is_none());
                    Ok((None, x.map(|e| (e.ino, e.file_type))))
                })
                .unwrap();
                let (o, n) = (format!("old-long-name-past-the-inline-limit-{i}"), format!("moved-{i}"));
                update_two::<()>((1, a2, o.as_bytes()), (2, b2, n.as_bytes()), |x, _| {
                    Ok((None, x.map(|e| (e.ino, e.file_type))))
                })
                .unwrap();
            }
        });
        let a3 = &a;
        let churn = s.spawn(move || {
            for round in 0..4 {
                for i in 0..N {
                    let n = format!("churn-{i}");
                    if round % 2 == 0 {
                        a3.insert(n.as_bytes(), 7 * N + i, 8).unwrap();
                    } else {
                        a3.remove(n.as_bytes()).unwrap();
                    }
                }
            }
        });
        renamer.join().unwrap();
        churn.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
    });
    assert_eq!(a.len(), u64::from(N));
    assert_eq!(b.len(), u64::from(N));
    assert_eq!(a.entries().len(), N as usize);
    // Listing agrees with the lookup index: every listed name looks up to its entry.
    let listed = a.list_after(2, usize::MAX, None);
    assert_eq!(listed.len(), N as usize);
    for (name, e) in listed {
        assert_eq!(a.lookup(&name), Some(e));
    }
}
