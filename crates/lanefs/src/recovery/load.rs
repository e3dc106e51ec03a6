//! Mount's first phase: the state the checkpoint left — its NAT (from the device, or from the
//! persistent-memory region that may hold it and the lane journals) and the segment table and
//! lanes positioned at its log cursors.
//!
//! Nothing here reads a journal chain: what this loads is exactly the checkpoint's state, the
//! base every later phase patches. A read-only mount writes nothing and keeps no region.

use crate::checkpoint::{read_nat, read_sit, read_summary};
use crate::device::{BlockDevice, Halt};
use crate::engine::FsOptions;
use crate::error::{Error, Result};
use crate::format::checkpoint::CP_FLAG_NVM_NAT;
use crate::format::layout::{Geometry, LogType, SegNo};
use crate::format::{Checkpoint, Superblock};
use crate::journal::Transaction;
use crate::nat::NatTable;
use crate::pmem::journal::NvmJournal;
use crate::pmem::nat::NvmNat;
use crate::pmem::PmemRegion;
use crate::seg::{LaneSet, SegmentTable};
use std::sync::Arc;

/// The segment table (from the SIT, with the checkpoint's active segments) and the lanes,
/// positioned at the checkpoint's log cursors with their active segments' summaries.
pub(super) fn load_segments(
    dev: &dyn BlockDevice,
    g: &Geometry,
    cp: &Checkpoint,
) -> Result<(Arc<SegmentTable>, LaneSet)> {
    let sit = read_sit(dev, g, cp)?;
    let active: Vec<(SegNo, u32, LogType)> = cp
        .lanes
        .iter()
        .enumerate()
        .flat_map(|(l, lane)| lane.logs.iter().zip(LogType::ALL).map(move |(c, t)| (c.segno, l as u32, t)))
        .collect();
    // One active segment per log of every lane: the table marks exactly those active.
    debug_assert_eq!(active.len(), cp.lanes.len() * LogType::ALL.len(), "active segments of the checkpoint");
    let table = Arc::new(SegmentTable::new(*g, sit, &active)?);
    let mut summaries = Vec::with_capacity(cp.lanes.len());
    for lane in &cp.lanes {
        let mut s = Vec::with_capacity(lane.logs.len());
        for c in &lane.logs {
            s.push(read_summary(dev, g, c.segno)?);
        }
        summaries.push(s);
    }
    let cursors: Vec<_> = cp.lanes.iter().map(|l| l.logs).collect();
    let lanes = LaneSet::new(table.clone(), &cursors, summaries)?;
    // The chains, the lane journals and the report are all indexed by the checkpoint's lanes.
    debug_assert_eq!(lanes.lane_count() as usize, cp.lanes.len(), "lanes loaded");
    Ok((table, lanes))
}

/// What [`load_nat`] found: the NAT, the region's NAT and lane journals (when the engine keeps
/// them), and the transactions those journals hold under the pack in force (per lane).
pub(super) type Loaded = (NatTable, Option<NvmNat>, Option<NvmJournal>, Vec<Vec<Transaction>>);

/// The NAT of checkpoint `cp` and the region the engine keeps it in (see the protocols in
/// `crate::pmem`): from the region when the pack is flagged, else from the device — seeding
/// the region (created if missing) when the mount has one. The region's lane journals are read
/// under a flagged pack only (records go there only under one). A read-only mount writes
/// nothing and keeps no region.
pub(super) fn load_nat(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    cp: &Checkpoint,
    opts: &FsOptions,
    halt: &Arc<Halt>,
) -> Result<Loaded> {
    let g = &sb.geometry;
    // `mount` refuses norecovery on a writable mount: what this loads is then written to.
    debug_assert!(!opts.no_recovery || opts.read_only, "norecovery on a writable mount");
    let flagged = cp.flags & CP_FLAG_NVM_NAT != 0;
    let table = |blocks| NatTable::from_blocks(g, blocks, NatTable::default_slots(), cp.next_nid);
    let Some(path) = &opts.nvm else {
        if flagged {
            return Err(Error::InvalidArgument(format!(
                "the image keeps its NAT and journals in a persistent-memory region (checkpoint {}): \
                 mount it with --nvm FILE",
                cp.version
            )));
        }
        return Ok((table(read_nat(dev, g, cp)?), None, None, Vec::new()));
    };
    if flagged {
        // Never a fresh region here: the NAT is in the one the image was checkpointed with.
        let mut region = PmemRegion::open(path, Some(sb.uuid), &opts.nvm_region)?;
        region.set_halt(halt.clone());
        let nvm = NvmNat::new(region, g)?;
        let log = NvmJournal::new(nvm.region(), nvm.layout().end, g)?;
        let blocks = nvm.read(cp.version)?;
        let txns = log.read(nvm.region(), cp.version)?;
        // One journal per lane: recovery pairs them with the device chains by index.
        debug_assert_eq!(txns.len(), g.lanes.max(1) as usize, "region journals read");
        if opts.read_only {
            return Ok((table(blocks), None, None, txns));
        }
        nvm.settle(cp.version)?;
        return Ok((table(blocks), Some(nvm), Some(log), txns));
    }
    let blocks = read_nat(dev, g, cp)?;
    if opts.read_only {
        return Ok((table(blocks), None, None, Vec::new()));
    }
    let (mut region, _) = PmemRegion::open_or_create(
        path,
        opts.nvm_size.unwrap_or_else(|| crate::pmem::default_size(g)),
        sb.uuid,
        &opts.nvm_region,
    )?;
    region.set_halt(halt.clone());
    let nvm = NvmNat::new(region, g)?;
    let log = NvmJournal::new(nvm.region(), nvm.layout().end, g)?;
    nvm.seed(&blocks, cp.version)?;
    Ok((table(blocks), Some(nvm), Some(log), Vec::new()))
}
