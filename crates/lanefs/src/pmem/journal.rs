//! The lane journals kept in a region: where fsync commits its transaction when the image has
//! one (`FsOptions::nvm`). The protocol and its crash-safety argument are in the module comment
//! of `pmem` (`pmem/mod.rs`) ("The lane journals in the region"); this file is their code.
//!
//! [`NvmJournal`] knows transactions as encoded bytes and decodes them back with
//! `Transaction::decode` (magic, checksum, bounds) and checks them against the geometry; it
//! does not know what they mean, nor the data blocks they map: the engine writes and flushes
//! those before it calls [`NvmJournal::append`].

use super::PmemRegion;
use crate::error::{Error, RegionFault, Result};
use crate::format::layout::Geometry;
use crate::journal::record::TXN_HEADER_LEN;
use crate::journal::Transaction;
use crate::sync::rank::{Mutex, Rank};
use std::ops::Range;

/// The smallest journal a lane gets; a region with less room per lane is refused.
pub const LANE_MIN_BYTES: usize = 16 << 10;
/// The largest journal a lane gets (its tail is a 32-bit byte count; more would only delay
/// checkpoints, which begin at half of it anyway).
pub const LANE_MAX_BYTES: usize = 256 << 20;
/// A lane's control line: its TAIL word, alone in its cache line.
const CONTROL: usize = 64;
/// Bytes of an entry's head word.
const HEAD: usize = 8;
// A TAIL word counts a lane's bytes in 32 bits, and an entry's head its length in 32 bits.
const _: () = assert!(LANE_MAX_BYTES <= u32::MAX as usize, "a lane's bytes fit the TAIL word");
// Entries start 8-aligned after the control line (TAIL and head words are aligned stores), and
// the smallest lane is whole pages with room past its control line.
const _: () = assert!(CONTROL.is_multiple_of(8) && HEAD == 8 && LANE_MIN_BYTES.is_multiple_of(4096));
const _: () = assert!(LANE_MIN_BYTES > CONTROL + HEAD + TXN_HEADER_LEN, "a lane holds an entry");

fn ver32(version: u64) -> u32 {
    version as u32
}

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Where the lane journals live in a region: after the NAT, one equal slice per lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalLayout {
    /// First byte of lane 0's slice (page-aligned).
    pub start: usize,
    /// Number of lanes, one slice each.
    pub lanes: usize,
    /// Bytes of one lane's slice, control line included (a whole number of pages).
    pub lane_bytes: usize,
}

impl JournalLayout {
    /// The layout in a region of `region_len` bytes whose NAT ends at `nat_end`, for `lanes`
    /// lanes. A function of the geometry and the region's size only, so every mount of the
    /// same pair finds the journals at the same place.
    pub fn of(nat_end: usize, region_len: usize, lanes: u32) -> JournalLayout {
        let start = nat_end.div_ceil(4096) * 4096;
        let lanes = lanes.max(1) as usize;
        let per = region_len.saturating_sub(start) / lanes / 4096 * 4096;
        let layout = JournalLayout { start, lanes, lane_bytes: per.min(LANE_MAX_BYTES) };
        // The slices are page-aligned, after the NAT, and inside the region (when it has room
        // past the NAT at all: `NvmJournal::new` refuses one without).
        debug_assert!(layout.start >= nat_end && layout.start.is_multiple_of(4096));
        debug_assert!(layout.end() <= region_len.max(layout.start), "journals past the region's end");
        layout
    }

    /// Offset of lane `lane`'s TAIL word.
    pub fn tail(&self, lane: usize) -> usize {
        // Lane `lanes` would be the next structure's bytes (or past the region).
        debug_assert!(lane < self.lanes, "lane {lane} of {}", self.lanes);
        self.start + lane * self.lane_bytes
    }

    /// Offset of lane `lane`'s first entry.
    pub fn log(&self, lane: usize) -> usize {
        // A layout the journals use (`NvmJournal::new` refuses smaller lanes): the entries
        // start inside the lane's slice.
        debug_assert!(self.lane_bytes > CONTROL, "lane slices of {} bytes", self.lane_bytes);
        self.tail(lane) + CONTROL
    }

    /// Entry bytes one lane holds.
    pub fn capacity(&self) -> usize {
        self.lane_bytes.saturating_sub(CONTROL)
    }

    /// First byte after the journals.
    pub fn end(&self) -> usize {
        self.start + self.lanes * self.lane_bytes
    }
}

/// What one lane's journal holds now (in memory; the region has the same in its TAIL word).
#[derive(Debug, Clone, Copy)]
struct LaneLog {
    /// The checkpoint version (low 32 bits) its entries follow; `None` until the first reset.
    gen: Option<u32>,
    /// Entry bytes committed.
    used: usize,
}

/// What [`NvmJournal::append`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Committed (durable): the lane's journal held `before` bytes and now holds `after`.
    Committed {
        /// Bytes the lane's journal held before.
        before: usize,
        /// Bytes it holds now.
        after: usize,
    },
    /// No room left in the lane's journal: nothing was written.
    Full,
}

/// The lane journals of a mounted image, in its region.
pub struct NvmJournal {
    layout: JournalLayout,
    g: Geometry,
    path: std::path::PathBuf,
    lanes: Vec<Mutex<LaneLog>>,
}

impl std::fmt::Debug for NvmJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmJournal").field("path", &self.path).field("layout", &self.layout).finish()
    }
}

impl NvmJournal {
    /// The journals of an image of geometry `g` in `region`, whose NAT ends at `nat_end`; fails
    /// with `RegionFault::TooSmall` (naming a size to create it with) when a lane would get
    /// less than [`LANE_MIN_BYTES`]. Appends are refused until the first [`NvmJournal::reset`].
    pub fn new(region: &PmemRegion, nat_end: usize, g: &Geometry) -> Result<NvmJournal> {
        let layout = JournalLayout::of(nat_end, region.size(), g.lanes);
        if layout.lane_bytes < LANE_MIN_BYTES {
            let need = (layout.start + layout.lanes * LANE_MIN_BYTES) as u64;
            region.require(
                need - super::HEADER_BYTES as u64,
                &format!("the NAT and {} lane journals of {} KiB", layout.lanes, LANE_MIN_BYTES >> 10),
            )?;
            return Err(Error::region(
                region.path(),
                RegionFault::TooSmall,
                format!("{} bytes per lane journal, fewer than {LANE_MIN_BYTES}", layout.lane_bytes),
            ));
        }
        // Past the check above every lane's slice, control line and entries, lies in the region.
        assert!(layout.end() <= region.size() && layout.capacity() > 0);
        debug_assert!(layout.start.is_multiple_of(4096) && layout.lane_bytes.is_multiple_of(4096));
        Ok(NvmJournal {
            layout,
            g: *g,
            path: region.path().to_path_buf(),
            lanes: (0..layout.lanes)
                .map(|_| Mutex::new(Rank::NvmJournalLane, LaneLog { gen: None, used: 0 }))
                .collect(),
        })
    }

    /// Where each lane's slice lies.
    pub fn layout(&self) -> JournalLayout {
        self.layout
    }

    fn corrupt(&self, lane: usize, why: String) -> Error {
        Error::region(&self.path, RegionFault::Corrupt, format!("lane {lane} journal: {why}"))
    }

    fn lane(&self, lane: u32) -> Result<&Mutex<LaneLog>> {
        debug_assert_eq!(self.lanes.len(), self.layout.lanes, "one lane log per slice");
        self.lanes
            .get(lane as usize)
            .ok_or_else(|| Error::InvalidArgument(format!("lane {lane} has no journal in the region")))
    }

    /// (gen, used) in lane `lane`'s TAIL word.
    fn tail_word(&self, region: &PmemRegion, lane: usize) -> Result<(u32, usize)> {
        debug_assert!(self.layout.tail(lane).is_multiple_of(8), "TAIL word of lane {lane} misaligned");
        let t = region.load_u64(self.layout.tail(lane))?;
        Ok(((t >> 32) as u32, t as u32 as usize))
    }

    /// The committed transactions of every lane (in lane order, each in append order) under
    /// the checkpoint pack of `version`: a lane whose TAIL names another checkpoint holds
    /// none. Everything a TAIL counts must decode — magic, checksums, bounds, the geometry —
    /// or the region is corrupt (its bytes were persisted before the TAIL that counts them).
    /// Writes nothing.
    pub fn read(&self, region: &PmemRegion, version: u64) -> Result<Vec<Vec<Transaction>>> {
        let cap = self.layout.capacity();
        let mut out = Vec::with_capacity(self.layout.lanes);
        for lane in 0..self.layout.lanes {
            let (gen, used) = self.tail_word(region, lane)?;
            if gen != ver32(version) {
                out.push(Vec::new());
                continue;
            }
            if used > cap || !used.is_multiple_of(8) {
                return Err(self.corrupt(lane, format!("tail {used} is not a place in its {cap} bytes")));
            }
            let mut buf = vec![0u8; used];
            region.read_bytes(self.layout.log(lane), &mut buf)?;
            let mut txns = Vec::new();
            let mut at = 0;
            // Bounded: each round consumes at least HEAD bytes.
            while at < used {
                debug_assert!(txns.len() < used / HEAD, "lane {lane}: more entries than the tail holds");
                debug_assert!(at.is_multiple_of(8) && at + HEAD <= used, "lane {lane}: entry at {at}");
                let head = u64::from_le_bytes(buf[at..at + HEAD].try_into().expect("8 bytes"));
                let (len, tag) = (head as u32 as usize, (head >> 32) as u32);
                if tag != gen {
                    return Err(
                        self.corrupt(lane, format!("entry at {at} belongs to checkpoint {tag}, not {gen}"))
                    );
                }
                let room = used - at - HEAD;
                if len < TXN_HEADER_LEN || pad8(len) > room {
                    return Err(self.corrupt(lane, format!("entry at {at} of {len} bytes, {room} left")));
                }
                let body = &buf[at + HEAD..at + HEAD + len];
                let txn = Transaction::decode(body)
                    .and_then(|t| t.validate_geometry(&self.g).map(|()| t))
                    .map_err(|e| self.corrupt(lane, format!("entry at {at}: {e}")))?;
                txns.push(txn);
                at += HEAD + pad8(len);
            }
            // Each entry was checked to fit in what the TAIL counts: the walk ends on it exactly.
            debug_assert_eq!(at, used);
            out.push(txns);
        }
        assert_eq!(out.len(), self.layout.lanes);
        Ok(out)
    }

    /// Empties every lane's journal for the checkpoint of `version`, the pack in force (after
    /// it is durable, or at mount): stores each TAIL = (version, 0), one persist for all.
    pub fn reset(&self, region: &PmemRegion, version: u64) -> Result<()> {
        let mut held: Vec<_> = self.lanes.iter().map(|l| l.lock()).collect();
        debug_assert_eq!(held.len(), self.layout.lanes);
        let word = (ver32(version) as u64) << 32;
        let mut ranges: Vec<Range<usize>> = Vec::with_capacity(held.len());
        for lane in 0..held.len() {
            let at = self.layout.tail(lane);
            // An aligned store is what makes the TAIL word's update atomic in the region.
            debug_assert!(at.is_multiple_of(8), "TAIL word of lane {lane} at {at}");
            region.store_u64(at, word)?;
            ranges.push(at..at + 8);
        }
        region.persist_ranges(&ranges)?;
        for l in &mut held {
            **l = LaneLog { gen: Some(ver32(version)), used: 0 };
        }
        Ok(())
    }

    /// Bytes an entry for an encoded transaction of `txn_len` bytes takes.
    pub fn entry_len(txn_len: usize) -> usize {
        HEAD + pad8(txn_len)
    }

    /// Whether lane `lane` has room for an entry of an encoded transaction of `txn_len` bytes
    /// now (another append may take it before this caller's).
    pub fn has_room(&self, lane: u32, txn_len: usize) -> bool {
        debug_assert!(txn_len >= TXN_HEADER_LEN, "a transaction of {txn_len} bytes");
        self.lane(lane)
            .map(|l| l.lock().used + Self::entry_len(txn_len) <= self.layout.capacity())
            .unwrap_or(false)
    }

    /// Appends the encoded transaction `txn` to lane `lane`'s journal and commits it: the entry
    /// (head word `len | gen << 32`, the bytes, zero padding to 8) is stored and persisted, then
    /// TAIL = (gen, new length) is stored and persisted. Durable when it returns `Committed`.
    pub fn append(&self, region: &PmemRegion, lane: u32, txn: &[u8]) -> Result<Appended> {
        if txn.len() < TXN_HEADER_LEN || txn.len() > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!("a transaction of {} bytes", txn.len())));
        }
        let n = Self::entry_len(txn.len());
        let mut l = self.lane(lane)?.lock();
        let Some(gen) = l.gen else {
            return Err(Error::InvalidArgument("the region's lane journals were not reset".into()));
        };
        if l.used + n > self.layout.capacity() {
            return Ok(Appended::Full);
        }
        let mut entry = Vec::with_capacity(n);
        entry.extend_from_slice(&(txn.len() as u64 | (gen as u64) << 32).to_le_bytes());
        entry.extend_from_slice(txn);
        entry.resize(n, 0);
        let at = self.layout.log(lane as usize) + l.used;
        // Entries stay 8-aligned and inside the lane's slice (its capacity was checked above).
        debug_assert!(l.used.is_multiple_of(8) && n.is_multiple_of(8));
        debug_assert!(at + n <= self.layout.tail(lane as usize) + self.layout.lane_bytes);
        region.write_bytes(at, &entry)?;
        region.persist(at..at + n)?;
        let after = l.used + n;
        let tail = self.layout.tail(lane as usize);
        region.store_u64(tail, after as u64 | (gen as u64) << 32)?;
        region.persist(tail..tail + 8)?;
        // What the TAIL now counts is the place the next entry goes: aligned, and in the lane.
        debug_assert!(after.is_multiple_of(8) && after <= self.layout.capacity(), "lane {lane} tail {after}");
        let before = std::mem::replace(&mut l.used, after);
        Ok(Appended::Committed { before, after })
    }

    /// Entry bytes each lane holds now.
    pub fn usage(&self) -> Vec<usize> {
        let used: Vec<usize> = self.lanes.iter().map(|l| l.lock().used).collect();
        debug_assert!(used.iter().all(|&u| u <= self.layout.capacity()), "a lane past its capacity");
        used
    }

    /// One line for `inspect`: the journals' size and, under the checkpoint of `version`, what
    /// each lane holds (read from the region's TAIL words).
    pub fn describe(&self, region: &PmemRegion, version: u64) -> String {
        let held: Vec<String> = (0..self.layout.lanes)
            .map(|lane| match self.tail_word(region, lane) {
                Ok((gen, used)) if gen == ver32(version) => format!("{used}"),
                Ok(_) => "0".into(),
                Err(e) => format!("error: {e}"),
            })
            .collect();
        format!(
            "{} lane journals of {} KiB; bytes committed since checkpoint {version}: {}",
            self.layout.lanes,
            self.layout.capacity() >> 10,
            held.join(", ")
        )
    }
}
