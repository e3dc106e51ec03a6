//! Loads, stores and persists on a mapped region, and what it tells about itself.
//!
//! Every access goes through `AtomicU64` words of the mapping, bounds-checked first, so
//! concurrent callers never race in the Rust sense; every store and persist passes the mount's
//! shutdown gate. A store is not durable until a persist covering it returns.

use crate::error::{Error, RegionFault, Result};
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{
    io_fault, persist, Mapping, PersistMethod, PmemCrash, PmemRegion, RegionHeader, RegionRecording,
    HEADER_BYTES,
};

impl PmemRegion {
    /// The whole mapping as words.
    pub(super) fn words(&self) -> &[AtomicU64] {
        // What `open` checked before mapping, and the slice below relies on.
        debug_assert!(
            self.len >= HEADER_BYTES && self.len.is_multiple_of(4096),
            "a mapping of {} bytes",
            self.len
        );
        // SAFETY: the mapping is `len` bytes (a multiple of 4096) at a page-aligned address, so
        // it is `len / 8` properly aligned u64s, and AtomicU64 has the layout of u64. It stays
        // mapped until `self` drops, which outlives the borrow. Every access in this process
        // goes through these atomics, so no access races with a non-atomic one.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().cast::<AtomicU64>(), self.len / 8) }
    }

    /// The region's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Total bytes, header included.
    pub fn size(&self) -> usize {
        self.len
    }

    /// The header read at open.
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

    /// How the region is mapped (DAX or page cache).
    pub fn mapping(&self) -> Mapping {
        self.mapping
    }

    /// How stores to the region are made durable.
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
            // Each round stores at least one byte of a word inside the checked range.
            debug_assert!(n >= 1 && wi < words.len(), "write of {n} bytes at word {wi}");
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
        debug_assert_eq!(pos, offset + data.len(), "region write of {} bytes at {offset}", data.len());
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
    pub(super) fn read_raw(&self, offset: usize, buf: &mut [u8]) {
        let words = self.words();
        // Unchecked for the caller, not unbounded: the bytes lie in the mapping.
        debug_assert!(
            offset.checked_add(buf.len()).is_some_and(|e| e <= self.len),
            "read {offset}+{}",
            buf.len()
        );
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
        debug_assert_eq!(pos, offset + buf.len(), "region read of {} bytes at {offset}", buf.len());
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
                // The msyncs below cover page-aligned, disjoint runs inside the mapping.
                debug_assert!(
                    merged.iter().all(|&(s, e)| s.is_multiple_of(page) && s < e && e <= self.len)
                        && merged.windows(2).all(|w| w[0].1 < w[1].0),
                    "msync runs {merged:?}"
                );
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
