//! Superblock: identity and geometry of an image, stored twice (blocks 0 and 1).
//!
//! Both copies are written identically by mkfs and never change afterwards except for the
//! label. Mount reads copy A and falls back to copy B. Decoding recomputes the geometry from
//! `total_blocks` and `lanes` and rejects any stored area address that disagrees.

use super::codec::{seal, verify_seal, Dec, Enc};
use super::layout::{Geometry, BLOCKS_PER_SEG, BLOCK_SIZE, LOG_TYPES, ORPHAN_CAPACITY, ROOT_INO};
use crate::error::{Error, Result, Structure};

/// "LNFS" little-endian.
pub const SB_MAGIC: u32 = u32::from_le_bytes(*b"LNFS");
/// The on-disk format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// Block numbers of the two copies.
pub const SB_ADDRS: [u64; 2] = [0, 1];
/// Longest label in bytes: the 32-byte field always ends with a NUL.
pub const LABEL_MAX: usize = 31;

/// The superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Format version (`FORMAT_VERSION`).
    pub version: u32,
    /// Feature bits; none defined yet, any set bit is refused.
    pub features: u32,
    /// The file system's UUID.
    pub uuid: [u8; 16],
    /// Seconds since the epoch at mkfs.
    pub created: u64,
    /// Up to [`LABEL_MAX`] bytes, NUL-padded.
    pub label: [u8; 32],
    /// Where everything is.
    pub geometry: Geometry,
}

impl Superblock {
    /// A superblock for a new file system.
    pub fn new(geometry: Geometry, uuid: [u8; 16], created: u64) -> Self {
        Superblock { version: FORMAT_VERSION, features: 0, uuid, created, label: [0; 32], geometry }
    }

    /// The superblock's bytes, checksummed.
    pub fn encode(&self) -> Vec<u8> {
        let g = &self.geometry;
        let mut b = vec![0u8; BLOCK_SIZE];
        let mut e = Enc::new(&mut b);
        e.u32(SB_MAGIC);
        e.u32(0);
        e.u32(self.version);
        e.u32(self.features);
        e.u32(BLOCK_SIZE as u32);
        e.u32(BLOCKS_PER_SEG);
        e.u32(LOG_TYPES as u32);
        e.u32(g.lanes);
        e.u64(g.total_blocks);
        e.bytes(&self.uuid);
        e.u64(self.created);
        e.bytes(&self.label);
        e.u64(g.cp_blkaddr);
        e.u32(g.cp_pack_blocks);
        e.u64(g.nat_blkaddr);
        e.u32(g.nat_blocks);
        e.u64(g.sit_blkaddr);
        e.u32(g.sit_blocks);
        e.u64(g.ssa_blkaddr);
        e.u64(g.main_blkaddr);
        e.u32(g.main_segments);
        e.u32(g.max_nid);
        e.u32(g.reserved_segments);
        e.u32(ROOT_INO);
        e.u32(ORPHAN_CAPACITY);
        seal(&mut b, 4);
        b
    }

    /// Decodes and validates one superblock copy.
    pub fn decode(b: &[u8], addr: Option<u64>) -> Result<Superblock> {
        let s = Structure::Superblock;
        if b.len() != BLOCK_SIZE {
            return Err(Error::corrupt(s, addr, "short block"));
        }
        // A wrong magic means "not lanefs", not "corrupt lanefs": say so.
        if b[..4] != SB_MAGIC.to_le_bytes() {
            return Err(Error::NotLanefs("no lanefs superblock magic".into()));
        }
        verify_seal(b, 0, SB_MAGIC, 4, s, addr)?;
        let mut d = Dec::at(b, 8, s, addr);
        let version = d.u32()?;
        if version != FORMAT_VERSION {
            return Err(Error::NotLanefs(format!(
                "format version {version} (this lanefs reads version {FORMAT_VERSION})"
            )));
        }
        let features = d.u32()?;
        if features != 0 {
            return Err(Error::NotLanefs(format!("unknown feature bits {features:#x}")));
        }
        let (bs, bps, logs) = (d.u32()?, d.u32()?, d.u32()?);
        if bs as usize != BLOCK_SIZE || bps != BLOCKS_PER_SEG || logs as usize != LOG_TYPES {
            return Err(d.err(format!("unsupported block size {bs}, segment {bps} or logs {logs}")));
        }
        let lanes = d.u32()?;
        let total_blocks = d.u64()?;
        let uuid: [u8; 16] = d.bytes(16)?.try_into().expect("16 bytes");
        let created = d.u64()?;
        let label: [u8; 32] = d.bytes(32)?.try_into().expect("32 bytes");
        let stored = Geometry {
            total_blocks,
            lanes,
            cp_blkaddr: d.u64()?,
            cp_pack_blocks: d.u32()?,
            nat_blkaddr: d.u64()?,
            nat_blocks: d.u32()?,
            sit_blkaddr: d.u64()?,
            sit_blocks: d.u32()?,
            ssa_blkaddr: d.u64()?,
            main_blkaddr: d.u64()?,
            main_segments: d.u32()?,
            max_nid: d.u32()?,
            reserved_segments: d.u32()?,
        };
        let (root, orphans) = (d.u32()?, d.u32()?);
        if root != ROOT_INO || orphans != ORPHAN_CAPACITY {
            return Err(d.err(format!("unsupported root inode {root} or orphan capacity {orphans}")));
        }
        let expected =
            Geometry::compute(total_blocks, lanes).map_err(|e| d.err(format!("impossible geometry: {e}")))?;
        if expected != stored {
            return Err(d.err("stored area addresses disagree with the geometry of the image size"));
        }
        Ok(Superblock { version, features, uuid, created, label, geometry: stored })
    }

    /// The label as text (up to the first NUL).
    pub fn label_str(&self) -> String {
        let end = self.label.iter().position(|&c| c == 0).unwrap_or(self.label.len());
        String::from_utf8_lossy(&self.label[..end]).into_owned()
    }

    /// The UUID in the usual 8-4-4-4-12 form.
    pub fn uuid_str(&self) -> String {
        uuid_str(&self.uuid)
    }
}

/// A UUID in the usual 8-4-4-4-12 form.
pub fn uuid_str(uuid: &[u8; 16]) -> String {
    let h: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}
