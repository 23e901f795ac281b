//! [`SharedBytes`]: the one byte-view type of larder. An immutable range of
//! any byte owner (a `Vec`, a file mapping, an aligned I/O buffer), shared by
//! reference count and sliced without a copy. The store's I/O backends hand
//! out these views and the model computes on them directly.

use std::sync::Arc;

/// Anything that owns bytes a view may point into (a `Vec<u8>`, an mmap, the
/// store's `AlignedBuf`).
pub type ByteOwner = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// `owner[start..start + len]`, shared.
#[derive(Clone)]
pub struct SharedBytes {
    owner: ByteOwner,
    start: usize,
    len: usize,
}

impl SharedBytes {
    /// A view of `owner[start..start + len]`.
    ///
    /// # Panics
    /// If the range is out of bounds (callers validate ranges from file
    /// headers first; backends build views from ranges they filled).
    pub fn new(owner: ByteOwner, start: usize, len: usize) -> Self {
        let total = (*owner).as_ref().len();
        assert!(start.checked_add(len).is_some_and(|end| end <= total), "SharedBytes out of range");
        SharedBytes { owner, start, len }
    }

    /// A view of all of `owner`.
    pub fn whole(owner: ByteOwner) -> Self {
        let len = (*owner).as_ref().len();
        SharedBytes { owner, start: 0, len }
    }

    /// Takes ownership of a vector.
    pub fn from_vec(v: Vec<u8>) -> Self {
        Self::whole(Arc::new(v))
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    /// A sub-range of this view, sharing the owner.
    ///
    /// # Panics
    /// If the range is out of bounds (callers check ranges first).
    pub fn slice(&self, offset: usize, len: usize) -> SharedBytes {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "SharedBytes::slice out of range"
        );
        SharedBytes {
            owner: self.owner.clone(),
            start: self.start + offset,
            len,
        }
    }

    /// The view over the owner's every byte (this view's range widened).
    pub fn whole_owner(&self) -> SharedBytes {
        Self::whole(self.owner.clone())
    }

    /// Bytes the owner holds (this view and all around it).
    pub fn owner_len(&self) -> usize {
        (*self.owner).as_ref().len()
    }

    /// Whether both views point into the same owner.
    pub fn same_owner(&self, other: &SharedBytes) -> bool {
        Arc::ptr_eq(&self.owner, &other.owner)
    }

    /// Where this view starts in its owner.
    pub fn start(&self) -> usize {
        self.start
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes at {})", self.len, self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_slice_and_share_their_owner() {
        let v = SharedBytes::from_vec((0u8..10).collect());
        let s = v.slice(2, 5);
        assert_eq!(s.as_slice(), &[2, 3, 4, 5, 6]);
        let t = s.slice(1, 2);
        assert_eq!((t.start(), t.as_slice()), (3, &[3u8, 4][..]));
        assert!(t.same_owner(&v));
        assert_eq!(t.whole_owner().len(), 10);
        assert!(!t.same_owner(&SharedBytes::from_vec(vec![0; 10])));
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn a_range_past_the_owner_panics() {
        SharedBytes::new(Arc::new(vec![0u8; 4]), 3, 2);
    }
}
