//! Chat templates from `tokenizer.chat_template`, rendered with minijinja.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A Jinja chat template as shipped in the model file.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Wraps a template source; the special-token strings are exposed to the template.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Self {
        Self {
            source,
            bos_token,
            eos_token,
        }
    }

    /// Renders the conversation; with `add_generation_prompt` the assistant turn is opened.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let mut env = Environment::new();
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.render_str(
            &self.source,
            context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            },
        )
    }
}
