//! Request shapes of OpenAI's API, as far as this server reads them. Unknown fields are
//! ignored (clients send many optional ones); fields that would change the answer in a way
//! this engine cannot honour are rejected by the handlers with a 400 naming the field.

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u64>,
    /// The newer name of `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<i64>,
    pub n: Option<u64>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub response_format: Option<Value>,
    /// Extension: `false` answers without retrieval (same as the `:no-retrieval` model).
    pub retrieval: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// A message's content: a string, or an array of parts of which only text is supported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    pub model: String,
    pub input: EmbeddingInput,
    /// `float` (default) or `base64` (little-endian f32s; what the Python client asks for).
    #[serde(default)]
    pub encoding_format: Option<String>,
    pub dimensions: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    One(String),
    Many(Vec<String>),
    /// Token ids: rejected (they would be another tokenizer's).
    Tokens(Value),
}

#[derive(Debug, Deserialize)]
pub struct SearchRequest {
    pub query: String,
    pub top_k: Option<u64>,
    /// `hybrid` (default), `bm25` or `dense`.
    pub mode: Option<String>,
}
