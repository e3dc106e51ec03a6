//! The check of a recovered file system against the history: every promise of an fsync whose
//! flush is durable holds, and every object shows a version the crash could have left.
//!
//! An object may show any version made before the crash's upper bound, and, when promised, only
//! its promised version or a later one (the rule of `rules`, which the SIGKILL test of the
//! mount applies to its names too); a rename is checked on both sides together, since it is
//! never half durable. Every difference is a message, never a panic.

use lanefs::FileKind;
use std::collections::{BTreeMap, HashMap};

use super::recovered::Recovered;
use super::rules::allowed;
use super::{EntryKey, History, Id, Promise, Ver};

/// The newest active promise per object, with the operation that made it.
#[derive(Default)]
struct Active<'a> {
    entries: HashMap<&'a EntryKey, (usize, &'a str)>,
    full: HashMap<Id, (usize, &'a str)>,
    data: HashMap<Id, (usize, &'a str)>,
    reach: HashMap<Id, (usize, &'a str)>,
}

fn raise<'a, K: std::hash::Hash + Eq>(m: &mut HashMap<K, (usize, &'a str)>, k: K, ver: usize, op: &'a str) {
    let e = m.entry(k).or_insert((ver, op));
    if ver > e.0 {
        *e = (ver, op);
    }
}

fn show_id(h: &History, v: Option<Id>) -> String {
    match v {
        None => "absent".into(),
        Some(id) => format!("{id} ({:?})", h.kinds.get(&id).copied().unwrap_or(FileKind::File)),
    }
}

/// Checks a recovered file system. `durable`: length of the log prefix that is durable in the
/// crash image (promises acknowledged within it must hold); `upper`: one past the last log
/// entry the image may contain.
pub fn check(h: &History, rec: &Recovered, durable: usize, upper: usize) -> Vec<String> {
    let mut out: Vec<String> = rec.problems.clone();
    let act = Active::of(h, durable);
    check_entries(h, rec, &act, upper, &mut out);
    check_renames(h, rec, &act, upper, &mut out);
    check_files(h, rec, &act, upper, &mut out);
    check_reach(h, rec, &act, upper, &mut out);
    check_single_names(h, rec, &mut out);
    out
}

impl<'a> Active<'a> {
    /// The promises of the operations acknowledged within the durable prefix `durable`.
    fn of(h: &'a History, durable: usize) -> Active<'a> {
        let mut act = Active::default();
        for a in h.acked.iter().filter(|a| a.ev_end <= durable) {
            for p in &a.promises {
                match p {
                    Promise::Entry { key, ver } => raise(&mut act.entries, key, *ver, &a.op),
                    Promise::File { id, ver, datasync: false } => raise(&mut act.full, *id, *ver, &a.op),
                    Promise::File { id, ver, datasync: true } => raise(&mut act.data, *id, *ver, &a.op),
                    Promise::Reach { id, ver } => raise(&mut act.reach, *id, *ver, &a.op),
                }
            }
        }
        act
    }
}

/// Entries of every reachable directory: each was created, and shows a version allowed.
fn check_entries(h: &History, rec: &Recovered, act: &Active, upper: usize, out: &mut Vec<String>) {
    for (dir, ents) in &rec.entries {
        for (name, id) in ents {
            if !h.entries.contains_key(&(*dir, name.clone())) {
                out.push(format!(
                    "{}: {} exists but was never created",
                    h.key_path(&(*dir, name.clone())),
                    show_id(h, Some(*id))
                ));
            }
        }
    }
    for (key, vs) in &h.entries {
        let Some(ents) = rec.entries.get(&key.0) else { continue };
        let got = ents.get(&key.1).copied();
        let (p, op) = act.entries.get(key).copied().unwrap_or((0, ""));
        if allowed(vs, p, upper).any(|i| vs[i].val == got) {
            continue;
        }
        let want: Vec<String> = allowed(vs, p, upper).map(|i| show_id(h, vs[i].val)).collect();
        let why = if op.is_empty() {
            "never existed before the crash".to_string()
        } else {
            format!("`{op}` promised version {p}")
        };
        out.push(format!(
            "entry {}: found {}, allowed {} ({why})",
            h.key_path(key),
            show_id(h, got),
            want.join(" | ")
        ));
    }
}

/// A rename (and the whiteout or exchanged inode it leaves at the source) is all or nothing:
/// its two entries show it done at both or at neither. Each entry's value may fit several
/// versions (a name can go back to an earlier inode), so only a state that no choice of
/// versions explains is reported.
fn check_renames(h: &History, rec: &Recovered, act: &Active, upper: usize, out: &mut Vec<String>) {
    for r in &h.renames {
        let (Some(sents), Some(dents)) = (rec.entries.get(&r.src.0), rec.entries.get(&r.dst.0)) else {
            continue;
        };
        let (Some(svs), Some(dvs)) = (h.entries.get(&r.src), h.entries.get(&r.dst)) else { continue };
        let (gs, gd) = (sents.get(&r.src.1).copied(), dents.get(&r.dst.1).copied());
        let fits = |vs: &[Ver<Option<Id>>], key: &EntryKey, got: Option<Id>| -> Vec<usize> {
            let p = act.entries.get(key).map_or(0, |x| x.0);
            allowed(vs, p, upper).filter(|&i| vs[i].val == got).collect()
        };
        let (is, id) = (fits(svs, &r.src, gs), fits(dvs, &r.dst, gd));
        if is.is_empty() || id.is_empty() {
            // Already reported as an entry no version allows.
            continue;
        }
        let done = |i: usize, at: usize| i >= at;
        let whole = is.iter().any(|&i| id.iter().any(|&j| done(i, r.src_ver) == done(j, r.dst_ver)));
        if !whole {
            out.push(format!(
                "rename {} -> {} is half done: the source shows {}, the destination {}",
                h.key_path(&r.src),
                h.key_path(&r.dst),
                show_id(h, gs),
                show_id(h, gd)
            ));
        }
    }
}

/// Contents and attributes of every reachable non-directory.
fn check_files(h: &History, rec: &Recovered, act: &Active, upper: usize, out: &mut Vec<String>) {
    for (id, got) in &rec.files {
        let Some(vs) = h.files.get(id) else {
            if h.kinds.contains_key(id) {
                out.push(format!("{}: {id} has contents but was never written as a file", h.path_of(id)));
            } else {
                out.push(format!("{id}: reachable but never created"));
            }
            continue;
        };
        let (pf, opf) = act.full.get(id).copied().unwrap_or((0, ""));
        let (pd, opd) = act.data.get(id).copied().unwrap_or((0, ""));
        let pmax = pf.max(pd);
        let data_ok: Vec<usize> = allowed(vs, pmax, upper).filter(|&i| vs[i].val.same_data(got)).collect();
        if data_ok.is_empty() {
            let op = if pd > pf { opd } else { opf };
            let why =
                if op.is_empty() { String::new() } else { format!(" (`{op}` promised version {pmax})") };
            let expect = &vs[pmax.min(vs.len() - 1)].val;
            let diff = expect
                .first_difference(got)
                .map(|o| format!(", first difference at byte {o}"))
                .unwrap_or_default();
            out.push(format!(
                "{}: contents {} match no allowed version{why}; expected e.g. {}{diff}",
                h.path_of(id),
                got.describe(),
                expect.describe()
            ));
            continue;
        }
        let meta_ok =
            allowed(vs, pf, upper).any(|i| vs[i].val.same_meta(got) && (data_ok.contains(&i) || pd > pf));
        if !meta_ok {
            let why =
                if opf.is_empty() { String::new() } else { format!(" (`{opf}` promised version {pf})") };
            let expect = &vs[*data_ok.last().expect("non-empty")].val;
            out.push(format!(
                "{}: attributes match no allowed version with these contents{why}: {}",
                h.path_of(id),
                expect.meta_diff(got)
            ));
        }
    }
}

/// Promised inodes are reachable (unless they lost every name since).
fn check_reach(h: &History, rec: &Recovered, act: &Active, upper: usize, out: &mut Vec<String>) {
    for (id, (p, op)) in &act.reach {
        if rec.kinds.contains_key(id) {
            continue;
        }
        let Some(vs) = h.links.get(id) else { continue };
        if allowed(vs, *p, upper).any(|i| vs[i].val == 0) {
            continue;
        }
        out.push(format!("{} ({id}) is gone, but `{op}` made it durable", h.path_of(id)));
    }
}

/// A rename is all or nothing: an inode never hard-linked has at most one name.
fn check_single_names(h: &History, rec: &Recovered, out: &mut Vec<String>) {
    for (id, n) in &rec.name_count {
        if *n > 1
            && h.max_links.get(id).copied().unwrap_or(0) <= 1
            && rec.kinds.get(id) != Some(&FileKind::Dir)
        {
            let names: Vec<&str> =
                rec.paths.iter().filter(|(_, i)| i == id).map(|(p, _)| p.as_str()).collect();
            out.push(format!("{id} never had two names but appears as {}", names.join(" and ")));
        }
    }
}

impl History {
    /// Differences between the live file system (walked before the crash) and what the workload
    /// recorded: a harness bug or an in-memory bug, either way worth a report.
    pub fn compare_live(&self, live: &Recovered) -> Vec<String> {
        let mut out = live.problems.iter().map(|p| format!("live walk: {p}")).collect::<Vec<_>>();
        for (dir, ents) in &live.entries {
            let want = self.children.get(dir);
            let empty = BTreeMap::new();
            let want = want.unwrap_or(&empty);
            if want != ents {
                let extra: Vec<String> = ents
                    .keys()
                    .filter(|n| !want.contains_key(*n))
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect();
                let missing: Vec<String> = want
                    .keys()
                    .filter(|n| !ents.contains_key(*n))
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect();
                out.push(format!(
                    "live directory {} differs from the recorded one: extra {extra:?}, missing {missing:?}, or entries point elsewhere",
                    self.path_of(dir)
                ));
            }
        }
        for (id, st) in &live.files {
            match self.files.get(id).and_then(|v| v.last()) {
                Some(v) if v.val.same_data(st) && v.val.same_meta(st) => {}
                Some(v) => out.push(format!(
                    "live file {}: {} but the workload recorded {}",
                    self.path_of(id),
                    st.describe(),
                    v.val.describe()
                )),
                None => out.push(format!("live file {} ({id}) was never recorded", self.path_of(id))),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::{Acked, FileState};

    fn id(n: u64) -> Id {
        Id { ino: n, crtime: (n as i64, 0) }
    }

    #[test]
    fn promises_and_checks() {
        let root = id(1);
        let mut rec = Recovered { root, ..Default::default() };
        rec.entries.insert(root, BTreeMap::new());
        rec.kinds.insert(root, FileKind::Dir);
        rec.paths.push(("/".into(), root));
        let mut h = History::from_recovered(&rec);
        let f = id(2);
        h.new_inode(f, FileKind::File);
        h.set_entry(3, root, b"f", Some(f));
        let st = FileState {
            kind: FileKind::File,
            size: 0,
            hash: 1,
            small: vec![],
            mode: 0o644,
            mtime: (0, 0),
            xattrs: vec![],
        };
        h.set_file(3, f, st.clone());
        let ps = h.promise_fsync(f, false);
        assert_eq!(ps.len(), 3);
        h.acked.push(Acked { ev_end: 10, op: "fsync /f".into(), promises: ps });
        // Durable: the file must be there.
        let v = check(&h, &rec, 10, 10);
        assert!(v.iter().any(|m| m.contains("entry /f")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("is gone")), "{v:?}");
        // Not durable yet: absence is fine.
        assert!(check(&h, &rec, 9, 10).is_empty());
        // Present with the right state: fine.
        rec.entries.get_mut(&root).unwrap().insert(b"f".to_vec(), f);
        rec.kinds.insert(f, FileKind::File);
        rec.name_count.insert(f, 1);
        rec.files.insert(f, st.clone());
        assert!(check(&h, &rec, 10, 10).is_empty());
        // Present but never created (log below its creation).
        assert!(!check(&h, &rec, 0, 2).is_empty());
        // Wrong contents.
        rec.files.insert(f, FileState { hash: 2, ..st });
        assert!(check(&h, &rec, 10, 10).iter().any(|m| m.contains("contents")));
    }
}
