//! `tools`, `tool_choice` and `parallel_tool_calls` on the chat route: the calls the model
//! may make become a grammar in the syntax its template teaches ([`CallSyntax`]: Qwen's
//! `<tool_call>` blocks, Llama 3's JSON, else a JSON list; each call's arguments valid
//! for its tool's schema), the tools are described to the model (through the template's
//! `tools`, or a system message where the template has none), earlier calls and results
//! go to the template as it reads them, and the output is read back as OpenAI's
//! `tool_calls`, whole or as streamed deltas whose argument pieces join into the
//! arguments' JSON.

use fornax_engine::grammar::{CallDelta, CallMode, CallReader, CallSyntax, Grammar, ToolSpec};
use fornax_engine::tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{Message, ToolCallMessage};
use crate::error::ApiError;

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Function,
}

/// A tool's function.
#[derive(Debug, Clone, Deserialize)]
pub struct Function {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
    /// Fornax always enforces the parameters' schema whole.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `tool_choice`.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}"
)]
pub enum ToolChoice {
    Mode(String),
    Named { function: NamedFunction },
}

/// The function `tool_choice` names.
#[derive(Debug, Clone, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// What a request's tools ask of the generation.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The grammar of the output.
    pub grammar: Grammar,
    /// How the calls are written.
    pub syntax: CallSyntax,
    /// The tools as the template receives them.
    pub tools: Value,
    /// A system message describing the tools, where the template does not read them.
    pub system: Option<String>,
}

/// The plan for `tools` under `choice` (default `auto`) and `parallel` (default true);
/// `None` when no tool may be called. `template_reads_tools`: the chat template
/// describes the tools itself, and teaches `syntax`.
pub fn plan(
    tools: Option<Vec<Tool>>,
    choice: Option<ToolChoice>,
    parallel: Option<bool>,
    template_reads_tools: bool,
    syntax: CallSyntax,
) -> Result<Option<ToolPlan>, ApiError> {
    // A template without tools teaches no syntax: the system message teaches the list.
    let syntax = match template_reads_tools {
        true => syntax,
        false => CallSyntax::List,
    };
    let tools = tools.unwrap_or_default();
    let bad_choice = |m: String| ApiError::invalid_param("tool_choice", m);
    let (named, text_allowed) = match &choice {
        None => (None, true),
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => return Ok(None),
            "auto" => (None, true),
            "required" => (None, false),
            other => {
                return Err(bad_choice(format!(
                    "tool_choice `{other}` is not one of none, auto, required or a named function"
                )))
            }
        },
        Some(ToolChoice::Named { function }) => (Some(function.name.clone()), false),
    };
    if tools.is_empty() {
        return match (named, text_allowed) {
            (None, true) => Ok(None),
            _ => Err(bad_choice(
                "tool_choice asks for a tool call but the request has no tools".into(),
            )),
        };
    }
    let mut specs: Vec<ToolSpec> = Vec::new();
    for t in &tools {
        let f = &t.function;
        if t.kind != "function" {
            return Err(ApiError::invalid_param(
                "tools",
                format!(
                    "tools of type `{}` are not supported (only function)",
                    t.kind
                ),
            ));
        }
        let name_ok = !f.name.is_empty()
            && f.name.len() <= 64
            && f.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok || specs.iter().any(|s| s.name == f.name) {
            return Err(ApiError::invalid_param(
                "tools",
                format!(
                    "tool name `{}` must be 1-64 letters, digits, `_` or `-`, and unique",
                    f.name
                ),
            ));
        }
        let parameters = match &f.parameters {
            None => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "tools",
                    format!(
                        "the parameters of `{}` must be a JSON schema object",
                        f.name
                    ),
                ))
            }
        };
        specs.push(ToolSpec {
            name: f.name.clone(),
            parameters,
        });
    }
    if let Some(name) = &named {
        specs.retain(|s| &s.name == name);
        if specs.is_empty() {
            return Err(bad_choice(format!(
                "tool_choice names no tool of the request: `{name}`"
            )));
        }
    }
    let mode = match (parallel.unwrap_or(true), &named) {
        (true, None) => CallMode::Several,
        _ => CallMode::One,
    };
    if parallel == Some(true) && !syntax.allows_several() && named.is_none() {
        return Err(ApiError::invalid_param(
            "parallel_tool_calls",
            "this model's chat template makes one call a turn: send parallel_tool_calls \
             false or leave it out",
        ));
    }
    // As the client wrote them (fields it left out stay out).
    let described: Vec<Value> = tools
        .iter()
        .map(|t| {
            let f = &t.function;
            let mut function = json!({"name": f.name});
            if let Some(d) = &f.description {
                function["description"] = json!(d);
            }
            if let Some(p) = &f.parameters {
                function["parameters"] = p.clone();
            }
            json!({"type": "function", "function": function})
        })
        .collect();
    let system = (!template_reads_tools).then(|| describe(&tools));
    Ok(Some(ToolPlan {
        grammar: syntax.grammar(&specs, mode, text_allowed),
        syntax,
        tools: Value::Array(described),
        system,
    }))
}

/// The system message that tells a model whose template has no tools how to call them.
fn describe(tools: &[Tool]) -> String {
    let mut s = String::from(
        "You can call functions. To call them, answer with only a JSON list of calls: \
         [{\"name\": \"function_name\", \"arguments\": {...}}]. The functions:\n",
    );
    for t in tools {
        let f = &t.function;
        let params = f.parameters.clone().unwrap_or(json!({}));
        s.push_str(&format!("- {}", f.name));
        if let Some(d) = &f.description {
            s.push_str(&format!(": {d}"));
        }
        s.push_str(&format!(" Arguments: {params}\n"));
    }
    s
}

/// The conversation as the template renders it, `system` first. Where the template reads
/// tools, it gets assistant calls (arguments as JSON values) and `tool` turns as it reads
/// them; otherwise calls are written as the list syntax has the model write them and a
/// run of tool results becomes one user turn.
pub fn conversation(
    messages: &[Message],
    system: Option<&str>,
    template_reads_tools: bool,
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out: Vec<ChatMessage> = Vec::new();
    // Whether the last turn written is a run of tool results (as a user turn).
    let mut in_results = false;
    for m in messages {
        let text = m.text()?;
        let was_in_results = std::mem::replace(&mut in_results, false);
        if let Some(calls) = m.tool_calls.as_deref().filter(|c| !c.is_empty()) {
            let mut turn = ChatMessage::new(&m.role, &text);
            match template_reads_tools {
                true => turn.tool_calls = Some(template_calls(calls)),
                false => turn.content = CallSyntax::List.write(&written_calls(calls)),
            }
            out.push(turn);
            continue;
        }
        if m.role == "tool" && !template_reads_tools {
            let id = m.tool_call_id.as_deref().unwrap_or("a call");
            let line = format!("Result of {id}: {text}");
            match out.last_mut().filter(|_| was_in_results) {
                Some(last) => {
                    last.content.push('\n');
                    last.content.push_str(&line);
                }
                None => out.push(ChatMessage::new("user", &line)),
            }
            in_results = true;
            continue;
        }
        let mut turn = ChatMessage::new(&m.role, &text);
        turn.tool_call_id = m.tool_call_id.clone();
        out.push(turn);
    }
    if let Some(system) = system {
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{system}", first.content);
            }
            _ => out.insert(0, ChatMessage::new("system", system)),
        }
    }
    Ok(out)
}

/// Earlier calls' names and arguments as JSON text (arguments that are not JSON written
/// as a JSON string).
fn written_calls(calls: &[ToolCallMessage]) -> Vec<(String, String)> {
    calls
        .iter()
        .map(|c| {
            (
                c.function.name.clone(),
                arguments(&c.function.arguments).to_string(),
            )
        })
        .collect()
}

/// Earlier calls as templates read them (transformers' convention: arguments a value).
fn template_calls(calls: &[ToolCallMessage]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let id = c.id.clone().unwrap_or_else(|| format!("call_{i}"));
            json!({"id": id, "type": "function", "function": {
                "name": c.function.name, "arguments": arguments(&c.function.arguments)}})
        })
        .collect()
}

/// A call's arguments (JSON text) as a value: a string where they are not JSON.
fn arguments(text: &str) -> Value {
    serde_json::from_str::<Value>(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// The id of call `index` of response `response`.
fn call_id(response: &str, index: usize) -> String {
    format!("call_{response}_{index}")
}

/// Whole calls as the message's `tool_calls`.
pub fn tool_calls(response: &str, calls: &[(String, String)]) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, (name, arguments))| {
            json!({"id": call_id(response, i), "type": "function",
                   "function": {"name": name, "arguments": arguments}})
        })
        .collect()
}

/// Reads calls whole from a finished output: `None` where it is text.
pub fn read_calls(syntax: CallSyntax, text: &str) -> Option<Result<Vec<(String, String)>, String>> {
    if syntax.starts_calls(text) != Some(true) {
        return None;
    }
    let mut reader = CallReader::new(syntax);
    Some(reader.push(text).and_then(|_| reader.finish()))
}

/// A streamed output of a request with tools: text until it shows it is calls, then the
/// calls' deltas.
#[derive(Debug, Clone)]
pub struct CallStream {
    syntax: CallSyntax,
    /// Text held until its first character shows what it is.
    held: String,
    /// Whether the output is calls, once known.
    calls: Option<bool>,
    reader: CallReader,
}

/// What a streamed piece becomes.
#[derive(Debug, PartialEq)]
pub enum Streamed {
    /// Text for `delta.content`.
    Text(String),
    /// `delta.tool_calls` entries.
    Calls(Vec<Value>),
}

impl CallStream {
    /// A stream whose calls are written in `syntax`.
    pub fn new(syntax: CallSyntax) -> Self {
        Self {
            syntax,
            held: String::new(),
            calls: None,
            reader: CallReader::new(syntax),
        }
    }

    /// How the calls are written.
    pub fn syntax(&self) -> CallSyntax {
        self.syntax
    }

    /// Takes a piece of the output; returns what to stream (nothing while undecided).
    pub fn push(&mut self, response: &str, piece: &str) -> Result<Option<Streamed>, String> {
        if self.calls.is_none() {
            self.held.push_str(piece);
            self.calls = self.syntax.starts_calls(&self.held);
            return match self.calls {
                None => Ok(None),
                Some(false) => Ok(Some(Streamed::Text(std::mem::take(&mut self.held)))),
                Some(true) => {
                    let held = std::mem::take(&mut self.held);
                    self.deltas(response, &held)
                }
            };
        }
        match self.calls {
            Some(true) => self.deltas(response, piece),
            _ => Ok(Some(Streamed::Text(piece.to_string()))),
        }
    }

    /// The calls' steps in `piece` as `delta.tool_calls` entries, one a call (OpenAI's
    /// shape: a call's start and its first arguments in one entry).
    fn deltas(&mut self, response: &str, piece: &str) -> Result<Option<Streamed>, String> {
        let mut deltas: Vec<Value> = Vec::new();
        for d in self.reader.push(piece)? {
            match d {
                CallDelta::Start { index, name } => deltas.push(json!({
                    "index": index, "id": call_id(response, index), "type": "function",
                    "function": {"name": name, "arguments": ""},
                })),
                CallDelta::Arguments { index, text } => match deltas.last_mut() {
                    Some(last) if last["index"] == index => {
                        let so_far = last["function"]["arguments"].as_str().unwrap_or("");
                        last["function"]["arguments"] = json!(format!("{so_far}{text}"));
                    }
                    _ => deltas.push(json!({"index": index, "function": {"arguments": text}})),
                },
            }
        }
        Ok((!deltas.is_empty()).then_some(Streamed::Calls(deltas)))
    }

    /// Ends the output: text still held, and whether it was a complete list of calls.
    pub fn finish(self) -> (String, bool) {
        let complete = self.calls == Some(true) && self.reader.finish().is_ok();
        (self.held, complete)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: CallSyntax = CallSyntax::List;

    fn tools(v: Value) -> Option<Vec<Tool>> {
        serde_json::from_value(v).unwrap()
    }

    fn choice(v: Value) -> Option<ToolChoice> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn choices_become_grammars_and_bad_ones_are_refused_by_name() {
        let two = json!([
            {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "b"}},
        ]);
        let lark = |p: ToolPlan| match p.grammar {
            Grammar::Lark(l) => l,
            g => panic!("{g:?}"),
        };
        let auto = plan(tools(two.clone()), None, None, false, LIST)
            .unwrap()
            .unwrap();
        assert!(auto.system.as_deref().unwrap().contains("- a Arguments"));
        assert!(lark(auto).contains("start: calls | text"));
        let named = plan(
            tools(two.clone()),
            choice(json!({"type": "function", "function": {"name": "b"}})),
            None,
            true,
            LIST,
        )
        .unwrap()
        .unwrap();
        assert!(named.system.is_none());
        let named = lark(named);
        assert!(
            named.contains("\\\"b\\\"") && !named.contains("\\\"a\\\"") && !named.contains("text")
        );
        let required = lark(
            plan(
                tools(two.clone()),
                choice(json!("required")),
                Some(false),
                false,
                LIST,
            )
            .unwrap()
            .unwrap(),
        );
        assert!(required.contains("calls: \"[\" call \"]\""));
        assert!(
            plan(tools(two.clone()), choice(json!("none")), None, false, LIST)
                .unwrap()
                .is_none()
        );
        assert!(plan(None, None, None, false, LIST).unwrap().is_none());
        for (t, c, param) in [
            (
                two.clone(),
                json!({"type": "function", "function": {"name": "zz"}}),
                "tool_choice",
            ),
            (json!([]), json!("required"), "tool_choice"),
            (two.clone(), json!("sometimes"), "tool_choice"),
            (
                json!([{"type": "retrieval", "function": {"name": "a"}}]),
                json!("auto"),
                "tools",
            ),
            (
                json!([{"type": "function", "function": {"name": "a b"}}]),
                json!("auto"),
                "tools",
            ),
            (
                json!([{"type": "function", "function": {"name": "a", "parameters": 3}}]),
                json!("auto"),
                "tools",
            ),
        ] {
            let e = plan(tools(t), choice(c.clone()), None, false, LIST).expect_err(&c.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{c}: {}", e.message);
        }
    }

    /// Without tools in the template: an assistant's calls are written as the grammar
    /// writes them, a run of results becomes one user turn (and only a run of results:
    /// a user turn after it stays its own), and the tools' description goes first.
    #[test]
    fn conversations_carry_calls_and_results() {
        let messages: Vec<Message> = serde_json::from_value(json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"a\":1}"}},
                {"id": "c2", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "noon"},
            {"role": "user", "content": "Result of my thinking: thanks"},
        ]))
        .unwrap();
        let out = conversation(&messages, Some("TOOLS"), false).unwrap();
        assert!(out.iter().all(|m| m.tool_calls.is_none()));
        let turns: Vec<(&str, &str)> = out
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(
            turns,
            [
                ("system", "TOOLS"),
                ("user", "Weather?"),
                (
                    "assistant",
                    r#"[{"name": "w", "arguments": {"a":1}}, {"name": "t", "arguments": {}}]"#
                ),
                ("user", "Result of c1: sunny\nResult of c2: noon"),
                ("user", "Result of my thinking: thanks"),
            ]
        );
    }

    /// A template that reads tools gets the calls with their arguments as values (text
    /// that is not JSON as a string), and `tool` turns with the call they answer.
    #[test]
    fn templates_with_tools_get_calls_and_results_as_they_read_them() {
        let messages: Vec<Message> = serde_json::from_value(json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"a\":1}"}},
                {"type": "function", "function": {"name": "t", "arguments": "not json"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]))
        .unwrap();
        let out = conversation(&messages, None, true).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(
            serde_json::to_value(&out[1]).unwrap(),
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": {"a": 1}}},
                {"id": "call_1", "type": "function", "function": {"name": "t", "arguments": "not json"}}]})
        );
        assert_eq!(
            serde_json::to_value(&out[2]).unwrap(),
            json!({"role": "tool", "content": "sunny", "tool_call_id": "c1"})
        );
    }

    /// The syntax follows the template where it reads tools; Llama 3's makes one call a
    /// turn, so asking for parallel calls there is refused by name.
    #[test]
    fn the_template_chooses_the_syntax() {
        let one = json!([{"type": "function", "function": {"name": "a"}}]);
        let p = |reads, syntax, parallel| plan(tools(one.clone()), None, parallel, reads, syntax);
        let tagged = p(true, CallSyntax::Tagged, None).unwrap().unwrap();
        assert_eq!(tagged.syntax, CallSyntax::Tagged);
        let Grammar::Lark(lark) = tagged.grammar else {
            panic!("a Lark grammar")
        };
        assert!(lark.contains("<tool_call>"));
        let listed = p(false, CallSyntax::Tagged, None).unwrap().unwrap();
        assert_eq!(listed.syntax, CallSyntax::List, "no tools in the template");
        assert!(p(true, CallSyntax::Llama3, None).unwrap().is_some());
        assert!(p(true, CallSyntax::Llama3, Some(false)).unwrap().is_some());
        let e = p(true, CallSyntax::Llama3, Some(true)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("parallel_tool_calls"));
    }

    #[test]
    fn a_stream_of_calls_becomes_openai_deltas_and_text_stays_text() {
        let mut s = CallStream::new(LIST);
        let mut deltas = Vec::new();
        for piece in [
            " ",
            "[{\"na",
            "me\": \"f\", \"arguments\": {\"x\"",
            ": 1}}",
            "]",
        ] {
            if let Some(Streamed::Calls(d)) = s.push("r", piece).unwrap() {
                deltas.extend(d);
            }
        }
        assert_eq!(deltas[0]["id"], "call_r_0");
        assert_eq!(deltas[0]["function"]["name"], "f");
        // Two calls' steps in one piece: one entry a call, start and arguments together.
        let mut both = CallStream::new(LIST);
        let Some(Streamed::Calls(entries)) = both
            .push(
                "r",
                r#"[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]"#,
            )
            .unwrap()
        else {
            panic!("calls")
        };
        assert_eq!(
            entries,
            [
                json!({"index": 0, "id": "call_r_0", "type": "function",
                       "function": {"name": "a", "arguments": "{\"x\": 1}"}}),
                json!({"index": 1, "id": "call_r_1", "type": "function",
                       "function": {"name": "b", "arguments": "{}"}}),
            ]
        );
        let args: String = deltas
            .iter()
            .map(|d| d["function"]["arguments"].as_str().unwrap())
            .collect();
        assert_eq!(args, "{\"x\": 1}");
        assert_eq!(s.finish(), (String::new(), true));
        let mut t = CallStream::new(LIST);
        assert_eq!(
            t.push("r", "Hi").unwrap(),
            Some(Streamed::Text("Hi".into()))
        );
        assert_eq!(
            t.push("r", "[x").unwrap(),
            Some(Streamed::Text("[x".into()))
        );
        assert!(!t.finish().1);
    }
}
