//! The NAT kept in a region: entries in place, a redo log per checkpoint, and the rules that
//! tie them to the checkpoint pack in force. The layout, protocol and crash-safety argument
//! are in the module comment of `pmem` (`pmem/mod.rs`); this file is their code.
//!
//! [`NvmNat`] knows NAT blocks and entries (the format layer) but not the in-memory table:
//! the engine hands it the dirty NAT blocks of a checkpoint and builds its table from
//! [`NvmNat::read`].

use super::{PmemRegion, HEADER_BYTES};
use crate::error::{Error, RegionFault, Result};
use crate::format::layout::{Geometry, NAT_ENTRIES_PER_BLOCK};
use crate::format::{NatBlock, NatEntry};
use crate::sync::rank::{Mutex, Rank};
use std::collections::BTreeMap;
use std::ops::Range;

/// "LNNV": the NAT area is seeded (low half of the SEEDED word; `max_nid` is the high half).
pub const NAT_AREA_MAGIC: u32 = u32::from_le_bytes(*b"LNNV");

const CONTROL: usize = HEADER_BYTES;
const SEEDED: usize = CONTROL;
const COMMIT: usize = CONTROL + 8;
const NAT_BASE: usize = HEADER_BYTES + 4096;
/// In the count half of COMMIT: the log was written in place after its pack was durable, so the
/// in-place entries are those of the log's checkpoint and no longer those of the one before.
const APPLIED: u64 = 1 << 31;
const RECORD: usize = 16;
const PER_BLOCK: usize = NAT_ENTRIES_PER_BLOCK as usize;

/// Where the NAT of a geometry lives in a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatLayout {
    /// Entries (node ids 0..entries), a whole number of NAT blocks.
    pub entries: usize,
    /// Offset of the per-checkpoint redo log.
    pub log: usize,
    /// First byte after the NAT's part of the region.
    pub end: usize,
}

impl NatLayout {
    /// The layout for the NAT of geometry `g`.
    pub fn of(g: &Geometry) -> NatLayout {
        let entries = g.nat_blocks as usize * PER_BLOCK;
        let log = (NAT_BASE + 8 * entries).div_ceil(4096) * 4096;
        NatLayout { entries, log, end: log + RECORD * entries }
    }

    fn entry(&self, nid: u32) -> usize {
        NAT_BASE + 8 * nid as usize
    }

    fn record(&self, i: usize) -> usize {
        self.log + RECORD * i
    }
}

fn ver32(version: u64) -> u32 {
    version as u32
}

/// Log records: (node id, entry word).
type Records = Vec<(u32, u64)>;

/// The NAT of a mounted image, in its region.
pub struct NvmNat {
    region: PmemRegion,
    g: Geometry,
    layout: NatLayout,
    /// The records of the last `stage`, for `apply`.
    staged: Mutex<Option<(u64, Records)>>,
}

impl std::fmt::Debug for NvmNat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmNat").field("region", &self.region).field("layout", &self.layout).finish()
    }
}

impl NvmNat {
    /// Takes `region` as the NAT store of an image of geometry `g`; fails with
    /// `RegionFault::TooSmall` (naming the size to create it with) if the NAT does not fit.
    pub fn new(region: PmemRegion, g: &Geometry) -> Result<NvmNat> {
        let layout = NatLayout::of(g);
        region.require(
            (layout.end - HEADER_BYTES) as u64,
            &format!("the NAT of {} node ids", layout.entries),
        )?;
        Ok(NvmNat { region, g: *g, layout, staged: Mutex::new(Rank::NvmNatStaged, None) })
    }

    /// The region the NAT lives in.
    pub fn region(&self) -> &PmemRegion {
        &self.region
    }

    /// Where the NAT and its log lie in the region.
    pub fn layout(&self) -> NatLayout {
        self.layout
    }

    fn fault(&self, fault: RegionFault, why: String) -> Error {
        Error::region(self.region.path(), fault, why)
    }

    fn seeded_word(&self) -> u64 {
        NAT_AREA_MAGIC as u64 | (self.g.max_nid as u64) << 32
    }

    /// Whether the region holds a NAT for this geometry (seeding completed once).
    pub fn is_seeded(&self) -> Result<bool> {
        Ok(self.region.load_u64(SEEDED)? == self.seeded_word())
    }

    /// (ver32, count, applied) of the log.
    fn commit_word(&self) -> Result<(u32, usize, bool)> {
        let c = self.region.load_u64(COMMIT)?;
        Ok(((c >> 32) as u32, (c & (APPLIED - 1)) as usize, c & APPLIED != 0))
    }

    fn set_commit(&self, version: u64, count: usize) -> Result<()> {
        debug_assert!(count <= self.layout.entries);
        self.region.store_u64(COMMIT, (ver32(version) as u64) << 32 | count as u64)?;
        self.region.persist(COMMIT..COMMIT + 8)
    }

    /// Makes the region hold `blocks` (the device NAT of the unflagged checkpoint `version`)
    /// as its NAT, with an empty log of `version`. Any earlier content is overwritten.
    pub fn seed(&self, blocks: &BTreeMap<u32, NatBlock>, version: u64) -> Result<()> {
        let r = &self.region;
        r.store_u64(SEEDED, 0)?;
        r.persist(SEEDED..SEEDED + 8)?;
        // Every entry: zero where the device NAT has none.
        for bi in 0..self.g.nat_blocks {
            let base = self.layout.entry(bi * NAT_ENTRIES_PER_BLOCK);
            match blocks.get(&bi) {
                Some(nb) => {
                    for (slot, e) in nb.entries.iter().enumerate() {
                        r.store_u64(base + 8 * slot, e.to_word())?;
                    }
                }
                None => r.write_bytes(base, &[0u8; 8 * PER_BLOCK])?,
            }
        }
        r.persist(NAT_BASE..NAT_BASE + 8 * self.layout.entries)?;
        self.set_commit(version, 0)?;
        r.store_u64(SEEDED, self.seeded_word())?;
        r.persist(SEEDED..SEEDED + 8)
    }

    /// The committed log records of checkpoint `version`, or `None` if the log belongs to the
    /// next checkpoint (not durable: ignore it). Checks the region is seeded and current.
    fn log_for(&self, version: u64) -> Result<Option<Records>> {
        if !self.is_seeded()? {
            return Err(self.fault(
                RegionFault::Stale,
                format!(
                    "holds no NAT for this image (checkpoint {version} keeps its NAT in a region): \
                     it was recreated or never completed"
                ),
            ));
        }
        let (cver, count, applied) = self.commit_word()?;
        if cver == ver32(version.wrapping_add(1)) {
            if applied && count > 0 {
                // Only a pack that was durable is ever applied: the image's newest checkpoint
                // was lost after it was written (a corrupt pack), and the entries of `version`
                // were overwritten by its successor's, so the region cannot give them. (With
                // an empty log the entries are those of `version` still.)
                return Err(self.fault(
                    RegionFault::Stale,
                    format!(
                        "holds the NAT of checkpoint {cver} (low 32 bits), but the image's newest usable \
                         checkpoint is {version}: its pack for checkpoint {cver} is unreadable, and the \
                         region no longer has the NAT of checkpoint {version}"
                    ),
                ));
            }
            return Ok(None);
        }
        if cver != ver32(version) {
            return Err(self.fault(
                RegionFault::Stale,
                format!(
                    "holds the NAT of checkpoint {cver} (low 32 bits), the image is at checkpoint {version}: \
                     not the region this image was last checkpointed with"
                ),
            ));
        }
        if count > self.layout.entries {
            return Err(
                self.fault(RegionFault::Corrupt, format!("log of {count} records exceeds its capacity"))
            );
        }
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let at = self.layout.record(i);
            let (head, word) = (self.region.load_u64(at)?, self.region.load_u64(at + 8)?);
            let (nid, tag) = (head as u32, (head >> 32) as u32);
            if tag != cver || nid as usize >= self.layout.entries {
                return Err(self.fault(
                    RegionFault::Corrupt,
                    format!("log record {i} (node id {nid}, checkpoint {tag}) does not belong to checkpoint {cver}"),
                ));
            }
            out.push((nid, word));
        }
        Ok(Some(out))
    }

    /// The NAT of checkpoint `version` (flagged): the in-place entries with its committed log
    /// applied, as the NAT blocks that hold a live entry. Every entry is checked against the
    /// geometry. Writes nothing (a read-only mount uses it as is).
    pub fn read(&self, version: u64) -> Result<BTreeMap<u32, NatBlock>> {
        let log = self.log_for(version)?.unwrap_or_default();
        let mut blocks = BTreeMap::new();
        let mut buf = vec![0u8; 8 * PER_BLOCK];
        for bi in 0..self.g.nat_blocks {
            self.region.read_bytes(self.layout.entry(bi * NAT_ENTRIES_PER_BLOCK), &mut buf)?;
            if buf.iter().all(|&b| b == 0) {
                continue;
            }
            let mut nb = NatBlock::empty(bi);
            for (e, w) in nb.entries.iter_mut().zip(buf.chunks_exact(8)) {
                *e = NatEntry::from_word(u64::from_le_bytes(w.try_into().expect("8 bytes")));
            }
            blocks.insert(bi, nb);
        }
        for (nid, word) in log {
            let (bi, slot) = NatBlock::locate(nid);
            blocks.entry(bi).or_insert_with(|| NatBlock::empty(bi)).entries[slot] = NatEntry::from_word(word);
        }
        for (&bi, nb) in &blocks {
            for (slot, e) in nb.entries.iter().enumerate() {
                let nid = bi as u64 * NAT_ENTRIES_PER_BLOCK as u64 + slot as u64;
                e.check(nid, &self.g)
                    .map_err(|why| self.fault(RegionFault::Corrupt, format!("NAT: {why}")))?;
            }
        }
        blocks.retain(|_, nb| nb.entries.iter().any(|e| !e.is_free()));
        Ok(blocks)
    }

    /// After a read-write mount of checkpoint `version` (flagged): writes its committed log in
    /// place, in case a crash interrupted [`NvmNat::apply`]. Idempotent.
    pub fn settle(&self, version: u64) -> Result<()> {
        if let Some(log) = self.log_for(version)? {
            self.write_in_place(&log)?;
        }
        Ok(())
    }

    /// Step 2 of checkpoint `version` (before its pack is written): logs every entry of
    /// `changed` that differs from its in-place word and commits the log. Returns the number
    /// of entries logged.
    pub fn stage(&self, version: u64, changed: &[NatBlock]) -> Result<usize> {
        let mut recs = Vec::new();
        for nb in changed {
            if nb.index >= self.g.nat_blocks || nb.entries.len() != PER_BLOCK {
                return Err(Error::InvalidArgument(format!("NAT block {} out of range", nb.index)));
            }
            for (slot, e) in nb.entries.iter().enumerate() {
                let nid = nb.index * NAT_ENTRIES_PER_BLOCK + slot as u32;
                let word = e.to_word();
                if self.region.load_u64(self.layout.entry(nid))? != word {
                    recs.push((nid, word));
                }
            }
        }
        if recs.len() > self.layout.entries {
            return Err(Error::InvalidArgument("a NAT block was passed twice".into()));
        }
        // The previous log was applied in place by the checkpoint that wrote it: drop it first,
        // so that no crash can pair its COMMIT word with records of this checkpoint.
        self.set_commit(version, 0)?;
        let v = ver32(version) as u64;
        for (i, &(nid, word)) in recs.iter().enumerate() {
            let at = self.layout.record(i);
            self.region.store_u64(at, nid as u64 | v << 32)?;
            self.region.store_u64(at + 8, word)?;
        }
        self.region.persist(self.layout.log..self.layout.record(recs.len()))?;
        self.set_commit(version, recs.len())?;
        let n = recs.len();
        *self.staged.lock() = Some((version, recs));
        Ok(n)
    }

    /// Step 4 of checkpoint `version` (its pack is durable): writes the staged entries in place.
    pub fn apply(&self, version: u64) -> Result<()> {
        let staged = self.staged.lock().take();
        match staged {
            Some((v, recs)) if v == version => {
                self.write_in_place(&recs)?;
                // After the entries are persistent: from now on a mount of the checkpoint
                // before `version` (its successor's pack lost) is refused, not given them.
                self.region.store_u64(COMMIT, (ver32(version) as u64) << 32 | APPLIED | recs.len() as u64)?;
                self.region.persist(COMMIT..COMMIT + 8)
            }
            _ => Err(Error::InvalidArgument(format!("no NAT log staged for checkpoint {version}"))),
        }
    }

    fn write_in_place(&self, recs: &[(u32, u64)]) -> Result<()> {
        let mut ranges: Vec<Range<usize>> = Vec::with_capacity(recs.len());
        for &(nid, word) in recs {
            let at = self.layout.entry(nid);
            self.region.store_u64(at, word)?;
            ranges.push(at..at + 8);
        }
        self.region.persist_ranges(&ranges)
    }

    /// One line for `inspect`: the region and what it holds.
    pub fn describe(&self) -> String {
        format!(
            "{}: NAT of {} node ids; {}",
            self.region.path().display(),
            self.layout.entries,
            self.region.describe()
        )
    }
}
