//! A model loaded onto the WebGPU device or into the CPU backend, with its tokenizer and
//! a paged KV pool, and generation over it that reads logits back asynchronously (WebGPU
//! cannot block), optionally under a JSON schema (llguidance, compiled to wasm with the
//! engine).

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
use fornax_engine::{CpuBackend, EngineBackend, GenerateParams, Generation};
use js_sys::{Function, Promise, Uint32Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, JsFuture};

#[cfg(feature = "webgpu")]
use crate::device::{device, WebBackend};

/// Context the demo's KV pool holds (prompt plus generated tokens), at most the model's.
const CONTEXT_TOKENS: usize = 2048;

/// How long the CPU path computes before the worker's events get a turn.
const YIELD_MS: f64 = 50.0;

/// Resolves in the worker's next task, after the messages already waiting (a message
/// to itself: unlike `setTimeout`, not held back to 4 ms when repeated).
async fn next_task() {
    let channel = web_sys::MessageChannel::new().expect("a message channel");
    let promise = Promise::new(&mut |resolve, _| {
        channel.port1().set_onmessage(Some(&resolve));
    });
    let _ = channel.port2().post_message(&JsValue::NULL);
    let _ = JsFuture::from(promise).await;
}

/// A model ready to generate in this tab, on one of the two paths.
#[wasm_bindgen]
pub struct Session {
    path: Path,
}

enum Path {
    #[cfg(feature = "webgpu")]
    WebGpu(Rc<Inner<WebBackend>>),
    Cpu(Rc<Inner<CpuBackend>>),
}

/// Runs `$body` with `$inner` bound to the path's session, whatever its backend.
macro_rules! on_path {
    ($path:expr, |$inner:ident| $body:expr) => {
        match $path {
            #[cfg(feature = "webgpu")]
            Path::WebGpu($inner) => $body,
            Path::Cpu($inner) => $body,
        }
    };
}

struct Inner<B: EngineBackend> {
    model: Model<B>,
    tokenizer: Arc<Tokenizer>,
    /// Built at the first schema (the vocabulary's token trie).
    grammars: OnceCell<GrammarCompiler>,
    /// One sequence at a time; borrowed for the length of a generation.
    kv: RefCell<PagedKv<B>>,
    summary: String,
    /// Whether the worker's events get a turn between tokens: the CPU path computes
    /// without awaiting anything, so the stop button would otherwise wait for the end.
    yields: bool,
}

fn js_error(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

#[wasm_bindgen]
impl Session {
    /// Parses a GGUF file and loads it on `path`: `"webgpu"` (checking that its largest
    /// weight fits one storage binding of the adapter) or `"cpu"` (the CPU kernels, on the
    /// thread pool where the module has one); quantized matrices stay quantized.
    /// `progress(done, total)` is called after each tensor.
    pub async fn load(
        bytes: Vec<u8>,
        progress: Function,
        path: String,
    ) -> Result<Session, JsError> {
        let file = GgufFile::parse(&bytes).map_err(js_error)?;
        let mut report = |done: usize, total: usize| {
            let _ = progress.call2(&JsValue::NULL, &done.into(), &total.into());
        };
        let path = match path.as_str() {
            #[cfg(feature = "webgpu")]
            "webgpu" => {
                let (device, adapter) = device().await;
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
                let model = Model::from_gguf_with(&file, &device, options, &mut report)
                    .map_err(js_error)?;
                Path::WebGpu(Rc::new(Inner::new(&file, model, "on the GPU", false)?))
            }
            "cpu" => {
                let model = Model::from_gguf_with(
                    &file,
                    &Default::default(),
                    LoadOptions::default(),
                    &mut report,
                )
                .map_err(js_error)?;
                Path::Cpu(Rc::new(Inner::new(&file, model, "in memory", true)?))
            }
            other => {
                return Err(JsError::new(&format!(
                    "no path {other:?} in this module (it has: {})",
                    Session::paths()
                )))
            }
        };
        Ok(Session { path })
    }

    /// The path the model is on: `"webgpu"` or `"cpu"`.
    #[wasm_bindgen(getter)]
    pub fn path(&self) -> String {
        match self.path {
            #[cfg(feature = "webgpu")]
            Path::WebGpu(_) => "webgpu".into(),
            Path::Cpu(_) => "cpu".into(),
        }
    }

    /// The paths this module can load on, comma-separated.
    pub fn paths() -> String {
        match cfg!(feature = "webgpu") {
            true => "webgpu, cpu".into(),
            false => "cpu".into(),
        }
    }

    /// The model's shape and what it holds.
    pub fn summary(&self) -> String {
        on_path!(&self.path, |inner| inner.summary.clone())
    }

    /// Token ids of `prompt`: the text as it is, or with `chat` a user turn rendered
    /// with the file's chat template.
    pub fn encode(&self, prompt: &str, chat: bool) -> Result<Vec<u32>, JsError> {
        let tok = on_path!(&self.path, |inner| &inner.tokenizer);
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
        on_path!(&self.path, |inner| {
            inner
                .clone()
                .generate_promise(prompt, max_tokens, temperature, seed, schema, on_token)
        })
    }
}

impl<B: EngineBackend> Inner<B> {
    /// The session around a loaded model: its tokenizer and a KV pool of FP32 blocks for
    /// [`CONTEXT_TOKENS`] (at most the model's context).
    fn new(
        file: &GgufFile<'_>,
        model: Model<B>,
        place: &str,
        yields: bool,
    ) -> Result<Self, JsError> {
        let tokenizer = Tokenizer::from_gguf(file).map_err(js_error)?;
        let dims = model.kv_dims();
        let context = CONTEXT_TOKENS.min(model.config.max_seq_len);
        let blocks = context.div_ceil(BLOCK_TOKENS);
        let kv = model.new_paged_cache(KvCapacity::f32_only(blocks), TierPolicy::ALL_F32);
        let c = &model.config;
        let summary = format!(
            "{} layers, d_model {}, {} heads ({} KV), vocabulary {}; weights {:.1} MB {place}; \
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
        Ok(Self {
            model,
            tokenizer: Arc::new(tokenizer),
            grammars: OnceCell::new(),
            kv: RefCell::new(kv),
            summary,
            yields,
        })
    }

    /// [`Session::generate`] on this path.
    fn generate_promise(
        self: Rc<Self>,
        prompt: Vec<u32>,
        max_tokens: usize,
        temperature: f32,
        seed: u32,
        schema: Option<String>,
        on_token: Function,
    ) -> Promise
    where
        B: 'static,
    {
        let inner = self;
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
        let mut turn = js_sys::Date::now();
        loop {
            if self.yields && js_sys::Date::now() - turn >= YIELD_MS {
                next_task().await;
                turn = js_sys::Date::now();
            }
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
