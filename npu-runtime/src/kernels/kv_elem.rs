//! The element types the KV cache stores (`f32`, `half::f16`), which the attention kernels
//! are generic over.

use half::f16;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

/// An element type the cache stores (`f32` or `half::f16`); the attention kernels are
/// generic over it and widen on load (exactly).
pub trait KvElem: Copy + Default + Send + Sync + 'static + sealed::Sealed {
    /// Half floats: the SIMD kernels widen them with `vcvtph2ps`.
    const HALF: bool;
    /// `x` as stored. Half: round to nearest even, finite values beyond the half range
    /// saturated to ±65504 (an infinity would turn a whole softmax into NaN), NaN kept.
    fn narrow(x: f32) -> Self;
    /// The f32 a stored value stands for (exact).
    fn widen(self) -> f32;
    /// `n` zeros from zeroed memory, so the pages stay unmapped until slots are written
    /// (a 4096-slot cache costs nothing for a short conversation).
    fn zeros(n: usize) -> Vec<Self>;
}

impl KvElem for f32 {
    const HALF: bool = false;
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    fn zeros(n: usize) -> Vec<Self> {
        vec![0.0; n]
    }
}

impl KvElem for f16 {
    const HALF: bool = true;
    #[inline]
    fn narrow(x: f32) -> Self {
        f16::from_f32(x.clamp(-65504.0, 65504.0))
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn zeros(n: usize) -> Vec<Self> {
        // `vec![f16::ZERO; n]` writes every element (only primitive zeros get zeroed
        // memory); the bits' vector does not, and is the same allocation reinterpreted.
        use half::vec::HalfBitsVecExt;
        vec![0u16; n].reinterpret_into()
    }
}
