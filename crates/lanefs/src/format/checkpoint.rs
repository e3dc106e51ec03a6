//! Checkpoint packs: the consistent points of the file system.
//!
//! Two packs alternate; mount takes the valid one with the higher version. A pack is a header
//! block, payload blocks, and a footer block at the pack's last block. The footer repeats the
//! header's version and payload checksum, so a pack torn by a crash (header new, footer old, or
//! any payload block missing) fails validation and the other pack is used.
//!
//! The payload records what cannot be derived from the areas themselves: which copy of every
//! NAT and SIT block is current (two bits each: never written, copy 0, copy 1 — so mkfs need
//! not write the whole NAT), the active segment and write offset of every lane's six logs, the
//! head of every lane's roll-forward chain, the orphan inode list, and space counters.

use super::codec::{seal, verify_seal, BlockHeader, Dec, Enc, HEADER_LEN};
use super::layout::{Geometry, SegNo, BLOCKS_PER_SEG, BLOCK_SIZE, LOG_TYPES, ORPHAN_CAPACITY};
use crate::error::{Error, Result, Structure};

/// Magic of a checkpoint pack's header block ("LNCP").
pub const CP_MAGIC: u32 = u32::from_le_bytes(*b"LNCP");
/// Magic of a checkpoint pack's footer block ("LNCF"), which must match its header.
pub const CP_FOOTER_MAGIC: u32 = u32::from_le_bytes(*b"LNCF");
/// Magic of the pack's payload blocks between them ("LNCD").
pub const CP_PAYLOAD_MAGIC: u32 = u32::from_le_bytes(*b"LNCD");

/// Set when the checkpoint was taken by a clean unmount (no roll-forward needed).
pub const CP_FLAG_CLEAN: u32 = 1;
/// Set when the checkpoint's NAT is in a persistent-memory region (`crate::pmem`), not in the
/// NAT blocks: the device's NAT copies are stale, and mounting needs the region.
pub const CP_FLAG_NVM_NAT: u32 = 2;

const FIXED_LEN: usize = 96;
const LANE_LEN: usize = LOG_TYPES * 6 + 4 + 8;

/// Bytes the payload may need at most for this geometry.
pub fn payload_capacity(nat_blocks: u32, sit_blocks: u32, lanes: u32) -> usize {
    FIXED_LEN
        + 4
        + CopyMap::encoded_len(nat_blocks)
        + 4
        + CopyMap::encoded_len(sit_blocks)
        + 4
        + lanes as usize * LANE_LEN
        + 4
        + ORPHAN_CAPACITY as usize * 4
}

/// Which copy of each double-buffered metadata block is current: two bits per block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyMap {
    len: u32,
    bits: Vec<u8>,
}

impl CopyMap {
    /// A map of `len` blocks, none written yet.
    pub fn new(len: u32) -> Self {
        CopyMap { len, bits: vec![0; Self::encoded_len(len)] }
    }
    fn encoded_len(len: u32) -> usize {
        (len as usize).div_ceil(4)
    }
    /// Number of blocks the map covers.
    pub fn len(&self) -> u32 {
        self.len
    }
    /// Whether the map covers no block.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The current copy (0 or 1) of block `i`, or None if it was never written.
    pub fn get(&self, i: u32) -> Option<u8> {
        assert!(i < self.len, "copy map index {i} out of {}", self.len);
        match (self.bits[i as usize / 4] >> ((i % 4) * 2)) & 3 {
            0 => None,
            v => Some(v - 1),
        }
    }
    /// Marks copy `copy` (0 or 1) of block `i` as current.
    pub fn set(&mut self, i: u32, copy: u8) {
        assert!(i < self.len && copy < 2);
        let byte = &mut self.bits[i as usize / 4];
        let shift = (i % 4) * 2;
        *byte = (*byte & !(3 << shift)) | ((copy + 1) << shift);
    }
    /// The copy a checkpoint should write next for block `i`: the one not current.
    pub fn next_copy(&self, i: u32) -> u8 {
        match self.get(i) {
            Some(c) => 1 - c,
            None => 0,
        }
    }
    fn encode(&self, e: &mut Enc) {
        e.u32(self.len);
        e.bytes(&self.bits);
    }
    fn decode(d: &mut Dec, expected_len: u32, what: &str) -> Result<CopyMap> {
        let len = d.u32()?;
        if len != expected_len {
            return Err(d.err(format!("{what} copy map has {len} entries, geometry says {expected_len}")));
        }
        let bits = d.bytes(Self::encoded_len(len))?.to_vec();
        for i in 0..len {
            if (bits[i as usize / 4] >> ((i % 4) * 2)) & 3 == 3 {
                return Err(d.err(format!("{what} copy map entry {i} is invalid")));
            }
        }
        let tail = len % 4;
        if tail != 0 && bits[bits.len() - 1] >> (tail * 2) != 0 {
            return Err(d.err(format!("{what} copy map has bits past its end")));
        }
        Ok(CopyMap { len, bits })
    }
}

/// Position of one active log: its segment and the next block offset to write in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogCursor {
    /// The segment the log writes.
    pub segno: SegNo,
    /// Next block offset to write in it.
    pub next_off: u16,
}

/// A lane's state at the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneCheckpoint {
    /// The cursor of each of the lane's logs, by `LogType`.
    pub logs: [LogCursor; LOG_TYPES],
    /// Block where this lane's roll-forward chain continues after the checkpoint (0: none).
    pub journal_head: u32,
    /// Sequence number the first block of that chain must carry.
    pub journal_seq: u64,
}

/// Everything a checkpoint records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Checkpoint version: one more than the previous; the newest valid pack wins.
    pub version: u64,
    /// `CP_FLAG_*` bits (clean unmount, NAT in the region).
    pub flags: u32,
    /// Seconds of file-system lifetime at this checkpoint (segment ages for cleaning).
    pub elapsed_secs: u64,
    /// Valid blocks in the main area.
    pub valid_blocks: u64,
    /// Valid node blocks.
    pub valid_nodes: u64,
    /// Live inodes.
    pub valid_inodes: u64,
    /// Where the next free node id search starts.
    pub next_nid: u32,
    /// Bytes users wrote, since mkfs.
    pub user_bytes_written: u64,
    /// Bytes the cleaner moved.
    pub gc_bytes_written: u64,
    /// Bytes written by the file system other than by cleaning: data, nodes, journals and
    /// checkpoint metadata (write amplification is this plus `gc_bytes_written` over
    /// `user_bytes_written`).
    pub cp_bytes_written: u64,
    /// Operation timestamp at which the checkpoint's snapshot was taken: journal records
    /// stamped at or before it are already part of the checkpoint and are not replayed.
    pub stamp: u64,
    /// Blocks preallocated and not yet written: the `NEW_ADDR` entries of every inode's tree
    /// (`mem::reserve`). Space no writer but their files may take. (Images from before this
    /// counter have zero in its place.)
    pub reserved_blocks: u64,
    /// Above every inode generation handed out before the checkpoint (`crate::generation`);
    /// 0 in images made before the counter existed, whose inodes all have generation 0.
    pub next_generation: u64,
    /// Which of the two copies of each NAT block is current.
    pub nat_map: CopyMap,
    /// Which of the two copies of each SIT block is current.
    pub sit_map: CopyMap,
    /// Per lane, its logs and journal head.
    pub lanes: Vec<LaneCheckpoint>,
    /// Inodes unlinked while open, to free at the next mount.
    pub orphans: Vec<u32>,
}

impl Checkpoint {
    fn encode_payload(&self) -> Vec<u8> {
        let cap = FIXED_LEN
            + 16
            + self.nat_map.bits.len()
            + self.sit_map.bits.len()
            + self.lanes.len() * LANE_LEN
            + self.orphans.len() * 4;
        let mut p = vec![0u8; cap];
        let mut e = Enc::new(&mut p);
        e.u64(self.elapsed_secs);
        e.u64(self.valid_blocks);
        e.u64(self.valid_nodes);
        e.u64(self.valid_inodes);
        e.u32(self.next_nid);
        e.u64(self.user_bytes_written);
        e.u64(self.gc_bytes_written);
        e.u64(self.cp_bytes_written);
        e.u64(self.stamp);
        e.u64(self.reserved_blocks);
        e.u64(self.next_generation);
        e.pad_to(FIXED_LEN);
        self.nat_map.encode(&mut e);
        self.sit_map.encode(&mut e);
        e.u32(self.lanes.len() as u32);
        for lane in &self.lanes {
            for log in &lane.logs {
                e.u32(log.segno.0);
                e.u16(log.next_off);
            }
            e.u32(lane.journal_head);
            e.u64(lane.journal_seq);
        }
        e.u32(self.orphans.len() as u32);
        for &o in &self.orphans {
            e.u32(o);
        }
        debug_assert_eq!(e.pos(), cap);
        p
    }

    /// Encodes the pack into `geometry.cp_pack_blocks` blocks (unused payload blocks zeroed).
    pub fn encode(&self, g: &Geometry) -> Result<Vec<u8>> {
        if self.orphans.len() > ORPHAN_CAPACITY as usize {
            return Err(Error::InvalidArgument(format!(
                "{} orphan inodes exceed the checkpoint capacity of {ORPHAN_CAPACITY}",
                self.orphans.len()
            )));
        }
        if self.lanes.len() != g.lanes as usize
            || self.nat_map.len != g.nat_blocks
            || self.sit_map.len != g.sit_blocks
        {
            return Err(Error::InvalidArgument("checkpoint does not match the geometry".into()));
        }
        let payload = self.encode_payload();
        let pack_blocks = g.cp_pack_blocks as usize;
        let chunks = payload.len().div_ceil(BLOCK_SIZE - HEADER_LEN);
        assert!(chunks + 2 <= pack_blocks, "payload larger than geometry allows");
        let mut out = vec![0u8; pack_blocks * BLOCK_SIZE];
        let payload_crc = crc32c::crc32c(&payload);
        for (magic, idx) in [(CP_MAGIC, 0), (CP_FOOTER_MAGIC, pack_blocks - 1)] {
            let blk = &mut out[idx * BLOCK_SIZE..(idx + 1) * BLOCK_SIZE];
            let mut e = Enc::new(blk);
            e.u32(magic);
            e.u32(0);
            e.u64(self.version);
            e.u32(self.flags);
            e.u32(pack_blocks as u32);
            e.u32(payload.len() as u32);
            e.u32(payload_crc);
            seal(blk, 4);
        }
        for (i, chunk) in payload.chunks(BLOCK_SIZE - HEADER_LEN).enumerate() {
            let blk = &mut out[(i + 1) * BLOCK_SIZE..(i + 2) * BLOCK_SIZE];
            BlockHeader { magic: CP_PAYLOAD_MAGIC, a: i as u32, b: self.version as u32 }.write(blk);
            blk[HEADER_LEN..HEADER_LEN + chunk.len()].copy_from_slice(chunk);
            seal(blk, 4);
        }
        // The pair of every check decode makes: what was encoded decodes to itself.
        debug_assert_eq!(Checkpoint::decode(&out, g, 0).ok().as_ref(), Some(self), "the pack decodes back");
        Ok(out)
    }

    /// Decodes and fully validates a pack read from `base_addr` (all `cp_pack_blocks` blocks).
    pub fn decode(pack: &[u8], g: &Geometry, base_addr: u64) -> Result<Checkpoint> {
        let s = Structure::Checkpoint;
        let pack_blocks = g.cp_pack_blocks as usize;
        if pack.len() != pack_blocks * BLOCK_SIZE {
            return Err(Error::corrupt(s, Some(base_addr), "pack has the wrong length"));
        }
        let read_hdr = |idx: usize, magic: u32| -> Result<(u64, u32, u32, u32)> {
            let addr = Some(base_addr + idx as u64);
            let blk = &pack[idx * BLOCK_SIZE..(idx + 1) * BLOCK_SIZE];
            verify_seal(blk, 0, magic, 4, s, addr)?;
            let mut d = Dec::at(blk, 8, s, addr);
            let (version, flags, blocks, len, crc) = (d.u64()?, d.u32()?, d.u32()?, d.u32()?, d.u32()?);
            if blocks as usize != pack_blocks {
                return Err(d.err(format!("pack claims {blocks} blocks, geometry says {pack_blocks}")));
            }
            Ok((version, flags, len, crc))
        };
        let (version, flags, len, crc) = read_hdr(0, CP_MAGIC)?;
        let footer = read_hdr(pack_blocks - 1, CP_FOOTER_MAGIC)?;
        if footer != (version, flags, len, crc) {
            return Err(Error::corrupt(s, Some(base_addr), "header and footer disagree (torn checkpoint)"));
        }
        let per = BLOCK_SIZE - HEADER_LEN;
        let chunks = (len as usize).div_ceil(per);
        if len as usize > payload_capacity(g.nat_blocks, g.sit_blocks, g.lanes) || chunks + 2 > pack_blocks {
            return Err(Error::corrupt(s, Some(base_addr), format!("payload length {len} too large")));
        }
        let mut payload = Vec::with_capacity(len as usize);
        for i in 0..chunks {
            let addr = base_addr + 1 + i as u64;
            let blk = &pack[(i + 1) * BLOCK_SIZE..(i + 2) * BLOCK_SIZE];
            let h = BlockHeader::check(blk, CP_PAYLOAD_MAGIC, s, Some(addr))?;
            if h.a != i as u32 || h.b != version as u32 {
                return Err(Error::corrupt(s, Some(addr), "payload block from another checkpoint"));
            }
            let take = per.min(len as usize - payload.len());
            payload.extend_from_slice(&blk[HEADER_LEN..HEADER_LEN + take]);
        }
        if crc32c::crc32c(&payload) != crc {
            return Err(Error::corrupt(s, Some(base_addr), "payload checksum mismatch"));
        }
        Self::decode_payload(&payload, g, version, flags, base_addr)
    }

    fn decode_payload(p: &[u8], g: &Geometry, version: u64, flags: u32, base: u64) -> Result<Checkpoint> {
        let mut d = Dec::new(p, Structure::Checkpoint, Some(base));
        let elapsed_secs = d.u64()?;
        let valid_blocks = d.u64()?;
        let valid_nodes = d.u64()?;
        let valid_inodes = d.u64()?;
        let next_nid = d.u32()?;
        let user_bytes_written = d.u64()?;
        let gc_bytes_written = d.u64()?;
        let cp_bytes_written = d.u64()?;
        let stamp = d.u64()?;
        let reserved_blocks = d.u64()?;
        let next_generation = d.u64()?;
        if p[d.pos()..FIXED_LEN.min(p.len())].iter().any(|&b| b != 0) {
            return Err(d.err("reserved checkpoint bytes are not zero"));
        }
        d.skip_to(FIXED_LEN)?;
        if valid_blocks > g.main_blocks() || valid_nodes > valid_blocks || valid_inodes > valid_nodes {
            return Err(d.err("block counts exceed the main area"));
        }
        if reserved_blocks > g.main_blocks() {
            return Err(d.err(format!("{reserved_blocks} reserved blocks exceed the main area")));
        }
        if next_nid > g.max_nid {
            return Err(d.err(format!("next nid {next_nid} beyond max {}", g.max_nid)));
        }
        let nat_map = CopyMap::decode(&mut d, g.nat_blocks, "NAT")?;
        let sit_map = CopyMap::decode(&mut d, g.sit_blocks, "SIT")?;
        let nlanes = d.u32()?;
        if nlanes != g.lanes {
            return Err(d.err(format!("{nlanes} lanes recorded, superblock says {}", g.lanes)));
        }
        let mut lanes = Vec::with_capacity(nlanes as usize);
        for lane in 0..nlanes {
            let mut logs = [LogCursor { segno: SegNo(0), next_off: 0 }; LOG_TYPES];
            for log in logs.iter_mut() {
                *log = LogCursor { segno: SegNo(d.u32()?), next_off: d.u16()? };
                if !g.has_segment(log.segno) || log.next_off as u32 > BLOCKS_PER_SEG {
                    return Err(d.err(format!("lane {lane} log cursor {log:?} outside the main area")));
                }
            }
            let journal_head = d.u32()?;
            let journal_seq = d.u64()?;
            if journal_head != 0 && !g.in_main(journal_head as u64) {
                return Err(d.err(format!("lane {lane} journal head {journal_head} outside the main area")));
            }
            lanes.push(LaneCheckpoint { logs, journal_head, journal_seq });
        }
        let norphans = d.u32()?;
        if norphans > ORPHAN_CAPACITY {
            return Err(d.err(format!("{norphans} orphans exceed capacity")));
        }
        let mut orphans = Vec::with_capacity(norphans as usize);
        for _ in 0..norphans {
            let o = d.u32()?;
            if o == 0 || o > g.max_nid {
                return Err(d.err(format!("orphan inode {o} out of range")));
            }
            orphans.push(o);
        }
        if d.remaining() != 0 {
            return Err(d.err("trailing bytes after the orphan list"));
        }
        Ok(Checkpoint {
            version,
            flags,
            elapsed_secs,
            valid_blocks,
            valid_nodes,
            valid_inodes,
            next_nid,
            user_bytes_written,
            gc_bytes_written,
            cp_bytes_written,
            stamp,
            reserved_blocks,
            next_generation,
            nat_map,
            sit_map,
            lanes,
            orphans,
        })
    }
}
