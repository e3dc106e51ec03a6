//! Node trees on real images: round trips at every shape boundary, rewrites that touch only
//! the changed nodes, random sparse maps, deletion, failures without side effects, corrupt
//! children, and an end-to-end image that fsck finds clean and that reloads identically.

mod mounted;

use lanefs::device::{BlockDevice, MemDevice, BLOCK_SIZE};
use lanefs::format::dentry::dtype_of;
use lanefs::format::layout::{Geometry, LogType, ROOT_INO};
use lanefs::format::node::{Inode, Timespec, ADDRS_PER_NODE, INODE_ADDRS, NEW_ADDR};
use lanefs::format::tree::{NodePos, MAX_FILE_BLOCKS};
use lanefs::format::{Dentry, DentryBlock, SummaryEntry, SummaryKind};
use lanefs::rng::Rng;
use lanefs::testing::node::{drop_inode, read_inode, write_inode, BlockMap, InodeTree};
use lanefs::Error;
use lanefs::Structure;
use lanefs::{fsck, FsckOptions};
use mounted::{mkfs, write_all, Mounted, MIB};
use std::collections::{BTreeMap, BTreeSet};

const I: u64 = INODE_ADDRS as u64;
const N: u64 = ADDRS_PER_NODE as u64;
/// First block of the double-indirect range.
const DIND: u64 = I + 2 * N + 2 * N * N;

fn file(size_blocks: u64) -> Inode {
    let mut i = Inode::new(0o100644, 1000, 100, Timespec { sec: 1_700_000_000, nsec: 42 });
    i.size = size_blocks * BLOCK_SIZE as u64;
    i.name = b"f".to_vec();
    i.parent = ROOT_INO;
    i.generation = 7;
    i
}

/// A fake but valid data address (node tests need no real data blocks).
fn data_addr(g: &Geometry, k: u64) -> u32 {
    (g.main_blkaddr + k.wrapping_mul(7919) % g.main_blocks()) as u32
}

fn dense(g: &Geometry, n: u64) -> BlockMap {
    (0..n).map(|i| (i, data_addr(g, i + 1))).collect()
}

/// Writes `map` over `old`, writes the blocks to the device, reads the inode back and checks
/// it against what was written. Returns the new tree and the number of node blocks written.
fn round_trip(
    dev: &dyn BlockDevice,
    m: &Mounted,
    inode: &Inode,
    map: &BlockMap,
    old: &InodeTree,
) -> (InodeTree, usize) {
    let w = m.writer(0, 0);
    let (tree, blocks) = write_inode(&w, inode, map, old, LogType::WarmNode).unwrap();
    write_all(dev, &blocks);
    let (back, back_map, back_tree) = read_inode(dev, &m.g, &m.nat, old.ino).unwrap();
    assert_eq!(&back_map, map, "block map of inode {}", old.ino);
    assert_eq!(back_tree, tree);
    let mut want = inode.clone();
    want.addrs = back.addrs.clone();
    want.nids = back.nids;
    want.blocks = map.len() as u64;
    assert_eq!(back, want, "attributes of inode {}", old.ino);
    (tree, blocks.len())
}

/// The checks every rewrite must pass: unchanged nodes keep their blocks, replaced and
/// dropped blocks are dead, dropped ids are free, written blocks are live and mapped.
fn check_rewrite(m: &Mounted, old: &InodeTree, new: &InodeTree, written: usize) {
    let mut changed = 0;
    for (pos, n) in new.nodes() {
        assert!(m.table.is_valid(n.addr as u64), "node at {pos:?} is not live");
        assert_eq!(m.nat.get(n.nid).block_addr, n.addr);
        match old.node(pos) {
            Some(o) if o.slots == n.slots => {
                assert_eq!(o.addr, n.addr, "unchanged node at {pos:?} rewritten")
            }
            Some(o) => {
                assert_eq!(o.nid, n.nid, "a kept position changed its id");
                assert_ne!(o.addr, n.addr);
                assert!(!m.table.is_valid(o.addr as u64), "replaced block {} still live", o.addr);
                changed += 1;
            }
            None => changed += 1,
        }
    }
    for (pos, o) in old.nodes() {
        if new.node(pos).is_none() {
            assert!(!m.table.is_valid(o.addr as u64), "dropped node block {} still live", o.addr);
            assert!(m.nat.get(o.nid).is_free(), "dropped node id {} still mapped", o.nid);
            assert!(!m.nat.is_allocatable(o.nid), "dropped id {} reusable before a checkpoint", o.nid);
        }
    }
    if old.inode_addr != 0 {
        assert!(!m.table.is_valid(old.inode_addr as u64), "old inode block still live");
    }
    assert_eq!(written, changed + 1, "written blocks = changed nodes + the inode");
    m.table.check_invariants().unwrap();
    m.nat.check_counters().unwrap();
}

fn new_ino(m: &Mounted) -> u32 {
    m.nat.alloc_nid(0).unwrap()
}

#[test]
fn round_trip_at_every_shape_boundary() {
    let dev = mkfs(256 * MIB, 2);
    let m = Mounted::load(&dev);
    let g = m.g;
    let far = DIND + 2 * N * N + 3 * N + 5;
    let cases: Vec<(&str, BlockMap, usize)> = vec![
        ("empty", BlockMap::new(), 0),
        ("one block", dense(&g, 1), 0),
        ("inode full", dense(&g, I), 0),
        ("first direct node", dense(&g, I + 1), 1),
        ("into the first indirect", dense(&g, I + 2 * N + 1), 4),
        ("sparse double indirect", BTreeMap::from([(far, data_addr(&g, 3))]), 3),
        ("last block of the largest file", BTreeMap::from([(MAX_FILE_BLOCKS - 1, NEW_ADDR)]), 3),
        (
            "sparse everywhere",
            BTreeMap::from([
                (0, NEW_ADDR),
                (I + N + 3, data_addr(&g, 1)),
                (I + 2 * N + N * N + 2, data_addr(&g, 2)),
                (DIND, data_addr(&g, 3)),
                (DIND + N, data_addr(&g, 4)),
                (DIND + N * N, data_addr(&g, 5)),
            ]),
            // root1; root3 + child; root4 + child0 (2 directs) + child1 (1 direct)
            1 + 2 + 1 + 2 + 2 + 1,
        ),
    ];
    for (what, map, nodes) in cases {
        let ino = new_ino(&m);
        let inode = file(map.keys().last().map_or(0, |k| k + 1));
        let (tree, written) = round_trip(&dev, &m, &inode, &map, &InodeTree::empty(ino));
        assert_eq!(tree.node_count(), nodes, "{what}: nodes");
        assert_eq!(written, nodes + 1, "{what}: blocks written");
        assert_eq!(m.nat.get(ino).ino, ino);
        for (pos, n) in tree.nodes() {
            assert_eq!(m.nat.get(n.nid).ino, ino, "{what}: node at {pos:?}");
        }
    }
    assert_eq!(m.nat.valid_inodes(), 9);
    m.nat.check_counters().unwrap();
}

#[test]
fn rewrites_touch_only_changed_nodes() {
    let dev = mkfs(256 * MIB, 2);
    let m = Mounted::load(&dev);
    let g = m.g;
    let ino = new_ino(&m);
    let mut map = dense(&g, I + 2 * N + 1);
    map.insert(DIND + 5, data_addr(&g, 99));
    let inode = file(DIND + 6);
    let (t0, w0) = round_trip(&dev, &m, &inode, &map, &InodeTree::empty(ino));
    // root0, root1, root2 + child0, root4 + child0 + grandchild0
    assert_eq!((t0.node_count(), w0), (7, 8));

    // 1. Change one address in the first direct node: that node and the inode.
    map.insert(I + 10, data_addr(&g, 5000));
    let (t1, w1) = round_trip(&dev, &m, &inode, &map, &t0);
    check_rewrite(&m, &t0, &t1, w1);
    assert_eq!(w1, 2);

    // 2. Attributes only: just the inode.
    let mut renamed = inode.clone();
    renamed.mtime.sec += 5;
    renamed.size += 1;
    let (t2, w2) = round_trip(&dev, &m, &renamed, &map, &t1);
    check_rewrite(&m, &t1, &t2, w2);
    assert_eq!(w2, 1);

    // 3. A block in a new direct node under the first indirect: the new node and its parent.
    map.insert(I + 2 * N + N + 1, NEW_ADDR);
    let (t3, w3) = round_trip(&dev, &m, &renamed, &map, &t2);
    check_rewrite(&m, &t2, &t3, w3);
    assert_eq!(w3, 3);
    let root2 = NodePos::root(2);
    assert_ne!(t3.node(root2).unwrap().addr, t2.node(root2).unwrap().addr);

    // 4. Empty the second direct node and drop the double-indirect block: four nodes go.
    for k in I + N..I + 2 * N {
        map.remove(&k);
    }
    map.remove(&(DIND + 5));
    let dropped: Vec<u32> =
        t3.nodes().filter(|(p, _)| p.root == 1 || p.root == 4).map(|(_, n)| n.nid).collect();
    assert_eq!(dropped.len(), 4);
    let (t4, w4) = round_trip(&dev, &m, &renamed, &map, &t3);
    check_rewrite(&m, &t3, &t4, w4);
    assert_eq!((t4.node_count(), w4), (4, 1));

    // 5. Truncate to nothing.
    let (t5, w5) = round_trip(&dev, &m, &renamed, &BlockMap::new(), &t4);
    check_rewrite(&m, &t4, &t5, w5);
    assert_eq!((t5.node_count(), w5), (0, 1));
    // One live node per inode remains (plus the root's).
    assert_eq!((m.nat.valid_nodes(), m.nat.valid_inodes()), (2, 2));

    // The dropped ids come back only after a checkpoint.
    let mut m = m;
    m.checkpoint(&dev);
    for nid in dropped {
        assert!(m.nat.is_allocatable(nid), "dropped id {nid} not reusable after the checkpoint");
    }
}

/// A logical block index, biased to the boundaries of the tree shape.
fn tree_index(rng: &mut Rng) -> u64 {
    let edges = [0, I - 1, I, I + N - 1, I + N, I + 2 * N - 1, I + 2 * N, I + 2 * N + N * N, DIND];
    match rng.below(4) {
        0 => (*rng.pick(&edges) + rng.below(3)).min(MAX_FILE_BLOCKS - 1),
        1 => rng.below(I + 2 * N + 3 * N),
        2 => DIND + rng.below(4 * N * N),
        _ => rng.below(MAX_FILE_BLOCKS),
    }
}

#[test]
fn random_sparse_maps_round_trip_and_rewrite_minimally() {
    let dev = mkfs(256 * MIB, 2);
    let mut m = Mounted::load(&dev);
    let g = m.g;
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    let mut files: Vec<(u32, BlockMap, InodeTree)> = Vec::new();
    for _ in 0..4 {
        let ino = new_ino(&m);
        files.push((ino, BlockMap::new(), InodeTree::empty(ino)));
    }
    let (mut dropped, mut deep) = (0, 0);
    for round in 0..60 {
        let f = rng.below(files.len() as u64) as usize;
        let (ino, mut map, old) = files[f].clone();
        // A few inserts, overwrites and removals.
        for _ in 0..1 + rng.below(12) {
            let idx = tree_index(&mut rng);
            match rng.below(5) {
                0 => {
                    map.remove(&idx);
                }
                1 => {
                    // Remove an existing entry, so nodes really empty out.
                    if let Some(&k) = map.keys().nth(rng.below(map.len().max(1) as u64) as usize) {
                        map.remove(&k);
                    }
                }
                2 => {
                    map.insert(idx, NEW_ADDR);
                }
                _ => {
                    map.insert(idx, data_addr(&g, rng.next_u64()));
                }
            }
        }
        let inode = file(map.keys().last().map_or(0, |k| k + 1));
        let (tree, written) = round_trip(&dev, &m, &inode, &map, &old);
        check_rewrite(&m, &old, &tree, written);
        dropped += old.nodes().filter(|(p, _)| tree.node(*p).is_none()).count();
        deep += tree.nodes().filter(|(p, _)| p.grandchild.is_some()).count();
        assert!(
            tree.nodes().all(|(p, n)| !p.is_direct() || n.slots.iter().any(|&a| a != 0)),
            "empty node kept"
        );
        files[f] = (ino, map, tree);
        if round % 20 == 19 {
            m.checkpoint(&dev);
        }
    }
    // The walk really exercised the deep end and node removal.
    assert!(dropped >= 5 && deep >= 10, "dropped {dropped} nodes, saw {deep} double-indirect leaves");
    // Everything still reads back after the rewrites, then deleting frees every node.
    let before = m.nat.valid_nodes();
    let mut removed = 0;
    for (ino, map, tree) in &files {
        let (_, back, back_tree) = read_inode(&dev, &g, &m.nat, *ino).unwrap();
        assert_eq!(&back, map);
        assert_eq!(&back_tree, tree);
        let w = m.writer(1, 1);
        drop_inode(&w, tree).unwrap();
        removed += tree.node_count() as u64 + 1;
        assert!(m.nat.get(*ino).is_free());
        assert!(!m.table.is_valid(tree.inode_addr as u64));
        for (_, n) in tree.nodes() {
            assert!(m.nat.get(n.nid).is_free());
            assert!(!m.table.is_valid(n.addr as u64));
        }
        assert!(matches!(read_inode(&dev, &g, &m.nat, *ino), Err(Error::Corrupt { .. })));
    }
    assert_eq!(m.nat.valid_nodes(), before - removed);
    assert_eq!((m.nat.valid_nodes(), m.nat.valid_inodes()), (1, 1));
    m.table.check_invariants().unwrap();
    m.nat.check_counters().unwrap();
}

#[test]
fn failed_writes_change_nothing() {
    let dev = mkfs(Geometry::min_size_bytes(1), 1);
    let m = Mounted::load_with_slots(&dev, 1);
    let g = m.g;
    let ino = new_ino(&m);
    let inode = file(I + 1);
    let (tree, _) = round_trip(&dev, &m, &inode, &dense(&g, I + 1), &InodeTree::empty(ino));
    let w = m.writer(0, 0);
    let state = |m: &Mounted| (m.nat.valid_nodes(), m.table.total_valid(), m.nat.get(ino), m.nat.has_dirty());
    m.nat.take_dirty_blocks();
    let s0 = state(&m);

    let past_end = BTreeMap::from([(MAX_FILE_BLOCKS, data_addr(&g, 1))]);
    let outside = BTreeMap::from([(3, 1u32)]);
    for bad in [past_end, outside] {
        let e = write_inode(&w, &inode, &bad, &tree, LogType::WarmNode).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert_eq!(state(&m), s0);
    }
    let e = write_inode(&w, &inode, &dense(&g, 2), &tree, LogType::WarmData).unwrap_err();
    assert!(e.to_string().contains("not a node log"), "{e}");
    let mut bad_mode = inode.clone();
    bad_mode.mode = 0o7777;
    assert!(write_inode(&w, &bad_mode, &dense(&g, 2), &tree, LogType::WarmNode).is_err());
    assert_eq!(state(&m), s0);

    // A stale tree (the one before the last write) is refused.
    let (t1, blocks) = write_inode(&w, &inode, &dense(&g, 2), &tree, LogType::HotNode).unwrap();
    write_all(&dev, &blocks);
    let e = write_inode(&w, &inode, &dense(&g, 3), &tree, LogType::HotNode).unwrap_err();
    assert!(e.to_string().contains("stale"), "{e}");
    assert!(drop_inode(&w, &tree).is_err());
    // An inode id nobody allocated is refused.
    let stranger = g.max_nid - 1;
    assert!(write_inode(&w, &inode, &BlockMap::new(), &InodeTree::empty(stranger), LogType::HotNode).is_err());
    assert!(m.nat.get(stranger).is_free());

    // Out of node ids: a write that needs a new node fails and gives back what it took.
    let mut held = Vec::new();
    while let Ok(n) = m.nat.alloc_nid(0) {
        held.push(n);
    }
    m.nat.take_dirty_blocks();
    let s1 = state(&m);
    let need_node = dense(&g, I + 1);
    assert!(matches!(write_inode(&w, &inode, &need_node, &t1, LogType::HotNode), Err(Error::NoSpace)));
    assert_eq!(state(&m), s1);
    // A write that needs no new node still works.
    let (t2, blocks) = write_inode(&w, &inode, &dense(&g, 4), &t1, LogType::HotNode).unwrap();
    write_all(&dev, &blocks);
    assert_eq!(read_inode(&dev, &g, &m.nat, ino).unwrap().1, dense(&g, 4));
    assert_eq!(t2.node_count(), 0);
    m.table.check_invariants().unwrap();
    m.nat.check_counters().unwrap();
}

fn flip(dev: &MemDevice, addr: u64, off: usize) {
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_block(addr, &mut b).unwrap();
    b[off] ^= 0x40;
    dev.write_block(addr, &b).unwrap();
}

#[test]
fn corrupt_children_are_named_errors() {
    let dev = mkfs(256 * MIB, 1);
    let m = Mounted::load(&dev);
    let g = m.g;
    let ino = new_ino(&m);
    let mut map = dense(&g, I + 2 * N + 2);
    map.insert(DIND + N * N + 1, data_addr(&g, 8));
    let (tree, _) = round_trip(&dev, &m, &file(DIND), &map, &InodeTree::empty(ino));
    let deep = tree.nodes().find(|(p, _)| p.grandchild.is_some()).map(|(p, n)| (p, n.clone())).unwrap();
    let child = tree.node(NodePos::root(2).child_at(0)).unwrap().clone();
    let image = dev.snapshot();

    // A flipped byte anywhere in a child (body or footer) names it and its block.
    for (victim, off) in [(&child, 100), (&child, BLOCK_SIZE - 20), (&deep.1, 7)] {
        flip(&dev, victim.addr as u64, off);
        let e = read_inode(&dev, &g, &m.nat, ino).unwrap_err();
        match &e {
            Error::Corrupt { structure, block, reason } => {
                assert_eq!(*structure, Structure::Node);
                assert_eq!(*block, Some(victim.addr as u64));
                assert!(reason.contains(&format!("node {}", victim.nid)), "{e}");
                assert!(reason.contains(&format!("inode {ino}")), "{e}");
            }
            other => panic!("expected a corruption error, got {other}"),
        }
        flip(&dev, victim.addr as u64, off);
        read_inode(&dev, &g, &m.nat, ino).unwrap();
    }

    // A child whose NAT entry points at another node's block: the footer gives it away.
    let other = tree.node(NodePos::root(0)).unwrap().clone();
    m.nat.set(child.nid, lanefs::format::NatEntry { block_addr: other.addr, ino });
    let e = read_inode(&dev, &g, &m.nat, ino).unwrap_err();
    assert!(
        e.to_string().contains(&format!("node {}", child.nid)) && e.to_string().contains("footer"),
        "{e}"
    );
    m.nat.set(child.nid, lanefs::format::NatEntry { block_addr: child.addr, ino });

    // An indirect node in a direct position (the inode's nids[0] made to name the indirect root).
    let root2 = tree.node(NodePos::root(2)).unwrap().clone();
    m.nat.set(other.nid, lanefs::format::NatEntry { block_addr: root2.addr, ino });
    assert!(read_inode(&dev, &g, &m.nat, ino).is_err());
    m.nat.set(other.nid, lanefs::format::NatEntry { block_addr: other.addr, ino });

    // A child owned by another inode.
    m.nat.set(deep.1.nid, lanefs::format::NatEntry { block_addr: deep.1.addr, ino: ROOT_INO });
    let e = read_inode(&dev, &g, &m.nat, ino).unwrap_err();
    assert!(e.to_string().contains(&format!("node {}", deep.1.nid)), "{e}");
    m.nat.set(deep.1.nid, lanefs::format::NatEntry { block_addr: deep.1.addr, ino });

    // The inode block itself.
    flip(&dev, tree.inode_addr as u64, 200);
    let e = read_inode(&dev, &g, &m.nat, ino).unwrap_err();
    assert!(e.to_string().contains(&format!("inode {ino}")), "{e}");
    flip(&dev, tree.inode_addr as u64, 200);
    assert_eq!(dev.snapshot(), image);
    let (_, back, _) = read_inode(&dev, &g, &m.nat, ino).unwrap();
    assert_eq!(back, map);

    // Every single-byte flip of every node block is an error, never a panic or a wrong map.
    for (_, n) in tree.nodes() {
        for off in (0..BLOCK_SIZE).step_by(509) {
            flip(&dev, n.addr as u64, off);
            match read_inode(&dev, &g, &m.nat, ino) {
                Err(Error::Corrupt { .. }) => {}
                other => panic!("flip at {off} of node {}: {:?}", n.nid, other.map(|r| r.1.len())),
            }
            flip(&dev, n.addr as u64, off);
        }
    }
}

/// One file of the end-to-end image: its inode, its map, and its tree.
struct File {
    ino: u32,
    inode: Inode,
    map: BlockMap,
    tree: InodeTree,
}

/// Allocates and writes real data blocks for logical `indexes` of `ino`.
fn data_blocks(dev: &dyn BlockDevice, m: &Mounted, ino: u32, indexes: &[u64], lane: u32) -> BlockMap {
    let mut out = BlockMap::new();
    let mut writes = Vec::new();
    for &idx in indexes {
        let owner = SummaryEntry { kind: SummaryKind::Data, nid: ino, ofs: idx as u32 };
        let a = m.lanes.alloc(lane, LogType::WarmData, owner, 1).unwrap();
        let mut b = vec![0u8; BLOCK_SIZE];
        b[..8].copy_from_slice(&idx.to_le_bytes());
        writes.push((a, b));
        out.insert(idx, a as u32);
    }
    write_all(dev, &writes);
    out
}

/// Writes a directory's dentry blocks as its whole map (old blocks are invalidated).
fn dentries(dev: &dyn BlockDevice, m: &Mounted, dir: &mut File, entries: Vec<Dentry>) {
    for &a in dir.map.values() {
        m.table.invalidate(a as u64).unwrap();
    }
    dir.map.clear();
    let mut writes = Vec::new();
    for (idx, b) in DentryBlock::pack(dir.ino, entries).iter().enumerate() {
        let owner = SummaryEntry { kind: SummaryKind::Data, nid: dir.ino, ofs: idx as u32 };
        let a = m.lanes.alloc(0, LogType::HotData, owner, 1).unwrap();
        writes.push((a, b.encode().unwrap()));
        dir.map.insert(idx as u64, a as u32);
    }
    dir.inode.size = (dir.map.len() * BLOCK_SIZE) as u64;
    write_all(dev, &writes);
}

fn entry(f: &File, name: &str) -> Dentry {
    Dentry { ino: f.ino, file_type: dtype_of(f.inode.mode), name: name.as_bytes().to_vec() }
}

/// Writes every file's inode and tree; node blocks go out in one batch.
fn write_files(dev: &dyn BlockDevice, m: &Mounted, files: &mut [&mut File]) {
    let mut batch = Vec::new();
    for (k, f) in files.iter_mut().enumerate() {
        let w = m.writer(k as u32 % m.g.lanes, k);
        let (tree, blocks) = write_inode(&w, &f.inode, &f.map, &f.tree, LogType::HotNode).unwrap();
        f.tree = tree;
        f.inode.blocks = f.map.len() as u64;
        batch.extend(blocks);
    }
    write_all(dev, &batch);
}

fn assert_reads_back(dev: &dyn BlockDevice, m: &Mounted, f: &File) {
    let (inode, map, tree) = read_inode(dev, &m.g, &m.nat, f.ino).unwrap();
    assert_eq!(map, f.map, "map of inode {}", f.ino);
    assert_eq!(tree, f.tree, "tree of inode {}", f.ino);
    let mut want = f.inode.clone();
    want.addrs = inode.addrs.clone();
    want.nids = inode.nids;
    assert_eq!(inode, want, "attributes of inode {}", f.ino);
}

fn assert_fsck_clean(dev: &dyn BlockDevice, inodes: u64) {
    let r = fsck(dev, &FsckOptions::default()).unwrap();
    assert!(r.is_clean(), "fsck found: {:#?}", r.problems);
    assert_eq!(r.stats.inodes, inodes);
}

#[test]
fn end_to_end_image_is_clean_and_reloads_identically() {
    let dev = mkfs(256 * MIB, 2);
    let mut m = Mounted::load(&dev);
    let (r_inode, r_map, r_tree) = read_inode(&dev, &m.g, &m.nat, ROOT_INO).unwrap();
    assert!(r_map.is_empty() && r_tree.node_count() == 0);
    let mut root = File { ino: ROOT_INO, inode: r_inode, map: r_map, tree: r_tree };

    let mk = |m: &Mounted, mode: u32, name: &str, parent: u32| {
        let ino = m.nat.alloc_nid(ino_cpu(name)).unwrap();
        let mut inode = Inode::new(mode, 1000, 1000, Timespec { sec: 1_700_000_000, nsec: 9 });
        inode.parent = parent;
        inode.name = name.as_bytes().to_vec();
        if mode & 0o170000 == 0o040000 {
            inode.nlink = 2;
        }
        File { ino, inode, tree: InodeTree::empty(ino), map: BlockMap::new() }
    };
    let mut small = mk(&m, 0o100644, "small", ROOT_INO);
    small.map = data_blocks(&dev, &m, small.ino, &[0, 1, 2], 0);
    let mut big = mk(&m, 0o100600, "big", ROOT_INO);
    let big_idx: Vec<u64> = (0..I + 2 * N + 5).collect();
    big.map = data_blocks(&dev, &m, big.ino, &big_idx, 1);
    let mut sparse = mk(&m, 0o100644, "sparse", ROOT_INO);
    let sparse_idx = [0, I + 25, I + N + 1, I + 2 * N + N * N + 17, DIND + 3, DIND + N * N + 2 * N + 1];
    sparse.map = data_blocks(&dev, &m, sparse.ino, &sparse_idx, 0);
    sparse.map.insert(I + 26, NEW_ADDR);
    // A preallocated block: the checkpoint counts it as reserved (fsck checks the count).
    m.cp.reserved_blocks = 1;
    let mut empty = mk(&m, 0o100644, "empty", ROOT_INO);
    let mut sub = mk(&m, 0o040755, "sub", ROOT_INO);
    let mut inner = mk(&m, 0o100644, "inner", sub.ino);
    inner.map = data_blocks(&dev, &m, inner.ino, &[0], 1);
    for f in [&mut small, &mut big, &mut sparse, &mut inner] {
        f.inode.size = f.map.keys().last().map_or(0, |k| (k + 1) * BLOCK_SIZE as u64);
    }
    let sub_entries = vec![entry(&inner, "inner")];
    dentries(&dev, &m, &mut sub, sub_entries);
    let root_entries = vec![
        entry(&small, "small"),
        entry(&big, "big"),
        entry(&sparse, "sparse"),
        entry(&empty, "empty"),
        entry(&sub, "sub"),
    ];
    dentries(&dev, &m, &mut root, root_entries);
    root.inode.nlink = 3;
    write_files(
        &dev,
        &m,
        &mut [&mut root, &mut small, &mut big, &mut sparse, &mut empty, &mut sub, &mut inner],
    );
    assert_eq!(big.tree.node_count(), 4);
    // root0, root1, root3 + child, root4 + two children + a direct node under each
    assert_eq!(sparse.tree.node_count(), 2 + 2 + 3 + 2);

    m.checkpoint(&dev);
    assert_fsck_clean(&dev, 7);
    let files = [&root, &small, &big, &sparse, &empty, &sub, &inner];
    let m2 = Mounted::load(&dev);
    assert_eq!((m2.nat.valid_nodes(), m2.nat.valid_inodes()), (m.nat.valid_nodes(), 7));
    for f in files {
        assert_reads_back(&dev, &m2, f);
    }
    drop(m2);

    // Second generation: shrink the sparse file out of its double-indirect range, rewrite a
    // block of the big file, delete the empty file, and check again.
    for k in [DIND + 3, DIND + N * N + 2 * N + 1] {
        let a = sparse.map.remove(&k).unwrap();
        m.table.invalidate(a as u64).unwrap();
    }
    sparse.inode.size = (I + 2 * N + N * N + 18) * BLOCK_SIZE as u64;
    let old = big.map[&(I + 7)];
    m.table.invalidate(old as u64).unwrap();
    big.map.extend(data_blocks(&dev, &m, big.ino, &[I + 7], 1));
    drop_inode(&m.writer(0, 0), &empty.tree).unwrap();
    let dropped_nids: BTreeSet<u32> =
        sparse.tree.nodes().filter(|(p, _)| p.root == 4).map(|(_, n)| n.nid).chain([empty.ino]).collect();
    let root_entries =
        vec![entry(&small, "small"), entry(&big, "big"), entry(&sparse, "sparse"), entry(&sub, "sub")];
    dentries(&dev, &m, &mut root, root_entries);
    let big_before = big.tree.clone();
    write_files(&dev, &m, &mut [&mut root, &mut big, &mut sparse]);
    // Only the direct node holding block I + 7 (and the inode) was rewritten.
    let moved = big.tree.nodes().filter(|(p, n)| big_before.node(*p).unwrap().addr != n.addr).count();
    assert_eq!(moved, 1);
    assert_eq!(sparse.tree.node_count(), 2 + 2);
    m.checkpoint(&dev);
    assert_fsck_clean(&dev, 6);
    for &nid in &dropped_nids {
        assert!(m.nat.is_allocatable(nid), "id {nid} not reusable after the checkpoint");
    }
    let m3 = Mounted::load(&dev);
    for f in [&root, &small, &big, &sparse, &sub, &inner] {
        assert_reads_back(&dev, &m3, f);
    }
    assert!(read_inode(&dev, &m3.g, &m3.nat, empty.ino).is_err());
    for &nid in &dropped_nids {
        assert!(m3.nat.get(nid).is_free() && m3.nat.is_allocatable(nid));
    }
    m3.nat.check_counters().unwrap();
}

/// Spreads the end-to-end test's inode allocations over CPU slots.
fn ino_cpu(name: &str) -> usize {
    name.len()
}

#[test]
fn threads_on_different_lanes_write_inodes_concurrently() {
    let dev = mkfs(256 * MIB, 2);
    let mut m = Mounted::load_with_slots(&dev, 4);
    let files: Vec<File> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u32)
            .map(|t| {
                let (m, dev) = (&m, &dev);
                s.spawn(move || {
                    let mut rng = Rng::new(0x1234_5678 + t as u64);
                    let mut out = Vec::new();
                    for k in 0..6 {
                        let ino = m.nat.alloc_nid(t as usize).unwrap();
                        let idx: BTreeSet<u64> =
                            (0..1 + rng.below(40)).map(|_| tree_index(&mut rng)).collect();
                        let idx: Vec<u64> = idx.into_iter().collect();
                        let mut inode = file(idx.last().map_or(0, |l| l + 1));
                        inode.name = format!("t{t}-{k}").into_bytes();
                        let map = data_blocks(dev, m, ino, &idx, t % 2);
                        let w = m.writer(t % 2, t as usize);
                        let (tree, blocks) =
                            write_inode(&w, &inode, &map, &InodeTree::empty(ino), LogType::WarmNode).unwrap();
                        write_all(dev, &blocks);
                        inode.blocks = map.len() as u64;
                        out.push(File { ino, inode, map, tree });
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let inos: BTreeSet<u32> = files.iter().map(|f| f.ino).collect();
    assert_eq!(inos.len(), 24);
    let (r_inode, r_map, r_tree) = read_inode(&dev, &m.g, &m.nat, ROOT_INO).unwrap();
    let mut root = File { ino: ROOT_INO, inode: r_inode, map: r_map, tree: r_tree };
    let names: Vec<Dentry> =
        files.iter().map(|f| entry(f, std::str::from_utf8(&f.inode.name).unwrap())).collect();
    dentries(&dev, &m, &mut root, names);
    write_files(&dev, &m, &mut [&mut root]);
    m.checkpoint(&dev);
    assert_fsck_clean(&dev, 25);
    let m2 = Mounted::load(&dev);
    for f in &files {
        assert_reads_back(&dev, &m2, f);
    }
}
