//! SSA (segment summary): for every block of a segment, who owns it. Two blocks per segment.
//!
//! A data block is owned by its inode at a logical block index (`nid` = inode, `ofs` = index),
//! so a block can be summarised when it is allocated, before the direct node that will point
//! at it exists; a node block by itself (`nid`, `ofs` = its position in the inode's tree); an
//! xattr block by its inode at its index in the set's stream; a journal block by its lane. The
//! cleaner reads the summary to find and move the valid blocks of a victim segment; fsck checks
//! it against the owners it finds by walking the tree.
//! Entries are nine bytes, so a segment's 512 entries take two blocks of 256.

use super::codec::{seal, BlockHeader, Dec, Enc, HEADER_LEN};
use super::layout::{SegNo, BLOCKS_PER_SEG, BLOCK_SIZE};
use crate::error::{Error, Result, Structure};

/// Magic of an SSA block ("LNSS").
pub const SSA_MAGIC: u32 = u32::from_le_bytes(*b"LNSS");
/// SSA blocks per segment.
pub const SSA_BLOCKS_PER_SEG: u32 = 2;
const PER_BLOCK: usize = BLOCKS_PER_SEG as usize / SSA_BLOCKS_PER_SEG as usize;
const _: () = assert!(PER_BLOCK * SSA_BLOCKS_PER_SEG as usize == BLOCKS_PER_SEG as usize);
/// Bytes of one encoded entry: node id, offset, kind.
const SUMMARY_ENTRY_LEN: usize = 4 + 4 + 1;
const _: () = assert!(HEADER_LEN + SUMMARY_ENTRY_LEN * PER_BLOCK <= BLOCK_SIZE);

/// What a summarised block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SummaryKind {
    /// The block holds nothing.
    None = 0,
    /// File data: `nid` is the inode, `ofs` the block index.
    Data = 1,
    /// A node: `nid` is the node.
    Node = 2,
    /// A journal block.
    Journal = 3,
    /// An xattr block of an inode (`nid` = inode, `ofs` = the block's index in its set's stream).
    Xattr = 4,
}

/// Owner of one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryEntry {
    /// What the block holds.
    pub kind: SummaryKind,
    /// Its owner node (see `SummaryKind`).
    pub nid: u32,
    /// Its offset in the owner.
    pub ofs: u32,
}

impl Default for SummaryEntry {
    fn default() -> Self {
        SummaryEntry { kind: SummaryKind::None, nid: 0, ofs: 0 }
    }
}

/// The summary of one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSummary {
    /// The segment summarized.
    pub segno: SegNo,
    /// One entry per block of the segment.
    pub entries: Vec<SummaryEntry>,
}

impl SegmentSummary {
    /// The summary of segment `segno` with every block empty.
    pub fn empty(segno: SegNo) -> Self {
        SegmentSummary { segno, entries: vec![SummaryEntry::default(); BLOCKS_PER_SEG as usize] }
    }

    /// Encodes the summary as `SSA_BLOCKS_PER_SEG` contiguous blocks.
    pub fn encode(&self) -> Vec<u8> {
        assert_eq!(self.entries.len(), BLOCKS_PER_SEG as usize);
        let mut out = vec![0u8; BLOCK_SIZE * SSA_BLOCKS_PER_SEG as usize];
        for (half, (b, entries)) in out.chunks_mut(BLOCK_SIZE).zip(self.entries.chunks(PER_BLOCK)).enumerate()
        {
            BlockHeader { magic: SSA_MAGIC, a: self.segno.0, b: half as u32 }.write(b);
            let mut e = Enc::at(b, HEADER_LEN);
            for en in entries {
                e.u32(en.nid);
                e.u32(en.ofs);
                e.u8(en.kind as u8);
            }
            // Paired with decode's per-block end position.
            debug_assert_eq!(e.pos(), HEADER_LEN + SUMMARY_ENTRY_LEN * entries.len());
            seal(b, 4);
        }
        debug_assert_eq!(
            SegmentSummary::decode(&out, self.segno, u32::MAX, None).ok().as_ref(),
            Some(self),
            "the summary decodes back"
        );
        out
    }

    /// Decodes the `SSA_BLOCKS_PER_SEG` blocks of segment `segno`'s summary.
    pub fn decode(b: &[u8], segno: SegNo, max_nid: u32, addr: Option<u64>) -> Result<SegmentSummary> {
        if b.len() != BLOCK_SIZE * SSA_BLOCKS_PER_SEG as usize {
            return Err(Error::corrupt(Structure::Ssa, addr, "summary has the wrong length"));
        }
        let mut entries = Vec::with_capacity(BLOCKS_PER_SEG as usize);
        for (half, blk) in b.chunks(BLOCK_SIZE).enumerate() {
            let at = addr.map(|a| a + half as u64);
            let h = BlockHeader::check(blk, SSA_MAGIC, Structure::Ssa, at)?;
            let mut d = Dec::at(blk, HEADER_LEN, Structure::Ssa, at);
            if h.a != segno.0 || h.b != half as u32 {
                return Err(
                    d.err(format!("summarises segment {} part {}, expected {segno} part {half}", h.a, h.b))
                );
            }
            for i in 0..PER_BLOCK {
                let off = half * PER_BLOCK + i;
                let nid = d.u32()?;
                let ofs = d.u32()?;
                let kind = match d.u8()? {
                    0 => SummaryKind::None,
                    1 => SummaryKind::Data,
                    2 => SummaryKind::Node,
                    3 => SummaryKind::Journal,
                    4 => SummaryKind::Xattr,
                    k => return Err(d.err(format!("block {off}: unknown kind {k}"))),
                };
                let owned = matches!(kind, SummaryKind::Data | SummaryKind::Node | SummaryKind::Xattr);
                if owned && (nid == 0 || nid > max_nid) {
                    return Err(d.err(format!("block {off}: owner node {nid} out of range")));
                }
                entries.push(SummaryEntry { kind, nid, ofs });
            }
            debug_assert_eq!(d.pos(), HEADER_LEN + SUMMARY_ENTRY_LEN * PER_BLOCK);
        }
        Ok(SegmentSummary { segno, entries })
    }
}
