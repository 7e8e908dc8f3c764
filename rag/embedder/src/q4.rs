//! ggml's Q4_0 block, the weight format of the packed multilingual-e5 file: 32 weights as an
//! f16 scale `d` and 16 bytes, byte `j` holding weight `j` in its low nibble and weight
//! `j + 16` in its high nibble; a weight is `(nibble - 8) * d`.

/// Weights per block.
pub(crate) const BLOCK: usize = 32;
/// Bytes per block: the f16 scale and 16 bytes of nibbles.
pub(crate) const BLOCK_BYTES: usize = 2 + BLOCK / 2;

/// Bytes of a row of `n` weights (`n` a multiple of [`BLOCK`]).
pub(crate) fn row_bytes(n: usize) -> usize {
    n / BLOCK * BLOCK_BYTES
}

/// Dequantises whole blocks of `src` into `out` (`out.len() / 32` blocks).
pub(crate) fn dequantize(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        let (lo, hi) = o.split_at_mut(BLOCK / 2);
        for ((&q, l), h) in b[2..].iter().zip(lo).zip(hi) {
            *l = ((q & 0x0F) as i32 - 8) as f32 * d;
            *h = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibbles_map_to_their_weights() {
        let mut block = vec![0u8; BLOCK_BYTES];
        block[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        for j in 0..16 {
            // weight j = j - 8, weight j + 16 = 15 - j - 8
            block[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0f32; BLOCK];
        dequantize(&block, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(out[j + 16], (7.0 - j as f32) * 0.5);
        }
        assert_eq!(row_bytes(384), 12 * 18);
    }
}
