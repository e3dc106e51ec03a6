//! `lanefs inspect --json`: the same facts as the text report, as serde-derived structs, so
//! that the schema is one set of types a reader (or a test) can check, not nested macros.
//! Maps are BTreeMaps: keys come out sorted, as before.

use lanefs::{ImageInfo, RegionInfo};
use lanefs_fuse::stats::{Counts, EngineCounters};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Serialize)]
pub struct Image<'a> {
    uuid: &'a str,
    label: &'a str,
    created: u64,
    format_version: u32,
    io_mode: String,
    io_detail: String,
    geometry: Geometry,
    superblock_copies_ok: [bool; 2],
    checkpoint: Checkpoint<'a>,
    segments: Segments,
    valid_blocks_by_kind: Kinds,
    free_bytes: u64,
    reserved_bytes: u64,
    bytes_written: Written,
    write_amplification: Option<f64>,
    lanes: Vec<Lane>,
    nat_in_region: bool,
    region: Option<Region<'a>>,
    mount: Option<Mount<'a>>,
}

#[derive(Serialize)]
struct Geometry {
    block_size: usize,
    segment_blocks: u32,
    total_blocks: u64,
    lanes: u32,
    cp_blkaddr: u64,
    cp_pack_blocks: u32,
    nat_blkaddr: u64,
    nat_blocks: u32,
    sit_blkaddr: u64,
    sit_blocks: u32,
    ssa_blkaddr: u64,
    main_blkaddr: u64,
    main_segments: u32,
    max_nid: u32,
    reserved_segments: u32,
}

#[derive(Serialize)]
struct Checkpoint<'a> {
    version: u64,
    pack: u32,
    clean_unmount: bool,
    other_pack: &'a str,
    orphans: usize,
    next_generation: u64,
}

#[derive(Serialize)]
struct Segments {
    free: u32,
    active: u32,
    dirty: u32,
    valid_blocks: u64,
}

#[derive(Serialize)]
struct Kinds {
    data: u64,
    node: u64,
    xattr: u64,
    other: u64,
}

#[derive(Serialize)]
struct Written {
    user: u64,
    gc: u64,
    checkpoint: u64,
}

#[derive(Serialize)]
struct Lane {
    lane: usize,
    /// Log name -> where its next block goes.
    logs: BTreeMap<&'static str, Cursor>,
}

#[derive(Serialize)]
struct Cursor {
    segment: u32,
    next_block: u16,
}

#[derive(Serialize)]
struct Region<'a> {
    path: &'a str,
    region: &'a str,
    nat: &'a str,
    journals: &'a str,
    journal_transactions: &'a [usize],
}

/// What the daemon of a mount counted.
#[derive(Serialize)]
pub struct Mount<'a> {
    mountpoint: &'a Path,
    /// Absent when the counters could not be read (`lanefs inspect IMAGE` of a mounted image).
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<&'a str>,
    requests: Option<Requests>,
    engine: Option<Engine>,
}

#[derive(Serialize)]
struct Requests {
    total: u64,
    by_opcode: BTreeMap<String, u64>,
}

#[derive(Serialize)]
struct Engine {
    /// The plain counters (`checkpoints`, `cp_exclusive_us_max`, ...).
    counters: BTreeMap<String, u64>,
    /// Lock class -> acquisitions that waited.
    contended: BTreeMap<String, u64>,
    /// The same per FUSE request, when the requests are known.
    contended_per_request: Option<BTreeMap<String, f64>>,
}

impl<'a> Image<'a> {
    pub fn new(
        info: &'a ImageInfo,
        dev: &dyn lanefs::device::BlockDevice,
        region: Option<&'a RegionInfo>,
        mount: Option<Mount<'a>>,
    ) -> Image<'a> {
        let g = &info.geometry;
        let names = ImageInfo::log_names();
        Image {
            uuid: &info.uuid,
            label: &info.label,
            created: info.created,
            format_version: info.format_version,
            io_mode: dev.io_mode().to_string(),
            io_detail: dev.describe(),
            geometry: Geometry {
                block_size: lanefs::device::BLOCK_SIZE,
                segment_blocks: lanefs::format::layout::BLOCKS_PER_SEG,
                total_blocks: g.total_blocks,
                lanes: g.lanes,
                cp_blkaddr: g.cp_blkaddr,
                cp_pack_blocks: g.cp_pack_blocks,
                nat_blkaddr: g.nat_blkaddr,
                nat_blocks: g.nat_blocks,
                sit_blkaddr: g.sit_blkaddr,
                sit_blocks: g.sit_blocks,
                ssa_blkaddr: g.ssa_blkaddr,
                main_blkaddr: g.main_blkaddr,
                main_segments: g.main_segments,
                max_nid: g.max_nid,
                reserved_segments: g.reserved_segments,
            },
            superblock_copies_ok: info.superblock_copies_ok,
            checkpoint: Checkpoint {
                version: info.checkpoint_version,
                pack: info.checkpoint_pack,
                clean_unmount: info.clean_unmount,
                other_pack: &info.other_pack,
                orphans: info.orphans,
                next_generation: info.next_generation,
            },
            segments: Segments {
                free: info.usage.free,
                active: info.usage.active,
                dirty: info.usage.dirty,
                valid_blocks: info.usage.valid_blocks,
            },
            valid_blocks_by_kind: Kinds {
                data: info.usage.kinds.data,
                node: info.usage.kinds.node,
                xattr: info.usage.kinds.xattr,
                other: info.usage.kinds.other,
            },
            free_bytes: info.free_bytes,
            reserved_bytes: info.reserved_bytes,
            bytes_written: Written {
                user: info.user_bytes_written,
                gc: info.gc_bytes_written,
                checkpoint: info.cp_bytes_written,
            },
            write_amplification: super::write_amplification(info),
            lanes: info
                .lanes
                .iter()
                .enumerate()
                .map(|(lane, logs)| Lane {
                    lane,
                    logs: names
                        .iter()
                        .zip(logs)
                        .map(|(n, c)| (*n, Cursor { segment: c.segno.0, next_block: c.next_off }))
                        .collect(),
                })
                .collect(),
            nat_in_region: info.nat_in_region,
            region: region.map(|r| Region {
                path: &r.path,
                region: &r.region,
                nat: &r.nat,
                journals: &r.journals,
                journal_transactions: &r.journal_transactions,
            }),
            mount,
        }
    }
}

impl<'a> Mount<'a> {
    pub fn new(
        mountpoint: &'a Path,
        image: Option<&'a str>,
        counts: Option<&Counts>,
        engine: Option<&EngineCounters>,
    ) -> Mount<'a> {
        Mount {
            mountpoint,
            image,
            requests: counts.map(|c| Requests {
                total: c.iter().map(|(_, n)| n).sum(),
                by_opcode: c.iter().cloned().collect(),
            }),
            engine: engine.map(|e| engine_json(e, counts)),
        }
    }
}

fn engine_json(e: &EngineCounters, counts: Option<&Counts>) -> Engine {
    let census = e.census();
    let total = super::request_total(counts);
    Engine {
        counters: e.values.iter().filter(|(k, _)| !k.starts_with("contended.")).cloned().collect(),
        contended: census.nonzero().map(|(r, n)| (format!("{r:?}"), n)).collect(),
        contended_per_request: total
            .map(|t| census.nonzero().map(|(r, n)| (format!("{r:?}"), n as f64 / t as f64)).collect()),
    }
}

/// Pretty JSON of `v`, as the command prints it.
pub fn to_string<T: Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string_pretty(v).map_err(|e| e.to_string())
}
