//! NatTable on real images: concurrent allocation, reuse only after a checkpoint, exhaustion,
//! pin-point dirty tracking, sentinels that never reach the disk, and reload.

mod mounted;

use lanefs::device::BLOCK_SIZE;
use lanefs::format::layout::{Geometry, NAT_ENTRIES_PER_BLOCK, ROOT_INO};
use lanefs::format::{NatBlock, NatEntry};
use lanefs::testing::checkpoint::{self, commit, CommitSet};
use lanefs::testing::nat::{NatTable, NID_BATCH};
use lanefs::Error;
use mounted::{mkfs, Mounted, MIB};
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

/// A plausible node address in the main area.
fn addr(g: &Geometry, k: u32) -> u32 {
    (g.main_blkaddr + (k as u64 % g.main_blocks())) as u32
}

#[test]
fn concurrent_allocation_from_eight_cpus_is_unique() {
    let dev = mkfs(128 * MIB, 2);
    let m = Mounted::load_with_slots(&dev, 8);
    let nat = Arc::new(m.nat);
    let per_thread = 700usize;
    assert!(8 * per_thread < nat.geometry().max_nid as usize);
    let handles: Vec<_> = (0..8usize)
        .map(|cpu| {
            let nat = nat.clone();
            std::thread::spawn(move || {
                (0..per_thread).map(|_| nat.alloc_nid(cpu).unwrap()).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all = HashSet::new();
    for h in handles {
        for nid in h.join().unwrap() {
            assert!(nid >= 1 && nid <= nat.geometry().max_nid, "nid {nid} out of range");
            assert_ne!(nid, ROOT_INO, "the root's id was handed out");
            assert!(nat.is_reserved(nid));
            assert!(nat.get(nid).is_free(), "a reserved id reads as free");
            assert!(all.insert(nid), "nid {nid} handed out twice");
        }
    }
    assert_eq!(all.len(), 8 * per_thread);
    // Reservation is not a disk change.
    assert!(!nat.has_dirty());
    assert_eq!((nat.valid_nodes(), nat.valid_inodes()), (1, 1));
}

#[test]
fn freed_ids_return_only_after_the_checkpoint_that_records_them() {
    // The smallest one-lane image: exhaust its id space.
    let dev = mkfs(Geometry::min_size_bytes(1), 1);
    let m = Mounted::load_with_slots(&dev, 3);
    let (g, nat) = (m.g, &m.nat);
    let mut held = Vec::new();
    loop {
        match nat.alloc_nid(held.len() % 3) {
            Ok(n) => held.push(n),
            Err(Error::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(held.len() <= g.max_nid as usize, "allocated more ids than exist");
    }
    // Every id but the root's, across all three caches (the last ones stolen from others).
    assert_eq!(held.len(), g.max_nid as usize - 1);
    assert_eq!(held.iter().copied().collect::<HashSet<_>>().len(), held.len());
    assert!(matches!(nat.alloc_nid(0), Err(Error::NoSpace)));

    // Write ten of them, then free them; free five reserved ones that were never written.
    let written: Vec<u32> = held[100..110].to_vec();
    for (k, &nid) in written.iter().enumerate() {
        nat.set(nid, NatEntry { block_addr: addr(&g, k as u32), ino: nid });
    }
    assert_eq!((nat.valid_nodes(), nat.valid_inodes()), (11, 11));
    for &nid in &written {
        nat.set(nid, NatEntry::default());
        nat.free_nid(nid).unwrap();
        assert!(nat.get(nid).is_free());
        assert!(!nat.is_allocatable(nid));
    }
    let never_written: Vec<u32> = held[500..505].to_vec();
    for &nid in &never_written {
        nat.free_nid(nid).unwrap();
    }
    assert_eq!((nat.valid_nodes(), nat.valid_inodes()), (1, 1));
    assert!(matches!(nat.alloc_nid(1), Err(Error::NoSpace)), "freed ids reused before a checkpoint");

    // The checkpoint takes the NAT; an id freed after that waits for the next checkpoint.
    let blocks = nat.take_dirty_blocks();
    assert!(!blocks.is_empty());
    let late = held[900];
    nat.free_nid(late).unwrap();
    assert!(matches!(nat.alloc_nid(0), Err(Error::NoSpace)), "freed ids reused before checkpoint_done");
    assert_eq!(nat.checkpoint_done(), 15);
    let mut back = BTreeSet::new();
    for i in 0..15 {
        back.insert(nat.alloc_nid(i % 3).unwrap());
    }
    let want: BTreeSet<u32> = written.iter().chain(&never_written).copied().collect();
    assert_eq!(back, want);
    assert!(matches!(nat.alloc_nid(2), Err(Error::NoSpace)), "{late} came back one checkpoint early");
    nat.take_dirty_blocks();
    assert_eq!(nat.checkpoint_done(), 1);
    assert_eq!(nat.alloc_nid(0).unwrap(), late);

    // Bad frees are refused.
    assert!(matches!(nat.free_nid(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(nat.free_nid(g.max_nid + 1), Err(Error::InvalidArgument(_))));
    nat.free_nid(late).unwrap();
    nat.take_dirty_blocks();
    nat.checkpoint_done();
    assert!(matches!(nat.free_nid(late), Err(Error::InvalidArgument(_))), "freeing a free id");
    nat.check_counters().unwrap();
}

#[test]
fn set_get_round_trip_and_dirty_blocks_are_exactly_the_touched_ones() {
    let dev = mkfs(256 * MIB, 2);
    let m = Mounted::load(&dev);
    let (g, nat) = (m.g, &m.nat);
    assert!(g.nat_blocks > 100);
    // mkfs wrote block 0 only; nothing is dirty after load.
    assert!(nat.take_dirty_blocks().is_empty());
    let mut touched = BTreeSet::new();
    let mut set = Vec::new();
    // Every 7th NAT block, a few slots each, including the first and last slot of a block.
    for bi in (1..g.nat_blocks - 1).step_by(7) {
        for slot in [0u32, 1, 255, NAT_ENTRIES_PER_BLOCK - 1] {
            let nid = bi * NAT_ENTRIES_PER_BLOCK + slot;
            // Odd slots are inodes, even ones nodes of the inode two ids below.
            let ino = if slot % 2 == 1 { nid } else { nid - 2 };
            let e = NatEntry { block_addr: addr(&g, nid), ino };
            nat.set(nid, e);
            set.push((nid, e));
        }
        touched.insert(bi);
    }
    for &(nid, e) in &set {
        assert_eq!(nat.get(nid), e);
        assert!(!nat.is_allocatable(nid));
    }
    let inodes = set.iter().filter(|(n, e)| e.ino == *n).count() as u64;
    assert_eq!(nat.valid_nodes(), 1 + set.len() as u64);
    assert_eq!(nat.valid_inodes(), 1 + inodes);
    nat.check_counters().unwrap();
    assert_eq!(nat.get(0), NatEntry::default());
    assert_eq!(nat.get(g.max_nid + 1), NatEntry::default());

    let dirty = nat.take_dirty_blocks();
    let idx: BTreeSet<u32> = dirty.iter().map(|b| b.index).collect();
    assert_eq!(idx, touched);
    for b in &dirty {
        // Blocks encode and decode as the entries set, and as nothing else.
        let back = NatBlock::decode(&b.encode(), b.index, &g, None).unwrap();
        assert_eq!(&back, b);
        let live = b.entries.iter().filter(|e| !e.is_free()).count();
        assert_eq!(live, 4);
    }
    assert!(nat.take_dirty_blocks().is_empty(), "marks survive a take");

    // Overwrite one entry: only its block is dirty again; the counters do not move.
    let (nid, e) = set[5];
    nat.set(nid, NatEntry { block_addr: e.block_addr + 1, ..e });
    let again = nat.take_dirty_blocks();
    assert_eq!(again.iter().map(|b| b.index).collect::<Vec<_>>(), vec![nid / NAT_ENTRIES_PER_BLOCK]);
    assert_eq!(nat.valid_nodes(), 1 + set.len() as u64);
    nat.check_counters().unwrap();
}

#[test]
fn reserved_and_freed_entries_encode_as_free() {
    let dev = mkfs(128 * MIB, 1);
    let m = Mounted::load_with_slots(&dev, 1);
    let (g, nat) = (m.g, &m.nat);
    let reserved = nat.alloc_nid(0).unwrap();
    let written = nat.alloc_nid(0).unwrap();
    let freed = nat.alloc_nid(0).unwrap();
    // The batch comes from the start of the id space: all three share NAT block 0.
    assert!(reserved < NAT_ENTRIES_PER_BLOCK && freed < NAT_ENTRIES_PER_BLOCK);
    nat.set(written, NatEntry { block_addr: addr(&g, 3), ino: written });
    nat.set(freed, NatEntry { block_addr: addr(&g, 4), ino: written });
    nat.free_nid(freed).unwrap();
    let dirty = nat.take_dirty_blocks();
    assert_eq!(dirty.len(), 1);
    let b = &dirty[0];
    assert_eq!(b.index, 0);
    assert_eq!(b.entries[reserved as usize], NatEntry::default());
    assert_eq!(b.entries[freed as usize], NatEntry::default());
    assert_eq!(b.entries[written as usize], NatEntry { block_addr: addr(&g, 3), ino: written });
    // Decoding rejects a free entry with an owner: the sentinels really are encoded as zeros.
    let bytes = b.encode();
    NatBlock::decode(&bytes, 0, &g, None).unwrap();
    let at = 16 + reserved as usize * 8;
    assert_eq!(&bytes[at..at + 8], &[0u8; 8]);
    assert_eq!(bytes.len(), BLOCK_SIZE);
    assert!(nat.is_reserved(reserved));
    assert_eq!(nat.nat_block(0), *b);
}

#[test]
fn reload_restores_entries_counters_and_hint() {
    let dev = mkfs(128 * MIB, 1);
    let mut m = Mounted::load(&dev);
    let g = m.g;
    let mut ids = Vec::new();
    for i in 0..(3 * NID_BATCH as u32) {
        let nid = m.nat.alloc_nid(i as usize).unwrap();
        ids.push(nid);
    }
    // Make some inodes and some nodes of them far apart in the id space too.
    let far = g.max_nid - 3;
    m.nat.set(far, NatEntry { block_addr: addr(&g, 9), ino: ids[0] });
    for (k, &nid) in ids.iter().enumerate().step_by(3) {
        m.nat.set(nid, NatEntry { block_addr: addr(&g, k as u32), ino: ids[0] });
    }
    m.nat.set(ids[0], NatEntry { block_addr: addr(&g, 1), ino: ids[0] });
    let before: Vec<NatEntry> = (0..=g.max_nid).map(|n| m.nat.get(n)).collect();
    let (nodes, inodes, hint) = (m.nat.valid_nodes(), m.nat.valid_inodes(), m.nat.next_nid_hint());
    // Commit just the NAT (no fsck here: the addresses are not real nodes).
    let nat = m.nat.take_dirty_blocks();
    let written: Vec<u32> = nat.iter().map(|b| b.index).collect();
    assert_eq!(written, vec![0, far / NAT_ENTRIES_PER_BLOCK]);
    m.cp.version += 1;
    m.cp.next_nid = hint;
    commit(&dev, &g, &mut m.cp, m.pack, &CommitSet { nat, sit: vec![], summaries: vec![] }).unwrap();
    let cp = checkpoint::read_checkpoint(&dev, &g).unwrap().cp;
    assert_eq!(cp.next_nid, hint);
    let (copies, unwritten) = (0..g.nat_blocks).partition::<Vec<u32>, _>(|&i| cp.nat_map.get(i).is_some());
    assert_eq!(copies, written, "only touched NAT blocks were written");
    assert_eq!(unwritten.len() as u32, g.nat_blocks - 2);

    let back = NatTable::load(&dev, &g, &cp).unwrap();
    let after: Vec<NatEntry> = (0..=g.max_nid).map(|n| back.get(n)).collect();
    assert_eq!(before, after);
    assert_eq!((back.valid_nodes(), back.valid_inodes()), (nodes, inodes));
    assert_eq!(back.next_nid_hint(), hint);
    back.check_counters().unwrap();
    // Reservations are not durable: ids handed out but never written are free again.
    let unwritten_id = ids[1];
    assert!(back.is_allocatable(unwritten_id));
    assert!(!back.is_allocatable(ids[0]) && !back.is_allocatable(far));
}
