//! Dentry blocks: the data blocks of a directory, each a packed list of entries.
//!
//! Directories are loaded whole into the in-memory hash map on first use, so the on-disk form
//! needs no hashing: an entry is (inode, file type, name length, name). `.` and `..` are not
//! stored; they are derived from the directory and its parent.

use super::codec::{seal, BlockHeader, Dec, Enc, HEADER_LEN};
use super::layout::BLOCK_SIZE;
use super::node::MAX_NAME_LEN;
use crate::error::{Error, Result, Structure};

/// Magic of a dentry block ("LNDE").
pub const DENTRY_MAGIC: u32 = u32::from_le_bytes(*b"LNDE");
const ENTRY_FIXED: usize = 6;
/// Payload bytes of one dentry block.
pub const DENTRY_SPACE: usize = BLOCK_SIZE - HEADER_LEN;

/// File type of an entry, as `DT_*` in dirent.h.
pub const DT_VALID: [u8; 7] = [1, 2, 4, 6, 8, 10, 12];

/// The `DT_*` directory-entry type of a mode.
pub fn dtype_of(mode: u32) -> u8 {
    match mode & super::node::S_IFMT {
        0o010000 => 1,
        0o020000 => 2,
        0o040000 => 4,
        0o060000 => 6,
        0o100000 => 8,
        0o120000 => 10,
        0o140000 => 12,
        _ => 0,
    }
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dentry {
    /// The inode the entry names.
    pub ino: u32,
    /// Its type, as `d_type` (`DT_*`).
    pub file_type: u8,
    /// The name (1 to 255 bytes, no NUL or '/').
    pub name: Vec<u8>,
}

impl Dentry {
    /// Bytes the entry takes in a dentry block.
    pub fn encoded_len(&self) -> usize {
        ENTRY_FIXED + self.name.len()
    }
}

/// Checks that `name` can be a directory entry: 1..=255 bytes, no '/', no NUL, not . or ..
pub fn validate_name(name: &[u8]) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err("empty or reserved name");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("name longer than 255 bytes");
    }
    if name.iter().any(|&c| c == b'/' || c == 0) {
        return Err("name contains '/' or NUL");
    }
    Ok(())
}

/// One dentry block of directory `dir_ino`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DentryBlock {
    /// The directory the block belongs to (checked on decode).
    pub dir_ino: u32,
    /// The entries the block holds.
    pub entries: Vec<Dentry>,
}

impl DentryBlock {
    /// Packs entries into as few blocks as needed.
    pub fn pack(dir_ino: u32, entries: impl IntoIterator<Item = Dentry>) -> Vec<DentryBlock> {
        let mut out: Vec<DentryBlock> = Vec::new();
        let mut used = DENTRY_SPACE;
        for d in entries {
            if used + d.encoded_len() > DENTRY_SPACE {
                out.push(DentryBlock { dir_ino, entries: Vec::new() });
                used = 0;
            }
            used += d.encoded_len();
            out.last_mut().expect("pushed above").entries.push(d);
        }
        out
    }

    /// The block's bytes; an error if the entries do not fit.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let used: usize = self.entries.iter().map(Dentry::encoded_len).sum();
        if used > DENTRY_SPACE {
            return Err(Error::InvalidArgument("dentry block overfull".into()));
        }
        let mut b = vec![0u8; BLOCK_SIZE];
        BlockHeader { magic: DENTRY_MAGIC, a: self.dir_ino, b: self.entries.len() as u32 }.write(&mut b);
        let mut e = Enc::at(&mut b, HEADER_LEN);
        for d in &self.entries {
            if validate_name(&d.name).is_err() || d.ino == 0 {
                return Err(Error::InvalidArgument("invalid directory entry".into()));
            }
            e.u32(d.ino);
            e.u8(d.file_type);
            e.u8(d.name.len() as u8);
            e.bytes(&d.name);
        }
        seal(&mut b, 4);
        // The pair of every check decode makes (entries may name any inode number here).
        debug_assert_eq!(
            DentryBlock::decode(&b, self.dir_ino, u32::MAX, None).ok().as_ref(),
            Some(self),
            "the block decodes back"
        );
        Ok(b)
    }

    /// Decodes and validates a block of directory `dir_ino` (entries name nodes up to `max_nid`).
    pub fn decode(b: &[u8], dir_ino: u32, max_nid: u32, addr: Option<u64>) -> Result<DentryBlock> {
        let h = BlockHeader::check(b, DENTRY_MAGIC, Structure::Dentry, addr)?;
        let mut d = Dec::at(b, HEADER_LEN, Structure::Dentry, addr);
        if h.a != dir_ino {
            return Err(d.err(format!("belongs to directory {}, expected {dir_ino}", h.a)));
        }
        let count = h.b as usize;
        if count > DENTRY_SPACE / (ENTRY_FIXED + 1) {
            return Err(d.err(format!("{count} entries cannot fit in one block")));
        }
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            let ino = d.u32()?;
            let file_type = d.u8()?;
            let len = d.u8()? as usize;
            let name = d.bytes(len)?.to_vec();
            if ino == 0 || ino > max_nid {
                return Err(d.err(format!("entry {i} points to impossible inode {ino}")));
            }
            if !DT_VALID.contains(&file_type) {
                return Err(d.err(format!("entry {i} has unknown file type {file_type}")));
            }
            if let Err(why) = validate_name(&name) {
                return Err(d.err(format!("entry {i}: {why}")));
            }
            entries.push(Dentry { ino, file_type, name });
        }
        if b[d.pos()..].iter().any(|&x| x != 0) {
            return Err(d.err("bytes after the last entry"));
        }
        Ok(DentryBlock { dir_ino, entries })
    }
}
