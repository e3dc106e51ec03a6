//! Workload operations as data: generated, printed, parsed back and replayed.
//!
//! A script is operations separated by `;` or newlines, for example
//! `mkdir /A; create /A/x; write /A/x 0 5000 7; fsync /A/x`. Paths are absolute. Written bytes
//! are a pattern of the file offset and a tag, so a script fully determines the contents.

use std::fmt;

/// How `falloc` is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallocMode {
    /// Mode 0: allocate, the size may grow.
    Alloc,
    /// FALLOC_FL_KEEP_SIZE.
    KeepSize,
    /// FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE.
    Punch,
    /// FALLOC_FL_ZERO_RANGE: the size may grow.
    Zero,
    /// FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE.
    ZeroKeepSize,
}

impl FallocMode {
    /// The mode as the library takes it.
    pub fn flags(self) -> lanefs::FallocMode {
        use lanefs::FallocMode as M;
        match self {
            FallocMode::Alloc => M::empty(),
            FallocMode::KeepSize => M::KEEP_SIZE,
            FallocMode::Punch => M::PUNCH_HOLE | M::KEEP_SIZE,
            FallocMode::Zero => M::ZERO_RANGE,
            FallocMode::ZeroKeepSize => M::ZERO_RANGE | M::KEEP_SIZE,
        }
    }
    fn name(self) -> &'static str {
        match self {
            FallocMode::Alloc => "alloc",
            FallocMode::KeepSize => "keep",
            FallocMode::Punch => "punch",
            FallocMode::Zero => "zero",
            FallocMode::ZeroKeepSize => "zerokeep",
        }
    }
}

/// One operation of a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// creat(path).
    Create(String),
    /// mkdir(path).
    Mkdir(String),
    /// link(existing, new).
    Link(String, String),
    /// unlink(path).
    Unlink(String),
    /// rmdir(path).
    Rmdir(String),
    /// rename(from, to).
    Rename(String, String),
    /// rename(2) with RENAME_EXCHANGE.
    Exchange(String, String),
    /// rename(2) with RENAME_WHITEOUT: the source name then holds a new whiteout (a character
    /// device 0:0).
    Whiteout(String, String),
    /// symlink(target, path).
    Symlink(String, String),
    /// Opens a file (keeps its inode alive after its last name goes, until `close`).
    Open(String),
    /// Releases the inode `open` of the same path opened.
    Close(String),
    /// Writes `len` bytes at `off`, a pattern named by `tag`.
    Write {
        /// The file.
        path: String,
        /// Byte offset.
        off: u64,
        /// Bytes to write.
        len: u64,
        /// Which pattern the bytes follow (the oracle derives the data from it).
        tag: u8,
    },
    /// truncate(path, size).
    Truncate {
        /// The file.
        path: String,
        /// The new size.
        size: u64,
    },
    /// fallocate(path, mode, off, len).
    Falloc {
        /// The file.
        path: String,
        /// Allocate, keep size, punch or zero.
        mode: FallocMode,
        /// Byte offset.
        off: u64,
        /// Bytes.
        len: u64,
    },
    /// setxattr(path, name) with a `len`-byte value in the pattern `tag`.
    SetXattr {
        /// The file.
        path: String,
        /// The attribute's name.
        name: String,
        /// Length of the value.
        len: u32,
        /// Which pattern the value follows.
        tag: u8,
    },
    /// removexattr(path, name).
    RemoveXattr {
        /// The file.
        path: String,
        /// The attribute's name.
        name: String,
    },
    /// chmod(path, mode).
    Chmod {
        /// The file.
        path: String,
        /// The new permission bits.
        mode: u32,
    },
    /// fsync(path).
    Fsync(String),
    /// fdatasync(path).
    Fdatasync(String),
    /// sync(): a checkpoint.
    Sync,
    /// Runs the segment cleaner to the end (`Fs::clean`): moves and checkpoints, no promise.
    Clean,
    /// Waits this many milliseconds (at most 1000): lets a background checkpoint start, to
    /// reproduce races. Never generated.
    Sleep(u64),
}

/// The byte a `write` with `tag` puts at file offset `pos`.
pub fn pattern_byte(tag: u8, pos: u64) -> u8 {
    let x = pos.wrapping_mul(0x9E37_79B9).wrapping_add(tag as u64 * 0x1000_0001);
    ((x >> 11) ^ (x >> 3) ^ tag as u64) as u8
}

/// The bytes of a `write`.
pub fn pattern(tag: u8, off: u64, len: u64) -> Vec<u8> {
    (off..off + len).map(|p| pattern_byte(tag, p)).collect()
}

/// The value of a `setxattr`.
pub fn xattr_value(tag: u8, len: u32) -> Vec<u8> {
    pattern(tag ^ 0x5A, 0, len as u64)
}

impl Op {
    /// The operation's kind, as `--avoid` names it: create, mkdir, link, unlink, rmdir,
    /// rename, exchange, whiteout, symlink, open (and close), write, truncate, falloc, xattr, chmod,
    /// fsync, fdatasync, sync.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Create(_) => "create",
            Op::Mkdir(_) => "mkdir",
            Op::Link(..) => "link",
            Op::Unlink(_) => "unlink",
            Op::Rmdir(_) => "rmdir",
            Op::Rename(..) => "rename",
            Op::Exchange(..) => "exchange",
            Op::Whiteout(..) => "whiteout",
            Op::Symlink(..) => "symlink",
            Op::Open(_) | Op::Close(_) => "open",
            Op::Write { .. } => "write",
            Op::Truncate { .. } => "truncate",
            Op::Falloc { .. } => "falloc",
            Op::SetXattr { .. } | Op::RemoveXattr { .. } => "xattr",
            Op::Chmod { .. } => "chmod",
            Op::Fsync(_) => "fsync",
            Op::Fdatasync(_) => "fdatasync",
            Op::Sync => "sync",
            Op::Clean => "clean",
            Op::Sleep(_) => "sleep",
        }
    }

    /// Every kind name.
    pub const KINDS: [&'static str; 16] = [
        "create",
        "mkdir",
        "link",
        "unlink",
        "rmdir",
        "rename",
        "whiteout",
        "write",
        "truncate",
        "falloc",
        "xattr",
        "chmod",
        "fsync",
        "fdatasync",
        "sync",
        "clean",
    ];

    /// Whether the operation is a persistence point (fsync, fdatasync, sync).
    pub fn is_persist(&self) -> bool {
        matches!(self, Op::Fsync(_) | Op::Fdatasync(_) | Op::Sync)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Create(p) => write!(f, "create {p}"),
            Op::Mkdir(p) => write!(f, "mkdir {p}"),
            Op::Link(a, b) => write!(f, "link {a} {b}"),
            Op::Unlink(p) => write!(f, "unlink {p}"),
            Op::Rmdir(p) => write!(f, "rmdir {p}"),
            Op::Rename(a, b) => write!(f, "rename {a} {b}"),
            Op::Exchange(a, b) => write!(f, "exchange {a} {b}"),
            Op::Whiteout(a, b) => write!(f, "whiteout {a} {b}"),
            Op::Symlink(t, p) => write!(f, "symlink {t} {p}"),
            Op::Open(p) => write!(f, "open {p}"),
            Op::Close(p) => write!(f, "close {p}"),
            Op::Write { path, off, len, tag } => write!(f, "write {path} {off} {len} {tag}"),
            Op::Truncate { path, size } => write!(f, "truncate {path} {size}"),
            Op::Falloc { path, mode, off, len } => write!(f, "falloc {path} {} {off} {len}", mode.name()),
            Op::SetXattr { path, name, len, tag } => write!(f, "setxattr {path} {name} {len} {tag}"),
            Op::RemoveXattr { path, name } => write!(f, "removexattr {path} {name}"),
            Op::Chmod { path, mode } => write!(f, "chmod {path} {mode:o}"),
            Op::Fsync(p) => write!(f, "fsync {p}"),
            Op::Fdatasync(p) => write!(f, "fdatasync {p}"),
            Op::Sync => write!(f, "sync"),
            Op::Clean => write!(f, "clean"),
            Op::Sleep(ms) => write!(f, "sleep {ms}"),
        }
    }
}

/// Prints a script: operations joined by "; ".
pub fn script(ops: &[Op]) -> String {
    ops.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

fn path(w: Option<&str>, line: &str) -> Result<String, String> {
    let p = w.ok_or_else(|| format!("`{line}`: missing path"))?;
    if !p.starts_with('/') {
        return Err(format!("`{line}`: path {p} is not absolute"));
    }
    Ok(p.to_string())
}

fn num<T: std::str::FromStr>(w: Option<&str>, line: &str) -> Result<T, String> {
    w.and_then(|s| s.parse().ok()).ok_or_else(|| format!("`{line}`: missing or bad number"))
}

/// Parses one operation.
pub fn parse_op(line: &str) -> Result<Op, String> {
    let mut w = line.split_whitespace();
    let cmd = w.next().ok_or_else(|| "empty operation".to_string())?;
    let op = match cmd {
        "create" => Op::Create(path(w.next(), line)?),
        "mkdir" => Op::Mkdir(path(w.next(), line)?),
        "link" => Op::Link(path(w.next(), line)?, path(w.next(), line)?),
        "unlink" => Op::Unlink(path(w.next(), line)?),
        "rmdir" => Op::Rmdir(path(w.next(), line)?),
        "rename" => Op::Rename(path(w.next(), line)?, path(w.next(), line)?),
        "exchange" => Op::Exchange(path(w.next(), line)?, path(w.next(), line)?),
        "whiteout" => Op::Whiteout(path(w.next(), line)?, path(w.next(), line)?),
        "symlink" => {
            let t = w.next().ok_or_else(|| format!("`{line}`: missing target"))?.to_string();
            Op::Symlink(t, path(w.next(), line)?)
        }
        "open" => Op::Open(path(w.next(), line)?),
        "close" => Op::Close(path(w.next(), line)?),
        "write" => Op::Write {
            path: path(w.next(), line)?,
            off: num(w.next(), line)?,
            len: num(w.next(), line)?,
            tag: num(w.next(), line)?,
        },
        "truncate" => Op::Truncate { path: path(w.next(), line)?, size: num(w.next(), line)? },
        "falloc" => {
            let p = path(w.next(), line)?;
            let mode = match w.next() {
                Some("alloc") => FallocMode::Alloc,
                Some("keep") => FallocMode::KeepSize,
                Some("punch") => FallocMode::Punch,
                Some("zero") => FallocMode::Zero,
                Some("zerokeep") => FallocMode::ZeroKeepSize,
                _ => return Err(format!("`{line}`: falloc mode is alloc, keep, punch, zero or zerokeep")),
            };
            Op::Falloc { path: p, mode, off: num(w.next(), line)?, len: num(w.next(), line)? }
        }
        "setxattr" => Op::SetXattr {
            path: path(w.next(), line)?,
            name: w.next().ok_or_else(|| format!("`{line}`: missing name"))?.to_string(),
            len: num(w.next(), line)?,
            tag: num(w.next(), line)?,
        },
        "removexattr" => Op::RemoveXattr {
            path: path(w.next(), line)?,
            name: w.next().ok_or_else(|| format!("`{line}`: missing name"))?.to_string(),
        },
        "chmod" => {
            let p = path(w.next(), line)?;
            let m = w.next().and_then(|s| u32::from_str_radix(s, 8).ok());
            Op::Chmod { path: p, mode: m.ok_or_else(|| format!("`{line}`: missing octal mode"))? }
        }
        "fsync" => Op::Fsync(path(w.next(), line)?),
        "fdatasync" => Op::Fdatasync(path(w.next(), line)?),
        "sync" => Op::Sync,
        "clean" => Op::Clean,
        "sleep" => Op::Sleep(num::<u64>(w.next(), line)?.min(1000)),
        other => return Err(format!("unknown operation `{other}`")),
    };
    if w.next().is_some() {
        return Err(format!("`{line}`: trailing words"));
    }
    Ok(op)
}

/// Parses a script (operations separated by `;` or newlines; `#` starts a comment).
pub fn parse_script(s: &str) -> Result<Vec<Op>, String> {
    s.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split(';'))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(parse_op)
        .collect()
}

/// Splits an absolute path into parent and last name ("/" has no name).
pub fn split(path: &str) -> Option<(&str, &str)> {
    let p = path.trim_end_matches('/');
    let i = p.rfind('/')?;
    let name = &p[i + 1..];
    if name.is_empty() {
        return None;
    }
    Some((if i == 0 { "/" } else { &p[..i] }, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let s = "mkdir /A; create /A/x; write /A/x 10 5000 7; truncate /A/x 3; falloc /A/x punch 0 4096; \
                 falloc /A/x zero 5 9000; falloc /A/x zerokeep 100 20; setxattr /A/x user.a 12 3; removexattr /A/x user.a; chmod /A/x 600; link /A/x /y; \
                 rename /y /A/z; unlink /A/z; fsync /A; fdatasync /A/x; sync; rmdir /B; exchange /a /b; \
                 symlink ../t /s; open /x; close /x; whiteout /x /w";
        let ops = parse_script(s).unwrap();
        assert_eq!(ops.len(), 22);
        assert_eq!(parse_script(&script(&ops)).unwrap(), ops);
        assert!(parse_script("frobnicate /x").is_err());
        assert!(parse_script("create x").is_err());
        assert!(parse_script("write /x 1 2").is_err());
        assert_eq!(split("/A/x"), Some(("/A", "x")));
        assert_eq!(split("/x"), Some(("/", "x")));
        assert_eq!(split("/"), None);
        assert_eq!(pattern(3, 5, 4).len(), 4);
        assert_eq!(pattern(3, 5, 4)[1], pattern_byte(3, 6));
    }
}
