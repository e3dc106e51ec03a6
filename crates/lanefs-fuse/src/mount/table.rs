//! The mount table: which lanefs mounts /proc/self/mountinfo lists, and where an image is
//! mounted.

use std::path::{Path, PathBuf};

/// A lanefs mount as /proc/self/mountinfo lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    pub source: String,
    /// major:minor of the file system: the same for every bind of one mount.
    pub dev: String,
    /// The per-mount options (rw, nosuid, nodev, relatime, ...).
    pub options: String,
}

/// Decodes mountinfo's octal escapes (\040 for a space, ...).
fn unescape(s: &str) -> String {
    String::from_utf8_lossy(&unescape_mountinfo(s)).into_owned()
}

/// Decodes the octal escapes of a /proc/self/mountinfo field (the kernel writes space, tab,
/// newline and backslash as `\ooo`) into the raw bytes of the path. A backslash not followed by
/// three octal digits stays as it is. The one implementation, shared with lanefs-bench.
pub fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        // The escape is b[i..i + 4]; `get` also takes one that ends the field, and none that is
        // cut short. Above \377 it is no byte: kept as it is (and no u8 overflow).
        let value = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u16, |v, c| v * 8 + u16::from(c - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        match value {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// The lanefs mounts in a mountinfo text.
pub fn lanefs_mounts(mountinfo: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        // id parent major:minor root mountpoint opts [optional...] - fstype source superopts
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 6 || r.len() < 2 || r[0] != "fuse.lanefs" {
            continue;
        }
        out.push(MountEntry {
            mountpoint: PathBuf::from(unescape(l[4])),
            source: unescape(r[1]),
            dev: l[2].to_string(),
            options: l[5].to_string(),
        });
    }
    out
}

/// Where `image` is mounted, if it is: the first lanefs mount with it as its source.
pub fn mounted_at(image: &Path) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    lanefs_mounts(&info).into_iter().find(|m| Path::new(&m.source) == image).map(|m| m.mountpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lists_lanefs_mounts_with_escapes() {
        let info = "36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    50 22 0:45 / /tmp/my\\040mnt rw,nosuid,nodev,relatime shared:30 - fuse.lanefs /tmp/a\\040b.img rw,user_id=0,group_id=0\n";
        let m = lanefs_mounts(info);
        assert_eq!(
            m,
            vec![MountEntry {
                mountpoint: PathBuf::from("/tmp/my mnt"),
                source: "/tmp/a b.img".into(),
                dev: "0:45".into(),
                options: "rw,nosuid,nodev,relatime".into(),
            }]
        );
    }
}
