//! DISKFS's state of a mounted file system: the device and everything that decides where
//! blocks go and how a lane's journal stands, gathered in [`Disk`].
//!
//! - `group_commit`: concurrent fsyncs sharing one device flush.
//! - `io`: bytes written by cause, for write amplification.

mod group_commit;
mod io;

pub(crate) use group_commit::GroupCommit;
pub(crate) use io::{IoCounters, WriteKind};

use crate::device::BlockDevice;
use crate::format::layout::Geometry;
use crate::journal::ChainWriter;
use crate::nat::NatTable;
use crate::seg::{LaneSet, SegmentTable};
use crate::sync::rank::Mutex;
use std::sync::Arc;

/// The disk side of a mount: the device behind its shutdown gate, the geometry, the NAT (in
/// blocks or in the region), the segment table and the lanes of active logs, each lane's
/// journal chain, group commit and the I/O counters. It knows nothing of inodes in memory or
/// of checkpoints in progress: MEMFS and the checkpointer reach the disk through it.
///
/// Invariants: every write of this mount goes through `dev`, which passes `halt`; `chains`
/// and `chain_marks` have one entry per lane of `lanes`; a lane's chain is written only under
/// its `chains` lock, which is held across the chain's device I/O (journal blocks of one lane
/// complete in chain order).
pub(crate) struct Disk {
    /// The device, behind `halt`: a [`crate::device::HaltDevice`].
    pub(crate) dev: Arc<dyn BlockDevice>,
    /// The shutdown gate every device and region write of this mount passes (`Fs::shutdown`).
    pub(crate) halt: Arc<crate::device::Halt>,
    pub(crate) g: Geometry,
    pub(crate) nat: NatTable,
    /// The persistent-memory region holding the NAT (`FsOptions::nvm`), when mounted with one.
    pub(crate) nvm: Option<crate::pmem::nat::NvmNat>,
    /// The lane journals in that region: fsync commits there (see `crate::pmem`).
    pub(crate) nvm_log: Option<crate::pmem::journal::NvmJournal>,
    pub(crate) table: Arc<SegmentTable>,
    pub(crate) lanes: LaneSet,
    pub(crate) chains: Vec<Mutex<ChainWriter>>,
    /// Per lane: how far its chain is written and durable, for the flushed-through mark that
    /// spares recovery reading back durable transactions' data (`journal::ChainMarks`).
    pub(crate) chain_marks: Vec<crate::journal::ChainMarks>,
    pub(crate) group: GroupCommit,
    /// Bytes written to the device, by cause.
    pub(crate) io: IoCounters,
    /// File-system age at mount (seconds) and when that was: segment ages for cleaning.
    pub(crate) age_at_mount: u64,
    pub(crate) mounted_at: std::time::Instant,
}
