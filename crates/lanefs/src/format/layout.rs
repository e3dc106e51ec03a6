//! Geometry: where every area of the image lives, derived from its size and lane count alone.
//!
//! ```text
//! block 0,1      superblock copies A and B
//! cp area        two checkpoint packs, alternating (header, payload blocks, footer)
//! NAT area       two copies of every NAT block; the checkpoint says which copy is current
//! SIT area       two copies of every SIT block; likewise
//! SSA area       two summary blocks per main segment
//! main area      segment aligned; segments written append-only by the lanes' logs
//! ```
//!
//! Because the geometry is a pure function of `(total_blocks, lanes)`, the superblock decoder
//! recomputes it and rejects a superblock whose stored areas disagree: a corrupt area address
//! can never send a later read outside the image.

use crate::error::{Error, Result};
use std::fmt;

/// Block size of the format: the device's, 4 KiB.
pub const BLOCK_SIZE: usize = crate::device::BLOCK_SIZE;
/// Blocks per segment (2 MiB segments).
pub const BLOCKS_PER_SEG: u32 = 512;
/// Log types of every lane, as in F2FS.
pub const LOG_TYPES: usize = 6;
/// Upper bound on lanes; each lane owns six active segments.
pub const MAX_LANES: u32 = 64;
/// Orphan inodes (unlinked while open) a checkpoint can record.
pub const ORPHAN_CAPACITY: u32 = 4096;
/// Node id of the root directory; equals FUSE's root inode number.
pub const ROOT_INO: u32 = 1;
/// Images larger than this would overflow 32-bit block addresses.
pub const MAX_TOTAL_BLOCKS: u64 = u32::MAX as u64 - 1;

/// The number of a main-area segment, counted from the first segment of the main area.
///
/// A segment number, a block address and a count of segments are all integers; as its own
/// type a segment number cannot be passed where an address or a count is meant, nor one of
/// those where a segment is. Its bytes on disk are the `u32` inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SegNo(pub u32);

impl SegNo {
    /// The segment's position in a table with one entry per main segment (SIT entries, the
    /// segment table).
    pub fn index(self) -> usize {
        self.0 as usize
    }
    /// The segment after this one (the end of a run of consecutive segments).
    pub fn next(self) -> SegNo {
        SegNo(self.0 + 1)
    }
}

impl fmt::Display for SegNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The six logs of a lane (F2FS temperature separation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum LogType {
    /// Directories' dentry blocks.
    HotData = 0,
    /// Regular files' data.
    WarmData = 1,
    /// Data the checkpoint moved for the cleaner (it outlived a segment), and xattr blocks.
    ColdData = 2,
    /// Directories' nodes.
    HotNode = 3,
    /// Other inodes' nodes.
    WarmNode = 4,
    /// Xattr nodes, and the lanes' journal chains.
    ColdNode = 5,
}

impl LogType {
    /// Every log type, in order.
    pub const ALL: [LogType; LOG_TYPES] = [
        LogType::HotData,
        LogType::WarmData,
        LogType::ColdData,
        LogType::HotNode,
        LogType::WarmNode,
        LogType::ColdNode,
    ];
    /// The log type numbered `v`, if any.
    pub fn from_u8(v: u8) -> Option<LogType> {
        LogType::ALL.get(v as usize).copied()
    }
    /// Whether the log holds nodes (else data).
    pub fn is_node(self) -> bool {
        matches!(self, LogType::HotNode | LogType::WarmNode | LogType::ColdNode)
    }
    /// Short name, for inspect.
    pub fn name(self) -> &'static str {
        match self {
            LogType::HotData => "hot-data",
            LogType::WarmData => "warm-data",
            LogType::ColdData => "cold-data",
            LogType::HotNode => "hot-node",
            LogType::WarmNode => "warm-node",
            LogType::ColdNode => "cold-node",
        }
    }
}

/// Entries per NAT block (16-byte header, 8-byte entries).
pub const NAT_ENTRIES_PER_BLOCK: u32 = 510;
/// Entries per SIT block (16-byte header, 76-byte entries).
pub const SIT_ENTRIES_PER_BLOCK: u32 = 53;
/// Usable payload bytes in a checkpoint payload block.
pub const CP_PAYLOAD_PER_BLOCK: usize = BLOCK_SIZE - super::codec::HEADER_LEN;

/// Where everything is. All addresses are block numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Size of the image in blocks.
    pub total_blocks: u64,
    /// Lanes: sets of active logs, one per core usually.
    pub lanes: u32,
    /// First block of the two checkpoint packs.
    pub cp_blkaddr: u64,
    /// Blocks of one checkpoint pack, header and footer included.
    pub cp_pack_blocks: u32,
    /// First block of the NAT (two copies).
    pub nat_blkaddr: u64,
    /// NAT blocks in one copy.
    pub nat_blocks: u32,
    /// First block of the SIT (two copies).
    pub sit_blkaddr: u64,
    /// SIT blocks in one copy.
    pub sit_blocks: u32,
    /// First block of the SSA (one block per main segment).
    pub ssa_blkaddr: u64,
    /// First block of the main area.
    pub main_blkaddr: u64,
    /// Segments in the main area.
    pub main_segments: u32,
    /// Node ids are `1..=max_nid`.
    pub max_nid: u32,
    /// Segments kept free for the cleaner to make progress.
    pub reserved_segments: u32,
}

impl Geometry {
    /// Lays out an image of `total_blocks` blocks with `lanes` lanes.
    pub fn compute(total_blocks: u64, lanes: u32) -> Result<Geometry> {
        if lanes == 0 || lanes > MAX_LANES {
            return Err(Error::InvalidArgument(format!(
                "lanes must be between 1 and {MAX_LANES}, got {lanes}"
            )));
        }
        if total_blocks > MAX_TOTAL_BLOCKS {
            return Err(Error::InvalidArgument(format!(
                "image of {} bytes is larger than the 16 TiB lanefs supports",
                total_blocks.saturating_mul(BLOCK_SIZE as u64)
            )));
        }
        Self::compute_unchecked(total_blocks, lanes)
            .filter(Geometry::meets_minimum)
            .ok_or_else(|| Self::too_small(total_blocks, lanes))
    }

    fn with_main(total_blocks: u64, lanes: u32, main_segments: u32) -> Geometry {
        let max_nid = (main_segments as u64 * BLOCKS_PER_SEG as u64).min(u32::MAX as u64 - 1) as u32;
        let nat_blocks = (max_nid as u64 + 1).div_ceil(NAT_ENTRIES_PER_BLOCK as u64) as u32;
        let sit_blocks = (main_segments as u64).div_ceil(SIT_ENTRIES_PER_BLOCK as u64).max(1) as u32;
        let payload = super::checkpoint::payload_capacity(nat_blocks, sit_blocks, lanes);
        let cp_pack_blocks = 2 + payload.div_ceil(CP_PAYLOAD_PER_BLOCK) as u32;
        let cp_blkaddr = 2;
        let nat_blkaddr = cp_blkaddr + 2 * cp_pack_blocks as u64;
        let sit_blkaddr = nat_blkaddr + 2 * nat_blocks as u64;
        let ssa_blkaddr = sit_blkaddr + 2 * sit_blocks as u64;
        let meta_end = ssa_blkaddr + super::ssa::SSA_BLOCKS_PER_SEG as u64 * main_segments as u64;
        let main_blkaddr = meta_end.div_ceil(BLOCKS_PER_SEG as u64) * BLOCKS_PER_SEG as u64;
        Geometry {
            total_blocks,
            lanes,
            cp_blkaddr,
            cp_pack_blocks,
            nat_blkaddr,
            nat_blocks,
            sit_blkaddr,
            sit_blocks,
            ssa_blkaddr,
            main_blkaddr,
            main_segments,
            max_nid,
            reserved_segments: (main_segments / 50).max(4),
        }
    }

    /// Segments a lane count needs at the least: six active logs per lane, the cleaner's
    /// reserve, and room for a few segments to fill and free.
    pub fn min_main_segments(lanes: u32) -> u32 {
        LOG_TYPES as u32 * lanes + 4 + 8
    }

    fn meets_minimum(&self) -> bool {
        self.main_segments >= Self::min_main_segments(self.lanes)
            && self.main_segments >= self.reserved_segments * 2
    }

    fn too_small(total_blocks: u64, lanes: u32) -> Error {
        Error::InvalidArgument(format!(
            "image of {} MiB is too small for {lanes} lanes: the minimum is {} MiB",
            total_blocks.saturating_mul(BLOCK_SIZE as u64) >> 20,
            Self::min_size_bytes(lanes) >> 20
        ))
    }

    /// The smallest image size in bytes that holds `lanes` lanes.
    pub fn min_size_bytes(lanes: u32) -> u64 {
        let lanes = lanes.clamp(1, MAX_LANES);
        let mut segs = Self::min_main_segments(lanes) as u64;
        loop {
            let total = (segs + 1) * BLOCKS_PER_SEG as u64;
            if Self::compute_unchecked(total, lanes).is_some_and(|g| g.meets_minimum()) {
                return total * BLOCK_SIZE as u64;
            }
            segs += 1;
            if segs > 1 << 20 {
                return u64::MAX;
            }
        }
    }

    /// The layout for the image size, whether or not it meets the minimum.
    fn compute_unchecked(total_blocks: u64, lanes: u32) -> Option<Geometry> {
        let bps = BLOCKS_PER_SEG as u64;
        let mut m = total_blocks / bps;
        for _ in 0..64 {
            let g = Self::with_main(total_blocks, lanes, m as u32);
            if g.main_blkaddr + m * bps <= total_blocks {
                return Some(g);
            }
            let fit = total_blocks.saturating_sub(g.main_blkaddr) / bps;
            if fit >= m || fit == 0 {
                break;
            }
            m = fit;
        }
        None
    }

    /// Block address of checkpoint pack `pack` (0 or 1).
    pub fn cp_pack_addr(&self, pack: u32) -> u64 {
        debug_assert!(pack < 2);
        self.cp_blkaddr + pack as u64 * self.cp_pack_blocks as u64
    }
    /// Block address of copy `copy` (0 or 1) of NAT block `index`.
    pub fn nat_block_addr(&self, index: u32, copy: u8) -> u64 {
        debug_assert!(index < self.nat_blocks && copy < 2);
        self.nat_blkaddr + copy as u64 * self.nat_blocks as u64 + index as u64
    }
    /// Block address of copy `copy` of SIT block `index`.
    pub fn sit_block_addr(&self, index: u32, copy: u8) -> u64 {
        debug_assert!(index < self.sit_blocks && copy < 2);
        self.sit_blkaddr + copy as u64 * self.sit_blocks as u64 + index as u64
    }
    /// Block address of the first of the summary blocks of main segment `segno`.
    pub fn ssa_block_addr(&self, segno: SegNo) -> u64 {
        debug_assert!(self.has_segment(segno));
        self.ssa_blkaddr + super::ssa::SSA_BLOCKS_PER_SEG as u64 * segno.0 as u64
    }
    /// First block of main segment `segno`.
    pub fn seg_start(&self, segno: SegNo) -> u64 {
        self.main_blkaddr + segno.0 as u64 * BLOCKS_PER_SEG as u64
    }
    /// Whether `segno` is a segment of the main area.
    pub fn has_segment(&self, segno: SegNo) -> bool {
        segno.0 < self.main_segments
    }
    /// Every main segment, in order.
    pub fn segments(&self) -> impl Iterator<Item = SegNo> {
        (0..self.main_segments).map(SegNo)
    }
    /// Whether `addr` lies in the main area.
    pub fn in_main(&self, addr: u64) -> bool {
        addr >= self.main_blkaddr
            && addr < self.main_blkaddr + self.main_segments as u64 * BLOCKS_PER_SEG as u64
    }
    /// Segment number and offset of a main-area block, or None outside main.
    pub fn seg_of(&self, addr: u64) -> Option<(SegNo, u32)> {
        if !self.in_main(addr) {
            return None;
        }
        let rel = addr - self.main_blkaddr;
        Some((SegNo((rel / BLOCKS_PER_SEG as u64) as u32), (rel % BLOCKS_PER_SEG as u64) as u32))
    }
    /// Blocks usable for user data and nodes in the main area.
    pub fn main_blocks(&self) -> u64 {
        self.main_segments as u64 * BLOCKS_PER_SEG as u64
    }

    /// Free segments ordinary writes leave alone. A checkpoint may need a fresh segment in
    /// every log it writes (each log fills whole segments) and the cleaner needs room to move
    /// blocks before it frees any: the format's reserve, but never fewer than one segment per
    /// log type plus two (small images).
    pub fn cleaning_reserve(&self) -> u64 {
        (self.reserved_segments as u64).max(LOG_TYPES as u64 + 2)
    }

    /// Blocks users can fill: the main area less the cleaning reserve and one open segment per
    /// log of every lane (a log's open segment cannot be cleaned). Invalid blocks inside this
    /// count as free: the cleaner gives them back.
    pub fn user_blocks(&self) -> u64 {
        self.main_blocks()
            .saturating_sub(self.cleaning_reserve() * BLOCKS_PER_SEG as u64)
            .saturating_sub(self.open_blocks())
    }

    /// One segment per log of every lane: the logs' open segments.
    pub fn open_blocks(&self) -> u64 {
        self.lanes as u64 * LOG_TYPES as u64 * BLOCKS_PER_SEG as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn areas_are_disjoint_and_inside_the_image() {
        for &size_mb in &[64u64, 100, 1024, 4096, 65536] {
            for lanes in [1, 2, 4] {
                let total = size_mb * 256;
                let g = match Geometry::compute(total, lanes) {
                    Ok(g) => g,
                    Err(_) => continue,
                };
                assert!(g.cp_blkaddr >= 2);
                assert_eq!(g.nat_blkaddr, g.cp_blkaddr + 2 * g.cp_pack_blocks as u64);
                assert!(g.sit_blkaddr >= g.nat_blkaddr + 2 * g.nat_blocks as u64);
                assert!(g.ssa_blkaddr >= g.sit_blkaddr + 2 * g.sit_blocks as u64);
                assert!(g.main_blkaddr >= g.ssa_blkaddr + 2 * g.main_segments as u64);
                assert_eq!(g.main_blkaddr % BLOCKS_PER_SEG as u64, 0);
                assert!(g.main_blkaddr + g.main_blocks() <= total);
                // Nearly all of the image is main area.
                assert!(g.main_blocks() * 100 / total >= 90, "{size_mb} MiB: {g:?}");
                assert!(g.max_nid as u64 <= g.main_blocks());
            }
        }
    }

    #[test]
    fn minimum_size_is_exact() {
        for lanes in [1, 2, 8, 64] {
            let min = Geometry::min_size_bytes(lanes);
            assert!(Geometry::compute(min / 4096, lanes).is_ok(), "lanes {lanes} min {min}");
            let below = min / 4096 - BLOCKS_PER_SEG as u64;
            let e = Geometry::compute(below, lanes).unwrap_err();
            assert!(e.to_string().contains("minimum"), "{e}");
        }
        assert!(Geometry::compute(1 << 20, 0).is_err());
        assert!(Geometry::compute(1 << 20, MAX_LANES + 1).is_err());
        assert!(Geometry::compute(0, 1).is_err());
        assert!(Geometry::compute(u64::MAX, 1).is_err());
    }
}
