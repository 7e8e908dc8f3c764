//! Pre-tokenizer regexes by `tokenizer.ggml.pre`, as llama.cpp defines them
//! (llama-vocab.cpp). Each entry is applied in order, each splitting the pieces
//! left by the previous one.

/// GPT-2's original split.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2: like llama3 but every digit is its own piece.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regex sequence and whether merges are ignored (whole words found in
/// the vocabulary are taken as one token, as llama.cpp does for llama3).
pub fn regexes_for(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    Some(match pre {
        "default" | "gpt2" | "gpt-2" => (vec![GPT2], false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => (vec![LLAMA3], true),
        "qwen2" | "deepseek-r1-qwen" => (vec![QWEN2], false),
        // starcoder family: digits are split individually, then the GPT-2 split
        "smollm" | "starcoder" | "refact" | "codeshell" => (vec![r"\p{N}", GPT2], false),
        _ => return None,
    })
}
