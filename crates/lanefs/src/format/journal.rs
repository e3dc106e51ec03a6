//! Journal blocks: a lane's records of directory operations, chained for roll-forward.
//!
//! The payload (merged operation-log records) is opaque here; the engine's flush layer defines
//! it. The container gives recovery what it needs to walk a lane's chain safely: the checkpoint
//! version and sequence number the block was written under (a stale block from an earlier pass
//! over the same segment fails the check), and the address of the next block.
//!
//! The word after the next pointer (written 0 before it had a meaning, and still 0 when unknown)
//! is the *flushed-through* mark: `back` > 0 says that every block of the lane's chain with a seq
//! below `seq + 1 - back` (and the data its transactions map) was on stable storage before this
//! block was written. Recovery trusts it to skip reading back those transactions' data; a block
//! written without it (0, by older versions too) just leaves them to be checked. Older versions
//! ignore the word, so images stay readable both ways.

use super::codec::{seal, BlockHeader, Dec, Enc, HEADER_LEN};
use super::layout::{Geometry, BLOCK_SIZE};
use crate::error::{Result, Structure};

/// Magic of a journal block ("LNJR").
pub const JOURNAL_MAGIC: u32 = u32::from_le_bytes(*b"LNJR");
const FIXED: usize = HEADER_LEN + 24;
/// Payload bytes one journal block carries.
pub const JOURNAL_PAYLOAD: usize = BLOCK_SIZE - FIXED;
/// Flag: the block carries the first bytes of a transaction.
pub const TXN_START: u16 = 1;
/// Flag: the block carries the last bytes of a transaction (a one-block transaction has both).
pub const TXN_END: u16 = 2;

/// One block of a lane's journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalBlock {
    /// The lane whose chain the block is in.
    pub lane: u16,
    /// `TXN_START` and `TXN_END` bits.
    pub flags: u16,
    /// Version of the checkpoint the chain continues (blocks of older chains are stale).
    pub cp_ver: u64,
    /// Position in the lane's chain: one more than the block before.
    pub seq: u64,
    /// Address of the next block of the chain (reserved before this one is written).
    pub next_blkaddr: u32,
    /// The flushed-through mark (see the module docs): 0 unknown, else at most `seq + 1`.
    pub flushed_back: u32,
    /// Bytes of the transactions' records this block carries.
    pub payload: Vec<u8>,
}

impl JournalBlock {
    /// The seq below which the mark says the chain was durable when this block was written
    /// (None: unknown). Decoding checked that it is not negative.
    pub fn flushed_through(&self) -> Option<u64> {
        (self.flushed_back != 0).then(|| self.seq.saturating_sub(self.flushed_back as u64 - 1))
    }

    /// The mark for a block at `seq` written when the chain was durable below `through` (the
    /// seq the mark stands for): 0 when unknown (`through` 0 or above `seq`, which no writer
    /// can know) or too far back for the word.
    pub fn back_for(seq: u64, through: u64) -> u32 {
        if through == 0 || through > seq {
            return 0;
        }
        u32::try_from(seq - through + 1).unwrap_or(0)
    }

    /// The block's bytes, checksummed.
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.payload.len() <= JOURNAL_PAYLOAD, "journal payload too large");
        let mut b = vec![0u8; BLOCK_SIZE];
        BlockHeader {
            magic: JOURNAL_MAGIC,
            a: self.lane as u32 | (self.flags as u32) << 16,
            b: self.payload.len() as u32,
        }
        .write(&mut b);
        let mut e = Enc::at(&mut b, HEADER_LEN);
        e.u64(self.cp_ver);
        e.u64(self.seq);
        e.u32(self.next_blkaddr);
        e.u32(self.flushed_back);
        e.bytes(&self.payload);
        seal(&mut b, 4);
        b
    }

    /// Decodes and validates a journal block against geometry `g`.
    pub fn decode(b: &[u8], g: &Geometry, addr: Option<u64>) -> Result<JournalBlock> {
        let h = BlockHeader::check(b, JOURNAL_MAGIC, Structure::Journal, addr)?;
        let mut d = Dec::at(b, HEADER_LEN, Structure::Journal, addr);
        let lane = (h.a & 0xFFFF) as u16;
        let flags = (h.a >> 16) as u16;
        let len = h.b as usize;
        if lane as u32 >= g.lanes {
            return Err(d.err(format!("lane {lane} does not exist")));
        }
        if len > JOURNAL_PAYLOAD {
            return Err(d.err(format!("payload length {len} too large")));
        }
        let cp_ver = d.u64()?;
        let seq = d.u64()?;
        let next_blkaddr = d.u32()?;
        let flushed_back = d.u32()?;
        if flushed_back as u64 > seq.saturating_add(1) {
            return Err(
                d.err(format!("flushed-through mark {flushed_back} reaches before seq 0 (seq {seq})"))
            );
        }
        if next_blkaddr != 0 && !g.in_main(next_blkaddr as u64) {
            return Err(d.err(format!("next block {next_blkaddr} outside the main area")));
        }
        let payload = d.bytes(len)?.to_vec();
        Ok(JournalBlock { lane, flags, cp_ver, seq, next_blkaddr, flushed_back, payload })
    }
}
