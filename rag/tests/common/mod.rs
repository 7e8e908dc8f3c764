//! Test-only helpers. `HashEmbedder` is a deterministic stand-in for the real model (hashed
//! character trigrams): it exercises the dense plumbing, it is not the product's retrieval.

use rag::Embedder;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct HashEmbedder {
    pub dim: usize,
    pub calls: AtomicUsize,
    pub texts: AtomicUsize,
}

impl Default for HashEmbedder {
    fn default() -> Self {
        Self::new()
    }
}

impl HashEmbedder {
    pub fn new() -> Self {
        HashEmbedder {
            dim: 128,
            calls: AtomicUsize::new(0),
            texts: AtomicUsize::new(0),
        }
    }
}

impl Embedder for HashEmbedder {
    fn dim(&self) -> usize {
        self.dim
    }
    fn model_id(&self) -> &str {
        "test-hash-trigram-v1"
    }
    fn embed_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.texts.fetch_add(texts.len(), Ordering::SeqCst);
        Ok(texts
            .iter()
            .map(|t| {
                let mut v = vec![0f32; self.dim];
                let chars: Vec<char> = t.to_lowercase().chars().collect();
                for w in chars.windows(3) {
                    let mut h: u64 = 1469598103934665603;
                    for c in w {
                        h = (h ^ *c as u64).wrapping_mul(1099511628211);
                    }
                    v[(h % self.dim as u64) as usize] += 1.0;
                }
                let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                v.iter_mut().for_each(|x| *x /= n);
                v
            })
            .collect())
    }
}

/// A small corpus with known facts.
pub fn write_corpus(dir: &Path) {
    std::fs::create_dir_all(dir.join("guide")).unwrap();
    std::fs::write(
        dir.join("guide/setup.md"),
        "# Setup\n\nInstall the otter daemon first.\n\n## Ports\n\nThe otter daemon listens on port 7311 by default.\n\n## Logs\n\nLogs are written to /var/log/otter.log and rotated weekly.\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("notes.txt"),
        "Beavers build dams from branches and mud.\nThey are most active at night.\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("page.html"),
        "<html><body><h1>Kayak rental</h1><p>Kayaks cost 12 euros per hour.</p><h2>Opening hours</h2><p>The boathouse opens at 9am.</p></body></html>",
    )
    .unwrap();
    std::fs::write(
        dir.join("main.rs"),
        "fn frobnicate(x: u32) -> u32 {\n    x * 42\n}\n",
    )
    .unwrap();
    std::fs::write(dir.join("image.png"), [0x89u8, b'P', b'N', b'G', 0, 0, 0]).unwrap();
    std::fs::write(dir.join("blob.dat2"), [1u8, 0, 2, 0, 3, 0, 4]).unwrap();
}

/// A PDF with one line of text per page.
pub fn write_pdf(path: &Path, pages: &[&str]) {
    corpus_tools::test_support::write_pdf(path, pages).unwrap();
}
