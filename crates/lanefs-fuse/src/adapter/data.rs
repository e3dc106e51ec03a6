//! The data path: READ, WRITE, FALLOCATE and LSEEK, and what the kernel's writeback cache
//! changes about them. With the cache on, the kernel owns a regular file's size, mtime and
//! ctime, and holds written data the engine has not seen yet: a direct read may meet the
//! engine's end of file before the kernel's, and a hole search may miss dirty pages, so both
//! have the kernel write its pages back first. A WRITE then keeps the times the kernel stamped.

use super::convert::errno;
use super::LaneFuse;
use crate::inflight::Op;
use crate::proto::abi::{READ_LOCKOWNER, WRITE_KILL_SUIDGID};
use crate::proto::{Errno, INodeNo, ReplyData, ReplyEmpty, ReplyLseek, ReplyWrite, Request};
use lanefs::Seek;
use std::cell::RefCell;

thread_local! {
    /// Per-worker read buffer, reused so that a 1 MiB read costs no allocation.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl LaneFuse {
    /// Whether a READ may ask past the engine's end of file while the kernel's size is further
    /// on. Under the writeback cache the kernel owns the size: an append it still holds dirty
    /// has moved its end of file and not yet the engine's. A page-cache read never needs the
    /// difference (the kernel zero-fills what comes back short below its size), but a direct
    /// one (an O_DIRECT open gets FOPEN_DIRECT_IO) would return short to its caller, ending the
    /// file early, as if the hole before the dirty pages were past the end. The kernel's direct
    /// path sends the reader's lock owner (READ_LOCKOWNER) and its page-cache reads never do;
    /// which matters, since a page-cache read holds its pages locked until the reply, and the
    /// write-back would wait for those locks.
    fn size_may_lag(&self, read_flags: u32, flags: i32) -> bool {
        self.writeback_cache_on
            && self.direct_io_flushes_cache
            && flags & libc::O_DIRECT != 0
            && read_flags & READ_LOCKOWNER != 0
    }

    /// Has the kernel write `ino`'s dirty pages from `off` on back (they make its size), for a
    /// direct READ answered short: true if it did, and the read may be made again. Where this
    /// worker may not wait for the kernel (`proto::spares`), the short answer stands.
    fn write_back_from(&self, ino: INodeNo, off: u64) -> bool {
        self.notifier.get().is_some_and(|n| n.write_back(ino, off).unwrap_or(false))
    }

    /// READ: up to `size` bytes at `offset`, read again after a write-back when the kernel's
    /// size may be ahead of the engine's (see [`LaneFuse::size_may_lag`]).
    // The request's fields, as `Filesystem::read` receives them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_data(
        &self,
        req: &Request,
        ino: INodeNo,
        offset: u64,
        size: u32,
        read_flags: u32,
        flags: i32,
        reply: ReplyData,
    ) {
        let _busy = self.inflight.enter(Op::Read, ino.0, req.pid());
        READ_BUF.with(|b| {
            let mut b = b.borrow_mut();
            let size = (size as usize).min(self.max_write as usize);
            if b.len() < size {
                b.resize(size, 0);
            }
            let mut r = self.fs.read_at(ino.0, offset, &mut b[..size]);
            if matches!(r, Ok(n) if n < size)
                && self.size_may_lag(read_flags, flags)
                && self.write_back_from(ino, offset)
            {
                r = self.fs.read_at(ino.0, offset, &mut b[..size]);
            }
            match r {
                Ok(n) => reply.data(&b[..n]),
                Err(e) => reply.error(errno(e)),
            }
        })
    }

    /// WRITE: `data` at `offset`, with the kernel's times under the writeback cache, and made
    /// durable before the reply for a direct O_SYNC / O_DSYNC write.
    // The request's fields, as `Filesystem::write` receives them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_data(
        &self,
        req: &Request,
        ino: INodeNo,
        offset: u64,
        data: &[u8],
        write_flags: u32,
        flags: i32,
        reply: ReplyWrite,
    ) {
        let _busy = self.inflight.enter(Op::Write, ino.0, req.pid());
        let kill = write_flags & WRITE_KILL_SUIDGID != 0;
        let caller = self.killpriv.then(|| self.caller(req, Some(!kill)));
        let caller = caller.as_ref().map(|c| c as &dyn lanefs::Caller);
        // With the writeback cache the kernel keeps a regular file's mtime and ctime: it
        // stamped them at write(2), direct I/O included, and sends them in SETATTR. Stamping
        // the time a WRITE arrives would show another time after the inode is read afresh.
        let r = match (self.writeback_cache_on, caller) {
            (true, caller) => self.fs.write_keep_times(ino.0, offset, data, caller),
            (false, Some(c)) => self.fs.write_at_as(ino.0, offset, data, c),
            (false, None) => self.fs.write_at(ino.0, offset, data),
        };
        let n = match r {
            Ok(n) => n,
            Err(e) => return reply.error(errno(e)),
        };
        // O_SYNC / O_DSYNC (the kernel sets them in the request from the file and the call):
        // after a buffered write the kernel sends FSYNC itself, after a direct-I/O one it does
        // not, so such a write is made durable here before it is acknowledged.
        if flags & libc::O_DIRECT != 0 && flags & libc::O_DSYNC != 0 {
            let datasync = flags & libc::O_SYNC != libc::O_SYNC;
            if let Err(e) = self.fs.fsync(ino.0, datasync) {
                return reply.error(errno(e));
            }
        }
        reply.written(n as u32)
    }

    /// FALLOCATE, with the kernel's privilege rule for the caller.
    pub(super) fn fallocate_data(
        &self,
        req: &Request,
        ino: INodeNo,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _busy = self.inflight.enter(Op::Fallocate, ino.0, req.pid());
        // The kernel drops privileges before a fallocate only by a SETATTR it empties under
        // FUSE_HANDLE_KILLPRIV_V2; the request carries no flag, so the engine applies the
        // kernel's rule for the caller, as for a write.
        // FALLOC_FL_* bits are Linux's; the engine refuses a mode it lacks with EOPNOTSUPP.
        let mode = lanefs::FallocMode(mode as u32);
        let r = if self.killpriv {
            self.fs.fallocate_as(ino.0, mode, offset, length, &self.caller(req, None))
        } else {
            self.fs.fallocate(ino.0, mode, offset, length)
        };
        self.empty(r, reply)
    }

    /// LSEEK with SEEK_DATA or SEEK_HOLE, after the kernel's dirty pages from `offset` on are
    /// written back.
    pub(super) fn seek_data(&self, req: &Request, ino: INodeNo, offset: i64, whence: i32, reply: ReplyLseek) {
        let _busy = self.inflight.enter(Op::Lseek, ino.0, req.pid());
        let what = match whence {
            libc::SEEK_DATA => Seek::Data,
            libc::SEEK_HOLE => Seek::Hole,
            // The kernel answers SEEK_SET, SEEK_CUR and SEEK_END itself.
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(off) = u64::try_from(offset) else { return reply.error(Errno::ENXIO) };
        // The kernel sends LSEEK without writing its dirty pages back first: with its writeback
        // cache the engine may not have seen data a reader would then skip as a hole (cp
        // copies with SEEK_DATA). So they are written back from `off` on first, before the
        // engine is asked (the wait holds nothing of the engine's). Where this worker may not
        // wait for that (`proto::spares`), ENOSYS makes the kernel answer from its own size
        // for good (fc->no_lseek): every byte is data, which is always correct.
        if self.writeback_cache_on {
            match self.notifier.get().map(|n| n.write_back(ino, off)) {
                Some(Ok(true)) => {}
                Some(Ok(false)) | None => return reply.error(Errno::ENOSYS),
                Some(Err(e)) => return reply.error(Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))),
            }
        }
        match self.fs.seek(ino.0, off, what) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(e)),
        }
    }
}
