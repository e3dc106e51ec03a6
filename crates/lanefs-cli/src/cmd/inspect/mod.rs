//! `lanefs inspect`: describe an image, and while it is mounted (or given a mount point) what
//! its daemon counted: FUSE requests and the engine's counters.

use super::{emit, open};
use crate::size;
use lanefs::device::{BlockDevice, IoChoice};
use std::path::Path;

mod json;

pub fn inspect(image: &Path, json: bool, nvm: Option<&Path>, io: IoChoice) -> Result<(), String> {
    let dev = open(image, io)?;
    let info = lanefs::inspect(&dev).map_err(|e| format!("{}: {e}", image.display()))?;
    let region = match nvm {
        Some(p) => Some(lanefs::inspect_region(&dev, p).map_err(|e| e.to_string())?),
        None => None,
    };
    // A mounted image: its mount's request counters too.
    let mounted = image.canonicalize().ok().and_then(|img| lanefs_fuse::mount::mounted_at(&img)).map(|mp| {
        let counts = lanefs_fuse::stats::read(&mp);
        let engine = lanefs_fuse::stats::read_engine(&mp);
        (mp, counts, engine)
    });
    let mut out = String::new();
    if json {
        let mount = mounted.as_ref().map(|(mp, counts, engine)| {
            json::Mount::new(mp, None, counts.as_ref().ok(), engine.as_ref().ok())
        });
        say!(out, "{}", json::to_string(&json::Image::new(&info, &dev, region.as_ref(), mount))?);
        return emit(&out);
    }
    say_image(&mut out, image, &info, &dev, region.as_ref());
    if let Some((mp, counts, engine)) = &mounted {
        say!(out, "mounted at    {} (what follows is the mount's; the lines above are the image's last checkpoint and journals)", mp.display());
        match lanefs_fuse::stats::read_transport(mp) {
            Ok(t) => say!(out, "transport     {t}"),
            Err(e) => say!(out, "transport     unknown: {e}"),
        }
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

/// The text report of an image: superblocks, checkpoint, areas, space, lanes, region.
fn say_image(
    out: &mut String,
    image: &Path,
    info: &lanefs::ImageInfo,
    dev: &dyn BlockDevice,
    region: Option<&lanefs::RegionInfo>,
) {
    let g = &info.geometry;
    let names = lanefs::ImageInfo::log_names();
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
        write_amplification(info).map_or("-".to_string(), |w| format!("{w:.2}"))
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
    if let Some(r) = region {
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
        "device        {} written for {} by users ({} by cleaning, {} segments); {} device flushes for \
         {} fsync flushes (group commit shares one among concurrent fsyncs)",
        e.get("device_bytes").map_or("?".to_string(), size::show),
        e.get("user_bytes").map_or("?".to_string(), size::show),
        e.get("cleaning_bytes").map_or("?".to_string(), size::show),
        v("segments_cleaned"),
        v("fsync_device_flushes"),
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
        let m = json::Mount::new(&canon, Some(&entry.source), Some(&counts), Some(&engine));
        say!(out, "{}", json::to_string(&m)?);
    } else {
        say!(out, "mount         {}", canon.display());
        say!(out, "image         {}", entry.source);
        say_requests(&mut out, &counts);
        say_engine(&mut out, &engine, Some(&counts));
    }
    emit(&out)
}

/// Device bytes (file system and cleaning) per user byte, over the image's life.
fn write_amplification(info: &lanefs::ImageInfo) -> Option<f64> {
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
