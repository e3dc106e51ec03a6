//! The byte layout of records and transactions (the table in the parent's doc), both ways.
//!
//! Encoding runs only on records `validate` accepted, so every length fits its field. Decoding
//! never panics and never reserves more than the bytes left can hold: a count is checked
//! against the remaining input before anything is allocated for it.

use std::sync::Arc;

use crate::device::BLOCK_SIZE;
use crate::error::{Error, Result, Structure};
use crate::format::codec::{Dec, Enc};
use crate::format::node::Timespec;
use crate::format::xattr;

use super::{InodeAttr, Record, Stamp, Transaction, Whiteout, MAP_RUN_MAX, TXN_HEADER_LEN, TXN_MAGIC};

/// Bytes of the record prefix: tag and stamp.
const RECORD_PREFIX: usize = 1 + 12;
/// The smallest record (`Free`): prefix and one inode number. Bounds the record count a body
/// of a given length can claim.
const MIN_RECORD_LEN: usize = RECORD_PREFIX + 4;
const ATTR_LEN: usize = 3 * 4 + 8 + 4 * 12 + 8 + 4 + 4;
// The layout table in the parent's doc gives an attr as 84 bytes; images depend on it.
const _: () = assert!(ATTR_LEN == 84, "an encoded attr is 84 bytes");
// The counts and lengths that travel in 16-bit fields fit them.
const _: () = assert!(MAP_RUN_MAX <= u16::MAX as usize, "a map run's count fits a u16");
const _: () = assert!(super::MAX_SYMLINK_LEN <= u16::MAX as usize, "a symlink's length fits a u16");

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

fn invalid(what: impl Into<String>) -> Error {
    Error::InvalidArgument(format!("journal record: {}", what.into()))
}

impl Record {
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

    /// Bytes the record takes encoded.
    pub fn encoded_len(&self) -> usize {
        let name = |n: &[u8]| 1 + n.len();
        let len = RECORD_PREFIX
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
            };
        // `Transaction::decode` bounds a body's record count by MIN_RECORD_LEN: a record
        // shorter than that would make a valid transaction read as corrupt.
        debug_assert!(len >= MIN_RECORD_LEN, "record {:?} of {len} bytes", self.tag());
        len
    }

    /// Writes the record; `validate` has passed, so every length fits its field.
    fn encode(&self, e: &mut Enc) {
        // Only validated records are written: the length casts below rely on it.
        debug_assert!(self.validate().is_ok(), "encoding an invalid record {:?}", self.tag());
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
                debug_assert!(symlink.len() <= super::MAX_SYMLINK_LEN, "symlink of {}", symlink.len());
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
                debug_assert!((1..=MAP_RUN_MAX).contains(&entries.len()), "map run of {}", entries.len());
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
                debug_assert!(name.len() <= u8::MAX as usize && value.len() <= u32::MAX as usize);
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
        // Kind 2 stands for a plain move with a whiteout: `validate_rename` refuses an exchange
        // with one, which this encoding could not carry.
        debug_assert!(!(*exchange && whiteout.is_some()), "exchange with a whiteout");
        debug_assert!(*replaced != *ino, "rename of {ino} replaces itself");
        let start = e.pos();
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
        debug_assert_eq!(e.pos() - start, self.encoded_len() - RECORD_PREFIX, "rename body length");
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
                Record::Data { stamp, ino, idx, data: Arc::new(crate::device::BlockData(data)) }
            }
            t => return Err(d.err(format!("unknown record tag {t}"))),
        };
        // The arm taken builds the variant the tag names: it re-encodes under the same tag.
        debug_assert_eq!(r.tag(), tag, "record decoded under tag {tag}");
        // The pair of `encoded_len`: whatever the bytes, a record decodes from exactly as many
        // as it would encode to.
        debug_assert_eq!(d.pos() - start, r.encoded_len(), "decoded length of {r:?}");
        Ok(r)
    }
}

fn put_name(e: &mut Enc, n: &[u8]) {
    // The decoder reads a u8 length of at least 1 (`validate_name`).
    debug_assert!(!n.is_empty() && n.len() <= u8::MAX as usize, "name of {} bytes", n.len());
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
    let start = d.pos();
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
    // Each entry took at least the 3 bytes the allocation bound above counts on.
    debug_assert!(d.pos() - start >= 2 + 3 * count, "{count} xattrs in {} bytes", d.pos() - start);
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
    let start = e.pos();
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
    // `encoded_len` counts an attr as ATTR_LEN bytes.
    debug_assert_eq!(e.pos() - start, ATTR_LEN, "attr length");
}

fn get_attr(d: &mut Dec) -> Result<InodeAttr> {
    let start = d.pos();
    let (mode, uid, gid) = (d.u32()?, d.u32()?, d.u32()?);
    let size = d.u64()?;
    let mut times = [Timespec::default(); 4];
    for t in times.iter_mut() {
        *t = Timespec { sec: d.i64()?, nsec: d.u32()? };
    }
    let [atime, mtime, ctime, crtime] = times;
    let a = InodeAttr {
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
    };
    // The pair of `put_attr`: read in full, an attr always takes ATTR_LEN bytes.
    debug_assert_eq!(d.pos() - start, ATTR_LEN, "attr length");
    Ok(a)
}

impl Transaction {
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
        debug_assert_eq!(Transaction::decode(&b).ok().as_ref(), Some(self), "the transaction decodes back");
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
        // Established above, whatever the bytes: the records fill the body exactly, so the
        // transaction re-encodes to as many bytes as it was read from.
        debug_assert_eq!(
            records.iter().map(Record::encoded_len).sum::<usize>(),
            body_len,
            "records decoded from the body"
        );
        Ok(Transaction { records })
    }
}
