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
//! `CREATE`, ...). Counts run from the mount on. FORGET counts inodes forgotten: the session
//! hands a BATCH_FORGET to the adapter one inode at a time. Reading the counters is not
//! counted. Not counted either: INIT, DESTROY and INTERRUPT, and the opcodes the session
//! answers with ENOSYS itself before the adapter sees them (SYNCFS, ...: the kernel then
//! stops sending most of them).
//!
//! A second attribute, `lanefs.engine`, holds what the engine counts since the mount, as
//! `key value` lines in a fixed order: checkpoints made durable, the longest time a
//! checkpoint's exclusive phase held every operation out and its write phase held fsync out
//! (µs), fsyncs and writebacks that waited for a checkpoint, bytes by cause, the device flushes
//! fsyncs asked for and those group commit issued for them, and per lock class the acquisitions that found the lock held (`contended.CLASS`, the contention census of `lanefs::sync::census`,
//! every class, zeros included). Reading it changes nothing.

use crate::inflight::Op;
use lanefs::sync::{Census, Rank};
use lanefs::IoStats;
use std::path::Path;

/// The attribute of the mount's root that holds the counters.
pub const REQUESTS_XATTR: &str = "lanefs.requests";

/// The attribute of the mount's root that holds the engine's counters.
pub const ENGINE_XATTR: &str = "lanefs.engine";

/// The attribute of the mount's root that says which transport serves the mount and why (one
/// line).
pub const TRANSPORT_XATTR: &str = "lanefs.transport";

/// The prefix the adapter keeps for itself: names under it cannot be set or removed.
pub const RESERVED_PREFIX: &[u8] = b"lanefs.";

/// Requests by opcode name.
pub type Counts = Vec<(String, u64)>;

/// The attribute's value for `counts`.
pub fn format(counts: &[(Op, u64)]) -> String {
    counts.iter().map(|(op, n)| format!("{} {n}\n", op.name())).collect()
}

/// Reads a value made by [`format`](fn@format): every line `NAME COUNT`, NAME upper case.
pub fn parse(text: &str) -> Result<Counts, String> {
    key_counts(text, "opcode name", |name| name.bytes().all(|c| c.is_ascii_uppercase() || c == b'_'))
}

/// The `KEY COUNT` lines of `text` (blank lines skipped), each key accepted by `valid`; an
/// error names the line and what is wrong with it (`what` for a refused key).
fn key_counts(text: &str, what: &str, valid: impl Fn(&str) -> bool) -> Result<Counts, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            let (Some(key), Some(n), None) = (w.next(), w.next(), w.next()) else {
                return Err(format!("bad counter line {l:?}"));
            };
            if !valid(key) {
                return Err(format!("bad {what} in {l:?}"));
            }
            let n = n.parse::<u64>().map_err(|_| format!("bad count in {l:?}"))?;
            Ok((key.to_string(), n))
        })
        .collect()
}

/// The counters of the lanefs mount at `mountpoint`.
pub fn read(mountpoint: &Path) -> Result<Counts, String> {
    let text = read_text(mountpoint, REQUESTS_XATTR)?;
    parse(&text).map_err(|e| format!("{}: {REQUESTS_XATTR}: {e}", mountpoint.display()))
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

/// The prefix of a lock class's census key in [`ENGINE_XATTR`].
const CONTENDED: &str = "contended.";

/// The engine's counters since the mount, as [`ENGINE_XATTR`] carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// `key value` pairs in the attribute's order.
    pub values: Vec<(String, u64)>,
}

impl EngineCounters {
    /// The value of `key`, if the daemon reported it.
    pub fn get(&self, key: &str) -> Option<u64> {
        self.values.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// The contention census, rebuilt: classes this build does not know are left out.
    pub fn census(&self) -> Census {
        Census::from_counts(self.values.iter().filter_map(|(k, n)| {
            let class = k.strip_prefix(CONTENDED)?;
            Rank::ALL.iter().find(|r| format!("{r:?}") == class).map(|&r| (r, *n))
        }))
    }
}

/// The [`ENGINE_XATTR`] value for the engine's `io` statistics and `census`.
pub fn format_engine(io: &IoStats, census: &Census) -> String {
    let mut out = String::new();
    for (k, v) in [
        ("checkpoints", io.checkpoints_durable),
        ("cp_exclusive_us_max", io.cp_exclusive_us_max),
        ("cp_write_phase_us_max", io.cp_write_phase_us_max),
        ("cp_waits", io.cp_waits),
        ("cp_helped", io.cp_helped),
        ("user_bytes", io.user_bytes),
        ("device_bytes", io.device_bytes()),
        ("cleaning_bytes", io.cleaning_bytes),
        ("segments_cleaned", io.segments_cleaned),
        ("fsync_flushes", io.fsync_flushes),
        ("fsync_device_flushes", io.fsync_device_flushes),
    ] {
        out.push_str(&format!("{k} {v}\n"));
    }
    for r in Rank::ALL {
        out.push_str(&format!("{CONTENDED}{r:?} {}\n", census.get(r)));
    }
    out
}

/// Reads a value made by [`format_engine`]: every line `KEY COUNT`, KEY of lower-case letters,
/// digits and `_`, or a census key (`contended.` and a class name).
pub fn parse_engine(text: &str) -> Result<EngineCounters, String> {
    let values = key_counts(text, "key", |key| {
        let plain = key.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_');
        let class = key
            .strip_prefix(CONTENDED)
            .is_some_and(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_alphanumeric()));
        plain || class
    })?;
    Ok(EngineCounters { values })
}

/// Reads the text attribute `name` of the root at `mountpoint`.
fn read_text(mountpoint: &Path, name: &str) -> Result<String, String> {
    let mut buf = vec![0u8; 16 << 10];
    let n = rustix::fs::getxattr(mountpoint, name, &mut buf[..]).map_err(|e| {
        format!(
            "{}: cannot read {name}: {e} (not a lanefs mount point, or a lanefs older than the counters)",
            mountpoint.display()
        )
    })?;
    buf.truncate(n);
    String::from_utf8(buf).map_err(|_| format!("{}: {name} is not text", mountpoint.display()))
}

/// The transport of the lanefs mount at `mountpoint`, and why (see [`TRANSPORT_XATTR`]).
pub fn read_transport(mountpoint: &Path) -> Result<String, String> {
    Ok(read_text(mountpoint, TRANSPORT_XATTR)?.trim().to_string())
}

/// The engine counters of the lanefs mount at `mountpoint`.
pub fn read_engine(mountpoint: &Path) -> Result<EngineCounters, String> {
    let text = read_text(mountpoint, ENGINE_XATTR)?;
    parse_engine(&text).map_err(|e| format!("{}: {ENGINE_XATTR}: {e}", mountpoint.display()))
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
    fn the_engine_value_round_trips_and_bad_text_is_refused() {
        let io = IoStats {
            user_bytes: 4096,
            journal_bytes: 100,
            checkpoint_bytes: 20,
            cleaning_bytes: 3,
            checkpoints_durable: 7,
            cp_exclusive_us_max: 640,
            cp_write_phase_us_max: 9000,
            cp_waits: 4,
            cp_helped: 6,
            fsync_flushes: 5,
            fsync_device_flushes: 3,
            ..Default::default()
        };
        let census = Census::from_counts([(Rank::Meta, 12), (Rank::DirShard, 1)]);
        let back = parse_engine(&format_engine(&io, &census)).unwrap();
        assert_eq!(back.get("checkpoints"), Some(7));
        assert_eq!(back.get("cp_exclusive_us_max"), Some(640));
        assert_eq!(back.get("cp_write_phase_us_max"), Some(9000));
        assert_eq!(back.get("cp_waits"), Some(4));
        assert_eq!(back.get("cp_helped"), Some(6));
        assert_eq!(back.get("device_bytes"), Some(123));
        assert_eq!(back.get("fsync_flushes"), Some(5));
        assert_eq!(back.get("fsync_device_flushes"), Some(3));
        assert_eq!(back.get("contended.Meta"), Some(12));
        assert_eq!(back.get("nothing"), None);
        let c = back.census();
        assert_eq!((c.get(Rank::Meta), c.get(Rank::DirShard), c.total()), (12, 1, 13));
        // Every class is listed, zeros included, so that a reader sees which classes exist.
        assert_eq!(back.values.iter().filter(|(k, _)| k.starts_with(CONTENDED)).count(), Rank::COUNT);
        for bad in ["checkpoints", "checkpoints x", "Checkpoints 1", "contended. 1", "a b c", "cp -1"] {
            assert!(parse_engine(bad).is_err(), "{bad:?}");
        }
        // A class this build does not know is kept as a value and left out of the census.
        let other = parse_engine("contended.Future 3\n").unwrap();
        assert_eq!((other.get("contended.Future"), other.census().total()), (Some(3), 0));
    }

    #[test]
    fn since_subtracts_by_name() {
        let a = vec![("LOOKUP".to_string(), 5), ("CREATE".to_string(), 1)];
        let b = vec![("CREATE".to_string(), 4), ("LOOKUP".to_string(), 9), ("WRITE".to_string(), 2)];
        assert_eq!(since(&b, &a), vec![("CREATE".into(), 3), ("LOOKUP".into(), 4), ("WRITE".into(), 2)]);
    }
}
