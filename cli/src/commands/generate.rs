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
use fornax_engine::sampling::{Adjustments, Sampler, SamplingParams, TokenLogprobs};
use fornax_engine::sched::{PolicyKind, SchedulerConfig};
use fornax_engine::seq_cache::PagedSeq;
use fornax_engine::tokenizer::{ChatMessage, TextStream, Tokenizer};
use fornax_engine::{generate_in, Engine, EngineBackend, Event, GenerateParams, Request};

use fornax_options::kv::KvArgs;
use fornax_options::spec::SpecArgs;
use fornax_options::{load_model, parse, tokenizer, ModelArgs, TemplateArgs};

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
    /// Drop tokens less likely than this times the most likely one (0 = none).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Penalise every token already seen, prompt included (1 = none; 1.1 is common).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Report each token's log-probability and the N most likely tokens' (0 to 20): in
    /// the JSON with --json, else a table on stderr.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..=20))]
    pub logprobs: Option<u8>,
    /// Random seed: the same seed gives the same tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Apply the model's chat template to the prompt.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub template: TemplateArgs,
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

    /// Whether what it asks for needs the engine (grammars, log-probabilities, sampling
    /// settings the plain generation loop does not apply).
    fn engine_only(&self) -> bool {
        let sampling = self.sampling();
        self.json_schema.is_some()
            || self.regex.is_some()
            || self.grammar.is_some()
            || self.logprobs.is_some()
            || Sampler::new(sampling).needs_host()
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

    fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            adjust: Adjustments {
                repetition_penalty: self.repetition_penalty,
                ..Adjustments::default()
            },
        }
    }

    fn params(&self, tok: &Tokenizer) -> GenerateParams {
        let stop_ids = match self.ignore_eos {
            true => Vec::new(),
            false => tok.stop_ids(),
        };
        GenerateParams {
            max_tokens: self.max_tokens,
            sampling: self.sampling(),
            stop_ids,
            ..GenerateParams::default()
        }
    }
}

impl Generate<'_> {
    /// Generates through the engine (one request), with speculative decoding, under
    /// `constraint`, with penalties or log-probabilities; returns the tokens, their
    /// log-probabilities (where asked) and, with speculation, a line of its figures.
    fn through_engine<B: EngineBackend>(
        &self,
        model: &Model<B>,
        prompt: Vec<u32>,
        params: &GenerateParams,
        constraint: Option<Constraint>,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<EngineOutput> {
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
            logprobs: self.args.logprobs.map(usize::from),
            prompt_logprobs: None,
        })?;
        let mut ids = Vec::new();
        let mut logprobs = Vec::new();
        while !engine.is_idle() {
            for event in engine.step()? {
                if let Event::Token {
                    token, logprobs: l, ..
                } = event
                {
                    ids.push(token);
                    logprobs.extend(l.map(|l| (token, l)));
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
        Ok((ids, logprobs, summary))
    }
}

/// Tokens, their log-probabilities where asked, and a line of speculation figures.
type EngineOutput = (Vec<u32>, Vec<(u32, Box<TokenLogprobs>)>, Option<String>);

/// Log-probabilities as JSON: per token its id, text, log-probability and alternatives.
fn logprobs_json(tok: &Tokenizer, entries: &[(u32, Box<TokenLogprobs>)]) -> serde_json::Value {
    let text =
        |t: u32| String::from_utf8_lossy(tok.token_bytes(t).unwrap_or_default()).into_owned();
    entries
        .iter()
        .map(|(t, l)| {
            let top: Vec<_> = l
                .top
                .iter()
                .map(|&(a, lp)| serde_json::json!({"id": a, "text": text(a), "logprob": lp}))
                .collect();
            serde_json::json!({"id": t, "text": text(*t), "logprob": l.logprob, "top": top})
        })
        .collect()
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
        let mut logprobs = Vec::new();
        let ids = if self.args.spec.spec.is_some() || self.args.engine_only() {
            let (ids, l, line) =
                self.through_engine(&model, prompt.clone(), &params, constraint, on_token)?;
            summary = line;
            logprobs = l;
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
            let mut out =
                serde_json::json!({ "prompt_ids": prompt, "generated_ids": ids, "text": text });
            if self.args.logprobs.is_some() {
                out["logprobs"] = logprobs_json(self.tok, &logprobs);
            }
            writeln!(stdout, "{out}")?;
        } else {
            writeln!(stdout, "{}", stream.finish())?;
            for entry in logprobs_json(self.tok, &logprobs)
                .as_array()
                .into_iter()
                .flatten()
            {
                eprintln!("{entry}");
            }
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
    if args.engine_only() && args.kv.contiguous_kv {
        anyhow::bail!(
            "--json-schema, --regex, --grammar, --logprobs, --min-p and --repetition-penalty \
             need the paged KV cache (drop --contiguous-kv)"
        );
    }
    let file = args.model.open()?;
    let gguf = parse(&file)?;
    let mut tok = tokenizer(&gguf)?;
    anyhow::ensure!(
        args.chat || args.template.chat_template_file.is_none(),
        "--chat-template-file is for --chat"
    );
    args.template.apply(&mut tok)?;
    let tok = Arc::new(tok);
    args.model.run_on(Generate {
        args: &args,
        gguf: &gguf,
        tok: &tok,
    })?
}
