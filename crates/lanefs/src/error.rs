//! Error type shared by every layer.
//!
//! Each variant maps to one errno for callers that speak POSIX (the FUSE adapter) and renders as
//! one line for a human. Format errors name the structure and the block so that a corrupt image
//! is reported precisely instead of panicking.

use std::fmt;
use std::path::PathBuf;

/// Which on-disk structure a format error was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structure {
    /// The superblock (blocks 0 and 1).
    Superblock,
    /// A checkpoint pack.
    Checkpoint,
    /// A NAT block (node id -> block address).
    Nat,
    /// A SIT block (segment validity).
    Sit,
    /// An SSA block (block owners).
    Ssa,
    /// A node: inode, direct or indirect node.
    Node,
    /// A dentry block.
    Dentry,
    /// A journal block.
    Journal,
    /// An xattr block (the stream of a large xattr set).
    Xattr,
    /// The persistent-memory region (`--nvm FILE`): its NAT or lane journals.
    Region,
}

impl fmt::Display for Structure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Structure::Superblock => "superblock",
            Structure::Checkpoint => "checkpoint pack",
            Structure::Nat => "NAT block",
            Structure::Sit => "SIT block",
            Structure::Ssa => "SSA (segment summary) block",
            Structure::Node => "node block",
            Structure::Dentry => "dentry block",
            Structure::Journal => "journal block",
            Structure::Xattr => "xattr block",
            Structure::Region => "persistent-memory region",
        };
        f.write_str(s)
    }
}

/// What is wrong with a persistent-memory region file (`--nvm FILE`, see `crate::pmem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionFault {
    /// The file does not exist (and was not to be created).
    Missing,
    /// The file does not start with a region header, or one of an unsupported version.
    NotRegion,
    /// The header fails its checksum or holds impossible values.
    Corrupt,
    /// The region is bound to another image (UUID mismatch).
    WrongImage,
    /// The region is bound to the image but does not hold its current state (an older copy,
    /// or one created after the image moved its NAT into another region).
    Stale,
    /// The file is shorter than its header says.
    Truncated,
    /// The region (or a size asked for) is below what is needed.
    TooSmall,
    /// Another process holds the region.
    InUse,
    /// The file could not be created, read, mapped or synced.
    Io,
}

/// Everything that can go wrong, from I/O to a corrupt image.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The device failed (also EIO after a shutdown).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A decode found bytes that are not a valid instance of `structure`.
    #[error("corrupt {structure}{}: {reason}", at_block(*.block))]
    Corrupt {
        /// The structure being decoded.
        structure: Structure,
        /// Its block address, when it was read from one.
        block: Option<u64>,
        /// What was wrong with it.
        reason: String,
    },
    /// The image is not lanefs at all, or of an unsupported version.
    #[error("not a lanefs image: {0}")]
    NotLanefs(String),
    /// A caller asked for something the geometry cannot hold.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The file system is full (ENOSPC), before any change was made.
    #[error("no space left on device")]
    NoSpace,
    /// A persistent-memory region that cannot be used, naming its file.
    #[error("persistent-memory region {}: {reason}", path.display())]
    Region {
        /// The region's file.
        path: PathBuf,
        /// What kind of fault, for callers that act on it.
        fault: RegionFault,
        /// What was wrong, in words.
        reason: String,
    },
    /// A POSIX error for the caller, with what it was about.
    #[error("{what}: {}", errno_text(*errno))]
    Errno {
        /// The errno (`libc::E*`).
        errno: i32,
        /// What it was about: a name, an operation.
        what: String,
    },
}

fn errno_text(errno: i32) -> String {
    let s = std::io::Error::from_raw_os_error(errno).to_string();
    // "No such file or directory (os error 2)" -> "No such file or directory"
    s.split(" (os error").next().unwrap_or(&s).to_string()
}

fn at_block(b: Option<u64>) -> String {
    match b {
        Some(b) => format!(" at block {b}"),
        None => String::new(),
    }
}

impl Error {
    /// A corruption error for `structure`, optionally at a block address.
    pub fn corrupt(structure: Structure, block: Option<u64>, reason: impl Into<String>) -> Self {
        Error::Corrupt { structure, block, reason: reason.into() }
    }

    /// A POSIX error.
    pub fn errno(errno: i32, what: impl Into<String>) -> Self {
        Error::Errno { errno, what: what.into() }
    }

    /// A region error for the file at `path`.
    pub fn region(path: impl Into<PathBuf>, fault: RegionFault, reason: impl Into<String>) -> Self {
        Error::Region { path: path.into(), fault, reason: reason.into() }
    }

    /// The errno a POSIX caller should see.
    /// Whether this is the EIO every operation gets after `Fs::shutdown`.
    pub fn is_shut_down(&self) -> bool {
        matches!(self, Error::Io(e) if e.get_ref().is_some_and(|c| c.is::<crate::device::halt::ShutDown>()))
    }

    /// The errno this error stands for (EIO for corruption, ENOSPC, the errno of an I/O error).
    pub fn to_errno(&self) -> i32 {
        match self {
            Error::Errno { errno, .. } => *errno,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt { .. } | Error::NotLanefs(_) => libc::EUCLEAN,
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::NoSpace => libc::ENOSPC,
            Error::Region { fault, .. } => match fault {
                RegionFault::Missing => libc::ENOENT,
                RegionFault::InUse => libc::EBUSY,
                RegionFault::TooSmall => libc::EINVAL,
                RegionFault::Io => libc::EIO,
                RegionFault::NotRegion
                | RegionFault::Corrupt
                | RegionFault::WrongImage
                | RegionFault::Stale
                | RegionFault::Truncated => libc::EUCLEAN,
            },
        }
    }
}

/// Result with lanefs's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.to_errno()).kind(), e.to_string())
    }
}
