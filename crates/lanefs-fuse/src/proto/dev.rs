//! The /dev/fuse descriptor: reading requests, writing replies, cloning per worker.
//!
//! Every read returns one whole request and every write must carry one whole reply, so a
//! reply is written with one `writev` of its header and body parts.

use super::abi;
use super::reply::Sink;
use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd};

/// One /dev/fuse descriptor of a connection.
pub struct DevFuse {
    file: File,
}

impl DevFuse {
    /// Opens /dev/fuse for a new connection (to be named in the mount's `fd=` option).
    pub fn open() -> io::Result<DevFuse> {
        let file = File::options().read(true).write(true).open("/dev/fuse").map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                io::Error::new(e.kind(), "/dev/fuse does not exist (modprobe fuse)")
            } else {
                e
            }
        })?;
        Ok(DevFuse { file })
    }

    pub fn from_file(file: File) -> DevFuse {
        DevFuse { file }
    }

    pub fn as_file(&self) -> &File {
        &self.file
    }

    /// Another descriptor on the same connection (FUSE_DEV_IOC_CLONE): the kernel hands each
    /// request to one reader, and takes its reply on the descriptor it was read from.
    pub fn clone_dev(&self) -> io::Result<DevFuse> {
        let new = DevFuse::open()?;
        let old = self.file.as_raw_fd() as u32;
        // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the descriptor to clone) through the pointer,
        // which points to a live local for the whole call; both descriptors are open.
        #[allow(unsafe_code)]
        let r = unsafe { libc::ioctl(new.file.as_raw_fd(), abi::DEV_IOC_CLONE as _, &old as *const u32) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(new)
    }

    /// Reads one request into `buf`.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        rustix::io::read(self.file.as_fd(), buf).map_err(io::Error::from)
    }

    /// Writes one reply (or, with `unique` 0, a notification whose code is `error`).
    pub fn write_reply(&self, unique: u64, error: i32, body: &[&[u8]]) -> io::Result<()> {
        let body_len = body.iter().map(|b| b.len()).sum::<usize>();
        let h = abi::out_header(body_len, error, unique);
        // Header plus at most 3 parts: no allocation on the reply path.
        let mut parts = [IoSlice::new(&[]); 4];
        parts[0] = IoSlice::new(&h);
        let mut n = 1;
        for b in body.iter().filter(|b| !b.is_empty()) {
            if n == parts.len() {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "a reply of more than 3 parts"));
            }
            parts[n] = IoSlice::new(b);
            n += 1;
        }
        let written = rustix::io::writev(self.file.as_fd(), &parts[..n]).map_err(io::Error::from)?;
        debug_assert_eq!(written, abi::OUT_HEADER_LEN + body_len, "/dev/fuse takes a reply whole");
        Ok(())
    }

    pub fn as_sink(&self) -> DevSink<'_> {
        DevSink { dev: self }
    }
}

/// Replies through a /dev/fuse descriptor.
pub struct DevSink<'a> {
    dev: &'a DevFuse,
}

impl Sink for DevSink<'_> {
    fn send(&self, unique: u64, error: i32, body: &[&[u8]]) {
        match self.dev.write_reply(unique, error, body) {
            Ok(()) => {}
            // The request was interrupted and is gone, or the file system is being unmounted:
            // nobody waits for this answer.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV)) => {}
            Err(e) => eprintln!("lanefs: cannot answer FUSE request {unique}: {e}"),
        }
    }
}
