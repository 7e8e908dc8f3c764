//! One deterministic generator for the crate's unit tests (no extra dependency).

/// `n` values in [-1, 1) from a 64-bit LCG whose state is `seed` (advanced in place).
pub(crate) fn uniform(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
