//! The subset of a Hugging Face `config.json` that determines a BERT encoder's graph.

use super::BertError;
use serde::Deserialize;

/// Hyper-parameters of a BERT encoder.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_pos")]
    pub position_embedding_type: String,
}

fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}
fn default_pos() -> String {
    "absolute".into()
}

impl BertConfig {
    /// Parses and validates `config.json` text.
    pub fn from_json(text: &str) -> Result<Self, BertError> {
        let cfg: BertConfig = serde_json::from_str(text)
            .map_err(|e| BertError::Config(format!("not a BERT config.json: {e}")))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    pub(crate) fn validate(&self) -> Result<(), BertError> {
        let bad = |m: String| Err(BertError::Config(m));
        if self.hidden_act != "gelu" {
            return bad(format!(
                "hidden_act {:?} unsupported (only exact \"gelu\")",
                self.hidden_act
            ));
        }
        if self.position_embedding_type != "absolute" {
            return bad(format!(
                "position_embedding_type {:?} unsupported (only \"absolute\")",
                self.position_embedding_type
            ));
        }
        let dims = [
            self.vocab_size,
            self.hidden_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.intermediate_size,
            self.max_position_embeddings,
            self.type_vocab_size,
        ];
        if dims.contains(&0) {
            return bad("a dimension is zero".into());
        }
        // Generous caps: they only reject corrupt configs before they size huge buffers.
        if self.hidden_size > 16384
            || self.intermediate_size > 65536
            || self.num_hidden_layers > 256
        {
            return bad("dimensions implausibly large".into());
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(format!(
                "hidden_size {} not divisible by num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !(self.layer_norm_eps > 0.0 && self.layer_norm_eps < 1.0) {
            return bad(format!(
                "layer_norm_eps {} out of range",
                self.layer_norm_eps
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINILM: &str = r#"{"architectures":["BertModel"],"hidden_act":"gelu","hidden_size":384,
        "intermediate_size":1536,"layer_norm_eps":1e-12,"max_position_embeddings":512,
        "model_type":"bert","num_attention_heads":12,"num_hidden_layers":6,"type_vocab_size":2,
        "vocab_size":30522}"#;

    #[test]
    fn parses_minilm() {
        let c = BertConfig::from_json(MINILM).unwrap();
        assert_eq!(
            (c.hidden_size, c.head_dim(), c.num_hidden_layers),
            (384, 32, 6)
        );
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(BertConfig::from_json("{").is_err());
        let act = MINILM.replace("\"gelu\"", "\"relu\"");
        assert!(BertConfig::from_json(&act).is_err());
        let heads = MINILM.replace("\"num_attention_heads\":12", "\"num_attention_heads\":7");
        assert!(BertConfig::from_json(&heads).is_err());
        let zero = MINILM.replace("\"hidden_size\":384", "\"hidden_size\":0");
        assert!(BertConfig::from_json(&zero).is_err());
    }
}
