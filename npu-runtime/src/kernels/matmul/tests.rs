use super::kernel_io::{Kernel, OutOp, Output};
use super::*;
use crate::kernels::act::{ActFormat, QuantActs};
use crate::kernels::ggml::GgmlType;
use crate::kernels::layout::GROUP;
use crate::kernels::pool::ThreadPool;
use crate::kernels::portable;
use crate::kernels::simd::Isa;
use crate::test_rng::uniform;

/// Random valid ggml bytes: random codes, small finite f16 scales.
fn random_matrix(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> QMatrix {
    QMatrix::from_ggml(ty, rows, cols, &random_bytes(ty, rows, cols, seed)).unwrap()
}

/// The ggml bytes of [`random_matrix`].
fn random_bytes(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let ts = ty.type_size();
    let n_blocks = rows * cols / ty.block_size();
    let noise = uniform(seed, n_blocks * ts);
    let mut bytes: Vec<u8> = noise.iter().map(|v| (v.to_bits() >> 7) as u8).collect();
    let at: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => unreachable!("test types only"),
    };
    // Scales (and Q4_1/Q5_1 mins, of either sign) vary by block and row, so a kernel
    // that reads another row's or block's gets different bits.
    let signed_min = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    for b in bytes.chunks_exact_mut(ts) {
        for &p in at {
            let r = b[p];
            let mut v = 0.003 * (0.5 + r as f32 / 256.0);
            if signed_min && p == 2 && r & 1 == 1 {
                v = -v;
            }
            b[p..p + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    bytes
}

/// `w · x` (a quantized `w`) by the canonical portable computation
/// ([`portable::run_quant_canonical`]): the plain row-by-row statement of the
/// arithmetic every kernel reproduces.
fn matmul_canonical(w: &QMatrix, x: &[f32], n: usize, out: &mut [f32]) {
    let mut acts = QuantActs::new(n, w.cols);
    let fmt = ActFormat::for_weights(w.ty);
    crate::kernels::act::quantize(Isa::Portable, fmt, x, &mut acts);
    let k = Kernel::new(w, n);
    let o = Output {
        dst: out.as_mut_ptr(),
        rows: w.rows,
        op: OutOp::Store,
    };
    // SAFETY: `out` holds n x rows floats, written only here; the activations were
    // quantized for these n tokens of w.cols columns.
    unsafe { portable::run_quant_canonical(&k, &acts, 0, w.rows.div_ceil(GROUP), &o) };
}

/// The portable kernel (its decode by words and its dot products reorganised for
/// speed) gives the canonical bits: every format, widths of one and several
/// super-blocks, partial last groups, 1-70 tokens (one and two token chunks).
#[test]
fn portable_kernel_equals_the_canonical_computation() {
    let mut seed = 0x5DEE_CE66_D1CEu64;
    let pool = ThreadPool::new(1);
    for ty in crate::kernels::ggml::QUANT_TYPES {
        for (rows, cols) in [(16, 256), (37, 512), (50, 768)] {
            let w = random_matrix(ty, rows, cols, &mut seed);
            for n in [1usize, 2, 3, 5, 8, 13, 64, 70] {
                let x = uniform(&mut seed, n * cols);
                let mut want = vec![f32::NAN; n * rows];
                matmul_canonical(&w, &x, n, &mut want);
                let mut got = vec![f32::NAN; n * rows];
                let mut scratch = MatmulScratch::new(n, cols);
                matmul_with_isa(Isa::Portable, &w, &x, n, &mut got, &mut scratch, &pool);
                assert_eq!(bits(&got), bits(&want), "{ty:?} {rows}x{cols} n={n}");
            }
        }
    }
}

/// Every row read back from the repacked layout (one row decoded, as an embedding
/// lookup does) equals ggml's reference dequantization of the original row, bit for
/// bit, including rows of a partial last group.
#[test]
fn dequantize_row_equals_reference_for_every_format() {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let (rows, cols) = (37, 512);
    for ty in crate::kernels::ggml::QUANT_TYPES {
        let raw = random_bytes(ty, rows, cols, &mut seed);
        let w = QMatrix::from_ggml(ty, rows, cols, &raw).unwrap();
        let rb = raw.len() / rows;
        let (mut got, mut want) = (vec![0f32; cols], vec![0f32; cols]);
        for r in 0..rows {
            w.dequantize_row(r, &mut got);
            graphs::quant::dequantize_row(ty, &raw[r * rb..(r + 1) * rb], &mut want).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{ty:?} row {r}");
        }
    }
}

/// `|out - exact| <= Σ_blocks amax_b/254 · Σ|w_b| + 1e-5 Σ|w·x|` (activation
/// quantization moves each x by at most half a step): an oracle independent of
/// the kernels and of which quantized copy they read.
fn assert_within_quantization_bound(w: &QMatrix, x: &[f32], n: usize, out: &[f32]) {
    let mut row = vec![0f32; w.cols()];
    for r in 0..w.rows() {
        w.dequantize_row(r, &mut row);
        for t in 0..n {
            let xt = &x[t * w.cols()..][..w.cols()];
            let prods = row.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64);
            let exact: f64 = prods.clone().sum();
            let mag: f64 = prods.map(f64::abs).sum();
            let quant: f64 = row
                .chunks(32)
                .zip(xt.chunks(32))
                .map(|(wb, xb)| {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                    amax / 254.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                })
                .sum();
            let err = (out[t * w.rows() + r] as f64 - exact).abs();
            assert!(
                err <= quant * 1.0001 + 1e-5 * mag + 1e-6,
                "row {r} token {t}: {err}"
            );
        }
    }
}

/// One region over several matrices (mixed activation formats, tiny and big
/// calls, 1-3 threads) gives every output the bits of its own `matmul`.
#[test]
fn multi_equals_separate_calls_bitwise() {
    let mut seed = 11;
    let cols = 512;
    let ws = [
        random_matrix(GgmlType::Q5_0, 200, cols, &mut seed),
        random_matrix(GgmlType::Q6K, 40, cols, &mut seed),
        random_matrix(GgmlType::Q4_1, 33, cols, &mut seed),
        random_matrix(GgmlType::Q4K, 16, cols, &mut seed),
    ];
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        for n in [1usize, 3, 8] {
            let x = uniform(&mut seed, n * cols);
            for isa in Isa::available() {
                let mut scratch = MatmulScratch::new(n, cols);
                for k in 1..=ws.len() {
                    let refs: Vec<&QMatrix> = ws[..k].iter().collect();
                    let mut want: Vec<Vec<f32>> =
                        refs.iter().map(|w| vec![0.0; n * w.rows()]).collect();
                    for (w, o) in refs.iter().zip(&mut want) {
                        matmul_with_isa(isa, w, &x, n, o, &mut scratch, &pool);
                    }
                    let mut got: Vec<Vec<f32>> =
                        refs.iter().map(|w| vec![f32::NAN; n * w.rows()]).collect();
                    let mut outs: Vec<&mut [f32]> =
                        got.iter_mut().map(|o| o.as_mut_slice()).collect();
                    matmul_multi_with_isa(isa, &refs, &x, n, &mut outs, &mut scratch, &pool);
                    for ((g, w), m) in got.iter().zip(&want).zip(&refs) {
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(g), bits(w), "{isa:?} n={n} k={k} t={threads}");
                        assert_within_quantization_bound(m, &x, n, g);
                    }
                }
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Every epilogue, alone and mixed in one `matmul_multi` region, gives the bits of
/// the plain `matmul` followed by the separate element-wise op (`ops::add_bias`,
/// `ops::add_in_place`): every format, a partial last group,
/// 1-3 threads, tiny (inline) and pooled calls, every ISA.
#[test]
fn epilogues_equal_the_unfused_sequence() {
    use crate::ops::{add_bias, add_in_place};
    let mut seed = 41;
    let (rows, cols) = (200 + 5, 256);
    for ty in crate::kernels::ggml::QUANT_TYPES {
        let w = random_matrix(ty, rows, cols, &mut seed);
        let bias: Vec<f32> = uniform(&mut seed, rows);
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for n in [1usize, 5, 16] {
                let mut scratch = MatmulScratch::new(n, cols);
                let x = uniform(&mut seed, n * cols);
                let init: Vec<f32> = uniform(&mut seed, n * rows)
                    .iter()
                    .map(|v| v * 12.0)
                    .collect();
                for isa in Isa::available() {
                    let mut p = vec![0f32; n * rows];
                    matmul_with_isa(isa, &w, &x, n, &mut p, &mut scratch, &pool);
                    let mut with_bias = p.clone();
                    add_bias(&mut with_bias, &bias);
                    let mut accumulated = init.clone();
                    add_in_place(&mut accumulated, &p);
                    let cases = [
                        (Epilogue::Store, &p),
                        (Epilogue::Bias(&bias), &with_bias),
                        (Epilogue::Accumulate, &accumulated),
                    ];
                    let what = format!("{ty:?} {isa:?} n={n} t={threads}");
                    for (epi, want) in cases {
                        let mut got = init.clone();
                        matmul_multi_epilogue_with_isa(
                            isa,
                            &[&w],
                            &x,
                            n,
                            &mut [&mut got],
                            &[epi],
                            &mut scratch,
                            &pool,
                        );
                        assert_eq!(bits(&got), bits(want), "{epi:?} {what}");
                    }
                    // All of them in one region (one matrix, one output each).
                    let mut got: Vec<Vec<f32>> = (0..3).map(|_| init.clone()).collect();
                    let mut outs: Vec<&mut [f32]> =
                        got.iter_mut().map(|o| o.as_mut_slice()).collect();
                    let epis = cases.map(|c| c.0);
                    let ws = [&w; 3];
                    matmul_multi_epilogue_with_isa(
                        isa,
                        &ws,
                        &x,
                        n,
                        &mut outs,
                        &epis,
                        &mut scratch,
                        &pool,
                    );
                    for (g, (epi, want)) in got.iter().zip(cases) {
                        assert_eq!(bits(g), bits(want), "multi {epi:?} {what}");
                    }
                }
            }
        }
    }
}

/// `matmul_swiglu` equals gate and up products followed by `silu_mul`, bit for
/// bit: mixed formats (two activation formats), a partial last group, more tasks
/// than threads, every batch size up to 17, every ISA.
#[test]
fn swiglu_equals_gate_up_then_silu_mul() {
    use crate::kernels::silu::silu_mul_with_isa;
    let mut seed = 43;
    let (rows, cols) = (16 * 21 + 3, 512);
    let pairs = [
        (GgmlType::Q4K, GgmlType::Q6K),
        (GgmlType::Q5_0, GgmlType::Q8_0),
        (GgmlType::Q4_1, GgmlType::Q4_1),
    ];
    for (tg, tu) in pairs {
        let wg = random_matrix(tg, rows, cols, &mut seed);
        let wu = random_matrix(tu, rows, cols, &mut seed);
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            let mut scratch = MatmulScratch::new(17, cols);
            for n in 1..=17 {
                // Large inputs so the gate products reach silu's both tails.
                let x: Vec<f32> = uniform(&mut seed, n * cols)
                    .iter()
                    .map(|v| v * 40.0)
                    .collect();
                for isa in Isa::available() {
                    let mut want = vec![0f32; n * rows];
                    let mut up = vec![0f32; n * rows];
                    matmul_with_isa(isa, &wg, &x, n, &mut want, &mut scratch, &pool);
                    matmul_with_isa(isa, &wu, &x, n, &mut up, &mut scratch, &pool);
                    silu_mul_with_isa(Isa::Portable, &mut want, &up);
                    let mut got = vec![f32::NAN; n * rows];
                    let mut got_up = vec![f32::NAN; n * rows];
                    let (g, u) = (&mut got, &mut got_up);
                    matmul_swiglu_with_isa(isa, &wg, &wu, &x, n, g, u, &mut scratch, &pool);
                    assert_eq!(bits(&got_up), bits(&up), "up products");
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{tg:?}/{tu:?} {isa:?} n={n} t={threads}"
                    );
                }
            }
        }
    }
}

/// Random ggml bytes for `rows` rows in which every row is a copy of one random
/// row, except `big` rows, copies of that row with a doubled scale: every output
/// of a token ties with all others of its kind, so argmax tie-breaking is tested.
fn tied_matrix(ty: GgmlType, rows: usize, cols: usize, big: &[usize], seed: &mut u64) -> QMatrix {
    let row_bytes = ty.row_bytes(cols).unwrap();
    assert_eq!(ty, GgmlType::Q8_0, "tied_matrix builds Q8_0 rows");
    let mut base = vec![0u8; row_bytes];
    let mut s = *seed;
    for b in base.chunks_exact_mut(34) {
        b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        for c in &mut b[2..] {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *c = (s >> 33) as u8;
        }
    }
    *seed = s;
    let mut doubled = base.clone();
    for b in doubled.chunks_exact_mut(34) {
        b[..2].copy_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
    }
    let mut bytes = Vec::with_capacity(rows * row_bytes);
    for r in 0..rows {
        bytes.extend_from_slice(if big.contains(&r) { &doubled } else { &base });
    }
    QMatrix::from_ggml(ty, rows, cols, &bytes).unwrap()
}

/// `matmul_argmax` returns `session::argmax` of every row of the full `matmul`
/// output: random matrices of every format (many groups, so several tasks and a
/// partial last group), exact ties across groups and tasks, all-negative rows
/// (the padding lanes of a partial group must not win), 1-3 threads, every ISA.
#[test]
fn argmax_equals_argmax_of_full_output() {
    use crate::session::argmax;
    let mut seed = 31;
    let cols = 256;
    let mut cases: Vec<(QMatrix, &str)> = crate::kernels::ggml::QUANT_TYPES
        .iter()
        .map(|&ty| (random_matrix(ty, 1000 + 7, cols, &mut seed), "random"))
        .collect();
    cases.push((
        tied_matrix(GgmlType::Q8_0, 421, cols, &[37, 300, 301, 415], &mut seed),
        "ties",
    ));
    cases.push((
        tied_matrix(GgmlType::Q8_0, 37, cols, &[], &mut seed),
        "all equal",
    ));
    let mut checked_ties = [0usize; 2];
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        for n in [1usize, 5, 8, 16, ARGMAX_MAX_TOKENS] {
            let mut scratch = MatmulScratch::new(n, cols);
            let mut x = uniform(&mut seed, n * cols);
            // Half the tokens negated: the tied rows' products flip sign.
            for t in (0..n).step_by(2) {
                x[t * cols..(t + 1) * cols]
                    .iter_mut()
                    .for_each(|v| *v = -*v);
            }
            for (w, what) in &cases {
                for isa in Isa::available() {
                    let mut full = vec![0f32; n * w.rows()];
                    matmul_with_isa(isa, w, &x, n, &mut full, &mut scratch, &pool);
                    let want: Vec<u32> = full.chunks_exact(w.rows()).map(argmax).collect();
                    let mut got = vec![u32::MAX; n];
                    matmul_argmax_with_isa(isa, w, &x, n, &mut got, &mut scratch, &pool);
                    assert_eq!(
                        got,
                        want,
                        "{what} {:?} {isa:?} n={n} t={threads}",
                        w.ggml_type()
                    );
                    if *what == "ties" {
                        for (t, &a) in want.iter().enumerate() {
                            let row = &full[t * w.rows()..][..w.rows()];
                            assert!(row.iter().filter(|&&v| v == row[a as usize]).count() > 1);
                            checked_ties[usize::from(a == 37)] += 1;
                        }
                    }
                }
            }
        }
    }
    // Both tie kinds occurred: the first doubled row (37) and row 0 of the others.
    assert!(
        checked_ties[0] > 0 && checked_ties[1] > 0,
        "{checked_ties:?}"
    );
}

/// Every batch size from 1 to 33 (so any split of the batch into token tiles
/// leaves a ragged tail somewhere) and 64, 65, 129, 130 (one and two token
/// chunks and a tail), every format, every ISA, row counts that leave a partial
/// group (37 rows: alone after two full ones; 245 rows: 16 groups, two per pool
/// task, so the last group is the partial second of a pair for kernels that run
/// groups in pairs): each token gets the bits of that token computed alone on
/// the portable kernel.
#[test]
fn every_batch_size_is_bit_identical_to_portable_single_tokens() {
    let mut seed = 23;
    let (cols, max_n) = (512, 130);
    let ns: Vec<usize> = (1..=33).chain([64, 65, 129, 130]).collect();
    let pool = ThreadPool::new(2);
    let mut scratch = MatmulScratch::new(max_n, cols);
    let types = crate::kernels::ggml::QUANT_TYPES;
    for (ty, rows) in types.iter().flat_map(|&ty| [(ty, 37), (ty, 245)]) {
        let w = random_matrix(ty, rows, cols, &mut seed);
        let x = uniform(&mut seed, max_n * cols);
        let mut alone = vec![0f32; max_n * rows];
        for t in 0..max_n {
            let (xt, ot) = (&x[t * cols..][..cols], &mut alone[t * rows..][..rows]);
            matmul_with_isa(Isa::Portable, &w, xt, 1, ot, &mut scratch, &pool);
        }
        assert_within_quantization_bound(&w, &x, max_n, &alone);
        for isa in Isa::available() {
            for &n in &ns {
                let mut out = vec![f32::NAN; n * rows];
                matmul_with_isa(isa, &w, &x[..n * cols], n, &mut out, &mut scratch, &pool);
                for (i, (g, a)) in out.iter().zip(&alone).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        a.to_bits(),
                        "{ty:?} {isa:?} n={n} token {} row {}",
                        i / rows,
                        i % rows
                    );
                }
            }
        }
    }
}

/// The largest K-quant codes times full-scale activations of either sign give the
/// portable bits on every ISA, in the pair passes too (a kernel that kept partial sums
/// in lanes narrower than the products need fails here, where random codes rarely
/// reach the range): every Q4_K code 15 with every 6-bit scale and min 63, and every
/// Q6_K code 0 (-32) or 63 (+31) with scale +-127, against activations that quantize
/// to +-127 in runs of 16 columns.
#[test]
fn largest_k_quant_codes_are_bit_identical_to_portable() {
    use graphs::quant::{BlockQ4K, BlockQ6K};
    use std::mem::{offset_of, size_of};
    // 16 row groups: two per pool task, so the pair passes run.
    let (rows, cols, n) = (256, 512, 24);
    let f16_at = |b: &mut [u8], at: usize, v: f32| {
        b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes())
    };
    let mut q4 = vec![0xFFu8; rows * cols / 256 * size_of::<BlockQ4K>()];
    for b in q4.chunks_exact_mut(size_of::<BlockQ4K>()) {
        f16_at(b, offset_of!(BlockQ4K, d), 0.002);
        f16_at(b, offset_of!(BlockQ4K, dmin), 0.001);
    }
    let mut matrices = vec![(GgmlType::Q4K, q4)];
    for (code, scale) in [(0x00u8, 0x7Fu8), (0xFF, 0x81)] {
        let mut q6 = vec![code; rows * cols / 256 * size_of::<BlockQ6K>()];
        for b in q6.chunks_exact_mut(size_of::<BlockQ6K>()) {
            b[offset_of!(BlockQ6K, scales)..][..16].fill(scale);
            f16_at(b, offset_of!(BlockQ6K, d), 0.002);
        }
        matrices.push((GgmlType::Q6K, q6));
    }
    // Token t: +1 or -1 in runs of 16 columns, the pattern shifted per token.
    let x: Vec<f32> = (0..n * cols)
        .map(|i| {
            let (t, c) = (i / cols, i % cols);
            if (c / 16 + t) % 3 == 0 {
                -1.0
            } else {
                1.0
            }
        })
        .collect();
    let pool = ThreadPool::new(2);
    let mut scratch = MatmulScratch::new(n, cols);
    for (ty, bytes) in matrices {
        let w = QMatrix::from_ggml(ty, rows, cols, &bytes).unwrap();
        let mut want = vec![0f32; n * rows];
        matmul_with_isa(Isa::Portable, &w, &x, n, &mut want, &mut scratch, &pool);
        assert!(want.iter().all(|v| v.is_finite() && *v != 0.0), "{ty:?}");
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; n * rows];
            matmul_with_isa(isa, &w, &x, n, &mut got, &mut scratch, &pool);
            assert_eq!(bits(&got), bits(&want), "{ty:?} {isa:?}");
        }
    }
}

#[test]
fn task_shares_cover_every_group_once_and_cut_at_even_groups() {
    use super::dispatch::task_groups;
    for n_groups in 0..200 {
        for n_tasks in 1..=24 {
            let mut next = 0;
            for j in 0..n_tasks {
                let (g0, g1) = task_groups(j, n_groups, n_tasks);
                assert_eq!(g0, next, "{n_groups} groups, {n_tasks} tasks, task {j}");
                assert!(g1 >= g0);
                if j + 1 < n_tasks {
                    assert_eq!(g1 % 2, 0, "{n_groups}/{n_tasks}: task {j} ends at {g1}");
                }
                // Near-even: no share exceeds the even split by more than a pair.
                assert!(g1 - g0 <= n_groups.div_ceil(n_tasks) + 2);
                next = g1;
            }
            assert_eq!(next, n_groups);
        }
    }
}
