//! Constrained decoding on the real model (SmolLM2, CPU backend): every schema of the
//! suite in `tests/schemas/suite.json` generated at temperature 0.7 in one batch, each
//! output checked by an independent validator (Python's `jsonschema`); the schemas the
//! grammar compiler must refuse are refused; a regex and a Lark grammar hold too; one
//! sequence's `Generation` (the browser's loop) under a grammar gives the engine's tokens.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::grammar::{
    CallMode, CallReader, CallSyntax, Grammar, GrammarCompiler, ToolSpec,
};
use fornax_engine::kv::{KvCapacity, TierPolicy};
use fornax_engine::model::Model;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{FinishReason, PolicyKind, SchedulerConfig};
use fornax_engine::spec::{ProposerKind, SpecConfig, SpecStats};
use fornax_engine::tokenizer::{ChatMessage, Tokenizer};
use fornax_engine::{Engine, Event, GenerateParams, Generation, Request};
use serde_json::{json, Value};

use crate::common::{f32_engine, model_file, run_on};
use fornax_engine::device_counts::counted;

fn suite() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/suite.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Each `(schema, output)` checked by Python's `jsonschema` (formats included): `None`
/// where the output parses and validates, else why not.
fn validate(cases: &[(Value, String)]) -> Vec<Option<String>> {
    let script = r#"
import json, sys
import jsonschema
out = []
for schema, text in json.load(sys.stdin):
    try:
        value = json.loads(text)
        cls = jsonschema.validators.validator_for(schema)
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)
        out.append(None)
    except Exception as e:
        out.append(f"{type(e).__name__}: {str(e)[:300]}")
json.dump(out, sys.stdout)
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .env(
            "PYTHONPATH",
            std::env::var("FORNAX_PYTHONPATH").unwrap_or_default(),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (scripts/test.sh installs jsonschema)");
    let input = serde_json::to_vec(cases).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the validator failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The real model, its tokenizer and a grammar compiler for its vocabulary.
fn load<B: fornax_engine::EngineBackend>(
    device: &B::Device,
) -> (Arc<Tokenizer>, GrammarCompiler, Model<B>) {
    let gguf = GgufFile::parse(model_file().bytes()).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&gguf).unwrap());
    let compiler = GrammarCompiler::new(tok.clone()).unwrap();
    let model = Model::<B>::from_gguf(&gguf, device, &mut |_, _| {}).unwrap();
    (tok, compiler, model)
}

/// A case of the suite: its prompt asking for JSON, and its schema.
fn suite_case(case: &Value) -> (String, Value) {
    let prompt = format!("{} Answer in JSON.", case["prompt"].as_str().unwrap());
    (prompt, case["schema"].clone())
}

/// Checks that every `(schema, output)` parses and validates ([`validate`]).
fn assert_all_valid(cases: &[(Value, String)]) {
    let verdicts = validate(cases);
    assert!(
        verdicts.iter().all(Option::is_none),
        "{verdicts:?}: {cases:?}"
    );
}

/// Generates one output per `(prompt, grammar)` in one batch at temperature 0.7; returns
/// each output's text and why it ended.
struct Generate(Vec<(String, Grammar)>);

impl BackendTask for Generate {
    type Output = Vec<(String, FinishReason)>;

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        info: DeviceInfo,
    ) -> Self::Output {
        Counted::sampled(self.0, true)
            .run::<B>(device, info)
            .outputs
    }
}

/// [`Generate`] with forced tokens on or off, at a temperature, with speculation or
/// without, masks on the device or read back; also counts what the run took.
struct Counted {
    jobs: Vec<(String, Grammar)>,
    force: bool,
    temperature: f32,
    spec: Option<SpecConfig>,
    host_masks: bool,
}

/// What a [`Counted`] run gave.
struct Counts {
    /// Each output's text and why it ended.
    outputs: Vec<(String, FinishReason)>,
    steps: u64,
    /// Tokens written without sampling.
    forced: u64,
    spec: SpecStats,
    /// Bytes read back from the device by the steps.
    read_bytes: u64,
}

impl Counted {
    /// At temperature 0.7, without speculation.
    fn sampled(jobs: Vec<(String, Grammar)>, force: bool) -> Self {
        Self {
            jobs,
            force,
            temperature: 0.7,
            spec: None,
            host_masks: false,
        }
    }
}

impl BackendTask for Counted {
    type Output = Counts;

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        _: DeviceInfo,
    ) -> Self::Output {
        let (tok, compiler, model) = load::<B>(&device);
        let kv = model.new_paged_cache(KvCapacity::f32_only(640), TierPolicy::ALL_F32);
        let config = SchedulerConfig {
            max_batch: 64,
            ..SchedulerConfig::default()
        };
        let mut engine = Engine::new(&model, kv, config, PolicyKind::default());
        if !self.force {
            engine = engine.without_forced_tokens();
        }
        if let Some(spec) = self.spec {
            engine = engine.with_speculation(spec);
        }
        if self.host_masks {
            engine = engine.with_host_masks();
        }
        let mut ids = std::collections::HashMap::new();
        for (i, (prompt, grammar)) in self.jobs.iter().enumerate() {
            let prompt = tok
                .encode_chat(&[ChatMessage::new("user", prompt)])
                .unwrap();
            let request = Request {
                prompt,
                max_tokens: 256,
                qos: 0,
                sampling: SamplingParams {
                    temperature: self.temperature,
                    seed: i as u64,
                    ..SamplingParams::greedy()
                },
                stop_ids: tok.stop_ids(),
                constraint: Some(compiler.compile(grammar).unwrap()),
                logprobs: None,
                prompt_logprobs: None,
            };
            ids.insert(engine.submit(request).unwrap(), i);
        }
        let mut tokens = vec![Vec::new(); ids.len()];
        let mut reasons = vec![None; ids.len()];
        let mut read_bytes = 0;
        while !engine.is_idle() {
            let (events, counts) = counted(|| engine.step().unwrap());
            read_bytes += counts.read_bytes;
            for event in events {
                match event {
                    Event::Token { id, token, .. } => tokens[ids[&id]].push(token),
                    Event::PromptLogprobs { .. } => {}
                    Event::Finished { id, reason } => reasons[ids[&id]] = Some(reason),
                }
            }
        }
        let stop = tok.stop_ids();
        let outputs = tokens
            .into_iter()
            .zip(reasons)
            .map(|(t, r)| {
                let t: Vec<u32> = t.into_iter().filter(|t| !stop.contains(t)).collect();
                (tok.decode(&t).unwrap(), r.expect("finished"))
            })
            .collect();
        Counts {
            outputs,
            steps: engine.steps,
            forced: engine.forced_tokens,
            spec: engine.spec_stats,
            read_bytes,
        }
    }
}

#[test]
fn every_schema_of_the_suite_gives_valid_json_at_temperature_0_7() {
    let suite = suite();
    let cases: Vec<(String, Value)> = suite["schemas"]
        .as_array()
        .unwrap()
        .iter()
        .map(suite_case)
        .collect();
    assert!(cases.len() >= 40);
    let jobs = cases
        .iter()
        .map(|(p, s)| (p.clone(), Grammar::JsonSchema(s.clone())))
        .collect();
    let outputs = run_on(BackendKind::Cpu, Generate(jobs)).unwrap();
    let checked: Vec<(Value, String)> = cases
        .iter()
        .zip(&outputs)
        .map(|((_, schema), (text, _))| (schema.clone(), text.clone()))
        .collect();
    let verdicts = validate(&checked);
    let mut bad = Vec::new();
    for ((case, (text, reason)), verdict) in suite["schemas"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&outputs)
        .zip(&verdicts)
    {
        eprintln!("{}: {text}", case["name"]);
        if *reason != FinishReason::Stop || verdict.is_some() {
            bad.push(format!("{}: {reason:?} {verdict:?}: {text}", case["name"]));
        }
    }
    assert!(
        bad.is_empty(),
        "outputs that do not validate:\n{}",
        bad.join("\n")
    );
}

#[test]
fn schemas_that_cannot_compile_are_refused_by_name() {
    let gguf = GgufFile::parse(model_file().bytes()).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&gguf).unwrap());
    let compiler = GrammarCompiler::new(tok).unwrap();
    let suite = suite();
    let refused = suite["refused"].as_array().unwrap();
    for case in refused {
        let got = compiler.compile(&Grammar::JsonSchema(case["schema"].clone()));
        let err = got.expect_err(case["name"].as_str().unwrap());
        eprintln!("{}: {err}", case["name"]);
    }
    // A schema of the suite compiles (the refusals are the schemas', not the compiler's).
    let ok = &suite["schemas"][0]["schema"];
    assert!(compiler.compile(&Grammar::JsonSchema(ok.clone())).is_ok());
}

#[test]
fn a_regex_and_a_lark_grammar_hold_the_output() {
    let jobs = vec![
        (
            "Give a product code.".to_string(),
            Grammar::Regex("[A-Z]{3}-[0-9]{4}".into()),
        ),
        (
            "Is the sky blue?".to_string(),
            Grammar::Lark(r#"start: ("yes" | "no") ", because " /[a-z ]{1,30}/ ".""#.into()),
        ),
        ("Tell me about cats.".to_string(), Grammar::JsonObject),
    ];
    let out = run_on(BackendKind::Cpu, Generate(jobs)).unwrap();
    let (code, _) = &out[0];
    let b = code.as_bytes();
    assert!(
        b.len() == 8
            && b[..3].iter().all(u8::is_ascii_uppercase)
            && b[3] == b'-'
            && b[4..].iter().all(u8::is_ascii_digit),
        "{code:?}"
    );
    let (answer, _) = &out[1];
    let rest = answer
        .strip_prefix("yes, because ")
        .or_else(|| answer.strip_prefix("no, because "))
        .unwrap_or_else(|| panic!("{answer:?}"));
    let body = rest
        .strip_suffix('.')
        .unwrap_or_else(|| panic!("{answer:?}"));
    assert!(body.chars().all(|c| c.is_ascii_lowercase() || c == ' ') && !body.is_empty());
    let (object, reason) = &out[2];
    let value: Value = serde_json::from_str(object).unwrap_or_else(|e| panic!("{e}: {object}"));
    assert!(value.is_object(), "{object}");
    assert_eq!(*reason, FinishReason::Stop);
    let _ = json!(null);
}

/// Tool calls (the server's grammar: a list of calls, each tool's parameters as JSON) at
/// temperature 0.7, with the grammar's forced tokens written without sampling and
/// without: every output is a complete list of calls whose arguments validate, and
/// forcing writes tokens without sampling and takes fewer steps.
#[test]
fn forced_tokens_take_fewer_steps_and_keep_tool_calls_valid() {
    let weather = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": false});
    let clock = json!({"type": "object", "properties": {
        "timezone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
        "required": ["timezone"], "additionalProperties": false});
    let tools = [
        ToolSpec {
            name: "get_weather".into(),
            parameters: weather.clone(),
        },
        ToolSpec {
            name: "get_time".into(),
            parameters: clock.clone(),
        },
    ];
    let grammar = CallSyntax::List.grammar(&tools, CallMode::Several, false);
    let prompts = [
        "What is the weather in Paris?",
        "What time is it in Tokyo?",
        "Weather and time in Rome, please.",
        "Is it cold in Oslo?",
    ];
    let jobs: Vec<(String, Grammar)> = prompts
        .iter()
        .map(|p| (p.to_string(), grammar.clone()))
        .collect();
    let run = |force| run_on(BackendKind::Cpu, Counted::sampled(jobs.clone(), force)).unwrap();
    let (sampled, forced) = (run(false), run(true));
    let (sampled_steps, none) = (sampled.steps, sampled.forced);
    let (forced_steps, written) = (forced.steps, forced.forced);
    let (sampled, forced) = (sampled.outputs, forced.outputs);
    eprintln!(
        "steps: {sampled_steps} sampling every token, {forced_steps} with {written} forced tokens"
    );
    assert_eq!(none, 0);
    assert!(written > 0 && forced_steps < sampled_steps);
    let mut cases = Vec::new();
    for (text, reason) in sampled.iter().chain(&forced) {
        assert_eq!(*reason, FinishReason::Stop, "{text}");
        let mut reader = CallReader::new(CallSyntax::List);
        reader.push(text).unwrap();
        for (name, args) in reader.finish().unwrap() {
            let schema = if name == "get_weather" {
                &weather
            } else {
                &clock
            };
            cases.push((schema.clone(), args));
        }
    }
    assert_all_valid(&cases);
}

/// One prompt under one schema, greedy and at temperature 0.7 (two seeds): the tokens of
/// a single-sequence [`Generation`] (contiguous cache, the browser demo's loop) and the
/// number of passes it ran, beside the engine's tokens for the same requests.
struct Single(Value);

impl BackendTask for Single {
    type Output = Vec<(Vec<u32>, usize, Vec<u32>, String)>;

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        _: DeviceInfo,
    ) -> Self::Output {
        let (tok, compiler, model) = load::<B>(&device);
        let prompt = tok
            .encode_prompt("The capital of France is", false)
            .unwrap();
        let grammar = Grammar::JsonSchema(self.0);
        [(0.0, 0), (0.7, 1), (0.7, 2)]
            .into_iter()
            .map(|(temperature, seed)| {
                let sampling = SamplingParams {
                    temperature,
                    seed,
                    ..SamplingParams::greedy()
                };
                let params = GenerateParams {
                    max_tokens: 64,
                    sampling: sampling.clone(),
                    stop_ids: tok.stop_ids(),
                    ..GenerateParams::default()
                };
                let constraint = compiler.compile(&grammar).unwrap();
                let (generation, mut logits) =
                    Generation::start(&model, model.new_cache(), &prompt, params).unwrap();
                let mut generation = generation.with_constraint(constraint);
                let mut passes = 1;
                loop {
                    generation.pick(logits).unwrap();
                    if generation.finished() {
                        break;
                    }
                    logits = generation.advance().unwrap();
                    passes += 1;
                }
                let single = generation.into_tokens();
                let mut engine = f32_engine(&model, 64);
                engine
                    .submit(Request {
                        prompt: prompt.clone(),
                        max_tokens: 64,
                        qos: 0,
                        sampling,
                        stop_ids: tok.stop_ids(),
                        constraint: Some(compiler.compile(&grammar).unwrap()),
                        logprobs: None,
                        prompt_logprobs: None,
                    })
                    .unwrap();
                let mut batched = Vec::new();
                while !engine.is_idle() {
                    for event in engine.step().unwrap() {
                        if let Event::Token { token, .. } = event {
                            batched.push(token);
                        }
                    }
                }
                let text: Vec<u32> = single
                    .iter()
                    .copied()
                    .filter(|t| !tok.stop_ids().contains(t))
                    .collect();
                let text = tok.decode(&text).unwrap();
                (single, passes, batched, text)
            })
            .collect()
    }
}

/// A single-sequence generation under a JSON schema, greedy and sampled: its tokens equal
/// the engine's (the same draws: one per token, forced ones included), the tokens the
/// grammar forces run together (fewer passes than tokens), and the output validates.
#[test]
fn a_single_generation_under_a_schema_gives_the_engines_tokens() {
    let schema = json!({"type": "object", "properties": {
        "capital": {"type": "string", "maxLength": 16},
        "country": {"type": "string", "enum": ["France", "Italy", "Spain"]},
        "fact": {"type": "string", "maxLength": 40}},
        "required": ["capital", "country", "fact"], "additionalProperties": false});
    let runs = run_on(BackendKind::Cpu, Single(schema.clone())).unwrap();
    let mut cases = Vec::new();
    for (single, passes, batched, text) in runs {
        eprintln!("{} tokens in {passes} passes: {text}", single.len());
        assert_eq!(single, batched, "{text}");
        assert!(
            passes < single.len(),
            "{passes} passes for {}",
            single.len()
        );
        cases.push((schema.clone(), text));
    }
    assert_all_valid(&cases);
}

/// Speculative decoding under grammars (n-gram drafts from the context): drafts are cut
/// where the grammar refuses a token and each drafted row is sampled under the mask after
/// the draft before it, so greedy outputs (4 schemas of the suite, and 2 prompts whose
/// answer copies their text, where most drafts are accepted) equal those without speculation
/// token for token; at temperature 0.7 every output still validates.
#[test]
fn speculation_under_grammars_keeps_greedy_outputs_and_valid_json() {
    let suite = suite();
    let note = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "note": {"type": "string", "maxLength": 120}},
        "required": ["city", "note"], "additionalProperties": false});
    let copies = [
        "Copy this note exactly, as JSON with the city: Paris. The quick brown fox jumps over \
         the lazy dog near the old river bank.",
        "Copy this note exactly, as JSON with the city: Rome. She sells sea shells by the sea \
         shore, and the shells she sells are surely sea shells.",
    ];
    // Python's `multipleOf` check fails decimals such as 1.11 for 0.01 (float division).
    let cases: Vec<(String, Value)> = suite["schemas"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["schema"].to_string().contains("multipleOf"))
        .take(4)
        .map(suite_case)
        .chain(copies.iter().map(|p| (p.to_string(), note.clone())))
        .collect();
    let jobs: Vec<(String, Grammar)> = cases
        .iter()
        .map(|(p, s)| (p.clone(), Grammar::JsonSchema(s.clone())))
        .collect();
    let spec = SpecConfig {
        proposer: ProposerKind::Ngram,
        tokens: 4,
        draft_layers: 0,
    };
    let run = |temperature, spec| {
        run_on(
            BackendKind::Cpu,
            Counted {
                jobs: jobs.clone(),
                force: true,
                temperature,
                spec,
                host_masks: false,
            },
        )
        .unwrap()
    };
    let plain = run(0.0, None);
    let (plain, plain_steps) = (plain.outputs, plain.steps);
    let drafted = run(0.0, Some(spec));
    let (drafted, steps, stats) = (drafted.outputs, drafted.steps, drafted.spec);
    eprintln!(
        "greedy: {plain_steps} steps without speculation, {steps} with; {} drafted, {} accepted",
        stats.proposed, stats.accepted
    );
    assert!(stats.proposed > 0 && stats.accepted > 0, "{stats:?}");
    for (a, b) in plain.iter().zip(&drafted) {
        assert_eq!(a, b);
    }
    let sampled = run(0.7, Some(spec));
    let (sampled, stats) = (sampled.outputs, sampled.spec);
    eprintln!(
        "temperature 0.7: {} drafted, {} accepted",
        stats.proposed, stats.accepted
    );
    let checked: Vec<(Value, String)> = cases
        .iter()
        .cycle()
        .zip(sampled.iter().chain(&drafted))
        .map(|((_, schema), (text, _))| (schema.clone(), text.clone()))
        .collect();
    assert_all_valid(&checked);
}

/// On lavapipe, greedy outputs under a regex and a JSON schema: with the masks sent to
/// the device packed (a bit a token) the tokens equal those of masking rows read back,
/// and the steps read back ids only, not rows of 49,152 logits.
#[test]
fn masks_on_the_device_keep_the_tokens_and_read_back_ids_only() {
    let capital = json!({"type": "object", "properties": {
        "capital": {"type": "string", "maxLength": 16}},
        "required": ["capital"], "additionalProperties": false});
    let jobs = vec![
        (
            "Give a product code.".to_string(),
            Grammar::Regex("[A-Z]{3}-[0-9]{4}".into()),
        ),
        (
            "What is the capital of France? Answer in JSON.".to_string(),
            Grammar::JsonSchema(capital),
        ),
    ];
    let run = |host_masks| {
        let counted = Counted {
            jobs: jobs.clone(),
            force: true,
            temperature: 0.0,
            spec: None,
            host_masks,
        };
        run_on(BackendKind::Wgpu, counted).expect("a wgpu adapter")
    };
    let (host, device) = (run(true), run(false));
    eprintln!(
        "{} steps: {} bytes read back with the masks on the device, {} with rows read back",
        device.steps, device.read_bytes, host.read_bytes
    );
    assert_eq!(device.outputs, host.outputs);
    assert!(device.outputs.iter().all(|(_, r)| *r == FinishReason::Stop));
    // Ids only: at most 8 bytes a sampled row (one row per request a step).
    assert!(
        device.read_bytes <= device.steps * 8 * jobs.len() as u64,
        "{} bytes in {} steps",
        device.read_bytes,
        device.steps
    );
    assert!(host.read_bytes > device.steps * 49_152 * 4);
}
