//! Tool calls as the model writes them under a grammar, and read back as they stream, in
//! the syntax the chat template teaches ([`CallSyntax`]): Qwen's and Hermes'
//! `<tool_call>` blocks, Llama 3's one JSON object with `parameters`, or, for a template
//! without one, a JSON list of calls. Each call's arguments are valid for its tool's
//! parameter schema. The layout is fixed by the grammar (keys in that order, one space
//! after each separator), so the reader can stream each call's name as soon as it is
//! complete and its arguments as they are written.

use serde_json::Value;

use super::{compact, guided, Grammar};

/// A function the model may call: its name and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub parameters: Value,
}

/// How a model writes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallSyntax {
    /// `[{"name": "f", "arguments": {...}}, ...]`: for templates that teach no syntax
    /// (the tools are then described in a system message).
    List,
    /// `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one block per call
    /// on its own line: Qwen2.5, Qwen3 and Hermes templates.
    Tagged,
    /// `{"name": "f", "parameters": {...}}`, one call a turn: Llama 3.1-3.3's JSON tool
    /// calling.
    Llama3,
}

/// The literal pieces of a syntax: before the calls, before a call's name, between its
/// name and its arguments, after its arguments, between calls, after the calls.
struct Layout {
    open: &'static str,
    head: &'static str,
    key: &'static str,
    end: &'static str,
    separator: &'static str,
    close: &'static str,
}

impl CallSyntax {
    /// The syntax `template` (a chat template's source) teaches.
    pub fn of_template(template: &str) -> Self {
        if template.contains("<tool_call>") {
            CallSyntax::Tagged
        } else if template.contains("\"parameters\": ") && template.contains("tools") {
            CallSyntax::Llama3
        } else {
            CallSyntax::List
        }
    }

    /// Whether a turn may hold several calls.
    pub fn allows_several(self) -> bool {
        self != CallSyntax::Llama3
    }

    fn layout(self) -> Layout {
        match self {
            CallSyntax::List => Layout {
                open: "[",
                head: "{\"name\": ",
                key: ", \"arguments\": ",
                end: "}",
                separator: ", ",
                close: "]",
            },
            CallSyntax::Tagged => Layout {
                open: "",
                head: "<tool_call>\n{\"name\": ",
                key: ", \"arguments\": ",
                end: "}\n</tool_call>",
                separator: "\n",
                close: "",
            },
            CallSyntax::Llama3 => Layout {
                open: "",
                head: "{\"name\": ",
                key: ", \"parameters\": ",
                end: "}",
                separator: "",
                close: "",
            },
        }
    }

    /// What an output of calls starts with.
    fn opener(self) -> &'static str {
        let layout = self.layout();
        match layout.open {
            "" => layout.head.split('\n').next().unwrap_or(layout.head),
            open => open,
        }
    }

    /// Calls (name and arguments as JSON text) written as the grammar has the model
    /// write them: for earlier turns of a conversation.
    pub fn write(self, calls: &[(String, String)]) -> String {
        let l = self.layout();
        let calls: Vec<String> = calls
            .iter()
            .map(|(name, arguments)| {
                format!("{}{}{}{arguments}{}", l.head, quoted(name), l.key, l.end)
            })
            .collect();
        format!("{}{}{}", l.open, calls.join(l.separator), l.close)
    }

    /// The grammar of calls to `tools` (one, or several where the syntax allows), or,
    /// with `text_allowed`, of either such calls or text that does not start as they do.
    pub fn grammar(self, tools: &[ToolSpec], mode: CallMode, text_allowed: bool) -> Grammar {
        let l = self.layout();
        let several = mode == CallMode::Several && self.allows_several();
        let mut calls = String::from("calls:");
        if !l.open.is_empty() {
            calls.push_str(&format!(" {}", quoted(l.open)));
        }
        calls.push_str(" call");
        if several {
            calls.push_str(&format!(" ({} call)*", quoted(l.separator)));
        }
        if !l.close.is_empty() {
            calls.push_str(&format!(" {}", quoted(l.close)));
        }
        let mut lark = String::new();
        lark.push_str(match text_allowed {
            true => "start: calls | text\n",
            false => "start: calls\n",
        });
        if text_allowed {
            let first = self
                .opener()
                .chars()
                .next()
                .expect("a syntax opens with text");
            let class = regex_syntax_escape(first);
            lark.push_str(&format!("text: /[^{class}][\\s\\S]*/\n"));
        }
        lark.push_str(&calls);
        lark.push('\n');
        let names: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
        lark.push_str(&format!("call: {}\n", names.join(" | ")));
        // Lark's string literals take JSON's escapes.
        for (i, tool) in tools.iter().enumerate() {
            let head = format!("{}{}{}", l.head, quoted(&tool.name), l.key);
            lark.push_str(&format!(
                "call_{i}: {} args_{i} {}\nargs_{i}: %json {}\n",
                quoted(&head),
                quoted(l.end),
                compact(&spaced(&tool.parameters))
            ));
        }
        Grammar::Lark(lark)
    }

    /// Whether an output starting with `text` (leading whitespace aside) is calls;
    /// `None` while it cannot tell.
    pub fn starts_calls(self, text: &str) -> Option<bool> {
        let text = text.trim_start();
        let opener = self.opener();
        if text.is_empty() || (text.len() < opener.len() && opener.starts_with(text)) {
            return None;
        }
        Some(text.starts_with(opener))
    }
}

/// `schema` with `", "` and `": "` between items (where it sets no separators): calls
/// written as chat templates render earlier calls (Python's `json.dumps` through
/// `tojson`), so a model's own calls look like those in its conversations.
fn spaced(schema: &Value) -> Value {
    let separators = [("item_separator", ", "), ("key_separator", ": ")];
    guided(
        schema,
        &separators.map(|(key, sep)| (key, Value::from(sep))),
    )
}

/// `c` for a regex character class.
fn regex_syntax_escape(c: char) -> String {
    match c {
        '[' | ']' | '\\' | '^' | '-' | '{' | '}' => format!("\\{c}"),
        c => c.to_string(),
    }
}

/// What the output may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMode {
    /// Exactly one call.
    One,
    /// One call or more (one where the syntax allows no more).
    Several,
}

/// `s` as a JSON string.
fn quoted(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// A step of the calls read so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallDelta {
    /// Call `index` to `name` begins.
    Start { index: usize, name: String },
    /// More of call `index`'s arguments (JSON text; all of a call's pieces together are
    /// its arguments).
    Arguments { index: usize, text: String },
}

/// Where the reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before the calls.
    Start,
    /// Before a call.
    Head,
    /// In a call's arguments, `depth` brackets deep.
    Arguments {
        depth: usize,
        in_string: bool,
        escaped: bool,
    },
    /// After a call's arguments, before its end.
    CallEnd,
    /// After a call: a separator, the close or the end of the output next.
    After,
    /// After the calls' close.
    Done,
}

/// Reads calls as their text streams in.
#[derive(Debug, Clone)]
pub struct CallReader {
    syntax: CallSyntax,
    text: String,
    /// Bytes of `text` read.
    read: usize,
    at: At,
    /// The calls so far: name and arguments.
    calls: Vec<(String, String)>,
}

impl CallReader {
    /// A reader of calls written in `syntax`.
    pub fn new(syntax: CallSyntax) -> Self {
        Self {
            syntax,
            text: String::new(),
            read: 0,
            at: At::Start,
            calls: Vec::new(),
        }
    }

    /// Reads `piece`; returns the calls' steps it completes.
    pub fn push(&mut self, piece: &str) -> Result<Vec<CallDelta>, String> {
        self.text.push_str(piece);
        let l = self.syntax.layout();
        let mut out = Vec::new();
        loop {
            let rest = &self.text[self.read..];
            match self.at {
                At::Start => {
                    self.skip_space();
                    let rest = &self.text[self.read..];
                    match expect(rest, l.open) {
                        Expect::Found => {
                            self.read += l.open.len();
                            self.at = At::Head;
                        }
                        Expect::Wait => return Ok(out),
                        Expect::Other => return Err(format!("expected calls at {rest:?}")),
                    }
                }
                At::Head => {
                    self.skip_space();
                    let rest = &self.text[self.read..];
                    match expect(rest, l.head) {
                        Expect::Found => {}
                        Expect::Wait => return Ok(out),
                        Expect::Other => return Err(format!("expected a call at {rest:?}")),
                    }
                    // The name: a JSON string, then the arguments' key.
                    let after = &rest[l.head.len()..];
                    let mut de = serde_json::Deserializer::from_str(after).into_iter::<String>();
                    let name = match de.next() {
                        Some(Ok(name)) => name,
                        _ => return Ok(out), // not complete yet
                    };
                    let used = l.head.len() + de.byte_offset();
                    match expect(&rest[used..], l.key) {
                        Expect::Found => {}
                        Expect::Wait => return Ok(out),
                        Expect::Other => {
                            return Err(format!("expected the arguments at {:?}", &rest[used..]))
                        }
                    }
                    self.read += used + l.key.len();
                    out.push(CallDelta::Start {
                        index: self.calls.len(),
                        name: name.clone(),
                    });
                    self.calls.push((name, String::new()));
                    self.at = At::Arguments {
                        depth: 0,
                        in_string: false,
                        escaped: false,
                    };
                }
                At::Arguments {
                    mut depth,
                    mut in_string,
                    mut escaped,
                } => {
                    let mut end = None;
                    for (i, c) in rest.char_indices() {
                        match (in_string, escaped, c) {
                            (true, true, _) => escaped = false,
                            (true, false, '\\') => escaped = true,
                            (true, false, '"') => in_string = false,
                            (true, false, _) => {}
                            (false, _, '"') => in_string = true,
                            (false, _, '{' | '[') => depth += 1,
                            (false, _, '}' | ']') => depth = depth.saturating_sub(1),
                            _ => {}
                        }
                        let closed = depth == 0 && !in_string && matches!(c, '}' | ']');
                        if closed {
                            end = Some(i + c.len_utf8());
                            break;
                        }
                    }
                    let taken = end.unwrap_or(rest.len());
                    let text = rest[..taken].to_string();
                    self.read += taken;
                    let index = self.calls.len() - 1;
                    if !text.is_empty() {
                        self.calls[index].1.push_str(&text);
                        out.push(CallDelta::Arguments { index, text });
                    }
                    match end {
                        Some(_) => self.at = At::CallEnd,
                        None => {
                            self.at = At::Arguments {
                                depth,
                                in_string,
                                escaped,
                            };
                            return Ok(out);
                        }
                    }
                }
                At::CallEnd => match expect(rest, l.end) {
                    Expect::Found => {
                        self.read += l.end.len();
                        self.at = At::After;
                    }
                    Expect::Wait => return Ok(out),
                    Expect::Other => return Err(format!("expected the end of a call at {rest:?}")),
                },
                At::After => {
                    if !l.close.is_empty() && rest.starts_with(l.close) {
                        self.read += l.close.len();
                        self.at = At::Done;
                        continue;
                    }
                    if !l.separator.is_empty() && rest.starts_with(l.separator) {
                        self.read += l.separator.len();
                        self.at = At::Head;
                        continue;
                    }
                    let waits = |p: &str| !p.is_empty() && p.starts_with(rest);
                    if rest.is_empty() || waits(l.close) || waits(l.separator) {
                        return Ok(out);
                    }
                    if l.close.is_empty() && rest.trim().is_empty() {
                        return Ok(out);
                    }
                    return Err(format!("text after the calls: {rest:?}"));
                }
                At::Done => {
                    if !rest.trim().is_empty() {
                        return Err(format!("text after the calls: {rest:?}"));
                    }
                    return Ok(out);
                }
            }
        }
    }

    /// Moves past whitespace.
    fn skip_space(&mut self) {
        let rest = &self.text[self.read..];
        self.read += rest.len() - rest.trim_start().len();
    }

    /// The calls read (name and arguments), once they are complete.
    pub fn finish(self) -> Result<Vec<(String, String)>, String> {
        let l = self.syntax.layout();
        let rest = self.text[self.read..].trim();
        let complete = match self.at {
            At::Done => true,
            // Without a close the calls end with the output; a separator may trail.
            At::After | At::Head => l.close.is_empty() && rest.is_empty() && !self.calls.is_empty(),
            _ => false,
        };
        match complete {
            true => Ok(self.calls),
            false => Err(format!("the calls are not complete: {:?}", self.text)),
        }
    }
}

/// Whether text starts with an expected literal.
enum Expect {
    Found,
    /// Too short to tell.
    Wait,
    Other,
}

fn expect(rest: &str, literal: &str) -> Expect {
    if rest.starts_with(literal) {
        Expect::Found
    } else if literal.starts_with(rest) {
        Expect::Wait
    } else {
        Expect::Other
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const SYNTAXES: [CallSyntax; 3] = [CallSyntax::List, CallSyntax::Tagged, CallSyntax::Llama3];

    /// The names started, the arguments' joined pieces, and the calls finished.
    type Read = (
        Vec<(usize, String)>,
        Vec<String>,
        Result<Vec<(String, String)>, String>,
    );

    /// Reads `text` cut into pieces of `step` characters: the names started, each call's
    /// joined argument pieces, and the finished calls.
    fn read_in_pieces(syntax: CallSyntax, text: &str, step: usize) -> Read {
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        let mut reader = CallReader::new(syntax);
        let (mut names, mut args) = (Vec::new(), Vec::<String>::new());
        let mut from = 0;
        for &to in cuts.iter().skip(step).step_by(step).chain([&text.len()]) {
            if to <= from {
                continue;
            }
            for d in reader.push(&text[from..to]).unwrap() {
                match d {
                    CallDelta::Start { index, name } => {
                        names.push((index, name));
                        args.push(String::new());
                    }
                    CallDelta::Arguments { index, text } => args[index].push_str(&text),
                }
            }
            from = to;
        }
        (names, args, reader.finish())
    }

    /// In every syntax, every way of cutting calls into pieces (strings holding brackets,
    /// braces, escaped quotes, the syntax's own tags and multi-byte characters) reads
    /// back the calls written, and the pieces of each call's arguments join into JSON.
    #[test]
    fn calls_read_back_whole_however_the_text_is_cut() {
        let two = vec![
            (
                "get_weather".to_string(),
                r#"{"city": "Par}is \"[x]\" </tool_call> é", "days": [1, {"a": 2}]}"#.to_string(),
            ),
            ("now".to_string(), "{}".to_string()),
        ];
        for syntax in SYNTAXES {
            let calls = match syntax.allows_several() {
                true => &two[..],
                false => &two[..1],
            };
            let text = syntax.write(calls);
            for step in [1, 2, 3, 7, text.len()] {
                let (names, args, finished) = read_in_pieces(syntax, &text, step);
                let want_names: Vec<(usize, String)> = calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (i, c.0.clone()))
                    .collect();
                assert_eq!(names, want_names, "{syntax:?} in pieces of {step}");
                for a in &args {
                    serde_json::from_str::<Value>(a).unwrap();
                }
                assert_eq!(finished.unwrap(), calls, "{syntax:?} in pieces of {step}");
            }
            // Output may end with whitespace.
            let (_, _, spaced) = read_in_pieces(syntax, &format!("{text}\n"), 1);
            assert_eq!(spaced.unwrap(), calls, "{syntax:?}");
            // Cut short, it is not complete.
            let (_, _, cut) = read_in_pieces(syntax, &text[..text.len() - 2], 1);
            assert!(cut.is_err(), "{syntax:?}: an unfinished call is an error");
            assert!(CallReader::new(syntax).push("Hello").is_err());
            assert_eq!(syntax.starts_calls(&format!("  {text}")), Some(true));
            assert_eq!(syntax.starts_calls("Hi"), Some(false));
            assert_eq!(syntax.starts_calls(" "), None);
            let opener = syntax.opener();
            assert_eq!(
                syntax.starts_calls(&opener[..1]),
                (opener.len() == 1).then_some(true)
            );
        }
        assert_eq!(
            CallSyntax::List.write(&two),
            r#"[{"name": "get_weather", "arguments": {"city": "Par}is \"[x]\" </tool_call> é", "days": [1, {"a": 2}]}}, {"name": "now", "arguments": {}}]"#
        );
        assert_eq!(
            CallSyntax::Tagged.write(&two[1..]),
            "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"
        );
        assert_eq!(
            CallSyntax::Llama3.write(&two[1..]),
            r#"{"name": "now", "parameters": {}}"#
        );
    }

    #[test]
    fn each_template_gets_the_syntax_it_teaches() {
        let qwen = "{{- tool | tojson }} ... within <tool_call></tool_call> XML tags";
        let llama = "{%- if tools is not none %} {{- '\"parameters\": ' }}";
        assert_eq!(CallSyntax::of_template(qwen), CallSyntax::Tagged);
        assert_eq!(CallSyntax::of_template(llama), CallSyntax::Llama3);
        assert_eq!(CallSyntax::of_template("{{ messages }}"), CallSyntax::List);
    }

    #[test]
    fn the_grammar_names_each_tool_and_embeds_its_schema() {
        let tools = [ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        }];
        let lark = |syntax: CallSyntax, mode, text| match syntax.grammar(&tools, mode, text) {
            Grammar::Lark(src) => src,
            other => panic!("a Lark grammar, not {other:?}"),
        };
        let one = lark(CallSyntax::List, CallMode::One, false);
        assert!(one.contains(r#"call_0: "{\"name\": \"get_weather\", \"arguments\": " args_0"#));
        assert!(one.contains("args_0: %json {"));
        assert!(
            one.contains(r#""item_separator":", ","key_separator":": ""#),
            "{one}"
        );
        assert!(!one.contains("text") && !one.contains(")*"));
        let auto = lark(CallSyntax::List, CallMode::Several, true);
        assert!(auto.contains("start: calls | text") && auto.contains("(\", \" call)*"));
        assert!(auto.contains(r"text: /[^\[][\s\S]*/"));
        let tagged = lark(CallSyntax::Tagged, CallMode::Several, true);
        assert!(tagged.contains(r#"call_0: "<tool_call>\n{\"name\": \"get_weather\""#));
        assert!(tagged.contains(r#"calls: call ("\n" call)*"#), "{tagged}");
        assert!(tagged.contains("text: /[^<]"));
        let llama = lark(CallSyntax::Llama3, CallMode::Several, true);
        assert!(llama.contains("calls: call\n"), "one call a turn: {llama}");
        assert!(llama.contains(r#"\"parameters\": " args_0"#));
        assert!(llama.contains(r"text: /[^\{]"));
    }
}
