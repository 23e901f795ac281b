//! Byte buffers the I/O backends fill and the model computes on without a
//! copy: [`AlignedBuf`] (4 KiB-aligned memory, as O_DIRECT requires). Reads
//! hand out views of them as [`SharedBytes`] (larder-tensor's one byte-view
//! type, re-exported here), so the model takes them without a conversion.
//!
//! Each buffer is its own anonymous mapping, so a freed buffer goes back to
//! the kernel at once (heap allocations of this size can stay in the
//! allocator's arenas and keep RSS above `--ram-budget`).
//!
//! Read buffers are recycled: a dropped buffer (an evicted cache entry)
//! goes to a small pool that [`AlignedBuf::for_read`] takes from, so steady
//! streaming does not pay page faults and zeroing for every record (measured:
//! that cost a quarter of io_uring's throughput when done on the submitting
//! thread). The pool holds at most [`POOL_BYTES`] in at most [`POOL_BUFFERS`]
//! buffers: it is the one pool that adds to a streamed model's RSS beyond
//! the RAM budget and the spine (see docs/store.md).

use std::sync::Mutex;

pub use larder_tensor::{ByteOwner, SharedBytes};
use memmap2::MmapMut;

/// Alignment of every buffer and of every O_DIRECT offset and length.
pub(crate) const ALIGN: usize = 4096;

/// `n` rounded up to a multiple of `ALIGN`.
pub fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN as u64) * ALIGN as u64
}

/// `n` rounded down to a multiple of [`ALIGN`].
pub(crate) fn align_down(n: u64) -> u64 {
    n / ALIGN as u64 * ALIGN as u64
}

/// Most bytes of freed buffers kept for reuse.
pub const POOL_BYTES: usize = 256 << 20;

/// Most freed buffers kept for reuse (a few per read in flight is enough;
/// bounds the pool for small records too).
pub const POOL_BUFFERS: usize = 16;

struct Pool {
    free: Vec<MmapMut>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    free: Vec::new(),
    bytes: 0,
});

/// Bytes the pool of freed buffers holds now.
#[cfg(test)]
fn pool_bytes() -> usize {
    POOL.lock().unwrap_or_else(|e| e.into_inner()).bytes
}

/// Page-aligned memory (an anonymous mapping), its length a multiple of `ALIGN`.
pub struct AlignedBuf {
    /// `None` only while being dropped into the pool.
    map: Option<MmapMut>,
}

impl AlignedBuf {
    /// A buffer to read into: a recycled one of the same size when the pool
    /// has one (its old contents are still there; readers only look at the
    /// ranges a read filled), else a fresh zeroed one.
    pub(crate) fn for_read(len: usize) -> Self {
        let size = (align_up(len as u64) as usize).max(ALIGN);
        {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = pool.free.iter().position(|m| m.len() == size) {
                let map = pool.free.swap_remove(i);
                pool.bytes -= map.len();
                return AlignedBuf { map: Some(map) };
            }
        }
        Self::new(len)
    }

    /// A zeroed buffer of at least `len` bytes (rounded up to `ALIGN`).
    /// Aborts like a failed allocation when the kernel refuses the mapping.
    pub fn new(len: usize) -> Self {
        let len = (align_up(len as u64) as usize).max(ALIGN);
        match MmapMut::map_anon(len) {
            Ok(map) => AlignedBuf { map: Some(map) },
            Err(_) => match std::alloc::Layout::from_size_align(len, ALIGN) {
                Ok(layout) => std::alloc::handle_alloc_error(layout),
                Err(_) => std::process::abort(),
            },
        }
    }

    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or(&mut [])
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let Some(map) = self.map.take() else { return };
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if pool.bytes + map.len() <= POOL_BYTES && pool.free.len() < POOL_BUFFERS {
            pool.bytes += map.len();
            pool.free.push(map);
        }
        // Else the mapping is unmapped here: its memory goes back to the kernel.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned() {
        let mut b = AlignedBuf::new(10);
        assert_eq!(b.len(), ALIGN);
        assert_eq!(b.as_mut_ptr() as usize % ALIGN, 0);
        assert!(b.as_ref().iter().all(|&x| x == 0));
        assert_eq!(align_up(4097), 8192);
        assert_eq!(AlignedBuf::new(5000).len(), 8192);
        assert_eq!(align_down(4097), 4096);
    }

    #[test]
    fn the_pool_is_bounded_in_buffers_and_bytes() {
        let bufs: Vec<AlignedBuf> = (0..POOL_BUFFERS * 2).map(|_| AlignedBuf::for_read(3 * ALIGN)).collect();
        drop(bufs);
        assert!(pool_bytes() <= POOL_BYTES);
        assert!(POOL.lock().unwrap().free.len() <= POOL_BUFFERS);
        let big: Vec<AlignedBuf> = (0..3).map(|_| AlignedBuf::for_read(POOL_BYTES / 2)).collect();
        drop(big);
        assert!(pool_bytes() <= POOL_BYTES);
    }
}
