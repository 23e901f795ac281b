//! Byte buffers the I/O backends fill and the model computes on without a
//! copy: [`AlignedBuf`] (4 KiB-aligned heap memory, as O_DIRECT requires)
//! and [`ByteView`], a shared view of a range of any byte owner (a buffer or
//! a file mapping).
//!
//! Read buffers are recycled: a dropped buffer (an evicted cache entry)
//! goes to a small pool that [`AlignedBuf::for_read`] takes from, so steady
//! streaming does not pay page faults and zeroing for every record (measured:
//! that cost a quarter of io_uring's throughput when done on the submitting
//! thread). The pool holds at most [`POOL_BYTES`].

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Alignment of every buffer and of every O_DIRECT offset and length.
pub const ALIGN: usize = 4096;

/// `n` rounded up to a multiple of [`ALIGN`].
pub fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN as u64) * ALIGN as u64
}

/// `n` rounded down to a multiple of [`ALIGN`].
pub fn align_down(n: u64) -> u64 {
    n / ALIGN as u64 * ALIGN as u64
}

/// Bytes of freed buffers kept for reuse.
pub const POOL_BYTES: usize = 256 << 20;

struct Pool {
    free: Vec<(NonNull<u8>, usize)>,
    bytes: usize,
}

// SAFETY: the pool owns the allocations it holds exclusively.
unsafe impl Send for Pool {}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    free: Vec::new(),
    bytes: 0,
});

/// Heap memory aligned to [`ALIGN`], its length a multiple of it.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer to read into: a recycled one of the same size when the pool
    /// has one (its old contents are still there; readers only look at the
    /// ranges a read filled), else a fresh zeroed one.
    pub fn for_read(len: usize) -> Self {
        let size = (align_up(len as u64) as usize).max(ALIGN);
        {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = pool.free.iter().position(|&(_, l)| l == size) {
                let (ptr, len) = pool.free.swap_remove(i);
                pool.bytes -= len;
                return AlignedBuf { ptr, len };
            }
        }
        Self::new(len)
    }

    /// A zeroed buffer of at least `len` bytes (rounded up to [`ALIGN`]).
    pub fn new(len: usize) -> Self {
        let len = (align_up(len as u64) as usize).max(ALIGN);
        let layout = Layout::from_size_align(len, ALIGN).expect("aligned buffer layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed or read) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            if pool.bytes + self.len <= POOL_BYTES {
                pool.bytes += self.len;
                pool.free.push((self.ptr, self.len));
                return;
            }
        }
        let layout = Layout::from_size_align(self.len, ALIGN).expect("aligned buffer layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// Anything that owns bytes the model may compute on.
pub type ByteOwner = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// `owner[start..start + len]`, shared.
#[derive(Clone)]
pub struct ByteView {
    pub owner: ByteOwner,
    pub start: usize,
    pub len: usize,
}

impl ByteView {
    /// # Panics
    /// If the range is outside the owner (backends build views from ranges they filled).
    pub fn new(owner: ByteOwner, start: usize, len: usize) -> Self {
        assert!(start + len <= (*owner).as_ref().len(), "ByteView out of range");
        ByteView { owner, start, len }
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for ByteView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ByteView({} bytes at {})", self.len, self.start)
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
        assert_eq!(align_down(4097), 4096);
    }
}
