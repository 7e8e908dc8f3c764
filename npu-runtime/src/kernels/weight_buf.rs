//! Zeroed, 64-byte aligned buffers for repacked weights, on transparent huge pages
//! where the OS offers them (KERNELS.md 98).
//!
//! A decode step streams every weight once: 393 MB for Qwen2.5-0.5B, ~100k pages of
//! 4 KB, each a TLB miss and a page walk while the kernels wait on the stream. Linux
//! backs anonymous memory with 2 MB pages when asked (`MADV_HUGEPAGE`; most distributions
//! ship `transparent_hugepage=madvise`, so nothing is huge unless asked). So a buffer of
//! at least one huge page is an anonymous mapping advised before its first write (the
//! advice applies to the pages the writes then fault in); anything smaller, any other
//! OS, or a refused mapping is an ordinary heap allocation.

/// 64 bytes, the alignment the kernels' vector loads assume.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Buffers from this size on are mapped and advised (smaller ones cannot hold a huge page).
const HUGE: usize = 2 << 20;

/// A zero-initialised byte buffer, 64-byte aligned, of a multiple of 64 bytes.
pub(crate) struct WeightBuf(Inner);

enum Inner {
    Heap(Vec<Line>),
    Mapped(memmap2::MmapMut),
}

impl WeightBuf {
    /// `len` zero bytes (`len` a multiple of 64).
    pub(crate) fn zeroed(len: usize) -> WeightBuf {
        assert!(
            len.is_multiple_of(64),
            "WeightBuf: length must be whole lines"
        );
        if cfg!(target_os = "linux") && len >= HUGE {
            // A mapping is page-aligned and zero-filled; the advice is only a hint, so
            // a kernel without huge pages (or with them off) just keeps small ones.
            if let Ok(map) = memmap2::MmapMut::map_anon(len) {
                #[cfg(target_os = "linux")]
                let _ = map.advise(memmap2::Advice::HugePage);
                return WeightBuf(Inner::Mapped(map));
            }
        }
        WeightBuf(Inner::Heap(vec![Line([0; 64]); len / 64]))
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match &self.0 {
            // SAFETY: `Line` is 64 plain bytes with no padding, so the vector's storage
            // is `len * 64` initialised bytes, borrowed immutably with `self`.
            Inner::Heap(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 64)
            },
            Inner::Mapped(m) => m,
        }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.0 {
            // SAFETY: as in `as_slice`, borrowed mutably with `self`.
            Inner::Heap(v) => unsafe {
                std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 64)
            },
            Inner::Mapped(m) => m,
        }
    }

    /// Whether the buffer is a mapping advised for huge pages.
    #[cfg(test)]
    fn is_mapped(&self) -> bool {
        matches!(self.0, Inner::Mapped(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_aligned_and_writable_at_every_size() {
        for len in [64, 4096, HUGE - 64, HUGE, HUGE + 64 * 3, 3 * HUGE] {
            let mut b = WeightBuf::zeroed(len);
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0), "{len}: not zeroed");
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0, "{len}: misaligned");
            for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
                *x = i as u8;
            }
            assert!(b.as_slice().iter().enumerate().all(|(i, &x)| x == i as u8));
            assert_eq!(
                b.is_mapped(),
                cfg!(target_os = "linux") && len >= HUGE,
                "{len}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "whole lines")]
    fn a_partial_line_is_refused() {
        WeightBuf::zeroed(100);
    }
}
