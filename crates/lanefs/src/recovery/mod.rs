//! Mount and recovery.
//!
//! Mount reads the newest valid checkpoint (superblock, pack, NAT, SIT, active segments), then
//! follows every lane's journal chain from the head the checkpoint recorded. A transaction is
//! kept only if every data block it references has the checksum it recorded (so a crash before
//! the device flush, which may have persisted the journal block but not the data, can never
//! expose stale data), or a flushed-through mark in the chain proves it was durable (then its
//! data is not read: see `walk::verified_prefix`); the first one that fails ends its lane. The
//! blocks the kept chains use are protected from reuse, every lane moves to fresh segments, the
//! records of all lanes are merged by timestamp and those after the checkpoint's stamp are
//! replayed into MEMFS, and a new checkpoint makes the result the base of the next mount. Reads
//! of the chains' data are batched per transaction. With a persistent-memory region the region
//! is read first: the NAT, and the lane journals fsync committed there, whose transactions join
//! the device chains' (see `crate::pmem`).
//!
//! One phase of [`mount`] per child, in the order it runs them; this file keeps the order
//! itself, the report, and the engine built from what the phases loaded:
//! - `load`: the checkpoint's state — the NAT (and the region, which may hold it) and the
//!   segment table and lanes.
//! - `walk`: every lane's journal chain, walked and its transactions' data checked.
//! - `space`: the blocks the kept chains use, protected from reuse, and the chains this mount
//!   writes.
//! - `replay`: the records applied to MEMFS, and the checkpoint's orphans.

mod load;
mod replay;
mod space;
mod walk;

use load::{load_nat, load_segments};
use replay::{mark_orphans, replay_all};
use space::{protect_journaled_blocks, start_chains};
use walk::{check_region_txns, newer_data_refs, walk_lanes, Journals};

use crate::checkpoint::{read_checkpoint, read_superblock, CheckpointRead};
use crate::device::{BlockDevice, Halt, HaltDevice, BLOCK_SIZE};
use crate::disk::{Disk, GroupCommit};
use crate::engine::{Engine, FsOptions, StampClock};
use crate::error::{Error, Result};
use crate::flush::checkpoint::{Checkpointer, CpRequests, CpState};
use crate::format::checkpoint::CP_FLAG_NVM_NAT;
use crate::format::layout::Geometry;
use crate::journal::ChainWriter;
use crate::mem::pages::CacheStats;
use crate::mem::Cells;
use crate::mem::Memfs;
use crate::nat::NatTable;
use crate::oplog::InFlight;
use crate::pmem::journal::NvmJournal;
use crate::pmem::nat::NvmNat;
use crate::seg::{LaneSet, SegmentTable};
use crate::sync::rank::{Condvar, Mutex, Rank, RwLock};
use crate::sync::{PassSem, PerCpu, PerCpuCounter};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What recovery did, for the mount's log line, `inspect`-style reporting and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Journal transactions replayed.
    pub transactions: usize,
    /// Records those transactions held.
    pub records_replayed: usize,
    /// Transactions dropped because their data did not reach the disk.
    pub torn_transactions: usize,
    /// Orphan inodes (unlinked while open) freed.
    pub orphans_removed: usize,
    /// Lanes whose journal (on the device or in the region) held a transaction to replay.
    pub lanes: usize,
    /// Bytes of the transactions kept (their encoded records).
    pub bytes: u64,
    /// Written data blocks the replayed records map (the file data the journal brought back).
    pub data_blocks: u64,
    /// Journal blocks the chain walks read on the device.
    pub journal_blocks: u64,
    /// Data blocks read back to check the transactions no flushed-through mark proves durable.
    pub data_blocks_checked: u64,
    /// From reading the checkpoint to the end of the post-recovery checkpoint.
    pub elapsed: std::time::Duration,
}

impl RecoveryReport {
    /// Whether the mount replayed or removed anything (a clean image: nothing to say).
    pub fn replayed(&self) -> bool {
        self.transactions + self.torn_transactions + self.orphans_removed > 0
    }
}

impl std::fmt::Display for RecoveryReport {
    /// One line for a human: "recovered 12 transactions (340 records, 1.2 MiB, mapping 40.0 MiB
    /// of data; 20 journal blocks read, 256 data blocks checked) from 2 lanes in 15 ms; 1 torn
    /// transactions dropped; 0 orphans removed".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "recovered {} transactions ({} records, {:.1} MiB, mapping {:.1} MiB of data; {} journal blocks read, \
             {} data blocks checked) from {} lanes in {} ms; {} torn transactions dropped; {} orphans removed",
            self.transactions,
            self.records_replayed,
            self.bytes as f64 / (1u64 << 20) as f64,
            (self.data_blocks * BLOCK_SIZE as u64) as f64 / (1u64 << 20) as f64,
            self.journal_blocks,
            self.data_blocks_checked,
            self.lanes,
            self.elapsed.as_millis(),
            self.torn_transactions,
            self.orphans_removed,
        )
    }
}

/// The chain nonce: fixed per format, different across formats.
pub(crate) fn nonce_of(uuid: &[u8; 16]) -> u64 {
    u64::from_le_bytes(uuid[..8].try_into().expect("8 bytes"))
}

/// Mounts the file system on `dev`, recovering from a crash if needed.
///
/// The phases, each a function below: read the superblock and the newest checkpoint, load the
/// NAT (and the region, which may hold it and the lane journals), load the segment tables and
/// lanes, walk every lane's chain, protect the blocks the chains use and start the chains this
/// mount writes, build the engine, replay the records newer than the checkpoint, and end with
/// a checkpoint that makes the result the base of the next mount.
pub fn mount(dev: Arc<dyn BlockDevice>, opts: FsOptions) -> Result<(Arc<Engine>, RecoveryReport)> {
    if opts.no_recovery && !opts.read_only {
        return Err(Error::errno(libc::EINVAL, "norecovery needs a read-only mount"));
    }
    // Every write of this mount, to the device and to the region, passes the shutdown gate.
    let halt = Halt::new();
    let dev: Arc<dyn BlockDevice> = Arc::new(HaltDevice::new(dev, halt.clone()));
    let sb = read_superblock(&*dev)?.sb;
    let g = sb.geometry;
    let cpr = read_checkpoint(&*dev, &g)?;
    let cp = &cpr.cp;
    let started = std::time::Instant::now();
    // The region first: it may hold the NAT and the lane journals.
    let (nat, nvm, nvm_log, region_txns) = load_nat(&*dev, &sb, cp, &opts, &halt)?;
    // Records go to the region's journals only under a pack that says the image needs its
    // region (a mount without it would miss them): the first mount with a region takes a
    // checkpoint, which flags the pack, before it returns.
    let first_with_region = nvm.is_some() && cp.flags & CP_FLAG_NVM_NAT == 0;
    let (table, lanes) = load_segments(&*dev, &g, cp)?;
    let nonce = nonce_of(&sb.uuid);
    let mut report = RecoveryReport::default();
    let reads = walk_lanes(&*dev, &g, cp, nonce, &opts, &mut report)?;
    debug_assert_eq!(lanes.lane_count() as usize, reads.len(), "one chain read per lane");
    let region_txns = if opts.no_recovery { Vec::new() } else { region_txns };
    let region = check_region_txns(&*dev, cp, region_txns, &reads, &mut report)?;
    let journals = Journals { reads, region };
    // The report counts exactly the transactions kept, device and region together.
    debug_assert_eq!(report.transactions, journals.transactions().count(), "transactions counted");
    report.data_blocks = journals.transactions().map(|t| newer_data_refs(t, cp.stamp).len() as u64).sum();
    let touched = journals.touched(cp);
    if touched {
        protect_journaled_blocks(&*dev, &g, cp, &table, &lanes, &journals)?;
    }
    let (chains, chain_marks) = start_chains(&lanes, cp, nonce, &journals.reads, touched)?;
    let clock_floor = cp.stamp.max(journals.max_stamp());
    let generation_floor = journals.generation_floor(cp);
    let records = journals.into_replay_order(cp.stamp);
    // Nothing kept, nothing to replay: an untouched mount skips replay and its checkpoint.
    debug_assert!(touched || records.is_empty(), "{} records to replay on an untouched mount", records.len());
    // The clock restarts past every record replayed: a new operation never sorts before one.
    debug_assert!(records.last().is_none_or(|r| r.stamp().ticks <= clock_floor));
    report.records_replayed = records.len();
    let orphans = cp.orphans.clone();
    let parts = MountParts { dev, halt, g, nat, nvm, nvm_log, table, lanes, chains, chain_marks };
    let engine = Arc::new(new_engine(parts, cpr, opts, clock_floor, generation_floor));
    if touched {
        replay_all(&engine, &records)?;
        report.orphans_removed = mark_orphans(&engine, orphans);
    }
    finish(&engine, touched || first_with_region)?;
    report.elapsed = started.elapsed();
    Ok((engine, report))
}

/// What the mount loaded from the device and the region, to build the engine from.
struct MountParts {
    dev: Arc<dyn BlockDevice>,
    halt: Arc<Halt>,
    g: Geometry,
    nat: NatTable,
    nvm: Option<NvmNat>,
    nvm_log: Option<NvmJournal>,
    table: Arc<SegmentTable>,
    lanes: LaneSet,
    chains: Vec<Mutex<ChainWriter>>,
    chain_marks: Vec<crate::journal::ChainMarks>,
}

/// The engine over what the mount loaded, under checkpoint `cpr`, its clock past
/// `clock_floor` and its generations past `generation_floor`; MEMFS starts empty.
fn new_engine(
    p: MountParts,
    cpr: CheckpointRead,
    opts: FsOptions,
    clock_floor: u64,
    generation_floor: u64,
) -> Engine {
    let lanes = p.lanes.lane_count() as usize;
    debug_assert!(p.chains.len() == lanes && p.chain_marks.len() == lanes, "one chain per lane");
    // Nothing the engine stamps may sort before what the checkpoint holds.
    debug_assert!(clock_floor >= cpr.cp.stamp && generation_floor >= cpr.cp.next_generation);
    let CheckpointRead { cp, pack, .. } = cpr;
    let (age, reserved) = (cp.elapsed_secs, cp.reserved_blocks);
    // Resolved once, for this device.
    let inline = opts.nvm_inline_pages.unwrap_or(if p.dev.flush_is_free() {
        0
    } else {
        crate::engine::DEFAULT_INLINE_PAGES
    });
    let opts = FsOptions { nvm_inline_pages: Some(inline), ..opts };
    Engine {
        disk: Disk {
            dev: p.dev,
            halt: p.halt,
            g: p.g,
            nat: p.nat,
            nvm: p.nvm,
            nvm_log: p.nvm_log,
            table: p.table,
            lanes: p.lanes,
            chains: p.chains,
            chain_marks: p.chain_marks,
            group: GroupCommit::default(),
            commit: crate::disk::CommitQueue::new(crate::disk::COMMIT_QUEUE_BOUND),
            io: Default::default(),
            age_at_mount: age,
            mounted_at: std::time::Instant::now(),
        },
        mem: Memfs {
            cells: Cells::new(),
            pass: PassSem::new(),
            inflight: InFlight::new(),
            rename_lock: Mutex::new(Rank::Rename, ()),
            cache: Arc::new(CacheStats { reserved_blocks: reserved.into(), ..Default::default() }),
            dirty: PerCpu::new(|_| Mutex::new(Rank::DirtySet, Default::default())),
            dead: PerCpu::new(|_| Mutex::new(Rank::DeadList, Vec::new())),
            atime: std::sync::atomic::AtomicU8::new(opts.atime.encode()),
            lazy: PerCpu::new(|_| Mutex::new(Rank::LazyAtime, Vec::new())),
            lazy_since: std::sync::atomic::AtomicU64::new(0),
            lazy_flush: AtomicBool::new(false),
            orphans: Mutex::new(Rank::Orphans, Default::default()),
            orphan_count: Default::default(),
            generations: crate::generation::Generations::new(generation_floor),
            xattr_owed: Default::default(),
            dirty_inodes: PerCpuCounter::new(),
            // The first checkpoint after mount is number 1 (`CpState::started` is 0).
            epoch: std::sync::atomic::AtomicU64::new(1),
            claimed: Default::default(),
        },
        ckpt: Checkpointer {
            gate: RwLock::new(Rank::Gate, ()),
            cp_serial: Mutex::new(Rank::CpSerial, ()),
            cp: Mutex::new(
                Rank::CpState,
                CpState {
                    cp,
                    pack,
                    started: 0,
                    durable: 0,
                    settled: 0,
                    fence: 0,
                    snap_stamp: 0,
                    installs: Default::default(),
                },
            ),
            cp_done: Condvar::new(),
            requests: CpRequests {
                journal_blocks: PerCpuCounter::new(),
                logged_ops: PerCpuCounter::new(),
                deleted_inodes: PerCpuCounter::new(),
                kick: (Mutex::new(Rank::CpKick, false), Condvar::new()),
                logged_ops_limit: opts.logged_ops_limit,
                journal_blocks_limit: opts.journal_blocks_limit,
            },
            failed: AtomicBool::new(false),
            failure: Mutex::new(Rank::Failure, String::new()),
            stop: AtomicBool::new(false),
            gc: Default::default(),
            cp_pauses: Default::default(),
        },
        clock: StampClock::new(clock_floor),
        opts,
    }
}

/// Ends the mount: a checkpoint when recovery changed anything or the image meets its region
/// for the first time (a read-only mount keeps the replayed state in memory only; with a
/// region, the checkpoint empties its lane journals once its pack is durable), else an empty
/// start for the region's lane journals.
fn finish(engine: &Engine, checkpoint: bool) -> Result<()> {
    if checkpoint {
        engine.checkpoint(false)?;
    } else {
        // Nothing was replayed and no orphan marked: the engine holds nothing a checkpoint
        // would have to write before the lane journals start empty.
        debug_assert_eq!(engine.mem.dirty_inodes.sum(), 0, "dirty inodes after an untouched mount");
        // Whatever the lane journals hold belongs to no live checkpoint (or is empty).
        let version = engine.ckpt.cp.lock().cp.version;
        engine.disk.reset_nvm_journals(version)?;
    }
    Ok(())
}
