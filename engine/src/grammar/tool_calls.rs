//! Tool calls as the model writes them under a grammar, and read back as they stream: a
//! JSON list of calls, `[{"name": "get_weather", "arguments": {"city": "Paris"}}]`, each
//! call's arguments valid for its tool's parameter schema. The layout is fixed by the
//! grammar (keys in that order, one space after each separator), so the reader can stream
//! each call's name as soon as it is complete and its arguments as they are written.

use serde_json::Value;

use super::{compact, Grammar};

/// A function the model may call: its name and the JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub parameters: Value,
}

/// A call's text up to its name, between its name and its arguments, and after them;
/// calls in a list are separated by [`SEPARATOR`].
const NAME_KEY: &str = "{\"name\": ";
const ARGUMENTS_KEY: &str = ", \"arguments\": ";
const CALL_END: &str = "}";
const SEPARATOR: &str = ", ";

/// The text of one call up to its arguments.
fn call_head(name: &str) -> String {
    format!("{NAME_KEY}{}{ARGUMENTS_KEY}", quoted(name))
}

/// Calls (name and arguments as JSON text) written as the grammar has the model write
/// them: for earlier turns of a conversation.
pub fn write_calls(calls: &[(String, String)]) -> String {
    let calls: Vec<String> = calls
        .iter()
        .map(|(name, arguments)| format!("{}{arguments}{CALL_END}", call_head(name)))
        .collect();
    format!("[{}]", calls.join(SEPARATOR))
}

/// What the output may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMode {
    /// Exactly one call.
    One,
    /// One call or more.
    Several,
}

/// The grammar of a list of calls to `tools` (one or several), or, with `text_allowed`,
/// of either such a list or text that does not start with `[`.
pub fn tool_call_grammar(tools: &[ToolSpec], mode: CallMode, text_allowed: bool) -> Grammar {
    let mut lark = String::new();
    let list = match mode {
        CallMode::One => "calls: \"[\" call \"]\"\n".to_string(),
        CallMode::Several => format!("calls: \"[\" call ({} call)* \"]\"\n", quoted(SEPARATOR)),
    };
    lark.push_str(match text_allowed {
        true => "start: calls | text\ntext: /[^\\[][\\s\\S]*/\n",
        false => "start: calls\n",
    });
    lark.push_str(&list);
    let names: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
    lark.push_str(&format!("call: {}\n", names.join(" | ")));
    // Lark's string literals take JSON's escapes.
    for (i, tool) in tools.iter().enumerate() {
        lark.push_str(&format!(
            "call_{i}: {} args_{i} {}\nargs_{i}: %json {}\n",
            quoted(&call_head(&tool.name)),
            quoted(CALL_END),
            compact(&tool.parameters)
        ));
    }
    Grammar::Lark(lark)
}

/// `s` as a JSON string.
fn quoted(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// Whether an output starting with `text` (leading whitespace aside) is a list of calls.
pub fn starts_calls(text: &str) -> Option<bool> {
    text.trim_start().chars().next().map(|c| c == '[')
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

/// Where the reader is in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before the list, or after a call (a separator, the end or a new call next).
    Between,
    /// In a call's arguments, `depth` brackets deep.
    Arguments {
        depth: usize,
        in_string: bool,
        escaped: bool,
    },
    /// After a call's arguments, before its closing brace.
    CallEnd,
    /// After the list.
    Done,
}

/// Reads a list of calls as its text streams in.
#[derive(Debug, Clone)]
pub struct CallReader {
    text: String,
    /// Bytes of `text` read.
    read: usize,
    at: At,
    /// The calls so far: name and arguments.
    calls: Vec<(String, String)>,
}

impl Default for CallReader {
    fn default() -> Self {
        Self {
            text: String::new(),
            read: 0,
            at: At::Between,
            calls: Vec::new(),
        }
    }
}

impl CallReader {
    /// Reads `piece`; returns the calls' steps it completes.
    pub fn push(&mut self, piece: &str) -> Result<Vec<CallDelta>, String> {
        self.text.push_str(piece);
        let mut out = Vec::new();
        loop {
            let rest = &self.text[self.read..];
            match self.at {
                At::Between => {
                    let skip = rest.len() - rest.trim_start().len();
                    self.read += skip;
                    let rest = &self.text[self.read..];
                    if rest.starts_with("[") || rest.starts_with(",") {
                        self.read += 1;
                        continue;
                    }
                    if rest.starts_with("]") {
                        self.read += 1;
                        self.at = At::Done;
                        continue;
                    }
                    let head = NAME_KEY;
                    if rest.len() < head.len() {
                        if !head.starts_with(rest) {
                            return Err(format!("expected a call at {rest:?}"));
                        }
                        return Ok(out);
                    }
                    if !rest.starts_with(head) {
                        return Err(format!("expected a call at {rest:?}"));
                    }
                    // The name: a JSON string, then the arguments' key.
                    let after = &rest[head.len()..];
                    let mut de = serde_json::Deserializer::from_str(after).into_iter::<String>();
                    let name = match de.next() {
                        Some(Ok(name)) => name,
                        _ => return Ok(out), // not complete yet
                    };
                    let used = head.len() + de.byte_offset();
                    let key = ARGUMENTS_KEY;
                    let tail = &rest[used..];
                    if tail.len() < key.len() {
                        return Ok(out);
                    }
                    if !tail.starts_with(key) {
                        return Err(format!("expected the arguments at {tail:?}"));
                    }
                    self.read += used + key.len();
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
                At::CallEnd => {
                    if rest.is_empty() {
                        return Ok(out);
                    }
                    if !rest.starts_with(CALL_END) {
                        return Err(format!("expected the end of a call at {rest:?}"));
                    }
                    self.read += CALL_END.len();
                    self.at = At::Between;
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

    /// The calls read (name and arguments), once the list is complete.
    pub fn finish(self) -> Result<Vec<(String, String)>, String> {
        match self.at {
            At::Done => Ok(self.calls),
            _ => Err(format!(
                "the list of calls is not complete: {:?}",
                self.text
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Every way of cutting a list of two calls into pieces (strings holding brackets,
    /// braces, escaped quotes and multi-byte characters) reads back the same names and
    /// arguments, and the pieces of each call's arguments join into valid JSON.
    #[test]
    fn calls_read_back_whole_however_the_text_is_cut() {
        let text = r#"[{"name": "get_weather", "arguments": {"city": "Par}is \"[x]\" é", "days": [1, {"a": 2}]}}, {"name": "now", "arguments": {}}]"#;
        let want = vec![
            (
                "get_weather".to_string(),
                r#"{"city": "Par}is \"[x]\" é", "days": [1, {"a": 2}]}"#.to_string(),
            ),
            ("now".to_string(), "{}".to_string()),
        ];
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for step in [1, 2, 3, 7, text.len()] {
            let mut reader = CallReader::default();
            let mut args = vec![String::new(); 2];
            let mut names = Vec::new();
            let mut from = 0;
            for &to in cuts.iter().skip(step).step_by(step).chain([&text.len()]) {
                if to <= from {
                    continue;
                }
                for d in reader.push(&text[from..to]).unwrap() {
                    match d {
                        CallDelta::Start { index, name } => names.push((index, name)),
                        CallDelta::Arguments { index, text } => args[index].push_str(&text),
                    }
                }
                from = to;
            }
            assert_eq!(names, [(0, "get_weather".into()), (1, "now".into())]);
            for a in &args {
                serde_json::from_str::<Value>(a).unwrap();
            }
            assert_eq!(reader.finish().unwrap(), want, "pieces of {step}");
        }
        assert_eq!(
            write_calls(&want),
            text,
            "written as the grammar writes them"
        );
        let mut cut = CallReader::default();
        cut.push(r#"[{"name": "f", "arguments": {"a"#).unwrap();
        assert!(cut.finish().is_err(), "an unfinished list is an error");
        assert!(CallReader::default().push("Hello").is_err());
        assert_eq!(starts_calls("  [{"), Some(true));
        assert_eq!(starts_calls("Hi"), Some(false));
        assert_eq!(starts_calls(" "), None);
    }

    #[test]
    fn the_grammar_names_each_tool_and_embeds_its_schema() {
        let tools = [ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        }];
        let Grammar::Lark(one) = tool_call_grammar(&tools, CallMode::One, false) else {
            panic!("a Lark grammar")
        };
        assert!(one.contains(r#"call_0: "{\"name\": \"get_weather\", \"arguments\": " args_0"#));
        assert!(one.contains("args_0: %json {"));
        assert!(!one.contains("text"));
        let Grammar::Lark(auto) = tool_call_grammar(&tools, CallMode::Several, true) else {
            panic!("a Lark grammar")
        };
        assert!(auto.contains("start: calls | text") && auto.contains("(\", \" call)*"));
    }
}
