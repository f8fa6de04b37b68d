//! Streaming-safe detokenisation: bytes of an incomplete UTF-8 sequence are held back
//! until the tokens that complete it arrive, so no garbage is ever printed.

/// Accumulates token bytes and releases only complete UTF-8 text.
#[derive(Debug, Default, Clone)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// Adds a token's bytes; returns the text that became complete (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).expect("valid"));
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Invalid bytes can never become valid: replace them.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left at the end of generation (lossily if incomplete).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_split_multibyte_characters() {
        let crab = "🦀".as_bytes();
        let mut s = TextStream::default();
        assert_eq!(s.push(b"a"), "a");
        assert_eq!(s.push(&crab[..1]), "");
        assert_eq!(s.push(&crab[1..3]), "");
        assert_eq!(s.push(&[crab[3], b'!']), "🦀!");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut s = TextStream::default();
        assert_eq!(s.push(&[b'x', 0xff, b'y']), "x\u{fffd}y");
        assert_eq!(s.push(&[0xe2, 0x82]), "");
        assert_eq!(s.finish(), "\u{fffd}");
    }
}
