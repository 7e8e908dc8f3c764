//! A loaded model: weights repacked for the kernels (or mapped from the repacked-weights
//! cache), tokenizer, chat template and the compute thread pool, shared by sessions.

use crate::error::{Result, RuntimeError};
use crate::kernels::screen::{ArgmaxScreen, MIN_SCREENED_WEIGHTS};
use crate::kernels::ThreadPool;
use crate::weights::{ModelWeights, SCREEN_COARSE};
use crate::weights_cache::{self, CacheOutcome, Lookup, WeightsCache};
use graphs::chat::ChatTemplate;
use graphs::config::ModelConfig;
use graphs::gguf::GgufFile;
use graphs::quant::GgmlType;
use graphs::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Compute threads (caller included); 0 = all available cores.
    pub threads: usize,
    /// Map repacked weights from a cache file instead of repacking (`weights_cache`);
    /// off by default, on in the CLI and `rag::Assistant`.
    pub weights_cache: WeightsCache,
    /// Keep only the LM head itself: no screen for argmax-only calls
    /// (`kernels::screen`), which a large Q8_0 head gets by default: it holds 0.75x the
    /// head's size more and makes greedy decoding and small verify batches read ~35%
    /// fewer of the head's bytes.
    pub plain_lm_head: bool,
}

impl LoadOptions {
    /// `threads` compute threads, everything else default.
    pub fn with_threads(threads: usize) -> Self {
        LoadOptions {
            threads,
            ..Default::default()
        }
    }
}

/// A loaded model, shareable between sessions.
pub struct Model {
    path: PathBuf,
    config: ModelConfig,
    weights: ModelWeights,
    pool: ThreadPool,
    tokenizer: Tokenizer,
    chat: ChatTemplate,
    eog: Vec<u32>,
    cache: Mutex<CacheOutcome>,
    cache_writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes `model`'s repacked matrices to its cache file in `dir` on a thread of its own
/// (which keeps the model alive until done); `Model::wait_weights_cache` joins it.
/// `damage`: what was wrong with the damaged cache file it replaces, if any.
fn write_cache_in_background(
    model: &Arc<Model>,
    dir: PathBuf,
    key: std::io::Result<weights_cache::CacheKey>,
    damage: Option<String>,
) {
    let m = model.clone();
    let write = move || {
        let stored =
            key.and_then(|k| weights_cache::store(&dir, &m.path, k, &m.weights.named_matrices()));
        *lock(&m.cache) = match stored {
            Ok(path) => CacheOutcome::Written { path, damage },
            Err(e) => {
                tracing::warn!("repacked-weights cache in {}: {e}", dir.display());
                CacheOutcome::NotWritten(e.to_string())
            }
        };
    };
    match std::thread::Builder::new()
        .name("rag-weights-cache".into())
        .spawn(write)
    {
        Ok(handle) => *lock(&model.cache_writer) = Some(handle),
        Err(e) => *lock(&model.cache) = CacheOutcome::NotWritten(e.to_string()),
    }
}

impl Model {
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Arc<Model>> {
        let f = GgufFile::open(path)
            .map_err(|e| RuntimeError::Model(format!("{}: {e}", path.display())))?;
        let config = ModelConfig::from_gguf(&f)
            .map_err(|e| RuntimeError::Model(format!("{}: {e}", path.display())))?;
        let threads = if opts.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            opts.threads
        };
        let pool = ThreadPool::new(threads);
        // The model file's cache key, read once (it samples every tensor's bytes).
        let cache_dir = match &opts.weights_cache {
            WeightsCache::Dir(dir) => Some((dir, weights_cache::key(path, &f))),
            WeightsCache::Off => None,
        };
        // Checked (data checksum included) before any matrix is built on it.
        let lookup = match &cache_dir {
            Some((dir, Ok(key))) => weights_cache::open(dir, path, *key, &pool),
            _ => Lookup::Miss,
        };
        let (cached, damage) = match lookup {
            Lookup::Hit(c) => (Some(c), None),
            Lookup::Miss => (None, None),
            Lookup::Damaged(what) => (None, Some(what.to_string())),
        };
        let (mut weights, mut all_cached) =
            ModelWeights::load(&f, &config, &pool, cached.as_ref())?;
        let head = weights.lm_head();
        if !opts.plain_lm_head && head.rows() * head.cols() >= MIN_SCREENED_WEIGHTS {
            let (rows, cols) = (head.rows(), head.cols());
            let coarse = cached
                .as_ref()
                .and_then(|c| c.matrix(SCREEN_COARSE, GgmlType::Q5_0, rows, cols));
            weights.lm_screen = match coarse {
                Some(m) => ArgmaxScreen::with_coarse(head, m, &pool),
                None => {
                    let s = ArgmaxScreen::build(head, &pool);
                    // A cache without the coarse copy (written by a plain-head load or
                    // an older build) is rewritten with it.
                    all_cached &= s.is_none();
                    s
                }
            };
        }
        // After a repack, the cache is written by a background thread once the model is
        // built (a first run does not wait for a ~1 GB write and sync before answering).
        let (cache, pending) = match cache_dir {
            None => (CacheOutcome::Off, None),
            Some((dir, _)) if all_cached => (
                CacheOutcome::Hit(weights_cache::cache_path(dir, path)),
                None,
            ),
            Some((dir, key)) => (
                CacheOutcome::Writing {
                    path: weights_cache::cache_path(dir, path),
                    damage: damage.clone(),
                },
                Some((dir.clone(), key, damage)),
            ),
        };
        let tokenizer = Tokenizer::from_gguf(&f)
            .map_err(|e| RuntimeError::Model(format!("{}: tokenizer: {e}", path.display())))?;
        let chat = ChatTemplate::from_gguf(&f);
        let mut eog: Vec<u32> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
            .iter()
            .filter_map(|k| f.get_u32(k))
            .filter(|&t| (t as usize) < config.vocab_size)
            .collect();
        eog.sort_unstable();
        eog.dedup();
        let model = Arc::new(Model {
            path: path.to_path_buf(),
            config,
            weights,
            pool,
            tokenizer,
            chat,
            eog,
            cache: Mutex::new(cache),
            cache_writer: Mutex::new(None),
        });
        if let Some((dir, key, damage)) = pending {
            write_cache_in_background(&model, dir, key, damage);
        }
        Ok(model)
    }

    /// What loading did with the repacked-weights cache (`Writing` while the background
    /// write after a repack is still running).
    pub fn weights_cache(&self) -> CacheOutcome {
        lock(&self.cache).clone()
    }

    /// Waits for the background cache write, if any, and returns the outcome. A short-lived
    /// process calls this before exiting so the next run finds the cache.
    pub fn wait_weights_cache(&self) -> CacheOutcome {
        if let Some(h) = lock(&self.cache_writer).take() {
            let _ = h.join();
        }
        self.weights_cache()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn weights(&self) -> &ModelWeights {
        &self.weights
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat
    }

    /// True for tokens that end a generation (EOS / end-of-turn).
    pub fn is_eog(&self, token: u32) -> bool {
        self.tokenizer.is_end_of_generation(token) || self.eog.contains(&token)
    }

    pub fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
}
