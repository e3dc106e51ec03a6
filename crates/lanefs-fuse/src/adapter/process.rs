//! The process behind a request: its credentials and capabilities, as the engine asks of them.

use crate::proto::{INodeNo, Notifier, Request};
use lanefs::{Attr, FileKind};
use std::cell::OnceCell;
use std::sync::OnceLock;

/// The process behind one request, as the engine asks about it (`lanefs::Caller`). The kernel
/// sends its file-system uid and gid and its (thread) id; whether it has CAP_FSETID and its
/// supplementary groups come from /proc/PID/status, read once and only when the engine asks
/// (for a file with set-ID bits). A WRITE and a truncate say it up front: the kernel sets
/// FUSE_WRITE_KILL_SUIDGID, and FATTR_KILL_SUIDGID on a SETATTR that changes only the size,
/// exactly when the caller lacks CAP_FSETID. A process gone by then
/// counts as uid 0 having CAP_FSETID and no supplementary groups.
///
/// On an idmapped mount the kernel sends `FUSE_INVALID_UIDGID` (u32::MAX) as the uid and gid
/// of every request that creates nothing. The ids are then taken from /proc (the file-system
/// ids of the process there, which are the mount's view only when the idmapping is the
/// identity: a best effort for the set-group-ID rule, the one place they matter).
pub(super) struct ReqCaller<'a> {
    uid: u32,
    gid: u32,
    pid: u32,
    fsetid: Option<bool>,
    status: OnceCell<Option<ProcStatus>>,
    notifier: &'a OnceLock<Notifier>,
}

/// What /proc/PID/status says of a process's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProcStatus {
    /// Effective capabilities.
    cap_eff: u64,
    /// File-system gid (the fourth field of `Gid:`).
    fsgid: u32,
    groups: Vec<u32>,
}

/// What the kernel sends as uid and gid when it has none for the request (idmapped mounts).
const FUSE_INVALID_UIDGID: u32 = u32::MAX;

pub(super) const CAP_FSETID: u32 = 4;
pub(super) const CAP_LINUX_IMMUTABLE: u32 = 9;
pub(super) const CAP_SYS_ADMIN: u32 = 21;

/// Whether the process behind `req` has capability `cap` in effect, as /proc/TID/status says.
/// The kernel sends no capabilities, and on a mount that allows idmapping the uid of most
/// requests is `FUSE_INVALID_UIDGID`, so the uid cannot stand for them. A process gone by
/// the time it is asked counts as privileged only if the request came from uid 0.
pub(super) fn capable(req: &Request, cap: u32) -> bool {
    proc_status(req.pid()).map_or(req.uid() == 0, |s| s.has(cap))
}

/// The credentials of task `pid` (a thread id works too); None once it is gone.
fn proc_status(pid: u32) -> Option<ProcStatus> {
    parse_status(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

impl ProcStatus {
    /// Whether capability `cap` is in the effective set.
    fn has(&self, cap: u32) -> bool {
        self.cap_eff & (1 << cap) != 0
    }
}

/// The credentials in a /proc/PID/status text (None if a line is missing or malformed).
fn parse_status(text: &str) -> Option<ProcStatus> {
    let mut cap_eff = None;
    let mut groups = None;
    let mut fsgid = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Gid:") {
            fsgid = v.split_whitespace().nth(3).and_then(|f| f.parse::<u32>().ok());
        } else if let Some(v) = line.strip_prefix("CapEff:") {
            cap_eff = u64::from_str_radix(v.trim(), 16).ok();
        } else if let Some(v) = line.strip_prefix("Groups:") {
            groups = v.split_whitespace().map(|g| g.parse().ok()).collect::<Option<Vec<u32>>>();
        }
    }
    Some(ProcStatus { cap_eff: cap_eff?, fsgid: fsgid?, groups: groups? })
}

impl<'a> ReqCaller<'a> {
    /// The process behind `req`; `fsetid` if the request says whether it has CAP_FSETID.
    pub(super) fn new(
        req: &Request,
        fsetid: Option<bool>,
        notifier: &'a OnceLock<Notifier>,
    ) -> ReqCaller<'a> {
        ReqCaller {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
            fsetid,
            status: OnceCell::new(),
            notifier,
        }
    }

    fn status(&self) -> Option<&ProcStatus> {
        self.status.get_or_init(|| proc_status(self.pid)).as_ref()
    }
}

impl lanefs::Caller for ReqCaller<'_> {
    fn fsetid(&self) -> bool {
        self.fsetid.unwrap_or_else(|| match self.status() {
            Some(s) => s.has(CAP_FSETID),
            None => self.uid == 0,
        })
    }

    fn in_group(&self, gid: u32) -> bool {
        if self.gid == FUSE_INVALID_UIDGID {
            return self.status().is_some_and(|s| s.fsgid == gid || s.groups.contains(&gid));
        }
        gid == self.gid || self.status().is_some_and(|s| s.groups.contains(&gid))
    }

    fn dropped(&self, ino: u64, _mode: u32) {
        // The kernel keeps a file's mode for the attribute TTL, and a write does not make it
        // ask again: until then it would still see set-ID bits on exec. Attributes only
        // (offset -1): no page is touched, so this cannot wait on the request being served.
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
    }
}

/// FUSE_ACCESS's answer for `req`, asked only when the mount has no default_permissions: the
/// mode bits of `mask` (R, W, X) the caller has on `a`. The caller's primary group stands for
/// its groups (FUSE does not send supplementary ones); root may read and write anything, and
/// execute what anyone may execute.
pub(super) fn may_access(req: &Request, a: &Attr, mask: u32) -> bool {
    let want = mask & 0o7;
    if req.uid() == 0 {
        return want & 1 == 0 || a.mode & 0o111 != 0 || a.kind == FileKind::Dir;
    }
    let bits = if req.uid() == a.uid {
        (a.mode >> 6) & 7
    } else if req.gid() == a.gid {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    };
    bits & want == want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_status_gives_capabilities_and_groups() {
        let text = "Name:\tsh\nUid:\t4242\t4242\t4242\t4242\nGid:\t10\t11\t12\t13\n\
                    Groups:\t0 27 4243 \nCapInh:\t0000000000000000\nCapEff:\t0000000000000010\n";
        let s = parse_status(text).unwrap();
        assert_eq!(s, ProcStatus { cap_eff: 1 << CAP_FSETID, fsgid: 13, groups: vec![0, 27, 4243] });
        // No supplementary groups: an empty list, not a failure.
        let s = parse_status("Gid:\t5\t5\t5\t5\nGroups:\t\nCapEff:\t0000000000000000\n").unwrap();
        assert_eq!(s, ProcStatus { cap_eff: 0, fsgid: 5, groups: vec![] });
        assert_eq!(parse_status("Gid:\t5\t5\t5\t5\nGroups:\t1\n"), None, "no CapEff line");
        assert_eq!(parse_status("Gid:\t5\t5\t5\t5\nGroups:\tx\nCapEff:\t0\n"), None, "a bad group");
        assert_eq!(parse_status("Groups:\t1\nCapEff:\t0\n"), None, "no Gid line");
        // This process's own entry parses (the adapter reads the requester's the same way).
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(parse_status(&own).is_some());
    }
}
