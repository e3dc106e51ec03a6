//! Heap buffers aligned for O_DIRECT.
//!
//! Direct I/O DMAs straight from and to user memory, so the kernel insists that buffer addresses
//! are aligned to the device's logical block size. Rust's allocator gives `Vec<u8>` no such
//! guarantee, so the io_uring back end copies unaligned caller buffers through an [`AlignedBuf`]
//! ("bounce buffer"). Upper layers that allocate their block buffers as `AlignedBuf` skip the copy.

use std::alloc::{self, Layout};
use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`AlignedBuf`]: one block, which covers every logical block size that the
/// device layer accepts for O_DIRECT (512 to 4096 bytes).
pub const DIRECT_ALIGN: usize = super::BLOCK_SIZE;

/// Whether `ptr` may be handed to O_DIRECT I/O without a bounce copy.
pub fn is_direct_aligned(ptr: *const u8) -> bool {
    // DIRECT_ALIGN is a power of two (a block), so a mask test is exact.
    (ptr as usize) & (DIRECT_ALIGN - 1) == 0
}

/// A zero-initialised, fixed-length byte buffer whose start is aligned to [`DIRECT_ALIGN`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively (like `Box<[u8]>`); nothing else holds the
// pointer, so moving it to or sharing it with another thread is as safe as for `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`, which is `Sync`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zero bytes aligned to [`DIRECT_ALIGN`]. Fails with `OutOfMemory` instead of
    /// aborting when the allocator refuses, because a bounce buffer's size comes from a caller's
    /// batch.
    pub fn new(len: usize) -> io::Result<Self> {
        if len == 0 {
            // A zero-sized allocation is not allowed; an aligned dangling pointer is what
            // `Vec` does for empty buffers too, and no byte is ever read through it.
            let ptr =
                NonNull::new(DIRECT_ALIGN as *mut u8).ok_or_else(|| io::Error::other("null alignment"))?;
            return Ok(AlignedBuf { ptr, len: 0 });
        }
        let layout = Layout::from_size_align(len, DIRECT_ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::OutOfMemory, e))?;
        // SAFETY: `layout` has a non-zero size (checked above) and a valid power-of-two alignment.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            io::Error::new(io::ErrorKind::OutOfMemory, format!("cannot allocate {len} aligned bytes"))
        })?;
        Ok(AlignedBuf { ptr, len })
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> io::Result<Self> {
        let mut b = AlignedBuf::new(data.len())?;
        b.copy_from_slice(data);
        Ok(b)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised (zeroed at allocation) bytes owned by `self`,
        // or is an aligned dangling pointer with `len == 0`; the shared borrow of `self` keeps
        // the memory alive and unaliased by writers for the slice's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and the exclusive borrow of `self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        if let Ok(layout) = Layout::from_size_align(self.len, DIRECT_ALIGN) {
            // SAFETY: the pointer came from `alloc_zeroed` with exactly this layout (the same
            // `len` and alignment succeeded in `new`) and is freed only here, once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_writable() {
        for len in [0, 1, 4096, 3 * 4096 + 7] {
            let mut b = AlignedBuf::new(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(is_direct_aligned(b.as_ptr()));
            assert!(b.iter().all(|&x| x == 0));
            b.fill(0xA5);
            assert!(b.iter().all(|&x| x == 0xA5));
        }
        let c = AlignedBuf::from_slice(b"hello").unwrap();
        assert_eq!(&c[..], b"hello");
    }

    #[test]
    fn absurd_size_is_an_error_not_an_abort() {
        assert!(AlignedBuf::new(usize::MAX - 10).is_err());
    }
}
