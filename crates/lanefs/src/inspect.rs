//! inspect: describe an image — geometry, checkpoint, segment usage (and what the valid blocks
//! hold, from the segment summaries), lanes, free space.

use crate::checkpoint;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::format::checkpoint::{LogCursor, CP_FLAG_CLEAN, CP_FLAG_NVM_NAT};
use crate::format::layout::{Geometry, LogType, SegNo, BLOCK_SIZE, LOG_TYPES};
use crate::format::ssa::SummaryKind;
use crate::pmem::journal::NvmJournal;
use crate::pmem::nat::NvmNat;
use crate::pmem::{PmemRegion, RegionOptions};
use std::collections::HashSet;
use std::path::Path;

/// Segment counts by state, as of the checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentUsage {
    /// Segments holding no valid block.
    pub free: u32,
    /// Segments a log is writing.
    pub active: u32,
    /// Partly or fully valid, not active.
    pub dirty: u32,
    /// Valid blocks in the whole main area.
    pub valid_blocks: u64,
    /// The valid blocks by what the segment summaries say they hold.
    pub kinds: BlockKinds,
}

/// Valid blocks by kind (`SummaryKind`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockKinds {
    /// File and directory data blocks.
    pub data: u64,
    /// Inodes, direct, indirect and xattr nodes.
    pub node: u64,
    /// Xattr blocks: the streams of xattr sets too large for their node.
    pub xattr: u64,
    /// Valid blocks whose summary says journal or nothing, or whose summary does not decode
    /// (fsck names them).
    pub other: u64,
}

/// Everything `lanefs inspect` prints.
#[derive(Debug, Clone)]
pub struct ImageInfo {
    /// The file system's UUID, as text.
    pub uuid: String,
    /// The label set by mkfs or FS_IOC_SETFSLABEL (may be empty).
    pub label: String,
    /// When mkfs made the image (the superblock's `created` stamp).
    pub created: u64,
    /// On-disk format version.
    pub format_version: u32,
    /// The image's geometry: areas, segments, lanes.
    pub geometry: Geometry,
    /// Which of the two superblock copies decode.
    pub superblock_copies_ok: [bool; 2],
    /// Version of the checkpoint mount would use.
    pub checkpoint_version: u64,
    /// Which of the two packs (0 or 1) holds it.
    pub checkpoint_pack: u32,
    /// Whether the last unmount was clean (no journal to replay).
    pub clean_unmount: bool,
    /// The other pack: valid (its version) or why not.
    pub other_pack: String,
    /// Segments by state.
    pub usage: SegmentUsage,
    /// Per lane, the cursor of each of its logs.
    pub lanes: Vec<[LogCursor; LOG_TYPES]>,
    /// Inodes unlinked while open at the checkpoint, freed at the next mount.
    pub orphans: usize,
    /// The generation counter: above every inode's generation (`crate::generation`).
    pub next_generation: u64,
    /// Bytes free for data, invalid blocks the cleaner reclaims included.
    pub free_bytes: u64,
    /// Bytes preallocated and not yet written (fallocate), which `free_bytes` leaves out.
    pub reserved_bytes: u64,
    /// Bytes users wrote, since mkfs (as of the checkpoint).
    pub user_bytes_written: u64,
    /// Bytes the cleaner moved, since mkfs.
    pub gc_bytes_written: u64,
    /// Bytes checkpoints wrote, since mkfs.
    pub cp_bytes_written: u64,
    /// The checkpoint keeps the NAT and the lane journals in a persistent-memory region.
    pub nat_in_region: bool,
}

/// A persistent-memory region as `lanefs inspect --nvm` shows it.
#[derive(Debug, Clone)]
pub struct RegionInfo {
    /// The region's file.
    pub path: String,
    /// Size, mapping, persistence method, file system.
    pub region: String,
    /// What it holds for the image's checkpoint: the NAT, or why it cannot be used.
    pub nat: String,
    /// The lane journals' size and what each holds.
    pub journals: String,
    /// Transactions in each lane's journal since the checkpoint (replayed by the next mount);
    /// empty when the region does not hold the image's NAT or its journals do not decode.
    pub journal_transactions: Vec<usize>,
}

/// Reads the image's description.
pub fn inspect(dev: &dyn BlockDevice) -> Result<ImageInfo> {
    let sbr = checkpoint::read_superblock(dev)?;
    let g = sbr.sb.geometry;
    let cpr = checkpoint::read_checkpoint(dev, &g)?;
    let cp = &cpr.cp;
    let sit = checkpoint::read_sit(dev, &g, cp)?;
    let active: HashSet<SegNo> = cp.lanes.iter().flat_map(|l| l.logs.iter().map(|c| c.segno)).collect();
    let mut usage = SegmentUsage::default();
    // One SIT entry per main segment, in order.
    for (segno, e) in g.segments().zip(&sit) {
        usage.valid_blocks += e.valid_blocks as u64;
        if e.valid_blocks > 0 {
            let k = &mut usage.kinds;
            match checkpoint::read_summary(dev, &g, segno) {
                Ok(sum) => {
                    for (_, en) in sum.entries.iter().enumerate().filter(|(off, _)| e.is_valid(*off as u32)) {
                        match en.kind {
                            SummaryKind::Data => k.data += 1,
                            SummaryKind::Node => k.node += 1,
                            SummaryKind::Xattr => k.xattr += 1,
                            SummaryKind::Journal | SummaryKind::None => k.other += 1,
                        }
                    }
                }
                Err(_) => k.other += e.valid_blocks as u64,
            }
        }
        if active.contains(&segno) {
            usage.active += 1;
        } else if e.valid_blocks == 0 {
            usage.free += 1;
        } else {
            usage.dirty += 1;
        }
    }
    // Free space as statfs reports it: what users can fill, less the valid blocks (invalid ones
    // count as free: the cleaner gives them back) and the preallocated ones, less the nodes
    // that data would need.
    let free_blocks = crate::engine::data_room(
        g.user_blocks().saturating_sub(usage.valid_blocks).saturating_sub(cp.reserved_blocks),
    );
    Ok(ImageInfo {
        uuid: sbr.sb.uuid_str(),
        label: sbr.sb.label_str(),
        created: sbr.sb.created,
        format_version: sbr.sb.version,
        geometry: g,
        superblock_copies_ok: [sbr.copies[0].is_ok(), sbr.copies[1].is_ok()],
        checkpoint_version: cp.version,
        checkpoint_pack: cpr.pack,
        clean_unmount: cp.flags & CP_FLAG_CLEAN != 0,
        other_pack: match &cpr.other {
            Ok(v) => format!("valid, older version {v}"),
            Err(e) => format!("not usable: {e}"),
        },
        usage,
        lanes: cp.lanes.iter().map(|l| l.logs).collect(),
        orphans: cp.orphans.len(),
        next_generation: cp.next_generation,
        free_bytes: free_blocks * BLOCK_SIZE as u64,
        reserved_bytes: cp.reserved_blocks * BLOCK_SIZE as u64,
        user_bytes_written: cp.user_bytes_written,
        gc_bytes_written: cp.gc_bytes_written,
        cp_bytes_written: cp.cp_bytes_written,
        nat_in_region: cp.flags & CP_FLAG_NVM_NAT != 0,
    })
}

/// Describes the region at `path` as the image on `dev` sees it. Opens it (locking it, so a
/// region in use by a mount is an error) and writes nothing.
pub fn inspect_region(dev: &dyn BlockDevice, path: &Path) -> Result<RegionInfo> {
    let sb = checkpoint::read_superblock(dev)?.sb;
    let g = sb.geometry;
    let cp = checkpoint::read_checkpoint(dev, &g)?.cp;
    let region = PmemRegion::open(path, Some(sb.uuid), &RegionOptions::default())?;
    let nvm = NvmNat::new(region, &g)?;
    let log = NvmJournal::new(nvm.region(), nvm.layout().end, &g)?;
    let mut journals = log.describe(nvm.region(), cp.version);
    let mut journal_transactions = Vec::new();
    let nat = if cp.flags & CP_FLAG_NVM_NAT == 0 {
        format!(
            "not in use: checkpoint {} keeps its NAT on the device (a mount with the region seeds it)",
            cp.version
        )
    } else {
        match nvm.read(cp.version) {
            Ok(blocks) => {
                match log.read(nvm.region(), cp.version) {
                    Ok(lanes) => journal_transactions = lanes.iter().map(Vec::len).collect(),
                    Err(e) => journals = format!("{journals}; {e}"),
                }
                let live: usize =
                    blocks.values().map(|b| b.entries.iter().filter(|e| !e.is_free()).count()).sum();
                format!("NAT of checkpoint {}: {live} live node ids of {}", cp.version, nvm.layout().entries)
            }
            Err(e) => format!("unusable: {e}"),
        }
    };
    Ok(RegionInfo {
        path: path.display().to_string(),
        region: nvm.region().describe(),
        nat,
        journals,
        journal_transactions,
    })
}

impl ImageInfo {
    /// Log type names in cursor order, for printing.
    pub fn log_names() -> [&'static str; LOG_TYPES] {
        LogType::ALL.map(LogType::name)
    }
}
