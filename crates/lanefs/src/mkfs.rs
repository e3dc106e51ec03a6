//! mkfs: lay out an empty file system on a device.
//!
//! Writes the root directory's inode, the NAT and SIT blocks that describe it, the summaries of
//! every lane's first active segments, both checkpoint packs, and finally both superblocks. The old
//! superblocks are zeroed and flushed first, so a crash during mkfs leaves an image that is not
//! mistaken for a finished one. Stale blocks of an earlier format are never trusted: NAT and
//! SIT blocks count only where the new checkpoint's copy maps say they were written, both old
//! packs are invalidated first, and checkpoint versions start at a random base so an old node footer cannot
//! pass for one written under the new checkpoint.

use crate::checkpoint::{commit, CommitSet};
use crate::device::{BlockDevice, ReadReq, BLOCK_SIZE};
use crate::engine::JOURNAL_LOG;
use crate::error::Result;
use crate::format::checkpoint::{LogCursor, CP_FLAG_CLEAN};
use crate::format::layout::{Geometry, LogType, SegNo, LOG_TYPES, ROOT_INO, SIT_ENTRIES_PER_BLOCK};
use crate::format::node::{Inode, Node, NodeBody, NodeFooter, Timespec};
use crate::format::sit::SitEntry;
use crate::format::ssa::{SummaryEntry, SummaryKind};
use crate::format::superblock::SB_ADDRS;
use crate::format::{
    Checkpoint, CopyMap, LaneCheckpoint, NatBlock, NatEntry, SegmentSummary, SitBlock, Superblock,
};
use crate::seg::SegmentTable;
use std::sync::Arc;

/// How to format.
#[derive(Debug, Clone)]
pub struct MkfsOptions {
    /// Lanes (sets of active logs); one per core is the usual choice.
    pub lanes: u32,
    /// Up to 31 bytes of label (`format::superblock::LABEL_MAX`); more are cut off.
    pub label: String,
    /// Owner of the root directory.
    pub root_uid: u32,
    /// Group of the root directory.
    pub root_gid: u32,
    /// Tell the device that every block is unused (punches holes in an image file).
    pub discard: bool,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions { lanes: 2, label: String::new(), root_uid: 0, root_gid: 0, discard: true }
    }
}

/// Seconds and nanoseconds now.
pub fn now() -> Timespec {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

fn random_bytes() -> [u8; 16] {
    let mut b = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_ok();
    if !filled {
        // No /dev/urandom: mix the clock and the process id; uniqueness, not secrecy, matters.
        let t = now();
        b[..8].copy_from_slice(&(t.sec as u64 ^ (t.nsec as u64) << 32).to_le_bytes());
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    b[6] = (b[6] & 0x0F) | 0x40; // RFC 4122 version 4
    b[8] = (b[8] & 0x3F) | 0x80;
    b
}

/// Names a file system or partition table already on the device, if any.
pub fn detect_existing(dev: &dyn BlockDevice) -> Result<Option<&'static str>> {
    let blocks = dev.block_count().min(17);
    if blocks == 0 {
        return Ok(None);
    }
    let mut buf = vec![0u8; blocks as usize * BLOCK_SIZE];
    dev.read_batch(&mut [ReadReq { addr: 0, buf: &mut buf }])?;
    let at = |off: usize, pat: &[u8]| buf.get(off..off + pat.len()) == Some(pat);
    Ok(if at(0, b"LNFS") {
        Some("lanefs")
    } else if at(1080, &[0x53, 0xEF]) {
        Some("ext2/ext3/ext4")
    } else if at(0, b"XFSB") {
        Some("xfs")
    } else if at(0x10040, b"_BHRfS_M") {
        Some("btrfs")
    } else if at(1024, &0xF2F5_2010u32.to_le_bytes()) {
        Some("f2fs")
    } else if at(4086, b"SWAPSPACE2") {
        Some("swap")
    } else if at(0, b"hsqs") {
        Some("squashfs")
    } else if at(510, &[0x55, 0xAA]) {
        Some("a partition table or FAT boot sector")
    } else {
        None
    })
}

/// Formats `dev` and returns the new superblock.
pub fn format_device(dev: &dyn BlockDevice, opts: &MkfsOptions) -> Result<Superblock> {
    let g = Geometry::compute(dev.block_count(), opts.lanes)?;
    let t = now();
    let uuid = random_bytes();
    let mut sb = Superblock::new(g, uuid, t.sec.max(0) as u64);
    let label = opts.label.as_bytes();
    let n = label.len().min(crate::format::superblock::LABEL_MAX);
    sb.label[..n].copy_from_slice(&label[..n]);

    // 1. No valid superblock until the end; invalidate both old checkpoint packs too.
    let zero = vec![0u8; BLOCK_SIZE];
    for addr in SB_ADDRS.into_iter().chain([g.cp_pack_addr(0), g.cp_pack_addr(1)]) {
        dev.write_block(addr, &zero)?;
    }
    dev.flush()?;
    if opts.discard {
        // Best effort: a device that cannot discard still gets a correct format.
        let _ = dev.discard(g.main_blkaddr, g.main_blocks());
    }

    // 2. Lane l's log t starts in segment l * 6 + t (`first_segment`).
    let lanes = g.lanes as usize;
    let active: Vec<(SegNo, u32, LogType)> = (0..lanes)
        .flat_map(|l| LogType::ALL.iter().map(move |&t| (first_segment(l, t as usize), l as u32, t)))
        .collect();
    let table = Arc::new(SegmentTable::new(g, vec![SitEntry::default(); g.main_segments as usize], &[])?);
    for &(segno, lane, log) in &active {
        table.activate_free(segno, lane, log, 0)?;
    }

    // 3. The root directory's inode, first block of lane 0's hot node log.
    let root_seg = active.iter().find(|a| a.1 == 0 && a.2 == LogType::HotNode).expect("lane 0").0;
    let root_addr = g.seg_start(root_seg);
    table.validate(root_addr, 0)?;
    let cp_ver = u64::from_le_bytes(random_bytes()[..8].try_into().expect("8 bytes")) >> 24 << 16;
    let mut root = Inode::new(0o040755, opts.root_uid, opts.root_gid, t);
    root.nlink = 2;
    root.parent = ROOT_INO;
    let node = Node {
        footer: NodeFooter { nid: ROOT_INO, ino: ROOT_INO, cp_ver, ..Default::default() },
        body: NodeBody::Inode(Box::new(root)),
    };
    dev.write_block(root_addr, &node.encode()?)?;

    // Pack 1 is "current" so the commit lands in pack 0. Then the same state again into pack 1,
    // so that one corrupt pack on a fresh image still leaves a valid checkpoint to mount.
    let (mut cp, set) = first_checkpoint(&g, &active, &table, root_seg, root_addr, cp_ver);
    let pack = commit(dev, &g, &mut cp, 1, &set)?;
    cp.version += 1;
    commit(dev, &g, &mut cp, pack, &CommitSet { nat: vec![], sit: vec![], summaries: vec![] })?;

    // 4. Superblocks last.
    let sb_bytes = sb.encode();
    for addr in SB_ADDRS {
        dev.write_block(addr, &sb_bytes)?;
    }
    dev.flush()?;
    debug_assert_eq!(table.total_valid(), 1);
    Ok(sb)
}

/// The segment lane `lane`'s log `log` starts in on a new image (step 2 of `format_device`):
/// the lanes' logs take the first segments, six to a lane.
fn first_segment(lane: usize, log: usize) -> SegNo {
    debug_assert!(log < LOG_TYPES, "log {log} of {LOG_TYPES}");
    SegNo((lane * LOG_TYPES + log) as u32)
}

/// The first checkpoint of a new image and what it commits: the root inode at `root_addr`
/// (the first block of segment `root_seg`) as the one valid block and node, every lane's logs
/// at the start of their `active` segments, and each lane's journal head at the first block
/// of its journal log, reserved here.
fn first_checkpoint(
    g: &Geometry,
    active: &[(SegNo, u32, LogType)],
    table: &SegmentTable,
    root_seg: SegNo,
    root_addr: u64,
    cp_ver: u64,
) -> (Checkpoint, CommitSet) {
    let journal_lane = |segno: SegNo| -> Option<u32> {
        (segno.index() % LOG_TYPES == JOURNAL_LOG as usize).then_some(segno.0 / LOG_TYPES as u32)
    };
    let mut nat0 = NatBlock::empty(0);
    nat0.entries[ROOT_INO as usize] = NatEntry { block_addr: root_addr as u32, ino: ROOT_INO };
    let summaries: Vec<SegmentSummary> = active
        .iter()
        .map(|&(segno, _, _)| {
            let mut s = SegmentSummary::empty(segno);
            if segno == root_seg {
                s.entries[0] = SummaryEntry { kind: SummaryKind::Node, nid: ROOT_INO, ofs: 0 };
            }
            if let Some(lane) = journal_lane(segno) {
                s.entries[0] = SummaryEntry { kind: SummaryKind::Journal, nid: lane, ofs: 0 };
            }
            s
        })
        .collect();
    let sit_blocks: Vec<SitBlock> =
        (0..=(active.len() as u32 - 1) / SIT_ENTRIES_PER_BLOCK).map(|i| table.sit_block(i)).collect();
    let lanes: Vec<LaneCheckpoint> = (0..g.lanes as usize)
        .map(|l| LaneCheckpoint {
            logs: std::array::from_fn(|t| {
                let segno = first_segment(l, t);
                LogCursor { segno, next_off: u16::from(segno == root_seg || journal_lane(segno).is_some()) }
            }),
            journal_head: g.seg_start(first_segment(l, JOURNAL_LOG as usize)) as u32,
            journal_seq: 0,
        })
        .collect();
    let cp = Checkpoint {
        version: cp_ver,
        flags: CP_FLAG_CLEAN,
        elapsed_secs: 0,
        valid_blocks: 1,
        valid_nodes: 1,
        valid_inodes: 1,
        next_nid: ROOT_INO + 1,
        user_bytes_written: 0,
        gc_bytes_written: 0,
        cp_bytes_written: 0,
        stamp: 0,
        reserved_blocks: 0,
        // The root has generation 0 (as the kernel's FUSE root inode); new inodes start at 1.
        next_generation: 1,
        nat_map: CopyMap::new(g.nat_blocks),
        sit_map: CopyMap::new(g.sit_blocks),
        lanes,
        orphans: Vec::new(),
    };
    (cp, CommitSet { nat: vec![nat0], sit: sit_blocks, summaries })
}
