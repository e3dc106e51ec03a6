//! The contract's rules for one object, kept as a workload goes: which values a name may show
//! after a crash ([`Versions`]), and which bytes, size, permission bits and mtime a file may
//! show ([`FileModel`]).
//!
//! [`check`](super::check) applies the first rule to the history of a recorded device, where
//! every version is tagged with the write-log position it was made at; a test that kills a
//! real process (the SIGKILL test of the mount) keeps one [`Versions`] per name, with the
//! newest version a returned fsync made durable, and one [`FileModel`] per file. A file there
//! is not a list of versions: the kernel's writeback and the daemon send the writes since the
//! last fsync in any order and in pieces, so after a crash each byte may hold what it held at
//! the last fsync or what any write since put there, its size may be any size it had since,
//! its permission bits any it was given since, and its mtime anything from the one the last
//! fsync made durable on (exactly that one while nothing has written to the file since).

use super::Ver;

/// Which versions of `vs` a crash image may show, given a promise of version `p` (0: none)
/// and the writes below `upper`: the promised version, and every later one made before
/// `upper` (a base version always counts as made).
pub(crate) fn allowed<T>(vs: &[Ver<T>], p: usize, upper: usize) -> impl Iterator<Item = usize> + '_ {
    let p = p.min(vs.len().saturating_sub(1));
    (p..vs.len()).filter(move |&i| i == p || vs[i].base || vs[i].ev < upper)
}

/// The versions of one object (a directory entry, say) and the newest one that a returned
/// fsync made durable: after a crash the object shows that version or a later one.
///
/// Each version carries the position on the workload's timeline at which the operation that
/// made it started (`ev`: a write-log length, or an operation's sequence number).
#[derive(Debug, Clone)]
pub struct Versions<T> {
    vers: Vec<Ver<T>>,
    durable: usize,
}

impl<T> Versions<T> {
    /// An object whose only version, `val`, is durable (a base version).
    pub fn new(val: T) -> Versions<T> {
        Versions { vers: vec![Ver { ev: 0, base: true, val }], durable: 0 }
    }

    /// A new version `val`, made by an operation that started at `ev`; returns its index.
    pub fn set(&mut self, ev: usize, val: T) -> usize {
        self.vers.push(Ver { ev, base: false, val });
        self.vers.len() - 1
    }

    /// The newest version's value.
    pub fn current(&self) -> &T {
        &self.vers.last().expect("a version").val
    }

    /// The index of the durable version.
    pub fn durable(&self) -> usize {
        self.durable
    }

    /// The durable version's value.
    pub fn durable_value(&self) -> &T {
        &self.vers[self.durable].val
    }

    /// Every version, oldest first.
    pub fn versions(&self) -> &[Ver<T>] {
        &self.vers
    }

    /// The newest version is durable (an fsync that covers the object returned).
    pub fn make_durable(&mut self) {
        self.durable = self.vers.len() - 1;
    }

    /// The newest version made at or before `ev` is durable, unless a later one already is (an
    /// fsync of the other side of a rename made at `ev`).
    pub fn make_durable_at(&mut self, ev: usize) {
        let i = self.vers.iter().rposition(|v| v.ev <= ev).unwrap_or(0);
        self.durable = self.durable.max(i);
    }

    /// The values a crash may leave: the durable version's and those of the later versions
    /// made before `upper` (`usize::MAX`: every version may have been made).
    pub fn allowed(&self, upper: usize) -> impl Iterator<Item = &T> + '_ {
        allowed(&self.vers, self.durable, upper).map(|i| &self.vers[i].val)
    }

    /// The versions as `value@ev -> ...`, the durable one marked, each value shown by `show`
    /// (for messages).
    pub fn describe(&self, show: impl Fn(&T) -> String) -> String {
        let v: Vec<String> = self
            .vers
            .iter()
            .enumerate()
            .map(|(i, v)| {
                format!("{}{}@{}", if i == self.durable { "durable:" } else { "" }, show(&v.val), v.ev)
            })
            .collect();
        v.join(" -> ")
    }
}

/// The byte a write of `generation` puts at file offset `pos`: how a [`FileModel`] knows the
/// content of a write it recorded by generation only. Never asked for generation 0.
pub type Pattern = fn(generation: u64, pos: u64) -> u8;

/// What a file may show after a crash of the process serving it: its content, size and
/// permission bits at the last fsync, what it has now, and what was written since.
///
/// Writes are recorded by offset, length and generation (the bytes come from the
/// [`Pattern`]; generation 0 is zeros, as truncation and holes leave them), so that a model of
/// many large writes stays small. After a crash:
/// - the size lies between the smallest and the largest size the file had since its last
///   fsync or fdatasync (that size, when nothing changed it since);
/// - each byte is the byte the last fsync made durable (zero past the durable size), the byte
///   there now, or one a write or truncation since put there: a torn mix of generations is
///   allowed, a byte from a generation never written there is not;
/// - the permission bits are those at the last fsync or any given since;
/// - the mtime is at least the one the last fsync made durable, and exactly that one while
///   nothing has written to or truncated the file since.
#[derive(Debug, Clone)]
pub struct FileModel {
    pattern: Pattern,
    /// Permission bits: at the last fsync, now, and those given since.
    mode_durable: u32,
    mode_cur: u32,
    modes_since: Vec<u32>,
    /// The mtime at the last fsync (a lower bound after a crash); `mtime_exact` while nothing
    /// has written to the file since (then it must be exactly that).
    mtime: (i64, u32),
    mtime_exact: bool,
    /// The content at the last fsync and now.
    durable: Vec<u8>,
    cur: Vec<u8>,
    /// Writes and truncations since the last fsync: (offset, length, generation).
    since: Vec<(u64, u64, u64)>,
    /// The smallest and largest size since the last fsync.
    min: u64,
    max: u64,
}

impl FileModel {
    /// A file whose state is durable: `content`, permission bits `mode`, and `mtime`, exactly,
    /// or `None` when it is not known (any mtime is then allowed until
    /// [`fsynced_mtime`](Self::fsynced_mtime) tells one). Writes take their bytes from
    /// `pattern`.
    pub fn new(content: Vec<u8>, mode: u32, mtime: Option<(i64, u32)>, pattern: Pattern) -> FileModel {
        let n = content.len() as u64;
        FileModel {
            pattern,
            mode_durable: mode,
            mode_cur: mode,
            modes_since: Vec::new(),
            mtime: mtime.unwrap_or((i64::MIN, 0)),
            mtime_exact: mtime.is_some(),
            durable: content.clone(),
            cur: content,
            since: Vec::new(),
            min: n,
            max: n,
        }
    }

    /// The byte generation `g` puts at `pos`.
    fn byte(&self, g: u64, pos: u64) -> u8 {
        if g == 0 {
            0
        } else {
            (self.pattern)(g, pos)
        }
    }

    /// A write of `len` bytes of `generation` at `off` (generation 0: zeros).
    pub fn write(&mut self, off: u64, len: u64, generation: u64) {
        let end = (off + len) as usize;
        if self.cur.len() < end {
            self.cur.resize(end, 0);
        }
        for (k, b) in self.cur[off as usize..end].iter_mut().enumerate() {
            *b = if generation == 0 { 0 } else { (self.pattern)(generation, off + k as u64) };
        }
        self.since.push((off, len, generation));
        self.max = self.max.max(end as u64);
        self.mtime_exact = false;
    }

    /// A truncation (or extension) to `len` bytes: the bytes between the old and the new size
    /// may read as zeros after a crash.
    pub fn truncate(&mut self, len: u64) {
        let old = self.cur.len() as u64;
        if len < old {
            self.since.push((len, old - len, 0));
        } else if len > old {
            self.since.push((old, len - old, 0));
        }
        self.cur.resize(len as usize, 0);
        self.min = self.min.min(len);
        self.max = self.max.max(len);
        self.mtime_exact = false;
    }

    /// A chmod to permission bits `mode`.
    pub fn set_mode(&mut self, mode: u32) {
        self.mode_cur = mode;
        self.modes_since.push(mode);
    }

    /// An fdatasync returned: the content and size now are durable.
    pub fn fdatasync(&mut self) {
        self.durable = self.cur.clone();
        self.since.clear();
        self.min = self.cur.len() as u64;
        self.max = self.min;
    }

    /// An fsync returned: the content, size and permission bits now are durable (the mtime it
    /// made durable is [`fsynced_mtime`](Self::fsynced_mtime)'s).
    pub fn fsync(&mut self) {
        self.fdatasync();
        self.mode_durable = self.mode_cur;
        self.modes_since.clear();
    }

    /// The mtime the last fsync made durable, read after it returned with nothing written to
    /// the file in between: until the next write or truncation it must be found exactly.
    pub fn fsynced_mtime(&mut self, mtime: (i64, u32)) {
        self.mtime = mtime;
        self.mtime_exact = true;
    }

    /// The size the last fsync or fdatasync made durable.
    pub fn durable_len(&self) -> u64 {
        self.durable.len() as u64
    }

    /// The content now (before a crash).
    pub fn content(&self) -> &[u8] {
        &self.cur
    }

    /// Whether a file with content `got`, permission bits `mode` and `mtime` is a state this
    /// file may be found in after a crash; if not, why.
    pub fn check(&self, got: &[u8], mode: u32, mtime: (i64, u32)) -> Result<(), String> {
        if mode != self.mode_durable && !self.modes_since.contains(&mode) {
            return Err(format!(
                "mode {mode:o}, fsynced {:o}, given since {:?}",
                self.mode_durable,
                self.modes_since.iter().map(|m| format!("{m:o}")).collect::<Vec<_>>()
            ));
        }
        if (self.mtime_exact && mtime != self.mtime) || mtime < self.mtime {
            return Err(format!(
                "mtime {mtime:?}, fsynced {:?}{}",
                self.mtime,
                if self.mtime_exact { " and not written since" } else { "" }
            ));
        }
        let n = got.len() as u64;
        let fsynced = self.durable.len();
        if n < self.min || n > self.max {
            return Err(format!(
                "size {n}, allowed {}..={} (fsynced size {fsynced}, size before the crash {})",
                self.min,
                self.max,
                self.cur.len()
            ));
        }
        if got == self.cur || got == self.durable {
            return Ok(());
        }
        for (c, chunk) in got.chunks(4096).enumerate() {
            let start = c * 4096;
            let end = start + chunk.len();
            if self.cur.get(start..end) == Some(chunk) || self.durable.get(start..end) == Some(chunk) {
                continue;
            }
            for (k, &b) in chunk.iter().enumerate() {
                let i = start + k;
                let base = self.durable.get(i).copied().unwrap_or(0);
                if b == base || self.cur.get(i) == Some(&b) {
                    continue;
                }
                let p = i as u64;
                if self.since.iter().any(|&(o, l, g)| p >= o && p < o + l && self.byte(g, p) == b) {
                    continue;
                }
                return Err(format!(
                    "byte {i} is {b:#04x}: neither the fsynced {base:#04x} nor a byte written there since \
                     ({}; fsynced size {fsynced}, size now {n}, before the crash {})",
                    if i < fsynced { "inside the fsynced range" } else { "past the fsynced size" },
                    self.cur.len()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pattern whose bytes depend on generation and offset.
    fn pat(g: u64, pos: u64) -> u8 {
        lanefs::rng::splitmix64(g ^ lanefs::rng::splitmix64(pos)) as u8
    }

    fn bytes(g: u64, off: u64, len: u64) -> Vec<u8> {
        (off..off + len).map(|p| pat(g, p)).collect()
    }

    const T: (i64, u32) = (100, 5);

    /// A file fsynced with 8 KiB of generation 7 and mtime `T`.
    fn fsynced() -> FileModel {
        let mut f = FileModel::new(Vec::new(), 0o644, None, pat);
        f.write(0, 8192, 7);
        f.fsync();
        f.fsynced_mtime(T);
        f
    }

    #[test]
    fn allowed_versions() {
        let vs = vec![
            Ver { ev: 0, base: true, val: 0 },
            Ver { ev: 5, base: false, val: 1 },
            Ver { ev: 9, base: false, val: 2 },
        ];
        assert_eq!(allowed(&vs, 0, 0).collect::<Vec<_>>(), vec![0]);
        assert_eq!(allowed(&vs, 0, 6).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(allowed(&vs, 1, 6).collect::<Vec<_>>(), vec![1]);
        assert_eq!(allowed(&vs, 1, 10).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(allowed(&vs, 7, 10).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn a_name_shows_its_durable_version_or_a_later_one() {
        let mut n = Versions::new(None);
        n.set(3, Some('a'));
        n.set(5, None);
        n.set(8, Some('b'));
        let all = |n: &Versions<Option<char>>| n.allowed(usize::MAX).copied().collect::<Vec<_>>();
        assert_eq!(all(&n), [None, Some('a'), None, Some('b')]);
        assert_eq!(*n.current(), Some('b'));
        // A rename at 6 made durable by an fsync of its other side: the version of 5 on.
        n.make_durable_at(6);
        assert_eq!((n.durable(), *n.durable_value()), (2, None));
        assert_eq!(all(&n), [None, Some('b')]);
        // Never back to an older one.
        n.make_durable_at(4);
        assert_eq!(n.durable(), 2);
        n.make_durable();
        assert_eq!(all(&n), [Some('b')]);
        assert_eq!(
            n.describe(|v| format!("{v:?}")),
            "None@0 -> Some('a')@3 -> None@5 -> durable:Some('b')@8"
        );
        // A crash bound: versions made from `upper` on are not allowed.
        let mut m = Versions::new(0);
        m.set(4, 1);
        m.set(9, 2);
        assert_eq!(m.allowed(5).copied().collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn the_fsynced_state_and_the_last_one_are_allowed() {
        let mut f = fsynced();
        let old = f.content().to_vec();
        assert_eq!(f.check(&old, 0o644, T), Ok(()));
        f.write(4096, 8192, 8);
        let new = f.content().to_vec();
        assert_eq!(new.len(), 12288);
        assert_eq!(f.check(&new, 0o644, (T.0 + 1, 0)), Ok(()));
        assert_eq!(f.check(&old, 0o644, T), Ok(()));
    }

    #[test]
    fn a_torn_mix_of_generations_is_allowed() {
        let mut f = fsynced();
        f.write(0, 8192, 8);
        f.write(2000, 4000, 9);
        // Bytes of 7, 8 and 9 interleaved, each where its write put it.
        let mut got = bytes(7, 0, 8192);
        got[100..200].copy_from_slice(&bytes(8, 100, 100));
        got[2500..2600].copy_from_slice(&bytes(9, 2500, 100));
        got[3000..3001].copy_from_slice(&bytes(8, 3000, 1));
        assert_eq!(f.check(&got, 0o644, T), Ok(()));
    }

    #[test]
    fn a_byte_from_a_generation_never_written_there_is_refused() {
        let mut f = fsynced();
        f.write(0, 100, 8);
        // Generation 8 just past its write; generation 5, never written.
        for (g, at) in [(8, 100usize), (5, 10)] {
            let b = pat(g, at as u64);
            assert!(b != pat(7, at as u64) && b != f.content()[at], "the test's bytes must differ");
            let mut got = f.content().to_vec();
            got[at] = b;
            let e = f.check(&got, 0o644, T).unwrap_err();
            assert!(e.starts_with(&format!("byte {at} ")), "{e}");
        }
        // A byte of the fsynced range changed, past the write since.
        let mut got = bytes(7, 0, 8192);
        got[5000] ^= 0x55;
        assert!(f.check(&got, 0o644, T).unwrap_err().contains("inside the fsynced range"));
        // Past the fsynced size, a byte of a generation written elsewhere.
        f.write(8192, 100, 9);
        let mut got = f.content().to_vec();
        got[8200] = pat(8, 8200);
        assert_ne!(got[8200], pat(9, 8200));
        assert_ne!(got[8200], 0);
        assert!(f.check(&got, 0o644, T).unwrap_err().contains("past the fsynced size"));
    }

    #[test]
    fn truncation_leaves_zeros_and_bounds_the_size() {
        let mut f = fsynced();
        // Shorter than the durable size, nothing since: refused.
        assert!(f.check(&bytes(7, 0, 8191), 0o644, T).unwrap_err().starts_with("size 8191"));
        // Longer than it ever was: refused.
        assert!(f.check(&vec![0; 8193], 0o644, T).unwrap_err().starts_with("size 8193"));
        f.truncate(1000);
        f.truncate(3000);
        // The truncated bytes may read as zeros, or as what they held; any size in between.
        let mut got = bytes(7, 0, 3000);
        got[1500..2000].fill(0);
        assert_eq!(f.check(&got, 0o644, (T.0, T.1 + 1)), Ok(()));
        assert_eq!(f.check(&bytes(7, 0, 1000), 0o644, T), Ok(()));
        assert!(f.check(&bytes(7, 0, 999), 0o644, T).is_err());
        // After fdatasync the new size is the only one.
        f.fdatasync();
        assert!(f.check(&bytes(7, 0, 1000), 0o644, T).is_err());
        assert!(f.check(f.content(), 0o644, T).is_ok());
        assert_eq!(f.durable_len(), 3000);
    }

    #[test]
    fn permission_bits_come_from_the_fsync_or_a_chmod_since() {
        let mut f = fsynced();
        let c = f.content().to_vec();
        f.set_mode(0o600);
        f.set_mode(0o640);
        for m in [0o644, 0o600, 0o640] {
            assert_eq!(f.check(&c, m, T), Ok(()));
        }
        assert!(f.check(&c, 0o755, T).unwrap_err().starts_with("mode 755"));
        // fdatasync does not make the mode durable; fsync does.
        f.fdatasync();
        assert_eq!(f.check(&c, 0o600, T), Ok(()));
        f.fsync();
        assert!(f.check(&c, 0o644, T).is_err());
        assert_eq!(f.check(&c, 0o640, T), Ok(()));
    }

    #[test]
    fn the_mtime_is_exact_until_a_write_and_bounded_below_after() {
        let mut f = fsynced();
        let c = f.content().to_vec();
        assert_eq!(f.check(&c, 0o644, T), Ok(()));
        assert!(f.check(&c, 0o644, (T.0, T.1 + 1)).unwrap_err().contains("not written since"));
        // A chmod does not change the mtime.
        f.set_mode(0o600);
        assert!(f.check(&c, 0o644, (T.0 + 1, 0)).is_err());
        f.write(0, 1, 8);
        assert_eq!(f.check(&c, 0o644, (T.0 + 1, 0)), Ok(()));
        assert!(f.check(&c, 0o644, (T.0, T.1 - 1)).is_err());
        // Unknown at creation: any mtime.
        let g = FileModel::new(Vec::new(), 0o644, None, pat);
        assert_eq!(g.check(&[], 0o644, (i64::MIN, 0)), Ok(()));
    }
}
