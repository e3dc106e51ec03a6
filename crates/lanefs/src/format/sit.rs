//! SIT blocks: per main segment, how many blocks are valid, which ones, of which log type,
//! and when the segment was last written (age for cost-benefit cleaning).
//!
//! Segment `s` lives in SIT block `s / 53`, slot `s % 53`. A decoded entry always has
//! `valid_blocks == popcount(bitmap)`; anything else is corruption.

use super::codec::{seal, BlockHeader, Dec, Enc, HEADER_LEN};
use super::layout::{LogType, SegNo, BLOCKS_PER_SEG, BLOCK_SIZE, SIT_ENTRIES_PER_BLOCK};
use crate::error::{Result, Structure};

/// Magic of a SIT block ("LNST").
pub const SIT_MAGIC: u32 = u32::from_le_bytes(*b"LNST");
const BITMAP_BYTES: usize = BLOCKS_PER_SEG as usize / 8;
const _: () = assert!(BITMAP_BYTES * 8 == BLOCKS_PER_SEG as usize, "one bit per block of a segment");
/// Bytes of one encoded entry: valid count, log type, pad, mtime, bitmap.
const SIT_ENTRY_LEN: usize = 2 + 1 + 1 + 8 + BITMAP_BYTES;
const _: () = assert!(HEADER_LEN + SIT_ENTRY_LEN * SIT_ENTRIES_PER_BLOCK as usize <= BLOCK_SIZE);
/// Log type byte of a segment no log has written since it was last free.
pub const NO_LOG: u8 = 0xFF;

/// Validity of one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitEntry {
    /// Valid blocks in the segment.
    pub valid_blocks: u16,
    /// The log type that wrote the segment, or `NO_LOG`.
    pub log_type: u8,
    /// Age stamp of its last write (cost-benefit cleaning).
    pub mtime: u64,
    /// One bit per block: valid or not.
    pub bitmap: [u8; BITMAP_BYTES],
}

impl Default for SitEntry {
    fn default() -> Self {
        SitEntry { valid_blocks: 0, log_type: NO_LOG, mtime: 0, bitmap: [0; BITMAP_BYTES] }
    }
}

impl SitEntry {
    /// Whether block `off` of the segment is valid.
    pub fn is_valid(&self, off: u32) -> bool {
        self.bitmap[off as usize / 8] & (1 << (off % 8)) != 0
    }
    /// Marks block `off` valid; returns false if it already was.
    pub fn set_valid(&mut self, off: u32) -> bool {
        if self.is_valid(off) {
            return false;
        }
        self.bitmap[off as usize / 8] |= 1 << (off % 8);
        self.valid_blocks += 1;
        true
    }
    /// Marks block `off` invalid; returns false if it already was.
    pub fn clear_valid(&mut self, off: u32) -> bool {
        if !self.is_valid(off) {
            return false;
        }
        self.bitmap[off as usize / 8] &= !(1 << (off % 8));
        self.valid_blocks -= 1;
        true
    }
}

/// One SIT block: 53 consecutive segment entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitBlock {
    /// Which SIT block this is.
    pub index: u32,
    /// Its segment entries.
    pub entries: Vec<SitEntry>,
}

impl SitBlock {
    /// Block `index` with every segment free.
    pub fn empty(index: u32) -> Self {
        SitBlock { index, entries: vec![SitEntry::default(); SIT_ENTRIES_PER_BLOCK as usize] }
    }

    /// SIT block index and slot of segment `segno`.
    pub fn locate(segno: SegNo) -> (u32, usize) {
        (segno.0 / SIT_ENTRIES_PER_BLOCK, (segno.0 % SIT_ENTRIES_PER_BLOCK) as usize)
    }

    /// The block's bytes, checksummed.
    pub fn encode(&self) -> Vec<u8> {
        assert_eq!(self.entries.len(), SIT_ENTRIES_PER_BLOCK as usize);
        let mut b = vec![0u8; BLOCK_SIZE];
        BlockHeader { magic: SIT_MAGIC, a: self.index, b: 0 }.write(&mut b);
        let mut e = Enc::at(&mut b, HEADER_LEN);
        for en in &self.entries {
            e.u16(en.valid_blocks);
            e.u8(en.log_type);
            e.u8(0);
            e.u64(en.mtime);
            e.bytes(&en.bitmap);
        }
        // Paired with decode's end position: both sides walk the same SIT_ENTRY_LEN entries.
        debug_assert_eq!(e.pos(), HEADER_LEN + SIT_ENTRY_LEN * SIT_ENTRIES_PER_BLOCK as usize);
        seal(&mut b, 4);
        debug_assert_eq!(
            SitBlock::decode(&b, self.index, None).ok().as_ref(),
            Some(self),
            "the block decodes back"
        );
        b
    }

    /// Decodes and validates SIT block `index`.
    pub fn decode(b: &[u8], index: u32, addr: Option<u64>) -> Result<SitBlock> {
        let h = BlockHeader::check(b, SIT_MAGIC, Structure::Sit, addr)?;
        let mut d = Dec::at(b, HEADER_LEN, Structure::Sit, addr);
        if h.a != index {
            return Err(d.err(format!("holds SIT index {}, expected {index}", h.a)));
        }
        let mut entries = Vec::with_capacity(SIT_ENTRIES_PER_BLOCK as usize);
        for slot in 0..SIT_ENTRIES_PER_BLOCK {
            let valid_blocks = d.u16()?;
            let log_type = d.u8()?;
            let _pad = d.u8()?;
            let mtime = d.u64()?;
            let bitmap: [u8; BITMAP_BYTES] = d.bytes(BITMAP_BYTES)?.try_into().expect("64 bytes");
            let count: u32 = bitmap.iter().map(|x| x.count_ones()).sum();
            if count != valid_blocks as u32 {
                return Err(
                    d.err(format!("segment slot {slot}: valid count {valid_blocks} but bitmap has {count}"))
                );
            }
            if log_type != NO_LOG && LogType::from_u8(log_type).is_none() {
                return Err(d.err(format!("segment slot {slot}: unknown log type {log_type}")));
            }
            entries.push(SitEntry { valid_blocks, log_type, mtime, bitmap });
        }
        debug_assert_eq!(d.pos(), HEADER_LEN + SIT_ENTRY_LEN * SIT_ENTRIES_PER_BLOCK as usize);
        Ok(SitBlock { index, entries })
    }
}
