//! A test-only image builder: writes directories, files and hard links straight into a
//! formatted image through the real segment allocator and checkpoint commit, so fsck can be
//! tested against real images and against deliberately broken ones. Files hold at most
//! `INODE_ADDRS` blocks (no direct nodes), which is all these tests need.

#![allow(dead_code)]

use lanefs::device::{BlockDevice, BLOCK_SIZE};
use lanefs::format::dentry::dtype_of;
use lanefs::format::layout::{Geometry, LogType, SegNo, ROOT_INO};
use lanefs::format::node::{Inode, NodeBody, NodeFooter, Timespec, INODE_ADDRS};
use lanefs::format::{Checkpoint, Dentry, DentryBlock, NatBlock, NatEntry, Node, SummaryEntry, SummaryKind};
use lanefs::testing::checkpoint::{self, commit, CommitSet};
use lanefs::testing::seg::{LaneSet, SegmentTable};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub struct Builder<'a> {
    pub dev: &'a dyn BlockDevice,
    pub g: Geometry,
    pub cp: Checkpoint,
    pack: u32,
    pub table: Arc<SegmentTable>,
    lanes: LaneSet,
    nat: BTreeMap<u32, NatBlock>,
    dirty_nat: BTreeSet<u32>,
    pub inodes: BTreeMap<u32, Inode>,
    pub dirs: BTreeMap<u32, Vec<Dentry>>,
    next_nid: u32,
}

impl<'a> Builder<'a> {
    /// Loads a freshly formatted image (root directory only).
    pub fn open(dev: &'a dyn BlockDevice) -> Builder<'a> {
        let sb = checkpoint::read_superblock(dev).unwrap().sb;
        let g = sb.geometry;
        let cpr = checkpoint::read_checkpoint(dev, &g).unwrap();
        let cp = cpr.cp;
        let nat = checkpoint::read_nat(dev, &g, &cp).unwrap();
        let sit = checkpoint::read_sit(dev, &g, &cp).unwrap();
        let active: Vec<(SegNo, u32, LogType)> = cp
            .lanes
            .iter()
            .enumerate()
            .flat_map(|(l, lane)| {
                lane.logs.iter().zip(LogType::ALL).map(move |(c, t)| (c.segno, l as u32, t))
            })
            .collect();
        let table = Arc::new(SegmentTable::new(g, sit, &active).unwrap());
        let cursors: Vec<_> = cp.lanes.iter().map(|l| l.logs).collect();
        let sums = cp
            .lanes
            .iter()
            .map(|l| l.logs.iter().map(|c| checkpoint::read_summary(dev, &g, c.segno).unwrap()).collect())
            .collect();
        let lanes = LaneSet::new(table.clone(), &cursors, sums).unwrap();
        let root_addr = nat[&0].entries[ROOT_INO as usize].block_addr;
        let mut buf = vec![0u8; BLOCK_SIZE];
        dev.read_block(root_addr as u64, &mut buf).unwrap();
        let root = match Node::decode(&buf, &g, None).unwrap().body {
            NodeBody::Inode(i) => *i,
            _ => panic!("root is not an inode"),
        };
        Builder {
            dev,
            g,
            cp,
            pack: cpr.pack,
            table,
            lanes,
            nat,
            dirty_nat: BTreeSet::new(),
            inodes: BTreeMap::from([(ROOT_INO, root)]),
            dirs: BTreeMap::from([(ROOT_INO, Vec::new())]),
            next_nid: ROOT_INO + 1,
        }
    }

    fn now() -> Timespec {
        Timespec { sec: 1_700_000_000, nsec: 5 }
    }

    fn new_inode(&mut self, parent: u32, name: &str, mode: u32) -> u32 {
        let ino = self.next_nid;
        self.next_nid += 1;
        let mut i = Inode::new(mode, 1000, 1000, Self::now());
        i.parent = parent;
        i.name = name.as_bytes().to_vec();
        self.inodes.insert(ino, i);
        self.add_entry(parent, name, ino);
        ino
    }

    /// Adds a directory entry (and nothing else: link counts are the caller's business).
    pub fn add_entry(&mut self, parent: u32, name: &str, ino: u32) {
        let ft = dtype_of(self.inodes[&ino].mode);
        self.dirs.get_mut(&parent).expect("parent is a directory").push(Dentry {
            ino,
            file_type: ft,
            name: name.as_bytes().to_vec(),
        });
    }

    pub fn mkdir(&mut self, parent: u32, name: &str) -> u32 {
        let ino = self.new_inode(parent, name, 0o040755);
        self.inodes.get_mut(&ino).unwrap().nlink = 2;
        self.inodes.get_mut(&parent).unwrap().nlink += 1;
        self.dirs.insert(ino, Vec::new());
        ino
    }

    pub fn create(&mut self, parent: u32, name: &str, data: &[u8]) -> u32 {
        let ino = self.new_inode(parent, name, 0o100644);
        let nblocks = data.len().div_ceil(BLOCK_SIZE);
        assert!(nblocks <= INODE_ADDRS);
        for (idx, chunk) in data.chunks(BLOCK_SIZE).enumerate() {
            let owner = SummaryEntry { kind: SummaryKind::Data, nid: ino, ofs: idx as u32 };
            let addr = self.lanes.alloc(0, LogType::WarmData, owner, 1).unwrap();
            let mut blk = vec![0u8; BLOCK_SIZE];
            blk[..chunk.len()].copy_from_slice(chunk);
            self.dev.write_block(addr, &blk).unwrap();
            self.inodes.get_mut(&ino).unwrap().addrs[idx] = addr as u32;
        }
        let i = self.inodes.get_mut(&ino).unwrap();
        i.size = data.len() as u64;
        i.blocks = nblocks as u64;
        ino
    }

    pub fn link(&mut self, ino: u32, parent: u32, name: &str) {
        self.add_entry(parent, name, ino);
        self.inodes.get_mut(&ino).unwrap().nlink += 1;
    }

    /// Writes dentry blocks, every inode, NAT, SIT, SSA and a new checkpoint.
    pub fn commit(mut self) {
        let mut written_nodes: Vec<(u32, u64)> = Vec::new();
        let dirs: Vec<(u32, Vec<Dentry>)> = self.dirs.iter().map(|(k, v)| (*k, v.clone())).collect();
        for (dir, entries) in dirs {
            let blocks = DentryBlock::pack(dir, entries);
            let inode = self.inodes.get_mut(&dir).unwrap();
            for (idx, b) in blocks.iter().enumerate() {
                let owner = SummaryEntry { kind: SummaryKind::Data, nid: dir, ofs: idx as u32 };
                let addr = self.lanes.alloc(0, LogType::HotData, owner, 1).unwrap();
                self.dev.write_block(addr, &b.encode().unwrap()).unwrap();
                inode.addrs[idx] = addr as u32;
            }
            inode.blocks = blocks.len() as u64;
            inode.size = (blocks.len() * BLOCK_SIZE) as u64;
        }
        for (&ino, inode) in &self.inodes {
            let (bi, slot) = NatBlock::locate(ino);
            let old = self.nat.get(&bi).map(|b| b.entries[slot]).unwrap_or_default();
            if !old.is_free() {
                self.table.invalidate(old.block_addr as u64).unwrap();
            }
            let owner = SummaryEntry { kind: SummaryKind::Node, nid: ino, ofs: 0 };
            let addr = self.lanes.alloc(0, LogType::HotNode, owner, 1).unwrap();
            let node = Node {
                footer: NodeFooter { nid: ino, ino, cp_ver: self.cp.version + 1, ..Default::default() },
                body: NodeBody::Inode(Box::new(inode.clone())),
            };
            self.dev.write_block(addr, &node.encode().unwrap()).unwrap();
            written_nodes.push((ino, addr));
        }
        for (ino, addr) in written_nodes {
            let (bi, slot) = NatBlock::locate(ino);
            self.nat.entry(bi).or_insert_with(|| NatBlock::empty(bi)).entries[slot] =
                NatEntry { block_addr: addr as u32, ino };
            self.dirty_nat.insert(bi);
        }
        let mut summaries = self.lanes.take_closed_summaries();
        summaries.extend(self.lanes.active_summaries());
        let sit = self.table.take_dirty_sit_blocks().into_iter().map(|(_, b)| b).collect();
        let nat = self.dirty_nat.iter().map(|i| self.nat[i].clone()).collect();
        let cursors = self.lanes.cursors();
        for (lane, c) in self.cp.lanes.iter_mut().zip(cursors) {
            lane.logs = c;
        }
        self.cp.version += 1;
        self.cp.valid_blocks = self.table.total_valid();
        self.cp.valid_nodes = self.inodes.len() as u64;
        self.cp.valid_inodes = self.inodes.len() as u64;
        self.cp.next_nid = self.next_nid;
        commit(self.dev, &self.g, &mut self.cp, self.pack, &CommitSet { nat, sit, summaries }).unwrap();
    }
}
