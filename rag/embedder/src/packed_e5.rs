//! Reader for the packed multilingual-e5-small file (`e5-small-q4.bin`, format `E5S1`
//! version 1): the BERT encoder's weights in Q4_0 and the XLM-R SentencePiece vocabulary in
//! one file. Every count, offset and size is checked against the header and the file's length
//! before it is used, so a truncated or corrupt file is an error, never a panic.
//!
//! Layout, little-endian:
//! - header: magic `E5S1`, u32 version, i32 hidden, layers, heads, intermediate, vocabulary,
//!   positions, token types, f32 layer-norm epsilon, i32 quantisation block (32);
//! - vocabulary: i32 pieces, i32 ids of `<s>`, `</s>`, `<pad>`, `<unk>`; u64 text bytes;
//!   u32 offsets (pieces + 1) into the text; f32 scores (pieces); the UTF-8 piece text;
//! - normalisation map: i32 entries, u32 bytes, then per entry u32 character, u8 count and
//!   that many u32 replacement characters;
//! - tensor directory: i32 entries, then per entry u16 name length, the name, u8 type
//!   (0 f32, 1 Q4_0), u32 elements, u64 offset from the file start, u64 bytes;
//! - tensors: `emb.word` (Q4_0), `emb.pos`, `emb.type`, `emb.ln.{w,b}`, and per layer `N`
//!   `lN.{q,k,v,ao,fi,fo}.{w,b}` (weights Q4_0) and `lN.{aln,oln}.{w,b}`.

use super::linear::Linear;
use super::q4;
use super::unigram::{SpecialIds, UnigramTokenizer};
use super::weights::{BertWeights, LayerWeights, WordTable};
use super::{BertConfig, BertError, WeightFormat};
use npu_runtime::kernels::ThreadPool;
use std::collections::HashMap;
use std::sync::Mutex;

const MAGIC: &[u8; 4] = b"E5S1";
const VERSION: u32 = 1;
const F32: u8 = 0;
const Q4_0: u8 = 1;

/// A parsed packed file: the encoder's config, its tokenizer and the tensors (borrowed).
pub(crate) struct PackedE5<'a> {
    pub config: BertConfig,
    pub tokenizer: UnigramTokenizer,
    tensors: HashMap<String, Tensor<'a>>,
}

struct Tensor<'a> {
    dtype: u8,
    elements: usize,
    data: &'a [u8],
}

fn corrupt(m: impl std::fmt::Display) -> BertError {
    BertError::Weights(format!("packed e5 file: {m}"))
}

/// Reads fields in order, failing on the first one that runs past the end.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], BertError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                corrupt(format!(
                    "truncated: {what} ({n} bytes at offset {}) runs past the end ({} bytes)",
                    self.pos,
                    self.bytes.len()
                ))
            })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], BertError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }
    fn u8(&mut self, what: &str) -> Result<u8, BertError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, BertError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32, BertError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, BertError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn f32(&mut self, what: &str) -> Result<f32, BertError> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }
    /// A non-negative i32 count or id.
    fn count(&mut self, what: &str) -> Result<usize, BertError> {
        let v = i32::from_le_bytes(self.array(what)?);
        usize::try_from(v).map_err(|_| corrupt(format!("{what} is negative ({v})")))
    }
    /// `n` little-endian 4-byte words.
    fn words(&mut self, n: usize, what: &str) -> Result<Vec<[u8; 4]>, BertError> {
        let bytes = n
            .checked_mul(4)
            .ok_or_else(|| corrupt(format!("{what}: count {n} overflows")))?;
        Ok(self
            .take(bytes, what)?
            .chunks_exact(4)
            .map(|w| [w[0], w[1], w[2], w[3]])
            .collect())
    }
}

impl<'a> PackedE5<'a> {
    /// Parses `bytes` (the whole file).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BertError> {
        let mut c = Cursor { bytes, pos: 0 };
        if c.take(4, "magic")? != MAGIC {
            return Err(corrupt("not a packed e5 file (magic is not E5S1)"));
        }
        let version = c.u32("version")?;
        if version != VERSION {
            return Err(corrupt(format!(
                "format version {version}, this reader knows {VERSION}"
            )));
        }
        let config = read_config(&mut c)?;
        let tokenizer = read_vocabulary(&mut c, config.vocab_size)?;
        let tensors = read_directory(&mut c, bytes)?;
        Ok(PackedE5 {
            config,
            tokenizer,
            tensors,
        })
    }

    /// Tensor `name` as f32, checked to hold `elements` values of type `dtype`.
    fn f32s(&self, name: &str, elements: usize) -> Result<Vec<f32>, BertError> {
        let d = self.tensor(name, F32, elements)?;
        Ok(d.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Tensor `name`'s raw bytes, checked to be `elements` values of type `dtype`.
    fn tensor(&self, name: &str, dtype: u8, elements: usize) -> Result<&'a [u8], BertError> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| corrupt(format!("tensor {name} missing")))?;
        if t.dtype != dtype || t.elements != elements {
            return Err(corrupt(format!(
                "tensor {name} is type {} with {} elements, the config implies type {dtype} \
                 with {elements}",
                t.dtype, t.elements
            )));
        }
        Ok(t.data)
    }

    /// A Q4_0 `[n, k]` weight dequantised, with its f32 bias, as a layer in `format`.
    fn linear(
        &self,
        name: &str,
        n: usize,
        k: usize,
        format: WeightFormat,
    ) -> Result<Linear, BertError> {
        let q = self.tensor(&format!("{name}.w"), Q4_0, n * k)?;
        let mut w = vec![0f32; n * k];
        q4::dequantize(q, &mut w);
        let b = self.f32s(&format!("{name}.b"), n)?;
        Ok(Linear::new(&w, &b, n, k, format))
    }

    fn norm(&self, name: &str, n: usize) -> Result<(Vec<f32>, Vec<f32>), BertError> {
        Ok((
            self.f32s(&format!("{name}.w"), n)?,
            self.f32s(&format!("{name}.b"), n)?,
        ))
    }

    fn layer(&self, l: usize, format: WeightFormat) -> Result<LayerWeights, BertError> {
        let (h, i) = (self.config.hidden_size, self.config.intermediate_size);
        let p = format!("l{l}.");
        let mut w = Vec::with_capacity(3 * h * h);
        let mut b = Vec::with_capacity(3 * h);
        for part in ["q", "k", "v"] {
            let q = self.tensor(&format!("{p}{part}.w"), Q4_0, h * h)?;
            let start = w.len();
            w.resize(start + h * h, 0.0);
            q4::dequantize(q, &mut w[start..]);
            b.extend(self.f32s(&format!("{p}{part}.b"), h)?);
        }
        Ok(LayerWeights {
            qkv: Linear::new(&w, &b, 3 * h, h, format),
            attn_out: self.linear(&format!("{p}ao"), h, h, format)?,
            attn_ln: self.norm(&format!("{p}aln"), h)?,
            intermediate: self.linear(&format!("{p}fi"), i, h, format)?,
            output: self.linear(&format!("{p}fo"), h, i, format)?,
            out_ln: self.norm(&format!("{p}oln"), h)?,
        })
    }

    /// The encoder's weights: the dense layers dequantised and stored in `format` (on
    /// `pool`'s threads, one layer per task), the word table kept in Q4_0.
    pub fn weights(
        &self,
        format: WeightFormat,
        pool: &ThreadPool,
    ) -> Result<BertWeights, BertError> {
        let cfg = &self.config;
        let h = cfg.hidden_size;
        let word = self.tensor("emb.word", Q4_0, cfg.vocab_size * h)?.to_vec();
        let position = self.f32s("emb.pos", cfg.max_position_embeddings * h)?;
        let token_type = self.f32s("emb.type", cfg.type_vocab_size * h)?;
        let emb_ln = self.norm("emb.ln", h)?;
        let slots: Vec<Mutex<Option<Result<LayerWeights, BertError>>>> = (0..cfg.num_hidden_layers)
            .map(|_| Mutex::new(None))
            .collect();
        pool.parallel_for_in_order(slots.len(), &|l| {
            let r = self.layer(l, format);
            *slots[l].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        });
        let layers = slots
            .into_iter()
            .map(|s| {
                s.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .expect("every layer task ran")
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BertWeights {
            word: WordTable::Q4_0(word),
            position,
            token_type,
            emb_ln,
            layers,
        })
    }
}

fn read_config(c: &mut Cursor) -> Result<BertConfig, BertError> {
    let hidden_size = c.count("hidden size")?;
    let num_hidden_layers = c.count("layer count")?;
    let num_attention_heads = c.count("head count")?;
    let intermediate_size = c.count("intermediate size")?;
    let vocab_size = c.count("vocabulary size")?;
    let max_position_embeddings = c.count("position count")?;
    let type_vocab_size = c.count("token type count")?;
    let layer_norm_eps = c.f32("layer-norm epsilon")? as f64;
    let block = c.count("quantisation block")?;
    if block != q4::BLOCK {
        return Err(corrupt(format!(
            "quantisation block {block}, expected {}",
            q4::BLOCK
        )));
    }
    let config = BertConfig {
        vocab_size,
        hidden_size,
        num_hidden_layers,
        num_attention_heads,
        intermediate_size,
        max_position_embeddings,
        type_vocab_size,
        layer_norm_eps,
        hidden_act: "gelu".into(),
        position_embedding_type: "absolute".into(),
    };
    config.validate()?;
    if !hidden_size.is_multiple_of(q4::BLOCK) || !intermediate_size.is_multiple_of(q4::BLOCK) {
        return Err(corrupt(format!(
            "hidden {hidden_size} / intermediate {intermediate_size} not multiples of {}",
            q4::BLOCK
        )));
    }
    // Caps only to reject corrupt headers before anything is sized from them.
    if vocab_size > 4_000_000 || max_position_embeddings > 65_536 || type_vocab_size > 64 {
        return Err(corrupt("vocabulary or position table implausibly large"));
    }
    Ok(config)
}

fn read_vocabulary(c: &mut Cursor, vocab_size: usize) -> Result<UnigramTokenizer, BertError> {
    let n = c.count("piece count")?;
    if n == 0 || n > vocab_size {
        return Err(corrupt(format!(
            "{n} pieces for an embedding table of {vocab_size} rows"
        )));
    }
    let mut special = || -> Result<u32, BertError> { Ok(c.count("special id")? as u32) };
    let (bos, eos, pad, unk) = (special()?, special()?, special()?, special()?);
    let text_len = usize::try_from(c.u64("piece text length")?)
        .map_err(|_| corrupt("piece text length overflows"))?;
    let offsets: Vec<usize> = c
        .words(n + 1, "piece offsets")?
        .into_iter()
        .map(|w| u32::from_le_bytes(w) as usize)
        .collect();
    let scores: Vec<f32> = c
        .words(n, "piece scores")?
        .into_iter()
        .map(f32::from_le_bytes)
        .collect();
    let text = c.take(text_len, "piece text")?;
    let mut pieces = Vec::with_capacity(n);
    for (i, w) in offsets.windows(2).enumerate() {
        let bytes = (w[0] <= w[1])
            .then(|| text.get(w[0]..w[1]))
            .flatten()
            .ok_or_else(|| corrupt(format!("piece {i}'s offsets are out of order or range")))?;
        let piece =
            std::str::from_utf8(bytes).map_err(|_| corrupt(format!("piece {i} is not UTF-8")))?;
        pieces.push(piece.to_owned());
    }
    let norm = read_normalization(c)?;
    UnigramTokenizer::new(pieces, scores, SpecialIds { bos, eos, pad, unk }, norm)
}

fn read_normalization(c: &mut Cursor) -> Result<Vec<(char, Vec<char>)>, BertError> {
    let entries = c.count("normalisation entries")?;
    let len = c.u32("normalisation map length")? as usize;
    let mut m = Cursor {
        bytes: c.take(len, "normalisation map")?,
        pos: 0,
    };
    let ch =
        |v: u32| char::from_u32(v).ok_or_else(|| corrupt(format!("U+{v:X} is not a character")));
    let mut out = Vec::with_capacity(entries.min(len / 5));
    for _ in 0..entries {
        let from = ch(m.u32("normalised character")?)?;
        let k = m.u8("replacement count")? as usize;
        let to = m
            .words(k, "replacement")?
            .into_iter()
            .map(|w| ch(u32::from_le_bytes(w)))
            .collect::<Result<Vec<_>, _>>()?;
        out.push((from, to));
    }
    Ok(out)
}

fn read_directory<'a>(
    c: &mut Cursor<'a>,
    file: &'a [u8],
) -> Result<HashMap<String, Tensor<'a>>, BertError> {
    let entries = c.count("tensor count")?;
    let mut out = HashMap::new();
    for _ in 0..entries {
        let name_len = c.u16("tensor name length")? as usize;
        let name = std::str::from_utf8(c.take(name_len, "tensor name")?)
            .map_err(|_| corrupt("a tensor name is not UTF-8"))?
            .to_owned();
        let dtype = c.u8("tensor type")?;
        let elements = c.u32("tensor elements")? as usize;
        let offset = c.u64("tensor offset")?;
        let len = c.u64("tensor bytes")?;
        let want = match dtype {
            F32 => elements * 4,
            Q4_0 if elements.is_multiple_of(q4::BLOCK) => q4::row_bytes(elements),
            Q4_0 => {
                return Err(corrupt(format!(
                    "tensor {name}: {elements} Q4_0 elements is not whole blocks"
                )))
            }
            t => return Err(corrupt(format!("tensor {name} has unknown type {t}"))),
        };
        if len != want as u64 {
            return Err(corrupt(format!(
                "tensor {name}: {len} bytes for {elements} elements of type {dtype}"
            )));
        }
        let data = usize::try_from(offset)
            .ok()
            .and_then(|o| file.get(o..o.checked_add(want)?))
            .ok_or_else(|| {
                corrupt(format!(
                    "truncated: tensor {name} ({want} bytes at offset {offset}) runs past the \
                     end ({} bytes)",
                    file.len()
                ))
            })?;
        if out
            .insert(
                name.clone(),
                Tensor {
                    dtype,
                    elements,
                    data,
                },
            )
            .is_some()
        {
            return Err(corrupt(format!("tensor {name} listed twice")));
        }
    }
    Ok(out)
}
