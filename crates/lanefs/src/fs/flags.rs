//! Typed flags of the calls that take Linux's flag words: rename(2)'s `RENAME_*`, setxattr(2)'s
//! `XATTR_*` and fallocate(2)'s `FALLOC_FL_*`. Re-exported at the crate root.
//!
//! Each is a newtype over the kernel's bits, in the style of [`InodeFlags`](crate::InodeFlags):
//! the bit values are Linux's, so a FUSE request's word converts without a table. The engine
//! checks the bits it is given as it always has (EINVAL for an unknown rename or xattr bit,
//! EOPNOTSUPP for an unknown fallocate mode), so a value built from raw bits is refused where
//! the kernel's would be.

use crate::mem::ops;
use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// The methods every flag word has: its bits, set tests and union.
macro_rules! flag_word {
    ($t:ident) => {
        impl $t {
            /// No flag: the plain call.
            pub const fn empty() -> $t {
                $t(0)
            }

            /// The raw bits, Linux's values.
            pub const fn bits(self) -> u32 {
                self.0
            }

            /// Whether every flag of `other` is set here.
            pub const fn contains(self, other: $t) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether any flag of `other` is set here.
            pub const fn intersects(self, other: $t) -> bool {
                self.0 & other.0 != 0
            }

            /// Whether no flag is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }
        }

        impl BitOr for $t {
            type Output = $t;
            fn bitor(self, rhs: $t) -> $t {
                $t(self.0 | rhs.0)
            }
        }

        impl BitOrAssign for $t {
            fn bitor_assign(&mut self, rhs: $t) {
                self.0 |= rhs.0;
            }
        }

        /// The bits in hex, as error messages show a flag word (`{:#x}`).
        impl fmt::LowerHex for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }
    };
}

/// rename(2)'s flags (`renameat2`'s `RENAME_*` bits). [`RenameFlags::EXCHANGE`] goes with no
/// other flag; [`RenameFlags::WHITEOUT`] may come with [`RenameFlags::NOREPLACE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct RenameFlags(pub u32);

impl RenameFlags {
    /// Fail with EEXIST instead of replacing an existing target.
    pub const NOREPLACE: RenameFlags = RenameFlags(ops::RENAME_NOREPLACE);
    /// Swap the two names atomically; both must exist.
    pub const EXCHANGE: RenameFlags = RenameFlags(ops::RENAME_EXCHANGE);
    /// Leave a whiteout (a character device 0:0) at the source name, as overlayfs asks.
    pub const WHITEOUT: RenameFlags = RenameFlags(ops::RENAME_WHITEOUT);
    /// Every flag lanefs accepts.
    pub const SUPPORTED: RenameFlags = RenameFlags(Self::NOREPLACE.0 | Self::EXCHANGE.0 | Self::WHITEOUT.0);
}

flag_word!(RenameFlags);

/// setxattr(2)'s flags: none (create or replace), or one of the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct XattrFlags(pub u32);

impl XattrFlags {
    /// Fail with EEXIST if the attribute exists.
    pub const CREATE: XattrFlags = XattrFlags(ops::XATTR_CREATE as u32);
    /// Fail with ENODATA unless the attribute exists.
    pub const REPLACE: XattrFlags = XattrFlags(ops::XATTR_REPLACE as u32);
}

flag_word!(XattrFlags);

/// fallocate(2)'s mode. Empty allocates (and reserves) the range, growing the file; the engine
/// supports [`FallocMode::KEEP_SIZE`] alone, [`FallocMode::PUNCH_HOLE`] with `KEEP_SIZE`, and
/// [`FallocMode::ZERO_RANGE`] with or without it. Any other mode (collapse, insert, unshare) is
/// EOPNOTSUPP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct FallocMode(pub u32);

impl FallocMode {
    /// Leave the file's size alone, even when the range runs past it.
    pub const KEEP_SIZE: FallocMode = FallocMode(ops::FALLOC_FL_KEEP_SIZE as u32);
    /// Deallocate the range (its bytes read as zeros); needs `KEEP_SIZE`.
    pub const PUNCH_HOLE: FallocMode = FallocMode(ops::FALLOC_FL_PUNCH_HOLE as u32);
    /// Make the range read as zeros, allocated.
    pub const ZERO_RANGE: FallocMode = FallocMode(ops::FALLOC_FL_ZERO_RANGE as u32);
}

flag_word!(FallocMode);
