//! What the adapter and the kernel agree on at INIT, and how long the kernel may cache replies.

use super::LaneFuse;
use crate::proto::abi::init;
use crate::proto::KernelConfig;
use std::time::Duration;

/// How long the kernel may cache what the adapter tells it (`-o cache_timeout=S`,
/// `-o negative_timeout=S`).
///
/// lanefs is the only writer of its image and every change goes through this mount, so the
/// kernel's caches stay right however long it keeps them: the kernel itself drops what its own
/// requests change (a directory's attributes after a create, an inode's after a write, link,
/// rename or setxattr; a name after unlink or rename; atime after a READ or READDIR), and the
/// adapter tells it of the rest, the changes the engine makes on its own: set-ID bits dropped by
/// a write (`ReqCaller::dropped`) and inode flags set by ioctl (`attributes_changed`). A long
/// TTL saves a GETATTR per stat and a LOOKUP per path component once a second; a negative entry
/// (a LOOKUP answered with node id 0 and a TTL, not ENOENT) saves the LOOKUP of a name that does
/// not exist on every later stat, and lets the CREATE of such a name come without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttl {
    /// Names and attributes of existing inodes (one value: CREATE and READDIRPLUS replies
    /// carry one TTL for both).
    pub cache: Duration,
    /// Names that do not exist (0: ENOENT, not cached).
    pub negative: Duration,
}

/// Default of both TTLs: an hour.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);

impl Default for Ttl {
    fn default() -> Ttl {
        Ttl { cache: DEFAULT_TTL, negative: DEFAULT_TTL }
    }
}

/// Largest write (and read) negotiated with the kernel, before the kernel's own cap.
pub const MAX_WRITE: u32 = 1 << 20;

/// 1 MiB, capped by what the kernel allows (/proc/sys/fs/fuse/max_pages_limit pages).
pub fn max_write() -> u32 {
    let page = 4096u64;
    let limit = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(256);
    (limit.saturating_mul(page)).clamp(page, MAX_WRITE as u64) as u32
}

impl LaneFuse {
    /// What to ask of the kernel at INIT, from what it offers; records what it agreed to.
    pub(super) fn negotiate(&mut self, config: &mut KernelConfig) {
        let caps = config.capabilities();
        // Reads of one file in parallel (readahead among them), writes past 4 KiB.
        let mut want = init::ASYNC_READ
            | init::BIG_WRITES
            | init::PARALLEL_DIROPS
            | init::DO_READDIRPLUS
            | init::READDIRPLUS_AUTO
            | init::CACHE_SYMLINKS
            | init::MAX_PAGES
            | init::ASYNC_DIO
            | init::DIRECT_IO_ALLOW_MMAP
            // Node ids are inode numbers and every reply carries the inode's generation, both
            // stable across mounts: the kernel may hand out file handles (name_to_handle_at,
            // NFS export) and resolve them with LOOKUP "." and "..".
            | init::EXPORT_SUPPORT;
        if self.writeback_cache {
            want |= init::WRITEBACK_CACHE;
        }
        if self.idmap {
            want |= init::ALLOW_IDMAP;
        }
        // The engine drops set-ID bits itself (no GETXATTR("security.capability") before each
        // write), inherits default ACLs (so the umask is ours to apply) and keeps the mode in
        // step with ACLs the kernel then enforces.
        want |= init::HANDLE_KILLPRIV_V2 | init::DONT_MASK;
        if self.posix_acl {
            want |= init::POSIX_ACL;
        }
        // Ask only for what this kernel offers; a missing optional feature is not an error.
        let got = want & caps;
        config.add_capabilities(got);
        self.killpriv = got & init::HANDLE_KILLPRIV_V2 != 0;
        self.writeback_cache_on = got & init::WRITEBACK_CACHE != 0;
        self.direct_io_flushes_cache = got & init::DIRECT_IO_ALLOW_MMAP != 0;
        self.dont_mask = got & init::DONT_MASK != 0;
        config.set_max_write(self.max_write);
        config.set_max_readahead(self.max_write);
        // Background requests (readahead, async direct I/O) in flight at once.
        config.set_max_background(64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_write_is_a_whole_number_of_pages_up_to_one_mib() {
        let m = max_write();
        assert!((4096..=MAX_WRITE).contains(&m) && m.is_multiple_of(4096));
    }
}
