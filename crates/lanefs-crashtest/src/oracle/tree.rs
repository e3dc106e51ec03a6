//! The few calls the oracle reads a recovered file system with, so that one walk and one check
//! serve a lanefs opened as a library ([`lanefs::Fs`]) and a directory on a mount read through
//! `std::fs` ([`DirTree`]).
//!
//! A tree hands out nodes (an inode number, a path) and answers stat, listing, read, readlink and
//! the extended attributes for them. Every call returns an error as text, never panics, so that a
//! walk of a corrupt image or of a dead mount still ends with something to report.

use lanefs::{FileKind, Fs, Ino, ROOT};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What the oracle needs of an inode's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Inode number.
    pub ino: Ino,
    /// Creation time (seconds, nanoseconds); (0, 0) where the tree cannot tell.
    pub crtime: (i64, u32),
    /// What the inode is.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Type and permission bits, as `st_mode`.
    pub mode: u32,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, u32),
    /// Number of names.
    pub nlink: u64,
}

impl Stat {
    /// The attributes of `a`, as the library reports them.
    pub fn of(a: &lanefs::Attr) -> Stat {
        Stat {
            ino: a.ino,
            crtime: (a.crtime.sec, a.crtime.nsec),
            kind: a.kind,
            size: a.size,
            mode: a.mode,
            mtime: (a.mtime.sec, a.mtime.nsec),
            nlink: u64::from(a.nlink),
        }
    }
}

/// One entry of a directory listing: its name, the node it leads to, and the kind the listing
/// says it has (checked against the node's stat).
#[derive(Debug, Clone)]
pub struct Entry<N> {
    /// The name.
    pub name: Vec<u8>,
    /// The node it names.
    pub node: N,
    /// Its kind as the listing reports it.
    pub kind: FileKind,
}

/// Extended attributes as (name, value) pairs, sorted by name.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// A file system to read back: a library mount or a directory of a kernel mount.
pub trait Tree {
    /// How the tree names an inode.
    type Node: Clone;
    /// The root directory.
    fn root(&self) -> Self::Node;
    /// The attributes of `node`.
    fn stat(&self, node: &Self::Node) -> Result<Stat, String>;
    /// Appends the entries of directory `dir` (without `.` and `..`) to `out`; entries read
    /// before an error stay there.
    fn list(&self, dir: &Self::Node, out: &mut Vec<Entry<Self::Node>>) -> Result<(), String>;
    /// Reads at `off` into `buf`; the bytes read (0 at the end).
    fn read(&self, node: &Self::Node, off: u64, buf: &mut [u8]) -> Result<usize, String>;
    /// A symlink's target.
    fn readlink(&self, node: &Self::Node) -> Result<Vec<u8>, String>;
    /// The extended attributes, at most `max`, sorted by name.
    fn xattrs(&self, node: &Self::Node, max: usize) -> Result<Xattrs, String>;
}

/// Listing rounds at most, so that a directory whose cookies cycle still ends.
const MAX_LIST_ROUNDS: usize = 200_000;
/// Entries of one directory at most (the walk's bound on inodes): a corrupt directory that
/// lists without end must not make the walk allocate without end.
const MAX_LIST_ENTRIES: usize = 200_000;

fn too_many<N>(out: &[Entry<N>]) -> Result<(), String> {
    if out.len() > MAX_LIST_ENTRIES {
        return Err(format!("more than {MAX_LIST_ENTRIES} entries"));
    }
    Ok(())
}

impl Tree for Fs {
    type Node = Ino;

    fn root(&self) -> Ino {
        ROOT
    }

    fn stat(&self, ino: &Ino) -> Result<Stat, String> {
        self.getattr(*ino).map(|a| Stat::of(&a)).map_err(|e| e.to_string())
    }

    fn list(&self, dir: &Ino, out: &mut Vec<Entry<Ino>>) -> Result<(), String> {
        let mut cookie = 0u64;
        for _ in 0..MAX_LIST_ROUNDS {
            let page = self.readdir(*dir, cookie, 64).map_err(|e| e.to_string())?;
            if page.is_empty() {
                return Ok(());
            }
            let mut advanced = false;
            for e in page {
                if e.cookie > cookie {
                    advanced = true;
                    cookie = e.cookie;
                }
                if e.name != b"." && e.name != b".." {
                    out.push(Entry { name: e.name, node: e.ino, kind: e.kind });
                }
            }
            too_many(out)?;
            if !advanced {
                return Err("cookie does not advance".into());
            }
        }
        Err("does not end".into())
    }

    fn read(&self, ino: &Ino, off: u64, buf: &mut [u8]) -> Result<usize, String> {
        self.read_at(*ino, off, buf).map_err(|e| e.to_string())
    }

    fn readlink(&self, ino: &Ino) -> Result<Vec<u8>, String> {
        Fs::readlink(self, *ino).map_err(|e| e.to_string())
    }

    fn xattrs(&self, ino: &Ino, max: usize) -> Result<Xattrs, String> {
        let names = self.listxattr(*ino).map_err(|e| format!("listxattr: {e}"))?;
        let mut out = Vec::new();
        for n in names.into_iter().take(max) {
            let v = self.getxattr(*ino, &n).map_err(|e| format!("getxattr: {e}"))?;
            out.push((n, v));
        }
        out.sort();
        Ok(out)
    }
}

/// A directory read through `std::fs`: the root of a kernel mount, as a program sees it.
/// Symlinks are not followed.
#[derive(Debug, Clone)]
pub struct DirTree {
    /// The directory the tree starts at.
    pub root: PathBuf,
}

fn kind_of(t: std::fs::FileType) -> FileKind {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        FileKind::Dir
    } else if t.is_symlink() {
        FileKind::Symlink
    } else if t.is_fifo() {
        FileKind::Fifo
    } else if t.is_socket() {
        FileKind::Socket
    } else if t.is_char_device() {
        FileKind::CharDevice
    } else if t.is_block_device() {
        FileKind::BlockDevice
    } else {
        FileKind::File
    }
}

fn io_text(p: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", p.display())
}

impl Tree for DirTree {
    type Node = PathBuf;

    fn root(&self) -> PathBuf {
        self.root.clone()
    }

    fn stat(&self, p: &PathBuf) -> Result<Stat, String> {
        let md = std::fs::symlink_metadata(p).map_err(|e| io_text(p, e))?;
        // The birth time where statx has one; a mount that reports none leaves the inode
        // number alone to name the inode.
        let crtime = md
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or((0, 0), |d| (d.as_secs() as i64, d.subsec_nanos()));
        Ok(Stat {
            ino: md.ino(),
            crtime,
            kind: kind_of(md.file_type()),
            size: md.len(),
            mode: md.mode(),
            mtime: (md.mtime(), md.mtime_nsec() as u32),
            nlink: md.nlink(),
        })
    }

    fn list(&self, dir: &PathBuf, out: &mut Vec<Entry<PathBuf>>) -> Result<(), String> {
        use std::os::unix::ffi::OsStrExt;
        for e in std::fs::read_dir(dir).map_err(|e| io_text(dir, e))? {
            let e = e.map_err(|e| io_text(dir, e))?;
            let kind = kind_of(e.file_type().map_err(|err| io_text(&e.path(), err))?);
            out.push(Entry { name: e.file_name().as_bytes().to_vec(), node: e.path(), kind });
            too_many(out)?;
        }
        Ok(())
    }

    fn read(&self, p: &PathBuf, off: u64, buf: &mut [u8]) -> Result<usize, String> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(p).map_err(|e| io_text(p, e))?;
        f.read_at(buf, off).map_err(|e| io_text(p, e))
    }

    fn readlink(&self, p: &PathBuf) -> Result<Vec<u8>, String> {
        use std::os::unix::ffi::OsStrExt;
        std::fs::read_link(p).map(|t| t.as_os_str().as_bytes().to_vec()).map_err(|e| io_text(p, e))
    }

    fn xattrs(&self, p: &PathBuf, max: usize) -> Result<Xattrs, String> {
        let mut names = vec![0u8; 64 << 10];
        let n = rustix::fs::llistxattr(p, &mut names[..])
            .map_err(|e| format!("{}: listxattr: {e}", p.display()))?;
        let mut out = Vec::new();
        for name in names[..n].split(|&b| b == 0).filter(|s| !s.is_empty()).take(max) {
            let mut v = vec![0u8; 64 << 10];
            let k = rustix::fs::lgetxattr(p, name, &mut v[..])
                .map_err(|e| format!("{}: getxattr {}: {e}", p.display(), String::from_utf8_lossy(name)))?;
            v.truncate(k);
            out.push((name.to_vec(), v));
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::walk_tree;

    /// A directory read through `std::fs` comes back as the library's walk would show it:
    /// entries, kinds, contents, symlink targets, name counts.
    #[test]
    fn a_directory_walks_like_a_mount() {
        let top = std::env::temp_dir().join(format!("lanefs-crashtest-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&top);
        std::fs::create_dir_all(top.join("d/e")).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(top.join("d/f"), &data).unwrap();
        std::fs::hard_link(top.join("d/f"), top.join("d/e/g")).unwrap();
        std::os::unix::fs::symlink("d/f", top.join("s")).unwrap();
        let rec = walk_tree(&DirTree { root: top.clone() });
        std::fs::remove_dir_all(&top).unwrap();
        assert!(rec.problems.is_empty(), "{:?}", rec.problems);
        let id_at = |p: &str| rec.paths.iter().find(|(q, _)| q == p).map(|x| x.1).unwrap();
        let (f, g, s) = (id_at("/d/f"), id_at("/d/e/g"), id_at("/s"));
        assert_eq!(f, g, "one inode under two names");
        assert_eq!(rec.name_count[&f], 2);
        assert_eq!(rec.nlink[&f], 2);
        assert_eq!(rec.files[&f].size, 10_000);
        assert_eq!(rec.files[&f].small, data);
        assert_eq!(rec.files[&s].kind, FileKind::Symlink);
        assert_eq!(rec.files[&s].small, b"d/f");
        assert_eq!(rec.kinds[&id_at("/d/e")], FileKind::Dir);
        let root_names: Vec<&[u8]> = rec.entries[&rec.root].keys().map(|k| k.as_slice()).collect();
        assert_eq!(root_names, [b"d".as_slice(), b"s"]);
    }
}
