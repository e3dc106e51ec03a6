//! One inode's extended attributes in memory.
//!
//! The set is a sorted map, so a lookup or change costs O(log n) whatever its size (thousands of
//! names), `listxattr` gives the names in one stable order, and the set encodes to the sorted
//! stream the xattr blocks hold (`format::xattr`) without sorting. It keeps the length of that
//! stream up to date, so `setxattr` checks the per-inode limit without encoding anything.
//!
//! An mnode holds its set behind an `Arc` (`Meta::xattrs`): a checkpoint snapshot shares it, and
//! a change made while the checkpoint writes it copies it once (`Arc::make_mut`).
//!
//! Invariant: `stream_len == encode_stream(self).len()`.

use crate::format::xattr::{inline_len, stream_entry_len, Xattr, EMPTY_STREAM_LEN};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// An mnode's xattrs and what the disk still owes them (in `Meta`, under its lock).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XattrState {
    pub set: Arc<XattrSet>,
    /// Names changed since they were last journaled or checkpointed: an fsync journals each
    /// with its value now (or its removal), so it costs what changed, not the whole set.
    pub unjournaled: BTreeSet<Vec<u8>>,
    /// Changed since the last checkpoint wrote them (an fsync does not clear this).
    pub cp_dirty: bool,
    /// Blocks the next checkpoint will write for them, counted in `Engine::xattr_owed` so that
    /// space is admitted for them (0 while `cp_dirty` is false).
    pub owed: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrSet {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    stream_len: usize,
}

impl Default for XattrSet {
    fn default() -> Self {
        XattrSet { map: BTreeMap::new(), stream_len: EMPTY_STREAM_LEN }
    }
}

impl XattrSet {
    /// A set of decoded attributes (the decoders have ruled out a name appearing twice; a
    /// repeat would keep the last value).
    pub fn from_entries(entries: Vec<Xattr>) -> XattrSet {
        let mut s = XattrSet::default();
        for (n, v) in entries {
            s.set(&n, v);
        }
        s
    }

    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.map.get(name).map(Vec::as_slice)
    }

    pub fn contains(&self, name: &[u8]) -> bool {
        self.map.contains_key(name)
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// (name, value) pairs in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&[u8], &[u8])> + Clone {
        self.map.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))
    }

    pub fn names(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.map.keys().map(Vec::as_slice)
    }

    /// Bytes of the set's stream (`format::xattr::encode_stream`).
    pub fn stream_len(&self) -> usize {
        self.stream_len
    }

    /// Bytes of the set in an inode's xattr node, inline (each entry takes two bytes less
    /// there than in the stream, and the count two bytes less).
    pub fn inline_len(&self) -> usize {
        let n = self.stream_len - 2 - 2 * self.map.len();
        debug_assert_eq!(n, inline_len(self.iter()));
        n
    }

    /// The stream length the set would have with `name` set to a value of `value_len` bytes.
    pub fn stream_len_with(&self, name: &[u8], value_len: usize) -> usize {
        let old = self.map.get(name).map_or(0, |v| stream_entry_len(name.len(), v.len()));
        self.stream_len - old + stream_entry_len(name.len(), value_len)
    }

    /// Sets `name` to `value`; returns whether it replaced a value.
    pub fn set(&mut self, name: &[u8], value: Vec<u8>) -> bool {
        let add = stream_entry_len(name.len(), value.len());
        let replaced = match self.map.get_mut(name) {
            Some(v) => {
                self.stream_len -= stream_entry_len(name.len(), v.len());
                *v = value;
                true
            }
            None => {
                self.map.insert(name.to_vec(), value);
                false
            }
        };
        self.stream_len += add;
        replaced
    }

    /// Removes `name`; returns whether it was there.
    pub fn remove(&mut self, name: &[u8]) -> bool {
        match self.map.remove(name) {
            Some(v) => {
                self.stream_len -= stream_entry_len(name.len(), v.len());
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::xattr::encode_stream;

    #[test]
    fn stream_len_tracks_the_encoding() {
        let mut s = XattrSet::default();
        assert_eq!(s.stream_len(), encode_stream(s.iter()).len());
        s.set(b"user.b", vec![1; 300]);
        s.set(b"user.a", vec![]);
        assert_eq!(s.stream_len_with(b"user.a", 70), s.stream_len() + 70);
        s.set(b"user.a", vec![2; 70]);
        assert!(s.set(b"user.b", vec![3; 10]));
        assert_eq!(s.stream_len(), encode_stream(s.iter()).len());
        assert!(s.remove(b"user.b"));
        assert!(!s.remove(b"user.b"));
        assert_eq!(s.stream_len(), encode_stream(s.iter()).len());
        assert_eq!(s.names().collect::<Vec<_>>(), vec![b"user.a".as_slice()]);
        assert_eq!(s.inline_len(), 2 + 3 + 6 + 70);
    }
}
