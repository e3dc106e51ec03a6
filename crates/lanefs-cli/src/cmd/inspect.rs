//! `lanefs inspect`: describe an image, and while it is mounted (or given a mount point) what
//! its daemon counted: FUSE requests and the engine's counters.

use super::{emit, open};
use crate::size;
use lanefs::device::{BlockDevice, IoChoice};
use std::path::Path;

pub fn inspect(image: &Path, json: bool, nvm: Option<&Path>, io: IoChoice) -> Result<(), String> {
    let dev = open(image, io)?;
    let info = lanefs::inspect::inspect(&dev).map_err(|e| format!("{}: {e}", image.display()))?;
    let region = match nvm {
        Some(p) => Some(lanefs::inspect::inspect_region(&dev, p).map_err(|e| e.to_string())?),
        None => None,
    };
    let g = &info.geometry;
    let mut out = String::new();
    let names = lanefs::inspect::ImageInfo::log_names();
    // A mounted image: its mount's request counters too.
    let mounted = image.canonicalize().ok().and_then(|img| lanefs_fuse::mount::mounted_at(&img)).map(|mp| {
        let counts = lanefs_fuse::stats::read(&mp);
        let engine = lanefs_fuse::stats::read_engine(&mp);
        (mp, counts, engine)
    });
    if json {
        let lanes: Vec<serde_json::Value> = info
            .lanes
            .iter()
            .enumerate()
            .map(|(i, logs)| {
                let m: serde_json::Map<String, serde_json::Value> = logs
                    .iter()
                    .zip(names)
                    .map(|(c, n)| {
                        (n.to_string(), serde_json::json!({"segment": c.segno, "next_block": c.next_off}))
                    })
                    .collect();
                serde_json::json!({"lane": i, "logs": m})
            })
            .collect();
        let v = serde_json::json!({
            "uuid": info.uuid, "label": info.label, "created": info.created, "format_version": info.format_version,
            "io_mode": dev.io_mode().to_string(), "io_detail": dev.describe(),
            "geometry": {
                "block_size": 4096, "segment_blocks": 512, "total_blocks": g.total_blocks, "lanes": g.lanes,
                "cp_blkaddr": g.cp_blkaddr, "cp_pack_blocks": g.cp_pack_blocks,
                "nat_blkaddr": g.nat_blkaddr, "nat_blocks": g.nat_blocks,
                "sit_blkaddr": g.sit_blkaddr, "sit_blocks": g.sit_blocks,
                "ssa_blkaddr": g.ssa_blkaddr, "main_blkaddr": g.main_blkaddr,
                "main_segments": g.main_segments, "max_nid": g.max_nid, "reserved_segments": g.reserved_segments,
            },
            "superblock_copies_ok": info.superblock_copies_ok,
            "checkpoint": {"version": info.checkpoint_version, "pack": info.checkpoint_pack,
                           "clean_unmount": info.clean_unmount, "other_pack": info.other_pack, "orphans": info.orphans,
                           "next_generation": info.next_generation},
            "segments": {"free": info.usage.free, "active": info.usage.active, "dirty": info.usage.dirty,
                         "valid_blocks": info.usage.valid_blocks},
            "valid_blocks_by_kind": {"data": info.usage.kinds.data, "node": info.usage.kinds.node,
                                     "xattr": info.usage.kinds.xattr, "other": info.usage.kinds.other},
            "free_bytes": info.free_bytes,
            "reserved_bytes": info.reserved_bytes,
            "bytes_written": {"user": info.user_bytes_written, "gc": info.gc_bytes_written, "checkpoint": info.cp_bytes_written},
            "write_amplification": write_amplification(&info),
            "lanes": lanes,
            "nat_in_region": info.nat_in_region,
            "region": region.as_ref().map(|r| serde_json::json!({
                "path": r.path, "region": r.region, "nat": r.nat, "journals": r.journals,
                "journal_transactions": r.journal_transactions,
            })),
            "mount": mounted.as_ref().map(|(mp, counts, engine)| serde_json::json!({
                "mountpoint": mp, "requests": counts.as_ref().map(|c| requests_json(c)).ok(),
                "engine": engine.as_ref().map(|e| engine_json(e, counts.as_ref().ok())).ok(),
            })),
        });
        say!(out, "{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
        return emit(&out);
    }
    say!(out, "image         {}", image.display());
    say!(out, "uuid          {}", info.uuid);
    if !info.label.is_empty() {
        say!(out, "label         {}", info.label);
    }
    say!(out, "format        version {}, 4 KiB blocks, 2 MiB segments", info.format_version);
    say!(out, "size          {} ({} blocks)", size::show(g.total_blocks * 4096), g.total_blocks);
    say!(out, "I/O           {}", dev.describe());
    say!(out, "superblocks   A {}, B {}", ok(info.superblock_copies_ok[0]), ok(info.superblock_copies_ok[1]));
    say!(
        out,
        "checkpoint    version {} in pack {} ({}); other pack {}",
        info.checkpoint_version,
        info.checkpoint_pack,
        if info.clean_unmount { "clean unmount" } else { "needs roll-forward" },
        info.other_pack
    );
    say!(
        out,
        "areas         cp @{} ({} blocks x2), NAT @{} ({} x2), SIT @{} ({} x2), SSA @{}, main @{}",
        g.cp_blkaddr,
        g.cp_pack_blocks,
        g.nat_blkaddr,
        g.nat_blocks,
        g.sit_blkaddr,
        g.sit_blocks,
        g.ssa_blkaddr,
        g.main_blkaddr
    );
    say!(
        out,
        "segments      {} main: {} free, {} active, {} dirty; {} reserved for cleaning",
        g.main_segments,
        info.usage.free,
        info.usage.active,
        info.usage.dirty,
        g.reserved_segments
    );
    say!(
        out,
        "space         {} valid blocks, {} free, {} preallocated and unwritten",
        info.usage.valid_blocks,
        size::show(info.free_bytes),
        size::show(info.reserved_bytes)
    );
    let k = &info.usage.kinds;
    say!(
        out,
        "valid blocks  {} data, {} node, {} xattr{}",
        k.data,
        k.node,
        k.xattr,
        if k.other > 0 { format!(", {} unsummarised (run fsck)", k.other) } else { String::new() }
    );
    say!(
        out,
        "written       {} by users, {} by the file system, {} by cleaning; write amplification {}",
        size::show(info.user_bytes_written),
        size::show(info.cp_bytes_written),
        size::show(info.gc_bytes_written),
        write_amplification(&info).map_or("-".to_string(), |w| format!("{w:.2}"))
    );
    say!(out, "orphans       {}", info.orphans);
    say!(out, "generations   next {}", info.next_generation);
    if info.nat_in_region || region.is_some() {
        say!(
            out,
            "NAT           {}",
            if info.nat_in_region {
                "in a persistent-memory region, with the lane journals (mount with --nvm FILE)"
            } else {
                "on the device"
            }
        );
    }
    if let Some(r) = &region {
        say!(out, "region        {}: {}", r.path, r.region);
        say!(out, "region NAT    {}", r.nat);
        say!(out, "region log    {}", r.journals);
        if !r.journal_transactions.is_empty() {
            let t: Vec<String> = r.journal_transactions.iter().map(|n| n.to_string()).collect();
            say!(out, "              transactions per lane, replayed by the next mount: {}", t.join(", "));
        }
    }
    for (i, logs) in info.lanes.iter().enumerate() {
        let s: Vec<String> =
            logs.iter().zip(names).map(|(c, n)| format!("{n} {}+{}", c.segno, c.next_off)).collect();
        say!(out, "lane {i:<8} {}", s.join(", "));
    }
    if let Some((mp, counts, engine)) = &mounted {
        say!(out, "mounted at    {} (what follows is the mount's; the lines above are the image's last checkpoint and journals)", mp.display());
        match counts {
            Ok(c) => say_requests(&mut out, c),
            Err(e) => say!(out, "requests      unknown: {e}"),
        }
        match engine {
            Ok(e) => say_engine(&mut out, e, counts.as_ref().ok()),
            Err(e) => say!(out, "engine        unknown: {e}"),
        }
    }
    emit(&out)
}

/// The lanefs mount at `mp` (canonical) and its image, if it is one.
fn lanefs_mount_at(mp: &Path) -> Option<lanefs_fuse::mount::MountEntry> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    lanefs_fuse::mount::lanefs_mounts(&info).into_iter().rev().find(|m| m.mountpoint == mp)
}

/// The request counters of a mount: the nonzero ones, one a line, after a total.
fn say_requests(out: &mut String, counts: &[(String, u64)]) {
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    say!(out, "requests      {total} FUSE requests since the mount (reading these is not counted)");
    for (name, n) in counts.iter().filter(|(_, n)| *n > 0) {
        say!(out, "  {name:<16} {n:>12}");
    }
}

/// FUSE requests in `counts`, for per-request figures (None when unknown or none).
fn request_total(counts: Option<&lanefs_fuse::stats::Counts>) -> Option<u64> {
    counts.map(|c| c.iter().map(|(_, n)| n).sum::<u64>()).filter(|&t| t > 0)
}

/// The engine's counters of a mount: checkpoints and their pauses, bytes, and the lock classes
/// whose acquisitions waited, per FUSE request where the requests are known.
fn say_engine(
    out: &mut String,
    e: &lanefs_fuse::stats::EngineCounters,
    counts: Option<&lanefs_fuse::stats::Counts>,
) {
    let v = |k: &str| e.get(k).map_or("?".to_string(), |n| n.to_string());
    say!(
        out,
        "checkpoints   {} since the mount; longest exclusive phase {} µs (every operation held out), longest write phase {} µs; {} fsyncs or writebacks waited for one",
        v("checkpoints"),
        v("cp_exclusive_us_max"),
        v("cp_write_phase_us_max"),
        v("cp_waits")
    );
    say!(
        out,
        "device        {} written for {} by users ({} by cleaning, {} segments); {} device flushes for fsync",
        e.get("device_bytes").map_or("?".to_string(), size::show),
        e.get("user_bytes").map_or("?".to_string(), size::show),
        e.get("cleaning_bytes").map_or("?".to_string(), size::show),
        v("segments_cleaned"),
        v("fsync_flushes")
    );
    let census = e.census();
    let total = request_total(counts);
    if census.total() == 0 {
        say!(out, "contention    no lock acquisition waited since the mount");
        return;
    }
    say!(
        out,
        "contention    {} lock acquisitions waited since the mount{}",
        census.total(),
        if total.is_some() { "; per FUSE request:" } else { ":" }
    );
    for (rank, n) in census.nonzero() {
        match total {
            Some(t) => say!(out, "  {:<16} {n:>12}  {:.6}", format!("{rank:?}"), n as f64 / t as f64),
            None => say!(out, "  {:<16} {n:>12}", format!("{rank:?}")),
        }
    }
}

fn engine_json(
    e: &lanefs_fuse::stats::EngineCounters,
    counts: Option<&lanefs_fuse::stats::Counts>,
) -> serde_json::Value {
    let total = request_total(counts);
    let census = e.census();
    let contended: serde_json::Map<String, serde_json::Value> =
        census.nonzero().map(|(r, n)| (format!("{r:?}"), serde_json::json!(n))).collect();
    let per_request: Option<serde_json::Map<String, serde_json::Value>> = total.map(|t| {
        census.nonzero().map(|(r, n)| (format!("{r:?}"), serde_json::json!(n as f64 / t as f64))).collect()
    });
    let plain: serde_json::Map<String, serde_json::Value> = e
        .values
        .iter()
        .filter(|(k, _)| !k.starts_with("contended."))
        .map(|(k, n)| (k.clone(), serde_json::json!(n)))
        .collect();
    serde_json::json!({"counters": plain, "contended": contended, "contended_per_request": per_request})
}

fn requests_json(counts: &[(String, u64)]) -> serde_json::Value {
    let by_op: serde_json::Map<String, serde_json::Value> =
        counts.iter().map(|(k, n)| (k.clone(), serde_json::json!(n))).collect();
    serde_json::json!({"total": counts.iter().map(|(_, n)| n).sum::<u64>(), "by_opcode": by_op})
}

/// `lanefs inspect MNT`: what the daemon of a lanefs mount served.
pub fn inspect_mount(mp: &Path, json: bool) -> Result<(), String> {
    let canon = mp.canonicalize().map_err(|e| format!("{}: {e}", mp.display()))?;
    let entry = lanefs_mount_at(&canon).ok_or_else(|| {
        format!("{} is a directory, neither a lanefs image nor a lanefs mount point", mp.display())
    })?;
    let counts = lanefs_fuse::stats::read(&canon)?;
    let engine = lanefs_fuse::stats::read_engine(&canon)?;
    let mut out = String::new();
    if json {
        let v = serde_json::json!({
            "mountpoint": canon, "image": entry.source, "requests": requests_json(&counts),
            "engine": engine_json(&engine, Some(&counts)),
        });
        say!(out, "{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        say!(out, "mount         {}", canon.display());
        say!(out, "image         {}", entry.source);
        say_requests(&mut out, &counts);
        say_engine(&mut out, &engine, Some(&counts));
    }
    emit(&out)
}

/// Device bytes (file system and cleaning) per user byte, over the image's life.
fn write_amplification(info: &lanefs::inspect::ImageInfo) -> Option<f64> {
    (info.user_bytes_written > 0)
        .then(|| (info.cp_bytes_written + info.gc_bytes_written) as f64 / info.user_bytes_written as f64)
}

fn ok(b: bool) -> &'static str {
    if b {
        "ok"
    } else {
        "BAD"
    }
}
