//! Published chat templates (Qwen2.5, Qwen3, Llama 3.2; `tests/reference/templates/`)
//! rendered as transformers renders them, tools, calls, results and template variables
//! included (`renders.json`, `scripts/template-references.py`); and tool calls on the
//! family checkpoints written in the syntax each template teaches.

use std::sync::Arc;

use fornax_backends::{BackendKind, BackendTask, DeviceInfo};
use fornax_engine::gguf::GgufFile;
use fornax_engine::grammar::{CallMode, CallReader, CallSyntax, GrammarCompiler, ToolSpec};
use fornax_engine::model::Model;
use fornax_engine::sampling::SamplingParams;
use fornax_engine::tokenizer::{ChatMessage, ChatTemplate, TemplateInputs, Tokenizer};
use fornax_engine::{GenerateParams, Generation};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::common::{read_reference, reference_dir, run_on};
use crate::families::checkpoint;

#[derive(Deserialize)]
struct Renders {
    cases: Vec<Render>,
}

#[derive(Deserialize)]
struct Render {
    template: String,
    messages: Vec<ChatMessage>,
    tools: Option<Value>,
    kwargs: Map<String, Value>,
    bos_token: String,
    eos_token: String,
    text: String,
}

fn template_source(name: &str) -> String {
    let path = reference_dir().join(format!("templates/{name}.jinja"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Each published template renders each conversation (a system message, parallel calls
/// with their arguments as values, tool results, reasoning in `<think>`) with its tools
/// (`tojson` with and without `indent`, non-ASCII, HTML characters, keys in the order
/// given) and variables (`date_string`, `enable_thinking`, `tools_in_user_message`)
/// exactly as transformers renders it.
#[test]
fn published_templates_render_as_transformers() {
    let renders: Renders = read_reference("templates/renders.json");
    assert_eq!(renders.cases.len(), 8);
    for (i, case) in renders.cases.iter().enumerate() {
        let template = ChatTemplate::new(
            template_source(&case.template),
            case.bos_token.clone(),
            case.eos_token.clone(),
        );
        let inputs = TemplateInputs {
            tools: case.tools.as_ref(),
            kwargs: Some(&case.kwargs),
        };
        let ours = template.render_with(&case.messages, true, inputs);
        let ours = ours.unwrap_or_else(|e| panic!("case {i} ({}): {e:#}", case.template));
        assert_eq!(ours, case.text, "case {i} ({})", case.template);
    }
}

/// The checkpoints of two families with their families' tool-calling templates, asked
/// for a call (`tool_choice: required`, greedy): the output is written in the syntax the
/// template teaches (`<tool_call>` blocks for Qwen2.5, Llama 3's JSON object with
/// `parameters`), reads back as calls, and each call's arguments are valid for its tool.
#[test]
fn family_checkpoints_call_tools_in_their_templates_syntax() {
    run_on(BackendKind::Cpu, ToolCalls).unwrap().unwrap();
}

struct ToolCalls;

impl BackendTask for ToolCalls {
    type Output = Result<(), String>;

    fn run<B: fornax_engine::EngineBackend>(
        self,
        device: B::Device,
        _: DeviceInfo,
    ) -> Self::Output {
        let weather = json!({"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false});
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather",
             "description": "The weather in a city.", "parameters": weather}},
            {"type": "function", "function": {"name": "now"}},
        ]);
        let specs = [
            ToolSpec {
                name: "get_weather".into(),
                parameters: weather.clone(),
            },
            ToolSpec {
                name: "now".into(),
                parameters: json!({"type": "object", "properties": {}}),
            },
        ];
        let kwargs: Map<String, Value> =
            serde_json::from_value(json!({"date_string": "05 Dec 2026"})).unwrap();
        for (family, template, syntax, opener) in [
            (
                "qwen2",
                "qwen2.5-instruct",
                CallSyntax::Tagged,
                "<tool_call>\n{\"name\": \"",
            ),
            (
                "llama3",
                "llama3.2-instruct",
                CallSyntax::Llama3,
                "{\"name\": \"",
            ),
        ] {
            let file = checkpoint(&format!("{family}-f32"));
            let gguf = GgufFile::parse(file.bytes()).unwrap();
            let mut tok = Tokenizer::from_gguf(&gguf).unwrap();
            tok.set_chat_template(template_source(template));
            let source = tok.chat_template().unwrap().source();
            assert_eq!(CallSyntax::of_template(source), syntax, "{template}");
            let messages = [ChatMessage::new("user", "What is the weather in Paris?")];
            let inputs = TemplateInputs {
                tools: Some(&tools),
                kwargs: Some(&kwargs),
            };
            let prompt = tok.encode_chat_with(&messages, inputs).unwrap();
            let plain = tok.encode_chat(&messages).unwrap();
            assert!(
                prompt.len() > plain.len() + 40,
                "{family}: the template describes the tools"
            );
            let tok = Arc::new(tok);
            let compiler = GrammarCompiler::new(tok.clone()).unwrap();
            let model = Model::<B>::from_gguf(&gguf, &device, &mut |_, _| {}).unwrap();
            let grammar = syntax.grammar(&specs, CallMode::Several, false);
            let params = GenerateParams {
                max_tokens: 160,
                sampling: SamplingParams::greedy(),
                stop_ids: tok.stop_ids(),
                ..GenerateParams::default()
            };
            let (generation, mut logits) =
                Generation::start(&model, model.new_cache(), &prompt, params).unwrap();
            let mut generation = generation.with_constraint(compiler.compile(&grammar).unwrap());
            loop {
                generation.pick(logits).unwrap();
                if generation.finished() {
                    break;
                }
                logits = generation.advance().unwrap();
            }
            let ids: Vec<u32> = generation
                .into_tokens()
                .into_iter()
                .filter(|t| !tok.stop_ids().contains(t))
                .collect();
            let text = tok.decode(&ids).unwrap();
            eprintln!("{family}: {text:?}");
            if !text.starts_with(opener) {
                return Err(format!("{family}: {text:?} does not open with {opener:?}"));
            }
            let mut reader = CallReader::new(syntax);
            reader.push(&text)?;
            let calls = reader.finish()?;
            if calls.is_empty() || (!syntax.allows_several() && calls.len() != 1) {
                return Err(format!("{family}: {calls:?}"));
            }
            for (name, text) in calls {
                let args: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
                // Spaced as the template's `tojson` renders earlier calls.
                if args.as_object().is_some_and(|o| !o.is_empty()) && !text.contains("\": ") {
                    return Err(format!("{family}: {text} is not spaced as `tojson`"));
                }
                let ok = match name.as_str() {
                    "get_weather" => {
                        args["city"]
                            .as_str()
                            .is_some_and(|c| c.chars().count() <= 12)
                            && ["celsius", "fahrenheit"]
                                .contains(&args["unit"].as_str().unwrap_or(""))
                    }
                    "now" => args.as_object().is_some(),
                    _ => false,
                };
                if !ok {
                    return Err(format!("{family}: {name} {args}"));
                }
            }
        }
        Ok(())
    }
}
