//! The input of an ioctl that the kernel does not pass on.
//!
//! FUSE forwards ioctls in restricted mode: the kernel copies in `_IOC_SIZE` bytes only when
//! the command's direction has `_IOC_WRITE`. XFS_IOC_GOINGDOWN (= EXT4_IOC_SHUTDOWN) is
//! declared `_IOR('X', 125, __u32)` although the file system reads its flags from the
//! pointer, so lanefs gets no flags in the request, only the pointer itself (FUSE_IOCTL's
//! `arg`, the caller's argument as the kernel received it). The caller is blocked in that
//! ioctl while lanefs answers, so the value at the pointer can be read where the kernel shows
//! the caller's memory: `/proc/TID/mem`. That needs the right to trace the caller (a daemon
//! running as root has it; an unprivileged one usually has not, under Yama); without it, for
//! a caller in another PID namespace (its TID means another task here), or for a NULL
//! pointer, the answer is `None` and the caller decides what an unknown input means.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// The `u32` at `ptr` in the memory of task `tid`; `None` when it cannot be read.
pub fn u32_at(tid: u32, ptr: u64) -> Option<u32> {
    if ptr == 0 {
        return None;
    }
    let mut word = [0u8; 4];
    File::open(format!("/proc/{tid}/mem")).ok()?.read_exact_at(&mut word, ptr).ok()?;
    Some(u32::from_ne_bytes(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_of_this_process_reads_back_and_a_bad_pointer_gives_none() {
        let word: Box<u32> = Box::new(0x1234_5678);
        let ptr = &*word as *const u32 as u64;
        assert_eq!(u32_at(std::process::id(), ptr), Some(0x1234_5678));
        assert_eq!(u32_at(std::process::id(), 0), None, "NULL");
        assert_eq!(u32_at(std::process::id(), 8), None, "an unmapped page");
        assert_eq!(u32_at(u32::MAX, ptr), None, "no such task");
    }
}
