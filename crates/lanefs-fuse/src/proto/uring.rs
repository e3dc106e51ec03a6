//! FUSE over io_uring (Linux 6.14 and later, with `/sys/module/fuse/parameters/enable_uring`).
//!
//! The kernel keeps one request queue per possible CPU and puts each request on the queue of
//! the CPU its caller runs on. A server registers ring entries on every queue (the kernel
//! switches to the rings only once each queue has one); an entry is a header buffer (the in
//! header, the fixed argument, and a commit id and payload size) and a payload buffer (names,
//! data). A registration completes when a request has been copied into the entry; the server
//! answers by writing the out header and the reply into the same buffers and sending
//! COMMIT_AND_FETCH, which hands the reply over and waits for the next request in one
//! io_uring_enter.
//!
//! Here every queue gets `per_queue` threads pinned to its CPU, each with an io_uring of its own
//! holding one entry: a thread serves one request at a time, synchronously, as a /dev/fuse
//! worker does, so a request that blocks (an fsync) holds up only its thread, and the kernel
//! hands the CPU's next request to another thread's entry. FORGET and INTERRUPT still come
//! through /dev/fuse, so the session keeps its /dev/fuse workers beside the rings.
//!
//! `unsafe` here: the submission entries are written as the kernel's bytes (the crate's
//! builder cannot set the iovec count a registration needs), and the kernel is handed the
//! addresses of the entry's buffers, which must stay put and alive while it may write them.

#![allow(unsafe_code)]

use super::abi;
use super::reply::Sink;
use super::request::Header;
use io_uring::{cqueue, squeue, IoUring};
use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;

/// What serves one request: its header, fixed argument and rest, and where the reply goes.
pub type Serve<'a> = dyn Fn(&Header, &[u8], &[u8], &dyn Sink) + 'a;

/// `IORING_OP_URING_CMD`.
const OP_URING_CMD: u8 = 46;
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: in_out[128], op_in[128], `struct fuse_uring_ent_in_out`.
const HEADER_LEN: usize = 128 + 128 + 32;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;

/// The kernel's number of request queues: one per possible CPU.
pub fn queue_count() -> usize {
    // "0-1", "0", "0-3,8-11": the highest CPU number plus one.
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| s.trim().split([',', '-']).filter_map(|n| n.parse::<usize>().ok()).max())
        .map_or(1, |m| m + 1)
}

/// Whether the administrator has let the kernel offer FUSE over io_uring.
pub fn enabled_by_kernel() -> Option<bool> {
    let v = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").ok()?;
    Some(matches!(v.trim(), "Y" | "y" | "1"))
}

/// One ring entry's buffers: where the kernel writes a request and reads its reply.
struct Buffers {
    header: Box<[u8; HEADER_LEN]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

/// One thread's io_uring with its one entry on queue `qid`.
pub struct RingWorker {
    // Dropped first: closing the ring cancels the entry's command before its buffers go.
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    bufs: Buffers,
    fd: RawFd,
    qid: u16,
    /// A command is in the kernel's hands: its buffers must outlive it.
    in_kernel: bool,
}

impl RingWorker {
    /// A ring on connection `fd` (a /dev/fuse descriptor) for queue `qid`, with a payload
    /// buffer of `payload` bytes (at least the kernel's largest request).
    pub fn new(fd: RawFd, qid: u16, payload: usize) -> io::Result<RingWorker> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
        let mut header = Box::new([0u8; HEADER_LEN]);
        let mut payload = vec![0u8; payload].into_boxed_slice();
        let iov = Box::new([
            libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: HEADER_LEN },
            libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
        ]);
        Ok(RingWorker { ring, bufs: Buffers { header, payload, iov }, fd, qid, in_kernel: false })
    }

    /// The 128 bytes of a FUSE uring command on this worker's entry.
    fn command(&self, cmd: u32, commit_id: u64) -> [u8; 128] {
        let mut sqe = [0u8; 128];
        sqe[0] = OP_URING_CMD;
        sqe[4..8].copy_from_slice(&self.fd.to_le_bytes());
        sqe[8..12].copy_from_slice(&cmd.to_le_bytes());
        if cmd == CMD_REGISTER {
            // addr: the two iovecs (header, payload); len: their count.
            sqe[16..24].copy_from_slice(&(self.bufs.iov.as_ptr() as u64).to_le_bytes());
            sqe[24..28].copy_from_slice(&2u32.to_le_bytes());
        }
        // The command area (`struct fuse_uring_cmd_req`): flags, commit_id, qid.
        sqe[48 + 8..48 + 16].copy_from_slice(&commit_id.to_le_bytes());
        sqe[48 + 16..48 + 18].copy_from_slice(&self.qid.to_le_bytes());
        sqe
    }

    /// Submits `cmd` and waits for its completion: 0 once a request is in the buffers, or a
    /// negative errno (the connection ended, or the kernel refused). One io_uring_enter.
    fn submit(&mut self, cmd: u32, commit_id: u64) -> io::Result<i32> {
        self.push(cmd, commit_id)?;
        self.wait()
    }

    /// `submit`, calling `submitted` once the kernel has the command and before waiting (a
    /// second io_uring_enter: for registrations only).
    fn submit_then(&mut self, cmd: u32, commit_id: u64, submitted: &mut dyn FnMut()) -> io::Result<i32> {
        self.push(cmd, commit_id)?;
        loop {
            match self.ring.submit() {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
        submitted();
        self.wait()
    }

    /// Puts `cmd` on the submission queue; from here its buffers are the kernel's.
    fn push(&mut self, cmd: u32, commit_id: u64) -> io::Result<()> {
        let bytes = self.command(cmd, commit_id);
        // SAFETY: `Entry128` is `#[repr(C)]` over the kernel's 128-byte SQE (a 64-byte
        // `io_uring_sqe` and 64 more command bytes), plain integers for which every bit pattern
        // is valid; the sizes match, which `transmute` checks.
        let entry: squeue::Entry128 = unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) };
        // SAFETY: the entry names this worker's buffers (header and payload, boxed, so they do
        // not move), which stay alive while the command is in the kernel: `in_kernel` keeps
        // them from being freed (see Drop) until its completion is seen.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("the ring's submission queue is full"))?;
        self.in_kernel = true;
        Ok(())
    }

    /// Waits for the command in the kernel's hands to complete (submitting it if it is not).
    fn wait(&mut self) -> io::Result<i32> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            if let Some(c) = self.ring.completion().next() {
                self.in_kernel = false;
                return Ok(c.result());
            }
        }
    }

    /// Serves requests until the connection ends: `serve(header, arg, rest, sink)` answers
    /// each one. `registered` is called once the entry is first in the kernel's hands (from
    /// then on the kernel may give it requests).
    pub fn run(&mut self, serve: &Serve<'_>, registered: &mut dyn FnMut()) -> io::Result<()> {
        let reply = EntryReply::default();
        let mut r = self.submit_then(CMD_REGISTER, 0, registered)?;
        if r < 0 && !connection_ended(-r) {
            // Said at once: until every queue has an entry, the kernel serves all through
            // /dev/fuse, slower but whole.
            eprintln!(
                "lanefs: FUSE over io_uring: the kernel refused queue {}'s entry: {}; requests stay on /dev/fuse",
                self.qid,
                io::Error::from_raw_os_error(-r)
            );
        }
        // Registrations in a row that failed: the entry is not in the kernel's hands.
        let mut refused = 0;
        loop {
            match -r {
                0 => {
                    refused = 0;
                    let commit_id = self.take_request(&reply, serve);
                    r = self.submit(CMD_COMMIT_AND_FETCH, commit_id)?;
                }
                e if connection_ended(e) => return Ok(()),
                // The kernel no longer knows the request (it ended it, as it does when the
                // connection goes down), or refused the command: the entry is out of the ring.
                // Register it again; a second refusal in a row is the answer.
                e if refused == 0 => {
                    refused += 1;
                    if e != libc::ENOENT {
                        eprintln!(
                            "lanefs: FUSE ring queue {}: {}",
                            self.qid,
                            io::Error::from_raw_os_error(e)
                        );
                    }
                    r = self.submit(CMD_REGISTER, 0)?;
                }
                e => return Err(io::Error::from_raw_os_error(e)),
            }
        }
    }

    /// Serves the request in the buffers and puts its reply there; the commit id to answer.
    fn take_request(&mut self, reply: &EntryReply, serve: &Serve<'_>) -> u64 {
        let hb = &self.bufs.header;
        let mut ent = abi::Bytes::new(&hb[ENT_IN_OUT..]);
        let (_flags, commit_id, payload_sz) =
            (ent.u64().unwrap_or(0), ent.u64().unwrap_or(0), ent.u32().unwrap_or(0));
        reply.clear();
        if let Some(h) = Header::parse(&hb[..abi::IN_HEADER_LEN]) {
            let arg = &hb[OP_IN..OP_IN + abi::arg_size(h.opcode).min(128)];
            let rest = h.without_extensions(self.bufs.payload.get(..payload_sz as usize).unwrap_or(&[]));
            reply.unique.set(h.unique);
            serve(&h, arg, rest, reply);
        }
        self.put_reply(reply);
        commit_id
    }

    /// Writes the out header, the reply and its size into the entry.
    fn put_reply(&mut self, reply: &EntryReply) {
        let body = reply.body.borrow();
        // Every request on a ring wants an answer; one that got none fails.
        let error = if reply.sent.get() { reply.error.get() } else { -libc::EIO };
        debug_assert!(body.len() <= self.bufs.payload.len(), "a reply larger than the payload buffer");
        let n = body.len().min(self.bufs.payload.len());
        self.bufs.payload[..n].copy_from_slice(&body[..n]);
        self.bufs.header[..abi::OUT_HEADER_LEN].copy_from_slice(&abi::out_header(
            n,
            error,
            reply.unique.get(),
        ));
        self.bufs.header[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(n as u32).to_le_bytes());
    }
}

impl Drop for RingWorker {
    fn drop(&mut self) {
        if self.in_kernel {
            // The kernel may still write into these buffers: leak them rather than free memory
            // it can reach. (Only after an error in the middle of a submission.)
            let bufs = std::mem::replace(
                &mut self.bufs,
                Buffers {
                    header: Box::new([0; HEADER_LEN]),
                    payload: Box::new([]),
                    iov: Box::new([libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2]),
                },
            );
            std::mem::forget(bufs);
        }
    }
}

/// The reply to a ring request, kept until the handler returns (its arguments live in the
/// payload buffer the reply goes into).
#[derive(Default)]
struct EntryReply {
    unique: std::cell::Cell<u64>,
    sent: std::cell::Cell<bool>,
    error: std::cell::Cell<i32>,
    body: RefCell<Vec<u8>>,
}

impl EntryReply {
    fn clear(&self) {
        self.sent.set(false);
        self.error.set(0);
        self.body.borrow_mut().clear();
    }
}

impl Sink for EntryReply {
    fn send(&self, unique: u64, error: i32, body: &[&[u8]]) {
        debug_assert_eq!(unique, self.unique.get(), "a reply for another request");
        self.sent.set(true);
        self.error.set(error);
        let mut b = self.body.borrow_mut();
        for part in body {
            b.extend_from_slice(part);
        }
    }
}

/// Whether a command's errno says the connection is gone (unmounted or aborted; ECANCELED:
/// the ring's commands cancelled as the connection went down).
fn connection_ended(errno: i32) -> bool {
    matches!(errno, libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED)
}

/// Pins the calling thread to `cpu` (a queue's requests come from that CPU); whether it is.
pub fn pin_to(cpu: usize) -> bool {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn there_is_a_queue_per_possible_cpu() {
        assert!(queue_count() >= std::thread::available_parallelism().map_or(1, |n| n.get()));
    }
}
