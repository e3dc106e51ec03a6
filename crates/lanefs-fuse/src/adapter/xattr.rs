//! What the xattr handlers share: the root's reserved `lanefs.*` counters (`crate::stats`),
//! the NUL-separated name list, and the size rule of GETXATTR and LISTXATTR replies (a size of
//! 0 asks how much; a value longer than the caller's buffer is ERANGE).

use super::convert::{errno, name};
use super::LaneFuse;
use crate::inflight::Op;
use crate::proto::{Errno, ReplyXattr, Request};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

impl LaneFuse {
    /// The value of `ino`'s attribute `n`: the mount's counters for the reserved names on the
    /// root (reading them is not counted as a request), the engine's xattr otherwise.
    pub(super) fn xattr_value(&self, req: &Request, ino: u64, n: &OsStr) -> lanefs::Result<Vec<u8>> {
        let is = |reserved: &str| ino == lanefs::ROOT && n.as_bytes() == reserved.as_bytes();
        if is(crate::stats::REQUESTS_XATTR) {
            Ok(crate::stats::format(&self.inflight.requests()).into_bytes())
        } else if is(crate::stats::TRANSPORT_XATTR) {
            Ok(format!("{}\n", self.transport.get().map_or("not settled", |t| t.as_str())).into_bytes())
        } else if is(crate::stats::ENGINE_XATTR) {
            Ok(crate::stats::format_engine(&self.fs.io_stats(), &self.fs.lock_census()).into_bytes())
        } else {
            let _busy = self.inflight.enter(Op::Getxattr, ino, req.pid());
            self.fs.getxattr(ino, name(n))
        }
    }
}

/// LISTXATTR's value: each name followed by a NUL.
pub(super) fn name_list(names: Vec<Vec<u8>>) -> Vec<u8> {
    let mut buf = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
    for n in names {
        buf.extend_from_slice(&n);
        buf.push(0);
    }
    buf
}

/// Replies with `v` to a caller whose buffer holds `size` bytes.
pub(super) fn reply_sized(v: lanefs::Result<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match v {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::name_list;

    #[test]
    fn a_name_list_ends_each_name_with_a_nul_and_is_empty_without_names() {
        assert_eq!(name_list(vec![]), Vec::<u8>::new());
        assert_eq!(name_list(vec![b"user.a".to_vec(), b"b".to_vec()]), b"user.a\0b\0".to_vec());
    }
}
