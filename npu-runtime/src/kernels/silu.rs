//! SwiGLU's element-wise step `gate = silu(gate) · up`, with libm `expf` (one call
//! per element).

/// `silu(g) · u` for one element: `g / (1 + e^{-g})`, then `· u`. NaN in either input
/// gives NaN; `+inf` gives `+inf · u`; `-inf` gives NaN (`-inf / inf`).
#[inline(always)]
pub fn silu_mul_one(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// `gate[i] = silu(gate[i]) · up[i]`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: gate and up lengths differ");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu_mul_one(*g, u);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against silu in f64 on a dense sweep, and the special values as documented.
    #[test]
    fn matches_f64_silu() {
        let mut x = -90.0f32;
        while x < 90.0 {
            let got = silu_mul_one(x, 1.0) as f64;
            let xd = x as f64;
            let want = xd / (1.0 + (-xd).exp());
            if want.abs() > 1e-35 {
                assert!(
                    (got - want).abs() <= 4e-7 * want.abs(),
                    "x={x}: {got} vs {want}"
                );
            } else {
                assert!(got.abs() <= 1e-35, "x={x}: {got}");
            }
            x += 0.0031;
        }
        assert_eq!(silu_mul_one(0.0, 5.0), 0.0);
        assert_eq!(silu_mul_one(f32::INFINITY, 2.0), f32::INFINITY);
        assert!(silu_mul_one(f32::NEG_INFINITY, 1.0).is_nan());
        assert!(silu_mul_one(f32::NAN, 1.0).is_nan());
        assert!(silu_mul_one(1.0, f32::NAN).is_nan());
    }
}
