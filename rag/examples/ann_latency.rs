//! Dense search paths at 1k/10k/100k vectors (dim 384): exact scan vs HNSW graph walk per
//! query, the graph's recall@10 against the scan, and the build cost of the deterministic
//! serial insert vs hnsw_rs's parallel insert. `ann::EXACT_SEARCH_BELOW` was chosen from it.
//!
//! ```text
//! cargo run --release -p rag --example ann_latency -- [sizes=1000,10000] [queries=200] [parallel=1]
//! ```
//!
//! Vectors are synthetic (100 clusters plus noise, L2-normalized), so the timings are the
//! search cost alone, without embedding the query (`rag-bench retrieval --scale` measures
//! the whole path on real text).

use hnsw_rs::prelude::Hnsw;
use rag::ann::{CosineDistance, HnswIndex, VectorIndex};
use std::time::Instant;

const DIM: usize = 384;

fn vectors(n: usize, seed: u64) -> Vec<(i64, Vec<f32>)> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 20_001) as f32 / 10_000.0 - 1.0
    };
    let centres: Vec<Vec<f32>> = (0..100)
        .map(|_| (0..DIM).map(|_| next()).collect())
        .collect();
    (0..n)
        .map(|i| {
            let c = &centres[i % centres.len()];
            let mut v: Vec<f32> = c.iter().map(|x| 0.6 * x + 0.4 * next()).collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter_mut().for_each(|x| *x /= norm);
            (i as i64 + 1, v)
        })
        .collect()
}

/// User + system CPU seconds of this process so far (/proc/self/stat, 100 ticks/s).
fn cpu_seconds() -> f64 {
    ticks("/proc/self/stat")
}

/// CPU seconds of the calling thread (a loaded machine inflates wall time, not this).
fn thread_cpu_seconds() -> f64 {
    ticks("/proc/thread-self/stat")
}

fn ticks(file: &str) -> f64 {
    let stat = std::fs::read_to_string(file).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = args
        .first()
        .map_or("1000,10000", |s| s.as_str())
        .split(',')
        .map(|s| s.parse().expect("sizes: comma-separated counts"))
        .collect();
    let queries: usize = args.get(1).map_or(200, |s| s.parse().expect("queries"));
    let parallel = args.get(2).is_none_or(|s| s != "0");
    println!("| vectors | build serial s (cpu s) | build parallel s (cpu s) | exact p50/p99 ms | graph p50/p99 ms | exact / graph cpu ms per query | graph recall@10 |");
    println!("|---|---|---|---|---|---|---|");
    for &n in &sizes {
        let data = vectors(n, 42 + n as u64);
        let qs: Vec<Vec<f32>> = vectors(queries, 7).into_iter().map(|x| x.1).collect();

        let (t, c) = (Instant::now(), cpu_seconds());
        let mut index = HnswIndex::new(DIM, n);
        for batch in data.chunks(4096) {
            index.insert(batch); // as the indexer does
        }
        let serial = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
        index.set_exact_search_below(0);

        let par = parallel.then(|| {
            let (t, c) = (Instant::now(), cpu_seconds());
            let h: Hnsw<f32, CosineDistance> = Hnsw::new(16, n.max(1024), 16, 200, CosineDistance);
            for batch in data.chunks(4096) {
                let items: Vec<(&[f32], usize)> = batch
                    .iter()
                    .map(|(id, v)| (v.as_slice(), *id as usize))
                    .collect();
                h.parallel_insert_slice(&items);
            }
            (t.elapsed().as_secs_f64(), cpu_seconds() - c)
        });

        // Interleaved per query so load spikes hit both paths alike.
        let (mut exact_ms, mut graph_ms, mut hits) = (Vec::new(), Vec::new(), 0usize);
        for q in &qs {
            let t = Instant::now();
            let exact = index.search_exact(q, 10);
            exact_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let graph = index.search_graph(q, 10);
            graph_ms.push(t.elapsed().as_secs_f64() * 1e3);
            hits += graph
                .iter()
                .filter(|g| exact.iter().any(|e| e.0 == g.0))
                .count();
        }
        // CPU per query: blocks of >= ~2M scanned vectors per path, alternating, 3 rounds
        // (the tick clock is 10 ms).
        let reps = (2_000_000 / (n * qs.len())).max(1);
        let (mut exact_cpu, mut graph_cpu) = (0.0, 0.0);
        for _ in 0..3 {
            let c = thread_cpu_seconds();
            for _ in 0..reps {
                for q in &qs {
                    std::hint::black_box(index.search_exact(q, 10));
                }
            }
            exact_cpu += thread_cpu_seconds() - c;
            let c = thread_cpu_seconds();
            for _ in 0..reps {
                for q in &qs {
                    std::hint::black_box(index.search_graph(q, 10));
                }
            }
            graph_cpu += thread_cpu_seconds() - c;
        }
        let per_query = |cpu: f64| cpu * 1e3 / (3 * reps * qs.len()) as f64;
        exact_ms.sort_by(f64::total_cmp);
        graph_ms.sort_by(f64::total_cmp);
        assert_eq!(index.ids().len(), n);
        println!(
            "| {n} | {:.2} ({:.2}) | {} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} |",
            serial.0,
            serial.1,
            par.map_or("-".into(), |p| format!("{:.2} ({:.2})", p.0, p.1)),
            percentile(&exact_ms, 0.5),
            percentile(&exact_ms, 0.99),
            percentile(&graph_ms, 0.5),
            percentile(&graph_ms, 0.99),
            per_query(exact_cpu),
            per_query(graph_cpu),
            hits as f64 / (10 * qs.len()) as f64
        );
    }
}
