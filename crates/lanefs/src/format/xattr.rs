//! Extended attributes on disk: an inode's xattr node, and the xattr blocks a large set spills to.
//!
//! An inode names at most one xattr node (`Inode::xattr_nid`). Its body takes one of two forms:
//!
//! ```text
//! inline   count u16 (< 0xFFFF) | count x (name_len u8, value_len u16, name, value)
//! blocks   0xFFFF u16 | 0 u16 | stream_len u32 | stream_crc u32 | nblocks u32 | nblocks x addr u32
//! ```
//!
//! Inline is the common case (a few short attributes: one node, as fast as ever) and the layout
//! every earlier lanefs wrote. A set that does not fit the node body is *encoded as a stream*
//!
//! ```text
//! stream   count u32 | count x (name_len u8, value_len u32, name, value)   names strictly ascending
//! ```
//!
//! cut into [`XATTR_PAYLOAD`]-byte pieces, one per xattr block, whose addresses the node lists in
//! order. An xattr block is `magic "LNXA" | crc32c | ino u32 | index u32 | payload`, summarised in
//! the SSA as `(Xattr, ino, index)`. A set holds up to [`MAX_XATTR_STREAM`] bytes of stream
//! (about 3.9 MiB: thousands of names, or sixty 64 KiB values).
//!
//! Invariants: the encoders accept exactly what the decoders accept (names of 1..=255 bytes,
//! values of at most [`XATTR_SIZE_MAX`] bytes, no name twice); every decode checks magic, crc32c
//! and bounds and never allocates more than its input's length implies. The blocks form's
//! `stream_crc` ties the blocks to the node that names them, so a stale block at a listed
//! address is caught even though its own checksum is good.

use super::codec::{BlockHeader, Dec, Enc, HEADER_LEN};
use super::layout::{Geometry, BLOCK_SIZE};
use super::node::BODY_LEN;
use crate::error::{Error, Result, Structure};

/// Longest xattr name and value (as Linux: `XATTR_NAME_MAX`, `XATTR_SIZE_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest xattr value, in bytes (Linux's XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;

/// Magic of an xattr block ("LNXA").
pub const XATTR_MAGIC: u32 = u32::from_le_bytes(*b"LNXA");
/// Stream bytes one xattr block carries.
pub const XATTR_PAYLOAD: usize = BLOCK_SIZE - HEADER_LEN;
/// Bytes of the blocks form's header in the node body.
const BLOCKS_HEADER: usize = 2 + 2 + 4 + 4 + 4;
/// Xattr blocks one node can list.
pub const MAX_XATTR_BLOCKS: usize = (BODY_LEN - BLOCKS_HEADER) / 4;
/// Largest stream a set may encode to.
pub const MAX_XATTR_STREAM: usize = MAX_XATTR_BLOCKS * XATTR_PAYLOAD;
/// The first u16 of a blocks-form body (no inline set has that many entries).
const BLOCKS_MARK: u16 = u16::MAX;

/// One attribute: (name, value).
pub type Xattr = (Vec<u8>, Vec<u8>);

/// Writes an inline set (see the module docs): its count, then each entry's name length, value
/// length, name and value. The caller checked the lengths fit their fields. The journal's
/// whole-set record uses the same layout.
pub(crate) fn put_inline(e: &mut Enc, attrs: &[Xattr]) {
    e.u16(attrs.len() as u16);
    for (n, v) in attrs {
        e.u8(n.len() as u8);
        e.u16(v.len() as u16);
        e.bytes(n);
        e.bytes(v);
    }
}

/// What an xattr node holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrNode {
    /// The whole set, in the node (any order; no name twice).
    Inline(Vec<Xattr>),
    /// The set's stream lives in `addrs` (in order); `stream_len` bytes long, crc32c `stream_crc`.
    Blocks {
        /// Length of the stream in bytes.
        stream_len: u32,
        /// Its crc32c.
        stream_crc: u32,
        /// The blocks holding it, in order.
        addrs: Vec<u32>,
    },
}

/// Bytes a set occupies in a node body in the inline form.
pub fn inline_len<'a>(attrs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> usize {
    2 + attrs.into_iter().map(|(n, v)| 3 + n.len() + v.len()).sum::<usize>()
}

/// Bytes one attribute adds to a stream.
pub fn stream_entry_len(name_len: usize, value_len: usize) -> usize {
    5 + name_len + value_len
}

/// Bytes of the stream of an empty set.
pub const EMPTY_STREAM_LEN: usize = 4;

/// Xattr blocks a stream of `len` bytes takes.
pub fn blocks_for(len: usize) -> usize {
    len.div_ceil(XATTR_PAYLOAD)
}

/// Why an attribute cannot be stored, if it cannot.
pub fn check_attr(name: &[u8], value: &[u8]) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(format!("xattr name of {} bytes (1..={XATTR_NAME_MAX})", name.len()));
    }
    if value.len() > XATTR_SIZE_MAX {
        return Err(format!("xattr value of {} bytes (at most {XATTR_SIZE_MAX})", value.len()));
    }
    Ok(())
}

/// Encodes a set (names strictly ascending, each checked by [`check_attr`]) as a stream.
pub fn encode_stream<'a>(attrs: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])> + Clone) -> Vec<u8> {
    let len =
        EMPTY_STREAM_LEN + attrs.clone().map(|(n, v)| stream_entry_len(n.len(), v.len())).sum::<usize>();
    let mut b = vec![0u8; len];
    let mut e = Enc::new(&mut b);
    e.u32(attrs.len() as u32);
    for (n, v) in attrs.clone() {
        debug_assert!(check_attr(n, v).is_ok());
        e.u8(n.len() as u8);
        e.u32(v.len() as u32);
        e.bytes(n);
        e.bytes(v);
    }
    debug_assert_eq!(e.pos(), len);
    debug_assert!(
        decode_stream(&b, None).is_ok_and(
            |d| d.len() == attrs.len() && d.iter().zip(attrs).all(|(x, (n, v))| x.0 == n && x.1 == v)
        ),
        "the stream decodes back"
    );
    b
}

/// Decodes a stream: every name valid and strictly ascending, every value in range, and not a
/// byte left over. `addr` names the node for errors.
pub fn decode_stream(b: &[u8], addr: Option<u64>) -> Result<Vec<Xattr>> {
    let mut d = Dec::new(b, Structure::Xattr, addr);
    let count = d.u32()? as usize;
    // Each entry takes at least 6 bytes, which bounds the allocation by the input.
    if count > d.remaining() / 6 {
        return Err(d.err(format!("{count} xattrs cannot fit in a stream of {} bytes", b.len())));
    }
    let mut out: Vec<Xattr> = Vec::with_capacity(count);
    for _ in 0..count {
        let nl = d.u8()? as usize;
        let vl = d.u32()? as usize;
        if nl == 0 || vl > XATTR_SIZE_MAX {
            return Err(d.err(format!("xattr name of {nl} bytes or value of {vl} bytes")));
        }
        let n = d.bytes(nl)?;
        let v = d.bytes(vl)?;
        if out.last().is_some_and(|(p, _)| p.as_slice() >= n) {
            return Err(d.err("xattr names out of order or repeated"));
        }
        out.push((n.to_vec(), v.to_vec()));
    }
    if d.remaining() != 0 {
        return Err(d.err(format!("{} bytes after the last xattr", d.remaining())));
    }
    Ok(out)
}

/// Encodes xattr block `index` of inode `ino`, holding `payload` (at most [`XATTR_PAYLOAD`]
/// bytes; the rest of the block is zero).
pub fn encode_block(ino: u32, index: u32, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() <= XATTR_PAYLOAD, "xattr block payload too long");
    let mut b = vec![0u8; BLOCK_SIZE];
    BlockHeader { magic: XATTR_MAGIC, a: ino, b: index }.write(&mut b);
    b[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
    super::codec::seal(&mut b, super::codec::CRC_OFFSET);
    debug_assert!(
        decode_block(&b, ino, index, None).is_ok_and(|p| p[..payload.len()] == *payload),
        "the block decodes back"
    );
    b
}

/// Checks xattr block `b` (read from `addr`) is block `index` of inode `ino`; returns its payload.
pub fn decode_block(b: &[u8], ino: u32, index: u32, addr: Option<u64>) -> Result<&[u8]> {
    let h = BlockHeader::check(b, XATTR_MAGIC, Structure::Xattr, addr)?;
    if h.a != ino || h.b != index {
        return Err(Error::corrupt(
            Structure::Xattr,
            addr,
            format!("block {} of inode {} where block {index} of inode {ino} was expected", h.b, h.a),
        ));
    }
    Ok(&b[HEADER_LEN..])
}

/// Joins the payloads of a blocks-form node's blocks (in order) into its stream and checks it
/// against the node's length and crc; `addr` names the node for errors.
pub fn join_stream<'a>(
    payloads: impl IntoIterator<Item = &'a [u8]>,
    stream_len: u32,
    stream_crc: u32,
    addr: Option<u64>,
) -> Result<Vec<u8>> {
    let len = stream_len as usize;
    let mut s = Vec::with_capacity(len.min(MAX_XATTR_STREAM));
    for p in payloads {
        let take = (len - s.len()).min(p.len());
        s.extend_from_slice(&p[..take]);
    }
    if s.len() != len {
        return Err(Error::corrupt(
            Structure::Xattr,
            addr,
            format!("stream of {} bytes, expected {len}", s.len()),
        ));
    }
    let crc = crc32c::crc32c(&s);
    if crc != stream_crc {
        return Err(Error::corrupt(
            Structure::Xattr,
            addr,
            format!("stream checksum mismatch (node says {stream_crc:#010x}, blocks give {crc:#010x})"),
        ));
    }
    Ok(s)
}

impl XattrNode {
    /// Writes the body. Fails (`InvalidArgument`) for what no valid node holds; callers choose
    /// the form so that it never does.
    pub(super) fn encode(&self, e: &mut Enc) -> Result<()> {
        let bad = |why: &str| Err(Error::InvalidArgument(format!("xattr node: {why}")));
        match self {
            XattrNode::Inline(attrs) => {
                if inline_len(attrs.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))) > BODY_LEN
                    || attrs.iter().any(|(n, v)| check_attr(n, v).is_err() || v.len() > u16::MAX as usize)
                {
                    return bad("inline set too large or an attribute out of range");
                }
                put_inline(e, attrs);
            }
            XattrNode::Blocks { stream_len, stream_crc, addrs } => {
                if addrs.is_empty()
                    || addrs.len() > MAX_XATTR_BLOCKS
                    || addrs.len() != blocks_for(*stream_len as usize)
                {
                    return bad("block list does not match the stream length");
                }
                e.u16(BLOCKS_MARK);
                e.u16(0);
                e.u32(*stream_len);
                e.u32(*stream_crc);
                e.u32(addrs.len() as u32);
                for &a in addrs {
                    e.u32(a);
                }
            }
        }
        Ok(())
    }

    /// Reads a body (the node's first `BODY_LEN` bytes).
    pub(super) fn decode(d: &mut Dec, g: &Geometry) -> Result<XattrNode> {
        let count = d.u16()?;
        if count == BLOCKS_MARK {
            if d.u16()? != 0 {
                return Err(d.err("unknown xattr node flags"));
            }
            let stream_len = d.u32()?;
            let stream_crc = d.u32()?;
            let n = d.u32()? as usize;
            if n == 0 || n > MAX_XATTR_BLOCKS || n != blocks_for(stream_len as usize) {
                return Err(d.err(format!("{n} xattr blocks for a stream of {stream_len} bytes")));
            }
            let mut addrs = Vec::with_capacity(n);
            for _ in 0..n {
                let a = d.u32()?;
                if !g.in_main(a as u64) {
                    return Err(d.err(format!("xattr block address {a} outside the main area")));
                }
                addrs.push(a);
            }
            let mut sorted = addrs.clone();
            sorted.sort_unstable();
            if sorted.windows(2).any(|w| w[0] == w[1]) {
                return Err(d.err("an xattr block is listed twice"));
            }
            return Ok(XattrNode::Blocks { stream_len, stream_crc, addrs });
        }
        let count = count as usize;
        // Each entry takes at least 4 bytes, which bounds the allocation by the block.
        if count * 4 > BODY_LEN {
            return Err(d.err(format!("{count} xattrs cannot fit in one node")));
        }
        let mut attrs: Vec<Xattr> = Vec::with_capacity(count);
        for _ in 0..count {
            let nl = d.u8()? as usize;
            let vl = d.u16()? as usize;
            if nl == 0 {
                return Err(d.err("empty xattr name"));
            }
            let n = d.bytes(nl)?.to_vec();
            let v = d.bytes(vl)?.to_vec();
            attrs.push((n, v));
        }
        // Bounded by the node: at most about a thousand names.
        let mut names: Vec<&[u8]> = attrs.iter().map(|(n, _)| n.as_slice()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(d.err("an xattr name appears twice"));
        }
        Ok(XattrNode::Inline(attrs))
    }
}
