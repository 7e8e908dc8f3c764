//! OpenAI's `stop` sequences over streamed text: the answer ends before the first
//! occurrence of any of them, and no streamed piece ever shows part of one (text that could
//! be the start of a stop sequence is held back until the next piece decides).

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty sequences are ignored (they would stop before the first character).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Feed the next piece of generated text; returns the text that may be shown now.
    /// After a stop sequence is found, everything else is swallowed.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            self.stopped = true;
            let out = self.held[..at].to_owned();
            self.held.clear();
            return out;
        }
        let keep = self.longest_partial_suffix();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        out
    }

    /// Whether a stop sequence ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The held-back text once generation has ended without a stop sequence.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Bytes at the end of `held` that begin some stop sequence (always a char boundary).
    fn longest_partial_suffix(&self) -> usize {
        let mut best = 0;
        for s in &self.stops {
            for (i, _) in self.held.char_indices() {
                let tail = &self.held[i..];
                if tail.len() <= best {
                    break;
                }
                if s.starts_with(tail) {
                    best = tail.len();
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out: Vec<String> = pieces.iter().map(|p| m.push(p)).collect();
        out.push(m.finish());
        (out, m.stopped())
    }

    #[test]
    fn no_stop_sequences_pass_everything_through() {
        let (out, stopped) = run(&[], &["a", "b"]);
        assert_eq!(out, ["a", "b", ""]);
        assert!(!stopped);
    }

    #[test]
    fn a_stop_split_across_pieces_is_never_shown() {
        let (out, stopped) = run(&["END"], &["one E", "N", "D two"]);
        assert_eq!(out, ["one ", "", "", ""]);
        assert!(stopped);
    }

    #[test]
    fn a_false_start_is_released() {
        let (out, stopped) = run(&["END"], &["an E", "ND", "x"]);
        assert_eq!(out.concat(), "an ");
        assert!(stopped);
        let (out, stopped) = run(&["END"], &["an E", "n", "d"]);
        assert_eq!(out, ["an ", "En", "d", ""]);
        assert!(!stopped);
        let (out, _) = run(&["END"], &["trailing E"]);
        assert_eq!(out, ["trailing ", "E"]);
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        let (out, stopped) = run(&["\n\n", "B"], &["xAyBz\n\nw"]);
        assert_eq!(out.concat(), "xAy");
        assert!(stopped);
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let (out, stopped) = run(&["é!"], &["caf", "é", "é!"]);
        assert_eq!(out.concat(), "café");
        assert!(stopped);
        let (out, _) = run(&["☃☃"], &["a☃", "b"]);
        assert_eq!(out, ["a", "☃b", ""]);
    }
}
