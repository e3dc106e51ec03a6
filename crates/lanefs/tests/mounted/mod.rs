//! A mounted image for the DISKFS tests: a formatted `MemDevice` loaded the way mount loads it
//! (superblock, newest checkpoint, NAT, SIT, lanes from the active segments' summaries), and a
//! checkpoint that writes exactly what the tables say changed.

#![allow(dead_code)]

use lanefs::device::{BlockDevice, MemDevice, WriteReq};
use lanefs::format::layout::{Geometry, LogType, SegNo};
use lanefs::format::Checkpoint;
use lanefs::testing::checkpoint::{self, commit, CommitSet};
use lanefs::testing::nat::NatTable;
use lanefs::testing::node::NodeWriter;
use lanefs::testing::seg::{LaneSet, SegmentTable};
use lanefs::{format_device, MkfsOptions};
use std::sync::Arc;

pub const MIB: u64 = 1 << 20;

/// A fresh image of `size` bytes with `lanes` lanes.
pub fn mkfs(size: u64, lanes: u32) -> MemDevice {
    let dev = MemDevice::new(size);
    format_device(&dev, &MkfsOptions { lanes, ..Default::default() }).unwrap();
    dev
}

pub struct Mounted {
    pub g: Geometry,
    pub cp: Checkpoint,
    pub pack: u32,
    pub nat: NatTable,
    pub table: Arc<SegmentTable>,
    pub lanes: LaneSet,
}

impl Mounted {
    pub fn load(dev: &dyn BlockDevice) -> Mounted {
        Self::load_with_slots(dev, 4)
    }

    pub fn load_with_slots(dev: &dyn BlockDevice, slots: usize) -> Mounted {
        let g = checkpoint::read_superblock(dev).unwrap().sb.geometry;
        let cpr = checkpoint::read_checkpoint(dev, &g).unwrap();
        let cp = cpr.cp;
        let nat = NatTable::load_with_slots(dev, &g, &cp, slots).unwrap();
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
        Mounted { g, cp, pack: cpr.pack, nat, table, lanes }
    }

    pub fn writer(&self, lane: u32, cpu: usize) -> NodeWriter<'_> {
        NodeWriter {
            g: &self.g,
            nat: &self.nat,
            lanes: &self.lanes,
            lane,
            cpu,
            cp_ver: self.cp.version + 1,
            mtime: 1,
        }
    }

    /// Commits a checkpoint of everything the tables hold, then releases what it freed.
    /// Returns the number of NAT blocks written.
    pub fn checkpoint(&mut self, dev: &dyn BlockDevice) -> usize {
        let nat = self.nat.take_dirty_blocks();
        let nat_written = nat.len();
        let sit = self.table.take_dirty_sit_blocks().into_iter().map(|(_, b)| b).collect();
        let mut summaries = self.lanes.take_closed_summaries();
        summaries.extend(self.lanes.active_summaries());
        for (lane, c) in self.cp.lanes.iter_mut().zip(self.lanes.cursors()) {
            lane.logs = c;
        }
        self.cp.version += 1;
        self.cp.valid_blocks = self.table.total_valid();
        self.cp.valid_nodes = self.nat.valid_nodes();
        self.cp.valid_inodes = self.nat.valid_inodes();
        self.cp.next_nid = self.nat.next_nid_hint();
        // The node tests write inodes with generations of their own (small numbers): the
        // counter stays past them, as the engine's does past every inode it wrote.
        self.cp.next_generation = self.cp.next_generation.max(1 << 10);
        self.pack =
            commit(dev, &self.g, &mut self.cp, self.pack, &CommitSet { nat, sit, summaries }).unwrap();
        self.table.checkpoint_done(|_| {});
        self.nat.checkpoint_done();
        nat_written
    }
}

/// Writes (address, block) pairs in one batch.
pub fn write_all(dev: &dyn BlockDevice, blocks: &[(u64, Vec<u8>)]) {
    let reqs: Vec<WriteReq> = blocks.iter().map(|(a, d)| WriteReq { addr: *a, data: d }).collect();
    dev.write_batch(&reqs).unwrap();
}
