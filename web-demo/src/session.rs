//! A model loaded onto the WebGPU device with its tokenizer and a paged KV pool, and
//! generation over it that reads logits back asynchronously (WebGPU cannot block),
//! optionally under a JSON schema (llguidance, compiled to wasm with the engine).

use std::cell::{OnceCell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use fornax_engine::gguf::GgufFile;
use fornax_engine::grammar::{Constraint, Grammar, GrammarCompiler};
use fornax_engine::kv::{KvCapacity, PagedKv, Tier, TierPolicy, BLOCK_TOKENS};
use fornax_engine::model::{LoadOptions, Model};
use fornax_engine::sampling::SamplingParams;
use fornax_engine::seq_cache::PagedSeq;
use fornax_engine::tokenizer::{ChatMessage, TextStream, Tokenizer};
use fornax_engine::{GenerateParams, Generation};
use js_sys::{Function, Promise, Uint32Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::device::{device, Adapter, WebBackend};

/// Context the demo's KV pool holds (prompt plus generated tokens), at most the model's.
const CONTEXT_TOKENS: usize = 2048;

/// A model ready to generate in this tab.
#[wasm_bindgen]
pub struct Session {
    inner: Rc<Inner>,
}

struct Inner {
    model: Model<WebBackend>,
    tokenizer: Arc<Tokenizer>,
    /// Built at the first schema (the vocabulary's token trie).
    grammars: OnceCell<GrammarCompiler>,
    /// One sequence at a time; borrowed for the length of a generation.
    kv: RefCell<PagedKv<WebBackend>>,
    adapter: Adapter,
    summary: String,
}

fn js_error(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

#[wasm_bindgen]
impl Session {
    /// Parses a GGUF file, checks that its largest weight fits one storage binding of the
    /// adapter, and uploads it (quantized matrices stay quantized); `progress(done,
    /// total)` is called after each tensor.
    pub async fn load(bytes: Vec<u8>, progress: Function) -> Result<Session, JsError> {
        let (device, adapter) = device().await;
        let file = GgufFile::parse(&bytes).map_err(js_error)?;
        let options = LoadOptions::default();
        if let Some((name, need)) = Model::<WebBackend>::largest_weight(&file, options) {
            if need > adapter.max_binding {
                return Err(JsError::new(&format!(
                    "tensor {name} needs {} MiB in one buffer, but this adapter binds at most {} MiB",
                    need >> 20,
                    adapter.max_binding >> 20
                )));
            }
        }
        let tokenizer = Tokenizer::from_gguf(&file).map_err(js_error)?;
        let mut report = |done: usize, total: usize| {
            let _ = progress.call2(&JsValue::NULL, &done.into(), &total.into());
        };
        let model = Model::<WebBackend>::from_gguf_with(&file, &device, options, &mut report)
            .map_err(js_error)?;
        let dims = model.kv_dims();
        let context = CONTEXT_TOKENS.min(model.config.max_seq_len);
        let blocks = context.div_ceil(BLOCK_TOKENS);
        let kv = model.new_paged_cache(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32);
        let c = &model.config;
        let summary = format!(
            "{} layers, d_model {}, {} heads ({} KV), vocabulary {}; weights {:.1} MB on the GPU; \
             KV pool {} blocks of {BLOCK_TOKENS} tokens in FP32 ({:.1} MB)",
            c.n_layers,
            c.d_model,
            c.n_heads,
            c.n_kv_heads,
            c.vocab_size,
            model.weight_bytes() as f64 / 1e6,
            blocks,
            (blocks * dims.block_bytes(Tier::F32)) as f64 / 1e6,
        );
        Ok(Session {
            inner: Rc::new(Inner {
                model,
                tokenizer: Arc::new(tokenizer),
                grammars: OnceCell::new(),
                kv: RefCell::new(kv),
                adapter,
                summary,
            }),
        })
    }

    /// The adapter, its binding limit and whether it has `shader-f16`.
    pub fn adapter(&self) -> String {
        self.inner.adapter.describe()
    }

    /// The model's shape and what it holds on the GPU.
    pub fn summary(&self) -> String {
        self.inner.summary.clone()
    }

    /// Token ids of `prompt`: the text as it is, or with `chat` a user turn rendered
    /// with the file's chat template.
    pub fn encode(&self, prompt: &str, chat: bool) -> Result<Vec<u32>, JsError> {
        let tok = &self.inner.tokenizer;
        let ids = match chat {
            true => tok.encode_chat(&[ChatMessage::new("user", prompt)]),
            false => tok.encode_prompt(prompt, false),
        };
        ids.map_err(js_error)
    }

    /// Generates up to `max_tokens` tokens after `prompt` (greedy when `temperature` is
    /// 0), calling `on_token(id, text)` as each arrives, with the text it completes
    /// (stop tokens give none); `on_token` returning `false` stops. With a JSON `schema`
    /// (not empty) the output is a value valid for it: each token sampled under its mask,
    /// the tokens it forces run together; a schema that cannot be enforced is an error.
    /// Resolves to the ids.
    pub fn generate(
        &self,
        prompt: Vec<u32>,
        max_tokens: usize,
        temperature: f32,
        seed: u32,
        schema: Option<String>,
        on_token: Function,
    ) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            let params = GenerateParams {
                max_tokens,
                sampling: SamplingParams {
                    temperature,
                    seed: seed.into(),
                    ..SamplingParams::greedy()
                },
                stop_ids: inner.tokenizer.stop_ids(),
                ..GenerateParams::default()
            };
            let constraint = match schema.as_deref().map(str::trim) {
                None | Some("") => None,
                Some(schema) => Some(inner.constraint(schema)?),
            };
            inner
                .generate(&prompt, params, constraint, &on_token)
                .await
                .map(|ids| Uint32Array::from(ids.as_slice()).into())
                .map_err(Into::into)
        })
    }
}

impl Inner {
    /// The grammar of a JSON schema's text, compiled against the vocabulary.
    fn constraint(&self, schema: &str) -> Result<Constraint, JsError> {
        let schema = serde_json::from_str(schema)
            .map_err(|e| JsError::new(&format!("the JSON schema does not parse: {e}")))?;
        let compiler = match self.grammars.get() {
            Some(c) => c,
            None => {
                let c = GrammarCompiler::new(self.tokenizer.clone()).map_err(js_error)?;
                self.grammars.get_or_init(|| c)
            }
        };
        compiler
            .compile(&Grammar::JsonSchema(schema))
            .map_err(|e| JsError::new(&format!("the schema cannot be enforced: {e}")))
    }

    // The pool's borrow is held across awaits on purpose: it is the lock that keeps one
    // generation at a time; a second one gets an error from `try_borrow_mut`, no panic.
    #[allow(clippy::await_holding_refcell_ref)]
    async fn generate(
        &self,
        prompt: &[u32],
        params: GenerateParams,
        constraint: Option<Constraint>,
        on_token: &Function,
    ) -> Result<Vec<u32>, JsError> {
        let mut kv = self
            .kv
            .try_borrow_mut()
            .map_err(|_| JsError::new("a generation is already running"))?;
        let stop_ids = params.stop_ids.clone();
        let seq = PagedSeq::new(&mut kv);
        let (mut generation, mut logits) =
            Generation::start(&self.model, seq, prompt, params).map_err(js_error)?;
        if let Some(c) = constraint {
            generation = generation.with_constraint(c);
        }
        let mut text = TextStream::default();
        loop {
            generation.pick_async(logits).await.map_err(js_error)?;
            let done = generation.finished();
            let pending = generation.pending().to_vec();
            for (i, &token) in pending.iter().enumerate() {
                let mut piece = match stop_ids.contains(&token) {
                    true => String::new(),
                    false => text.push(self.tokenizer.token_bytes(token).map_err(js_error)?),
                };
                let last = done && i + 1 == pending.len();
                if last {
                    piece.push_str(&text.finish());
                }
                let go_on = on_token
                    .call2(&JsValue::NULL, &token.into(), &piece.into())
                    .map_err(|e| JsError::new(&format!("on_token threw: {e:?}")))?;
                if go_on == JsValue::FALSE || last {
                    // Forced tokens after a stop were never shown.
                    let mut tokens = generation.into_tokens();
                    tokens.truncate(tokens.len() + i + 1 - pending.len());
                    return Ok(tokens);
                }
            }
            logits = generation.advance().map_err(js_error)?;
        }
    }
}
