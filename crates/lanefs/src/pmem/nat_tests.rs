//! The region NAT protocol: seed, stage, apply, read, and every crash state in between.

use super::nat::{NatLayout, NvmNat};
use super::tests::{fault_of, scratch};
use super::*;
use crate::format::layout::Geometry;
use crate::format::{NatBlock, NatEntry};
use std::collections::BTreeMap;

const UUID: [u8; 16] = *b"nat-region-test!";

fn geometry() -> Geometry {
    // 64 MiB, two lanes: a NAT of a few dozen blocks, which fits a 1 MiB region.
    Geometry::compute(16384, 2).unwrap()
}

type Nat = BTreeMap<u32, NatBlock>;

/// A NAT with the given live entries (nid -> (addr offset in main, owner)).
fn nat_of(g: &Geometry, entries: &[(u32, u32, u32)]) -> Nat {
    let mut m = Nat::new();
    for &(nid, off, ino) in entries {
        let (bi, slot) = NatBlock::locate(nid);
        m.entry(bi).or_insert_with(|| NatBlock::empty(bi)).entries[slot] =
            NatEntry { block_addr: g.main_blkaddr as u32 + off, ino };
    }
    m
}

/// The NAT blocks a checkpoint from `old` to `new` would pass as dirty (every block that
/// differs, whole).
fn dirty(g: &Geometry, old: &Nat, new: &Nat) -> Vec<NatBlock> {
    (0..g.nat_blocks)
        .filter_map(|bi| {
            let (a, b) = (old.get(&bi), new.get(&bi));
            (a != b).then(|| b.cloned().unwrap_or_else(|| NatBlock::empty(bi)))
        })
        .collect()
}

fn open(path: &Path, record: bool) -> NvmNat {
    let r = PmemRegion::open(path, Some(UUID), &RegionOptions { record, ..Default::default() }).unwrap();
    NvmNat::new(r, &geometry()).unwrap()
}

#[test]
fn layout_fits_and_too_small_regions_are_refused() {
    let g = geometry();
    let l = NatLayout::of(&g);
    assert_eq!(l.entries, g.nat_blocks as usize * 510);
    assert!(l.entries > g.max_nid as usize);
    assert!(l.end <= MIN_REGION_SIZE as usize, "{l:?}");
    // A 1 GiB image needs more than the minimum region: the error names the file and a size.
    let big = Geometry::compute(262144, 2).unwrap();
    let d = scratch();
    let p = d.path().join("r.nvm");
    let r = PmemRegion::create(&p, MIN_REGION_SIZE, UUID, &RegionOptions::default()).unwrap();
    let e = NvmNat::new(r, &big).unwrap_err();
    assert_eq!(fault_of(&e), RegionFault::TooSmall);
    let msg = e.to_string();
    assert!(msg.contains(&p.display().to_string()) && msg.contains("--nvm-size"), "{msg}");
}

#[test]
fn seed_stage_apply_read() {
    let g = geometry();
    let d = scratch();
    let p = d.path().join("r.nvm");
    drop(PmemRegion::create(&p, MIN_REGION_SIZE, UUID, &RegionOptions::default()).unwrap());
    let n = open(&p, false);
    // Not seeded: a flagged checkpoint cannot be read from it.
    assert!(!n.is_seeded().unwrap());
    assert_eq!(fault_of(&n.read(3).unwrap_err()), RegionFault::Stale);

    let a = nat_of(&g, &[(3, 10, 3), (4, 11, 3), (600, 12, 600)]);
    n.seed(&a, 3).unwrap();
    assert!(n.is_seeded().unwrap());
    assert_eq!(n.read(3).unwrap(), a);

    let b = nat_of(&g, &[(3, 20, 3), (600, 12, 600), (1200, 21, 3)]);
    assert_eq!(n.stage(4, &dirty(&g, &a, &b)).unwrap(), 3, "exactly the changed entries");
    // Staged, pack not yet durable: checkpoint 3 still reads A; once pack 4 is, B.
    assert_eq!(n.read(3).unwrap(), a);
    assert_eq!(n.read(4).unwrap(), b);
    n.apply(4).unwrap();
    assert_eq!(n.read(4).unwrap(), b);
    assert!(n.apply(4).is_err(), "applied once");
    // An unchanged dirty block logs nothing.
    assert_eq!(n.stage(5, &dirty(&g, &Nat::new(), &b)).unwrap(), 0);
    n.apply(5).unwrap();
    assert_eq!(n.read(5).unwrap(), b);
    // A region two checkpoints behind, or ahead, is stale.
    assert_eq!(fault_of(&n.read(3).unwrap_err()), RegionFault::Stale);
    assert_eq!(fault_of(&n.read(7).unwrap_err()), RegionFault::Stale);
    drop(n);
    let n = open(&p, false);
    assert_eq!(n.read(5).unwrap(), b);
    // Seeding again (an unflagged checkpoint) replaces everything.
    n.seed(&a, 9).unwrap();
    assert_eq!(n.read(9).unwrap(), a);
}

#[test]
fn corrupt_entries_and_records_are_refused_naming_the_file() {
    let g = geometry();
    let d = scratch();
    let p = d.path().join("r.nvm");
    drop(PmemRegion::create(&p, MIN_REGION_SIZE, UUID, &RegionOptions::default()).unwrap());
    let n = open(&p, false);
    let a = nat_of(&g, &[(3, 10, 3)]);
    n.seed(&a, 1).unwrap();
    let b = nat_of(&g, &[(3, 11, 3)]);
    n.stage(2, &dirty(&g, &a, &b)).unwrap();
    let l = n.layout();
    drop(n);
    let good = std::fs::read(&p).unwrap();
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut img = good.clone();
        f(&mut img);
        std::fs::write(&p, &img).unwrap();
        open(&p, false)
    };
    // An entry pointing outside the main area.
    let n = with(&|img| {
        img[8192 + 8 * 5..8192 + 8 * 6]
            .copy_from_slice(&NatEntry { block_addr: 1, ino: 5 }.to_word().to_le_bytes())
    });
    let e = n.read(1).unwrap_err();
    assert_eq!(fault_of(&e), RegionFault::Corrupt);
    assert!(e.to_string().contains(&p.display().to_string()) && e.to_string().contains("node 5"), "{e}");
    drop(n);
    // A log record of another checkpoint.
    let n = with(&|img| img[l.log + 4..l.log + 8].copy_from_slice(&7u32.to_le_bytes()));
    assert_eq!(fault_of(&n.read(2).unwrap_err()), RegionFault::Corrupt);
    drop(n);
    // A count beyond the log's capacity.
    let n = with(&|img| img[4096 + 8..4096 + 12].copy_from_slice(&u32::MAX.to_le_bytes()));
    assert_eq!(fault_of(&n.read(2).unwrap_err()), RegionFault::Corrupt);
    drop(n);
    let n = with(&|_| {});
    assert_eq!(n.read(2).unwrap(), b);
}

/// xorshift64*, for sampling subsets.
pub(super) fn next(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// Crash images of `cm`: every subset of the pending words when there are few, else a sample,
/// plus images where a word with several values landed with an older one.
pub(super) fn images(cm: &PmemCrash, seed: &mut u64) -> Vec<Vec<u8>> {
    let p = cm.pending().len();
    let mut out = Vec::new();
    if p <= 6 {
        for mask in 0u64..1 << p {
            out.push(cm.image_with(|i, w| (mask >> i & 1 != 0).then(|| w.values.len() - 1)));
        }
    } else {
        out.push(cm.image_with(|_, _| None));
        out.push(cm.everything());
        for _ in 0..48 {
            let mask = next(seed);
            out.push(cm.image_with(|i, w| (mask >> (i % 64) & 1 != 0).then(|| w.values.len() - 1)));
        }
    }
    for (j, w) in cm.pending().iter().enumerate() {
        for k in 0..w.values.len().saturating_sub(1) {
            out.push(cm.image_with(|i, _| (i == j).then_some(k)));
        }
    }
    out
}

/// Runs checkpoint `version` (from `old` to `new`) on a recording region and checks every crash
/// state: before the stage is complete only `version - 1` can be the pack in force and the NAT
/// read is `old`; once it is, pack `version` may be durable and reads `new` (and after a settle
/// the entries in place are `new`); before apply starts, pack `version - 1` is still possible.
fn crash_window(n: &NvmNat, version: u64, old: &Nat, new: &Nat, scratch: &Path) -> usize {
    let g = geometry();
    let r = n.region();
    let k0 = r.recorded_events();
    n.stage(version, &dirty(&g, old, new)).unwrap();
    let k1 = r.recorded_events();
    n.apply(version).unwrap();
    let k2 = r.recorded_events();
    assert!(k0 < k1 && k1 < k2);
    let mut seed = 0x9E37_79B9_7F4A_7C15 ^ version;
    let mut states = 0;
    for k in k0..=k2 {
        let cm = r.crash_model_at(k).unwrap();
        for img in images(&cm, &mut seed) {
            states += 1;
            std::fs::write(scratch, &img).unwrap();
            let c = open(scratch, false);
            if k <= k1 {
                assert_eq!(&c.read(version - 1).unwrap(), old, "crash at event {k}, pack {}", version - 1);
            }
            if k >= k1 {
                assert_eq!(&c.read(version).unwrap(), new, "crash at event {k}, pack {version}");
                c.settle(version).unwrap();
                assert_eq!(&c.read(version).unwrap(), new, "settled at event {k}");
                // Settled: the in-place entries alone are the new NAT (a log of the next
                // checkpoint would be ignored on top of them).
                c.stage(version + 1, &[]).unwrap();
                assert_eq!(&c.read(version).unwrap(), new, "in place after settle, event {k}");
            }
        }
    }
    states
}

#[test]
fn every_crash_state_resolves_to_the_nat_of_the_pack_in_force() {
    let g = geometry();
    let d = scratch();
    let p = d.path().join("r.nvm");
    let s = d.path().join("crash.nvm");
    drop(PmemRegion::create(&p, MIN_REGION_SIZE, UUID, &RegionOptions::default()).unwrap());
    let a = nat_of(&g, &[(3, 10, 3), (4, 11, 3), (5, 12, 5), (600, 13, 600), (601, 14, 600)]);
    open(&p, false).seed(&a, 10).unwrap();
    let n = open(&p, true);
    // Checkpoint 11: moves, frees, new ids in a block never used.
    let b = nat_of(
        &g,
        &[(3, 20, 3), (5, 12, 5), (600, 21, 600), (601, 22, 600), (2000, 23, 2000), (2001, 24, 2000)],
    );
    let mut states = crash_window(&n, 11, &a, &b, &s);
    // Checkpoint 12, after one with a non-empty log: its log replaces that one.
    let c = nat_of(&g, &[(3, 30, 3), (600, 21, 600), (2000, 31, 2000), (7, 32, 7)]);
    states += crash_window(&n, 12, &b, &c, &s);
    assert!(states > 200, "{states} crash states");
}
