//! Chat templates from `tokenizer.chat_template`, rendered with minijinja as
//! transformers renders them (Python's string methods, its `tojson`, `strftime_now`); a
//! built-in one (Gemma's turns, ChatML) for a file without a template whose vocabulary
//! has that format's turn tokens.

use minijinja::value::Kwargs;
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::Map;

/// One chat message, as templates read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
    /// The calls an assistant turn made, as templates read them:
    /// `{"id", "type": "function", "function": {"name", "arguments": {...}}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// The call a `tool` turn answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_string(),
            content: content.to_string(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// What a template reads besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct TemplateInputs<'a> {
    /// The tools the model may call, as the template's `tools` (OpenAI's list of
    /// `{"type": "function", "function": {...}}`).
    pub tools: Option<&'a serde_json::Value>,
    /// More variables (a request's `chat_template_kwargs`: `enable_thinking`,
    /// `date_string`, ...); they do not replace the ones above.
    pub kwargs: Option<&'a Map<String, serde_json::Value>>,
}

/// Built-in formats: name, the turn tokens the vocabulary must have, the template.
const BUILT_IN: [(&str, [&str; 2], &str); 2] = [
    (
        "gemma",
        ["<start_of_turn>", "<end_of_turn>"],
        include_str!("templates/gemma.jinja"),
    ),
    (
        "chatml",
        ["<|im_start|>", "<|im_end|>"],
        include_str!("templates/chatml.jinja"),
    ),
];

/// A Jinja chat template as shipped in the model file, or a built-in one.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
    built_in: Option<&'static str>,
}

impl ChatTemplate {
    /// Wraps a template source; the special-token strings are exposed to the template.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Self {
        Self {
            source,
            bos_token,
            eos_token,
            built_in: None,
        }
    }

    /// The built-in format whose turn tokens the vocabulary has (`has_token`), for a file
    /// without a template: Gemma's turns, else ChatML; `None` when neither fits.
    pub fn built_in_for(
        has_token: impl Fn(&str) -> bool,
        bos_token: String,
        eos_token: String,
    ) -> Option<Self> {
        let (name, _, source) = BUILT_IN
            .iter()
            .find(|(_, turns, _)| turns.iter().all(|t| has_token(t)))?;
        Some(Self {
            built_in: Some(name),
            ..Self::new(source.to_string(), bos_token, eos_token)
        })
    }

    /// The built-in format's name (`gemma`, `chatml`) when the file had no template.
    pub fn built_in(&self) -> Option<&'static str> {
        self.built_in
    }

    /// Renders the conversation; with `add_generation_prompt` the assistant turn is opened.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        self.render_with(messages, add_generation_prompt, TemplateInputs::default())
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template reads a `tools` variable (describes tools to the model).
    pub fn reads_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// [`Self::render`] with the tools and other variables of `inputs`.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        inputs: TemplateInputs<'_>,
    ) -> Result<String, Error> {
        let mut env = Environment::new();
        // As transformers renders templates: a block tag's line ends with it.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", tojson);
        #[cfg(not(target_family = "wasm"))]
        env.add_function("strftime_now", |format: String| {
            chrono::Local::now().format(&format).to_string()
        });
        let kwargs = Value::from_serialize(inputs.kwargs);
        env.render_str(
            &self.source,
            context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                tools => inputs.tools,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                ..kwargs
            },
        )
    }
}

/// Python's `json.dumps` as transformers' templates call it: keys in their order,
/// non-ASCII as is, `", "` and `": "` between items (`","` and `": "` with `indent`).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let bad = |e: serde_json::Error| Error::new(ErrorKind::InvalidOperation, e.to_string());
    let mut out = Vec::new();
    match indent {
        Some(n) => {
            let spaces = vec![b' '; n];
            let formatter = serde_json::ser::PrettyFormatter::with_indent(&spaces);
            let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
            value.serialize(&mut ser).map_err(bad)?;
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonCompact);
            value.serialize(&mut ser).map_err(bad)?;
        }
    }
    let text = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(text))
}

/// Python `json.dumps`'s default separators, `", "` and `": "`.
struct PythonCompact;

impl serde_json::ser::Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.begin_array_value(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built_in(vocab: &[&str]) -> Option<ChatTemplate> {
        ChatTemplate::built_in_for(|t| vocab.contains(&t), "<bos>".into(), "<eos>".into())
    }

    #[test]
    fn a_file_without_a_template_gets_the_format_its_turn_tokens_call_for() {
        let gemma = built_in(&["<start_of_turn>", "<end_of_turn>", "<|im_start|>"]).unwrap();
        assert_eq!(gemma.built_in(), Some("gemma"));
        let chatml = built_in(&["<|im_start|>", "<|im_end|>"]).unwrap();
        assert_eq!(chatml.built_in(), Some("chatml"));
        // One turn token of a pair is not enough.
        assert!(built_in(&["<start_of_turn>", "<|im_end|>"]).is_none());
        let file = ChatTemplate::new("{{ messages[0].content }}".into(), "".into(), "".into());
        assert_eq!(file.built_in(), None);
    }

    #[test]
    fn gemma_turns_render_as_gemma_writes_them() {
        let t = built_in(&["<start_of_turn>", "<end_of_turn>"]).unwrap();
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", " Hi \n"),
            ChatMessage::new("assistant", "Hello!"),
            ChatMessage::new("user", "Name a color."),
        ];
        assert_eq!(
            t.render(&messages, true).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nName a color.<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            t.render(&messages[1..2], false).unwrap(),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        );
        // Two user turns in a row, or the assistant first, are refused.
        let err = t.render(&[messages[1].clone(), messages[3].clone()], true);
        assert!(err.unwrap_err().to_string().contains("alternate"));
        assert!(t.render(&messages[2..], true).is_err());
    }

    #[test]
    fn chatml_renders_each_turn() {
        let t = built_in(&["<|im_start|>", "<|im_end|>"]).unwrap();
        let messages = [ChatMessage::new("user", "Hi")];
        assert_eq!(
            t.render(&messages, true).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
