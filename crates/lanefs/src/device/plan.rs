//! Validation and run planning shared by every back end.
//!
//! A batch is checked whole before any byte moves, so a bad request never leaves half a batch on
//! disk. Then the requests are sorted by address and adjacent ones are grouped into runs: a run
//! becomes one vectored system call (sync) or one SQE (io_uring), which is where scatter-gather
//! pays off.

use std::io;
use std::ops::Range;

use super::BLOCK_SIZE;

// The mask tests below need a power-of-two block size.
const _: () = assert!(BLOCK_SIZE.is_power_of_two());

/// Most iovecs one `preadv`/`pwritev` (or READV/WRITEV SQE) accepts on Linux (`UIO_MAXIOV`).
pub(crate) const IOV_MAX: usize = 1024;

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Checks one request of `len` bytes at block `addr` and returns its length in blocks.
pub(crate) fn check_request(addr: u64, len: usize, block_count: u64) -> io::Result<u64> {
    if len == 0 || len & (BLOCK_SIZE - 1) != 0 {
        return Err(invalid(format!(
            "request at block {addr}: length {len} is not a non-zero multiple of {BLOCK_SIZE}"
        )));
    }
    let blocks = (len / BLOCK_SIZE) as u64;
    match addr.checked_add(blocks) {
        Some(end) if end <= block_count => Ok(blocks),
        _ => Err(invalid(format!(
            "request of {blocks} block(s) at block {addr} runs past the device end ({block_count} blocks)"
        ))),
    }
}

/// A group of requests at adjacent addresses: `members` indexes into [`Plan::order`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    /// First block of the run.
    pub addr: u64,
    pub members: Range<usize>,
}

/// The requests of a batch in address order, grouped into runs.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Request indices sorted by address (stable: equal addresses keep batch order).
    pub order: Vec<usize>,
    pub runs: Vec<Run>,
}

/// Validates every request (`(addr, len_bytes)`) and groups adjacent ones into runs of at most
/// [`IOV_MAX`] members.
///
/// Writes may not overlap: two writes to one block in one batch would land in an order that
/// depends on the back end (io_uring completes runs in any order), so the batch is refused rather
/// than made nondeterministic. Reads may overlap freely.
pub(crate) fn plan(reqs: &[(u64, usize)], block_count: u64, is_write: bool) -> io::Result<Plan> {
    let mut blocks = Vec::with_capacity(reqs.len());
    for &(addr, len) in reqs {
        blocks.push(check_request(addr, len, block_count)?);
    }
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by_key(|&i| reqs[i].0);

    let mut runs: Vec<Run> = Vec::with_capacity(reqs.len());
    let mut prev_end: Option<u64> = None;
    for (pos, &i) in order.iter().enumerate() {
        let addr = reqs[i].0;
        if is_write {
            if let Some(end) = prev_end {
                if addr < end {
                    return Err(invalid(format!("two writes of one batch overlap at block {addr}")));
                }
            }
        }
        let extend = match (runs.last(), prev_end) {
            (Some(run), Some(end)) => end == addr && run.members.len() < IOV_MAX,
            _ => false,
        };
        if extend {
            if let Some(run) = runs.last_mut() {
                run.members.end = pos + 1;
            }
        } else {
            runs.push(Run { addr, members: pos..pos + 1 });
        }
        // Cannot overflow: check_request proved addr + blocks <= block_count.
        prev_end = Some(addr + blocks[i]);
    }
    Ok(Plan { order, runs })
}

/// Validates a write batch without planning runs (for back ends that do not merge).
pub fn check_writes(reqs: &[super::WriteReq<'_>], block_count: u64) -> io::Result<()> {
    let shape: Vec<(u64, usize)> = reqs.iter().map(|r| (r.addr, r.data.len())).collect();
    plan(&shape, block_count, true).map(|_| ())
}

/// Validates a read batch without planning runs.
pub(crate) fn check_reads(reqs: &[super::ReadReq<'_>], block_count: u64) -> io::Result<()> {
    for r in reqs {
        check_request(r.addr, r.buf.len(), block_count)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = BLOCK_SIZE;

    #[test]
    fn rejects_bad_lengths_and_ranges() {
        assert!(check_request(0, 0, 10).is_err());
        assert!(check_request(0, 100, 10).is_err());
        assert!(check_request(0, B + 1, 10).is_err());
        assert!(check_request(9, 2 * B, 10).is_err());
        assert!(check_request(10, B, 10).is_err());
        assert!(check_request(u64::MAX, B, u64::MAX).is_err());
        assert_eq!(check_request(8, 2 * B, 10).unwrap(), 2);
        let e = check_request(0, 7, 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn merges_adjacent_requests_in_address_order() {
        // 7, 3(2 blocks), 5, 6, 20 -> runs [3,4][5][6][7] merged: 3..5 + 5 + 6 + 7 = one run, 20.
        let reqs = [(7, B), (3, 2 * B), (5, B), (20, B), (6, B)];
        let p = plan(&reqs, 100, true).unwrap();
        assert_eq!(p.order, vec![1, 2, 4, 0, 3]);
        assert_eq!(p.runs, vec![Run { addr: 3, members: 0..4 }, Run { addr: 20, members: 4..5 }]);
    }

    #[test]
    fn overlapping_writes_rejected_but_reads_allowed() {
        let reqs = [(3, 2 * B), (4, B)];
        assert!(plan(&reqs, 100, true).is_err());
        let p = plan(&reqs, 100, false).unwrap();
        assert_eq!(p.runs.len(), 2);
        let dup = [(9, B), (9, B)];
        assert!(plan(&dup, 100, true).is_err());
        assert_eq!(plan(&dup, 100, false).unwrap().runs.len(), 2);
    }

    #[test]
    fn runs_are_capped_at_iov_max() {
        let reqs: Vec<(u64, usize)> = (0..(IOV_MAX as u64 * 2 + 5)).map(|a| (a, B)).collect();
        let p = plan(&reqs, 1 << 20, true).unwrap();
        assert_eq!(p.runs.len(), 3);
        assert_eq!(p.runs[1].addr, IOV_MAX as u64);
        assert!(p.runs.iter().all(|r| r.members.len() <= IOV_MAX));
    }
}
