//! Who changes a file, and what a change then takes away: the set-user-ID and set-group-ID bits
//! and the `security.capability` xattr, by the rules of the kernel's VFS (fs/attr.c,
//! fs/inode.c), which a kernel file system gets for free and a FUSE server that negotiates
//! `FUSE_HANDLE_KILLPRIV_V2` must apply itself.
//!
//! - A change of data (write, truncate, fallocate, copy into) by a caller without CAP_FSETID
//!   drops set-user-ID, and set-group-ID when the file is group-executable or the caller is not
//!   in the file's group (`setattr_should_drop_suidgid`). Regular files only.
//! - A chown of a non-directory drops set-user-ID whoever asks, and set-group-ID as above but
//!   with CAP_FSETID counting as membership (`setattr_should_drop_sgid`).
//! - Either drops `security.capability`, whoever asks (`ATTR_KILL_PRIV`).
//! - Setting an access ACL drops set-group-ID unless the caller is in the file's group or has
//!   CAP_FSETID (`posix_acl_update_mode`).
//!
//! The library's plain calls (`Fs::write_at`, `Fs::setattr`, ...) change nothing of this: a
//! library caller owns the image and is treated as privileged. The `_as` calls take a
//! [`Caller`]; the engine asks it only when a file has set-ID bits, and never under a lock, so
//! a caller may look its answer up (the FUSE adapter reads /proc).

/// `S_ISUID`, `S_ISGID`, `S_IXGRP`.
pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_IXGRP: u32 = 0o0010;

/// The xattr that holds file capabilities.
pub const SECURITY_CAPABILITY: &[u8] = b"security.capability";

/// The process that asks for a change.
pub trait Caller {
    /// Whether it has CAP_FSETID (may keep set-ID bits, and set-group-ID of any group).
    fn fsetid(&self) -> bool;
    /// Whether `gid` is its file-system group or one of its supplementary groups.
    fn in_group(&self, gid: u32) -> bool;
    /// Told after its change dropped set-ID bits of inode `ino` (now `mode`), so that a cache
    /// of the old mode can be dropped (the FUSE adapter tells the kernel).
    fn dropped(&self, ino: u64, mode: u32) {
        let _ = (ino, mode);
    }
}

/// A caller with every privilege and no cache: what the library's plain calls act as.
pub struct Privileged;

impl Caller for Privileged {
    fn fsetid(&self) -> bool {
        true
    }
    fn in_group(&self, _gid: u32) -> bool {
        true
    }
}

/// What kind of change a caller makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Data: write, truncate, fallocate, copy into.
    Data,
    /// Owner or group (chown).
    Owner,
}

/// The set-ID bits of a file with `mode` and group `gid` that `change` by `caller` drops.
pub fn setid_to_drop(mode: u32, gid: u32, change: Change, caller: &dyn Caller) -> u32 {
    const S_IFMT: u32 = 0o170000;
    let setid = mode & (S_ISUID | S_ISGID);
    if setid == 0 {
        return 0;
    }
    let group_exec = mode & S_IXGRP != 0;
    match change {
        Change::Data => {
            if mode & S_IFMT != 0o100000 || caller.fsetid() {
                return 0;
            }
            let sgid = setid & S_ISGID != 0 && (group_exec || !caller.in_group(gid));
            (setid & S_ISUID) | if sgid { S_ISGID } else { 0 }
        }
        Change::Owner => {
            if mode & S_IFMT == 0o040000 {
                return 0;
            }
            let sgid = setid & S_ISGID != 0 && (group_exec || !(caller.in_group(gid) || caller.fsetid()));
            (setid & S_ISUID) | if sgid { S_ISGID } else { 0 }
        }
    }
}

/// Whether setting an access ACL on a file of group `gid` keeps its set-group-ID bit.
pub fn acl_keeps_sgid(gid: u32, caller: &dyn Caller) -> bool {
    caller.in_group(gid) || caller.fsetid()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct As {
        fsetid: bool,
        groups: &'static [u32],
    }

    impl Caller for As {
        fn fsetid(&self) -> bool {
            self.fsetid
        }
        fn in_group(&self, gid: u32) -> bool {
            self.groups.contains(&gid)
        }
    }

    const USER: As = As { fsetid: false, groups: &[1001] };
    const ROOT: As = As { fsetid: true, groups: &[0] };

    /// generic/683-687: what a write by an unprivileged user (not in group 0) and by root leaves.
    #[test]
    fn data_changes_drop_as_the_fstests_expect() {
        for (mode, user_leaves) in [
            (0o6666, 0o666),
            (0o6676, 0o676),
            (0o6766, 0o766),
            (0o6777, 0o777),
            (0o2676, 0o676),
            (0o2777, 0o777),
        ] {
            let f = 0o100000 | mode;
            assert_eq!(mode & !setid_to_drop(f, 0, Change::Data, &USER), user_leaves, "{mode:o}");
            assert_eq!(setid_to_drop(f, 0, Change::Data, &ROOT), 0, "{mode:o}");
        }
        // A member of the file's group keeps set-group-ID on a file it cannot execute as group.
        assert_eq!(setid_to_drop(0o102664, 1001, Change::Data, &USER), 0);
        assert_eq!(setid_to_drop(0o102674, 1001, Change::Data, &USER), S_ISGID);
        // Directories and special files keep their bits.
        assert_eq!(setid_to_drop(0o046777, 0, Change::Data, &USER), 0);
    }

    #[test]
    fn chown_drops_set_user_id_even_for_root() {
        assert_eq!(setid_to_drop(0o104755, 0, Change::Owner, &ROOT), S_ISUID);
        assert_eq!(setid_to_drop(0o106755, 0, Change::Owner, &ROOT), S_ISUID | S_ISGID);
        // Not group-executable: kept by root or a member, dropped for anyone else.
        assert_eq!(setid_to_drop(0o102745, 0, Change::Owner, &ROOT), 0);
        assert_eq!(setid_to_drop(0o102745, 1001, Change::Owner, &USER), 0);
        assert_eq!(setid_to_drop(0o102745, 0, Change::Owner, &USER), S_ISGID);
        assert_eq!(setid_to_drop(0o046777, 0, Change::Owner, &USER), 0);
    }

    #[test]
    fn an_acl_keeps_sgid_for_members_and_root_only() {
        assert!(acl_keeps_sgid(1001, &USER));
        assert!(!acl_keeps_sgid(100, &USER));
        assert!(acl_keeps_sgid(100, &ROOT));
    }
}
