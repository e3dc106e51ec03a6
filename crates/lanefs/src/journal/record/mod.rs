//! Journal records and the transaction that groups them: the logical redo log between checkpoints.
//!
//! An fsync (or directory fsync) produces one [`Transaction`]: the records that make the fsynced
//! state durable, each stamped at its operation's linearization point. Records are absolute
//! where they can be (an inode's whole attribute set, a block's address, an xattr's value), so
//! replaying a record twice, or replaying one whose effect already reached a checkpoint, is
//! harmless; only link counts are relative, and replay derives those from `Create` / `Link` /
//! `Unlink` / `Rename` / `Free`.
//!
//! Byte layout (all integers little-endian):
//!
//! ```text
//! transaction  magic u32 "LNTX" | count u32 | body_len u32 | crc32c(body) u32 | body
//! body         count records, back to back, exactly body_len bytes
//! record       tag u8 | stamp: ticks u64, cpu u32 | fields of the variant
//! name         len u8 (1..=255) | bytes            (no '/', no NUL, not "." or "..")
//! attr         mode u32 | uid u32 | gid u32 | size u64 | atime | mtime | ctime | crtime | rdev u64
//!              | flags u32 | generation u32        (each time: sec i64, nsec u32 < 1e9) = 84 bytes
//! 1 Create     dir u32 | name | ino u32 | attr | symlink_len u16 | symlink bytes
//! 2 Link       dir u32 | name | ino u32 | file_type u8 (a DT_* value)
//! 3 Unlink     dir u32 | name | ino u32
//! 4 Rename     src_dir u32 | src_name | dst_dir u32 | dst_name | ino u32 | replaced u32 | kind u8
//!              [kind 2: whiteout ino u32 | attr]  (kind: 0 plain, 1 exchange, 2 whiteout)
//! 5 SetAttr    ino u32 | attr
//! 6 Map        ino u32 | first u64 | count u16 (1..=MAP_RUN_MAX) | count x (addr u32, crc u32)
//! 7 Truncate   ino u32 | from_block u64
//! 8 Xattrs     ino u32 | count u16 | count x (name_len u8, value_len u16, name, value)
//!              (the whole set; written by earlier lanefs, still replayed)
//! 9 Free       ino u32
//! 10 Data      ino u32 | index u64 | 4096 bytes    (a page logged inline: region journals only)
//! 11 SetXattr  ino u32 | name_len u8 (1..=255) | value_len u32 (<= 65536) | name | value
//! 12 RemoveXattr ino u32 | name_len u8 (1..=255) | name
//! ```
//!
//! Invariants: the encoder accepts exactly what the decoder accepts ([`Record::validate`] runs
//! on both sides), so a transaction lanefs wrote always reads back. The decoder never panics
//! and never allocates more than the input's length implies: every count is checked against
//! the bytes left before anything is reserved for it.
//!
//! This file holds the records' types and the transaction; each side of the invariant has a
//! child: `validate` (what a record may hold, on its own and against the image) and `codec`
//! (the byte layout above, both ways).

mod codec;
mod validate;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::device::BlockData;
use crate::error::{Error, Result, Structure};
use crate::format::layout::Geometry;
use crate::format::node::{Timespec, NEW_ADDR};

/// Magic at the start of every encoded transaction ("LNTX").
pub const TXN_MAGIC: u32 = u32::from_le_bytes(*b"LNTX");
/// Bytes of the transaction header (magic, count, body length, body crc).
pub const TXN_HEADER_LEN: usize = 16;
/// Most block entries one `Map` record carries; longer runs are split ([`Record::map_runs`]) so
/// that one record stays small (2 KiB of entries) whatever the size of the write.
pub const MAP_RUN_MAX: usize = 256;
/// Longest symlink target (PATH_MAX without its NUL).
pub const MAX_SYMLINK_LEN: usize = 4095;
/// Blocks a file can have: the node tree's bound, so that a record decodes only if its index
/// fits in the tree it replays into (no file reaches past it: `mem::ops::MAX_FILE_SIZE`).
pub use crate::format::tree::MAX_FILE_BLOCKS;

/// When an operation took effect: a synchronized tick count and the CPU that read it. The
/// derived order (ticks, then cpu) is the total order replay applies records in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Stamp {
    pub ticks: u64,
    pub cpu: u32,
}

/// Every attribute of an inode except its link count, which replay derives from the namespace
/// records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InodeAttr {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    pub rdev: u64,
    pub flags: u32,
    pub generation: u32,
}

/// The whiteout a rename with RENAME_WHITEOUT leaves at the source name: a new inode (a
/// character device 0:0, as overlayfs reads it), created by the rename itself so that replay
/// makes both or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Whiteout {
    pub ino: u32,
    pub attr: InodeAttr,
}

/// The file type and device number of a whiteout (`S_IFCHR`, 0:0).
pub const WHITEOUT_TYPE: u32 = 0o020000;

/// One logged change. Inode and directory numbers are node ids (never 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A new inode named `name` in `dir`, with link count 1 (2 for a directory). `symlink` holds
    /// a symlink's target and is empty for every other type.
    Create { stamp: Stamp, dir: u32, name: Vec<u8>, ino: u32, attr: InodeAttr, symlink: Vec<u8> },
    /// A new name for an existing inode.
    Link { stamp: Stamp, dir: u32, name: Vec<u8>, ino: u32, file_type: u8 },
    /// `name` in `dir`, which referred to `ino`, is gone.
    Unlink { stamp: Stamp, dir: u32, name: Vec<u8>, ino: u32 },
    /// `src_dir/src_name` (inode `ino`) moved to `dst_dir/dst_name`. `replaced` is the inode the
    /// destination named before (0 if none); with `exchange` the two names swapped and
    /// `replaced` now sits at the source; with `whiteout` a new whiteout inode sits there.
    Rename {
        stamp: Stamp,
        src_dir: u32,
        src_name: Vec<u8>,
        dst_dir: u32,
        dst_name: Vec<u8>,
        ino: u32,
        replaced: u32,
        exchange: bool,
        whiteout: Option<Whiteout>,
    },
    /// The inode's attributes, absolute.
    SetAttr { stamp: Stamp, ino: u32, attr: InodeAttr },
    /// File blocks `first..first + entries.len()` now map to `(addr, crc32c of the block)`;
    /// addr 0 is a hole and `NEW_ADDR` an allocated, unwritten block (both with crc 0).
    Map { stamp: Stamp, ino: u32, first: u64, entries: Vec<(u32, u32)> },
    /// Every block at index `from_block` and beyond is unmapped.
    Truncate { stamp: Stamp, ino: u32, from_block: u64 },
    /// The inode's complete extended attribute set (name, value), as lanefs journaled xattrs
    /// before it journaled them one by one: decoded and replayed, no longer written.
    Xattrs { stamp: Stamp, ino: u32, attrs: Vec<(Vec<u8>, Vec<u8>)> },
    /// Extended attribute `name` of the inode holds `value`.
    SetXattr { stamp: Stamp, ino: u32, name: Vec<u8>, value: Vec<u8> },
    /// The inode has no extended attribute `name`.
    RemoveXattr { stamp: Stamp, ino: u32, name: Vec<u8> },
    /// The inode is gone: no names left and no longer open.
    Free { stamp: Stamp, ino: u32 },
    /// File block `idx` holds `data`, carried in the record itself (an fsync with a
    /// persistent-memory region logs small writes inline instead of writing data blocks; the
    /// device gets the page at the next checkpoint).
    Data { stamp: Stamp, ino: u32, idx: u64, data: Arc<BlockData> },
}

impl Record {
    /// When the operation took effect.
    pub fn stamp(&self) -> Stamp {
        match self {
            Record::Create { stamp, .. }
            | Record::Link { stamp, .. }
            | Record::Unlink { stamp, .. }
            | Record::Rename { stamp, .. }
            | Record::SetAttr { stamp, .. }
            | Record::Map { stamp, .. }
            | Record::Truncate { stamp, .. }
            | Record::Xattrs { stamp, .. }
            | Record::SetXattr { stamp, .. }
            | Record::RemoveXattr { stamp, .. }
            | Record::Free { stamp, .. }
            | Record::Data { stamp, .. } => *stamp,
        }
    }

    /// Splits block mappings `index -> (addr, crc)` of one inode into `Map` records: one per
    /// run of consecutive indexes, and at most [`MAP_RUN_MAX`] entries each. Indexes absent
    /// from `map` are left out (they did not change), never logged as holes.
    pub fn map_runs(ino: u32, stamp: Stamp, map: &BTreeMap<u64, (u32, u32)>) -> Vec<Record> {
        let mut out = Vec::new();
        let mut cur: Option<(u64, Vec<(u32, u32)>)> = None;
        for (&idx, &entry) in map {
            match &mut cur {
                Some((first, entries))
                    if entries.len() < MAP_RUN_MAX && *first + entries.len() as u64 == idx =>
                {
                    entries.push(entry)
                }
                _ => {
                    if let Some((first, entries)) = cur.take() {
                        out.push(Record::Map { stamp, ino, first, entries });
                    }
                    cur = Some((idx, vec![entry]));
                }
            }
        }
        if let Some((first, entries)) = cur {
            out.push(Record::Map { stamp, ino, first, entries });
        }
        // Every mapping in exactly one run, and every run one `validate` accepts in length.
        debug_assert_eq!(
            out.iter()
                .map(|r| if let Record::Map { entries, .. } = r { entries.len() } else { 0 })
                .sum::<usize>(),
            map.len(),
            "map runs of inode {ino}"
        );
        debug_assert!(out
            .iter()
            .all(|r| matches!(r, Record::Map { entries, .. } if (1..=MAP_RUN_MAX).contains(&entries.len()))));
        out
    }
}
/// The records one fsync makes durable, written to a lane's chain as a unit: recovery replays
/// all of them or none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Transaction {
    /// The records, in the order they were logged.
    pub records: Vec<Record>,
}

impl Transaction {
    /// A transaction of `records`.
    pub fn new(records: Vec<Record>) -> Transaction {
        Transaction { records }
    }

    /// Bytes of the encoded transaction, header included.
    pub fn encoded_len(&self) -> usize {
        TXN_HEADER_LEN + self.records.iter().map(Record::encoded_len).sum::<usize>()
    }

    /// Checks every record against the image ([`Record::validate_geometry`]).
    pub fn validate_geometry(&self, g: &Geometry) -> Result<()> {
        // A geometry with no node ids or no main area would accept nothing: a caller mixed up
        // its images.
        debug_assert!(g.max_nid > 0 && g.main_blocks() > 0, "validated against an empty geometry");
        for (i, r) in self.records.iter().enumerate() {
            r.validate_geometry(g)
                .map_err(|e| Error::corrupt(Structure::Journal, None, format!("record {i}: {e}")))?;
        }
        Ok(())
    }

    /// Every written data block the transaction maps, as (address, crc32c), in record order.
    /// Holes and unwritten (`NEW_ADDR`) entries are left out: they have no contents to check.
    /// Recovery reads these back and trusts the transaction only if every checksum matches
    /// (data was written in the same batch as the journal blocks, with no ordering between).
    pub fn data_refs(&self) -> Vec<(u32, u32)> {
        let refs: Vec<(u32, u32)> = self
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Map { entries, .. } => Some(entries),
                _ => None,
            })
            .flatten()
            .filter(|&&(a, _)| a != 0 && a != NEW_ADDR)
            .copied()
            .collect();
        // Each map record carries at most MAP_RUN_MAX entries (`validate`): this bounds the
        // blocks recovery reads back for one transaction.
        debug_assert!(refs.len() <= self.records.len() * MAP_RUN_MAX, "more refs than map entries");
        refs
    }
}
