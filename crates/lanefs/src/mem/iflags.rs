//! Inode flags: what `chattr` sets and `lsattr` shows (FS_IOC_GETFLAGS / FS_IOC_SETFLAGS), and
//! their FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR form.
//!
//! An inode's flags are Linux's `FS_*_FL` bits, stored as they are in the inode (`Inode::flags`)
//! and in every journal record of its attributes, so `lsattr` reads the same after a remount or
//! a crash. Only the flags lanefs gives a meaning are accepted; any other bit is EOPNOTSUPP, as
//! ext4 answers for a flag it does not support.
//!
//! What the engine enforces, as ext4 (the VFS checks there; FUSE never shows the kernel these
//! flags, so here every check is the engine's):
//! - `IMMUTABLE`: no write, truncate, fallocate, attribute or xattr change; no link to it; it
//!   cannot be removed or renamed; a directory takes no new entry and loses none.
//! - `APPEND`: writes only at the end, opens for writing need O_APPEND, no truncate or punch, no
//!   attribute or xattr change; it cannot be removed or renamed; a directory takes new entries
//!   but loses none.
//! - Only a caller with CAP_LINUX_IMMUTABLE sets or clears those two; while a file stays
//!   immutable no other flag changes.
//! - `NOATIME`: reads leave its access time alone. `SYNC`: each change is durable when it
//!   returns (data writes fsync; a directory's entry changes too). `DIRSYNC`: a directory's entry
//!   changes are durable when they return. `NODUMP` and `DAX` are kept and inherited, nothing more
//!   (FUSE has no DAX).
//! - A new inode inherits its directory's inheritable flags, filtered by its type, as ext4 does:
//!   a directory takes them all, a regular file all but `DIRSYNC`, anything else `NODUMP` and
//!   `NOATIME` only. `IMMUTABLE` and `APPEND` are never inherited.

use crate::error::{Error, Result};

/// An inode's flags, as `FS_IOC_GETFLAGS` reports them (Linux's `FS_*_FL` bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct InodeFlags(pub u32);

impl InodeFlags {
    /// `S`: changes are synchronous.
    pub const SYNC: InodeFlags = InodeFlags(0x0000_0008);
    /// `i`: the inode cannot be changed, linked to, renamed or removed.
    pub const IMMUTABLE: InodeFlags = InodeFlags(0x0000_0010);
    /// `a`: writes only append; the inode cannot be truncated, renamed or removed.
    pub const APPEND: InodeFlags = InodeFlags(0x0000_0020);
    /// `d`: not for backups (kept, not interpreted).
    pub const NODUMP: InodeFlags = InodeFlags(0x0000_0040);
    /// `A`: reads leave the access time alone.
    pub const NOATIME: InodeFlags = InodeFlags(0x0000_0080);
    /// `D`: a directory's entry changes are synchronous.
    pub const DIRSYNC: InodeFlags = InodeFlags(0x0001_0000);
    /// `x`: DAX (kept and inherited; FUSE maps nothing).
    pub const DAX: InodeFlags = InodeFlags(0x0200_0000);

    /// Every flag lanefs accepts.
    pub const SUPPORTED: InodeFlags = InodeFlags(
        Self::SYNC.0
            | Self::IMMUTABLE.0
            | Self::APPEND.0
            | Self::NODUMP.0
            | Self::NOATIME.0
            | Self::DIRSYNC.0
            | Self::DAX.0,
    );
    /// The two only a caller with CAP_LINUX_IMMUTABLE may change.
    pub const PRIVILEGED: InodeFlags = InodeFlags(Self::IMMUTABLE.0 | Self::APPEND.0);
    /// What a new inode takes from its directory (before the filter for its type).
    const INHERITED: InodeFlags =
        InodeFlags(Self::SYNC.0 | Self::NODUMP.0 | Self::NOATIME.0 | Self::DIRSYNC.0 | Self::DAX.0);

    /// The raw `FS_*_FL` bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether every flag of `other` is set here.
    pub fn contains(self, other: InodeFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag of `other` is set here.
    pub fn intersects(self, other: InodeFlags) -> bool {
        self.0 & other.0 != 0
    }

    /// The flags as `struct fsxattr`'s `fsx_xflags` (FS_IOC_FSGETXATTR).
    pub fn xflags(self) -> u32 {
        XFLAGS.iter().filter(|(f, _)| self.contains(*f)).fold(0, |x, (_, xf)| x | xf)
    }

    /// Flags from `fsx_xflags` (FS_IOC_FSSETXATTR); EOPNOTSUPP for an xflag lanefs lacks.
    pub fn from_xflags(xflags: u32) -> Result<InodeFlags> {
        let known = XFLAGS.iter().fold(0, |x, (_, xf)| x | xf);
        if xflags & !known != 0 {
            return Err(Error::errno(libc::EOPNOTSUPP, format!("inode xflags {:#x}", xflags & !known)));
        }
        Ok(InodeFlags(XFLAGS.iter().filter(|(_, xf)| xflags & xf != 0).fold(0, |f, (fl, _)| f | fl.0)))
    }

    /// The flags a new inode of type `mode & S_IFMT` takes from a directory with `self`.
    pub fn inherited_by(self, mode: u32) -> InodeFlags {
        let f = self.0 & Self::INHERITED.0;
        InodeFlags(match mode & crate::format::node::S_IFMT {
            0o040000 => f,
            0o100000 => f & !Self::DIRSYNC.0,
            _ => f & (Self::NODUMP.0 | Self::NOATIME.0),
        })
    }

    /// The flags an inode of type `mode & S_IFMT` may hold: what `set` keeps of a request, as
    /// ext4 masks flags by type (`DIRSYNC` means nothing but on a directory).
    pub fn for_type(self, mode: u32) -> InodeFlags {
        match mode & crate::format::node::S_IFMT {
            0o040000 => self,
            0o100000 => InodeFlags(self.0 & !Self::DIRSYNC.0),
            _ => InodeFlags(self.0 & (Self::NODUMP.0 | Self::NOATIME.0 | Self::PRIVILEGED.0 | Self::SYNC.0)),
        }
    }
}

/// Flag and its `FS_XFLAG_*` counterpart (every flag lanefs keeps has one but `DIRSYNC`, which
/// `fsx_xflags` cannot carry and a FSSETXATTR leaves as it was).
const XFLAGS: [(InodeFlags, u32); 6] = [
    (InodeFlags::IMMUTABLE, 0x0000_0008),
    (InodeFlags::APPEND, 0x0000_0010),
    (InodeFlags::SYNC, 0x0000_0020),
    (InodeFlags::NOATIME, 0x0000_0040),
    (InodeFlags::NODUMP, 0x0000_0080),
    (InodeFlags::DAX, 0x0000_8000),
];

/// Checks a flag change from `old` to `new` the way ext4 does; `privileged`: the caller holds
/// CAP_LINUX_IMMUTABLE.
pub(crate) fn check_change(old: InodeFlags, new: InodeFlags, privileged: bool) -> Result<()> {
    if new.0 & !InodeFlags::SUPPORTED.0 != 0 {
        return Err(Error::errno(
            libc::EOPNOTSUPP,
            format!("inode flags {:#x} not supported", new.0 & !InodeFlags::SUPPORTED.0),
        ));
    }
    if (old.0 ^ new.0) & InodeFlags::PRIVILEGED.0 != 0 && !privileged {
        return Err(Error::errno(
            libc::EPERM,
            "only CAP_LINUX_IMMUTABLE changes the immutable or append flag",
        ));
    }
    // An inode that stays immutable changes nothing else (ext4_ioctl_check_immutable).
    let imm = InodeFlags::IMMUTABLE.0;
    if old.0 & new.0 & imm != 0 && old.0 & !imm != new.0 & !imm {
        return Err(Error::errno(libc::EPERM, "inode is immutable"));
    }
    Ok(())
}

/// EPERM if `flags` holds any of `forbidden`; `what` names the refused operation.
pub(crate) fn refuse(flags: u32, forbidden: InodeFlags, what: &str) -> Result<()> {
    if flags & forbidden.0 == 0 {
        return Ok(());
    }
    let why = if flags & InodeFlags::IMMUTABLE.0 != 0 { "immutable" } else { "append-only" };
    Err(Error::errno(libc::EPERM, format!("{what}: inode is {why}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xflags_round_trip_every_flag_but_dirsync() {
        for (f, xf) in XFLAGS {
            assert_eq!(f.xflags(), xf);
            assert_eq!(InodeFlags::from_xflags(xf).unwrap(), f);
        }
        let all = InodeFlags::SUPPORTED;
        assert_eq!(InodeFlags::from_xflags(all.xflags()).unwrap().0, all.0 & !InodeFlags::DIRSYNC.0);
        // FS_XFLAG_REALTIME is no lanefs flag.
        let e = InodeFlags::from_xflags(0x1).unwrap_err();
        assert_eq!(e.to_errno(), libc::EOPNOTSUPP);
    }

    #[test]
    fn inheritance_follows_the_type_and_never_passes_immutable_or_append() {
        let parent = InodeFlags(InodeFlags::SUPPORTED.0);
        let dir = parent.inherited_by(0o040000);
        let file = parent.inherited_by(0o100000);
        let link = parent.inherited_by(0o120000);
        assert!(!dir.intersects(InodeFlags::PRIVILEGED) && !file.intersects(InodeFlags::PRIVILEGED));
        assert!(dir.contains(InodeFlags::DIRSYNC) && dir.contains(InodeFlags::DAX));
        assert!(!file.contains(InodeFlags::DIRSYNC) && file.contains(InodeFlags::DAX));
        assert_eq!(link, InodeFlags(InodeFlags::NODUMP.0 | InodeFlags::NOATIME.0));
    }

    #[test]
    fn changes_are_checked_as_ext4_checks_them() {
        let none = InodeFlags::default();
        let i = InodeFlags::IMMUTABLE;
        let a = InodeFlags::APPEND;
        let d = InodeFlags::NODUMP;
        assert_eq!(check_change(none, i, false).unwrap_err().to_errno(), libc::EPERM);
        assert_eq!(check_change(a, none, false).unwrap_err().to_errno(), libc::EPERM);
        check_change(none, i, true).unwrap();
        check_change(none, d, false).unwrap();
        // Immutable before and after: nothing else may change, even for root.
        assert_eq!(check_change(i, InodeFlags(i.0 | d.0), true).unwrap_err().to_errno(), libc::EPERM);
        check_change(InodeFlags(i.0 | d.0), d, true).unwrap();
        assert_eq!(check_change(none, InodeFlags(0x4), true).unwrap_err().to_errno(), libc::EOPNOTSUPP);
    }
}
