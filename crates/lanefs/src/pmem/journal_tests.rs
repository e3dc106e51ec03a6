//! The region lane-journal protocol: append, read, reset, refusals, and every crash state of a
//! run of appends and a checkpoint's reset.

use super::journal::{Appended, JournalLayout, NvmJournal, LANE_MIN_BYTES};
use super::nat::NatLayout;
use super::nat_tests::{images, next};
use super::tests::{fault_of, scratch};
use super::*;
use crate::format::layout::Geometry;
use crate::format::node::Timespec;
use crate::journal::{InodeAttr, Record, Stamp, Transaction};

const UUID: [u8; 16] = *b"jnl-region-test!";

fn geometry() -> Geometry {
    Geometry::compute(16384, 2).unwrap()
}

fn nat_end() -> usize {
    NatLayout::of(&geometry()).end
}

fn open(path: &Path, record: bool) -> PmemRegion {
    PmemRegion::open(path, Some(UUID), &RegionOptions { record, ..Default::default() }).unwrap()
}

fn new_region(path: &Path) {
    drop(PmemRegion::create(path, MIN_REGION_SIZE, UUID, &RegionOptions::default()).unwrap());
}

/// A transaction like an fsync's: attributes and `blocks` mapped blocks of inode `ino`.
fn txn(ino: u32, blocks: u64, tick: u64) -> Transaction {
    let g = geometry();
    let stamp = Stamp { ticks: tick, cpu: 0 };
    let t = Timespec { sec: tick as i64, nsec: 0 };
    let attr = InodeAttr {
        mode: 0o100644,
        size: blocks * 4096,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        ..Default::default()
    };
    let mut records = vec![Record::SetAttr { stamp, ino, attr }];
    let map = (0..blocks)
        .map(|i| (i, (g.main_blkaddr as u32 + (tick as u32 * 7 + i as u32) % 4096, 0xC0DE)))
        .collect();
    records.extend(Record::map_runs(ino, stamp, &map));
    Transaction::new(records)
}

fn append(j: &NvmJournal, r: &PmemRegion, lane: u32, t: &Transaction) -> Appended {
    j.append(r, lane, &t.encode().unwrap()).unwrap()
}

#[test]
fn layout_is_after_the_nat_and_small_regions_are_refused() {
    let g = geometry();
    let l = JournalLayout::of(nat_end(), MIN_REGION_SIZE as usize, g.lanes);
    assert!(l.start >= nat_end() && l.start.is_multiple_of(4096));
    assert!(l.end() <= MIN_REGION_SIZE as usize, "{l:?}");
    assert!(l.capacity() >= LANE_MIN_BYTES, "{l:?}");
    // Too many lanes for a 1 MiB region: refused, naming the file and a size.
    let many = Geometry::compute(204800, 64).unwrap();
    let d = scratch();
    let p = d.path().join("r.nvm");
    new_region(&p);
    let r = open(&p, false);
    let e = NvmJournal::new(&r, NatLayout::of(&many).end, &many).unwrap_err();
    assert_eq!(fault_of(&e), RegionFault::TooSmall, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&p.display().to_string()) && msg.contains("--nvm-size"), "{msg}");
}

#[test]
fn append_read_reset() {
    let g = geometry();
    let d = scratch();
    let p = d.path().join("r.nvm");
    new_region(&p);
    let r = open(&p, false);
    let j = NvmJournal::new(&r, nat_end(), &g).unwrap();
    // Not reset yet: appends are refused, reads find nothing (a fresh region is all zero).
    assert!(j.append(&r, 0, &txn(3, 1, 1).encode().unwrap()).is_err());
    assert_eq!(j.read(&r, 5).unwrap(), vec![vec![], vec![]]);
    j.reset(&r, 5).unwrap();
    let (a, b, c) = (txn(3, 1, 10), txn(4, 300, 11), txn(5, 0, 12));
    assert!(matches!(append(&j, &r, 0, &a), Appended::Committed { before: 0, .. }));
    append(&j, &r, 1, &b);
    append(&j, &r, 0, &c);
    assert_eq!(j.read(&r, 5).unwrap(), vec![vec![a.clone(), c.clone()], vec![b.clone()]]);
    // Under another checkpoint the lanes hold nothing.
    assert_eq!(j.read(&r, 6).unwrap(), vec![vec![], vec![]]);
    assert_eq!(j.read(&r, 4).unwrap(), vec![vec![], vec![]]);
    // Survives closing and reopening.
    drop(j);
    drop(r);
    let r = open(&p, false);
    let j = NvmJournal::new(&r, nat_end(), &g).unwrap();
    assert_eq!(j.read(&r, 5).unwrap(), vec![vec![a.clone(), c], vec![b]]);
    assert!(j.describe(&r, 5).contains("2 lane journals"));
    // A checkpoint's reset empties them; appends then follow the new checkpoint.
    j.reset(&r, 6).unwrap();
    assert_eq!(j.read(&r, 5).unwrap(), vec![vec![], vec![]]);
    assert_eq!(j.read(&r, 6).unwrap(), vec![vec![], vec![]]);
    append(&j, &r, 1, &a);
    assert_eq!(j.read(&r, 6).unwrap(), vec![vec![], vec![a.clone()]]);
    assert_eq!(j.usage()[1], NvmJournal::entry_len(a.encode().unwrap().len()));
    // Filling a lane: Full, with nothing written, until the next reset.
    let cap = j.layout().capacity();
    let big = txn(7, 256, 20);
    let mut n = 1;
    while let Appended::Committed { after, .. } = append(&j, &r, 1, &big) {
        assert!(after <= cap);
        n += 1;
    }
    let full = j.read(&r, 6).unwrap();
    assert_eq!(full[1].len(), n);
    assert_eq!(append(&j, &r, 1, &big), Appended::Full);
    assert_eq!(j.read(&r, 6).unwrap(), full);
    assert!(!j.has_room(1, big.encode().unwrap().len()));
    assert!(j.has_room(0, big.encode().unwrap().len()));
    j.reset(&r, 7).unwrap();
    assert!(j.has_room(1, big.encode().unwrap().len()));
}

#[test]
fn corrupt_journals_are_refused_naming_the_file() {
    let g = geometry();
    let d = scratch();
    let p = d.path().join("r.nvm");
    new_region(&p);
    let l = {
        let r = open(&p, false);
        let j = NvmJournal::new(&r, nat_end(), &g).unwrap();
        j.reset(&r, 9).unwrap();
        append(&j, &r, 0, &txn(3, 2, 30));
        append(&j, &r, 0, &txn(3, 1, 31));
        j.layout()
    };
    let good = std::fs::read(&p).unwrap();
    let read_with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut img = good.clone();
        f(&mut img);
        std::fs::write(&p, &img).unwrap();
        let r = open(&p, false);
        let j = NvmJournal::new(&r, nat_end(), &g).unwrap();
        j.read(&r, 9)
    };
    let refused = |f: &dyn Fn(&mut Vec<u8>)| {
        let e = read_with(f).unwrap_err();
        assert_eq!(fault_of(&e), RegionFault::Corrupt, "{e}");
        assert!(e.to_string().contains(&p.display().to_string()), "{e}");
    };
    let (tail, log) = (l.tail(0), l.log(0));
    let word = |img: &Vec<u8>, at: usize| u64::from_le_bytes(img[at..at + 8].try_into().unwrap());
    let used = word(&good, tail) as u32 as usize;
    // A tail beyond the lane's capacity, or not a multiple of 8.
    refused(&|img| img[tail..tail + 4].copy_from_slice(&(l.capacity() as u32 + 8).to_le_bytes()));
    refused(&|img| img[tail..tail + 4].copy_from_slice(&(used as u32 - 4).to_le_bytes()));
    // A tail that cuts an entry short.
    refused(&|img| img[tail..tail + 4].copy_from_slice(&(used as u32 - 8).to_le_bytes()));
    // An entry of another checkpoint; an entry length past the tail; a short one.
    refused(&|img| img[log + 4..log + 8].copy_from_slice(&8u32.to_le_bytes()));
    refused(&|img| img[log..log + 4].copy_from_slice(&(used as u32).to_le_bytes()));
    refused(&|img| img[log..log + 4].copy_from_slice(&4u32.to_le_bytes()));
    // A flipped bit in a transaction (its checksum), or in its magic.
    refused(&|img| img[log + 8 + 20] ^= 0x10);
    refused(&|img| img[log + 8] ^= 1);
    // A block address outside the main area (the transaction re-sealed, so only the geometry
    // check can catch it).
    let bad = {
        let mut t = txn(3, 1, 40);
        if let Record::Map { entries, .. } = &mut t.records[1] {
            entries[0].0 = 1;
        }
        let mut b = t.encode().unwrap();
        b.resize(b.len().div_ceil(8) * 8, 0);
        b
    };
    refused(&|img| {
        let head = (bad.len() as u64) | 9 << 32;
        img[log..log + 8].copy_from_slice(&head.to_le_bytes());
        img[log + 8..log + 8 + bad.len()].copy_from_slice(&bad);
        img[tail..tail + 8].copy_from_slice(&((8 + bad.len()) as u64 | 9 << 32).to_le_bytes());
    });
    // Untouched, it reads.
    assert_eq!(read_with(&|_| {}).unwrap()[0].len(), 2);
}

/// Crash images of `cm`: every subset when few words are pending (and older values), else
/// none, all, and random subsets (an entry's words are many; what matters is which land with
/// or without the TAIL word, which random subsets cover both ways).
fn crash_images(cm: &PmemCrash, seed: &mut u64) -> Vec<Vec<u8>> {
    if cm.pending().len() <= 6 {
        return images(cm, seed);
    }
    let mut out = vec![cm.image_with(|_, _| None), cm.everything()];
    for _ in 0..14 {
        let (a, b) = (next(seed), next(seed));
        out.push(cm.image_with(|i, w| {
            let bit = if i % 128 < 64 { a >> (i % 64) } else { b >> (i % 64) };
            (bit & 1 != 0).then(|| w.values.len() - 1)
        }));
    }
    out
}

/// Per lane: how many appends finished (commit persisted) and started before event `k`.
fn bounds(marks: &[(u32, usize, usize)], lanes: usize, k: usize) -> Vec<(usize, usize)> {
    let mut out = vec![(0, 0); lanes];
    for &(lane, k0, k1) in marks {
        if k1 <= k {
            out[lane as usize].0 += 1;
        }
        if k0 < k {
            out[lane as usize].1 += 1;
        }
    }
    out
}

fn check_prefix(got: &[Vec<Transaction>], want: &[Vec<Transaction>], b: &[(usize, usize)], what: &str) {
    for (lane, (g, w)) in got.iter().zip(want).enumerate() {
        let (done, started) = b[lane];
        assert!(
            g.len() >= done && g.len() <= started && g[..] == w[..g.len()],
            "{what}, lane {lane}: read {} transactions, {done} committed, {started} started",
            g.len()
        );
    }
}

/// (lane, first event, event after) of each append.
type Marks = Vec<(u32, usize, usize)>;

/// Appends `txns` (lane, transaction), recording the event window of each.
fn run(j: &NvmJournal, r: &PmemRegion, txns: &[(u32, Transaction)]) -> (Marks, Vec<Vec<Transaction>>) {
    let mut marks = Vec::new();
    let mut per_lane = vec![Vec::new(); j.layout().lanes];
    for (lane, t) in txns {
        let k0 = r.recorded_events();
        assert!(matches!(append(j, r, *lane, t), Appended::Committed { .. }));
        marks.push((*lane, k0, r.recorded_events()));
        per_lane[*lane as usize].push(t.clone());
    }
    (marks, per_lane)
}

#[test]
fn every_crash_state_reads_a_prefix_of_the_committed_transactions() {
    let g = geometry();
    let d = scratch();
    let p = d.path().join("r.nvm");
    let s = d.path().join("crash.nvm");
    new_region(&p);
    {
        // Old entries of checkpoint 6 under what the next ones overwrite.
        let r = open(&p, false);
        let j = NvmJournal::new(&r, nat_end(), &g).unwrap();
        j.reset(&r, 6).unwrap();
        append(&j, &r, 0, &txn(9, 40, 1));
        append(&j, &r, 1, &txn(9, 3, 2));
    }
    let r = open(&p, true);
    let j = NvmJournal::new(&r, nat_end(), &g).unwrap();
    // Checkpoint 7 is in force (mount reset the journals).
    let start = r.recorded_events();
    j.reset(&r, 7).unwrap();
    let after_mount = r.recorded_events();
    let (marks_a, lanes_a) =
        run(&j, &r, &[(0, txn(3, 1, 10)), (1, txn(4, 2, 11)), (0, txn(5, 0, 12)), (0, txn(3, 300, 13))]);
    // Checkpoint 8: its pack is durable, then the reset.
    let reset0 = r.recorded_events();
    j.reset(&r, 8).unwrap();
    let reset1 = r.recorded_events();
    let (marks_b, lanes_b) = run(&j, &r, &[(1, txn(6, 1, 20)), (1, txn(6, 1, 21))]);
    let end = r.recorded_events();
    let empty = vec![Vec::new(); 2];

    let mut seed = 0x5EED_0001;
    let mut states = 0;
    for k in start..=end {
        let cm = r.crash_model_at(k).unwrap();
        for img in crash_images(&cm, &mut seed) {
            states += 1;
            std::fs::write(&s, &img).unwrap();
            let c = open(&s, false);
            let cj = NvmJournal::new(&c, nat_end(), &g).unwrap();
            let read7 = cj.read(&c, 7).unwrap_or_else(|e| panic!("crash at event {k}: {e}"));
            let read8 = cj.read(&c, 8).unwrap_or_else(|e| panic!("crash at event {k}: {e}"));
            if k <= after_mount {
                // Mid-reset at mount: a lane is empty under 7, or still says 6.
                assert_eq!(read7, empty, "crash at event {k}");
            } else if k <= reset0 {
                // Pack 7 in force.
                check_prefix(&read7, &lanes_a, &bounds(&marks_a, 2, k), &format!("pack 7, event {k}"));
                assert_eq!(read8, empty, "crash at event {k}");
            }
            if k >= reset0 {
                // Pack 8 is durable: whatever checkpoint 7's lanes still hold is ignored.
                check_prefix(&read8, &lanes_b, &bounds(&marks_b, 2, k), &format!("pack 8, event {k}"));
                // A mount then resets and appends (the old entries do not come back).
                cj.reset(&c, 8).unwrap();
                assert_eq!(cj.read(&c, 8).unwrap(), empty);
                let t = txn(11, 1, 99);
                append(&cj, &c, 0, &t);
                assert_eq!(cj.read(&c, 8).unwrap(), vec![vec![t], vec![]], "event {k}");
            }
        }
    }
    assert!(reset1 > reset0 && end > reset1);
    assert!(states > 300, "{states} crash states");
    eprintln!("{states} crash states over {} events", end - start);
}
