//! How a KV block is stored in the shared tier: a self-describing value a reader checks
//! in full before use, and the key it is stored under.
//!
//! Value: `FXKV`, format version (u32), the fingerprint (32 bytes), the number of tokens
//! up to the block's end (u32) and those token ids (u32 each), the number of floats (u32)
//! and the block's keys and values (f32 each, `[layer][k or v][token][n_kv * head_dim]`),
//! all little-endian. Key: `fornax:kv:` + the fingerprint's first 16 hex digits + `:` +
//! the SHA-256 of the token ids, hex.

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 4] = b"FXKV";
const VERSION: u32 = 1;

/// What decides a block's bytes besides its tokens: the model file and the KV layout.
pub type Fingerprint = [u8; 32];

/// Why a stored value was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("not a Fornax KV block (bad magic or version)")]
    Foreign,
    #[error("written for another model or KV layout")]
    OtherModel,
    #[error("written for other tokens")]
    OtherTokens,
    #[error("truncated or padded value")]
    BadLength,
}

/// The key of the block ending after `tokens` (the whole prefix up to its end).
pub fn key(fingerprint: &Fingerprint, tokens: &[u32]) -> String {
    let mut h = Sha256::new();
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    format!(
        "fornax:kv:{}:{}",
        hex(&fingerprint[..8]),
        hex(&h.finalize())
    )
}

/// The stored value of a block ending after `tokens` holding `values`.
pub fn encode(fingerprint: &Fingerprint, tokens: &[u32], values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + 4 * (tokens.len() + values.len()));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(fingerprint);
    out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&(values.len() as u32).to_le_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// The block's values if `bytes` is exactly a block of this fingerprint ending after
/// `tokens`, with `floats` values.
pub fn decode(
    bytes: &[u8],
    fingerprint: &Fingerprint,
    tokens: &[u32],
    floats: usize,
) -> Result<Vec<f32>, Rejected> {
    let mut r = Reader(bytes);
    if r.take(4) != Some(MAGIC.as_slice()) || r.u32() != Some(VERSION) {
        return Err(Rejected::Foreign);
    }
    if r.take(32) != Some(fingerprint.as_slice()) {
        return Err(Rejected::OtherModel);
    }
    let n = r.u32().ok_or(Rejected::BadLength)? as usize;
    if n != tokens.len() {
        return Err(Rejected::OtherTokens);
    }
    for &t in tokens {
        if r.u32().ok_or(Rejected::BadLength)? != t {
            return Err(Rejected::OtherTokens);
        }
    }
    if r.u32() != Some(floats as u32) {
        return Err(Rejected::BadLength);
    }
    let data = r.take(4 * floats).ok_or(Rejected::BadLength)?;
    if !r.0.is_empty() {
        return Err(Rejected::BadLength);
    }
    Ok(data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: Fingerprint = [7; 32];

    #[test]
    fn a_value_decodes_only_for_its_model_tokens_and_length() {
        let tokens: Vec<u32> = (0..64).collect();
        let values = [1.5f32, -2.0, 3.25];
        let bytes = encode(&FP, &tokens, &values);
        assert_eq!(decode(&bytes, &FP, &tokens, 3).unwrap(), values);
        assert_eq!(
            decode(&bytes, &[8; 32], &tokens, 3),
            Err(Rejected::OtherModel)
        );
        let mut other = tokens.clone();
        other[40] = 999;
        assert_eq!(decode(&bytes, &FP, &other, 3), Err(Rejected::OtherTokens));
        assert_eq!(
            decode(&bytes, &FP, &tokens[..32], 3),
            Err(Rejected::OtherTokens)
        );
        assert_eq!(decode(&bytes, &FP, &tokens, 4), Err(Rejected::BadLength));
        assert_eq!(
            decode(&bytes[..bytes.len() - 1], &FP, &tokens, 3),
            Err(Rejected::BadLength)
        );
        let mut padded = bytes.clone();
        padded.push(0);
        assert_eq!(decode(&padded, &FP, &tokens, 3), Err(Rejected::BadLength));
        assert_eq!(decode(b"hello", &FP, &tokens, 3), Err(Rejected::Foreign));
    }

    #[test]
    fn keys_differ_by_model_and_by_every_token() {
        let tokens: Vec<u32> = (0..64).collect();
        let mut other = tokens.clone();
        other[0] = 1;
        assert_ne!(key(&FP, &tokens), key(&FP, &other));
        assert_ne!(key(&FP, &tokens), key(&[8; 32], &tokens));
        assert!(key(&FP, &tokens).starts_with("fornax:kv:0707070707070707:"));
    }
}
