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

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::device::BLOCK_SIZE;
use crate::error::{Error, Result, Structure};
use crate::format::codec::{Dec, Enc};
use crate::format::dentry::{validate_name, DT_VALID};
use crate::format::layout::Geometry;
use crate::format::node::{Timespec, BODY_LEN, NEW_ADDR, S_IFMT};
use crate::format::xattr::{self, inline_len};

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

/// Bytes of the record prefix: tag and stamp.
const RECORD_PREFIX: usize = 1 + 12;
/// The smallest record (`Free`): prefix and one inode number. Bounds the record count a body
/// of a given length can claim.
const MIN_RECORD_LEN: usize = RECORD_PREFIX + 4;
const ATTR_LEN: usize = 3 * 4 + 8 + 4 * 12 + 8 + 4 + 4;

/// File types a mode may carry (`S_IFREG`, `S_IFDIR`, `S_IFLNK`, `S_IFCHR`, `S_IFBLK`,
/// `S_IFIFO`, `S_IFSOCK`).
const VALID_TYPES: [u32; 7] = [0o100000, 0o040000, 0o120000, 0o020000, 0o060000, 0o010000, 0o140000];
const S_IFLNK: u32 = 0o120000;

mod tag {
    pub const CREATE: u8 = 1;
    pub const LINK: u8 = 2;
    pub const UNLINK: u8 = 3;
    pub const RENAME: u8 = 4;
    pub const SET_ATTR: u8 = 5;
    pub const MAP: u8 = 6;
    pub const TRUNCATE: u8 = 7;
    pub const XATTRS: u8 = 8;
    pub const FREE: u8 = 9;
    pub const DATA: u8 = 10;
    pub const SET_XATTR: u8 = 11;
    pub const REMOVE_XATTR: u8 = 12;
}

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
    Data { stamp: Stamp, ino: u32, idx: u64, data: Arc<[u8; BLOCK_SIZE]> },
}

fn invalid(what: impl Into<String>) -> Error {
    Error::InvalidArgument(format!("journal record: {}", what.into()))
}

fn check_ino(ino: u32, what: &str) -> std::result::Result<(), String> {
    if ino == 0 {
        return Err(format!("{what} number is 0"));
    }
    Ok(())
}

fn check_name(name: &[u8]) -> std::result::Result<(), String> {
    validate_name(name).map_err(|e| format!("bad name: {e}"))
}

fn check_attr(a: &InodeAttr) -> std::result::Result<(), String> {
    if !VALID_TYPES.contains(&(a.mode & S_IFMT)) {
        return Err(format!("mode {:o} has no valid file type", a.mode));
    }
    for t in [a.atime, a.mtime, a.ctime, a.crtime] {
        if t.nsec >= 1_000_000_000 {
            return Err(format!("timestamp nanoseconds {} out of range", t.nsec));
        }
    }
    Ok(())
}

/// A symlink carries a target of 1..=MAX_SYMLINK_LEN bytes; nothing else carries one.
fn check_symlink(attr: &InodeAttr, symlink: &[u8]) -> std::result::Result<(), String> {
    let is_link = attr.mode & S_IFMT == S_IFLNK;
    if is_link == symlink.is_empty() || symlink.len() > MAX_SYMLINK_LEN {
        return Err(format!(
            "symlink target of {} bytes for mode {:o} (a symlink needs 1..={MAX_SYMLINK_LEN})",
            symlink.len(),
            attr.mode
        ));
    }
    Ok(())
}

/// A map run: 1..=MAP_RUN_MAX entries inside the largest file, holes and unwritten blocks
/// without a checksum.
fn check_map(first: u64, entries: &[(u32, u32)]) -> std::result::Result<(), String> {
    if entries.is_empty() || entries.len() > MAP_RUN_MAX {
        return Err(format!("map of {} entries (1..={MAP_RUN_MAX})", entries.len()));
    }
    if !matches!(first.checked_add(entries.len() as u64), Some(end) if end <= MAX_FILE_BLOCKS) {
        return Err(format!("map at block {first} runs past the largest file"));
    }
    if entries.iter().any(|&(a, c)| (a == 0 || a == NEW_ADDR) && c != 0) {
        return Err("a hole or unwritten block carries a checksum".into());
    }
    Ok(())
}

/// A whole xattr set (the `Xattrs` record of earlier images).
fn check_xattr_set(attrs: &[(Vec<u8>, Vec<u8>)]) -> std::result::Result<(), String> {
    // Earlier lanefs kept an inode's xattrs in one xattr node, and never journaled a set
    // larger than that.
    if inline_len(attrs.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))) > BODY_LEN {
        return Err("xattr set larger than one xattr node".into());
    }
    if attrs.iter().any(|(n, v)| n.is_empty() || n.len() > 255 || v.len() > u16::MAX as usize) {
        return Err("xattr name or value length out of range".into());
    }
    // Bounded by the node size above: at most a few hundred entries.
    let mut names: Vec<&[u8]> = attrs.iter().map(|(n, _)| n.as_slice()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err("xattr set names one attribute twice".into());
    }
    Ok(())
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

    fn tag(&self) -> u8 {
        match self {
            Record::Create { .. } => tag::CREATE,
            Record::Link { .. } => tag::LINK,
            Record::Unlink { .. } => tag::UNLINK,
            Record::Rename { .. } => tag::RENAME,
            Record::SetAttr { .. } => tag::SET_ATTR,
            Record::Map { .. } => tag::MAP,
            Record::Truncate { .. } => tag::TRUNCATE,
            Record::Xattrs { .. } => tag::XATTRS,
            Record::SetXattr { .. } => tag::SET_XATTR,
            Record::RemoveXattr { .. } => tag::REMOVE_XATTR,
            Record::Free { .. } => tag::FREE,
            Record::Data { .. } => tag::DATA,
        }
    }

    /// Checks everything about the record that does not depend on the image: non-zero inode
    /// numbers, valid names, modes and times, bounded lengths. Encoding and decoding both run
    /// it, so the writer can never produce what the reader would reject.
    pub fn validate(&self) -> std::result::Result<(), String> {
        match self {
            Record::Create { dir, name, ino, attr, symlink, .. } => {
                check_ino(*dir, "directory")?;
                check_ino(*ino, "inode")?;
                check_name(name)?;
                check_attr(attr)?;
                check_symlink(attr, symlink)?;
            }
            Record::Link { dir, name, ino, file_type, .. } => {
                check_ino(*dir, "directory")?;
                check_ino(*ino, "inode")?;
                check_name(name)?;
                if !DT_VALID.contains(file_type) {
                    return Err(format!("unknown file type {file_type}"));
                }
            }
            Record::Unlink { dir, name, ino, .. } => {
                check_ino(*dir, "directory")?;
                check_ino(*ino, "inode")?;
                check_name(name)?;
            }
            Record::Rename { .. } => self.validate_rename()?,
            Record::SetAttr { ino, attr, .. } => {
                check_ino(*ino, "inode")?;
                check_attr(attr)?;
            }
            Record::Map { ino, first, entries, .. } => {
                check_ino(*ino, "inode")?;
                check_map(*first, entries)?;
            }
            Record::Truncate { ino, from_block, .. } => {
                check_ino(*ino, "inode")?;
                if *from_block > MAX_FILE_BLOCKS {
                    return Err(format!("truncate at block {from_block} past the largest file"));
                }
            }
            Record::Xattrs { ino, attrs, .. } => {
                check_ino(*ino, "inode")?;
                check_xattr_set(attrs)?;
            }
            Record::SetXattr { ino, name, value, .. } => {
                check_ino(*ino, "inode")?;
                xattr::check_attr(name, value)?;
            }
            Record::RemoveXattr { ino, name, .. } => {
                check_ino(*ino, "inode")?;
                xattr::check_attr(name, &[])?;
            }
            Record::Free { ino, .. } => check_ino(*ino, "inode")?,
            Record::Data { ino, idx, .. } => {
                check_ino(*ino, "inode")?;
                if *idx >= MAX_FILE_BLOCKS {
                    return Err(format!("data at block {idx} past the largest file"));
                }
            }
        }
        Ok(())
    }

    /// [`Record::validate`] of a rename: the inodes and names, and a whiteout only on a move
    /// that neither moves nor replaces it.
    fn validate_rename(&self) -> std::result::Result<(), String> {
        let Record::Rename {
            src_dir, src_name, dst_dir, dst_name, ino, replaced, exchange, whiteout, ..
        } = self
        else {
            unreachable!("validate_rename of {self:?}");
        };
        check_ino(*src_dir, "source directory")?;
        check_ino(*dst_dir, "destination directory")?;
        check_ino(*ino, "inode")?;
        check_name(src_name)?;
        check_name(dst_name)?;
        if *replaced == *ino {
            return Err("rename replaces the inode it moves".into());
        }
        if *exchange && *replaced == 0 {
            return Err("exchange without a second inode".into());
        }
        if let Some(w) = whiteout {
            check_ino(w.ino, "whiteout")?;
            check_attr(&w.attr)?;
            if *exchange {
                return Err("exchange with a whiteout".into());
            }
            if w.ino == *ino || w.ino == *replaced {
                return Err("whiteout inode is one the rename moves or replaces".into());
            }
            if w.attr.mode & S_IFMT != WHITEOUT_TYPE || w.attr.rdev != 0 {
                return Err(format!("whiteout of mode {:o}, device {}", w.attr.mode, w.attr.rdev));
            }
        }
        Ok(())
    }

    /// Checks the record against the image: node ids within the NAT, data addresses inside the
    /// main area. Recovery runs it before trusting a transaction.
    pub fn validate_geometry(&self, g: &Geometry) -> std::result::Result<(), String> {
        let nid_ok = |n: u32| n <= g.max_nid;
        let ok = match self {
            Record::Create { dir, ino, .. }
            | Record::Link { dir, ino, .. }
            | Record::Unlink { dir, ino, .. } => nid_ok(*dir) && nid_ok(*ino),
            Record::Rename { src_dir, dst_dir, ino, replaced, whiteout, .. } => {
                nid_ok(*src_dir)
                    && nid_ok(*dst_dir)
                    && nid_ok(*ino)
                    && nid_ok(*replaced)
                    && whiteout.is_none_or(|w| nid_ok(w.ino))
            }
            Record::SetAttr { ino, .. }
            | Record::Truncate { ino, .. }
            | Record::Xattrs { ino, .. }
            | Record::SetXattr { ino, .. }
            | Record::RemoveXattr { ino, .. }
            | Record::Free { ino, .. }
            | Record::Data { ino, .. } => nid_ok(*ino),
            Record::Map { ino, entries, .. } => {
                if entries.iter().any(|&(a, _)| a != 0 && a != NEW_ADDR && !g.in_main(a as u64)) {
                    return Err("map entry outside the main area".into());
                }
                nid_ok(*ino)
            }
        };
        if ok {
            Ok(())
        } else {
            Err(format!("node id beyond {}", g.max_nid))
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
        out
    }

    /// Bytes the record takes encoded.
    pub fn encoded_len(&self) -> usize {
        let name = |n: &[u8]| 1 + n.len();
        RECORD_PREFIX
            + match self {
                Record::Create { name: n, symlink, .. } => 4 + name(n) + 4 + ATTR_LEN + 2 + symlink.len(),
                Record::Link { name: n, .. } => 4 + name(n) + 4 + 1,
                Record::Unlink { name: n, .. } => 4 + name(n) + 4,
                Record::Rename { src_name, dst_name, whiteout, .. } => {
                    4 + name(src_name) + 4 + name(dst_name) + 9 + whiteout.map_or(0, |_| 4 + ATTR_LEN)
                }
                Record::SetAttr { .. } => 4 + ATTR_LEN,
                Record::Map { entries, .. } => 4 + 8 + 2 + 8 * entries.len(),
                Record::Truncate { .. } => 4 + 8,
                Record::Xattrs { attrs, .. } => {
                    4 + 2 + attrs.iter().map(|(n, v)| 3 + n.len() + v.len()).sum::<usize>()
                }
                Record::SetXattr { name, value, .. } => 4 + 1 + 4 + name.len() + value.len(),
                Record::RemoveXattr { name: n, .. } => 4 + name(n),
                Record::Free { .. } => 4,
                Record::Data { .. } => 4 + 8 + BLOCK_SIZE,
            }
    }

    /// Writes the record; `validate` has passed, so every length fits its field.
    fn encode(&self, e: &mut Enc) {
        let start = e.pos();
        e.u8(self.tag());
        let s = self.stamp();
        e.u64(s.ticks);
        e.u32(s.cpu);
        match self {
            Record::Create { dir, name, ino, attr, symlink, .. } => {
                e.u32(*dir);
                put_name(e, name);
                e.u32(*ino);
                put_attr(e, attr);
                e.u16(symlink.len() as u16);
                e.bytes(symlink);
            }
            Record::Link { dir, name, ino, file_type, .. } => {
                e.u32(*dir);
                put_name(e, name);
                e.u32(*ino);
                e.u8(*file_type);
            }
            Record::Unlink { dir, name, ino, .. } => {
                e.u32(*dir);
                put_name(e, name);
                e.u32(*ino);
            }
            Record::Rename { .. } => self.encode_rename(e),
            Record::SetAttr { ino, attr, .. } => {
                e.u32(*ino);
                put_attr(e, attr);
            }
            Record::Map { ino, first, entries, .. } => {
                e.u32(*ino);
                e.u64(*first);
                e.u16(entries.len() as u16);
                for &(a, c) in entries {
                    e.u32(a);
                    e.u32(c);
                }
            }
            Record::Truncate { ino, from_block, .. } => {
                e.u32(*ino);
                e.u64(*from_block);
            }
            Record::Xattrs { ino, attrs, .. } => {
                e.u32(*ino);
                xattr::put_inline(e, attrs);
            }
            Record::SetXattr { ino, name, value, .. } => {
                e.u32(*ino);
                e.u8(name.len() as u8);
                e.u32(value.len() as u32);
                e.bytes(name);
                e.bytes(value);
            }
            Record::RemoveXattr { ino, name, .. } => {
                e.u32(*ino);
                put_name(e, name);
            }
            Record::Free { ino, .. } => e.u32(*ino),
            Record::Data { ino, idx, data, .. } => {
                e.u32(*ino);
                e.u64(*idx);
                e.bytes(&data[..]);
            }
        }
        // The pair of `encoded_len`: the transaction's buffer is sized by it.
        debug_assert_eq!(e.pos() - start, self.encoded_len(), "encoded_len of {:?}", self.tag());
    }

    /// [`Record::encode`] of a rename: both names, the inodes, then its kind (0 move,
    /// 1 exchange, 2 move leaving a whiteout, whose inode and attributes follow).
    fn encode_rename(&self, e: &mut Enc) {
        let Record::Rename {
            src_dir, src_name, dst_dir, dst_name, ino, replaced, exchange, whiteout, ..
        } = self
        else {
            unreachable!("encode_rename of {self:?}");
        };
        e.u32(*src_dir);
        put_name(e, src_name);
        e.u32(*dst_dir);
        put_name(e, dst_name);
        e.u32(*ino);
        e.u32(*replaced);
        match whiteout {
            None => e.u8(*exchange as u8),
            Some(w) => {
                e.u8(2);
                e.u32(w.ino);
                put_attr(e, &w.attr);
            }
        }
    }

    /// Reads one record; the caller validates it.
    fn decode(d: &mut Dec) -> Result<Record> {
        let start = d.pos();
        let tag = d.u8()?;
        let stamp = Stamp { ticks: d.u64()?, cpu: d.u32()? };
        let r = match tag {
            tag::CREATE => {
                let dir = d.u32()?;
                let name = get_name(d)?;
                let ino = d.u32()?;
                let attr = get_attr(d)?;
                let len = d.u16()? as usize;
                let symlink = d.bytes(len)?.to_vec();
                Record::Create { stamp, dir, name, ino, attr, symlink }
            }
            tag::LINK => {
                let dir = d.u32()?;
                let name = get_name(d)?;
                Record::Link { stamp, dir, name, ino: d.u32()?, file_type: d.u8()? }
            }
            tag::UNLINK => {
                let dir = d.u32()?;
                let name = get_name(d)?;
                Record::Unlink { stamp, dir, name, ino: d.u32()? }
            }
            tag::RENAME => decode_rename(d, stamp)?,
            tag::SET_ATTR => Record::SetAttr { stamp, ino: d.u32()?, attr: get_attr(d)? },
            tag::MAP => decode_map(d, stamp)?,
            tag::TRUNCATE => Record::Truncate { stamp, ino: d.u32()?, from_block: d.u64()? },
            tag::XATTRS => Record::Xattrs { stamp, ino: d.u32()?, attrs: get_xattr_set(d)? },
            tag::SET_XATTR => {
                let ino = d.u32()?;
                let nl = d.u8()? as usize;
                let vl = d.u32()? as usize;
                // Bounded by the bytes left: never allocates more than the record holds.
                let name = d.bytes(nl)?.to_vec();
                let value = d.bytes(vl)?.to_vec();
                Record::SetXattr { stamp, ino, name, value }
            }
            tag::REMOVE_XATTR => {
                let ino = d.u32()?;
                Record::RemoveXattr { stamp, ino, name: get_name(d)? }
            }
            tag::FREE => Record::Free { stamp, ino: d.u32()? },
            tag::DATA => {
                let ino = d.u32()?;
                let idx = d.u64()?;
                let data: [u8; BLOCK_SIZE] = d.bytes(BLOCK_SIZE)?.try_into().expect("BLOCK_SIZE bytes");
                Record::Data { stamp, ino, idx, data: Arc::new(data) }
            }
            t => return Err(d.err(format!("unknown record tag {t}"))),
        };
        // The pair of `encoded_len`: whatever the bytes, a record decodes from exactly as many
        // as it would encode to.
        debug_assert_eq!(d.pos() - start, r.encoded_len(), "decoded length of {r:?}");
        Ok(r)
    }
}

fn put_name(e: &mut Enc, n: &[u8]) {
    e.u8(n.len() as u8);
    e.bytes(n);
}

fn get_name(d: &mut Dec) -> Result<Vec<u8>> {
    let n = d.u8()? as usize;
    Ok(d.bytes(n)?.to_vec())
}

/// A whole xattr set in the layout of [`xattr::put_inline`] (with its own checks: the record
/// is validated after decoding).
fn get_xattr_set(d: &mut Dec) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let count = d.u16()? as usize;
    // Each entry takes at least 3 bytes, so the bytes left bound the allocation.
    if count * 3 > d.remaining() {
        return Err(d.err(format!("{count} xattrs cannot fit in the record")));
    }
    let mut attrs = Vec::with_capacity(count);
    for _ in 0..count {
        let nl = d.u8()? as usize;
        let vl = d.u16()? as usize;
        let n = d.bytes(nl)?.to_vec();
        let v = d.bytes(vl)?.to_vec();
        attrs.push((n, v));
    }
    Ok(attrs)
}

/// The body of a rename record (see [`Record::encode_rename`]).
fn decode_rename(d: &mut Dec, stamp: Stamp) -> Result<Record> {
    let src_dir = d.u32()?;
    let src_name = get_name(d)?;
    let dst_dir = d.u32()?;
    let dst_name = get_name(d)?;
    let (ino, replaced) = (d.u32()?, d.u32()?);
    let (exchange, whiteout) = match d.u8()? {
        0 => (false, None),
        1 => (true, None),
        2 => (false, Some(Whiteout { ino: d.u32()?, attr: get_attr(d)? })),
        x => return Err(d.err(format!("rename kind {x}"))),
    };
    Ok(Record::Rename { stamp, src_dir, src_name, dst_dir, dst_name, ino, replaced, exchange, whiteout })
}

/// The body of a map record: inode, first block, and 1..=MAP_RUN_MAX (address, crc) entries.
fn decode_map(d: &mut Dec, stamp: Stamp) -> Result<Record> {
    let ino = d.u32()?;
    let first = d.u64()?;
    let count = d.u16()? as usize;
    // Checked before reserving: a corrupt count cannot ask for more than the cap.
    if count == 0 || count > MAP_RUN_MAX {
        return Err(d.err(format!("map of {count} entries")));
    }
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        entries.push((d.u32()?, d.u32()?));
    }
    Ok(Record::Map { stamp, ino, first, entries })
}

fn put_attr(e: &mut Enc, a: &InodeAttr) {
    e.u32(a.mode);
    e.u32(a.uid);
    e.u32(a.gid);
    e.u64(a.size);
    for t in [a.atime, a.mtime, a.ctime, a.crtime] {
        e.i64(t.sec);
        e.u32(t.nsec);
    }
    e.u64(a.rdev);
    e.u32(a.flags);
    e.u32(a.generation);
}

fn get_attr(d: &mut Dec) -> Result<InodeAttr> {
    let (mode, uid, gid) = (d.u32()?, d.u32()?, d.u32()?);
    let size = d.u64()?;
    let mut times = [Timespec::default(); 4];
    for t in times.iter_mut() {
        *t = Timespec { sec: d.i64()?, nsec: d.u32()? };
    }
    let [atime, mtime, ctime, crtime] = times;
    Ok(InodeAttr {
        mode,
        uid,
        gid,
        size,
        atime,
        mtime,
        ctime,
        crtime,
        rdev: d.u64()?,
        flags: d.u32()?,
        generation: d.u32()?,
    })
}

/// The records one fsync makes durable, written to a lane's chain as a unit: recovery replays
/// all of them or none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Transaction {
    pub records: Vec<Record>,
}

impl Transaction {
    pub fn new(records: Vec<Record>) -> Transaction {
        Transaction { records }
    }

    /// Bytes of the encoded transaction, header included.
    pub fn encoded_len(&self) -> usize {
        TXN_HEADER_LEN + self.records.iter().map(Record::encoded_len).sum::<usize>()
    }

    /// Encodes the transaction. Fails (`InvalidArgument`) on a record [`Record::validate`]
    /// rejects, or a transaction whose body would not fit a u32 length.
    pub fn encode(&self) -> Result<Vec<u8>> {
        for (i, r) in self.records.iter().enumerate() {
            r.validate().map_err(|e| invalid(format!("record {i}: {e}")))?;
        }
        let len = self.encoded_len();
        let body_len = u32::try_from(len - TXN_HEADER_LEN).map_err(|_| invalid("transaction too large"))?;
        let count = u32::try_from(self.records.len()).map_err(|_| invalid("too many records"))?;
        let mut b = vec![0u8; len];
        let mut e = Enc::at(&mut b, TXN_HEADER_LEN);
        for r in &self.records {
            r.encode(&mut e);
        }
        debug_assert_eq!(e.pos(), len, "encoded_len disagrees with encode");
        let crc = crc32c::crc32c(&b[TXN_HEADER_LEN..]);
        let mut e = Enc::new(&mut b);
        e.u32(TXN_MAGIC);
        e.u32(count);
        e.u32(body_len);
        e.u32(crc);
        Ok(b)
    }

    /// Decodes and validates an encoded transaction, which must be exactly `bytes` long.
    /// Errors are `Corrupt { structure: Journal, .. }`.
    pub fn decode(bytes: &[u8]) -> Result<Transaction> {
        let mut d = Dec::new(bytes, Structure::Journal, None);
        let magic = d.u32()?;
        if magic != TXN_MAGIC {
            return Err(d.err(format!("bad transaction magic {magic:#010x}")));
        }
        let count = d.u32()? as usize;
        let body_len = d.u32()? as usize;
        let crc = d.u32()?;
        if body_len != d.remaining() {
            return Err(d.err(format!("transaction body of {body_len} bytes, found {}", d.remaining())));
        }
        let body = &bytes[TXN_HEADER_LEN..];
        let actual = crc32c::crc32c(body);
        if crc != actual {
            return Err(
                d.err(format!("transaction checksum mismatch ({crc:#010x}, computed {actual:#010x})"))
            );
        }
        // Bounds the allocation by the bytes we actually hold, whatever the count says.
        if count > body_len / MIN_RECORD_LEN {
            return Err(d.err(format!("{count} records cannot fit in {body_len} bytes")));
        }
        let mut records = Vec::with_capacity(count);
        for i in 0..count {
            let r = Record::decode(&mut d)?;
            r.validate().map_err(|e| d.err(format!("record {i}: {e}")))?;
            records.push(r);
        }
        if d.remaining() != 0 {
            return Err(d.err(format!("{} bytes after the last record", d.remaining())));
        }
        Ok(Transaction { records })
    }

    /// Checks every record against the image ([`Record::validate_geometry`]).
    pub fn validate_geometry(&self, g: &Geometry) -> Result<()> {
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
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::Map { entries, .. } => Some(entries),
                _ => None,
            })
            .flatten()
            .filter(|&&(a, _)| a != 0 && a != NEW_ADDR)
            .copied()
            .collect()
    }
}
