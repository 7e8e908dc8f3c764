//! The thread pool's fork-join cost: `parallel_for` regions of a given task count whose
//! tasks spin for a fixed share of a given per-thread work time; prints the time per
//! region and its excess over the work (hand-off, task taking, join).
//!
//! cargo run --release -p npu-runtime --example pool_bench -- [--threads 2] [--regions 20000]

use npu_runtime::kernels::pool::ThreadPool;
use std::time::Instant;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .map(|i| args[i + 1].clone())
        .unwrap_or_else(|| default.to_string())
}

fn main() {
    let threads: usize = arg("--threads", "2").parse().expect("--threads");
    let regions: usize = arg("--regions", "20000").parse().expect("--regions");
    let pool = ThreadPool::new(threads);
    println!("threads {threads}, {regions} regions per row");
    println!("tasks  work/thread ns  ns/region  excess ns");
    for tasks in [2usize, 4, 8, 16] {
        for work_ns in [0u64, 2000, 10000] {
            // Each task spins for its share of the per-thread work.
            let per_task = work_ns * threads as u64 / tasks as u64;
            let f = |_: usize| {
                let t = Instant::now();
                while (t.elapsed().as_nanos() as u64) < per_task {
                    std::hint::spin_loop();
                }
            };
            for _ in 0..regions / 20 {
                pool.parallel_for(tasks, &f);
            }
            let t = Instant::now();
            for _ in 0..regions {
                pool.parallel_for(tasks, &f);
            }
            let per = t.elapsed().as_nanos() as f64 / regions as f64;
            println!(
                "{tasks:5}  {work_ns:14}  {per:9.0}  {:9.0}",
                per - work_ns as f64
            );
        }
    }
}
