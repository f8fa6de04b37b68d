//! `fornax generate`: stream a completion (or a chat reply) to stdout.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::grammar::{Constraint, Grammar, GrammarCompiler};
use fornax_engine::model::Model;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{PolicyKind, SchedulerConfig};
use fornax_engine::seq_cache::PagedSeq;
use fornax_engine::tokenizer::{ChatMessage, TextStream, Tokenizer};
use fornax_engine::{generate_in, Engine, EngineBackend, Event, GenerateParams, Request};

use fornax_options::kv::KvArgs;
use fornax_options::spec::SpecArgs;
use fornax_options::{load_model, parse, tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The prompt (a user message with --chat).
    pub prompt: String,
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample among the k most likely tokens (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Random seed: the same seed gives the same tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Apply the model's chat template to the prompt.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Prepend the BOS token even where the file does not ask for one (it does for Gemma,
    /// not for SmolLM2).
    #[arg(long)]
    pub bos: bool,
    /// Keep generating after an end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print only one JSON object at the end: prompt ids, generated ids and text.
    #[arg(long)]
    pub json: bool,
    /// The output must be JSON valid for the JSON schema in this file.
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub json_schema: Option<PathBuf>,
    /// The output must match this regular expression.
    #[arg(long, value_name = "REGEX", group = "constraint")]
    pub regex: Option<String>,
    /// The output must match the Lark grammar in this file (llguidance's dialect).
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub grammar: Option<PathBuf>,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

struct Generate<'a> {
    args: &'a GenerateArgs,
    gguf: &'a GgufFile<'a>,
    tok: &'a Arc<Tokenizer>,
}

impl GenerateArgs {
    fn prompt_ids(&self, tok: &Tokenizer) -> Result<Vec<u32>> {
        let mut ids = if self.chat {
            let mut messages = Vec::new();
            if let Some(system) = &self.system {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", &self.prompt));
            if let Some(name) = tok.chat_template()?.built_in() {
                eprintln!("(the file has no chat template: using the built-in {name} format)");
            }
            tok.encode_chat(&messages)?
        } else {
            tok.encode_prompt(&self.prompt, false)?
        };
        if let Some(bos) = tok.bos_id.filter(|&b| self.bos && ids.first() != Some(&b)) {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// The grammar asked for, read from its file.
    fn grammar(&self) -> Result<Option<Grammar>> {
        let read = |path: &PathBuf| {
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
        };
        Ok(if let Some(path) = &self.json_schema {
            let schema = serde_json::from_str(&read(path)?)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            Some(Grammar::JsonSchema(schema))
        } else if let Some(path) = &self.grammar {
            Some(Grammar::Lark(read(path)?))
        } else {
            self.regex.clone().map(Grammar::Regex)
        })
    }

    fn params(&self, tok: &Tokenizer) -> GenerateParams {
        let stop_ids = match self.ignore_eos {
            true => Vec::new(),
            false => tok.stop_ids(),
        };
        GenerateParams {
            max_tokens: self.max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                seed: self.seed,
            },
            stop_ids,
            ..GenerateParams::default()
        }
    }
}

impl Generate<'_> {
    /// Generates through the engine (one request), with speculative decoding or under
    /// `constraint`; returns the tokens and, with speculation, a line of its figures.
    fn through_engine<B: EngineBackend>(
        &self,
        model: &Model<B>,
        prompt: Vec<u32>,
        params: &GenerateParams,
        constraint: Option<Constraint>,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, Option<String>)> {
        let capacity = self
            .args
            .kv
            .capacity(model.kv_dims(), 1, params.prefill_chunk)?;
        let kv = model.new_paged_cache(capacity, self.args.kv.policy());
        let config = SchedulerConfig {
            max_batch_tokens: params.prefill_chunk,
            max_batch: 1,
            ..SchedulerConfig::default()
        };
        let mut engine = self
            .args
            .spec
            .apply(Engine::new(model, kv, config, PolicyKind::Fcfs));
        let id = engine.submit(Request {
            prompt,
            max_tokens: params.max_tokens,
            qos: 0,
            sampling: params.sampling.clone(),
            stop_ids: params.stop_ids.clone(),
            constraint,
        })?;
        let mut ids = Vec::new();
        while !engine.is_idle() {
            for event in engine.step()? {
                if let Event::Token { token, .. } = event {
                    ids.push(token);
                    if !on_token(token) {
                        engine.cancel(id);
                        break;
                    }
                }
            }
        }
        let s = engine.spec_stats;
        let summary = self.args.spec.spec.is_some().then(|| format!(
            "speculative decoding: {} tokens in {} forward passes; {} drafted, {} accepted ({:.0}%)",
            ids.len(),
            engine.steps,
            s.proposed,
            s.accepted,
            100.0 * s.acceptance_rate()
        ));
        Ok((ids, summary))
    }
}

impl BackendTask for Generate<'_> {
    type Output = Result<()>;

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        _info: DeviceInfo,
    ) -> Result<()> {
        let constraint = match self.args.grammar()? {
            Some(grammar) => {
                let compiler = GrammarCompiler::new(self.tok.clone())?;
                Some(compiler.compile(&grammar)?)
            }
            None => None,
        };
        let model = load_model::<B>(self.gguf, &device, self.args.model.load_options())?;
        let prompt = self.args.prompt_ids(self.tok)?;
        let params = self.args.params(self.tok);
        let mut stream = TextStream::default();
        let mut stdout = std::io::stdout().lock();
        let json = self.args.json;
        let on_token = |id| {
            if !json && !params.stop_ids.contains(&id) {
                let text = stream.push(self.tok.token_bytes(id).unwrap_or_default());
                // A closed stdout (e.g. `| head`) stops generation.
                return write!(stdout, "{text}")
                    .and_then(|_| stdout.flush())
                    .is_ok();
            }
            true
        };
        let mut summary = None;
        let ids = if self.args.spec.spec.is_some() || constraint.is_some() {
            let (ids, line) =
                self.through_engine(&model, prompt.clone(), &params, constraint, on_token)?;
            summary = line;
            ids
        } else if self.args.kv.contiguous_kv {
            generate_in(&model, &mut model.new_cache(), &prompt, &params, on_token)?
        } else {
            let capacity = self
                .args
                .kv
                .capacity(model.kv_dims(), 1, params.prefill_chunk)?;
            let mut kv = model.new_paged_cache(capacity, self.args.kv.policy());
            let mut seq = PagedSeq::new(&mut kv);
            let ids = generate_in(&model, &mut seq, &prompt, &params, on_token)?;
            drop(seq);
            ids
        };
        if json {
            let text = self.tok.decode(&ids)?;
            let out =
                serde_json::json!({ "prompt_ids": prompt, "generated_ids": ids, "text": text });
            writeln!(stdout, "{out}")?;
        } else {
            writeln!(stdout, "{}", stream.finish())?;
        }
        if let Some(line) = summary {
            eprintln!("{line}");
        }
        Ok(())
    }
}

pub fn run(args: GenerateArgs) -> Result<()> {
    if args.spec.spec.is_some() && args.kv.contiguous_kv {
        anyhow::bail!("--spec needs the paged KV cache (drop --contiguous-kv)");
    }
    let constrained = args.json_schema.is_some() || args.regex.is_some() || args.grammar.is_some();
    if constrained && args.kv.contiguous_kv {
        anyhow::bail!(
            "--json-schema, --regex and --grammar need the paged KV cache (drop --contiguous-kv)"
        );
    }
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let tok = Arc::new(tokenizer(&gguf)?);
    args.model.run_on(Generate {
        args: &args,
        gguf: &gguf,
        tok: &tok,
    })?
}
