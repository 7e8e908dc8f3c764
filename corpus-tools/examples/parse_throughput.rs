//! Parse throughput under the two isolation modes, interleaved in one process: worker
//! processes ([`corpus_tools::worker`], this binary opts in) vs one thread per file
//! (`RAG_PARSE_ISOLATION=thread`). Walks, reads and parses every file (no chunking, no
//! store), so the isolation overhead is not hidden behind indexing.
//!
//!     cargo run --release -p corpus-tools --example parse_throughput -- DIR... [--rounds 3]

use corpus_tools::walk::{walk, WalkOptions};
use corpus_tools::{parse_isolated, ParseLimits};
use std::path::PathBuf;
use std::time::Instant;

fn main() {
    corpus_tools::worker::init_or_serve();
    let mut roots = Vec::new();
    let mut rounds = 3;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|n| n.parse().ok()).unwrap_or(3),
            _ => roots.push(PathBuf::from(a)),
        }
    }
    assert!(
        !roots.is_empty(),
        "usage: parse_throughput DIR... [--rounds N]"
    );
    let (files, _) = walk(&roots, &WalkOptions::default());
    let limits = ParseLimits::default();
    // Read once: the comparison is about parsing, not the page cache.
    let contents: Vec<_> = files
        .iter()
        .filter_map(|f| {
            let b = corpus_tools::load::read_file(f, limits.max_file_bytes).ok()?;
            Some((f.clone(), b))
        })
        .collect();
    let mb = contents.iter().map(|(_, b)| b.len()).sum::<usize>() as f64 / 1e6;
    println!("{} files ({mb:.1} MB)", contents.len());
    for round in 1..=rounds {
        for mode in ["process", "thread"] {
            if mode == "thread" {
                std::env::set_var(corpus_tools::worker::ISOLATION_ENV, "thread");
            } else {
                std::env::remove_var(corpus_tools::worker::ISOLATION_ENV);
            }
            let t = Instant::now();
            let mut ok = 0;
            for (f, b) in &contents {
                ok += parse_isolated(f, b.clone(), &limits).is_ok() as usize;
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "round {round} {mode:7}: {s:.3} s, {:.0} files/s, {:.1} MB/s, {ok} parsed",
                contents.len() as f64 / s,
                mb / s
            );
        }
    }
}
