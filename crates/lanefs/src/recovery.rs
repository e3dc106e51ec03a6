//! Mount and recovery.
//!
//! Mount reads the newest valid checkpoint (superblock, pack, NAT, SIT, active segments), then
//! follows every lane's journal chain from the head the checkpoint recorded. A transaction is
//! kept only if every data block it references has the checksum it recorded (so a crash before
//! the device flush, which may have persisted the journal block but not the data, can never
//! expose stale data), or a flushed-through mark in the chain proves it was durable (then its
//! data is not read: see `verified_prefix`); the first one that fails ends its lane. The blocks
//! the kept chains use are protected from reuse, every lane moves to fresh segments, the records
//! of all lanes are merged by timestamp and those after the checkpoint's stamp are replayed into
//! MEMFS, and a new checkpoint makes the result the base of the next mount. Reads of the chains'
//! data are batched per transaction. With a persistent-memory region the region is read first:
//! the NAT, and the lane journals fsync committed there, whose transactions join the device
//! chains' (see `crate::pmem`).

use crate::checkpoint::{
    read_blocks, read_checkpoint, read_nat, read_sit, read_summary, read_superblock, CheckpointRead,
};
use crate::device::{BlockDevice, Halt, HaltDevice, BLOCK_SIZE};
use crate::engine::{CpState, Engine, FsOptions, GroupCommit, StampClock, JOURNAL_LOG};
use crate::error::{Error, Result};
use crate::format::checkpoint::CP_FLAG_NVM_NAT;
use crate::format::layout::{Geometry, LogType};
use crate::format::node::NEW_ADDR;
use crate::format::ssa::{SummaryEntry, SummaryKind};
use crate::format::{Checkpoint, Superblock};
use crate::journal::{merge_by_stamp, read_chain, ChainRead, ChainWriter, InodeAttr, Record, Transaction};
use crate::mem::mnode::{ts_to_ns, MNode, Meta, S_IFDIR};
use crate::mem::pages::CacheStats;
use crate::mem::xattr::XattrSet;
use crate::mem::Cells;
use crate::nat::NatTable;
use crate::oplog::dirlog::LoggedOp;
use crate::oplog::InFlight;
use crate::pmem::journal::NvmJournal;
use crate::pmem::nat::NvmNat;
use crate::pmem::PmemRegion;
use crate::seg::{LaneSet, SegmentTable};
use crate::sync::rank::{Condvar, Mutex, Rank, RwLock};
use crate::sync::{PassSem, PerCpu, PerCpuCounter};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What recovery did, for the mount's log line, `inspect`-style reporting and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub transactions: usize,
    pub records_replayed: usize,
    /// Transactions dropped because their data did not reach the disk.
    pub torn_transactions: usize,
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
    let region_txns = if opts.no_recovery { Vec::new() } else { region_txns };
    let region = check_region_txns(&*dev, cp, region_txns, &reads, &mut report)?;
    let journals = Journals { reads, region };
    report.data_blocks = journals.transactions().map(|t| newer_data_refs(t, cp.stamp).len() as u64).sum();
    let touched = journals.touched(cp);
    if touched {
        protect_journaled_blocks(&*dev, &g, cp, &table, &lanes, &journals)?;
    }
    let (chains, chain_marks) = start_chains(&lanes, cp, nonce, &journals.reads, touched)?;
    let clock_floor = cp.stamp.max(journals.max_stamp());
    let generation_floor = journals.generation_floor(cp);
    let records = journals.into_replay_order(cp.stamp);
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

/// The segment table (from the SIT, with the checkpoint's active segments) and the lanes,
/// positioned at the checkpoint's log cursors with their active segments' summaries.
fn load_segments(
    dev: &dyn BlockDevice,
    g: &Geometry,
    cp: &Checkpoint,
) -> Result<(Arc<SegmentTable>, LaneSet)> {
    let sit = read_sit(dev, g, cp)?;
    let active: Vec<(u32, u32, LogType)> = cp
        .lanes
        .iter()
        .enumerate()
        .flat_map(|(l, lane)| lane.logs.iter().zip(LogType::ALL).map(move |(c, t)| (c.segno, l as u32, t)))
        .collect();
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
    Ok((table, lanes))
}

/// Walks lane `l`'s chain from the head its checkpoint records and keeps the transactions
/// whose data is intact: the read, how many transactions were torn, and how many data blocks
/// were read to find out.
fn walk_lane(
    dev: &dyn BlockDevice,
    g: &Geometry,
    cp: &Checkpoint,
    nonce: u64,
    no_recovery: bool,
    l: usize,
) -> Result<(ChainRead, usize, u64)> {
    let lane = &cp.lanes[l];
    if lane.journal_head == 0 || no_recovery {
        return Ok((ChainRead::empty(lane.journal_head, lane.journal_seq), 0, 0));
    }
    let mut r = read_chain(dev, g, l as u16, nonce, lane.journal_head, lane.journal_seq, g.main_blocks())?;
    let read = r.transactions.len();
    let (kept, checked) = verified_prefix(dev, &r.transactions, r.proven(), cp.stamp)?;
    assert!(kept <= read, "kept {kept} of {read} transactions read");
    r.truncate(kept);
    // The chain only moves forward from the head the checkpoint gave it.
    debug_assert!(r.end_seq >= lane.journal_seq);
    debug_assert!(r.starts.windows(2).all(|w| w[0].seq < w[1].seq));
    Ok((r, read - kept, checked))
}

/// The journals: each lane's chain is walked (and its transactions' data checked) on a thread
/// of its own, since the lanes are independent until their records are merged. One read per
/// lane, in lane order; the counts go to `report`.
fn walk_lanes(
    dev: &dyn BlockDevice,
    g: &Geometry,
    cp: &Checkpoint,
    nonce: u64,
    opts: &FsOptions,
    report: &mut RecoveryReport,
) -> Result<Vec<ChainRead>> {
    let walk = |l: usize| walk_lane(dev, g, cp, nonce, opts.no_recovery, l);
    let walked: Vec<Result<(ChainRead, usize, u64)>> = if cp.lanes.len() > 1 {
        std::thread::scope(|scope| {
            let walk = &walk;
            let handles: Vec<_> = (0..cp.lanes.len()).map(|l| scope.spawn(move || walk(l))).collect();
            // A walk that panicked is a bug in the decoder: the mount fails with it.
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        })
    } else {
        (0..cp.lanes.len()).map(walk).collect()
    };
    let mut reads: Vec<ChainRead> = Vec::with_capacity(cp.lanes.len());
    for w in walked {
        let (r, torn, checked) = w?;
        report.torn_transactions += torn;
        report.data_blocks_checked += checked;
        report.transactions += r.transactions.len();
        report.journal_blocks += r.blocks.len() as u64;
        report.lanes += usize::from(!r.transactions.is_empty());
        report.bytes += r.transactions.iter().map(|t| t.encoded_len() as u64).sum::<u64>();
        reads.push(r);
    }
    assert_eq!(reads.len(), cp.lanes.len(), "one chain read per lane");
    Ok(reads)
}

/// The region's lane journals: a transaction is committed there only after a device flush
/// that followed the writes of every data block it maps (`Engine::commit_to_region`), so all
/// are proven and none is read back. Returns them per lane, the counts going to `report`.
fn check_region_txns(
    dev: &dyn BlockDevice,
    cp: &Checkpoint,
    mut region_txns: Vec<Vec<Transaction>>,
    reads: &[ChainRead],
    report: &mut RecoveryReport,
) -> Result<Vec<Vec<Transaction>>> {
    for (l, t) in region_txns.iter_mut().enumerate() {
        let (kept, checked) = verified_prefix(dev, t, t.len(), cp.stamp)?;
        assert!(kept <= t.len(), "kept {kept} of {} region transactions", t.len());
        report.data_blocks_checked += checked;
        report.torn_transactions += t.len() - kept;
        t.truncate(kept);
        report.transactions += kept;
        report.bytes += t.iter().map(|t| t.encoded_len() as u64).sum::<u64>();
        // A lane counts once, whether its transactions were on the device or in the region.
        let on_device = reads.get(l).is_some_and(|r| !r.transactions.is_empty());
        report.lanes += usize::from(!t.is_empty() && !on_device);
    }
    Ok(region_txns)
}

/// The transactions recovery kept: per lane, from its chain on the device and from its
/// journal in the region.
struct Journals {
    reads: Vec<ChainRead>,
    region: Vec<Vec<Transaction>>,
}

impl Journals {
    fn transactions(&self) -> impl Iterator<Item = &Transaction> {
        self.reads.iter().flat_map(|r| r.transactions.iter()).chain(self.region.iter().flatten())
    }

    /// Whether recovery has anything to do: blocks to protect, records or orphans to replay, or
    /// a lane without a journal head to start.
    fn touched(&self, cp: &Checkpoint) -> bool {
        self.reads.iter().any(|r| !r.blocks.is_empty())
            || self.region.iter().any(|t| !t.is_empty())
            || !cp.orphans.is_empty()
            || cp.lanes.iter().any(|l| l.journal_head == 0)
    }

    /// The newest stamp of any record kept (0: none): the mount's clock starts past it.
    fn max_stamp(&self) -> u64 {
        self.transactions().flat_map(|t| t.records.iter().map(|x| x.stamp().ticks)).max().unwrap_or(0)
    }

    /// Past every generation the image knows of: its checkpoint's counter, and the inodes the
    /// journals create (files, and the whiteouts of renames).
    fn generation_floor(&self, cp: &Checkpoint) -> u64 {
        let floor = self
            .transactions()
            .flat_map(|t| t.records.iter())
            .filter_map(|r| match r {
                Record::Create { attr, .. } | Record::SetAttr { attr, .. } => Some(attr.generation),
                Record::Rename { whiteout: Some(w), .. } => Some(w.attr.generation),
                _ => None,
            })
            .filter(|&g| g != 0)
            .map(|g| crate::generation::lift(g, cp.next_generation) + 1)
            .fold(cp.next_generation, u64::max);
        debug_assert!(floor >= cp.next_generation);
        floor
    }

    /// The records of all lanes newer than the checkpoint's stamp `cp_stamp`, in replay order.
    fn into_replay_order(self, cp_stamp: u64) -> Vec<Record> {
        let read: usize = self.transactions().map(|t| t.records.len()).sum();
        let chains = self.reads.into_iter().map(|r| r.transactions).chain(self.region).collect();
        let records: Vec<Record> =
            merge_by_stamp(chains).into_iter().filter(|r| r.stamp().ticks > cp_stamp).collect();
        assert!(records.len() <= read, "{} records to replay of {read} read", records.len());
        debug_assert!(records.windows(2).all(|w| w[0].stamp() <= w[1].stamp()));
        records
    }
}

/// Protects what the chains use until the post-recovery checkpoint is durable: the segments of
/// journal blocks and of data that replay may install stay out of the free map (prefree);
/// replay marks a block valid when it installs it. Logs whose active segment holds such blocks
/// move on to fresh segments, and the segment summaries learn the owners of the data blocks.
fn protect_journaled_blocks(
    dev: &dyn BlockDevice,
    g: &Geometry,
    cp: &Checkpoint,
    table: &SegmentTable,
    lanes: &LaneSet,
    journals: &Journals,
) -> Result<()> {
    let mut touched_segs = std::collections::BTreeSet::new();
    let journal_blocks = journals.reads.iter().flat_map(|r| r.blocks.iter().copied());
    let data = journals.transactions().flat_map(|t| newer_data_refs(t, cp.stamp)).map(|(a, _)| a as u64);
    for b in journal_blocks.chain(data) {
        // Once per segment: a GiB of replayed data is a quarter million blocks.
        if let Some((segno, _)) = g.seg_of(b) {
            if touched_segs.insert(segno) {
                table.claim_for_journal(segno)?;
            }
        }
    }
    // The journal heads this mount starts were reserved in the checkpoint's journal log:
    // that segment always moves, so no old chain block is overwritten in place.
    for lane in &cp.lanes {
        if let Some((segno, _)) = g.seg_of(lane.journal_head as u64) {
            touched_segs.insert(segno);
        }
    }
    lanes.retire_touched(cp.elapsed_secs, |segno| touched_segs.contains(&segno))?;
    lanes.patch_summaries(&summary_patches(g, journals), |segno| {
        read_summary(dev, g, segno).unwrap_or_else(|_| crate::format::SegmentSummary::empty(segno))
    });
    Ok(())
}

/// The owners of the data blocks the journals map, per segment, for the segment summaries
/// (never written for blocks after the checkpoint).
fn summary_patches(
    g: &Geometry,
    journals: &Journals,
) -> std::collections::BTreeMap<u32, Vec<(u32, SummaryEntry)>> {
    let mut patches: std::collections::BTreeMap<u32, Vec<(u32, SummaryEntry)>> = Default::default();
    for t in journals.transactions() {
        for rec in &t.records {
            let Record::Map { ino, first, entries, .. } = rec else { continue };
            for (i, &(addr, _)) in entries.iter().enumerate() {
                if let Some((segno, off)) = g.seg_of(addr as u64) {
                    let e =
                        SummaryEntry { kind: SummaryKind::Data, nid: *ino, ofs: (first + i as u64) as u32 };
                    patches.entry(segno).or_default().push((off, e));
                }
            }
        }
    }
    patches
}

/// The chain writer of each lane for this mount, and its flushed-through marks. After a
/// recovery that touched anything, every lane starts a fresh chain at a newly reserved head
/// (with the seq past both what it read and what the checkpoint gave); otherwise each resumes
/// where its chain ends.
fn start_chains(
    lanes: &LaneSet,
    cp: &Checkpoint,
    nonce: u64,
    reads: &[ChainRead],
    touched: bool,
) -> Result<(Vec<Mutex<ChainWriter>>, Vec<crate::journal::ChainMarks>)> {
    assert_eq!(reads.len(), cp.lanes.len(), "one chain read per lane");
    let mut chains = Vec::with_capacity(reads.len());
    let mut chain_marks = Vec::with_capacity(reads.len());
    for (l, r) in reads.iter().enumerate() {
        let w = if touched || cp.lanes[l].journal_head == 0 {
            let owner = SummaryEntry { kind: SummaryKind::Journal, nid: l as u32, ofs: 0 };
            let head = lanes.reserve(l as u32, JOURNAL_LOG, owner, cp.elapsed_secs)? as u32;
            ChainWriter::new(l as u16, nonce, head, r.end_seq.max(cp.lanes[l].journal_seq))
        } else {
            ChainWriter::resume(l as u16, nonce, r.end())
        };
        // Never behind the checkpoint: a seq reused would let a stale block join the chain.
        debug_assert!(w.position().1 >= cp.lanes[l].journal_seq);
        chain_marks.push(crate::journal::ChainMarks::new(w.position().1));
        chains.push(Mutex::new(Rank::Chain, w));
    }
    Ok((chains, chain_marks))
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
        dev: p.dev,
        halt: p.halt,
        g: p.g,
        nat: p.nat,
        nvm: p.nvm,
        nvm_log: p.nvm_log,
        table: p.table,
        lanes: p.lanes,
        cells: Cells::new(),
        pass: PassSem::new(),
        inflight: InFlight::new(),
        gate: RwLock::new(Rank::Gate, ()),
        cp_serial: Mutex::new(Rank::CpSerial, ()),
        chains: p.chains,
        chain_marks: p.chain_marks,
        group: GroupCommit::default(),
        dirty: PerCpu::new(|_| Mutex::new(Rank::DirtySet, Default::default())),
        dead: PerCpu::new(|_| Mutex::new(Rank::DeadList, Vec::new())),
        atime: std::sync::atomic::AtomicU8::new(opts.atime.encode()),
        lazy: PerCpu::new(|_| Mutex::new(Rank::LazyAtime, Vec::new())),
        lazy_since: std::sync::atomic::AtomicU64::new(0),
        lazy_flush: AtomicBool::new(false),
        orphans: Mutex::new(Rank::Orphans, Default::default()),
        clock: StampClock::new(clock_floor),
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
        cache: Arc::new(CacheStats { reserved_blocks: reserved.into(), ..Default::default() }),
        opts,
        rename_lock: Mutex::new(Rank::Rename, ()),
        generations: crate::generation::Generations::new(generation_floor),
        journal_blocks: PerCpuCounter::new(),
        logged_ops: PerCpuCounter::new(),
        deleted_inodes: PerCpuCounter::new(),
        dirty_inodes: PerCpuCounter::new(),
        xattr_owed: Default::default(),
        failed: AtomicBool::new(false),
        failure: Mutex::new(Rank::Failure, String::new()),
        cp_kick: (Mutex::new(Rank::CpKick, false), Condvar::new()),
        stop: AtomicBool::new(false),
        io: Default::default(),
        age_at_mount: age,
        mounted_at: std::time::Instant::now(),
        gc: Default::default(),
        claimed: Default::default(),
        cp_pauses: Default::default(),
    }
}

/// Replays `records` (in replay order) into MEMFS.
fn replay_all(engine: &Engine, records: &[Record]) -> Result<()> {
    for r in records {
        engine.replay(r)?;
    }
    Ok(())
}

/// Marks dirty the checkpoint's orphans that no replayed record linked again, so the
/// checkpoint that ends recovery deletes them; returns how many.
fn mark_orphans(engine: &Engine, orphans: Vec<u32>) -> usize {
    let mut removed = 0;
    for o in orphans {
        if let Ok(m) = engine.mnode(o) {
            if m.meta.lock().nlink == 0 {
                engine.mark_dirty(&m);
                removed += 1;
            }
        }
    }
    removed
}

/// Ends the mount: a checkpoint when recovery changed anything or the image meets its region
/// for the first time (a read-only mount keeps the replayed state in memory only; with a
/// region, the checkpoint empties its lane journals once its pack is durable), else an empty
/// start for the region's lane journals.
fn finish(engine: &Engine, checkpoint: bool) -> Result<()> {
    if checkpoint {
        engine.checkpoint(false)?;
    } else {
        // Whatever the lane journals hold belongs to no live checkpoint (or is empty).
        let version = engine.cp.lock().cp.version;
        engine.reset_nvm_journals(version)?;
    }
    Ok(())
}

/// What [`load_nat`] found: the NAT, the region's NAT and lane journals (when the engine keeps
/// them), and the transactions those journals hold under the pack in force (per lane).
type Loaded = (NatTable, Option<NvmNat>, Option<NvmJournal>, Vec<Vec<Transaction>>);

/// The NAT of checkpoint `cp` and the region the engine keeps it in (see the protocols in
/// `crate::pmem`): from the region when the pack is flagged, else from the device — seeding
/// the region (created if missing) when the mount has one. The region's lane journals are read
/// under a flagged pack only (records go there only under one). A read-only mount writes
/// nothing and keeps no region.
fn load_nat(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    cp: &Checkpoint,
    opts: &FsOptions,
    halt: &Arc<Halt>,
) -> Result<Loaded> {
    let g = &sb.geometry;
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

/// Data blocks (address, crc) that records of `t` newer than the checkpoint map.
fn newer_data_refs(t: &Transaction, cp_stamp: u64) -> Vec<(u32, u32)> {
    t.records
        .iter()
        .filter(|r| r.stamp().ticks > cp_stamp)
        .flat_map(|r| match r {
            Record::Map { entries, .. } => {
                entries.iter().filter(|e| e.0 != 0 && e.0 != NEW_ADDR).copied().collect()
            }
            _ => Vec::new(),
        })
        .collect()
}

/// How many leading transactions of `txns` have every data block they map (past the
/// checkpoint) intact, and how many data blocks it read to find out. The first `proven` are
/// known to be durable and are not read.
///
/// Why skipping them is safe: a transaction is checked so that a crash between its batch and
/// the device flush (journal blocks on disk, data not) cannot expose stale data. A proven one
/// ends at or below the flushed-through mark of a block the chain walk accepted, and that block
/// was written only after a device flush had completed that started after the transaction's
/// batch completed (`journal::ChainMarks`): its data was on stable storage then. It is still
/// there at the crash: a block a journaled transaction maps after the checkpoint is never
/// written again before a later checkpoint is durable (its segment is at most prefree), the
/// same fact the crc check itself relies on to accept a transaction written long before.
fn verified_prefix(
    dev: &dyn BlockDevice,
    txns: &[Transaction],
    proven: usize,
    cp_stamp: u64,
) -> Result<(usize, u64)> {
    debug_assert!(proven <= txns.len());
    let mut checked = 0u64;
    for (k, t) in txns.iter().enumerate().skip(proven) {
        let refs = newer_data_refs(t, cp_stamp);
        let data = read_blocks(dev, &refs.iter().map(|x| x.0 as u64).collect::<Vec<_>>())?;
        checked += refs.len() as u64;
        let ok = refs.iter().zip(data.chunks(BLOCK_SIZE)).all(|((_, crc), b)| crc32c::crc32c(b) == *crc);
        if !ok {
            return Ok((k, checked));
        }
    }
    Ok((txns.len(), checked))
}

impl Engine {
    /// Applies one journal record to MEMFS (recovery; single-threaded, before mount returns).
    /// Records that refer to what does not exist are skipped: the only way to get them is an
    /// operation absorbed or superseded before its dependent was journaled.
    fn replay(&self, r: &Record) -> Result<()> {
        match r {
            Record::Create { dir, name, ino, attr, symlink, .. } => {
                self.replay_create(r, *dir, name, *ino, attr, symlink)
            }
            Record::Link { dir, name, ino, file_type, .. } => {
                self.replay_link(r, *dir, name, *ino, *file_type)
            }
            Record::Unlink { dir, name, ino, .. } => self.replay_unlink(r, *dir, name, *ino),
            Record::Rename { .. } => self.replay_rename(r),
            Record::SetAttr { ino, attr, .. } => self.replay_setattr(*ino, attr),
            Record::Map { ino, first, entries, .. } => return self.replay_map(*ino, *first, entries),
            Record::Truncate { ino, from_block, .. } => self.replay_truncate(*ino, *from_block),
            Record::Xattrs { ino, attrs, .. } => self.replay_xattrs(*ino, attrs),
            Record::SetXattr { ino, name, value, .. } => self.replay_xattr(*ino, name, Some(value)),
            Record::RemoveXattr { ino, name, .. } => self.replay_xattr(*ino, name, None),
            Record::Free { .. } => {}
            Record::Data { ino, idx, data, .. } => self.replay_data(*ino, *idx, data),
        }
        Ok(())
    }

    /// A create: the new inode and its name, unless either exists already.
    fn replay_create(&self, r: &Record, dir: u32, name: &[u8], ino: u32, attr: &InodeAttr, symlink: &[u8]) {
        let Ok(d) = self.dir_mnode(dir) else { return };
        if self.replay_new_inode(&d, name, ino, attr, symlink) {
            self.replayed(&d, r);
        }
    }

    /// A hard link: one more name, and one more link, for an inode that exists.
    fn replay_link(&self, r: &Record, dir: u32, name: &[u8], ino: u32, file_type: u8) {
        let (Ok(d), Ok(m)) = (self.dir_mnode(dir), self.mnode(ino)) else { return };
        if d.dir().expect("dir").map.insert(name, ino, file_type).is_ok() {
            m.add_nlink(1);
            self.replayed(&d, r);
            self.mark_dirty(&m);
        }
    }

    /// An unlink: the name goes only if it still names `ino`.
    fn replay_unlink(&self, r: &Record, dir: u32, name: &[u8], ino: u32) {
        let Ok(d) = self.dir_mnode(dir) else { return };
        let dm = d.dir().expect("dir");
        if dm.map.lookup(name).map(|e| e.ino) != Some(ino) {
            return;
        }
        dm.map.remove(name);
        if let Ok(m) = self.mnode(ino) {
            self.unlinked(&d, &m);
        }
        self.replayed(&d, r);
    }

    /// A rename (an exchange, or a move that may replace the target and leave a whiteout),
    /// applied only while the source name still names the inode renamed.
    fn replay_rename(&self, r: &Record) {
        let Record::Rename {
            src_dir, src_name, dst_dir, dst_name, ino, replaced, exchange, whiteout, ..
        } = r
        else {
            unreachable!("replay_rename of {r:?}");
        };
        let (Ok(sd), Ok(dd)) = (self.dir_mnode(*src_dir), self.dir_mnode(*dst_dir)) else { return };
        let (sm, dm) = (sd.dir().expect("dir"), dd.dir().expect("dir"));
        let Some(se) = sm.map.lookup(src_name).filter(|e| e.ino == *ino) else { return };
        let de = dm.map.lookup(dst_name);
        let Ok(src) = self.mnode(*ino) else { return };
        if *exchange {
            let Some(de) = de.filter(|e| e.ino == *replaced) else { return };
            sm.map.update(src_name, |_| (Some((de.ino, de.file_type)), ()));
            dm.map.update(dst_name, |_| (Some((se.ino, se.file_type)), ()));
            if let Ok(other) = self.mnode(*replaced) {
                if other.is_dir() && src_dir != dst_dir {
                    other.parent.store(*src_dir, Ordering::Relaxed);
                    dd.add_nlink(-1);
                    sd.add_nlink(1);
                }
                self.mark_dirty(&other);
            }
        } else {
            if let Some(de) = de {
                if let Ok(old) = self.mnode(de.ino) {
                    self.unlinked(&dd, &old);
                }
            }
            sm.map.remove(src_name);
            dm.map.update(dst_name, |_| (Some((se.ino, se.file_type)), ()));
            if let Some(w) = whiteout {
                // The rename made it: the source name is free again just now.
                self.replay_new_inode(&sd, src_name, w.ino, &w.attr, &[]);
            }
        }
        if src.is_dir() && src_dir != dst_dir {
            src.parent.store(*dst_dir, Ordering::Relaxed);
            sd.add_nlink(-1);
            dd.add_nlink(1);
        }
        self.replayed(&sd, r);
        if src_dir != dst_dir {
            self.replayed(&dd, r);
        }
        self.mark_dirty(&src);
    }

    /// A setattr: the attributes as the fsync saw them (the file type bits stay; a directory's
    /// size is its own).
    fn replay_setattr(&self, ino: u32, attr: &InodeAttr) {
        let Ok(m) = self.mnode(ino) else { return };
        {
            let mut meta = m.meta.lock();
            meta.mode = (meta.mode & crate::format::node::S_IFMT) | (attr.mode & 0o7777);
            meta.uid = attr.uid;
            meta.gid = attr.gid;
            meta.crtime = attr.crtime;
            meta.rdev = attr.rdev;
            meta.generation = attr.generation;
        }
        m.atime.store(ts_to_ns(attr.atime), Ordering::Relaxed);
        m.flags.store(attr.flags, Ordering::Release);
        if !m.is_dir() {
            m.size.store(attr.size, Ordering::Release);
        }
        m.mtime.store(ts_to_ns(attr.mtime), Ordering::Relaxed);
        m.ctime.store(ts_to_ns(attr.ctime), Ordering::Relaxed);
        self.mark_dirty(&m);
    }

    /// A map: blocks `first..` of `ino` now at `entries`' addresses (0 a hole, `NEW_ADDR`
    /// preallocated); each block installed becomes valid in the segment table.
    fn replay_map(&self, ino: u32, first: u64, entries: &[(u32, u32)]) -> Result<()> {
        let Ok(m) = self.mnode(ino) else { return Ok(()) };
        let pages = m.pages().map(|(p, _)| p);
        let mut disk = m.disk.lock();
        for (i, &(addr, _)) in entries.iter().enumerate() {
            let idx = first + i as u64;
            // Newer than a page an earlier record logged inline: the block wins.
            if let Some(p) = pages {
                p.truncate_one(idx);
            }
            if addr == 0 {
                disk.remap(idx, 0);
            } else if addr == NEW_ADDR {
                // Through remap, so the block it replaces is let go like any other.
                disk.remap(idx, NEW_ADDR);
            } else {
                if disk.cur_map.get(&idx) == Some(&addr) {
                    continue;
                }
                // The chain walk and the region's reader checked every address against the
                // geometry (`Transaction::validate_geometry`) before it got here.
                debug_assert!(self.g.in_main(addr as u64), "map of {ino} to block {addr}");
                // Installed: live from now on (its segment was kept out of the free map).
                self.table.claim_valid(addr as u64, 0)?;
                disk.remap(idx, addr);
            }
        }
        m.note_reserved(&disk);
        drop(disk);
        self.mark_dirty(&m);
        Ok(())
    }

    /// A truncate: blocks from `from_block` on are let go, on the device and in the cache.
    fn replay_truncate(&self, ino: u32, from_block: u64) {
        let Ok(m) = self.mnode(ino) else { return };
        {
            let mut disk = m.disk.lock();
            disk.truncate(from_block);
            m.note_reserved(&disk);
        }
        if let Some((p, _)) = m.pages() {
            p.truncate(from_block);
        }
        self.mark_dirty(&m);
    }

    /// A whole xattr set (the record older images wrote): replaces the inode's set.
    fn replay_xattrs(&self, ino: u32, attrs: &[(Vec<u8>, Vec<u8>)]) {
        let Ok(m) = self.mnode(ino) else { return };
        let mut meta = m.meta.lock();
        let x = &mut meta.xattrs;
        let old: Vec<Vec<u8>> = x.set.names().map(<[u8]>::to_vec).collect();
        x.set = Arc::new(XattrSet::from_entries(attrs.to_vec()));
        for n in old.iter().chain(attrs.iter().map(|(n, _)| n)) {
            self.xattr_changed(x, n);
        }
        drop(meta);
        self.mark_dirty(&m);
    }

    /// One xattr set to `value`, or removed (`None`).
    ///
    /// Not checked against the per-inode limit: within one transaction the records come in
    /// name order, not in the order the changes were made, so a set may pass through a larger
    /// size than it ever had; after the whole transaction it is the set the fsync saw.
    fn replay_xattr(&self, ino: u32, name: &[u8], value: Option<&Vec<u8>>) {
        let Ok(m) = self.mnode(ino) else { return };
        let mut meta = m.meta.lock();
        let x = &mut meta.xattrs;
        match value {
            Some(v) => {
                Arc::make_mut(&mut x.set).set(name, v.clone());
            }
            None => {
                Arc::make_mut(&mut x.set).remove(name);
            }
        }
        self.xattr_changed(x, name);
        drop(meta);
        self.mark_dirty(&m);
    }

    /// A page logged inline: a dirty page, which the checkpoint that ends recovery writes to
    /// the device. Written over a preallocated block, it draws on the reservation.
    fn replay_data(&self, ino: u32, idx: u64, data: &[u8; BLOCK_SIZE]) {
        let Ok(m) = self.mnode(ino) else { return };
        let Some((p, _)) = m.pages() else { return };
        m.disk.lock().draw(idx);
        let whole = p.write(idx, 0, &data[..], None);
        debug_assert!(whole, "a logged page is a whole page");
        self.mark_dirty(&m);
    }

    /// A new inode `ino` named `name` in directory `d` (a create, or a rename's whiteout), with
    /// link count 1 (2 for a directory). False, and nothing done, when the name is taken or the
    /// inode exists already (the record was superseded).
    fn replay_new_inode(&self, d: &MNode, name: &[u8], ino: u32, attr: &InodeAttr, symlink: &[u8]) -> bool {
        let dm = d.dir().expect("dir");
        if dm.map.lookup(name).is_some() || self.cells.get(ino as u64).is_some() {
            return false;
        }
        if self.nat.reserve(ino).is_err() {
            return false;
        }
        let is_dir = attr.mode & crate::format::node::S_IFMT == S_IFDIR;
        let meta = Meta {
            mode: attr.mode,
            uid: attr.uid,
            gid: attr.gid,
            nlink: if is_dir { 2 } else { 1 },
            crtime: attr.crtime,
            rdev: attr.rdev,
            generation: attr.generation,
            xattrs: Default::default(),
            symlink: symlink.to_vec(),
        };
        let stamps = crate::mem::mnode::Stamps {
            atime: attr.atime,
            mtime: attr.mtime,
            ctime: attr.ctime,
            flags: attr.flags,
        };
        let m = MNode::new(ino, meta, attr.size, stamps, &self.cache);
        m.parent.store(d.ino, Ordering::Relaxed);
        if is_dir {
            m.disk.lock().dentries = Some(Default::default());
            d.add_nlink(1);
        }
        let (m, _) = self.cells.insert_if_absent(ino as u64, || m);
        let _ = dm.map.insert(name, ino, crate::format::dentry::dtype_of(attr.mode));
        self.mark_dirty(&m);
        true
    }

    /// A name of `m` in `d` went away during replay.
    fn unlinked(&self, d: &MNode, m: &MNode) {
        // One inode's meta at a time (sync::rank: `Meta` does not nest).
        let mut meta = m.meta.lock();
        let was_dir = m.is_dir();
        if was_dir {
            meta.nlink = 0;
        } else {
            meta.nlink = meta.nlink.saturating_sub(1);
        }
        drop(meta);
        if was_dir {
            d.add_nlink(-1);
        }
        self.mark_dirty(m);
    }

    /// Logs a replayed operation in `d` (journaled already) so the checkpoint rewrites its names.
    fn replayed(&self, d: &MNode, r: &Record) {
        let op = LoggedOp::new(r.clone());
        op.journaled.store(true, Ordering::Relaxed);
        d.dir().expect("dir").log.push(op);
        self.mark_dirty(d);
    }
}

impl ChainRead {
    /// An empty read positioned at (head, seq).
    pub(crate) fn empty(head: u32, seq: u64) -> ChainRead {
        ChainRead {
            transactions: Vec::new(),
            starts: Vec::new(),
            blocks: Vec::new(),
            end_addr: head,
            end_seq: seq,
            end_link: 0,
            flushed: 0,
        }
    }
}
