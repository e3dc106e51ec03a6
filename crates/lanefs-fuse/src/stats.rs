//! The mount's request counters, published as an extended attribute of its root.
//!
//! Why an xattr: it needs no channel beside the mount (no socket, no file to keep fresh, no
//! daemon state on disk), it works for any user who may read the mount point, and any tool
//! reads it: `getfattr -n lanefs.requests --only-values MNT`, or `lanefs inspect MNT`. The name
//! is outside every namespace the kernel's own file systems know (user., trusted., security.,
//! system.): FUSE passes any name to its server, so it can never be an attribute a program set
//! (the adapter refuses to set or remove `lanefs.*`, with EOPNOTSUPP as ext4 does for an
//! unknown namespace). It is answered on the root only, and is not listed by listxattr.
//!
//! The value is text, one line per opcode the adapter serves, in a fixed order, zeros
//! included: `NAME COUNT\n`, NAME as the kernel's protocol spells the opcode (`LOOKUP`,
//! `CREATE`, ...). Counts run from the mount on. FORGET counts inodes forgotten: fuser hands
//! a BATCH_FORGET to the adapter one inode at a time. Reading the counters is not counted. Not
//! counted either: INIT, DESTROY and INTERRUPT, and the opcodes fuser 0.18 answers with
//! ENOSYS itself before the adapter sees them (STATX, TMPFILE, SYNCFS, ...: the kernel then
//! stops sending most of them).

use crate::inflight::Op;
use std::path::Path;

/// The attribute of the mount's root that holds the counters.
pub const REQUESTS_XATTR: &str = "lanefs.requests";

/// The prefix the adapter keeps for itself: names under it cannot be set or removed.
pub const RESERVED_PREFIX: &[u8] = b"lanefs.";

/// Requests by opcode name.
pub type Counts = Vec<(String, u64)>;

/// The attribute's value for `counts`.
pub fn format(counts: &[(Op, u64)]) -> String {
    counts.iter().map(|(op, n)| format!("{} {n}\n", op.name())).collect()
}

/// Reads a value made by [`format`]: every line `NAME COUNT`, NAME upper case.
pub fn parse(text: &str) -> Result<Counts, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            let (Some(name), Some(n), None) = (w.next(), w.next(), w.next()) else {
                return Err(format!("bad counter line {l:?}"));
            };
            if !name.bytes().all(|c| c.is_ascii_uppercase() || c == b'_') {
                return Err(format!("bad opcode name in {l:?}"));
            }
            let n = n.parse::<u64>().map_err(|_| format!("bad count in {l:?}"))?;
            Ok((name.to_string(), n))
        })
        .collect()
}

/// The counters of the lanefs mount at `mountpoint`.
pub fn read(mountpoint: &Path) -> Result<Counts, String> {
    let mut buf = vec![0u8; 16 << 10];
    let n = rustix::fs::getxattr(mountpoint, REQUESTS_XATTR, &mut buf[..]).map_err(|e| {
        format!("{}: cannot read {REQUESTS_XATTR}: {e} (not a lanefs mount point, or a lanefs older than the counters)", mountpoint.display())
    })?;
    let text = std::str::from_utf8(&buf[..n])
        .map_err(|_| format!("{}: {REQUESTS_XATTR} is not text", mountpoint.display()))?;
    parse(text).map_err(|e| format!("{}: {REQUESTS_XATTR}: {e}", mountpoint.display()))
}

/// What was counted between `earlier` and `later` (opcodes of `later`; one missing from
/// `earlier` counts from zero).
pub fn since(later: &[(String, u64)], earlier: &[(String, u64)]) -> Counts {
    later
        .iter()
        .map(|(name, n)| {
            let before = earlier.iter().find(|(e, _)| e == name).map_or(0, |(_, m)| *m);
            (name.clone(), n.saturating_sub(before))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_round_trips_and_bad_text_is_refused() {
        let counts = vec![(Op::Lookup, 3), (Op::Create, 0), (Op::CopyFileRange, u64::MAX)];
        let text = format(&counts);
        assert_eq!(text, format!("LOOKUP 3\nCREATE 0\nCOPY_FILE_RANGE {}\n", u64::MAX));
        let back = parse(&text).unwrap();
        assert_eq!(
            back,
            vec![("LOOKUP".into(), 3), ("CREATE".into(), 0), ("COPY_FILE_RANGE".into(), u64::MAX)]
        );
        for bad in ["LOOKUP", "LOOKUP x", "LOOKUP 1 2", "lookup 1", "LOOKUP -1"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse("").unwrap(), vec![]);
    }

    #[test]
    fn since_subtracts_by_name() {
        let a = vec![("LOOKUP".to_string(), 5), ("CREATE".to_string(), 1)];
        let b = vec![("CREATE".to_string(), 4), ("LOOKUP".to_string(), 9), ("WRITE".to_string(), 2)];
        assert_eq!(since(&b, &a), vec![("CREATE".into(), 3), ("LOOKUP".into(), 4), ("WRITE".into(), 2)]);
    }
}
