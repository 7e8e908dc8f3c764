//! The flags `rag ask`, `rag chat` and `rag serve` share: the index, the model and how it
//! runs, and what each question retrieves. Every default is the library's
//! (`rag::assistant`), so the commands behave as `Assistant` does when told nothing; the
//! index, model, top-k, threads and spec mode may also come from the environment or the
//! config file (`rag_cli::config`).

use anyhow::Result;
use npu_runtime::session::KvPrecision;
use npu_runtime::weights_cache::WeightsCache;
use rag::assistant::{AskOptions, AssistantOptions, Sampling, DEFAULT_CONTEXT_TOKENS};
use rag::SearchMode;
use rag_cli::backend_args::BackendArgs;
use rag_cli::config::Config;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct AssistantArgs {
    /// Where the index lives [default: $RAG_INDEX_DIR, the config file's index_dir, or
    /// .rag-index].
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
    /// Model name (fetched on first use) or path to a GGUF file [default: the config
    /// file's model, or the library's default].
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// Passages retrieved for each question (the prompt's numbered sources) [default: the
    /// config file's top_k, or 5].
    #[arg(long, short = 'k')]
    pub top_k: Option<usize>,
    /// hybrid (BM25 + dense, fused), bm25 or dense.
    #[arg(long, default_value_t = AskOptions::default().mode,
          value_parser = rag_cli::search_mode_parser())]
    pub mode: SearchMode,
    /// BM25 only: do not load the embedding model (`rag serve`: no /v1/embeddings).
    #[arg(long)]
    pub no_dense: bool,
    /// Token budget for the numbered sources in the prompt.
    #[arg(long, default_value_t = DEFAULT_CONTEXT_TOKENS)]
    pub context_tokens: usize,
    /// Speculative decoding: none, pld, sam or sdnpu (the answer is the same; speed
    /// differs) [default: the config file's spec, or sdnpu].
    #[arg(long, value_parser = ["none", "pld", "sam", "sdnpu"])]
    pub spec: Option<String>,
    /// Compute threads, 0 = all cores [default: the config file's threads, or 0].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Repack the model's weights on every load instead of keeping them in
    /// `$RAG_MODEL_DIR/repacked` (saves about one model size of disk).
    #[arg(long)]
    pub no_weights_cache: bool,
    /// KV cache precision: f32 (exact) or f16 (half the cache memory and attention
    /// bytes per token; llama.cpp's default).
    #[arg(long, default_value = KvPrecision::default().name(), value_parser = ["f32", "f16"])]
    pub kv_cache: String,
    /// Load the LM head without the screen that lets greedy steps read a third fewer of
    /// a large Q8_0 head's bytes (saves 0.75x the head's size of memory; same answers).
    #[arg(long)]
    pub plain_lm_head: bool,
    /// Sampling temperature in [0, 2]; 0 = greedy (the default). Speculation stays
    /// lossless when sampling: the answer equals plain sampled decoding with the seed.
    #[arg(long, default_value_t = 0.0, value_parser = parse_temperature)]
    pub temperature: f32,
    /// Nucleus sampling: draw only from the most likely tokens whose probabilities add
    /// up to this, in (0, 1].
    #[arg(long, default_value_t = 1.0, value_parser = parse_top_p)]
    pub top_p: f32,
    /// Seed of the sampler, for a reproducible sampled answer [default: a fresh one
    /// per answer].
    #[arg(long)]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub backend: BackendArgs,
}

fn parse_temperature(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(t) if (0.0..=2.0).contains(&t) => Ok(t),
        _ => Err(format!("`{s}` is not a temperature in [0, 2]")),
    }
}

fn parse_top_p(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(format!("`{s}` is not a top-p in (0, 1]")),
    }
}

/// The settings a flag, the environment or the config file may give, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    pub index_dir: PathBuf,
    pub model: String,
    pub top_k: usize,
    pub threads: usize,
    pub spec: specdec::Mode,
}

impl AssistantArgs {
    /// The flags, else the environment, else `config`, else the built-in defaults.
    pub fn settings(&self, config: &Config) -> Result<Settings> {
        Ok(Settings {
            index_dir: config.index_dir(self.index_dir.clone()),
            model: config.model(self.model.clone()),
            top_k: config.top_k(self.top_k),
            threads: config.threads(self.threads),
            spec: config.spec(self.spec.as_deref())?,
        })
    }

    /// Whether dense retrieval is on: not with `--no-dense` or `--mode bm25`.
    pub fn dense(&self) -> bool {
        !self.no_dense && self.mode != SearchMode::Bm25
    }

    /// The assistant these flags and settings describe, dense retrieval as `dense` says.
    /// The model starts loading at once (a command asks right away).
    pub fn options(&self, s: &Settings, dense: bool) -> Result<AssistantOptions> {
        let mut opts = AssistantOptions::new(&s.index_dir);
        opts.model = s.model.clone();
        opts.dense = dense;
        opts.threads = s.threads;
        opts.spec = s.spec;
        opts.kv_precision = rag_cli::kv_precision(&self.kv_cache)?;
        opts.plain_lm_head = self.plain_lm_head;
        opts.backend = self.backend.choice()?;
        opts.npu_memory_mb = self.backend.npu_memory_mb;
        if let Some(kv) = self.backend.kv_capacity() {
            opts.kv_capacity = kv;
        }
        if self.no_weights_cache {
            opts.weights_cache = WeightsCache::Off;
        }
        opts.preload_model = true;
        Ok(opts)
    }

    /// Fails with the missing-model exit code unless the model (and, with dense retrieval,
    /// the embedding model) is present or fetched now.
    pub fn require_models(&self, s: &Settings, dense: bool) -> Result<()> {
        rag_cli::exit::require_model(&s.model)?;
        if dense {
            rag_cli::exit::require_model(&rag::embed::choose_embedder(&s.index_dir, None)?)?;
        }
        Ok(())
    }

    /// Retrieval per question: BM25 when dense retrieval is off.
    pub fn ask_options(&self, s: &Settings, dense: bool, max_tokens: usize) -> AskOptions {
        AskOptions {
            top_k: s.top_k,
            mode: if dense { self.mode } else { SearchMode::Bm25 },
            context_tokens: self.context_tokens,
            max_tokens,
            // The parsers keep both in range, which is all the constructor checks.
            sampling: Sampling::new(
                self.temperature,
                self.top_p,
                self.seed.unwrap_or_else(Sampling::fresh_seed),
            )
            .unwrap_or(Sampling::GREEDY),
            ..AskOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: AssistantArgs,
    }

    #[test]
    fn defaults_are_the_librarys() {
        let a = Wrap::parse_from(["rag"]).args;
        let s = a.settings(&Config::default()).unwrap();
        let lib = AskOptions::default();
        let asked = a.ask_options(&s, a.dense(), lib.max_tokens);
        assert_eq!(
            (asked.top_k, asked.mode, asked.context_tokens),
            (lib.top_k, lib.mode, lib.context_tokens)
        );
        let opts = a.options(&s, a.dense()).unwrap();
        let lib = AssistantOptions::new(rag_cli::config::DEFAULT_INDEX_DIR);
        assert_eq!(opts.index_dir, lib.index_dir);
        assert_eq!(opts.model, lib.model);
        assert_eq!(opts.spec, lib.spec);
        assert_eq!(opts.kv_precision, lib.kv_precision);
        assert_eq!(opts.threads, lib.threads);
        assert_eq!(opts.kv_capacity, lib.kv_capacity);
        assert_eq!(opts.plain_lm_head, lib.plain_lm_head);
        assert!(opts.dense && lib.dense);
    }

    #[test]
    fn bm25_mode_or_no_dense_turns_dense_retrieval_off() {
        let c = Config::default();
        let a = Wrap::parse_from(["rag", "--mode", "bm25"]).args;
        let s = a.settings(&c).unwrap();
        assert!(!a.dense());
        assert_eq!(a.ask_options(&s, a.dense(), 1).mode, SearchMode::Bm25);
        let a = Wrap::parse_from(["rag", "--no-dense"]).args;
        assert!(!a.dense());
        assert_eq!(a.ask_options(&s, a.dense(), 1).mode, SearchMode::Bm25);
        let a = Wrap::parse_from(["rag", "--mode", "dense", "-k", "3"]).args;
        let s = a.settings(&c).unwrap();
        assert!(a.dense());
        assert_eq!(a.ask_options(&s, true, 1).top_k, 3);
    }

    /// A flag beats the config file, which beats the built-in default.
    #[test]
    fn flags_beat_the_config_file() {
        let c = Config::parse(
            "model = \"a.gguf\"\ntop_k = 2\nthreads = 3\nspec = \"pld\"\nindex_dir = \"/cfg\"\n",
            std::path::Path::new("c.toml"),
        )
        .unwrap();
        let a = Wrap::parse_from(["rag"]).args;
        let s = a.settings(&c).unwrap();
        assert_eq!(
            (s.model.as_str(), s.top_k, s.threads, s.spec),
            ("a.gguf", 2, 3, specdec::Mode::Pld)
        );
        let a = Wrap::parse_from([
            "rag",
            "-m",
            "b.gguf",
            "-k",
            "4",
            "--threads",
            "1",
            "--spec",
            "none",
            "--index-dir",
            "/flag",
        ])
        .args;
        let s = a.settings(&c).unwrap();
        assert_eq!(
            (s.model.as_str(), s.top_k, s.threads, s.spec),
            ("b.gguf", 4, 1, specdec::Mode::None)
        );
        assert_eq!(s.index_dir, PathBuf::from("/flag"));
        assert!(Wrap::try_parse_from(["rag", "--spec", "warp"]).is_err());
    }

    #[test]
    fn search_modes_are_listed_choices() {
        use clap::CommandFactory;
        let e = Wrap::try_parse_from(["rag", "--mode", "fuzzy"])
            .err()
            .unwrap();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        assert_eq!(e.exit_code(), 2);
        let help = Wrap::command().render_long_help().to_string();
        assert!(help.contains("hybrid") && help.contains("bm25") && help.contains("dense"));
        assert!(
            help.contains("[possible values: hybrid, bm25, dense]"),
            "{help}"
        );
    }

    #[test]
    fn sampling_flags_are_checked_and_reach_the_options() {
        let c = Config::default();
        let a = Wrap::parse_from(["rag"]).args;
        let s = a.settings(&c).unwrap();
        assert!(a.ask_options(&s, true, 1).sampling.is_greedy());
        let a = Wrap::parse_from([
            "rag",
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--seed",
            "5",
        ])
        .args;
        let got = a.ask_options(&s, true, 1).sampling;
        assert_eq!(got, Sampling::new(0.7, 0.9, 5).unwrap());
        for bad in [
            ["--temperature", "-1"],
            ["--temperature", "2.5"],
            ["--temperature", "nan"],
            ["--top-p", "0"],
            ["--top-p", "1.1"],
            ["--seed", "-3"],
        ] {
            assert!(
                Wrap::try_parse_from(["rag", bad[0], bad[1]]).is_err(),
                "{bad:?}"
            );
        }
    }
}
