//! Incremental detokenization: a multi-byte UTF-8 char may be split across
//! tokens, so bytes are held back until they form complete chars.

use super::Tokenizer;

/// Feed token ids, receive text as soon as it is valid UTF-8. Invalid byte
/// sequences become U+FFFD. Reuses its buffer: no allocation per token once
/// warmed up (the caller owns the output `String`).
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self {
            pending: Vec::with_capacity(64),
        }
    }

    /// Append the text completed by token `id` to `out`; returns the number of
    /// bytes appended.
    pub fn push(&mut self, tok: &Tokenizer, id: u32, out: &mut String) -> usize {
        self.pending.extend_from_slice(tok.piece(id));
        let before = out.len();
        self.drain(out, false);
        out.len() - before
    }

    /// Flush whatever is left (an incomplete char becomes U+FFFD).
    pub fn finish(&mut self, out: &mut String) {
        self.drain(out, true);
    }

    /// Convenience: the text completed by `id` as a new String.
    pub fn next_text(&mut self, tok: &Tokenizer, id: u32) -> String {
        let mut s = String::new();
        self.push(tok, id, &mut s);
        s
    }

    fn drain(&mut self, out: &mut String, at_end: bool) {
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // from_utf8 validated this range, so the fallback is never taken
                    out.push_str(std::str::from_utf8(&self.pending[start..valid]).unwrap_or(""));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            start = valid + bad;
                        }
                        None if at_end => {
                            out.push('\u{FFFD}');
                            start = self.pending.len();
                            break;
                        }
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
    }
}
