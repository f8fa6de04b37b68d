//! Constrained decoding with `llguidance`: a grammar (a JSON schema, a Lark grammar or a
//! regex) compiled once per request against the model's vocabulary, then a token mask per
//! step applied to the logits before sampling, and the sampled tokens fed back. A grammar
//! that does not compile is an error for the caller, never an unconstrained answer.

mod tok_env;
mod tool_calls;

use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{InferenceCapabilities, SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use lru::LruCache;
use serde_json::Value;

pub use tok_env::TokenEnv;
pub use tool_calls::{CallDelta, CallMode, CallReader, CallSyntax, ToolSpec};

use crate::tokenizer::Tokenizer;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A value valid for the JSON schema.
    JsonSchema(Value),
    /// A Lark grammar (llguidance's dialect).
    Lark(String),
    /// A regular expression matching the whole output.
    Regex(String),
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(&serde_json::json!({"type": "object"})))
            }
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact(schema)),
            Grammar::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
        }
    }

    /// A key of the grammar for the compiled-grammar cache.
    fn key(&self) -> u64 {
        let mut h = DefaultHasher::new();
        match self {
            Grammar::JsonObject => 0u8.hash(&mut h),
            Grammar::JsonSchema(schema) => (1u8, schema.to_string()).hash(&mut h),
            Grammar::Lark(src) => (2u8, src).hash(&mut h),
            Grammar::Regex(rx) => (3u8, rx).hash(&mut h),
        }
        h.finish()
    }
}

/// `schema` with llguidance's JSON options defaulting to one line without spaces
/// (`{"a":1,"b":[2,3]}`) where the schema does not set them: a small model's free-form
/// whitespace wanders and costs tokens.
fn compact(schema: &Value) -> Value {
    guided(schema, &[("whitespace_flexible", Value::Bool(false))])
}

/// `schema` with llguidance's JSON options (`x-guidance`) defaulting to `defaults`
/// where the schema does not set them.
fn guided(schema: &Value, defaults: &[(&str, Value)]) -> Value {
    let mut schema = schema.clone();
    if let Some(root) = schema.as_object_mut() {
        let options = root
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(options) = options.as_object_mut() {
            for (key, value) in defaults {
                options.entry(*key).or_insert_with(|| value.clone());
            }
        }
    }
    schema
}

/// Why a grammar could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// It does not compile (malformed, unsupported, or over the compile limits).
    #[error("the grammar does not compile: {0}")]
    Compile(String),
    /// Matching failed during generation.
    #[error("constrained decoding failed: {0}")]
    Match(String),
}

/// Compiles grammars for one model's vocabulary, keeping the most recent ones compiled.
pub struct GrammarCompiler {
    factory: ParserFactory,
    cache: Mutex<LruCache<u64, Matcher>>,
}

impl fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrammarCompiler").finish_non_exhaustive()
    }
}

/// Compiled grammars kept for reuse.
const CACHED_GRAMMARS: usize = 64;

impl GrammarCompiler {
    /// A compiler for `tokenizer`'s vocabulary; a complete output ends with its end of
    /// sequence token (or its first stop token).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Self, GrammarError> {
        let eos = tokenizer
            .eos_id
            .or_else(|| tokenizer.stop_ids().first().copied())
            .ok_or_else(|| GrammarError::Compile("the vocabulary has no end token".into()))?;
        let env: TokEnv = Arc::new(TokenEnv::new(tokenizer, eos));
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| GrammarError::Compile(e.to_string()))?;
        factory.quiet();
        let cache = LruCache::new(NonZeroUsize::new(CACHED_GRAMMARS).expect("not zero"));
        Ok(Self {
            factory,
            cache: Mutex::new(cache),
        })
    }

    /// A fresh constraint for `grammar` (compiled, or copied from the cache).
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        let key = grammar.key();
        if let Some(m) = self.cache.lock().expect("not poisoned").get(&key) {
            return Ok(Constraint::new(m.deep_clone()));
        }
        let parser = self
            .factory
            .create_parser(grammar.top_level())
            .map_err(|e| GrammarError::Compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Compile(e));
        }
        let constraint = Constraint::new(matcher.deep_clone());
        self.cache.lock().expect("not poisoned").put(key, matcher);
        Ok(constraint)
    }
}

/// One generation's grammar state (boxed: a matcher is over a kilobyte, and requests
/// travel by value).
pub struct Constraint {
    matcher: Box<Matcher>,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self::new(self.matcher.deep_clone())
    }
}

impl Constraint {
    fn new(matcher: Matcher) -> Self {
        Self {
            matcher: Box::new(matcher),
        }
    }

    /// The tokens allowed next (only the end token once the grammar is complete).
    pub fn mask(&mut self) -> Result<Mask, GrammarError> {
        self.matcher
            .compute_mask_or_eos()
            .map(Mask)
            .map_err(|e| GrammarError::Match(e.to_string()))
    }

    /// The tokens the grammar forces next (the only ones it allows, one after another),
    /// written without sampling.
    pub fn forced(&mut self) -> Vec<u32> {
        self.matcher.compute_ff_tokens()
    }

    /// The tokens allowed after `tokens` (the state moves on in a copy only).
    pub fn mask_after(&self, tokens: &[u32]) -> Result<Mask, GrammarError> {
        let mut ahead = self.clone();
        ahead.consume(tokens)?;
        ahead.mask()
    }

    /// The masks of `draft`'s positions: the tokens allowed after each of its prefixes,
    /// the empty one first (`draft.len() + 1` masks; the state moves on in a copy only).
    pub fn masks_along(&self, draft: &[u32]) -> Result<Vec<Mask>, GrammarError> {
        let mut ahead = self.clone();
        let mut masks = vec![ahead.mask()?];
        for &token in draft {
            ahead.consume(&[token])?;
            masks.push(ahead.mask()?);
        }
        Ok(masks)
    }

    /// How many leading tokens of `draft` the grammar allows from here.
    pub fn valid_prefix(&mut self, draft: &[u32]) -> usize {
        self.matcher.validate_tokens(draft).unwrap_or(0)
    }

    /// Feeds the tokens generated (a token the mask did not allow is an error).
    pub fn consume(&mut self, tokens: &[u32]) -> Result<(), GrammarError> {
        self.matcher
            .consume_tokens(tokens)
            .map_err(|e| GrammarError::Match(e.to_string()))
    }

    /// Whether the grammar admits nothing more: the generation is complete.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// A set of allowed tokens, one bit per token.
#[derive(Debug, Clone)]
pub struct Mask(SimpleVob);

impl Mask {
    /// Sets the logits of every token not allowed to minus infinity (tokens past the
    /// vocabulary included).
    pub fn apply(&self, logits: &mut [f32]) {
        let words = self.0.as_slice();
        for (i, chunk) in logits.chunks_mut(32).enumerate() {
            let word = words.get(i).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            for (bit, l) in chunk.iter_mut().enumerate() {
                if word >> bit & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Whether `token` is allowed.
    pub fn allows(&self, token: u32) -> bool {
        self.0.is_allowed(token)
    }

    /// The mask packed, a bit per token (bit `t % 32` of word `t / 32`).
    pub fn words(&self) -> &[u32] {
        self.0.as_slice()
    }
}
