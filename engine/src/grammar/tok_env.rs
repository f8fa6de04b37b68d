//! The model's vocabulary as `llguidance` sees it: each token's bytes in a trie (control
//! tokens marked as special, so no grammar produces them as text) and our own encoder for
//! the text a grammar forces.

use std::sync::Arc;

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

/// A [`Tokenizer`] with its token trie.
pub struct TokenEnv {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenEnv {
    /// The trie of `tokenizer`'s vocabulary; a grammar ends with `eos` (the token that
    /// ends a generation).
    pub fn new(tokenizer: Arc<Tokenizer>, eos: u32) -> Self {
        let words: Vec<Vec<u8>> = (0..tokenizer.vocab_size() as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id).unwrap_or_default();
                if tokenizer.is_control(id) || id == eos {
                    [&[TokTrie::SPECIAL_TOKEN_MARKER], bytes].concat()
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let mut info = TokRxInfo::new(words.len() as u32, eos);
        info.tok_bos = tokenizer.bos_id;
        let trie = TokTrie::from(&info, &words);
        Self { tokenizer, trie }
    }
}

impl TokenizerEnv for TokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Text a grammar forces is UTF-8 but may be cut mid-character, and may spell a
        // control token (`<tool_call>` in some vocabularies), which no grammar's text
        // produces: the trie's greedy split covers those.
        let encoded = std::str::from_utf8(s)
            .ok()
            .and_then(|text| self.tokenizer.encode(text, false).ok())
            .filter(|ids| !ids.iter().any(|&id| self.tokenizer.is_control(id)));
        encoded.unwrap_or_else(|| self.trie.greedy_tokenize(s))
    }
}
