//! Prompt lookup decoding (n-gram match in the context), with the defaults of the
//! Hugging Face implementation: match n-grams of size 2 then 1, take the earliest
//! occurrence that has a continuation, propose up to 10 tokens.

pub const PLD_MAX_NGRAM: usize = 2;
pub const PLD_NUM_PRED: usize = 10;

/// Continuation after the earliest earlier occurrence of the longest matching
/// trailing n-gram (n from `max_ngram` down to 1). Returns (n, continuation).
pub fn pld_lookup(ctx: &[u32], max_ngram: usize, num_pred: usize) -> Option<(usize, &[u32])> {
    let len = ctx.len();
    for n in (1..=max_ngram.min(len.saturating_sub(1))).rev() {
        let gram = &ctx[len - n..];
        for i in 0..len - n {
            if &ctx[i..i + n] == gram {
                let start = i + n;
                let end = (start + num_pred).min(len);
                if start < end {
                    return Some((n, &ctx[start..end]));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bigram_before_unigram_and_earliest_match() {
        let ctx = [1, 2, 3, 9, 2, 4, 1, 2];
        // bigram [1,2] occurs at 0 -> continuation [3, 9, 2, 4, 1, 2]
        assert_eq!(pld_lookup(&ctx, 2, 10), Some((2, &ctx[2..8])));
        assert_eq!(pld_lookup(&ctx, 2, 2), Some((2, &[3u32, 9][..])));
        // Only a unigram match.
        let ctx = [5, 7, 8, 6, 7];
        assert_eq!(pld_lookup(&ctx, 2, 10), Some((1, &[8u32, 6, 7][..])));
        assert_eq!(pld_lookup(&[1, 2, 3], 2, 10), None);
        assert_eq!(pld_lookup(&[], 2, 10), None);
    }
}
