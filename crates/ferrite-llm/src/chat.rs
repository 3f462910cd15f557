//! Chat prompts through the GGUF's own `tokenizer.chat_template` (a Jinja
//! template, rendered with minijinja as HuggingFace's chat templates are).

use ferrite::{Result, Status, StatusCode};

/// One chat message.
#[derive(Clone, Debug)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message.
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Renders `template` over `messages`, with the generation prompt (the
/// assistant's turn opened) when `add_generation_prompt`.
pub fn render(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let mut env = minijinja::Environment::new();
    env.add_template("chat", template).map_err(|e| {
        Status::new(
            StatusCode::InvalidArgument,
            format!("gguf tokenizer.chat_template does not parse: {e}"),
        )
    })?;
    let msgs: Vec<minijinja::Value> = messages
        .iter()
        .map(|m| minijinja::context! { role => m.role.clone(), content => m.content.clone() })
        .collect();
    let tmpl = env
        .get_template("chat")
        .map_err(|e| Status::new(StatusCode::Internal, e.to_string()))?;
    tmpl.render(minijinja::context! {
        messages => msgs,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    })
    .map_err(|e| {
        Status::new(
            StatusCode::InvalidArgument,
            format!("gguf tokenizer.chat_template fails to render: {e}"),
        )
    })
}
