//! The io_uring back end: one submission per batch.
//!
//! Every `unsafe` block of the file-device path lives here: io_uring reads our iovecs and the
//! buffers behind them through raw pointers after `push` returns, so soundness rests on one rule
//! that this module keeps: **no batch function returns while the kernel may still touch its
//! memory**. Every pushed SQE is reaped before return, on success and on every error path.
//! (Also here, for the same reason: [`blk_discard`], the one ioctl of the device path that
//! rustix has no safe wrapper for.)
//!
//! Rings: a small pool, one ring per CPU slot (at most 16), each behind its own mutex. One ring
//! behind one mutex would serialise every lane's commit for the whole device latency (the lock is
//! held across `submit_and_wait`), which defeats lanes; one ring per thread would grow without
//! bound with FUSE and application threads (each ring pins memory and an fd). A thread starts at
//! its home slot and takes the first free ring, so concurrent batches overlap on the device.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::sync::rank::{Mutex, MutexGuard, Rank};
use io_uring::{opcode, squeue, types, IoUring};

use super::aligned::{is_direct_aligned, AlignedBuf};
use super::plan::Plan;
use super::{ReadReq, WriteReq, BLOCK_SIZE};

/// SQ entries per ring. A 64-block scattered batch fits in one submission; larger batches go in
/// chunks of this many SQEs (the CQ is twice as large, so it never overflows).
const RING_ENTRIES: u32 = 128;
/// Most rings per device.
const MAX_SLOTS: usize = 16;
/// Resubmissions after EINTR/EAGAIN completions before a batch gives up.
const MAX_RETRIES: usize = 10_000;

static NEXT_THREAD_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static HOME_SLOT: usize = NEXT_THREAD_SLOT.fetch_add(1, Ordering::Relaxed);
}

fn build_ring() -> io::Result<IoUring> {
    // A forked child must not inherit the ring mappings (the FUSE daemon may fork).
    // COOP_TASKRUN spares an IPI per completion; kernels before 5.19 refuse it, so retry plain.
    match IoUring::builder().dontfork().setup_coop_taskrun().build(RING_ENTRIES) {
        Ok(r) => Ok(r),
        Err(_) => IoUring::builder().dontfork().build(RING_ENTRIES),
    }
}

/// A pool of io_uring instances shared by the threads that use one device.
pub(crate) struct UringBackend {
    rings: Box<[Mutex<IoUring>]>,
}

impl std::fmt::Debug for UringBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringBackend").field("rings", &self.rings.len()).finish()
    }
}

/// One READV/WRITEV in flight: a run of adjacent requests, possibly partly done.
struct Op {
    /// Byte offset on the device of the first byte not yet transferred.
    offset: u64,
    /// iovecs of the run; entries before `start` are done, `iov[start]` may be partly done.
    iov: Vec<libc::iovec>,
    start: usize,
    remaining: usize,
}

impl Op {
    /// Skips `n` bytes that the kernel reported done.
    fn advance(&mut self, n: usize) {
        let n = n.min(self.remaining);
        self.remaining -= n;
        self.offset += n as u64;
        let mut left = n;
        while left > 0 && self.start < self.iov.len() {
            let v = &mut self.iov[self.start];
            if left >= v.iov_len {
                left -= v.iov_len;
                self.start += 1;
            } else {
                v.iov_base = (v.iov_base as *mut u8).wrapping_add(left) as *mut libc::c_void;
                v.iov_len -= left;
                left = 0;
            }
        }
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY))
}

impl UringBackend {
    /// Sets up the pool; fails if the kernel (or a seccomp policy) refuses io_uring.
    pub(crate) fn new() -> io::Result<Self> {
        let slots = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, MAX_SLOTS);
        let mut rings = Vec::with_capacity(slots);
        for _ in 0..slots {
            rings.push(Mutex::new(Rank::Device, build_ring()?));
        }
        Ok(UringBackend { rings: rings.into_boxed_slice() })
    }

    pub(crate) fn ring_count(&self) -> usize {
        self.rings.len()
    }

    fn acquire(&self) -> MutexGuard<'_, IoUring> {
        let n = self.rings.len();
        let home = HOME_SLOT.with(|h| *h) % n;
        for k in 0..n {
            if let Some(g) = self.rings[(home + k) % n].try_lock() {
                return g;
            }
        }
        self.rings[home].lock()
    }

    /// Writes a validated, planned batch. With `direct`, unaligned caller buffers are copied into
    /// one aligned bounce buffer first.
    pub(crate) fn write_batch(
        &self,
        fd: RawFd,
        reqs: &[WriteReq<'_>],
        plan: &Plan,
        direct: bool,
    ) -> io::Result<()> {
        let bounce_len: usize =
            reqs.iter().filter(|r| direct && !is_direct_aligned(r.data.as_ptr())).map(|r| r.data.len()).sum();
        let mut bounce = AlignedBuf::new(bounce_len)?;
        let mut src: Vec<*const u8> = Vec::with_capacity(reqs.len());
        // Carve disjoint pieces out of one borrow of `bounce`, so every pointer stays valid.
        let mut rest: &mut [u8] = &mut bounce;
        for r in reqs {
            if direct && !is_direct_aligned(r.data.as_ptr()) {
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(r.data.len());
                piece.copy_from_slice(r.data);
                src.push(piece.as_ptr());
                rest = tail;
            } else {
                src.push(r.data.as_ptr());
            }
        }
        let mut ops = build_ops(plan, |i| (src[i] as *mut u8, reqs[i].data.len()));
        // SAFETY: every iovec points into a caller's `data` slice (borrowed for this whole call)
        // or into `bounce` (a local that outlives the call below); the kernel only reads them, and
        // `run_ops` returns only after every SQE has completed.
        unsafe { self.run_ops(fd, &mut ops, true) }
    }

    /// Reads a validated, planned batch. With `direct`, unaligned caller buffers are read through
    /// one aligned bounce buffer and copied out after every read completed.
    pub(crate) fn read_batch(
        &self,
        fd: RawFd,
        reqs: &mut [ReadReq<'_>],
        plan: &Plan,
        direct: bool,
    ) -> io::Result<()> {
        let bounced: Vec<bool> = reqs.iter().map(|r| direct && !is_direct_aligned(r.buf.as_ptr())).collect();
        let bounce_len: usize = reqs.iter().zip(&bounced).filter(|(_, &b)| b).map(|(r, _)| r.buf.len()).sum();
        let mut bounce = AlignedBuf::new(bounce_len)?;
        let mut dst: Vec<(*mut u8, usize)> = Vec::with_capacity(reqs.len());
        let mut bounce_off = Vec::with_capacity(reqs.len());
        let mut used = 0;
        let bounce_base = bounce.as_mut_ptr();
        for (r, &b) in reqs.iter_mut().zip(&bounced) {
            let len = r.buf.len();
            if b {
                dst.push((bounce_base.wrapping_add(used), len));
                bounce_off.push(used);
                used += len;
            } else {
                dst.push((r.buf.as_mut_ptr(), len));
                bounce_off.push(0);
            }
        }
        let mut ops = build_ops(plan, |i| dst[i]);
        // SAFETY: every iovec points into a caller's `buf` (exclusively borrowed for this call and
        // not touched until `run_ops` returns) or into `bounce` (a local, not otherwise accessed
        // until `run_ops` returns); each byte range is targeted by exactly one iovec because the
        // `&mut` buffers cannot alias and bounce slices are disjoint. `run_ops` returns only after
        // every SQE has completed, so no kernel write outlives these borrows.
        unsafe { self.run_ops(fd, &mut ops, false)? };
        for ((r, &b), &off) in reqs.iter_mut().zip(&bounced).zip(&bounce_off) {
            if b {
                let len = r.buf.len();
                r.buf.copy_from_slice(&bounce[off..off + len]);
            }
        }
        Ok(())
    }

    /// Submits every op, resubmits short and interrupted ones, and reaps every completion.
    ///
    /// # Safety
    /// Every iovec in `ops` must point to memory valid for the transfer direction (readable for
    /// writes, writable and not otherwise accessed for reads) until this function returns.
    unsafe fn run_ops(&self, fd: RawFd, ops: &mut [Op], write: bool) -> io::Result<()> {
        let mut ring = self.acquire();
        let mut queue: VecDeque<usize> = (0..ops.len()).collect();
        let mut inflight = 0usize;
        let mut first_err: Option<io::Error> = None;
        let mut retries = 0usize;
        let mut enter_failures = 0usize;

        loop {
            if first_err.is_none() {
                // Dropping `sq` publishes the new tail to the kernel.
                let mut sq = ring.submission();
                while let Some(&i) = queue.front() {
                    let entry = sqe_for(fd, &ops[i], write).user_data(i as u64);
                    // SAFETY: the SQE refers to `ops[i].iov[start..]`, a heap array that is not
                    // resized or freed until the op's completion is reaped below, and to buffers
                    // the caller guarantees live until we return; we return only when
                    // `inflight == 0`, i.e. after every pushed SQE completed.
                    if unsafe { sq.push(&entry) }.is_err() {
                        break; // SQ full: the rest goes in the next chunk.
                    }
                    queue.pop_front();
                    inflight += 1;
                }
            }
            if inflight == 0 {
                break;
            }
            if let Err(e) = ring.submit_and_wait(inflight) {
                // Pushed SQEs stay ours until reaped: never return with any in flight.
                enter_failures += 1;
                if !is_transient(&e) && first_err.is_none() {
                    first_err = Some(e);
                }
                if enter_failures > MAX_RETRIES {
                    // Returning now would let the kernel DMA into memory we hand back to the
                    // caller; the ring is unusable, so stopping is the only sound choice.
                    eprintln!("lanefs: io_uring wait keeps failing with I/O in flight; aborting");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(1));
            } else {
                enter_failures = 0;
            }
            for cqe in ring.completion() {
                inflight = inflight.saturating_sub(1);
                let Some(op) = ops.get_mut(cqe.user_data() as usize) else {
                    continue;
                };
                let res = cqe.result();
                if res < 0 {
                    let err = io::Error::from_raw_os_error(-res);
                    if is_transient(&err) && retries < MAX_RETRIES {
                        retries += 1;
                        queue.push_back(cqe.user_data() as usize);
                    } else if first_err.is_none() {
                        first_err = Some(err);
                    }
                    continue;
                }
                let n = res as usize;
                if n == 0 && op.remaining > 0 {
                    if first_err.is_none() {
                        first_err = Some(if write {
                            io::Error::new(io::ErrorKind::WriteZero, "io_uring write wrote 0 bytes")
                        } else {
                            io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                format!("io_uring read hit end of file at byte {}", op.offset),
                            )
                        });
                    }
                    continue;
                }
                op.advance(n);
                if op.remaining > 0 {
                    queue.push_back(cqe.user_data() as usize);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn build_ops(plan: &Plan, mut buf: impl FnMut(usize) -> (*mut u8, usize)) -> Vec<Op> {
    plan.runs
        .iter()
        .map(|run| {
            let iov: Vec<libc::iovec> = plan.order[run.members.clone()]
                .iter()
                .map(|&i| {
                    let (base, len) = buf(i);
                    libc::iovec { iov_base: base as *mut libc::c_void, iov_len: len }
                })
                .collect();
            let remaining = iov.iter().map(|v| v.iov_len).sum();
            Op { offset: run.addr * BLOCK_SIZE as u64, iov, start: 0, remaining }
        })
        .collect()
}

fn sqe_for(fd: RawFd, op: &Op, write: bool) -> squeue::Entry {
    let iov = &op.iov[op.start..];
    // At most IOV_MAX (1024) iovecs per run, so the count fits in u32.
    let n = iov.len() as u32;
    if write {
        opcode::Writev::new(types::Fd(fd), iov.as_ptr(), n).offset(op.offset).build()
    } else {
        opcode::Readv::new(types::Fd(fd), iov.as_ptr(), n).offset(op.offset).build()
    }
}

/// BLKDISCARD: tells the block device `fd` that `len` bytes at byte `start` hold nothing (TRIM).
pub(super) fn blk_discard(fd: std::os::fd::BorrowedFd<'_>, start: u64, len: u64) -> io::Result<()> {
    use rustix::ioctl::{ioctl, opcode, Setter};
    // linux/fs.h: BLKDISCARD is _IO(0x12, 119), taking a pointer to u64[2] {start, len}.
    const BLKDISCARD: rustix::ioctl::Opcode = opcode::none(0x12, 119);
    // SAFETY: BLKDISCARD reads exactly a u64[2] through the pointer, which Setter points at its
    // own copy of `range`, alive for the whole call; the kernel keeps no reference after it.
    unsafe { ioctl(fd, Setter::<BLKDISCARD, [u64; 2]>::new([start, len])) }.map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_skips_whole_and_partial_iovecs() {
        let mut a = [0u8; 8];
        let mut b = [0u8; 8];
        let mut op = Op {
            offset: 100,
            iov: vec![
                libc::iovec { iov_base: a.as_mut_ptr().cast(), iov_len: 8 },
                libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: 8 },
            ],
            start: 0,
            remaining: 16,
        };
        op.advance(3);
        assert_eq!((op.start, op.iov[0].iov_len, op.remaining, op.offset), (0, 5, 13, 103));
        op.advance(5);
        assert_eq!((op.start, op.remaining, op.offset), (1, 8, 108));
        op.advance(6);
        assert_eq!((op.start, op.iov[1].iov_len, op.remaining), (1, 2, 2));
        assert_eq!(op.iov[1].iov_base as usize, b.as_ptr() as usize + 6);
        op.advance(99);
        assert_eq!((op.start, op.remaining), (2, 0));
    }
}
