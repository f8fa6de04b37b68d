//! The GPT-2 byte-level alphabet: each byte is written as one printable character in the
//! vocabulary. Decoding maps the characters back to raw bytes.

/// The character that stands for byte `b` in byte-level BPE vocabularies.
pub fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    if printable(b) {
        char::from(b)
    } else {
        let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + rank).expect("valid char")
    }
}

/// Lookup table from the alphabet's characters back to bytes.
pub struct ByteDecoder {
    table: std::collections::HashMap<char, u8>,
}

impl ByteDecoder {
    /// Builds the table.
    pub fn new() -> Self {
        Self {
            table: (0..=255u8).map(|b| (byte_to_char(b), b)).collect(),
        }
    }

    /// The bytes a byte-level token string stands for; characters outside the alphabet
    /// (never present in a byte-level vocabulary) are kept as their UTF-8 encoding.
    pub fn token_bytes(&self, token: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(token.len());
        for ch in token.chars() {
            match self.table.get(&ch) {
                Some(&b) => out.push(b),
                None => out.extend(ch.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        out
    }
}

impl Default for ByteDecoder {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_round_trips() {
        let d = ByteDecoder::new();
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        let all: String = (0..=255u8).map(byte_to_char).collect();
        assert_eq!(d.token_bytes(&all), (0..=255u8).collect::<Vec<_>>());
    }
}
