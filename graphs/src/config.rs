//! Model hyper-parameters read from GGUF metadata, validated against the tensor
//! directory so that a model that loads is a model the runtime can run.

use crate::gguf::{GgufFile, TensorInfo};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
}

impl Arch {
    /// The `general.architecture` string (also the metadata key prefix).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// llama: rotate adjacent pairs (2i, 2i+1).
    Normal,
    /// qwen2 (GPT-NeoX): rotate (i, i + head_dim/2).
    Neox,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub vocab_size: usize,
    pub ctx_len: usize,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub rms_eps: f32,
    pub has_qkv_bias: bool,
    /// No `output.weight`: the LM head reuses `token_embd.weight`.
    pub tied_embeddings: bool,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("missing metadata key 'general.architecture'")]
    NoArchitecture,
    #[error("unsupported architecture '{0}' (supported: llama, qwen2)")]
    UnsupportedArch(String),
    #[error("missing or non-integer metadata key '{0}'")]
    MissingKey(String),
    #[error("bad value for '{key}': {why}")]
    BadValue { key: String, why: String },
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    #[error("tensor '{name}' has shape {got:?}, expected {expected:?}")]
    BadShape {
        name: String,
        got: Vec<u64>,
        expected: Vec<u64>,
    },
}

/// Names of the per-layer tensors, relative to `blk.N.`.
pub mod names {
    pub const TOKEN_EMBD: &str = "token_embd.weight";
    pub const OUTPUT_NORM: &str = "output_norm.weight";
    pub const OUTPUT: &str = "output.weight";
    pub const ATTN_NORM: &str = "attn_norm.weight";
    pub const ATTN_Q: &str = "attn_q.weight";
    pub const ATTN_K: &str = "attn_k.weight";
    pub const ATTN_V: &str = "attn_v.weight";
    pub const ATTN_Q_BIAS: &str = "attn_q.bias";
    pub const ATTN_K_BIAS: &str = "attn_k.bias";
    pub const ATTN_V_BIAS: &str = "attn_v.bias";
    pub const ATTN_OUTPUT: &str = "attn_output.weight";
    pub const FFN_NORM: &str = "ffn_norm.weight";
    pub const FFN_GATE: &str = "ffn_gate.weight";
    pub const FFN_UP: &str = "ffn_up.weight";
    pub const FFN_DOWN: &str = "ffn_down.weight";
}

/// `blk.{layer}.{name}`.
pub fn layer_tensor_name(layer: usize, name: &str) -> String {
    format!("blk.{layer}.{name}")
}

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<Self, ConfigError> {
        let arch_name = f
            .get_str("general.architecture")
            .ok_or(ConfigError::NoArchitecture)?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => return Err(ConfigError::UnsupportedArch(other.into())),
        };
        let a = arch.name();
        let req = |k: &str| -> Result<usize, ConfigError> {
            let key = format!("{a}.{k}");
            let v = f
                .get_u64(&key)
                .ok_or_else(|| ConfigError::MissingKey(key.clone()))?;
            usize::try_from(v).map_err(|_| ConfigError::BadValue {
                key,
                why: format!("{v} does not fit in usize"),
            })
        };
        let positive = |k: &str, v: usize| -> Result<usize, ConfigError> {
            if v == 0 {
                Err(ConfigError::BadValue {
                    key: format!("{a}.{k}"),
                    why: "must be > 0".into(),
                })
            } else {
                Ok(v)
            }
        };
        let n_layer = positive("block_count", req("block_count")?)?;
        let n_embd = positive("embedding_length", req("embedding_length")?)?;
        let n_head = positive("attention.head_count", req("attention.head_count")?)?;
        let n_head_kv = match f.get_u64(&format!("{a}.attention.head_count_kv")) {
            Some(v) => positive("attention.head_count_kv", v as usize)?,
            None => n_head,
        };
        let n_ff = positive("feed_forward_length", req("feed_forward_length")?)?;
        let ctx_len = positive("context_length", req("context_length")?)?;
        if n_head % n_head_kv != 0 {
            return Err(ConfigError::BadValue {
                key: format!("{a}.attention.head_count_kv"),
                why: format!("{n_head_kv} does not divide head_count {n_head}"),
            });
        }
        let head_dim = match f.get_u64(&format!("{a}.attention.key_length")) {
            Some(v) => v as usize,
            None => {
                if n_embd % n_head != 0 {
                    return Err(ConfigError::BadValue {
                        key: format!("{a}.embedding_length"),
                        why: format!("{n_embd} is not a multiple of head_count {n_head}"),
                    });
                }
                n_embd / n_head
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(ConfigError::BadValue {
                key: format!("{a}.attention.key_length"),
                why: format!("head dimension {head_dim} must be even and > 0"),
            });
        }
        if let Some(v) = f.get_u64(&format!("{a}.attention.value_length")) {
            if v as usize != head_dim {
                return Err(ConfigError::BadValue {
                    key: format!("{a}.attention.value_length"),
                    why: format!("{v} differs from the key length {head_dim} (unsupported)"),
                });
            }
        }
        if let Some(v) = f.get_u64(&format!("{a}.rope.dimension_count")) {
            if v as usize != head_dim {
                return Err(ConfigError::BadValue {
                    key: format!("{a}.rope.dimension_count"),
                    why: format!("partial rotary ({v} of {head_dim} dims) is unsupported"),
                });
            }
        }
        // Rope scaling changes the frequencies of every position: refuse rather
        // than silently compute something else.
        let scaling_key = format!("{a}.rope.scaling.type");
        if let Some(kind) = f.get_str(&scaling_key) {
            if kind != "none" {
                return Err(ConfigError::BadValue {
                    key: scaling_key,
                    why: format!("rope scaling '{kind}' is unsupported"),
                });
            }
        }
        if f.tensor("rope_freqs.weight").is_some() {
            return Err(ConfigError::BadValue {
                key: "rope_freqs.weight".into(),
                why: "per-frequency rope factors (llama3 rope scaling) are unsupported".into(),
            });
        }
        let rope_theta = f
            .get_f32(&format!("{a}.rope.freq_base"))
            .unwrap_or(10_000.0);
        let rms_eps_key = format!("{a}.attention.layer_norm_rms_epsilon");
        let rms_eps = f
            .get_f32(&rms_eps_key)
            .ok_or(ConfigError::MissingKey(rms_eps_key))?;
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(ConfigError::BadValue {
                key: format!("{a}.rope.freq_base"),
                why: format!("{rope_theta} is not a positive number"),
            });
        }
        if !(rms_eps.is_finite() && rms_eps > 0.0) {
            return Err(ConfigError::BadValue {
                key: format!("{a}.attention.layer_norm_rms_epsilon"),
                why: format!("{rms_eps} is not a positive number"),
            });
        }

        let embd = tensor(f, names::TOKEN_EMBD)?;
        let vocab_size = match f.get_u64(&format!("{a}.vocab_size")) {
            Some(v) => v as usize,
            None => match f.get("tokenizer.ggml.tokens") {
                Some(t) => t.as_array().map_or(0, |a| a.len()),
                None => embd.dims.get(1).copied().unwrap_or(0) as usize,
            },
        };
        if vocab_size == 0 {
            return Err(ConfigError::BadValue {
                key: format!("{a}.vocab_size"),
                why: "vocabulary size is 0 or unknown".into(),
            });
        }

        let has_qkv_bias = match arch {
            Arch::Qwen2 => true,
            Arch::Llama => f
                .tensor(&layer_tensor_name(0, names::ATTN_Q_BIAS))
                .is_some(),
        };
        let tied_embeddings = f.tensor(names::OUTPUT).is_none();
        let cfg = ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            vocab_size,
            ctx_len,
            rope_theta,
            rope_style: match arch {
                Arch::Llama => RopeStyle::Normal,
                Arch::Qwen2 => RopeStyle::Neox,
            },
            rms_eps,
            has_qkv_bias,
            tied_embeddings,
        };
        cfg.check_tensors(f)?;
        Ok(cfg)
    }

    /// Every tensor the forward pass needs, with its expected ggml-order shape.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<u64>)> {
        let e = self.n_embd as u64;
        let q = (self.n_head * self.head_dim) as u64;
        let kv = (self.n_head_kv * self.head_dim) as u64;
        let ff = self.n_ff as u64;
        let v = self.vocab_size as u64;
        let mut out = vec![
            (names::TOKEN_EMBD.to_string(), vec![e, v]),
            (names::OUTPUT_NORM.to_string(), vec![e]),
        ];
        if !self.tied_embeddings {
            out.push((names::OUTPUT.to_string(), vec![e, v]));
        }
        for l in 0..self.n_layer {
            let mut per = vec![
                (names::ATTN_NORM, vec![e]),
                (names::ATTN_Q, vec![e, q]),
                (names::ATTN_K, vec![e, kv]),
                (names::ATTN_V, vec![e, kv]),
                (names::ATTN_OUTPUT, vec![q, e]),
                (names::FFN_NORM, vec![e]),
                (names::FFN_GATE, vec![e, ff]),
                (names::FFN_UP, vec![e, ff]),
                (names::FFN_DOWN, vec![ff, e]),
            ];
            if self.has_qkv_bias {
                per.push((names::ATTN_Q_BIAS, vec![q]));
                per.push((names::ATTN_K_BIAS, vec![kv]));
                per.push((names::ATTN_V_BIAS, vec![kv]));
            }
            out.extend(per.into_iter().map(|(n, s)| (layer_tensor_name(l, n), s)));
        }
        out
    }

    fn check_tensors(&self, f: &GgufFile) -> Result<(), ConfigError> {
        for (name, shape) in self.expected_tensors() {
            let t = tensor(f, &name)?;
            // A 1-D tensor may be stored as [n, 1]; compare without trailing 1s.
            let trim = |d: &[u64]| {
                let mut v = d.to_vec();
                while v.len() > 1 && v.last() == Some(&1) {
                    v.pop();
                }
                v
            };
            if trim(&t.dims) != shape {
                return Err(ConfigError::BadShape {
                    name,
                    got: t.dims.clone(),
                    expected: shape,
                });
            }
        }
        Ok(())
    }
}

/// Tensor types are already restricted to supported ones by the GGUF parser
/// (an unknown type fails at open with the tensor's name).
fn tensor<'a>(f: &'a GgufFile, name: &str) -> Result<&'a TensorInfo, ConfigError> {
    f.tensor(name)
        .ok_or_else(|| ConfigError::MissingTensor(name.to_string()))
}
