//! NAT blocks: node id -> block address of the node's current version.
//!
//! Entries are eight bytes (address, owning inode) so that the persistent-memory mode can update
//! one entry with a single atomic store (pin-point NAT update, SYSTOR'19). Node id `n` lives in
//! NAT block `n / 510`, slot `n % 510`. Address 0 means "no node" (block 0 is a superblock).

use super::codec::{seal, BlockHeader, Dec, Enc, HEADER_LEN};
use super::layout::{Geometry, BLOCK_SIZE, NAT_ENTRIES_PER_BLOCK};
use crate::error::{Result, Structure};

/// Bytes of one encoded entry: block address and owning inode, a `u32` each.
const NAT_ENTRY_LEN: usize = 8;
const _: () = assert!(HEADER_LEN + NAT_ENTRY_LEN * NAT_ENTRIES_PER_BLOCK as usize <= BLOCK_SIZE);

/// Magic of a NAT block ("LNNT").
pub const NAT_MAGIC: u32 = u32::from_le_bytes(*b"LNNT");

/// Where a node lives and which inode owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NatEntry {
    /// Block holding the node; 0 when the node id is free.
    pub block_addr: u32,
    /// Inode the node belongs to.
    pub ino: u32,
}

impl NatEntry {
    /// Whether the node id is unused.
    pub fn is_free(&self) -> bool {
        self.block_addr == 0
    }
    /// The entry as one little-endian word, for 8-byte atomic updates.
    pub fn to_word(self) -> u64 {
        self.block_addr as u64 | (self.ino as u64) << 32
    }
    /// The entry from its word (`to_word`'s inverse).
    pub fn from_word(w: u64) -> NatEntry {
        NatEntry { block_addr: w as u32, ino: (w >> 32) as u32 }
    }
    /// Whether this can be the entry of node id `nid` in an image of geometry `g`: a live
    /// entry names a possible id, a main-area block and a possible owner; a free one no owner.
    pub fn check(&self, nid: u64, g: &Geometry) -> std::result::Result<(), String> {
        if !self.is_free() {
            if nid == 0 || nid > g.max_nid as u64 {
                return Err(format!("entry for impossible node id {nid}"));
            }
            if !g.in_main(self.block_addr as u64) {
                return Err(format!("node {nid} at {} outside the main area", self.block_addr));
            }
            if self.ino == 0 || self.ino > g.max_nid {
                return Err(format!("node {nid} owned by impossible inode {}", self.ino));
            }
        } else if self.ino != 0 {
            return Err(format!("free node id {nid} names owner {}", self.ino));
        }
        Ok(())
    }
}

/// One NAT block: 510 consecutive entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatBlock {
    /// Which NAT block this is (entries `index * 510 ..`).
    pub index: u32,
    /// Its 510 entries.
    pub entries: Vec<NatEntry>,
}

impl NatBlock {
    /// Block `index` with every entry free.
    pub fn empty(index: u32) -> Self {
        NatBlock { index, entries: vec![NatEntry::default(); NAT_ENTRIES_PER_BLOCK as usize] }
    }

    /// NAT block index and slot holding node id `nid`.
    pub fn locate(nid: u32) -> (u32, usize) {
        (nid / NAT_ENTRIES_PER_BLOCK, (nid % NAT_ENTRIES_PER_BLOCK) as usize)
    }

    /// The block's bytes, checksummed.
    pub fn encode(&self) -> Vec<u8> {
        assert_eq!(self.entries.len(), NAT_ENTRIES_PER_BLOCK as usize);
        let mut b = vec![0u8; BLOCK_SIZE];
        BlockHeader { magic: NAT_MAGIC, a: self.index, b: 0 }.write(&mut b);
        let mut e = Enc::at(&mut b, HEADER_LEN);
        for en in &self.entries {
            e.u32(en.block_addr);
            e.u32(en.ino);
        }
        // Paired with decode's end position: both sides walk the same NAT_ENTRY_LEN entries.
        debug_assert_eq!(e.pos(), HEADER_LEN + NAT_ENTRY_LEN * NAT_ENTRIES_PER_BLOCK as usize);
        seal(&mut b, 4);
        b
    }

    /// Decodes NAT block `index`, checking every address against the geometry.
    pub fn decode(b: &[u8], index: u32, g: &Geometry, addr: Option<u64>) -> Result<NatBlock> {
        let h = BlockHeader::check(b, NAT_MAGIC, Structure::Nat, addr)?;
        let mut d = Dec::at(b, HEADER_LEN, Structure::Nat, addr);
        if h.a != index {
            return Err(d.err(format!("holds NAT index {}, expected {index}", h.a)));
        }
        let mut entries = Vec::with_capacity(NAT_ENTRIES_PER_BLOCK as usize);
        for slot in 0..NAT_ENTRIES_PER_BLOCK {
            let en = NatEntry { block_addr: d.u32()?, ino: d.u32()? };
            let nid = index as u64 * NAT_ENTRIES_PER_BLOCK as u64 + slot as u64;
            en.check(nid, g).map_err(|why| d.err(why))?;
            entries.push(en);
        }
        debug_assert_eq!(d.pos(), HEADER_LEN + NAT_ENTRY_LEN * NAT_ENTRIES_PER_BLOCK as usize);
        Ok(NatBlock { index, entries })
    }
}
