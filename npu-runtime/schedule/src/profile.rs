//! Warm-up profile: what the scheduler knows about a model on a backend and machine.
//!
//! Times are in milliseconds (as measured or derived), memory in bytes. A profile is
//! validated on load: bad files give an error, never a panic.

use super::error::{Result, ScheduleError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Format tag written into every profile file.
pub const PROFILE_FORMAT: &str = "rag-prefill-profile/1";

/// The paper-derived phone profile (Qwen2.5-1.5B on a Snapdragon NPU), see
/// `npu-runtime/profiles/README.md` for the derivation.
pub const PAPER_PHONE_PROFILE_JSON: &str =
    include_str!("../../profiles/qwen2.5-1.5b-snapdragon-paper.json");

/// Costs of one block of consecutive layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockProfile {
    /// Human-readable layer range, e.g. "0-3".
    pub layers: String,
    /// Compute time of one full prefill chunk on the prefill-shaped graph (one G1 run).
    pub g1_chunk_ms: f64,
    /// Compute time of one full prefill chunk on the decode-shaped graph
    /// (`chunk_tokens / g2_tokens` G2 runs).
    pub g2_chunk_ms: f64,
    /// Time to load the G2 form (the switch's I/O).
    pub load_g2_ms: f64,
    /// Time to tear down the G1 form.
    #[serde(default)]
    pub unload_g1_ms: f64,
    /// Resident bytes of the G1 form.
    pub mem_g1_bytes: u64,
    /// Resident bytes of the G2 form.
    pub mem_g2_bytes: u64,
}

/// A per-model, per-backend, per-machine warm-up profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub format: String,
    pub model: String,
    pub backend: String,
    pub machine: String,
    /// Where the numbers come from ("measured by warm-up on ..." or "derived from ...").
    pub source: String,
    /// Tokens per prefill chunk (the G1 shape).
    pub chunk_tokens: usize,
    /// Tokens per G2 run (the decode/verify shape).
    pub g2_tokens: usize,
    /// One decode step on G2 for the whole model (the first decoded token's cost).
    pub decode_step_ms: f64,
    /// False when one form serves both shapes (e.g. a CPU layout that is best at both):
    /// then no switch exists and every schedule is the ideal one.
    #[serde(default = "default_true")]
    pub switch_needed: bool,
    pub blocks: Vec<BlockProfile>,
}

fn default_true() -> bool {
    true
}

/// Upper bounds that keep a corrupt profile from turning into absurd allocations.
const MAX_BLOCKS: usize = 4096;
const MAX_TOKENS: usize = 1 << 20;
const MAX_MS: f64 = 1.0e7;

impl Profile {
    /// The paper-derived phone profile shipped with the crate.
    pub fn paper_phone() -> Profile {
        Profile::from_json(PAPER_PHONE_PROFILE_JSON)
            .expect("the embedded paper profile is valid (checked by tests)")
    }

    pub fn n_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Number of prefill chunks for a prompt (last one possibly partial).
    pub fn n_chunks(&self, prompt_tokens: usize) -> usize {
        prompt_tokens.div_ceil(self.chunk_tokens)
    }

    pub fn from_json(text: &str) -> Result<Profile> {
        let p: Profile = serde_json::from_str(text)
            .map_err(|e| ScheduleError::Profile(format!("not a profile JSON: {e}")))?;
        p.validate()?;
        Ok(p)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("profile serializes")
    }

    pub fn load(path: &Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path).map_err(|source| ScheduleError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Profile::from_json(&text).map_err(|e| match e {
            ScheduleError::Profile(m) => ScheduleError::Profile(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Writes atomically (temp file + rename) so a crash never leaves half a profile.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.validate()?;
        let io = |source| ScheduleError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, self.to_json()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    pub fn validate(&self) -> Result<()> {
        let err = |m: String| Err(ScheduleError::Profile(m));
        if self.format != PROFILE_FORMAT {
            return err(format!(
                "format is {:?}, expected {PROFILE_FORMAT:?}",
                self.format
            ));
        }
        if self.blocks.is_empty() || self.blocks.len() > MAX_BLOCKS {
            return err(format!(
                "{} blocks (must be 1..={MAX_BLOCKS})",
                self.blocks.len()
            ));
        }
        if self.chunk_tokens == 0 || self.chunk_tokens > MAX_TOKENS {
            return err(format!("chunk_tokens {} out of range", self.chunk_tokens));
        }
        if self.g2_tokens == 0 || self.g2_tokens > self.chunk_tokens {
            return err(format!(
                "g2_tokens {} must be in 1..=chunk_tokens ({})",
                self.g2_tokens, self.chunk_tokens
            ));
        }
        if !self.chunk_tokens.is_multiple_of(self.g2_tokens) {
            return err(format!(
                "chunk_tokens {} is not a multiple of g2_tokens {} (graph equivalence needs whole sub-chunks)",
                self.chunk_tokens, self.g2_tokens
            ));
        }
        check_ms("decode_step_ms", self.decode_step_ms)?;
        for (i, b) in self.blocks.iter().enumerate() {
            for (name, v) in [
                ("g1_chunk_ms", b.g1_chunk_ms),
                ("g2_chunk_ms", b.g2_chunk_ms),
                ("load_g2_ms", b.load_g2_ms),
                ("unload_g1_ms", b.unload_g1_ms),
            ] {
                check_ms(&format!("block {i} {name}"), v)?;
            }
        }
        Ok(())
    }
}

fn check_ms(name: &str, v: f64) -> Result<()> {
    if !v.is_finite() || !(0.0..=MAX_MS).contains(&v) {
        return Err(ScheduleError::Profile(format!(
            "{name} = {v} is not a time in 0..={MAX_MS} ms"
        )));
    }
    Ok(())
}

/// Directory of cached profiles: `$RAG_PROFILE_DIR`, else `$RAG_MODEL_DIR/profiles`,
/// else `~/.cache/rag/profiles`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RAG_PROFILE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("RAG_MODEL_DIR") {
        return PathBuf::from(d).join("profiles");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("rag").join("profiles")
}

/// Cache file for one model + backend + machine (+ shape) combination.
pub fn cache_path(
    dir: &Path,
    model: &str,
    backend: &str,
    machine: &str,
    chunk_tokens: usize,
) -> PathBuf {
    let name = format!(
        "{}--{}--{}--c{chunk_tokens}.json",
        sanitize(model),
        sanitize(backend),
        sanitize(machine)
    );
    dir.join(name)
}

fn sanitize(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    if t.is_empty() {
        "_".into()
    } else {
        t
    }
}
