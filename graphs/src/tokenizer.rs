//! Byte-level BPE tokenizer built in memory from the GGUF vocabulary, matching
//! llama.cpp's tokenization (checked token for token by tests/tokenizer_golden.rs).
//!
//! Encoding uses the HF `tokenizers` crate (BPE model + llama.cpp's
//! pre-tokenizer regexes); decoding maps each token to its raw bytes directly.

mod byte_level;
mod pretokenize;
mod stream;

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::gguf::GgufFile;

pub use stream::StreamDecoder;

/// `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// Texts of tokens that end a generation turn when present in the vocabulary
/// (llama.cpp adds the same ones to its end-of-generation set).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
];

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("missing or malformed metadata '{0}'")]
    Missing(&'static str),
    #[error("tokenizer model '{0}' is not supported (only byte-level BPE, 'gpt2')")]
    UnsupportedModel(String),
    #[error("pre-tokenizer '{0}' is not supported (known: gpt2/default, llama-bpe/llama3, qwen2, smollm/starcoder)")]
    UnsupportedPre(String),
    #[error("malformed merge #{index}: '{merge}' (expected two space-separated tokens)")]
    BadMerge { index: usize, merge: String },
    #[error("{what} token id {id} is outside the vocabulary of {n}")]
    BadSpecialId {
        what: &'static str,
        id: u32,
        n: usize,
    },
    #[error("token id {id} is outside the vocabulary of {n}")]
    BadId { id: u32, n: usize },
    #[error("tokenizer: {0}")]
    Hf(String),
}

fn hf(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Hf(e.to_string())
}

pub struct Tokenizer {
    /// The BPE pipeline. Its one mode flag ("encode special tokens": treat control
    /// tokens' text as ordinary text, as llama.cpp does with parse_special=false; user-defined
    /// tokens are split out either way) is set per call under the lock; a second copy for
    /// the other mode cost ~30 ms of every model load and ~20 MB.
    encoder: Mutex<tokenizers::Tokenizer>,
    /// Raw bytes of each token.
    pieces: FlatPieces,
    /// Vocabulary strings, concatenated; `text_ends[i]` ends token i's.
    texts: String,
    text_ends: Vec<usize>,
    types: Vec<i32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    eog: HashSet<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl Tokenizer {
    pub fn from_gguf(f: &GgufFile) -> Result<Self, TokenizerError> {
        let model = f
            .get_str("tokenizer.ggml.model")
            .ok_or(TokenizerError::Missing("tokenizer.ggml.model"))?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.into()));
        }
        let pre = f.get_str("tokenizer.ggml.pre").unwrap_or("default");
        let (regexes, ignore_merges) = pretokenize::regexes_for(pre)
            .ok_or_else(|| TokenizerError::UnsupportedPre(pre.into()))?;
        let tokens = f
            .get_str_array("tokenizer.ggml.tokens")
            .ok_or(TokenizerError::Missing("tokenizer.ggml.tokens"))?;
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(TokenizerError::Missing("tokenizer.ggml.tokens"));
        }
        let types = match f.get_i32_array("tokenizer.ggml.token_type") {
            Some(t) if t.len() == n => t,
            Some(_) => return Err(TokenizerError::Missing("tokenizer.ggml.token_type")),
            None => vec![token_type::NORMAL; n],
        };
        let merges_raw = f
            .get_str_array("tokenizer.ggml.merges")
            .ok_or(TokenizerError::Missing("tokenizer.ggml.merges"))?;

        // on duplicates the first id wins, as in llama.cpp's token_to_id map
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .rev()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let mut merges = Vec::with_capacity(merges_raw.len());
        for (index, m) in merges_raw.iter().enumerate() {
            let (a, b) = split_merge(m).ok_or_else(|| TokenizerError::BadMerge {
                index,
                merge: m.to_string(),
            })?;
            merges.push((a.to_string(), b.to_string()));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .build()
            .map_err(|e| {
                // Name the first merge of a token outside the vocabulary (looked up only
                // here: on a good file the builder's own lookups are the only ones).
                let known: HashSet<&str> = tokens.iter().map(|t| &**t).collect();
                merges_raw
                    .iter()
                    .enumerate()
                    .find(|(_, m)| {
                        split_merge(m)
                            .is_some_and(|(a, b)| !known.contains(a) || !known.contains(b))
                    })
                    .map_or_else(
                        || hf(e),
                        |(index, m)| TokenizerError::BadMerge {
                            index,
                            merge: m.to_string(),
                        },
                    )
            })?;

        let mut pre_tokenizers = Vec::new();
        for r in regexes {
            let split = Split::new(
                SplitPattern::Regex(r.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(hf)?;
            pre_tokenizers.push(PreTokenizerWrapper::Split(split));
        }
        pre_tokenizers.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        )));

        let mut encoder = tokenizers::Tokenizer::new(bpe);
        encoder.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(
            pre_tokenizers,
        ))));
        let mut control = Vec::new();
        let mut user = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            match types[i] {
                token_type::CONTROL => control.push(AddedToken::from(t.to_string(), true)),
                // user-defined tokens are matched even without special parsing
                token_type::USER_DEFINED => {
                    user.push(AddedToken::from(t.to_string(), false).normalized(false))
                }
                _ => {}
            }
        }
        encoder.add_special_tokens(&control);
        encoder.add_tokens(&user);

        let inv = byte_level::char_to_byte();
        let mut pieces = FlatPieces::with_capacity(n, tokens.iter().map(|t| t.len()).sum());
        let mut texts = String::with_capacity(pieces.bytes.capacity());
        let mut text_ends = Vec::with_capacity(n);
        for (t, &ty) in tokens.iter().zip(&types) {
            match ty {
                token_type::NORMAL | token_type::BYTE | token_type::UNUSED => {
                    pieces.push_with(|out| byte_level::decode_token_into(t, &inv, out))
                }
                _ => pieces.push_with(|out| out.extend_from_slice(t.as_bytes())),
            }
            texts.push_str(t);
            text_ends.push(texts.len());
        }

        let special_id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
            match f.get_u32(key) {
                None => Ok(None),
                Some(id) if (id as usize) < n => Ok(Some(id)),
                Some(id) => Err(TokenizerError::BadSpecialId { what: key, id, n }),
            }
        };
        let bos = special_id("tokenizer.ggml.bos_token_id")?;
        let eos = special_id("tokenizer.ggml.eos_token_id")?;
        let mut eog: HashSet<u32> = HashSet::new();
        eog.extend(eos);
        eog.extend(special_id("tokenizer.ggml.eot_token_id")?);
        eog.extend(special_id("tokenizer.ggml.eom_token_id")?);
        for (i, t) in tokens.iter().enumerate() {
            if EOG_TEXTS.contains(t) && types[i] != token_type::NORMAL {
                eog.insert(i as u32);
            }
        }
        let add_bos = f
            .get_bool("tokenizer.ggml.add_bos_token")
            .unwrap_or(matches!(pre, "llama3" | "llama-v3" | "llama-bpe"));

        Ok(Tokenizer {
            encoder: Mutex::new(encoder),
            pieces,
            texts,
            text_ends,
            types,
            bos,
            eos,
            add_bos,
            eog,
        })
    }

    /// Token ids of `text` (no BOS is added: see `add_bos`). With
    /// `parse_special = false`, text such as "<|im_end|>" is tokenized as plain
    /// characters and can never produce a control token.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        // A panic inside `tokenizers` cannot leave the flag half-set: it is set on every call.
        let mut t = self.encoder.lock().unwrap_or_else(PoisonError::into_inner);
        t.set_encode_special_tokens(!parse_special);
        Ok(t.encode_fast(text, false).map_err(hf)?.get_ids().to_vec())
    }

    /// Text of `ids`, control tokens included as their text; byte sequences
    /// that are not valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            let p = self.pieces.get(id).ok_or(TokenizerError::BadId {
                id,
                n: self.vocab_size(),
            })?;
            bytes.extend_from_slice(p);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Like `decode`, but control tokens (e.g. a final `<|im_end|>`) are left
    /// out, for showing generated text.
    pub fn decode_skip_special(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| self.token_type(id) != Some(token_type::CONTROL))
            .collect();
        self.decode(&kept)
    }

    /// Raw bytes of one token (a multi-byte char may span several tokens);
    /// empty for an id outside the vocabulary.
    pub fn token_to_piece_bytes(&self, id: u32) -> Vec<u8> {
        self.piece(id).to_vec()
    }

    /// Borrowed form of `token_to_piece_bytes` (no allocation).
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id).unwrap_or(&[])
    }

    pub fn vocab_size(&self) -> usize {
        self.text_ends.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether a prompt should start with BOS (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// True for tokens that end a generation: EOS, EOT, `<|im_end|>`,
    /// `<|endoftext|>`, `<|eot_id|>`, ...
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// The id of the token whose vocabulary string is `piece` (byte-level
    /// form for normal tokens, e.g. "Ġthe").
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.encoder
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .token_to_id(piece)
    }

    /// The vocabulary string of a token.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        let i = id as usize;
        let end = *self.text_ends.get(i)?;
        let start = if i == 0 { 0 } else { self.text_ends[i - 1] };
        self.texts.get(start..end)
    }

    /// `tokenizer.ggml.token_type` of a token.
    pub fn token_type(&self, id: u32) -> Option<i32> {
        self.types.get(id as usize).copied()
    }

    /// Control or user-defined token (never produced from plain text except
    /// user-defined ones, as in llama.cpp).
    pub fn is_special(&self, id: u32) -> bool {
        matches!(
            self.token_type(id),
            Some(token_type::CONTROL | token_type::USER_DEFINED)
        )
    }
}

/// The two tokens of a GGUF merge: like llama.cpp, the separator is the first space after
/// position 0.
fn split_merge(m: &str) -> Option<(&str, &str)> {
    let (at, _) = m.char_indices().skip(1).find(|&(_, c)| c == ' ')?;
    Some((&m[..at], &m[at + 1..]))
}

/// Byte strings of every token in one buffer (one allocation instead of one per token).
struct FlatPieces {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl FlatPieces {
    fn with_capacity(n: usize, bytes: usize) -> Self {
        FlatPieces {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends the next token's bytes, written by `fill`.
    fn push_with(&mut self, fill: impl FnOnce(&mut Vec<u8>)) {
        fill(&mut self.bytes);
        self.ends.push(self.bytes.len());
    }

    fn get(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.bytes[start..end])
    }
}
