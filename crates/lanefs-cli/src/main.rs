//! The `lanefs` command: create, check, describe and measure lanefs images.
//!
//! Each subcommand is a thin translation to the library; errors print as one line prefixed with
//! `lanefs <command>:` and map to exit codes (fsck uses fsck(8)'s).

// An application of the engine: its items are documented where they need it, not as an API
// (the workspace denies missing_docs for the engine's sake).
#![allow(missing_docs)]

use clap::{Parser, Subcommand, ValueEnum};
use lanefs::device::IoChoice;
use std::path::PathBuf;
use std::process::ExitCode;

mod cmd;
mod size;

/// See Cargo.toml: blocks freed by a thread other than the one that allocated them are the
/// checkpoint's common case, and mimalloc frees those without the owner's lock.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// is mounted, the FUSE requests its mount served and its engine counters. Given a lanefs
    /// mount point: those only (also `getfattr -n lanefs.requests --only-values MNT`, and
    /// `lanefs.engine`: checkpoints, their longest pauses, bytes, contended locks by class).
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
            exit(cmd::mkfs::mkfs(&image, size, lanes, &label, force), "mkfs")
        }
        Cmd::Fsck { image, repair, nvm, io } => cmd::fsck::fsck(&image, repair, nvm, io.into()),
        Cmd::Inspect { image, json, nvm: None, .. } if image.is_dir() => {
            exit(cmd::inspect::inspect_mount(&image, json), "inspect")
        }
        Cmd::Inspect { image, json, nvm, io } => {
            exit(cmd::inspect::inspect(&image, json, nvm.as_deref(), io.into()), "inspect")
        }
        Cmd::Devbench { path, pmem: true, bytes, iterations, json, .. } => {
            exit(cmd::devbench::pmem_bench(&path, bytes, iterations, json), "devbench")
        }
        Cmd::Devbench { path, pmem: false, io, batch, iterations, size, json, .. } => {
            exit(cmd::devbench::devbench(&path, io.into(), batch, iterations, size, json), "devbench")
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
        Cmd::Umount { mountpoint } => exit(cmd::umount(&mountpoint), "umount"),
        Cmd::Crashtest { quick, nvm, seed, workloads, threads, replay, state, script, setup, avoid } => {
            cmd::crashtest::crashtest(
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
        Cmd::Bench(args) => exit(cmd::bench(&args), "bench"),
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
