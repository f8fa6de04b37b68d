//! Generated text as it streams: whole UTF-8 characters only, cut at the first stop
//! string, holding back any tail that could still become one.

use fornax_engine::tokenizer::{TextStream, Tokenizer};

/// The text of one generation.
#[derive(Debug, Default)]
pub struct StopText {
    stream: TextStream,
    stops: Vec<String>,
    /// Everything decoded so far (cut at a stop string once one is found).
    text: String,
    /// Bytes of `text` already released.
    sent: usize,
    stopped: bool,
}

impl StopText {
    /// Text that ends at the first of `stops`.
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            ..Self::default()
        }
    }

    /// Adds a token; returns the text now safe to release (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, token: u32) -> String {
        let piece = self.stream.push(tok.token_bytes(token).unwrap_or_default());
        self.add(&piece, false)
    }

    /// Ends the text; returns what was held back.
    pub fn finish(&mut self) -> String {
        let rest = self.stream.finish();
        self.add(&rest, true)
    }

    /// Whether a stop string ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The full text released so far.
    pub fn text(&self) -> &str {
        &self.text[..self.sent]
    }

    fn add(&mut self, piece: &str, last: bool) -> String {
        if self.stopped {
            return String::new();
        }
        // A stop string can start up to its length minus one before the new piece.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.text.len().saturating_sub(longest.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.text.push_str(piece);
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        let end = match found {
            Some(at) => {
                self.stopped = true;
                self.text.truncate(at);
                at
            }
            None if last => self.text.len(),
            None => self.text.len() - self.held_tail(),
        };
        let out = self.text[self.sent..end.max(self.sent)].to_string();
        self.sent = end.max(self.sent);
        out
    }

    /// Bytes at the end of the text that begin some stop string.
    fn held_tail(&self) -> usize {
        let text = &self.text[self.sent..];
        text.char_indices()
            .map(|(i, _)| &text[i..])
            .find(|tail| self.stops.iter().any(|s| s.starts_with(tail)))
            .map_or(0, str::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let mut t = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out: Vec<String> = pieces.iter().map(|p| t.add(p, false)).collect();
        out.push(t.add("", true));
        (out, t.stopped())
    }

    #[test]
    fn cuts_at_a_stop_string_split_across_pieces() {
        let (out, stopped) = feed(&["\n\n"], &["Hello", " world\n", "\nmore", " text"]);
        assert_eq!(out, ["Hello", " world", "", "", ""]);
        assert!(stopped);
    }

    #[test]
    fn releases_held_text_that_did_not_become_a_stop() {
        let (out, stopped) = feed(&["END"], &["a E", "N", "x", "EN"]);
        assert_eq!(out, ["a ", "", "ENx", "", "EN"]);
        assert!(!stopped);
    }

    #[test]
    fn earliest_of_several_stops_wins_and_multibyte_text_is_kept_whole() {
        let (out, stopped) = feed(&["é!", "b"], &["ñaé", "!b"]);
        assert_eq!(out, ["ña", "", ""]);
        assert!(stopped);
        let (out, _) = feed(&[], &["ñ", "é"]);
        assert_eq!(out.concat(), "ñé");
    }
}
