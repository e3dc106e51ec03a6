//! The `lanefs` command: create, check, describe and measure lanefs images.
//!
//! Each subcommand is a thin translation to the library; errors print as one line prefixed with
//! `lanefs <command>:` and map to exit codes (fsck uses fsck(8)'s).

use clap::{Parser, Subcommand, ValueEnum};
use lanefs::device::{self, BlockDevice, DeviceOptions, IoChoice};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod size;

#[derive(Parser)]
#[command(name = "lanefs", version, about = "A log-structured file system for flash that scales with cores")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum IoArg {
    Auto,
    Uring,
    Sync,
}

impl From<IoArg> for IoChoice {
    fn from(a: IoArg) -> Self {
        match a {
            IoArg::Auto => IoChoice::Auto,
            IoArg::Uring => IoChoice::Uring,
            IoArg::Sync => IoChoice::Sync,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Create (or format) an image file or block device.
    Mkfs {
        image: PathBuf,
        /// Size of a new or resized image file (e.g. 512M, 4G, 64GiB).
        #[arg(long, value_parser = size::parse_size)]
        size: Option<u64>,
        /// Lanes of active logs; default: one per CPU.
        #[arg(long)]
        lanes: Option<u32>,
        /// Label, up to 31 bytes.
        #[arg(long, default_value = "")]
        label: String,
        /// Format even if the device holds a file system.
        #[arg(long)]
        force: bool,
    },
    /// Check an image; with --repair, rebuild what can be derived. Exit codes as fsck(8).
    Fsck {
        image: PathBuf,
        #[arg(long)]
        repair: bool,
        /// The persistent-memory region of an image that keeps its NAT and journals in one:
        /// checked with it.
        #[arg(long)]
        nvm: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "auto")]
        io: IoArg,
    },
    /// Describe an image: geometry, checkpoint, segment usage, lanes, I/O mode; and, while it
    /// is mounted, the FUSE requests its mount served. Given a lanefs mount point: those
    /// requests only (also `getfattr -n lanefs.requests --only-values MNT`).
    Inspect {
        /// An image, or a lanefs mount point.
        image: PathBuf,
        #[arg(long)]
        json: bool,
        /// Also describe the image's persistent-memory region: mapping, persistence method, the
        /// NAT it holds, what each lane journal holds.
        #[arg(long)]
        nvm: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "auto")]
        io: IoArg,
    },
    /// Micro-benchmark of the device layer: one batch of discontiguous blocks against one
    /// pwrite per block, on PATH (an image file or block device; overwritten). With --pmem:
    /// the cost of persisting --bytes in a persistent-memory region at PATH (created if
    /// missing; its data area is overwritten), for every persistence method this CPU has.
    Devbench {
        path: PathBuf,
        /// Benchmark persists in a persistent-memory region instead of block writes.
        #[arg(long)]
        pmem: bool,
        /// Bytes per persist (with --pmem).
        #[arg(long, default_value_t = 256)]
        bytes: usize,
        #[arg(long, value_enum, default_value = "auto")]
        io: IoArg,
        /// Blocks per batch.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        #[arg(long, default_value_t = 2000)]
        iterations: usize,
        /// Size to create PATH with when it does not exist.
        #[arg(long, value_parser = size::parse_size, default_value = "256M")]
        size: u64,
        #[arg(long)]
        json: bool,
    },
    /// Mount an image with FUSE (a daemon unless --foreground; errors come before it detaches).
    Mount {
        image: PathBuf,
        mountpoint: PathBuf,
        /// Persistent-memory region (a file on a DAX mount, or in /dev/shm to emulate one) for
        /// the NAT and the lane journals: fsync commits there. Created on first use; the image
        /// needs it from then on.
        #[arg(long)]
        nvm: Option<PathBuf>,
        /// Size of a region created by this mount (e.g. 64M; the NAT of a 1 GiB image needs
        /// about 6 MiB, the rest holds the lane journals); default: the NAT plus 32 MiB of
        /// journal per lane, at most 256 MiB of journals.
        #[arg(long, value_parser = size::parse_size, requires = "nvm")]
        nvm_size: Option<u64>,
        /// Worker threads, each with its own /dev/fuse descriptor; default: one per core.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
        threads: Option<u16>,
        /// Mount options: ro, allow_other, default_permissions (on by default; off with
        /// no_default_permissions), threads=N, checkpoint_secs=N, fsname=..., and what the
        /// kernel's FUSE takes.
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
        /// Stay in the foreground; SIGTERM or SIGINT unmounts.
        #[arg(long, short = 'f')]
        foreground: bool,
    },
    /// Unmount a lanefs mount and wait for its final checkpoint.
    Umount { mountpoint: PathBuf },
    /// Crash-consistency and fault harness: runs workloads on a recording device, rebuilds every
    /// crash state, recovers it and checks the durability contract. Exits non-zero on any
    /// violation; the last line is `crashtest: N states, M violations`.
    Crashtest {
        /// CI mode: at least 10,000 crash states across the families in a few minutes.
        #[arg(long)]
        quick: bool,
        /// Mount every workload with a persistent-memory region (NAT and lane journals there):
        /// crash states cut one timeline of device and region events, with torn (unpersisted)
        /// 8-byte region stores. The corrupt family is skipped.
        #[arg(long)]
        nvm: bool,
        /// Master seed: every workload and crash state derives from it.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Families to run (default: all): seq1 seq2 random mt-lanes mt-rename mt-cp gc faults corrupt.
        #[arg(long, num_args = 1..)]
        workloads: Vec<String>,
        /// Worker threads (default: one per CPU).
        #[arg(long)]
        threads: Option<usize>,
        /// Run one workload again, by the id a violation printed (e.g. seq2:0x1f2e).
        #[arg(long)]
        replay: Option<String>,
        /// With --replay: only this crash state.
        #[arg(long, requires = "replay")]
        state: Option<usize>,
        /// Run a script of operations ("create /A/x; write /A/x 0 4096 1; fsync /A/x").
        #[arg(long, conflicts_with = "replay")]
        script: Option<String>,
        /// Base image of --script: ace (directories A, B, A/C and a few files) or empty.
        #[arg(long, default_value = "ace")]
        setup: String,
        /// Leave these operation kinds out of generated workloads (to look past a known bug):
        /// create mkdir link unlink rmdir rename exchange symlink open write truncate falloc
        /// xattr chmod fsync fdatasync sync; bg-checkpoint leaves out the small journal limits
        /// that make background checkpoints overlap a workload.
        #[arg(long, num_args = 1..)]
        avoid: Vec<String>,
    },
    /// FxMark and filebench workloads against a directory (or lanefs), side by side with the
    /// kernel file systems (--compare); JSON lines, a markdown table and a PNG plot.
    Bench(lanefs_bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Mkfs { image, size, lanes, label, force } => {
            exit(mkfs(&image, size, lanes, &label, force), "mkfs")
        }
        Cmd::Fsck { image, repair, nvm, io } => fsck(&image, repair, nvm, io.into()),
        Cmd::Inspect { image, json, nvm: None, .. } if image.is_dir() => {
            exit(inspect_mount(&image, json), "inspect")
        }
        Cmd::Inspect { image, json, nvm, io } => {
            exit(inspect(&image, json, nvm.as_deref(), io.into()), "inspect")
        }
        Cmd::Devbench { path, pmem: true, bytes, iterations, json, .. } => {
            exit(pmem_bench(&path, bytes, iterations, json), "devbench")
        }
        Cmd::Devbench { path, pmem: false, io, batch, iterations, size, json, .. } => {
            exit(devbench(&path, io.into(), batch, iterations, size, json), "devbench")
        }
        Cmd::Mount { image, mountpoint, nvm, nvm_size, threads, options, foreground } => {
            let args = lanefs_fuse::MountArgs {
                image,
                mountpoint,
                nvm,
                nvm_size,
                threads: threads.map(usize::from),
                options,
                foreground,
            };
            exit(lanefs_fuse::mount_command(&args), "mount")
        }
        Cmd::Umount { mountpoint } => exit(umount(&mountpoint), "umount"),
        Cmd::Crashtest { quick, nvm, seed, workloads, threads, replay, state, script, setup, avoid } => {
            crashtest(
                quick,
                nvm,
                seed,
                &workloads,
                threads,
                replay.as_deref(),
                state,
                script.as_deref(),
                &setup,
                &avoid,
            )
        }
        Cmd::Bench(args) => exit(bench(&args), "bench"),
    }
}

fn exit(r: Result<(), String>, cmd: &str) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lanefs {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn open(path: &Path, io: IoChoice) -> Result<device::FileDevice, String> {
    device::FileDevice::open(path, DeviceOptions { io }).map_err(|e| format!("{}: {e}", path.display()))
}

fn default_lanes() -> u32 {
    std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1).clamp(1, 64)
}

fn mkfs(image: &Path, size: Option<u64>, lanes: Option<u32>, label: &str, force: bool) -> Result<(), String> {
    let lanes = lanes.unwrap_or_else(default_lanes);
    let max = lanefs::format::superblock::LABEL_MAX;
    if label.len() > max {
        return Err(format!("label of {} bytes: a label holds at most {max}", label.len()));
    }
    let meta = std::fs::metadata(image);
    let is_file = match &meta {
        Ok(m) => m.file_type().is_file(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(format!("{}: {e}", image.display())),
    };
    if let Some(s) = size {
        let min = lanefs::format::Geometry::min_size_bytes(lanes);
        if s < min {
            return Err(format!(
                "size {} is below the minimum of {} for {lanes} lanes",
                size::show(s),
                size::show(min)
            ));
        }
    }
    if meta.is_err() {
        let s =
            size.ok_or_else(|| format!("{} does not exist: give --size to create it", image.display()))?;
        device::create_image(image, s).map_err(|e| format!("{}: {e}", image.display()))?;
    } else {
        let dev = open(image, IoChoice::Auto)?;
        if let Some(what) = lanefs::mkfs::detect_existing(&dev).map_err(|e| e.to_string())? {
            if !force {
                return Err(format!("{} holds {what}; use --force to format it anyway", image.display()));
            }
        }
        if let Some(s) = size {
            if !is_file {
                return Err("--size applies to image files; a block device is formatted whole".into());
            }
            std::fs::OpenOptions::new()
                .write(true)
                .open(image)
                .and_then(|f| f.set_len(s))
                .map_err(|e| format!("{}: {e}", image.display()))?;
        }
    }
    let dev = open(image, IoChoice::Auto)?;
    let opts = lanefs::mkfs::MkfsOptions { lanes, label: label.to_string(), ..Default::default() };
    let sb = lanefs::mkfs::format_device(&dev, &opts).map_err(|e| e.to_string())?;
    let g = sb.geometry;
    println!(
        "lanefs: formatted {} ({}, {} lanes, {} segments of 2 MiB, uuid {})",
        image.display(),
        size::show(g.total_blocks * 4096),
        g.lanes,
        g.main_segments,
        sb.uuid_str()
    );
    Ok(())
}

fn fsck(image: &Path, repair: bool, nvm: Option<PathBuf>, io: IoChoice) -> ExitCode {
    let dev = match open(image, io) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("lanefs fsck: {e}");
            return ExitCode::from(8);
        }
    };
    let bar = progress::Bar::new();
    let report = lanefs::fsck::check_with_progress(
        &dev,
        &lanefs::fsck::FsckOptions { repair, nvm },
        &|phase, done, total| bar.update(phase, done, total),
    );
    bar.finish();
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lanefs fsck: {}: {e}", image.display());
            return ExitCode::from(8);
        }
    };
    for n in &report.notes {
        println!("note: {n}");
    }
    for p in &report.problems {
        let tag = if p.repaired { "repaired" } else { "error" };
        println!("{tag}: {}: {}", p.structure, p.message);
    }
    let s = &report.stats;
    println!(
        "{}: checkpoint {} (pack {}), {} inodes, {} directories, {} nodes, {} data blocks, {} xattr blocks: {}",
        image.display(),
        s.checkpoint_version,
        s.checkpoint_pack,
        s.inodes,
        s.directories,
        s.nodes,
        s.data_blocks,
        s.xattr_blocks,
        match report.exit_code() {
            0 => "clean".to_string(),
            1 => format!("{} errors corrected", report.problems.len()),
            _ =>
                format!("{} errors left uncorrected", report.problems.iter().filter(|p| !p.repaired).count()),
        }
    );
    ExitCode::from(report.exit_code() as u8)
}

/// `writeln!` into a `String` (which cannot fail).
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

/// Writes a command's whole output to stdout. A reader that went away (`lanefs inspect | head`)
/// is not an error: the output was simply not wanted any more.
fn emit(out: &str) -> Result<(), String> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("writing to stdout: {e}")),
        _ => Ok(()),
    }
}

fn inspect(image: &Path, json: bool, nvm: Option<&Path>, io: IoChoice) -> Result<(), String> {
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
        (mp, counts)
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
            "mount": mounted.as_ref().map(|(mp, counts)| serde_json::json!({
                "mountpoint": mp, "requests": counts.as_ref().map(|c| requests_json(c)).map_err(|e| e.clone()).ok(),
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
    if let Some((mp, counts)) = &mounted {
        say!(out, "mounted at    {} (what follows is the mount's; the lines above are the image's last checkpoint and journals)", mp.display());
        match counts {
            Ok(c) => say_requests(&mut out, c),
            Err(e) => say!(out, "requests      unknown: {e}"),
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

fn requests_json(counts: &[(String, u64)]) -> serde_json::Value {
    let by_op: serde_json::Map<String, serde_json::Value> =
        counts.iter().map(|(k, n)| (k.clone(), serde_json::json!(n))).collect();
    serde_json::json!({"total": counts.iter().map(|(_, n)| n).sum::<u64>(), "by_opcode": by_op})
}

/// `lanefs inspect MNT`: what the daemon of a lanefs mount served.
fn inspect_mount(mp: &Path, json: bool) -> Result<(), String> {
    let canon = mp.canonicalize().map_err(|e| format!("{}: {e}", mp.display()))?;
    let entry = lanefs_mount_at(&canon).ok_or_else(|| {
        format!("{} is a directory, neither a lanefs image nor a lanefs mount point", mp.display())
    })?;
    let counts = lanefs_fuse::stats::read(&canon)?;
    let mut out = String::new();
    if json {
        let v = serde_json::json!({
            "mountpoint": canon, "image": entry.source, "requests": requests_json(&counts),
        });
        say!(out, "{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        say!(out, "mount         {}", canon.display());
        say!(out, "image         {}", entry.source);
        say_requests(&mut out, &counts);
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

fn devbench(
    path: &Path,
    io: IoChoice,
    batch: usize,
    iterations: usize,
    size: u64,
    json: bool,
) -> Result<(), String> {
    if !path.exists() {
        device::create_image(path, size).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let r =
        device::batch_bench(path, io, batch, iterations).map_err(|e| format!("{}: {e}", path.display()))?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "path": path.display().to_string(), "io_mode": r.description, "batch_blocks": batch,
                "iterations": iterations, "batch_blocks_per_sec": r.batch_blocks_per_sec,
                "pwrite_blocks_per_sec": r.pwrite_blocks_per_sec, "ratio": r.ratio,
            })
        );
    } else {
        println!(
            "{}: {} batch {:.0} blocks/s, one pwrite per block {:.0} blocks/s, ratio {:.2}",
            path.display(),
            r.description,
            r.batch_blocks_per_sec,
            r.pwrite_blocks_per_sec,
            r.ratio
        );
    }
    Ok(())
}

fn pmem_bench(path: &Path, bytes: usize, iterations: usize, json: bool) -> Result<(), String> {
    let rs = lanefs::pmem::bench::persist_bench(path, bytes, iterations, &[]).map_err(|e| e.to_string())?;
    if json {
        let rows: Vec<_> = rs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "method": r.method.to_string(), "region": r.description, "bytes": r.bytes,
                    "iterations": r.iterations, "persist_mean_ns": r.mean_ns, "persist_p50_ns": r.p50_ns,
                    "persist_p99_ns": r.p99_ns, "write_and_persist_ns": r.write_and_persist_ns,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "path": path.display().to_string(), "results": rows }));
    } else {
        if let Some(r) = rs.first() {
            println!("{}: {}", path.display(), r.description);
        }
        for r in &rs {
            println!("{r}");
        }
    }
    Ok(())
}

fn umount(mountpoint: &Path) -> Result<(), String> {
    if let Some(note) = lanefs_fuse::umount_command(mountpoint, std::time::Duration::from_secs(120))? {
        eprintln!("lanefs umount: {note}");
    }
    Ok(())
}

/// `lanefs crashtest`: prints violations as they are found, a progress bar on a terminal, a
/// line per family, and the summary line last.
#[allow(clippy::too_many_arguments)]
fn crashtest(
    quick: bool,
    nvm: bool,
    seed: u64,
    workloads: &[String],
    threads: Option<usize>,
    replay: Option<&str>,
    state: Option<usize>,
    script: Option<&str>,
    setup: &str,
    avoid: &[String],
) -> ExitCode {
    use indicatif::{ProgressBar, ProgressStyle};
    use lanefs::crashtest::{self, Event, Family};
    use std::io::IsTerminal;

    let mut families = Vec::new();
    for w in workloads.iter().flat_map(|w| w.split(',')).filter(|w| !w.is_empty()) {
        match Family::parse(w) {
            Some(f) => families.push(f),
            None => {
                let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
                eprintln!("lanefs crashtest: unknown workload family {w} (known: {})", names.join(", "));
                return ExitCode::from(2);
            }
        }
    }
    if families.is_empty() {
        families = Family::ALL.to_vec();
    }
    let Some(setup) = crashtest::workload::Setup::parse(setup) else {
        eprintln!("lanefs crashtest: unknown setup {setup} (known: ace, empty)");
        return ExitCode::from(2);
    };
    let threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let avoid: Vec<String> =
        avoid.iter().flat_map(|a| a.split(',')).filter(|a| !a.is_empty()).map(String::from).collect();
    if let Some(bad) = avoid
        .iter()
        .find(|a| !crashtest::ops::Op::KINDS.contains(&a.as_str()) && a.as_str() != crashtest::BG_CHECKPOINT)
    {
        eprintln!(
            "lanefs crashtest: unknown operation kind {bad} (known: {})",
            crashtest::ops::Op::KINDS.join(", ")
        );
        return ExitCode::from(2);
    }
    let cfg = crashtest::Config { quick, seed, families, threads, avoid, nvm };
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} states, {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    });
    let sink = |e: Event<'_>| match e {
        Event::Family { family, target } => {
            if let Some(b) = &bar {
                b.set_message(family.name());
                b.set_length(target.min(10_000_000));
                b.set_position(0);
            }
        }
        Event::Progress { states, .. } => {
            if let Some(b) = &bar {
                b.set_position(states);
            }
        }
        Event::Violation(text) | Event::Note(text) => match &bar {
            Some(b) => b.suspend(|| println!("{text}")),
            None => println!("{text}"),
        },
    };
    let sum = match (replay, script) {
        (Some(id), _) => crashtest::replay(&cfg, id, state, &sink),
        (None, Some(text)) => crashtest::run_script(&cfg, setup, text, &sink),
        (None, None) => crashtest::run(&cfg, &sink),
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    for f in &sum.families {
        println!(
            "{:>10}: {} workloads, {} states, {} violations, {:.1} s",
            f.family.name(),
            f.workloads,
            f.states,
            f.violations,
            f.elapsed.as_secs_f64()
        );
    }
    println!(
        "time: {:.1} s, {} threads{}{}",
        sum.elapsed.as_secs_f64(),
        threads,
        if quick { ", quick" } else { "" },
        if nvm { ", nvm" } else { "" }
    );
    println!("{}", sum.last_line());
    if sum.violations > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `lanefs bench`: the harness lives in the lanefs-bench crate.
fn bench(args: &lanefs_bench::BenchArgs) -> Result<(), String> {
    lanefs_bench::run(args)
}

mod progress {
    //! A progress bar on a terminal, nothing otherwise.
    use indicatif::{ProgressBar, ProgressStyle};
    use std::io::IsTerminal;

    pub struct Bar(Option<ProgressBar>);

    impl Bar {
        pub fn new() -> Bar {
            if !std::io::stderr().is_terminal() {
                return Bar(None);
            }
            let b = ProgressBar::new(0);
            b.set_style(
                ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            Bar(Some(b))
        }
        pub fn update(&self, phase: &str, done: u64, total: u64) {
            if let Some(b) = &self.0 {
                b.set_message(phase.to_string());
                b.set_length(total);
                b.set_position(done);
            }
        }
        pub fn finish(&self) {
            if let Some(b) = &self.0 {
                b.finish_and_clear();
            }
        }
    }
}
