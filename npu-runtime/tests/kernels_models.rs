//! The matmul kernels on real weights: for every tensor type in the test models
//! (SmolLM2-135M: Q4_1/Q8_0, Qwen2.5-0.5B: Q5_0/Q8_0/Q4_K/Q6_K), the first rows of
//! one tensor per type dequantize bit-identically to graphs' oracle and multiply
//! within the activation-quantization error bound on every ISA, with the same
//! bits whether a token is alone or in a batch.

use std::path::Path;

mod common;
use common::model_or_skip as model;

use graphs::gguf::GgufFile;
use npu_runtime::kernels::{
    kernel_supported, matmul_reference, matmul_with_isa, GgmlType, Isa, MatmulScratch, QMatrix,
    ThreadPool,
};

fn check_model(path: &Path, expect: &[GgmlType]) {
    let f = GgufFile::open(path).expect("open gguf");
    let pool = ThreadPool::new(2);
    let mut seen = Vec::new();
    for t in f.tensors() {
        let ty = t.ggml_type;
        if !kernel_supported(ty) {
            continue;
        }
        if t.dims.len() != 2 || seen.contains(&ty) {
            continue;
        }
        seen.push(ty);
        let (cols, rows) = (t.row_len(), t.n_rows().min(48));
        let rb = t.ggml_type.row_bytes(cols).unwrap();
        let raw = &f.tensor_data(t)[..rows * rb];
        let w = QMatrix::from_ggml(ty, rows, cols, raw).unwrap();
        // Oracle equality of the repacked rows.
        let (mut got, mut want) = (vec![0f32; cols], vec![0f32; cols]);
        let mut dense = vec![0f32; rows * cols];
        for r in 0..rows {
            w.dequantize_row(r, &mut got);
            graphs::quant::dequantize_row(t.ggml_type, &raw[r * rb..(r + 1) * rb], &mut want)
                .unwrap();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}: row {r}",
                t.name
            );
            dense[r * cols..(r + 1) * cols].copy_from_slice(&got);
        }
        // Activations shaped like a residual stream: mostly small, a few large.
        let n = 5;
        let x: Vec<f32> = (0..n * cols)
            .map(|i| {
                let v = ((i * 2654435761usize % 1000) as f32 / 500.0 - 1.0) * 0.5;
                if i % 211 == 7 {
                    v * 40.0
                } else {
                    v
                }
            })
            .collect();
        let mut exact = vec![0f32; n * rows];
        matmul_reference(&w, &x, n, &mut exact);
        for isa in Isa::available() {
            let mut out = vec![0f32; n * rows];
            let mut scratch = MatmulScratch::new(n, cols);
            matmul_with_isa(isa, &w, &x, n, &mut out, &mut scratch, &pool);
            for tok in 0..n {
                let xt = &x[tok * cols..(tok + 1) * cols];
                let mut one = vec![0f32; rows];
                matmul_with_isa(isa, &w, xt, 1, &mut one, &mut scratch, &pool);
                for r in 0..rows {
                    let wr = &dense[r * cols..(r + 1) * cols];
                    let mag: f64 = wr
                        .iter()
                        .zip(xt)
                        .map(|(a, b)| (*a as f64 * *b as f64).abs())
                        .sum();
                    let mut bound = 1e-5 * mag + 1e-6;
                    if !matches!(ty, GgmlType::F32 | GgmlType::F16) {
                        for (wb, xb) in wr.chunks(32).zip(xt.chunks(32)) {
                            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                            bound += amax / 254.0
                                * 1.0001
                                * wb.iter().map(|v| v.abs() as f64).sum::<f64>();
                        }
                    }
                    let (g, e) = (out[tok * rows + r], exact[tok * rows + r]);
                    assert!(
                        ((g - e) as f64).abs() <= bound,
                        "{} {isa:?} row {r} token {tok}: {g} vs {e}",
                        t.name
                    );
                    assert_eq!(
                        g.to_bits(),
                        one[r].to_bits(),
                        "{} {isa:?}: batch vs alone",
                        t.name
                    );
                }
            }
        }
    }
    for ty in expect {
        assert!(
            seen.contains(ty),
            "{}: no {ty:?} tensor found",
            path.display()
        );
    }
}

#[test]
fn smollm2_tensors() {
    if let Some(p) = model("smollm2-135m") {
        check_model(&p, &[GgmlType::Q4_1, GgmlType::Q8_0]);
    }
}

#[test]
fn qwen_tensors() {
    if let Some(p) = model("qwen2.5-coder-0.5b") {
        check_model(
            &p,
            &[GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K],
        );
    }
}
