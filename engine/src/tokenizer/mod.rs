//! Tokenizer built from GGUF metadata (`tokenizer.ggml.*`): byte-level BPE with the
//! model's pre-tokenizer (`gpt2`) or SentencePiece-style merges by score (`llama`),
//! special tokens, streaming-safe decoding and the chat template.

mod byte_level;
mod chat;
mod spm;
mod stream;

use thiserror::Error;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::{
    byte_level::ByteLevel,
    digits::Digits,
    sequence::Sequence,
    split::{Split, SplitPattern},
    PreTokenizerWrapper,
};
use tokenizers::AddedToken;
use tokenizers::SplitDelimiterBehavior;

use crate::gguf::{GgufError, GgufFile};
pub use byte_level::{byte_to_char, ByteDecoder};
pub use chat::{ChatMessage, ChatTemplate, TemplateInputs};
use spm::{types, Spm};
pub use stream::TextStream;

/// The tokenizer models Fornax reads (`tokenizer.ggml.model`).
pub const TOKENIZER_MODELS: [&str; 2] = ["gpt2", "llama"];

/// Errors building or using the tokenizer.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(
        "unsupported tokenizer model {0:?} (supported: gpt2 byte-level BPE, llama SentencePiece)"
    )]
    UnsupportedModel(String),
    #[error(
        "unsupported pre-tokenizer {0:?} (supported: gpt2, default, smollm, starcoder, refact, codeshell, llama-bpe, llama3, llama-v3, qwen2)"
    )]
    UnsupportedPre(String),
    #[error("malformed tokenizer metadata: {0}")]
    Malformed(String),
    #[error("tokenizer failed: {0}")]
    Encode(String),
    #[error("token id {0} is outside the vocabulary")]
    UnknownId(u32),
    #[error(
        "the model has no chat template (and no turn tokens of a built-in format: Gemma's, ChatML)"
    )]
    NoChatTemplate,
    #[error("chat template failed: {0}")]
    Template(#[from] minijinja::Error),
}

/// How text becomes ids.
enum Encoder {
    /// Byte-level BPE (`gpt2`).
    Bpe {
        /// Treats special-token text as special tokens.
        special: Box<tokenizers::Tokenizer>,
        /// Encodes special-token text as ordinary text.
        plain: Box<tokenizers::Tokenizer>,
    },
    /// SentencePiece-style merges by score (`llama`).
    Spm(Spm),
}

/// The model's tokenizer.
pub struct Tokenizer {
    encoder: Encoder,
    token_bytes: Vec<Vec<u8>>,
    token_is_control: Vec<bool>,
    /// Beginning-of-sequence token id.
    pub bos_id: Option<u32>,
    /// End-of-sequence token id.
    pub eos_id: Option<u32>,
    /// Whether the file asks for a BOS token at the start of a prompt.
    pub add_bos: bool,
    chat_template: Option<ChatTemplate>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.token_bytes.len())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .finish()
    }
}

/// Llama 3's split (`llama-bpe`): contractions, letters, digits in threes, punctuation,
/// newlines and spaces.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split (`qwen2`, also Qwen2.5 and Qwen3): Llama 3's with single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Pre-tokenizers known for `gpt2`-type vocabularies, as llama.cpp names them, and
/// whether a piece found whole in the vocabulary skips the merges (Llama 3's
/// `ignore_merges`).
fn pre_tokenizer(name: &str) -> Result<(Vec<PreTokenizerWrapper>, bool), TokenizerError> {
    let byte_level = ByteLevel::new(false, false, true).into();
    let split = |pattern: &str| -> Result<PreTokenizerWrapper, TokenizerError> {
        let split = Split::new(
            SplitPattern::Regex(pattern.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Malformed(e.to_string()))?;
        Ok(split.into())
    };
    let bytes_only = || ByteLevel::new(false, true, false).into();
    match name {
        // Digits split one by one, then the GPT-2 regex.
        "smollm" | "starcoder" | "refact" | "codeshell" => {
            Ok((vec![Digits::new(true).into(), byte_level], false))
        }
        "gpt2" | "default" => Ok((vec![byte_level], false)),
        "llama-bpe" | "llama3" | "llama-v3" => Ok((vec![split(LLAMA3_SPLIT)?, bytes_only()], true)),
        "qwen2" => Ok((vec![split(QWEN2_SPLIT)?, bytes_only()], false)),
        other => Err(TokenizerError::UnsupportedPre(other.to_string())),
    }
}

impl Tokenizer {
    /// Builds the tokenizer from the file's metadata.
    pub fn from_gguf(file: &GgufFile<'_>) -> Result<Self, TokenizerError> {
        let model = file.str("tokenizer.ggml.model")?;
        if !TOKENIZER_MODELS.contains(&model) {
            return Err(TokenizerError::UnsupportedModel(model.to_string()));
        }
        let tokens: Vec<&str> = file
            .array("tokenizer.ggml.tokens")?
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| TokenizerError::Malformed("token is not a string".into()))
            })
            .collect::<Result<_, _>>()?;
        let types: Vec<i64> = match file.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .as_array()
                .ok_or_else(|| TokenizerError::Malformed("token_type is not an array".into()))?
                .iter()
                .map(|t| t.as_i64().unwrap_or(types::NORMAL))
                .collect(),
            None => vec![types::NORMAL; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(TokenizerError::Malformed(format!(
                "{} tokens but {} token types",
                tokens.len(),
                types.len()
            )));
        }
        let id = |key: &str| file.get(key).and_then(|v| v.as_u64()).map(|v| v as u32);
        let token_is_control: Vec<bool> = types.iter().map(|&t| t == types::CONTROL).collect();
        let (encoder, token_bytes) = match model {
            "gpt2" => bpe(file, &tokens, &types)?,
            _ => {
                let scores: Vec<f32> = match file.get("tokenizer.ggml.scores") {
                    Some(v) => v
                        .as_array()
                        .ok_or_else(|| TokenizerError::Malformed("scores is not an array".into()))?
                        .iter()
                        .map(|s| s.as_f64().unwrap_or(0.0) as f32)
                        .collect(),
                    None => vec![0.0; tokens.len()],
                };
                let unknown = id("tokenizer.ggml.unknown_token_id");
                let bytes = tokens
                    .iter()
                    .zip(&types)
                    .map(|(t, &ty)| spm::token_bytes(t, ty))
                    .collect();
                let space_prefix = file
                    .get("tokenizer.ggml.add_space_prefix")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(true);
                let spm = Spm::new(&tokens, &scores, &types, unknown, space_prefix);
                (Encoder::Spm(spm), bytes)
            }
        };

        let bos_id = id("tokenizer.ggml.bos_token_id");
        let eos_id = id("tokenizer.ggml.eos_token_id");
        let name = |id: Option<u32>| {
            id.and_then(|i| tokens.get(i as usize))
                .map(|s| s.to_string())
                .unwrap_or_default()
        };
        let chat_template = match file.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
            Some(src) => Some(ChatTemplate::new(
                src.to_string(),
                name(bos_id),
                name(eos_id),
            )),
            None => {
                let has = |t: &str| match &encoder {
                    Encoder::Bpe { special, .. } => special.token_to_id(t).is_some(),
                    Encoder::Spm(spm) => spm.token_id(t).is_some(),
                };
                ChatTemplate::built_in_for(has, name(bos_id), name(eos_id))
            }
        };
        Ok(Self {
            encoder,
            token_bytes,
            token_is_control,
            bos_id,
            eos_id,
            add_bos: file
                .get("tokenizer.ggml.add_bos_token")
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            chat_template,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// Encodes text; with `parse_special`, special-token text such as `<|im_start|>`
    /// becomes its single token, otherwise it is encoded as ordinary text.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let (special, plain) = match &self.encoder {
            Encoder::Spm(spm) => return Ok(spm.encode(text, parse_special)),
            Encoder::Bpe { special, plain } => (special, plain),
        };
        let tok = if parse_special { special } else { plain };
        tok.encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// `ids` as a prompt the model expects: BOS first where the file asks for one
    /// (`tokenizer.ggml.add_bos_token`) and the ids do not already start with it.
    pub fn with_bos(&self, mut ids: Vec<u32>) -> Vec<u32> {
        if let Some(bos) = self.bos_id.filter(|_| self.add_bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        ids
    }

    /// [`Self::encode`] as a prompt: BOS first where the file asks for one.
    pub fn encode_prompt(
        &self,
        text: &str,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        Ok(self.with_bos(self.encode(text, parse_special)?))
    }

    /// The raw bytes a token stands for (special tokens give their text).
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        self.token_bytes
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or(TokenizerError::UnknownId(id))
    }

    /// Whether `id` is a control token such as `<|im_end|>`.
    pub fn is_control(&self, id: u32) -> bool {
        self.token_is_control
            .get(id as usize)
            .copied()
            .unwrap_or(false)
    }

    /// The id of a token given its exact vocabulary text, if any.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.encoder {
            Encoder::Bpe { special, .. } => special.token_to_id(text),
            Encoder::Spm(spm) => spm.token_id(text),
        }
    }

    /// Decodes ids to text (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The chat template: the file's, or a built-in one its turn tokens call for.
    pub fn chat_template(&self) -> Result<&ChatTemplate, TokenizerError> {
        self.chat_template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)
    }

    /// Replaces the file's chat template with `source` (a file's template that is missing
    /// or wrong, or a family's newer one); BOS and EOS keep the vocabulary's strings.
    pub fn set_chat_template(&mut self, source: String) {
        let name = |id: Option<u32>| {
            id.and_then(|i| self.token_bytes(i).ok())
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        self.chat_template = Some(ChatTemplate::new(
            source,
            name(self.bos_id),
            name(self.eos_id),
        ));
    }

    /// Renders a conversation with the chat template and encodes it (special tokens
    /// parsed), BOS first where the file asks for one and the template did not write it.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, TokenizerError> {
        self.encode_chat_with(messages, TemplateInputs::default())
    }

    /// [`Self::encode_chat`] with the tools and other variables of `inputs`.
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        inputs: TemplateInputs<'_>,
    ) -> Result<Vec<u32>, TokenizerError> {
        let text = self.chat_template()?.render_with(messages, true, inputs)?;
        self.encode_prompt(&text, true)
    }

    /// Tokens that end a generation: end of sequence, end of turn (`<|im_end|>`,
    /// `<end_of_turn>`, `<|eot_id|>`) and end of text, those the vocabulary has, each once.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.eos_id.into_iter().collect();
        let ends = [
            "<|im_end|>",
            "<end_of_turn>",
            "<|eot_id|>",
            "<|endoftext|>",
            "<|end_of_text|>",
        ];
        for text in ends {
            if let Some(id) = self.token_id(text).filter(|id| !ids.contains(id)) {
                ids.push(id);
            }
        }
        ids
    }
}

/// The byte-level BPE encoder of a `gpt2` vocabulary and each token's bytes.
fn bpe(
    file: &GgufFile<'_>,
    tokens: &[&str],
    types: &[i64],
) -> Result<(Encoder, Vec<Vec<u8>>), TokenizerError> {
    let pre = file
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let merges = file
        .array("tokenizer.ggml.merges")?
        .iter()
        .map(|m| {
            m.as_str()
                .and_then(|s| s.split_once(' '))
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| TokenizerError::Malformed(format!("bad merge {m:?}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let vocab: ahash::AHashMap<String, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    let (pre_tokenizers, ignore_merges) = pre_tokenizer(pre)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Malformed(e.to_string()))?;
    let mut special = tokenizers::Tokenizer::new(bpe);
    special.with_pre_tokenizer(Some(Sequence::new(pre_tokenizers)));
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(_, &t)| t == types::CONTROL || t == types::USER_DEFINED)
        .map(|(tok, &t)| AddedToken::from(tok.to_string(), t == types::CONTROL))
        .collect();
    special.add_special_tokens(&added);
    let mut plain = special.clone();
    plain.set_encode_special_tokens(true);
    let bytes = ByteDecoder::new();
    let token_bytes = tokens
        .iter()
        .zip(types)
        .map(|(t, &ty)| match ty == types::CONTROL {
            true => t.as_bytes().to_vec(),
            false => bytes.token_bytes(t),
        })
        .collect();
    let encoder = Encoder::Bpe {
        special: Box::new(special),
        plain: Box::new(plain),
    };
    Ok((encoder, token_bytes))
}
