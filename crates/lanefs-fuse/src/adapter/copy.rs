//! COPY_FILE_RANGE. The engine cannot share blocks between files, so a copy is a read and
//! write loop in the daemon: it saves the two kernel crossings per chunk that a user-space copy
//! pays.

use super::process::ReqCaller;
use super::LaneFuse;

/// Largest copy_file_range answered in one request (the reply carries a u32).
const MAX_COPY: u64 = 1 << 30;

impl LaneFuse {
    /// COPY_FILE_RANGE: reads and writes `len` bytes (at most [`MAX_COPY`]) from `ino_in` to
    /// `ino_out`, a chunk of `max_write` at a time; the bytes copied.
    pub(super) fn copy_range(
        &self,
        caller: &ReqCaller,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> lanefs::Result<u64> {
        let len = len.min(MAX_COPY);
        let efbig = || lanefs::Error::errno(libc::EFBIG, "copy range past the largest offset");
        off_in.checked_add(len).ok_or_else(efbig)?;
        off_out.checked_add(len).ok_or_else(efbig)?;
        let mut buf = vec![0u8; (self.max_write as u64).min(len.max(1)) as usize];
        let mut done = 0u64;
        while done < len {
            let want = ((len - done) as usize).min(buf.len());
            let n = self.fs.read_at(ino_in, off_in + done, &mut buf[..want])?;
            if n == 0 {
                break;
            }
            if self.killpriv {
                self.fs.write_at_as(ino_out, off_out + done, &buf[..n], caller)?;
            } else {
                self.fs.write_at(ino_out, off_out + done, &buf[..n])?;
            }
            done += n as u64;
        }
        Ok(done)
    }
}
