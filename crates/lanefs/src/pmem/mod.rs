//! pmem: a byte-addressable persistent-memory region mapped from a file (`--nvm FILE`).
//!
//! ARCHITECTURE.md, "Persistent-memory mode": a small region (64-256 MiB) that holds the NAT and the
//! lane journals, which are also the node log for fsync (below), so that an fsync persists a few
//! hundred bytes instead of writing 4 KiB blocks. This module is the region itself: creating, checking
//! and mapping the file, 8-byte atomic stores, byte-range writes, persisting a range, and a
//! crash model for tests; and, in [`nat`] and [`journal`], the structures the engine keeps in it,
//! which know formats but not the engine.
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
//! the recorded events from a clock shared with a `device::CrashDevice`, so that device and
//! region events form one timeline (`lanefs crashtest --nvm`), and
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

pub mod bench;
pub mod crash;
pub mod header;
pub mod journal;
pub mod nat;
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

use crate::error::{Error, RegionFault, Result};
use crate::sync::rank::{Mutex, Rank};
use crash::Recorder;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// `device::CrashDevice`, so both logs form one timeline (`lanefs crashtest --nvm`).
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

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Maps `len` bytes of `file`: MAP_SYNC first when asked, else (or when refused) MAP_SHARED.
fn map_file(file: &File, len: usize, try_sync: bool) -> io::Result<(NonNull<u8>, Mapping, Option<String>)> {
    use rustix::mm::{mmap, MapFlags, ProtFlags};
    let prot = ProtFlags::READ | ProtFlags::WRITE;
    let mut refused = None;
    if try_sync {
        // SAFETY: a new mapping at an address the kernel chooses; it aliases no Rust object.
        // The file is at least `len` bytes long (checked by the caller), so no access within
        // `len` faults with SIGBUS unless another process truncates the file, which the
        // exclusive flock and the region's documented ownership rule out.
        match unsafe {
            mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED_VALIDATE | MapFlags::SYNC, file, 0)
        } {
            Ok(p) => {
                return Ok((NonNull::new(p.cast()).expect("mmap never returns null"), Mapping::Sync, None))
            }
            Err(e) => refused = Some(io::Error::from(e).to_string()),
        }
    }
    // SAFETY: as above, with a plain shared mapping.
    let p = unsafe { mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, file, 0) }?;
    Ok((NonNull::new(p.cast()).expect("mmap never returns null"), Mapping::Shared, refused))
}

/// Opens the region file at `path` for reading and writing and takes its exclusive lock: one
/// open of a region at a time (two mounts writing one region would corrupt it).
fn open_exclusive(path: &Path) -> Result<File> {
    let file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::region(path, RegionFault::Missing, "no such file"))
        }
        Err(e) => return Err(io_fault(path, "cannot open", e)),
    };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(Error::region(
            path,
            RegionFault::InUse,
            "in use (locked by another open of it, such as the mount of its image): unmount the \
             image first; `lanefs inspect` without --nvm works on a mounted image",
        )),
        Err(e) => Err(io_fault(path, "cannot lock", e.into())),
    }
}

/// The header of the region file `file` at `path`, checked against the file (a regular file of
/// exactly the size the header gives) and, with `expect_uuid`, against the image.
fn read_header(path: &Path, file: &File, expect_uuid: Option<[u8; 16]>) -> Result<RegionHeader> {
    let meta = file.metadata().map_err(|e| io_fault(path, "cannot stat", e))?;
    if !meta.is_file() {
        return Err(Error::region(path, RegionFault::NotRegion, "not a regular file"));
    }
    let flen = meta.len();
    if flen < HEADER_BYTES as u64 {
        return Err(Error::region(
            path,
            RegionFault::Truncated,
            format!("file is {flen} bytes, shorter than the {HEADER_BYTES}-byte region header"),
        ));
    }
    let mut hb = vec![0u8; HEADER_BYTES];
    file.read_exact_at(&mut hb, 0).map_err(|e| io_fault(path, "cannot read the header", e))?;
    let header = RegionHeader::decode(&hb, path)?;
    if flen < header.size {
        return Err(Error::region(
            path,
            RegionFault::Truncated,
            format!("file is {flen} bytes, its header says {}", header.size),
        ));
    }
    if flen > header.size {
        return Err(Error::region(
            path,
            RegionFault::Corrupt,
            format!("file is {flen} bytes, longer than the {} its header says", header.size),
        ));
    }
    if let Some(want) = expect_uuid.filter(|want| *want != header.uuid) {
        return Err(Error::region(
            path,
            RegionFault::WrongImage,
            format!(
                "bound to image {}, not to this image ({})",
                crate::format::superblock::uuid_str(&header.uuid),
                crate::format::superblock::uuid_str(&want)
            ),
        ));
    }
    Ok(header)
}

/// How stores to the mapping are made durable: the method asked for (refused if this CPU lacks
/// it), else a cache flush where it is enough (a MAP_SYNC mapping, or tmpfs, where the page
/// cache is the medium), else msync.
fn persist_method(asked: Option<PersistMethod>, mapping: Mapping, on_tmpfs: bool) -> Result<PersistMethod> {
    Ok(match asked {
        Some(m) if !m.available() => {
            return Err(Error::InvalidArgument(format!("{m} is not available on this CPU")))
        }
        Some(m) => m,
        None => match PersistMethod::best_cache_flush() {
            Some(m) if mapping == Mapping::Sync || on_tmpfs => m,
            _ => PersistMethod::Msync,
        },
    })
}

impl PmemRegion {
    /// Creates a new region of `size` bytes at `path`, bound to the image with `uuid`, and
    /// opens it. Fails if `path` exists. The file appears complete or not at all.
    pub fn create(path: &Path, size: u64, uuid: [u8; 16], opts: &RegionOptions) -> Result<PmemRegion> {
        if size > MAX_REGION_SIZE || !size.is_multiple_of(header::REGION_ALIGN) {
            return Err(Error::InvalidArgument(format!(
                "{}: a region size must be a whole number of 4 KiB pages up to {MAX_REGION_SIZE} (not {size})",
                path.display()
            )));
        }
        header::check_size(path, size)?;
        let name =
            path.file_name().ok_or_else(|| Error::region(path, RegionFault::Io, "the path names no file"))?;
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let hdr = RegionHeader { size, uuid, created: now_secs() };
        let made = (|| -> io::Result<()> {
            let f = OpenOptions::new().read(true).write(true).create_new(true).open(&tmp)?;
            f.set_len(size)?;
            f.write_all_at(&hdr.encode(), 0)?;
            f.sync_all()?;
            // Refuse to replace an existing file (a region or anything else).
            std::fs::hard_link(&tmp, path)?;
            std::fs::remove_file(&tmp)?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir)?.sync_all()?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_fault(path, "cannot create the region", e));
        }
        Self::open(path, Some(uuid), opts)
    }

    /// Opens the region at `path`, creating it with `size` bytes if it does not exist. Returns
    /// whether it was created.
    pub fn open_or_create(
        path: &Path,
        size: u64,
        uuid: [u8; 16],
        opts: &RegionOptions,
    ) -> Result<(PmemRegion, bool)> {
        match Self::open(path, Some(uuid), opts) {
            Err(Error::Region { fault: RegionFault::Missing, .. }) => {
                Ok((Self::create(path, size, uuid, opts)?, true))
            }
            r => r.map(|r| (r, false)),
        }
    }

    /// Opens an existing region. With `expect_uuid`, a region bound to another image is refused
    /// (`RegionFault::WrongImage`); `None` accepts any (inspection, benchmarks).
    pub fn open(path: &Path, expect_uuid: Option<[u8; 16]>, opts: &RegionOptions) -> Result<PmemRegion> {
        let file = open_exclusive(path)?;
        let header = read_header(path, &file, expect_uuid)?;
        let len = usize::try_from(header.size).map_err(|_| {
            Error::region(path, RegionFault::TooSmall, "size does not fit this machine's address space")
        })?;
        // The header's decoder refused any other size; `words` relies on it.
        assert!(len >= HEADER_BYTES && len.is_multiple_of(header::REGION_ALIGN as usize));
        let backing = match rustix::fs::fstatfs(&file) {
            // f_type is a signed word on some targets; the magics are 32-bit.
            Ok(st) => (st.f_type as u64) & 0xFFFF_FFFF,
            Err(_) => 0,
        };
        let on_tmpfs = backing == crate::device::TMPFS_MAGIC;
        let (base, mapping, sync_refused) =
            map_file(&file, len, opts.try_map_sync).map_err(|e| io_fault(path, "cannot map", e))?;
        let method = match persist_method(opts.persist, mapping, on_tmpfs) {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: the mapping was just made and nothing refers to it.
                let _ = unsafe { rustix::mm::munmap(base.as_ptr().cast(), len) };
                return Err(e);
            }
        };
        let mut region = PmemRegion {
            path: path.to_path_buf(),
            _file: file,
            base,
            len,
            header,
            mapping,
            sync_refused,
            method,
            backing: crate::device::fs_name(backing),
            recorder: None,
            halt: None,
        };
        if opts.record {
            let mut image = vec![0u8; len];
            region.read_raw(0, &mut image);
            region.recorder =
                Some(Arc::new(Mutex::new(Rank::PmemRecorder, Recorder::new(image, opts.clock.clone()))));
        }
        Ok(region)
    }

    /// The whole mapping as words.
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is `len` bytes (a multiple of 4096) at a page-aligned address, so
        // it is `len / 8` properly aligned u64s, and AtomicU64 has the layout of u64. It stays
        // mapped until `self` drops, which outlives the borrow. Every access in this process
        // goes through these atomics, so no access races with a non-atomic one.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().cast::<AtomicU64>(), self.len / 8) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Total bytes, header included.
    pub fn size(&self) -> usize {
        self.len
    }

    pub fn header(&self) -> &RegionHeader {
        &self.header
    }

    /// The UUID of the image the region is bound to.
    pub fn uuid(&self) -> [u8; 16] {
        self.header.uuid
    }

    /// The offsets callers may store to and persist: after the header, up to the end.
    pub fn data_range(&self) -> Range<usize> {
        HEADER_BYTES..self.len
    }

    pub fn mapping(&self) -> Mapping {
        self.mapping
    }

    pub fn persist_method(&self) -> PersistMethod {
        self.method
    }

    /// One line for `lanefs inspect`: size, mapping, persistence method, file system.
    pub fn describe(&self) -> String {
        let map = match (&self.mapping, &self.sync_refused) {
            (Mapping::Shared, Some(why)) => format!("MAP_SHARED (MAP_SYNC refused: {why})"),
            (m, _) => m.to_string(),
        };
        let note = if self.mapping == Mapping::Shared && self.backing == "tmpfs" {
            ", emulated: not durable across power loss"
        } else {
            ""
        };
        format!("{} MiB on {}, {map}, persist by {}{note}", self.len >> 20, self.backing, self.method)
    }

    /// Fails with `RegionFault::TooSmall` unless the data area holds at least `bytes` bytes
    /// (`what` says what needs them).
    pub fn require(&self, bytes: u64, what: &str) -> Result<()> {
        let have = (self.len - HEADER_BYTES) as u64;
        if have < bytes {
            let need = (bytes + HEADER_BYTES as u64).div_ceil(1 << 20);
            return Err(Error::region(
                &self.path,
                RegionFault::TooSmall,
                format!(
                    "{what} needs {bytes} bytes, the region has {have} (create it with --nvm-size {need}M or more)"
                ),
            ));
        }
        Ok(())
    }

    /// Checks that `[offset, offset + len)` is inside the data area.
    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if offset >= HEADER_BYTES && end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "region range {offset}+{len} outside the data area {HEADER_BYTES}..{}",
                self.len
            ))),
        }
    }

    fn check_word(&self, offset: usize) -> Result<()> {
        if !offset.is_multiple_of(8) {
            return Err(Error::InvalidArgument(format!("region offset {offset} is not 8-byte aligned")));
        }
        self.check(offset, 8)
    }

    /// Puts the region behind the mount's shutdown gate (see `crate::device::halt`): from the
    /// gate's halt on, every store and persist fails with EIO and changes nothing.
    pub fn set_halt(&mut self, halt: Arc<crate::device::Halt>) {
        self.halt = Some(halt);
    }

    /// Admits one store or persist through the shutdown gate, if the region has one.
    fn admit(&self) -> Result<Option<crate::device::halt::HaltGuard<'_>>> {
        match &self.halt {
            Some(h) => Ok(Some(h.enter()?)),
            None => Ok(None),
        }
    }

    /// Stores `value` at the 8-byte-aligned `offset` with one atomic store (never torn).
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        self.check_word(offset)?;
        let _admitted = self.admit()?;
        let raw = value.to_le();
        match &self.recorder {
            // Store and record under the recorder's lock, so the recorded order of values of
            // one word is the order they were stored in.
            Some(r) => {
                let mut r = r.lock();
                self.words()[offset / 8].store(raw, Ordering::Release);
                r.stored(offset, value);
            }
            None => self.words()[offset / 8].store(raw, Ordering::Release),
        }
        Ok(())
    }

    /// The word at the 8-byte-aligned `offset`.
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        self.check_word(offset)?;
        Ok(u64::from_le(self.words()[offset / 8].load(Ordering::Acquire)))
    }

    /// Copies `data` to `offset`: whole words with one store each, partial words at the ends
    /// by compare-and-swap (the other bytes of those words are kept).
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        let _admitted = self.admit()?;
        let words = self.words();
        // Held for the whole write, so the recorded order of each word's values is the order
        // they were stored in.
        let mut rec = self.recorder.as_ref().map(|r| r.lock());
        let (mut pos, mut rest) = (offset, data);
        // Bounded: each round consumes at least one byte.
        while !rest.is_empty() {
            let (wi, at) = (pos / 8, pos % 8);
            let n = (8 - at).min(rest.len());
            let raw = if n == 8 {
                let raw = u64::from_ne_bytes(rest[..8].try_into().expect("8 bytes"));
                words[wi].store(raw, Ordering::Release);
                raw
            } else {
                let merge = |old: u64| {
                    let mut b = old.to_ne_bytes();
                    b[at..at + n].copy_from_slice(&rest[..n]);
                    u64::from_ne_bytes(b)
                };
                let old = words[wi]
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| Some(merge(old)))
                    .expect("the update always applies");
                merge(old)
            };
            if let Some(r) = rec.as_mut() {
                r.stored(wi * 8, u64::from_le(raw));
            }
            pos += n;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` (word loads; a concurrent writer of the same bytes
    /// may be seen word by word).
    pub fn read_bytes(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len())?;
        self.read_raw(offset, buf);
        Ok(())
    }

    /// `read_bytes` without the data-area check (the header too).
    fn read_raw(&self, offset: usize, buf: &mut [u8]) {
        let words = self.words();
        let (mut pos, mut done) = (offset, 0);
        // Bounded: each round copies at least one byte.
        while done < buf.len() {
            let (wi, at) = (pos / 8, pos % 8);
            let n = (8 - at).min(buf.len() - done);
            let b = words[wi].load(Ordering::Acquire).to_ne_bytes();
            buf[done..done + n].copy_from_slice(&b[at..at + n]);
            done += n;
            pos += n;
        }
    }

    /// Makes every store to `range` before the call durable (see the module comment for what
    /// durable means on an emulated region).
    pub fn persist(&self, range: Range<usize>) -> Result<()> {
        self.persist_ranges(std::slice::from_ref(&range))
    }

    /// [`PmemRegion::persist`] of several ranges at once: one fence after all the write-backs,
    /// or one msync per run of touched pages.
    pub fn persist_ranges(&self, ranges: &[Range<usize>]) -> Result<()> {
        for r in ranges {
            if r.start > r.end {
                return Err(Error::InvalidArgument(format!("region range {r:?} is reversed")));
            }
            self.check(r.start, r.end - r.start)?;
        }
        let ranges: Vec<&Range<usize>> = ranges.iter().filter(|r| !r.is_empty()).collect();
        if ranges.is_empty() {
            return Ok(());
        }
        let _admitted = self.admit()?;
        match self.method {
            PersistMethod::Msync => {
                let page = rustix::param::page_size();
                let mut runs: Vec<(usize, usize)> = ranges
                    .iter()
                    .map(|r| (r.start / page * page, r.end.div_ceil(page).saturating_mul(page).min(self.len)))
                    .collect();
                runs.sort_unstable();
                let mut merged: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
                for (s, e) in runs {
                    match merged.last_mut() {
                        Some(last) if s <= last.1 => last.1 = last.1.max(e),
                        _ => merged.push((s, e)),
                    }
                }
                for (start, end) in merged {
                    // SAFETY: [start, end) is page-aligned at its start and lies inside the
                    // mapping (start <= a checked range's start, end <= len); msync reads no
                    // Rust-visible memory.
                    unsafe {
                        rustix::mm::msync(
                            self.base.as_ptr().add(start).cast(),
                            end - start,
                            rustix::mm::MsyncFlags::SYNC,
                        )
                    }
                    .map_err(|e| io_fault(&self.path, "msync", e.into()))?;
                }
            }
            m => {
                for r in &ranges {
                    // SAFETY: r.start < len (checked above), so the pointer is in the mapping.
                    let p = unsafe { self.base.as_ptr().add(r.start) };
                    persist::write_back(m, p, r.end - r.start);
                }
                persist::fence();
            }
        }
        if let Some(rec) = &self.recorder {
            let mut rec = rec.lock();
            for r in ranges {
                rec.persisted(r.start, r.end);
            }
        }
        Ok(())
    }

    /// Persists the whole data area.
    pub fn persist_all(&self) -> Result<()> {
        self.persist(self.data_range())
    }

    /// The crash states now, if the region was opened with `record`.
    pub fn crash_model(&self) -> Option<PmemCrash> {
        self.recorder.as_ref().map(|r| r.lock().snapshot_at(usize::MAX))
    }

    /// Stores and persists recorded so far (0 without `record`): a point to crash at.
    pub fn recorded_events(&self) -> usize {
        self.recorder.as_ref().map_or(0, |r| r.lock().event_count())
    }

    /// The recorder, if the region was opened with `record`: it keeps recording while the
    /// region is open and stays readable after it is closed.
    pub fn recording(&self) -> Option<RegionRecording> {
        self.recorder.as_ref().map(|r| RegionRecording(r.clone()))
    }

    /// The crash states after the first `upto` recorded events, if the region was opened with
    /// `record`.
    pub fn crash_model_at(&self, upto: usize) -> Option<PmemCrash> {
        self.recorder.as_ref().map(|r| r.lock().snapshot_at(upto))
    }
}
