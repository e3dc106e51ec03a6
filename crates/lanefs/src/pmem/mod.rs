//! pmem: a byte-addressable persistent-memory region mapped from a file (`--nvm FILE`).
//!
//! ARCHITECTURE.md, "Persistent-memory mode": a small region (64-256 MiB) that holds the NAT and the
//! lane journals, which are also the node log for fsync (below), so that an fsync persists a few
//! hundred bytes instead of writing 4 KiB blocks. This module is the region itself: creating, checking
//! and mapping the file (`open`), 8-byte atomic stores, byte-range writes and persisting a range
//! (`access`, with [`persist`] for how a range is made durable), and a crash model for tests
//! ([`crash`]); and, in [`nat`] and [`journal`], the structures the engine keeps in it, which
//! know formats but not the engine.
//!
//! # The file
//!
//! A [`header`] (4 KiB: magic, version, size, the UUID of the image the region is bound to,
//! crc32c), then the data area. [`PmemRegion::create`] writes a new region to a temporary name,
//! syncs it and renames it into place, so a region file that exists was completely formatted.
//! [`PmemRegion::open`] reads and checks the header before mapping anything: a missing file,
//! a bad magic or checksum, a file shorter than its header says, a size out of bounds or a
//! region bound to another image is a typed [`Error::Region`] naming the file (never a panic,
//! and the only allocation is the 4 KiB header). An open region holds an exclusive `flock` on
//! the file, so two mounts cannot share it.
//!
//! # Mapping and persistence
//!
//! The file is mapped `MAP_SHARED_VALIDATE | MAP_SYNC` where the kernel allows it (a DAX file on
//! real persistent memory: the page tables then point at the media and no msync is needed), else
//! plain `MAP_SHARED`; [`PmemRegion::mapping`] tells which. [`PmemRegion::persist`] makes a range
//! durable with one of:
//!
//! - CLWB (else CLFLUSHOPT) per 64-byte line, then SFENCE — chosen when the CPU has it and the
//!   mapping is `MAP_SYNC` or the file is on tmpfs (the emulation this machine offers);
//! - msync(MS_SYNC) of the touched pages — everywhere else (no CPU support, not x86_64, or a
//!   file on a disk file system, where only a write-back of the page cache reaches the disk).
//!
//! [`RegionOptions::persist`] forces a method (tests, benchmarks). [`PmemRegion::describe`]
//! reports the choice, for `lanefs inspect`.
//!
//! **The emulation is not power-safe.** On /dev/shm (tmpfs, no DAX) the region is page cache:
//! it survives the process being killed (which is what the crash tests exercise), but neither a
//! cache flush nor msync makes it survive a power loss or a kernel crash, because tmpfs has no
//! media. The cache flush there costs what it would on real persistent memory, which is what
//! the emulation is for. On a DAX mount of real persistent memory the same code is durable.
//!
//! # Access
//!
//! Every access to the mapping goes through `AtomicU64` (the mapping is page-aligned, so every
//! 8-byte-aligned offset is a valid `AtomicU64`): [`PmemRegion::store_u64`] is one atomic store,
//! never torn; [`PmemRegion::write_bytes`] stores whole words where it can and updates the partial
//! words at its ends with a compare-and-swap. So concurrent callers never race in the Rust sense;
//! which bytes a caller owns is the caller's protocol. Values are little-endian in the file.
//! Offsets are from the start of the file; the header (offsets below [`HEADER_BYTES`]) is
//! read-only through this API. Stores are not durable until a `persist` covering them returns.
//!
//! # Crash model
//!
//! [`RegionOptions::record`] keeps what is persistent and what is not yet ([`crash`]), so that
//! tests can build every image a crash may leave: the persisted content plus any subset of the
//! 8-byte words stored since their line was last persisted. [`RegionOptions::clock`] numbers
//! the recorded events from a clock shared with lanefs-crashtest's `CrashDevice`, so that device
//! and region events form one timeline (`lanefs crashtest --nvm`), and
//! [`PmemRegion::recording`] hands out the recorder so that it outlives the mount.

//!
//! # The NAT in the region (`FsOptions::nvm`, [`nat`])
//!
//! Where NAT entries change in lanefs. fsync writes no node and no NAT entry: it commits a
//! redo transaction (directory operations, attributes, data mappings) to its lane's journal.
//! Nodes — and so NAT entries — are written only by a checkpoint, which today writes every NAT
//! block holding a changed entry (a 4 KiB block for one 8-byte change), to the block's spare
//! copy, then the pack. With a region, those changed entries go to the region instead, 8 bytes
//! each, and the checkpoint writes no NAT block at all. (The lane journals, and so fsync, move
//! into the region after the NAT: next section.)
//!
//! Layout (offsets in the file; `E = nat_blocks * 510` entries, one per node id):
//!
//! ```text
//!   4096            control line: SEEDED word ("LNNV" | max_nid << 32), COMMIT word (below)
//!   8192            NAT: E words, entry of node id n at 8192 + 8n (NatEntry::to_word, LE)
//!   8192 + 8E↑4096  log: up to E records of 16 bytes: (nid | ver32 << 32, entry word)
//! ```
//!
//! COMMIT = `ver32 << 32 | count`: the log holds `count` records of the checkpoint whose
//! version's low 32 bits are `ver32`. The in-place entries always hold the NAT of the last
//! checkpoint whose log was applied; a committed log is a redo log for the next one.
//!
//! A checkpoint of version V+1 ([`nat::NvmNat::stage`], [`nat::NvmNat::apply`]):
//!
//! 1. (as now) write the snapshot's node and data blocks.
//! 2. stage: store COMMIT = (V+1, 0) and persist — the log of V is dropped, which is safe
//!    because the log of V was applied in place before checkpoint V returned (checkpoints are
//!    serialised); write one record per entry of the dirty NAT blocks that differs from its
//!    in-place word (exactly the changed entries); persist them; store COMMIT = (V+1, n);
//!    persist.
//! 3. `checkpoint::commit` with no NAT block: SIT and summaries, flush, pack (flagged
//!    `CP_FLAG_NVM_NAT`), flush.
//! 4. apply: store each logged entry in place (one 8-byte atomic store each), persist exactly
//!    those lines (one fence); then store COMMIT = (V+1, n | APPLIED) (bit 31 of the count)
//!    and persist it.
//!
//! Mount with a region, given the newest valid pack of version V:
//!
//! - flagged pack: the region must exist (a missing file is an error naming it, never a fresh
//!   region), be bound to the image's UUID, and be seeded for the image's `max_nid`. If
//!   COMMIT's ver32 is V, the log is re-applied in place (a crash during step 4); if it is V+1
//!   the log is ignored (a crash before the pack of V+1 was durable: the in-place entries are
//!   still those of V) — unless it is marked APPLIED with records in it: then pack V+1 was
//!   durable and has been lost since (a corrupt pack, so mount fell back to V), and the in-place
//!   entries are those of V+1, which the region cannot undo: the mount fails naming the file
//!   (fsck reports it), rather than pair checkpoint V with another checkpoint's NAT. Anything
//!   else means the region is not the one this image was last checkpointed with, and the mount
//!   fails naming the file. Every entry is checked against the geometry, as a decoded NAT block
//!   is.
//! - unflagged pack (first mount with this region, or an image last checkpointed without one):
//!   the device NAT is authoritative. The region is created if missing, cleared, filled with
//!   that NAT, COMMIT = (V, 0), then SEEDED set, each persisted in that order. A crash during
//!   seeding leaves the pack unflagged, so the next mount seeds again.
//! - a flagged pack mounted without a region fails: its device NAT blocks are stale.
//!
//! Why it is crash-safe:
//!
//! - Data before the entry: an entry is only ever in effect through a pack that is durable
//!   (a log of V+1 counts only when pack V+1 is the newest valid one; in-place stores happen
//!   after it is), and `commit` flushes the node blocks before it writes the pack. So a
//!   durable entry never names a block that is not durable.
//! - The old NAT stays intact until the new pack is durable: in-place entries change only in
//!   step 4, and the blocks they name are not reused before the checkpoint that frees them is
//!   durable (prefree segments), exactly as for the device NAT's spare copy.
//! - Torn stores: every entry and both control words are single aligned 8-byte stores, so a
//!   crash leaves each old or new, never mixed; any subset of the unpersisted ones may have
//!   landed, and every such state resolves to the NAT of the pack in force (tests enumerate
//!   them with the crash model). Log records are two words and are read only when COMMIT
//!   (persisted after them) counts them; each carries ver32 as a check.
//! - The region and the image cannot drift apart silently: UUID binding, the flag in the pack,
//!   and the COMMIT version check catch a wrong, recreated or stale region.
//!
//! # The lane journals in the region ([`journal`])
//!
//! Without a region, fsync commits a redo transaction (records with their data blocks' crcs)
//! to its lane's journal chain on the device: data and journal blocks in one batch, then one
//! group-committed device flush. With one, the transaction goes to the lane's journal in the
//! region, and the device sees only the data blocks.
//!
//! Layout (after the NAT, page-aligned; `L` lanes share the rest of the region equally, each
//! slice a whole number of pages, at least 16 KiB, at most 256 MiB):
//!
//! ```text
//!   lane l at S + l * B:  control line (64 bytes): TAIL word = gen32 << 32 | used bytes
//!                         entries from +64: head word (len | gen32 << 32), the transaction as
//!                         encoded for the device chain (magic, count, length, crc32c, records),
//!                         zero padding to 8 bytes; back to back, `used` bytes in all
//! ```
//!
//! `gen32` is the low 32 bits of the version of the checkpoint pack the entries follow.
//!
//! fsync ([`crate::flush`], `flush/nvm.rs`), holding the gate shared, having collected its
//! records under the flush locks of the directories it journals and waited for the flushes
//! that collected from them before it (`sync::ticket`):
//!
//! 1. write the transaction's data blocks; if it maps any written block (its own, or ones
//!    writeback wrote without a flush), one group-committed device flush. A metadata-only
//!    transaction (chmod, rename, unlink, ...) does no device I/O at all.
//! 2. under the lane's lock: store the entry after `used`, persist it; store TAIL = (gen,
//!    used + entry), persist. The transaction counts from this 8-byte store on.
//! 3. only then are its directory records released to dependent fsyncs (pending counts, flush
//!    locks), so a dependent fsync that finds them taken finds them durable. If the lane's
//!    journal has no room, nothing is committed, everything the transaction took is given
//!    back, and the fsync takes a checkpoint instead (after letting go of the gate), which
//!    makes it durable and empties the journals; a checkpoint is asked for in the background
//!    once a lane's journal is half full. Nothing is ever appended to the device chains with a
//!    region: their heads, reserved at mount and never written, may lie in segments reused
//!    since.
//!
//! Checkpoint of version V+1 (holding the gate exclusively, so no fsync appends meanwhile):
//! after the pack is durable and the NAT log applied, every lane's TAIL = (V+1, 0), persisted.
//! Mount: read-write mounts reset the journals to the pack in force before any fsync (after
//! replaying them: a mount that finds records takes a checkpoint, which resets them).
//!
//! Recovery under pack V (flagged; records are never put in the region under an unflagged
//! pack: the first mount with a region takes a checkpoint, which flags it, before it returns):
//! a lane whose TAIL says gen V holds `used` bytes of entries, each of which must decode (gen,
//! bounds, the transaction's magic and crc32c, the geometry) or the mount fails naming the
//! file; a lane whose TAIL says anything else holds nothing. The device chains are read as
//! before (they hold transactions written before the switch to a region, if any), the
//! data crcs of every transaction are checked as before, and all lanes of both are merged by
//! stamp and replayed past the pack's stamp.
//!
//! Why it is crash-safe:
//!
//! - A transaction counts only once its TAIL store is persistent, and the TAIL is stored after
//!   the entry was persisted: every byte a TAIL counts is the entry as written, whatever subset
//!   of the unpersisted words a crash kept (an entry's words, the TAIL word: each an aligned
//!   8-byte store, never torn). A crash before the TAIL lands leaves the lane as it was; the
//!   next append overwrites the partial entry.
//! - data=ordered: the device flush of the data precedes the entry, so a counted transaction
//!   never maps a block that is not durable (recovery's crc check agrees, and would drop the
//!   transaction and the rest of its lane if not).
//! - Crash between the pack of V+1 and the reset: lanes still say gen V, which is not the pack
//!   in force, so they are ignored, which is right: every entry of gen V was appended before
//!   the snapshot of V+1 (the gate), and checkpoint V+1 holds everything they record (the same
//!   rule that lets device chains start at the heads recorded at the snapshot). Crash before
//!   the pack of V+1 is durable: the reset has not begun, the lanes say gen V, pack V is in
//!   force, they are replayed. A crash in the middle of the reset leaves each lane old (ignored)
//!   or empty.
//! - Old entries under a reset lane, or entries of an older life of the region, are never read:
//!   only `used` bytes after a TAIL of the pack in force count, and each entry repeats gen.
//!
//! Tests: `journal_tests.rs` checks every crash state (every subset of pending words, or a
//! sample when many) of a run of appends and a checkpoint's reset; `tests/nvm_journal.rs`
//! crashes a mounted file system at every region event of a run of fsyncs and mounts the result.

//!
//! # Fine-grained inodes: appended records, and small writes inline
//!
//! The node log for fsync is the lane journal above: what an fsync persists for an inode is
//! not a 4 KiB node block but a record holding only what changed — its attributes (84 bytes)
//! when they changed, the block pointers it remapped (8 bytes each), and nothing when nothing
//! changed. The issue allowed in-place records (8-byte stores under a commit word) or appended
//! ones; appended records were chosen because their crash safety is the journal's (one TAIL
//! word commits any number of records of any number of inodes atomically, a torn entry is
//! never counted), whereas an in-place inode record spanning several words needs its own
//! commit word, an allocator in the region and a way to free records, for no fewer bytes
//! persisted. Checkpoints keep writing the cold copy of nodes to the device, and the region
//! journals are emptied once that copy is durable.
//!
//! An fsync with at most `FsOptions::nvm_inline_pages` dirty pages also puts the pages
//! themselves into the record (`Record::Data`) instead of writing data blocks: no device
//! write and no device flush at all on that fsync. The pages stay cached and *logged*
//! (`mem::pages`): the next checkpoint (or writeback) writes them to the device like any dirty
//! page, and replay puts a logged page back into the page cache as a dirty page (a later
//! `Map` or `Truncate` record of the same block wins, by stamp). On real persistent memory
//! this takes the device's flush latency off small fsyncs (the common database and mail
//! pattern); the price is region space (a page per record), so such workloads checkpoint far
//! more often, and a checkpoint holds fsyncs at its gate. On an image in RAM, where a device
//! flush costs next to nothing, that price is higher than the gain (DWSL: 231k against 296k
//! ops/s at one thread), so by default it is on (4 pages) only where the device's flush costs
//! something (`BlockDevice::flush_is_free` is false): with the image on the VM's disk, DWSL
//! runs at 96k ops/s with it against 17k without a region (docs/benchmarks.md).

mod access;
pub mod bench;
pub mod crash;
pub mod header;
pub mod journal;
pub mod nat;
mod open;
pub mod persist;

#[cfg(test)]
mod journal_tests;
#[cfg(test)]
mod nat_tests;
#[cfg(test)]
mod tests;

pub use crash::{PendingWord, PmemCrash, RegionEvent, RegionRecording, RegionTrace};
pub use header::{RegionHeader, HEADER_BYTES, MAX_REGION_SIZE, MIN_REGION_SIZE};
pub use persist::{PersistMethod, LINE};

use crate::error::{Error, RegionFault};
use crate::sync::rank::Mutex;
use crash::Recorder;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

/// Journal bytes per lane in a region created without `--nvm-size` (see [`default_size`]).
pub const DEFAULT_JOURNAL_PER_LANE: u64 = 32 << 20;
/// Journal bytes of all lanes together in a region created without `--nvm-size`.
pub const DEFAULT_JOURNAL_TOTAL: u64 = 256 << 20;

/// Size of a region created without `--nvm-size` for an image of geometry `g`: its NAT plus
/// [`DEFAULT_JOURNAL_PER_LANE`] for each lane's journal, all lanes together at most
/// [`DEFAULT_JOURNAL_TOTAL`], in whole MiB. A lane's journal bounds how much an fsync-heavy
/// run commits between checkpoints (one is asked for at half full), so its size sets the
/// checkpoint rate; the NAT grows with the image (about 6 MiB per GiB), and a fixed size would
/// leave large images little journal.
pub fn default_size(g: &crate::format::layout::Geometry) -> u64 {
    let nat = nat::NatLayout::of(g).end as u64;
    let journals = (g.lanes.max(1) as u64 * DEFAULT_JOURNAL_PER_LANE).min(DEFAULT_JOURNAL_TOTAL);
    (nat + journals).div_ceil(1 << 20) << 20
}

/// How the file is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// `MAP_SHARED_VALIDATE | MAP_SYNC`: a DAX file, stores reach the media directly.
    Sync,
    /// `MAP_SHARED`: the page cache (MAP_SYNC was refused or not asked for).
    Shared,
}

impl std::fmt::Display for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mapping::Sync => "MAP_SYNC",
            Mapping::Shared => "MAP_SHARED",
        })
    }
}

/// Choices for opening or creating a region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionOptions {
    /// Force a persistence method (it must be available on this CPU); `None`: the best one.
    pub persist: Option<PersistMethod>,
    /// Try `MAP_SYNC` first (default true).
    pub try_map_sync: bool,
    /// Keep the crash model (copies the region; tests only).
    pub record: bool,
    /// With `record`: number the recorded events from this clock, shared with a
    /// crash-recording device (lanefs-crashtest's `CrashDevice`), so both logs form one
    /// timeline (`lanefs crashtest --nvm`).
    pub clock: Option<crate::device::EventClock>,
}

impl Default for RegionOptions {
    fn default() -> Self {
        RegionOptions { persist: None, try_map_sync: true, record: false, clock: None }
    }
}

/// A mapped region file.
pub struct PmemRegion {
    path: PathBuf,
    /// Holds the exclusive flock for as long as the region is open.
    _file: File,
    base: NonNull<u8>,
    len: usize,
    header: RegionHeader,
    mapping: Mapping,
    /// Why MAP_SYNC was not used, when it was tried and refused.
    sync_refused: Option<String>,
    method: PersistMethod,
    /// The file system holding the file ("tmpfs", "ext4", ...).
    backing: String,
    /// Shared with [`RegionRecording`] handles, which outlive the region.
    recorder: Option<Arc<Mutex<Recorder>>>,
    /// The mount's shutdown gate ([`PmemRegion::set_halt`]): every store and persist is admitted
    /// by it, so that nothing reaches the region once the file system is shut down.
    halt: Option<Arc<crate::device::Halt>>,
}

// SAFETY: the mapping is owned by the region and lives until drop; every access to it goes
// through atomics (`words`), so sharing `&PmemRegion` between threads cannot race, and moving
// the region to another thread moves the ownership of the mapping with it.
unsafe impl Send for PmemRegion {}
// SAFETY: see `Send`: all shared access is atomic or behind the recorder's mutex.
unsafe impl Sync for PmemRegion {}

impl Drop for PmemRegion {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are exactly what mmap returned, and no reference into the
        // mapping outlives `self` (every borrow is tied to `&self`).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

impl std::fmt::Debug for PmemRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmemRegion")
            .field("path", &self.path)
            .field("size", &self.len)
            .field("mapping", &self.mapping)
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

fn io_fault(path: &Path, what: &str, e: io::Error) -> Error {
    Error::region(path, RegionFault::Io, format!("{what}: {e}"))
}
