//! Row-wise transformer operations. Each works on one token row at a time with a fixed
//! loop order, so a row's result never depends on the batch it travels in.

/// Root-mean-square norm of every `dim`-wide row of `x` into `out`, times `weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ss = crate::kernels::vector::sum_squares_f64(xr);
        let scale = (1.0 / (ss / dim as f64 + f64::from(eps)).sqrt()) as f32;
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// `x += y` elementwise.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Add a bias vector to every row.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

/// Which dimensions RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// (2i, 2i+1): llama as stored in GGUF.
    Adjacent,
    /// (i, i + d/2): qwen2 / GPT-NeoX.
    Halves,
}

/// Precomputed cos/sin for positions `[0, max_pos)`.
pub struct RopeTable {
    half: usize,
    layout: RopeLayout,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    pub fn new(head_dim: usize, theta_base: f32, max_pos: usize, layout: RopeLayout) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            for i in 0..half {
                let inv = f64::from(theta_base).powf(-2.0 * i as f64 / head_dim as f64);
                let a = p as f64 * inv;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        RopeTable {
            half,
            layout,
            cos,
            sin,
        }
    }

    pub fn max_pos(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotate every head (`head_dim`-wide slice) of one token row at position `pos`.
    pub fn apply(&self, row: &mut [f32], pos: usize) {
        let h = self.half;
        let c = &self.cos[pos * h..(pos + 1) * h];
        let s = &self.sin[pos * h..(pos + 1) * h];
        for head in row.chunks_exact_mut(2 * h) {
            match self.layout {
                RopeLayout::Adjacent => {
                    for i in 0..h {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * c[i] - b * s[i];
                        head[2 * i + 1] = a * s[i] + b * c[i];
                    }
                }
                RopeLayout::Halves => {
                    for i in 0..h {
                        let (a, b) = (head[i], head[i + h]);
                        head[i] = a * c[i] - b * s[i];
                        head[i + h] = a * s[i] + b * c[i];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5, 4.0, 4.0, 4.0, 4.0];
        let w = [1.0f32, 2.0, 0.5, 1.0];
        let mut out = [0.0f32; 8];
        rms_norm(&x, &w, 1e-6, &mut out);
        let ms = (1.0 + 4.0 + 9.0 + 0.25) / 4.0;
        let s = 1.0 / (ms + 1e-6f64).sqrt();
        assert!((out[1] as f64 - (-2.0 * s * 2.0)).abs() < 1e-6);
        assert!((out[4] - 1.0).abs() < 1e-5);
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        for layout in [RopeLayout::Adjacent, RopeLayout::Halves] {
            let t = RopeTable::new(8, 10000.0, 64, layout);
            let orig: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut r = orig.clone();
            t.apply(&mut r, 0);
            assert_eq!(r, orig);
            t.apply(&mut r, 37);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = r.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
            assert_ne!(r, orig);
        }
    }

    #[test]
    fn rope_pairs_follow_layout() {
        let t = RopeTable::new(4, 10000.0, 4, RopeLayout::Adjacent);
        let mut r = vec![1.0, 0.0, 0.0, 0.0];
        t.apply(&mut r, 1);
        // first pair rotated by angle 1 rad
        assert!((r[0] - 1f32.cos()).abs() < 1e-6 && (r[1] - 1f32.sin()).abs() < 1e-6);
        let t = RopeTable::new(4, 10000.0, 4, RopeLayout::Halves);
        let mut r = vec![1.0, 0.0, 0.0, 0.0];
        t.apply(&mut r, 1);
        assert!((r[0] - 1f32.cos()).abs() < 1e-6 && (r[2] - 1f32.sin()).abs() < 1e-6);
    }
}
