//! The region header: the first 4 KiB of a region file, written once when the region is created
//! and never changed afterwards (mutable state lives in the data area, in words of its own).
//!
//! Layout (little-endian, like every structure in `format/`):
//!
//! | offset | size | field                                                        |
//! |--------|------|--------------------------------------------------------------|
//! | 0      | 4    | magic `"LNPM"`                                               |
//! | 4      | 4    | crc32c of bytes 0..4096 with this field left out             |
//! | 8      | 4    | version (1)                                                  |
//! | 12     | 4    | header length in bytes (4096): where the data area starts    |
//! | 16     | 8    | region size in bytes (the file's length)                     |
//! | 24     | 16   | UUID of the image the region is bound to (its superblock's)  |
//! | 40     | 8    | seconds since the epoch at creation                          |
//! | 48     | 4048 | zero                                                         |
//!
//! Decoding checks magic, checksum, version, header length, and that the size is a whole number
//! of pages no smaller than [`MIN_REGION_SIZE`]; the caller compares size and UUID with the file
//! and the image. Every failure is a typed [`Error::Region`] naming the file.

use crate::error::{Error, RegionFault, Result};
use crate::format::codec::{crc_skipping, seal, Enc, CRC_OFFSET};
use std::path::Path;

/// "LNPM" little-endian.
pub const REGION_MAGIC: u32 = u32::from_le_bytes(*b"LNPM");
/// Version of the region's layout.
pub const REGION_VERSION: u32 = 1;
/// Bytes of the header; the data area starts here.
pub const HEADER_BYTES: usize = 4096;
/// The smallest region accepted: the header and room for a useful data area.
pub const MIN_REGION_SIZE: u64 = 1 << 20;
/// The largest region accepted (a bound, so a corrupt header cannot ask for an absurd mapping).
pub const MAX_REGION_SIZE: u64 = 1 << 40;
/// Regions are a whole number of these.
pub const REGION_ALIGN: u64 = 4096;

/// The decoded header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionHeader {
    /// Size of the region in bytes.
    pub size: u64,
    /// UUID of the image the region belongs to.
    pub uuid: [u8; 16],
    /// When the region was created (seconds since the epoch).
    pub created: u64,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Checks a size asked for or found: whole pages, within the bounds.
pub fn check_size(path: &Path, size: u64) -> Result<()> {
    if size < MIN_REGION_SIZE {
        return Err(Error::region(
            path,
            RegionFault::TooSmall,
            format!("size {size} bytes is below the minimum of {MIN_REGION_SIZE}"),
        ));
    }
    if size > MAX_REGION_SIZE || !size.is_multiple_of(REGION_ALIGN) {
        return Err(Error::region(
            path,
            RegionFault::Corrupt,
            format!("size {size} bytes is not a whole number of 4 KiB pages up to {MAX_REGION_SIZE}"),
        ));
    }
    Ok(())
}

impl RegionHeader {
    /// The header's bytes, checksummed.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_BYTES];
        let mut e = Enc::new(&mut b);
        e.u32(REGION_MAGIC);
        e.u32(0); // crc, filled by seal
        e.u32(REGION_VERSION);
        e.u32(HEADER_BYTES as u32);
        e.u64(self.size);
        e.bytes(&self.uuid);
        e.u64(self.created);
        seal(&mut b, CRC_OFFSET);
        b
    }

    /// Decodes the header block of the region file at `path`.
    pub fn decode(b: &[u8], path: &Path) -> Result<RegionHeader> {
        let fault = |f: RegionFault, why: String| Error::region(path, f, why);
        if b.len() != HEADER_BYTES {
            return Err(fault(
                RegionFault::Truncated,
                format!("header is {} bytes, expected {HEADER_BYTES}", b.len()),
            ));
        }
        let magic = le32(b, 0);
        if magic != REGION_MAGIC {
            return Err(fault(
                RegionFault::NotRegion,
                format!("not a lanefs region (magic {magic:#010x}, expected {REGION_MAGIC:#010x})"),
            ));
        }
        let (stored, actual) = (le32(b, CRC_OFFSET), crc_skipping(b, CRC_OFFSET));
        if stored != actual {
            return Err(fault(
                RegionFault::Corrupt,
                format!("header checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"),
            ));
        }
        let version = le32(b, 8);
        if version != REGION_VERSION {
            return Err(fault(
                RegionFault::NotRegion,
                format!("region version {version} (this lanefs reads version {REGION_VERSION})"),
            ));
        }
        let header_bytes = le32(b, 12);
        if header_bytes as usize != HEADER_BYTES {
            return Err(fault(
                RegionFault::Corrupt,
                format!("header length {header_bytes}, expected {HEADER_BYTES}"),
            ));
        }
        let size = le64(b, 16);
        check_size(path, size)?;
        let uuid: [u8; 16] = b[24..40].try_into().expect("16 bytes");
        Ok(RegionHeader { size, uuid, created: le64(b, 40) })
    }
}
