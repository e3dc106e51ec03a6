//! Little-endian encoding and bounds-checked decoding of on-disk bytes, and block sealing.
//!
//! Every decoder in `format` reads through [`Dec`], whose accessors return an error instead of
//! panicking when a length or offset read from disk points outside the buffer. Every metadata
//! block carries a crc32c at byte offset 4 ([`seal`], [`verify_seal`]) computed over the whole
//! block with the crc field itself left out, so a single flipped bit anywhere is detected.

use crate::error::{Error, Result, Structure};

/// Byte offset of the crc32c in every block that uses the common 16-byte header.
pub const CRC_OFFSET: usize = 4;

/// crc32c over `buf` skipping the four bytes at `crc_at`.
pub fn crc_skipping(buf: &[u8], crc_at: usize) -> u32 {
    debug_assert!(crc_at + 4 <= buf.len());
    let c = crc32c::crc32c(&buf[..crc_at]);
    crc32c::crc32c_append(c, &buf[crc_at + 4..])
}

/// Stores the crc32c of `buf` (without its crc field) at `crc_at`.
pub fn seal(buf: &mut [u8], crc_at: usize) {
    let c = crc_skipping(buf, crc_at);
    buf[crc_at..crc_at + 4].copy_from_slice(&c.to_le_bytes());
}

/// Checks magic (first four bytes at `magic_at`) and crc of a sealed block.
pub fn verify_seal(
    buf: &[u8],
    magic_at: usize,
    magic: u32,
    crc_at: usize,
    structure: Structure,
    block: Option<u64>,
) -> Result<()> {
    if buf.len() < magic_at + 4 || buf.len() < crc_at + 4 {
        return Err(Error::corrupt(structure, block, "buffer too short"));
    }
    let found = u32::from_le_bytes(buf[magic_at..magic_at + 4].try_into().expect("4 bytes"));
    if found != magic {
        return Err(Error::corrupt(
            structure,
            block,
            format!("bad magic {found:#010x}, expected {magic:#010x}"),
        ));
    }
    let stored = u32::from_le_bytes(buf[crc_at..crc_at + 4].try_into().expect("4 bytes"));
    let actual = crc_skipping(buf, crc_at);
    if stored != actual {
        return Err(Error::corrupt(
            structure,
            block,
            format!("checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"),
        ));
    }
    Ok(())
}

/// Sequential little-endian writer into a fixed buffer.
///
/// Encoders size their output from validated in-memory values; running past the end is a bug
/// in lanefs, not bad input, so it panics (in tests) rather than returning an error.
pub struct Enc<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Enc<'a> {
    /// An encoder writing from the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Enc { buf, pos: 0 }
    }
    /// An encoder writing `buf` from byte `pos`.
    pub fn at(buf: &'a mut [u8], pos: usize) -> Self {
        assert!(pos <= buf.len());
        Enc { buf, pos }
    }
    /// The next byte to write.
    pub fn pos(&self) -> usize {
        self.pos
    }
    /// Writes `b` as it is.
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
    /// Writes `n` zero bytes.
    pub fn zeros(&mut self, n: usize) {
        self.buf[self.pos..self.pos + n].fill(0);
        self.pos += n;
    }
    /// Zero-fills up to absolute offset `to` (which must not be behind the cursor).
    pub fn pad_to(&mut self, to: usize) {
        assert!(to >= self.pos, "encoder overran its field area");
        self.zeros(to - self.pos);
    }
    /// Writes one byte.
    pub fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }
    /// Writes a little-endian u16.
    pub fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    /// Writes a little-endian u32.
    pub fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    /// Writes a little-endian u64.
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    /// Writes a little-endian i64.
    pub fn i64(&mut self, v: i64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// Sequential little-endian reader whose every access is bounds-checked.
pub struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
    structure: Structure,
    block: Option<u64>,
}

impl<'a> Dec<'a> {
    /// A decoder of `buf` from its start; errors name `structure` and `block`.
    pub fn new(buf: &'a [u8], structure: Structure, block: Option<u64>) -> Self {
        Dec { buf, pos: 0, structure, block }
    }
    /// A decoder of `buf` from byte `pos`.
    pub fn at(buf: &'a [u8], pos: usize, structure: Structure, block: Option<u64>) -> Self {
        Dec { buf, pos, structure, block }
    }
    /// The next byte to read.
    pub fn pos(&self) -> usize {
        self.pos
    }
    /// Bytes left to read.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }
    /// An error for this structure and block.
    pub fn err(&self, reason: impl Into<String>) -> Error {
        Error::corrupt(self.structure, self.block, reason)
    }
    /// The next `n` bytes; an error if fewer are left.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.err(format!("field at offset {} runs past the end", self.pos)))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    /// Moves to byte `to`, which must not be behind the position or past the end.
    pub fn skip_to(&mut self, to: usize) -> Result<()> {
        if to < self.pos || to > self.buf.len() {
            return Err(self.err(format!("bad field offset {to}")));
        }
        self.pos = to;
        Ok(())
    }
    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    /// Reads a little-endian u16.
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.bytes(2)?.try_into().expect("2 bytes")))
    }
    /// Reads a little-endian u32.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4 bytes")))
    }
    /// Reads a little-endian u64.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8 bytes")))
    }
    /// Reads a little-endian i64.
    pub fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.bytes(8)?.try_into().expect("8 bytes")))
    }
}

/// The 16-byte header that starts NAT, SIT, SSA, dentry and checkpoint payload blocks:
/// magic, crc32c, and two structure-specific words (usually an index and a version).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    /// The structure's magic.
    pub magic: u32,
    /// First structure-specific word (usually an index).
    pub a: u32,
    /// Second structure-specific word (usually a version).
    pub b: u32,
}

/// Bytes of a `BlockHeader`.
pub const HEADER_LEN: usize = 16;

impl BlockHeader {
    /// Writes the header at the start of `block` (the crc is sealed later, over the whole block).
    pub fn write(&self, block: &mut [u8]) {
        let mut e = Enc::new(block);
        e.u32(self.magic);
        e.u32(0); // crc, filled by seal
        e.u32(self.a);
        e.u32(self.b);
    }

    /// Verifies magic, crc and length of a whole block and returns its header words.
    pub fn check(block: &[u8], magic: u32, structure: Structure, addr: Option<u64>) -> Result<BlockHeader> {
        if block.len() != crate::device::BLOCK_SIZE {
            return Err(Error::corrupt(
                structure,
                addr,
                format!("block is {} bytes, expected {}", block.len(), crate::device::BLOCK_SIZE),
            ));
        }
        verify_seal(block, 0, magic, CRC_OFFSET, structure, addr)?;
        let mut d = Dec::at(block, 8, structure, addr);
        Ok(BlockHeader { magic, a: d.u32()?, b: d.u32()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dec_rejects_out_of_bounds_without_panic() {
        let buf = [1u8, 2, 3];
        let mut d = Dec::new(&buf, Structure::Node, Some(7));
        assert!(d.u16().is_ok());
        let e = d.u32().unwrap_err();
        assert!(e.to_string().contains("node block at block 7"), "{e}");
        let mut d = Dec::new(&buf, Structure::Node, None);
        assert!(d.bytes(usize::MAX).is_err());
        assert!(d.skip_to(4).is_err());
    }

    #[test]
    fn seal_detects_every_single_bit_flip() {
        let mut b = vec![0u8; 64];
        for (i, x) in b.iter_mut().enumerate() {
            *x = i as u8;
        }
        b[..4].copy_from_slice(&0xABCD_0123u32.to_le_bytes());
        seal(&mut b, CRC_OFFSET);
        verify_seal(&b, 0, 0xABCD_0123, CRC_OFFSET, Structure::Nat, None).unwrap();
        for bit in 0..b.len() * 8 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(verify_seal(&c, 0, 0xABCD_0123, CRC_OFFSET, Structure::Nat, None).is_err());
        }
    }
}
