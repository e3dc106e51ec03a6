//! Journal blocks: a lane's records of directory operations, chained for roll-forward.
//!
//! The payload (merged operation-log records) is opaque here; the engine's flush layer defines
//! it. The container gives recovery what it needs to walk a lane's chain safely: the checkpoint
//! version and sequence number the block was written under (a stale block from an earlier pass
//! over the same segment fails the check), and the address of the next block.

use super::codec::{seal, BlockHeader, Dec, Enc, HEADER_LEN};
use super::layout::{Geometry, BLOCK_SIZE};
use crate::error::{Result, Structure};

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
    pub lane: u16,
    pub flags: u16,
    pub cp_ver: u64,
    pub seq: u64,
    pub next_blkaddr: u32,
    pub payload: Vec<u8>,
}

impl JournalBlock {
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
        e.u32(0);
        e.bytes(&self.payload);
        seal(&mut b, 4);
        b
    }

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
        let _ = d.u32()?;
        if next_blkaddr != 0 && !g.in_main(next_blkaddr as u64) {
            return Err(d.err(format!("next block {next_blkaddr} outside the main area")));
        }
        let payload = d.bytes(len)?.to_vec();
        Ok(JournalBlock { lane, flags, cp_ver, seq, next_blkaddr, payload })
    }
}
