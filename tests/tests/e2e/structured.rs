//! Constrained decoding on the real model (SmolLM2, CPU backend): every schema of the
//! suite in `tests/schemas/suite.json` generated at temperature 0.7 in one batch, each
//! output checked by an independent validator (Python's `jsonschema`); the schemas the
//! grammar compiler must refuse are refused; a regex and a Lark grammar hold too.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::grammar::{
    tool_call_grammar, CallMode, CallReader, Grammar, GrammarCompiler, ToolSpec,
};
use fornax_engine::kv::{KvCapacity, TierPolicy};
use fornax_engine::model::Model;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::sched::{FinishReason, PolicyKind, SchedulerConfig};
use fornax_engine::tokenizer::{ChatMessage, Tokenizer};
use fornax_engine::{Engine, Event, Request};
use serde_json::{json, Value};

use crate::common::{model_file, run_on};

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
        Counted {
            jobs: self.0,
            force: true,
        }
        .run::<B>(device, info)
        .0
    }
}

/// [`Generate`] with forced tokens on or off; also returns the steps run and the tokens
/// written without sampling.
struct Counted {
    jobs: Vec<(String, Grammar)>,
    force: bool,
}

impl BackendTask for Counted {
    type Output = (Vec<(String, FinishReason)>, u64, u64);

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        _: DeviceInfo,
    ) -> Self::Output {
        let gguf = GgufFile::parse(model_file().bytes()).unwrap();
        let tok = Arc::new(Tokenizer::from_gguf(&gguf).unwrap());
        let compiler = GrammarCompiler::new(tok.clone()).unwrap();
        let model = Model::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).unwrap();
        let kv = model.new_paged_cache(KvCapacity::f32_only(640), TierPolicy::ALL_F32);
        let config = SchedulerConfig {
            max_batch: 64,
            ..SchedulerConfig::default()
        };
        let mut engine = Engine::new(&model, kv, config, PolicyKind::default());
        if !self.force {
            engine = engine.without_forced_tokens();
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
                    temperature: 0.7,
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
        while !engine.is_idle() {
            for event in engine.step().unwrap() {
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
        (outputs, engine.steps, engine.forced_tokens)
    }
}

#[test]
fn every_schema_of_the_suite_gives_valid_json_at_temperature_0_7() {
    let suite = suite();
    let cases: Vec<(String, Value)> = suite["schemas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let prompt = format!("{} Answer in JSON.", c["prompt"].as_str().unwrap());
            (prompt, c["schema"].clone())
        })
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
    let grammar = tool_call_grammar(&tools, CallMode::Several, false);
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
    let run = |force| {
        run_on(
            BackendKind::Cpu,
            Counted {
                jobs: jobs.clone(),
                force,
            },
        )
        .unwrap()
    };
    let (sampled, sampled_steps, none) = run(false);
    let (forced, forced_steps, written) = run(true);
    eprintln!(
        "steps: {sampled_steps} sampling every token, {forced_steps} with {written} forced tokens"
    );
    assert_eq!(none, 0);
    assert!(written > 0 && forced_steps < sampled_steps);
    let mut cases = Vec::new();
    for (text, reason) in sampled.iter().chain(&forced) {
        assert_eq!(*reason, FinishReason::Stop, "{text}");
        let mut reader = CallReader::default();
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
    let verdicts = validate(&cases);
    assert!(
        verdicts.iter().all(Option::is_none),
        "{verdicts:?}: {cases:?}"
    );
}
