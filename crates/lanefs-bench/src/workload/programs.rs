//! Workloads that replay what real programs ask of a file system: `untar` unpacks a source tree
//! as `tar xf` does and then checks it as `git status` does.

use super::*;
use std::time::SystemTime;

/// Files in one tree (before `--fill` scaling): a mid-sized source tree.
pub(super) const TREE_FILES: usize = 3072;
/// Top-level directories, each with as many subdirectories; the files are spread over the
/// subdirectories.
const TREE_WIDTH: usize = 8;
/// File sizes of a source tree, each drawn with its weight: most files a few KiB, a tail of
/// large ones (generated code, data, images).
const FILE_SIZES: [(usize, u64); 8] =
    [(300, 10), (1200, 15), (2500, 15), (4096, 15), (7000, 15), (12_000, 15), (40_000, 10), (250_000, 5)];
/// The modification time every member carries (as in an archive), set as tar sets it.
const ARCHIVE_MTIME_SECS: u64 = 1_700_000_000;

/// One member of the archive, its path relative to the tree's root.
pub(super) enum Member {
    Dir(PathBuf),
    File(PathBuf, usize),
}

/// The archive: directories before what they contain, as tar writes them. The same on every
/// target and every run (a fixed seed).
pub(super) fn source_tree(files: usize) -> Vec<Member> {
    let mut rng = Rng::new(0x7a5);
    let total: u64 = FILE_SIZES.iter().map(|s| s.1).sum();
    let leaves = TREE_WIDTH * TREE_WIDTH;
    let per_leaf = files.div_ceil(leaves).max(1);
    let mut out = Vec::with_capacity(files + leaves + TREE_WIDTH);
    let mut made = 0;
    for a in 0..TREE_WIDTH {
        let top = PathBuf::from(format!("d{a}"));
        out.push(Member::Dir(top.clone()));
        for b in 0..TREE_WIDTH {
            let sub = top.join(format!("s{b}"));
            out.push(Member::Dir(sub.clone()));
            for i in 0..per_leaf.min(files - made) {
                let mut pick = rng.below(total);
                let size = FILE_SIZES
                    .iter()
                    .find(|(_, w)| {
                        let hit = pick < *w;
                        pick = pick.saturating_sub(*w);
                        hit
                    })
                    .map_or(FILE_SIZES[0].0, |s| s.0);
                out.push(Member::File(sub.join(format!("f{i}.c")), size));
                made += 1;
            }
        }
    }
    debug_assert_eq!(made, files);
    out
}

/// untar: one thread's unpacking and checking of its own copy of the tree, again and again.
pub(super) struct Unpack<'a> {
    t: &'a dyn Target,
    /// The thread's directory; each round's tree is `tree{round}` in it.
    home: PathBuf,
    members: &'a [Member],
    round: u64,
    /// Position in the round: below `members.len()` the next member to extract, then the next
    /// member to check.
    next: usize,
    content: Vec<u8>,
}

impl<'a> Unpack<'a> {
    pub(super) fn new(t: &'a dyn Target, home: PathBuf, members: &'a [Member], tid: usize) -> Unpack<'a> {
        let longest = FILE_SIZES.iter().map(|s| s.0).max().unwrap_or(0);
        let content = (0..longest).map(|i| (i as u8).wrapping_mul(31).wrapping_add(tid as u8)).collect();
        Unpack { t, home, members, round: 0, next: 0, content }
    }

    pub(super) fn tree(&self) -> PathBuf {
        self.home.join(format!("tree{}", self.round))
    }
}

impl Worker for Unpack<'_> {
    fn op(&mut self, _fsync: &mut Histogram) -> io::Result<Step> {
        let n = self.members.len();
        let (checking, m) = if self.next < n {
            (false, &self.members[self.next])
        } else {
            (true, &self.members[self.next - n])
        };
        let tree = self.tree();
        match (checking, m) {
            (false, Member::Dir(p)) => self.t.mkdir(&tree.join(p))?,
            (false, Member::File(p, len)) => {
                let f = self.t.open(&tree.join(p), OpenOptions::create_new())?;
                f.write_all_at(&self.content[..*len], 0)?;
                let when = SystemTime::UNIX_EPOCH + Duration::from_secs(ARCHIVE_MTIME_SECS);
                f.set_times(when, when)?;
            }
            (true, Member::Dir(p)) => {
                self.t.readdir(&tree.join(p))?;
            }
            (true, Member::File(p, len)) => {
                let st = self.t.stat(&tree.join(p))?;
                if st.size != *len as u64 {
                    return Err(io::Error::other(format!(
                        "{}: size {} after writing {len}",
                        p.display(),
                        st.size
                    )));
                }
            }
        }
        self.next += 1;
        Ok(if self.next == 2 * n { Step::Maintain } else { Step::Done })
    }

    /// Removes the checked tree (children before their directory) and starts the next round.
    fn maintain(&mut self) -> io::Result<()> {
        let tree = self.tree();
        for m in self.members.iter().rev() {
            match m {
                Member::File(p, _) => self.t.unlink(&tree.join(p))?,
                Member::Dir(p) => self.t.rmdir(&tree.join(p))?,
            }
        }
        self.t.rmdir(&tree)?;
        self.round += 1;
        self.next = 0;
        self.t.mkdir(&self.tree())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::DirTarget;
    use std::collections::HashSet;

    #[test]
    fn the_archive_is_a_source_tree_with_directories_first() {
        let tree = source_tree(TREE_FILES);
        let mut dirs = HashSet::new();
        let mut sizes = Vec::new();
        for m in &tree {
            match m {
                Member::Dir(p) => {
                    let parent = p.parent().filter(|q| !q.as_os_str().is_empty());
                    if let Some(q) = parent {
                        assert!(dirs.contains(q), "{} before its parent", p.display());
                    }
                    dirs.insert(p.clone());
                }
                Member::File(p, len) => {
                    assert!(dirs.contains(p.parent().unwrap()), "{} before its directory", p.display());
                    sizes.push(*len);
                }
            }
        }
        assert_eq!(sizes.len(), TREE_FILES);
        assert_eq!(dirs.len(), TREE_WIDTH + TREE_WIDTH * TREE_WIDTH);
        sizes.sort_unstable();
        let median = sizes[sizes.len() / 2];
        assert!((2500..=7000).contains(&median), "median {median}");
        assert_eq!(sizes.last(), Some(&250_000));
        assert_eq!(source_tree(100).iter().filter(|m| matches!(m, Member::File(..))).count(), 100);
    }

    /// One round through a real directory: every member unpacked, then checked, then the tree
    /// removed and the next round's directory made.
    #[test]
    fn a_round_unpacks_checks_and_removes_its_tree() {
        let dir = tempfile::tempdir().unwrap();
        let t = DirTarget::new(dir.path()).unwrap();
        let members = source_tree(100);
        t.mkdir(Path::new("t0")).unwrap();
        let mut w = Unpack::new(&t, PathBuf::from("t0"), &members, 0);
        t.mkdir(&w.tree()).unwrap();
        let mut h = Histogram::new();
        let mut ops = 0;
        while w.op(&mut h).unwrap() == Step::Done {
            ops += 1;
        }
        assert_eq!(ops + 1, 2 * members.len());
        let f = dir.path().join("t0/tree0/d0/s0/f0.c");
        let md = std::fs::metadata(&f).unwrap();
        assert_eq!(md.modified().unwrap(), SystemTime::UNIX_EPOCH + Duration::from_secs(ARCHIVE_MTIME_SECS));
        w.maintain().unwrap();
        assert!(!dir.path().join("t0/tree0").exists());
        assert_eq!(std::fs::read_dir(dir.path().join("t0/tree1")).unwrap().count(), 0);
    }
}
