//! Default token counter: an estimate of BERT word-piece tokens without loading a
//! tokenizer (corpus-tools must not depend on model crates). Callers with a real
//! tokenizer pass their own counter to the chunker instead.

/// Estimated word-piece token count: one token per punctuation mark, one per short word,
/// and one per ~4 further characters of a long word (rare words split into pieces).
pub fn estimate_tokens(text: &str) -> usize {
    let mut tokens = 0usize;
    let mut word_len = 0usize;
    let flush = |len: usize| -> usize {
        match len {
            0 => 0,
            1..=7 => 1,
            n => 1 + (n - 7).div_ceil(4),
        }
    };
    for c in text.chars() {
        if c.is_alphanumeric() {
            word_len += 1;
        } else {
            tokens += flush(word_len);
            word_len = 0;
            if !c.is_whitespace() {
                tokens += 1;
            }
        }
    }
    tokens + flush(word_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_words_and_punctuation() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("hello world"), 2);
        assert_eq!(estimate_tokens("hello, world!"), 4);
        // A long rare word is split into several pieces.
        assert!(estimate_tokens("antidisestablishmentarianism") >= 4);
    }
}
