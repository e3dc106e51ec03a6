//! The input of an ioctl that the kernel does not pass on.
//!
//! FUSE forwards ioctls in restricted mode: the kernel copies in `_IOC_SIZE` bytes only when
//! the command's direction has `_IOC_WRITE`. XFS_IOC_GOINGDOWN (= EXT4_IOC_SHUTDOWN) is
//! declared `_IOR('X', 125, __u32)` although the file system reads its flags from the
//! pointer, so lanefs gets no flags (FUSE_IOCTL's `arg` is the bare pointer). The
//! caller is blocked in that ioctl while lanefs answers, so its arguments can be read where
//! the kernel shows them: the pointer in `/proc/TID/syscall` (after checking that the task is
//! in `ioctl` with this very command), the value at it in `/proc/TID/mem`. Both need the
//! right to trace the caller (a daemon running as root has it; an unprivileged one usually
//! has not, under Yama); without it, or for a caller in another PID namespace, the answer is
//! `None` and the caller decides what an unknown input means.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// The `u32` that task `tid`, blocked in `ioctl(fd, cmd, ptr)`, passed through `ptr`; `None`
/// when it cannot be read or the task is not in that call.
pub fn ioctl_u32_input(tid: u32, cmd: u32) -> Option<u32> {
    let syscall = std::fs::read_to_string(format!("/proc/{tid}/syscall")).ok()?;
    let ptr = ioctl_pointer(&syscall, cmd)?;
    let mut word = [0u8; 4];
    File::open(format!("/proc/{tid}/mem")).ok()?.read_exact_at(&mut word, ptr).ok()?;
    Some(u32::from_ne_bytes(word))
}

/// The pointer argument in a `/proc/TID/syscall` line ("NR ARG1 ... ARG6 SP PC", the
/// arguments in hex) of a task blocked in `ioctl(fd, cmd, ptr)`; `None` for any other call.
fn ioctl_pointer(line: &str, cmd: u32) -> Option<u64> {
    let mut f = line.split_whitespace();
    let nr: i64 = f.next()?.parse().ok()?;
    if nr != libc::SYS_ioctl {
        return None;
    }
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    let _fd = hex(f.next()?)?;
    let req = hex(f.next()?)?;
    let ptr = hex(f.next()?)?;
    // The request is an unsigned int in the kernel; the register may carry a sign extension.
    (req as u32 == cmd && ptr != 0).then_some(ptr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pointer_of_the_right_ioctl_only() {
        let nr = libc::SYS_ioctl;
        let line = format!("{nr} 0x3 0x8004587d 0x7ffc5e0b1a2c 0x0 0x0 0x0 0x7ffc5e0b19f8 0x7f3a1c2d3e4f\n");
        assert_eq!(ioctl_pointer(&line, 0x8004_587d), Some(0x7ffc_5e0b_1a2c));
        assert_eq!(ioctl_pointer(&line, 0xc018_5879), None, "another command");
        let other = format!("{} 0x3 0x8004587d 0x7ffc5e0b1a2c 0x0 0x0 0x0 0x0 0x0", nr + 1);
        assert_eq!(ioctl_pointer(&other, 0x8004_587d), None, "another system call");
        assert_eq!(ioctl_pointer("running", 0x8004_587d), None);
        assert_eq!(ioctl_pointer("-1 0x7ffc 0x0", 0x8004_587d), None);
        assert_eq!(ioctl_pointer(&format!("{nr} 0x3 0xffffffff8004587d 0x10"), 0x8004_587d), Some(0x10));
        assert_eq!(ioctl_pointer(&format!("{nr} 0x3 0x8004587d 0x0"), 0x8004_587d), None, "NULL");
    }

    #[test]
    fn a_task_in_another_call_gives_none() {
        // The test harness's main thread waits for this one (a futex, not an ioctl): the read
        // says None rather than guessing. (The FUSE tests read a real GOINGDOWN's flags.)
        assert_eq!(ioctl_u32_input(std::process::id(), 0x8004_587d), None);
        assert_eq!(ioctl_u32_input(u32::MAX, 0x8004_587d), None, "no such task");
    }
}
