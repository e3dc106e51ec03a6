//! SSA (segment summary) blocks: for every block of a segment, who owns it.
//!
//! A data block is owned by the node holding its address (`nid`) at slot `ofs`; a node block by
//! itself; a journal block by its lane. The cleaner reads the summary to find and move the valid
//! blocks of a victim segment; fsck checks it against the owners it finds by walking the tree.

use super::codec::{seal, BlockHeader, Dec, Enc, HEADER_LEN};
use super::layout::{BLOCKS_PER_SEG, BLOCK_SIZE};
use crate::error::{Result, Structure};

pub const SSA_MAGIC: u32 = u32::from_le_bytes(*b"LNSS");

/// What a summarised block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SummaryKind {
    None = 0,
    Data = 1,
    Node = 2,
    Journal = 3,
}

/// Owner of one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryEntry {
    pub kind: SummaryKind,
    pub nid: u32,
    pub ofs: u16,
}

impl Default for SummaryEntry {
    fn default() -> Self {
        SummaryEntry { kind: SummaryKind::None, nid: 0, ofs: 0 }
    }
}

/// The summary of one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSummary {
    pub segno: u32,
    pub entries: Vec<SummaryEntry>,
}

impl SegmentSummary {
    pub fn empty(segno: u32) -> Self {
        SegmentSummary { segno, entries: vec![SummaryEntry::default(); BLOCKS_PER_SEG as usize] }
    }

    pub fn encode(&self) -> Vec<u8> {
        assert_eq!(self.entries.len(), BLOCKS_PER_SEG as usize);
        let mut b = vec![0u8; BLOCK_SIZE];
        BlockHeader { magic: SSA_MAGIC, a: self.segno, b: 0 }.write(&mut b);
        let mut e = Enc::at(&mut b, HEADER_LEN);
        for en in &self.entries {
            e.u32(en.nid);
            e.u16(en.ofs);
            e.u8(en.kind as u8);
        }
        seal(&mut b, 4);
        b
    }

    pub fn decode(b: &[u8], segno: u32, max_nid: u32, addr: Option<u64>) -> Result<SegmentSummary> {
        let h = BlockHeader::check(b, SSA_MAGIC, Structure::Ssa, addr)?;
        let mut d = Dec::at(b, HEADER_LEN, Structure::Ssa, addr);
        if h.a != segno {
            return Err(d.err(format!("summarises segment {}, expected {segno}", h.a)));
        }
        let mut entries = Vec::with_capacity(BLOCKS_PER_SEG as usize);
        for off in 0..BLOCKS_PER_SEG {
            let nid = d.u32()?;
            let ofs = d.u16()?;
            let kind = match d.u8()? {
                0 => SummaryKind::None,
                1 => SummaryKind::Data,
                2 => SummaryKind::Node,
                3 => SummaryKind::Journal,
                k => return Err(d.err(format!("block {off}: unknown kind {k}"))),
            };
            if kind != SummaryKind::None && kind != SummaryKind::Journal && (nid == 0 || nid > max_nid) {
                return Err(d.err(format!("block {off}: owner node {nid} out of range")));
            }
            entries.push(SummaryEntry { kind, nid, ofs });
        }
        Ok(SegmentSummary { segno, entries })
    }
}
