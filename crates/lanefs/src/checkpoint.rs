//! Consistent points: finding the image's newest valid state and writing a new one.
//!
//! Reading: superblock copy A, else copy B; then both checkpoint packs, taking the valid one
//! with the higher version (a pack torn by a crash fails its checks and the other is used);
//! then the current copy of every NAT and SIT block the checkpoint says was ever written.
//!
//! Writing (`commit`): changed NAT and SIT blocks go to the copy that is *not* current, the
//! device is flushed, and only then is the pack written to the slot not holding the current
//! checkpoint and flushed again. A crash anywhere before the second flush leaves the previous
//! checkpoint intact and current.

use crate::device::{BlockDevice, ReadReq, WriteReq, BLOCK_SIZE};
use crate::error::{Error, Result, Structure};
use crate::format::layout::{Geometry, SegNo, NAT_ENTRIES_PER_BLOCK, SIT_ENTRIES_PER_BLOCK};
use crate::format::superblock::SB_ADDRS;
use crate::format::{Checkpoint, NatBlock, SegmentSummary, SitBlock, SitEntry, Superblock};
use std::collections::BTreeMap;

/// What was found in the two superblock copies.
pub struct SuperblockRead {
    /// The superblock mount uses.
    pub sb: Superblock,
    /// Decode result of copy A and copy B (the error text where a copy is bad).
    pub copies: [std::result::Result<(), String>; 2],
}

/// Reads both superblock copies; returns the first valid one.
pub fn read_superblock(dev: &dyn BlockDevice) -> Result<SuperblockRead> {
    if dev.block_count() < 2 {
        return Err(Error::NotLanefs(format!("device of {} blocks is too small", dev.block_count())));
    }
    let mut bufs = [vec![0u8; BLOCK_SIZE], vec![0u8; BLOCK_SIZE]];
    let [a, b] = &mut bufs;
    dev.read_batch(&mut [ReadReq { addr: SB_ADDRS[0], buf: a }, ReadReq { addr: SB_ADDRS[1], buf: b }])?;
    let dec: Vec<Result<Superblock>> =
        bufs.iter().zip(SB_ADDRS).map(|(b, addr)| Superblock::decode(b, Some(addr))).collect();
    let copies = [
        dec[0].as_ref().map(|_| ()).map_err(|e| e.to_string()),
        dec[1].as_ref().map(|_| ()).map_err(|e| e.to_string()),
    ];
    let mut it = dec.into_iter();
    let (a, b) = (it.next().expect("two"), it.next().expect("two"));
    let sb = match (a, b) {
        (Ok(sb), _) | (Err(_), Ok(sb)) => sb,
        (Err(ea), Err(eb)) => {
            return Err(match (&ea, &eb) {
                (Error::NotLanefs(_), Error::NotLanefs(_)) => ea,
                _ => Error::corrupt(
                    Structure::Superblock,
                    None,
                    format!("both copies are bad: copy A: {ea}; copy B: {eb}"),
                ),
            })
        }
    };
    if sb.geometry.total_blocks > dev.block_count() {
        return Err(Error::corrupt(
            Structure::Superblock,
            None,
            format!(
                "image is truncated: superblock says {} blocks, device has {}",
                sb.geometry.total_blocks,
                dev.block_count()
            ),
        ));
    }
    Ok(SuperblockRead { sb, copies })
}

/// The checkpoint in force and what was found in the other pack.
pub struct CheckpointRead {
    /// The checkpoint pack's fixed part and lanes.
    pub cp: Checkpoint,
    /// Which pack (0 or 1) holds it.
    pub pack: u32,
    /// Why the other pack was not taken: Ok(version) if valid but older, Err(text) if invalid.
    pub other: std::result::Result<u64, String>,
}

/// Reads both packs and picks the newest valid one.
pub fn read_checkpoint(dev: &dyn BlockDevice, g: &Geometry) -> Result<CheckpointRead> {
    let n = g.cp_pack_blocks as usize * BLOCK_SIZE;
    let mut p0 = vec![0u8; n];
    let mut p1 = vec![0u8; n];
    dev.read_batch(&mut [
        ReadReq { addr: g.cp_pack_addr(0), buf: &mut p0 },
        ReadReq { addr: g.cp_pack_addr(1), buf: &mut p1 },
    ])?;
    let c0 = Checkpoint::decode(&p0, g, g.cp_pack_addr(0));
    let c1 = Checkpoint::decode(&p1, g, g.cp_pack_addr(1));
    match (c0, c1) {
        (Ok(a), Ok(b)) if b.version > a.version => {
            Ok(CheckpointRead { other: Ok(a.version), cp: b, pack: 1 })
        }
        (Ok(a), Ok(b)) => Ok(CheckpointRead { other: Ok(b.version), cp: a, pack: 0 }),
        (Ok(a), Err(e)) => Ok(CheckpointRead { cp: a, pack: 0, other: Err(e.to_string()) }),
        (Err(e), Ok(b)) => Ok(CheckpointRead { cp: b, pack: 1, other: Err(e.to_string()) }),
        (Err(e0), Err(e1)) => Err(Error::corrupt(
            Structure::Checkpoint,
            None,
            format!("no valid checkpoint pack: pack 0: {e0}; pack 1: {e1}"),
        )),
    }
}

/// Reads the current copy of every NAT block the checkpoint says was written.
/// Blocks never written hold only free entries and are absent from the map.
pub fn read_nat(dev: &dyn BlockDevice, g: &Geometry, cp: &Checkpoint) -> Result<BTreeMap<u32, NatBlock>> {
    let idx: Vec<(u32, u64)> =
        (0..g.nat_blocks).filter_map(|i| cp.nat_map.get(i).map(|c| (i, g.nat_block_addr(i, c)))).collect();
    let bufs = read_blocks(dev, &idx.iter().map(|&(_, a)| a).collect::<Vec<_>>())?;
    idx.iter()
        .zip(bufs.chunks(BLOCK_SIZE))
        .map(|(&(i, addr), b)| NatBlock::decode(b, i, g, Some(addr)).map(|nb| (i, nb)))
        .collect()
}

/// Reads the SIT: one entry per main segment (segments in never-written SIT blocks are empty).
pub fn read_sit(dev: &dyn BlockDevice, g: &Geometry, cp: &Checkpoint) -> Result<Vec<SitEntry>> {
    let idx: Vec<(u32, u64)> =
        (0..g.sit_blocks).filter_map(|i| cp.sit_map.get(i).map(|c| (i, g.sit_block_addr(i, c)))).collect();
    let bufs = read_blocks(dev, &idx.iter().map(|&(_, a)| a).collect::<Vec<_>>())?;
    let mut out = vec![SitEntry::default(); g.main_segments as usize];
    for (&(i, addr), b) in idx.iter().zip(bufs.chunks(BLOCK_SIZE)) {
        let blk = SitBlock::decode(b, i, Some(addr))?;
        for (slot, e) in blk.entries.into_iter().enumerate() {
            let segno = (i * SIT_ENTRIES_PER_BLOCK) as usize + slot;
            if segno < out.len() {
                out[segno] = e;
            } else if e != SitEntry::default() {
                return Err(Error::corrupt(
                    Structure::Sit,
                    Some(addr),
                    format!("entry for segment {segno} beyond the main area"),
                ));
            }
        }
    }
    Ok(out)
}

/// Reads the summary block of segment `segno`.
pub fn read_summary(dev: &dyn BlockDevice, g: &Geometry, segno: SegNo) -> Result<SegmentSummary> {
    let addr = g.ssa_block_addr(segno);
    let mut b = vec![0u8; BLOCK_SIZE * crate::format::ssa::SSA_BLOCKS_PER_SEG as usize];
    dev.read_block(addr, &mut b)?;
    SegmentSummary::decode(&b, segno, g.max_nid, Some(addr))
}

/// Reads blocks at `addrs` in one batch, concatenated.
pub fn read_blocks(dev: &dyn BlockDevice, addrs: &[u64]) -> Result<Vec<u8>> {
    let mut out = vec![0u8; addrs.len() * BLOCK_SIZE];
    // Bound each submission so a huge NAT does not become one enormous request list.
    for (chunk_addrs, chunk_buf) in addrs.chunks(256).zip(out.chunks_mut(256 * BLOCK_SIZE)) {
        let mut reqs: Vec<ReadReq> = chunk_addrs
            .iter()
            .zip(chunk_buf.chunks_mut(BLOCK_SIZE))
            .map(|(&addr, buf)| ReadReq { addr, buf })
            .collect();
        dev.read_batch(&mut reqs)?;
    }
    Ok(out)
}

/// Everything a new checkpoint writes besides the pack.
pub struct CommitSet {
    /// NAT blocks changed since the last checkpoint, to write.
    pub nat: Vec<NatBlock>,
    /// SIT blocks changed since the last checkpoint, to write.
    pub sit: Vec<SitBlock>,
    /// Segment summaries of the segments this checkpoint filled.
    pub summaries: Vec<SegmentSummary>,
}

/// Writes `set` and then `cp` as the new current checkpoint into pack `1 - current_pack`.
/// Updates `cp`'s copy maps for the blocks written. Returns the pack written.
pub fn commit(
    dev: &dyn BlockDevice,
    g: &Geometry,
    cp: &mut Checkpoint,
    current_pack: u32,
    set: &CommitSet,
) -> Result<u32> {
    let mut blocks: Vec<(u64, Vec<u8>)> =
        Vec::with_capacity(set.nat.len() + set.sit.len() + set.summaries.len());
    for nb in &set.nat {
        if nb.index >= g.nat_blocks || nb.entries.len() != NAT_ENTRIES_PER_BLOCK as usize {
            return Err(Error::InvalidArgument(format!("NAT block {} out of range", nb.index)));
        }
        let copy = cp.nat_map.next_copy(nb.index);
        blocks.push((g.nat_block_addr(nb.index, copy), nb.encode()));
        cp.nat_map.set(nb.index, copy);
    }
    for sb in &set.sit {
        if sb.index >= g.sit_blocks {
            return Err(Error::InvalidArgument(format!("SIT block {} out of range", sb.index)));
        }
        let copy = cp.sit_map.next_copy(sb.index);
        blocks.push((g.sit_block_addr(sb.index, copy), sb.encode()));
        cp.sit_map.set(sb.index, copy);
    }
    for s in &set.summaries {
        if !g.has_segment(s.segno) {
            return Err(Error::InvalidArgument(format!("summary of segment {} out of range", s.segno)));
        }
        blocks.push((g.ssa_block_addr(s.segno), s.encode()));
    }
    let reqs: Vec<WriteReq> = blocks.iter().map(|(addr, data)| WriteReq { addr: *addr, data }).collect();
    for chunk in reqs.chunks(256) {
        dev.write_batch(chunk)?;
    }
    dev.flush()?;
    let pack = 1 - current_pack;
    let bytes = cp.encode(g)?;
    // The pack's blocks are contiguous: one request.
    dev.write_block(g.cp_pack_addr(pack), &bytes)?;
    dev.flush()?;
    Ok(pack)
}
