//! What a record may hold: the one check the encoder runs before it writes and the decoder
//! runs after it reads, so lanefs never writes what it would reject on reading; and the check
//! against the image's geometry that recovery runs before it trusts a transaction.
//!
//! Every check returns a message, never panics: what it checks may come from a corrupt disk.

use crate::format::dentry::{validate_name, DT_VALID};
use crate::format::layout::Geometry;
use crate::format::node::{BODY_LEN, NEW_ADDR, S_IFMT};
use crate::format::xattr::{self, inline_len};

use super::{InodeAttr, Record, MAP_RUN_MAX, MAX_FILE_BLOCKS, MAX_SYMLINK_LEN, WHITEOUT_TYPE};

/// File types a mode may carry (`S_IFREG`, `S_IFDIR`, `S_IFLNK`, `S_IFCHR`, `S_IFBLK`,
/// `S_IFIFO`, `S_IFSOCK`).
const VALID_TYPES: [u32; 7] = [0o100000, 0o040000, 0o120000, 0o020000, 0o060000, 0o010000, 0o140000];
const S_IFLNK: u32 = 0o120000;
// Every type is made of file type bits only, and the types the checks below single out are
// among them: a symlink's and a whiteout's attrs pass `check_attr`.
const _: () = {
    let mut i = 0;
    while i < VALID_TYPES.len() {
        assert!(VALID_TYPES[i] & !S_IFMT == 0, "a file type outside S_IFMT");
        i += 1;
    }
    assert!(VALID_TYPES[2] == S_IFLNK && VALID_TYPES[3] == WHITEOUT_TYPE, "symlink and whiteout types");
};

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
        // A geometry `Geometry::compute` made: ids and main-area blocks exist to check against.
        debug_assert!(g.max_nid >= 1 && g.main_blocks() > 0, "validated against an empty geometry");
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
}
