//! Times the quantized matmul on Qwen2.5-0.5B shapes for several batch sizes.
//!
//! cargo run -p npu-runtime --release --example kernel_bench -- \
//!     [--threads N] [--isa avx512|avxvnni|avx2|portable] [--min-ms MS] [--only NAME]
//!
//! Weights are random but valid ggml blocks of each tensor's real type. GB/s is
//! weight bytes (repacked, ≈ GGUF size) per call divided by the call's time.
//! "forward" sums one Qwen2.5-0.5B step's matmuls (24 layers + lm_head) from
//! the per-shape times: ffn_down is half Q4_K, half Q6_K, attn_v half Q5_0,
//! half Q8_0 in the real file; the bench uses Q4_K and Q5_0 for those. The
//! per-shape loop re-runs one matrix, which then sits in the 32 MB L3: use
//! `--forward` for the honest number, which builds all 24 layers (≈ 390 MB,
//! real types per layer) and times whole passes from DRAM.
//! `--forward --model 1.5b` does the same for Qwen2.5-Coder-1.5B Q4_K_M (≈ 990 MB,
//! Q4_K/Q6_K); `--by-type` adds passes over one weight type's matrices only.
//! `--lm-head-argmax` alternates, call by call, the Qwen LM head (151936x896 Q8_0)
//! writing all logits and `matmul_argmax` (argmax per token only) for each `--ns`.

use std::time::Instant;

use npu_runtime::kernels::matmul::matmul_argmax_with_isa;
use npu_runtime::kernels::{matmul_with_isa, GgmlType, Isa, MatmulScratch, QMatrix, ThreadPool};

fn random_ggml(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let ts = ty.type_size();
    let mut v = vec![0u8; rows * cols / ty.block_size() * ts];
    for b in v.chunks_exact_mut(ts) {
        b.iter_mut().for_each(|x| *x = next() as u8);
        let d = half::f16::from_f32(0.01).to_le_bytes();
        let at = if ty == GgmlType::Q6K { 208 } else { 0 };
        b[at..at + 2].copy_from_slice(&d);
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K) {
            b[2..4].copy_from_slice(&d);
        }
    }
    v
}

struct Shape {
    name: &'static str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Occurrences in one Qwen2.5-0.5B forward pass.
    per_forward: usize,
}

/// CPU time of the calling thread in ns (Linux schedstat), if available.
/// With `--threads 1` it measures the kernel without time stolen by other
/// processes on a shared machine.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let threads: usize = arg("--threads").map_or(2, |s| s.parse().expect("--threads"));
    let min_ms: f64 = arg("--min-ms").map_or(300.0, |s| s.parse().expect("--min-ms"));
    let only = arg("--only");
    let use_cpu = !args.iter().any(|a| a == "--wall");
    let isa = match arg("--isa").as_deref() {
        Some("portable") => Isa::Portable,
        Some("avx2") => Isa::Avx2,
        Some("avxvnni") => Isa::AvxVnni,
        Some("avx512") => Isa::Avx512Vnni,
        None => Isa::available()[0],
        Some(o) => panic!("unknown isa {o}"),
    };
    assert!(isa.is_supported(), "{isa:?} not supported on this CPU");
    let ns: Vec<usize> = arg("--ns").map_or(vec![1, 2, 4, 8, 16, 32, 64], |s| {
        s.split(',').map(|v| v.parse().expect("--ns")).collect()
    });
    let shapes = [
        Shape {
            name: "attn_q/o 896x896 q5_0",
            ty: GgmlType::Q5_0,
            rows: 896,
            cols: 896,
            per_forward: 48,
        },
        Shape {
            name: "attn_k/v 128x896 q5_0",
            ty: GgmlType::Q5_0,
            rows: 128,
            cols: 896,
            per_forward: 48,
        },
        Shape {
            name: "ffn_up/gate 4864x896 q5_0",
            ty: GgmlType::Q5_0,
            rows: 4864,
            cols: 896,
            per_forward: 48,
        },
        Shape {
            name: "ffn_down 896x4864 q4_K",
            ty: GgmlType::Q4K,
            rows: 896,
            cols: 4864,
            per_forward: 12,
        },
        Shape {
            name: "ffn_down 896x4864 q6_K",
            ty: GgmlType::Q6K,
            rows: 896,
            cols: 4864,
            per_forward: 12,
        },
        Shape {
            name: "896x896 q8_0",
            ty: GgmlType::Q8_0,
            rows: 896,
            cols: 896,
            per_forward: 0,
        },
        Shape {
            name: "896x896 q4_0",
            ty: GgmlType::Q4_0,
            rows: 896,
            cols: 896,
            per_forward: 0,
        },
        Shape {
            name: "896x896 q4_1",
            ty: GgmlType::Q4_1,
            rows: 896,
            cols: 896,
            per_forward: 0,
        },
        Shape {
            name: "lm_head 151936x896 q8_0",
            ty: GgmlType::Q8_0,
            rows: 151936,
            cols: 896,
            per_forward: 1,
        },
    ];
    let pool = ThreadPool::new(threads);
    if args.iter().any(|a| a == "--forward") {
        let model = arg("--model").unwrap_or_else(|| "0.5b".into());
        let by_type = args.iter().any(|a| a == "--by-type");
        return forward(isa, &pool, &ns, min_ms, &model, by_type);
    }
    if args.iter().any(|a| a == "--lm-head-argmax") {
        return lm_head_argmax(isa, &pool, &ns, use_cpu && threads == 1);
    }
    let max_n = *ns.iter().max().unwrap();
    let mut scratch = MatmulScratch::new(max_n, 4864);
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut forward_ms = vec![0f64; ns.len()];
    // The int8 multiply-accumulate peak of as many threads: each row's share of it says
    // how close the kernel runs to the arithmetic floor (the batched rows' bound).
    let peak = npu_runtime::kernels::peak::int8_macs_per_sec(threads, 3);
    println!(
        "isa {isa:?}, threads {threads}, time = {}, int8 peak {}",
        if threads == 1 && use_cpu {
            "thread CPU time"
        } else {
            "wall clock"
        },
        peak.map_or("n/a".into(), |p| format!("{:.0} G MAC/s", p / 1e9))
    );
    println!(
        "{:<28} {:>4} {:>10} {:>9} {:>10} {:>7}",
        "shape", "N", "ms/call", "GB/s", "ms/token", "% peak"
    );
    for s in &shapes {
        if only.as_deref().is_some_and(|o| !s.name.contains(o)) {
            continue;
        }
        let w = QMatrix::from_ggml(
            s.ty,
            s.rows,
            s.cols,
            &random_ggml(s.ty, s.rows, s.cols, &mut seed),
        )
        .unwrap();
        let x: Vec<f32> = (0..max_n * s.cols)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 250.0)
            .collect();
        let mut out = vec![0f32; max_n * s.rows];
        for (ni, &n) in ns.iter().enumerate() {
            let (x, out) = (&x[..n * s.cols], &mut out[..n * s.rows]);
            matmul_with_isa(isa, &w, x, n, out, &mut scratch, &pool); // warm-up
            let start = Instant::now();
            let cpu0 = thread_cpu_ns();
            let mut reps = 0u32;
            while reps < 3 || start.elapsed().as_secs_f64() * 1e3 < min_ms {
                matmul_with_isa(isa, &w, x, n, out, &mut scratch, &pool);
                reps += 1;
            }
            let wall_ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
            let cpu_ms = match (cpu0, thread_cpu_ns()) {
                (Some(a), Some(b)) => (b - a) as f64 / 1e6 / reps as f64,
                _ => f64::NAN,
            };
            // Single-threaded, the caller's CPU time is the kernel's time.
            let ms = if threads == 1 && use_cpu {
                cpu_ms
            } else {
                wall_ms
            };
            let gbs = w.size_bytes() as f64 / (ms * 1e-3) / 1e9;
            let macs = (s.rows * s.cols * n) as f64;
            let share = peak.map_or(f64::NAN, |p| 100.0 * macs / (ms * 1e-3) / p);
            println!(
                "{:<28} {:>4} {:>10.4} {:>9.2} {:>10.4} {:>6.1}%",
                s.name,
                n,
                ms,
                gbs,
                ms / n as f64,
                share
            );
            forward_ms[ni] += ms * s.per_forward as f64;
        }
    }
    if only.is_none() {
        println!("\nQwen2.5-0.5B matmuls per forward pass (sum of the shapes above):");
        println!(
            "{:>4} {:>12} {:>12} {:>14}",
            "N", "ms/forward", "cost(N)/cost(1)", "tokens/s (N=1)"
        );
        for (ni, &n) in ns.iter().enumerate() {
            println!(
                "{:>4} {:>12.3} {:>12.2} {:>14.1}",
                n,
                forward_ms[ni],
                forward_ms[ni] / forward_ms[0],
                1e3 / forward_ms[0]
            );
        }
    }
}

/// Every matrix of one Qwen2.5-Coder-1.5B Q4_K_M forward pass (28 layers + the
/// LM head), random valid blocks, ≈ 990 MB. As in the GGUF, half of attn_v and
/// ffn_down are Q6_K (here every other layer), the LM head is Q6_K, the rest Q4_K.
fn qwen15_matrices(seed: &mut u64) -> Vec<QMatrix> {
    let mut mats = Vec::new();
    let (d, ff) = (1536, 8960);
    for layer in 0..28 {
        let k6 = if layer % 2 == 0 {
            GgmlType::Q6K
        } else {
            GgmlType::Q4K
        };
        for (ty, rows, cols) in [
            (GgmlType::Q4K, d, d),
            (GgmlType::Q4K, 256, d),
            (k6, 256, d),
            (GgmlType::Q4K, d, d),
            (GgmlType::Q4K, ff, d),
            (GgmlType::Q4K, ff, d),
            (k6, d, ff),
        ] {
            mats.push(
                QMatrix::from_ggml(ty, rows, cols, &random_ggml(ty, rows, cols, seed)).unwrap(),
            );
        }
    }
    let lm = GgmlType::Q6K;
    mats.push(QMatrix::from_ggml(lm, 151936, d, &random_ggml(lm, 151936, d, seed)).unwrap());
    mats
}

/// Every matrix of one Qwen2.5-0.5B forward pass (24 layers + the Q8_0 LM head).
fn qwen05_matrices(seed: &mut u64) -> Vec<QMatrix> {
    let mut mats = Vec::new();
    for layer in 0..24 {
        // Layer types as in qwen2.5-coder-0.5b's GGUF (Q4_K_M mix).
        let down = if layer % 2 == 0 {
            GgmlType::Q6K
        } else {
            GgmlType::Q4K
        };
        let v = if layer % 2 == 0 {
            GgmlType::Q8_0
        } else {
            GgmlType::Q5_0
        };
        for (ty, rows, cols) in [
            (GgmlType::Q5_0, 896, 896),
            (GgmlType::Q5_0, 128, 896),
            (v, 128, 896),
            (GgmlType::Q5_0, 896, 896),
            (GgmlType::Q5_0, 4864, 896),
            (GgmlType::Q5_0, 4864, 896),
            (down, 896, 4864),
        ] {
            mats.push(
                QMatrix::from_ggml(ty, rows, cols, &random_ggml(ty, rows, cols, seed)).unwrap(),
            );
        }
    }
    mats.push(
        QMatrix::from_ggml(
            GgmlType::Q8_0,
            151936,
            896,
            &random_ggml(GgmlType::Q8_0, 151936, 896, seed),
        )
        .unwrap(),
    );
    mats
}

/// Time every matmul of a Qwen2.5-0.5B (or, with `--model 1.5b`, Qwen2.5-Coder-1.5B)
/// forward pass over distinct matrices; `--by-type` also times passes over the
/// matrices of one type only (each type's achieved weight GB/s from DRAM).
fn forward(isa: Isa, pool: &ThreadPool, ns: &[usize], min_ms: f64, model: &str, by_type: bool) {
    let mut seed = 0xfeed_beef_1234_5678u64;
    let mats = if model == "1.5b" {
        qwen15_matrices(&mut seed)
    } else {
        qwen05_matrices(&mut seed)
    };
    let max_n = *ns.iter().max().unwrap();
    let max_cols = mats.iter().map(|m| m.cols()).max().unwrap();
    let mut scratch = MatmulScratch::new(max_n, max_cols);
    let x: Vec<f32> = (0..max_n * max_cols)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 250.0)
        .collect();
    let mut out = vec![0f32; max_n * 151936];
    let mut sets: Vec<(String, Vec<&QMatrix>)> = vec![("all".into(), mats.iter().collect())];
    if by_type {
        let mut types: Vec<GgmlType> = mats.iter().map(|m| m.ggml_type()).collect();
        types.sort_by_key(|t| format!("{t:?}"));
        types.dedup();
        for t in types {
            let of_t = mats.iter().filter(|m| m.ggml_type() == t).collect();
            sets.push((format!("{t:?}"), of_t));
        }
    }
    for (name, set) in &sets {
        forward_set(isa, pool, ns, min_ms, name, set, &x, &mut out, &mut scratch);
    }
}

/// Time passes over `mats` (one matmul each) per batch size.
#[allow(clippy::too_many_arguments)]
fn forward_set(
    isa: Isa,
    pool: &ThreadPool,
    ns: &[usize],
    min_ms: f64,
    name: &str,
    mats: &[&QMatrix],
    x: &[f32],
    out: &mut [f32],
    scratch: &mut MatmulScratch,
) {
    let bytes: usize = mats.iter().map(|m| m.size_bytes()).sum();
    println!(
        "{name}: forward pass matmuls, isa {isa:?}, threads {}, {} matrices, {:.0} MB of weights, time = {}",
        pool.n_threads(),
        mats.len(),
        bytes as f64 / 1e6,
        if pool.n_threads() == 1 {
            "thread CPU time"
        } else {
            "wall clock"
        }
    );
    println!(
        "{:>4} {:>12} {:>10} {:>16} {:>12}",
        "N", "ms/forward", "GB/s", "cost(N)/cost(1)", "tokens/s"
    );
    let mut base = 0.0;
    for &n in ns {
        let pass = |scratch: &mut MatmulScratch, out: &mut [f32]| {
            for m in mats {
                let (x, out) = (&x[..n * m.cols()], &mut out[..n * m.rows()]);
                matmul_with_isa(isa, m, x, n, out, scratch, pool);
            }
        };
        pass(scratch, out);
        let start = Instant::now();
        let cpu0 = thread_cpu_ns();
        let mut reps = 0u32;
        while reps < 3 || start.elapsed().as_secs_f64() * 1e3 < min_ms {
            pass(scratch, out);
            reps += 1;
        }
        let wall = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
        let cpu = match (cpu0, thread_cpu_ns()) {
            (Some(a), Some(b)) if pool.n_threads() == 1 => (b - a) as f64 / 1e6 / reps as f64,
            _ => wall,
        };
        let ms = cpu;
        if n == ns[0] {
            base = ms;
        }
        println!(
            "{:>4} {:>12.3} {:>10.2} {:>16.2} {:>12.1}",
            n,
            ms,
            bytes as f64 / (ms * 1e-3) / 1e9,
            ms / base,
            n as f64 * 1e3 / ms
        );
    }
}

/// Full LM-head logits vs the argmax-only LM head, alternating blocks of 5 calls (15
/// pairs per N after a warm-up pair); min and median ms per call of each.
fn lm_head_argmax(isa: Isa, pool: &ThreadPool, ns: &[usize], use_cpu: bool) {
    let (rows, cols) = (151_936, 896);
    let mut seed = 0x5eed_u64;
    let w = QMatrix::from_ggml(
        GgmlType::Q8_0,
        rows,
        cols,
        &random_ggml(GgmlType::Q8_0, rows, cols, &mut seed),
    )
    .unwrap();
    let max_n = *ns.iter().max().unwrap();
    let mut scratch = MatmulScratch::new(max_n, cols);
    let x: Vec<f32> = (0..max_n * cols)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let mut logits = vec![0f32; max_n * rows];
    let mut ids = vec![0u32; max_n];
    let now = || {
        if use_cpu {
            thread_cpu_ns().unwrap_or(0) as f64 / 1e6
        } else {
            Instant::now()
                .duration_since(START.with(|s| *s))
                .as_secs_f64()
                * 1e3
        }
    };
    println!(
        "lm_head 151936x896 q8_0, isa {isa:?}, {} ms",
        if use_cpu { "thread CPU" } else { "wall" }
    );
    for &n in ns {
        let (xs, ls, is) = (&x[..n * cols], &mut logits[..n * rows], &mut ids[..n]);
        let (mut full, mut arg) = (Vec::new(), Vec::new());
        // Blocks of 5 calls: the thread CPU clock here advances in coarse ticks.
        const CALLS: usize = 5;
        for rep in 0..16 {
            let t0 = now();
            for _ in 0..CALLS {
                matmul_with_isa(isa, &w, xs, n, ls, &mut scratch, pool);
            }
            let t1 = now();
            for _ in 0..CALLS {
                matmul_argmax_with_isa(isa, &w, xs, n, is, &mut scratch, pool);
            }
            let t2 = now();
            if rep > 0 {
                full.push((t1 - t0) / CALLS as f64);
                arg.push((t2 - t1) / CALLS as f64);
            }
        }
        full.sort_by(f64::total_cmp);
        arg.sort_by(f64::total_cmp);
        let m = full.len() / 2;
        println!(
            "N={n:3}  logits min {:7.2} med {:7.2}   argmax min {:7.2} med {:7.2}   med ratio {:.3}",
            full[0], full[m], arg[0], arg[m], arg[m] / full[m]
        );
    }
}

thread_local! {
    static START: Instant = Instant::now();
}
