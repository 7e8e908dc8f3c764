//! Times attention alone: one verify step's attention over every layer of a model-shaped
//! KV cache (random rows), for several batch sizes, causal mask.
//!
//! cargo run -p npu-runtime --release --example attn_bench -- \
//!     [--model 0.5b|1.5b|smollm2] [--depth 1000] [--threads 2] [--ns 1,8,16] [--rounds 20]
//!     [--flush MB] [--kv f32|f16]
//!
//! Reports the minimum and median wall time of a step (all layers) and the f32 FMA rate
//! (QK plus PV: `2 * N * n_head * keys * head_dim` per layer) against the pool's f32 FMA
//! peak estimated from the int8 VNNI probe (AVX-512 VNNI: 64 MACs per `vpdpbusd`, 16 FMAs
//! per `vfmadd`, same issue rate). `--isa` picks the kernels as `RAG_ISA` does.

use std::sync::atomic::AtomicU32;
use std::time::Instant;

use npu_runtime::attention::{attention, AttnDims, AttnScratch, BatchMask};
use npu_runtime::kernels::ThreadPool;
use npu_runtime::kv_cache::{KvCache, KvPrecision};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: &str| {
        args.iter()
            .position(|a| a == name)
            .map_or(default.to_string(), |i| args[i + 1].clone())
    };
    let (n_layer, n_head, n_head_kv, hd) = match arg("--model", "0.5b").as_str() {
        "1.5b" => (28, 12, 2, 128),
        "smollm2" => (30, 9, 3, 64),
        _ => (24, 14, 2, 64),
    };
    let depth: usize = arg("--depth", "1000").parse().expect("--depth");
    let threads: usize = arg("--threads", "2").parse().expect("--threads");
    let rounds: usize = arg("--rounds", "20").parse().expect("--rounds");
    // Read this many MB between layers, untimed: in a real forward the layer's weights
    // pass through the caches between two attention calls, so K and V come from DRAM.
    let flush_mb: usize = arg("--flush", "0").parse().expect("--flush");
    let flush: Vec<u64> = vec![1; flush_mb << 17];
    let ns: Vec<usize> = arg("--ns", "1,8,16")
        .split(',')
        .map(|s| s.parse().expect("--ns"))
        .collect();
    let max_n = *ns.iter().max().unwrap_or(&1);
    let cap = depth + max_n;
    let kv_dim = n_head_kv * hd;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let precision = KvPrecision::parse(&arg("--kv", "f32")).expect("--kv: f32 or f16");
    let mut kv = KvCache::with_precision(n_layer, n_head_kv, hd, cap, precision);
    let (mut k, mut v) = (vec![0f32; kv_dim], vec![0f32; kv_dim]);
    for layer in 0..n_layer {
        for slot in 0..cap {
            k.iter_mut().for_each(|x| *x = 2.0 * rnd());
            v.iter_mut().for_each(|x| *x = rnd());
            kv.write(layer, slot, &k, &v);
        }
    }
    let q: Vec<f32> = (0..max_n * n_head * hd).map(|_| 2.0 * rnd()).collect();
    let out: Vec<AtomicU32> = (0..max_n * n_head * hd)
        .map(|_| AtomicU32::new(0))
        .collect();
    let pool = ThreadPool::new(threads);
    let scratch = AttnScratch::new(threads, cap, hd, n_head / n_head_kv);
    let run = |n: usize, f: &(dyn Fn(usize) + Sync)| pool.parallel_for(n, f);
    let dims = AttnDims {
        n_head,
        n_head_kv,
        head_dim: hd,
    };
    let isa = npu_runtime::kernels::detected();
    let peak_fma = npu_runtime::kernels::peak::int8_macs_per_sec(threads, 3).map(|m| m / 4.0);
    println!(
        "isa {isa:?}, threads {threads}, {n_layer} layers x {n_head}/{n_head_kv} heads x {hd}, depth {depth}"
    );
    if let Some(p) = peak_fma {
        println!("f32 FMA peak estimate {:.0} G/s", p / 1e9);
    }
    println!("N   min ms   med ms   G FMA/s   share of peak");
    let mut mask = BatchMask::new(max_n);
    for &n in &ns {
        mask.set_causal(n).expect("batch size");
        let mut times = Vec::with_capacity(rounds);
        for _ in 0..rounds + 2 {
            let mut elapsed = 0.0;
            for layer in 0..n_layer {
                if !flush.is_empty() {
                    let sum: u64 = pool_sum(&pool, &flush);
                    std::hint::black_box(sum);
                }
                let t0 = Instant::now();
                attention(
                    &q[..n * n_head * hd],
                    kv.layer_view(layer),
                    depth,
                    &mask,
                    dims,
                    &scratch,
                    &out,
                    &run,
                );
                elapsed += t0.elapsed().as_secs_f64();
            }
            times.push(elapsed);
        }
        times.drain(..2);
        times.sort_by(f64::total_cmp);
        let (min, med) = (times[0], times[times.len() / 2]);
        let keys = (depth + n) as f64;
        let fma = 2.0 * (n * n_head * n_layer * hd) as f64 * keys;
        let rate = fma / min;
        let share = peak_fma.map_or(String::from("-"), |p| format!("{:.0}%", 100.0 * rate / p));
        println!(
            "{n:<3} {:>7.3}  {:>7.3}  {:>8.1}   {share}",
            min * 1e3,
            med * 1e3,
            rate / 1e9
        );
    }
}

/// Sum of `buf`, read by every pool thread in contiguous shares (so every core's caches
/// are flushed, as a layer's matmuls would).
fn pool_sum(pool: &ThreadPool, buf: &[u64]) -> u64 {
    let n = pool.n_threads();
    let sums: Vec<std::sync::atomic::AtomicU64> = (0..n)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    pool.parallel_for(n, &|t| {
        let part = &buf[buf.len() * t / n..buf.len() * (t + 1) / n];
        let s = part.iter().fold(0u64, |a, &x| a.wrapping_add(x));
        sums[t].store(s, std::sync::atomic::Ordering::Relaxed);
    });
    sums.iter()
        .map(|s| s.load(std::sync::atomic::Ordering::Relaxed))
        .sum()
}
