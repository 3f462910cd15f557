//! Request bodies of the OpenAI API (chat completions, completions,
//! embeddings), parsed strictly and checked: a field this server does not
//! know, a value of the wrong type or out of range is a 400 naming the
//! field. Fields OpenAI defines but this server does not implement (`n`
//! above 1, penalties, logit bias, log-probabilities, tools) are accepted
//! only at their neutral values, and otherwise refused by name, so that a
//! client never gets a silently different answer.
//!
//! Extensions beyond OpenAI's fields (as vLLM and llama.cpp's server take
//! them): `top_k` and `ignore_eos`.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value as Json};

use crate::error::ApiError;

/// Parses `body` as `T`, turning serde's error into a 400 that names the
/// field at fault (its path, e.g. `messages[1].content`).
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid(
            "",
            "the request body is empty; send a JSON object",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    let out: T = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = inner.to_string();
        // serde names an unknown field in backticks; the path points at
        // the object holding it.
        let unknown = msg
            .strip_prefix("unknown field `")
            .and_then(|r| r.split('`').next());
        // The path ends with the unknown field's own name.
        let param = match (unknown, path.as_str()) {
            (Some(f), "." | "") => f.to_string(),
            (Some(f), p) if !p.ends_with(f) => format!("{p}.{f}"),
            (_, ".") => String::new(),
            (_, p) => p.to_string(),
        };
        let msg = if inner.is_syntax() || inner.is_eof() {
            format!("the request body is not valid JSON: {msg}")
        } else if param.is_empty() {
            format!("invalid request: {msg}")
        } else {
            format!("invalid field '{param}': {msg}")
        };
        ApiError::invalid(&param, msg)
    })?;
    Ok(out)
}

/// `stop`: one string or a list of up to four.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk carrying `usage` (empty `choices`).
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// A message's `content`: text, or a list of parts.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts; only `{"type": "text", "text": ...}` is supported.
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ContentPart {
    /// The part's type (`text`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Its text.
    #[serde(default)]
    pub text: Option<String>,
}

/// One chat message.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    #[serde(default)]
    pub content: Option<Content>,
    /// A participant name (accepted, not shown to the model).
    #[serde(default)]
    pub name: Option<String>,
}

/// The sampling and streaming fields chat and text completions share
/// (copied out of either request; serde's `flatten` would lose
/// `deny_unknown_fields` and the error paths).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Common {
    /// Tokens to generate at most.
    pub max_tokens: Option<i64>,
    /// Sampling temperature (0..=2; 0 is greedy). OpenAI's default is 1.
    pub temperature: Option<f32>,
    /// Nucleus sampling mass (0 < p <= 1).
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens (extension; 0 is off).
    pub top_k: Option<i64>,
    /// Seed of the sampler.
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Server-sent events instead of one JSON answer.
    pub stream: Option<bool>,
    /// Options of the stream.
    pub stream_options: Option<StreamOptions>,
    /// Choices per request (1 only).
    pub n: Option<i64>,
    /// Must be 0 if given.
    pub presence_penalty: Option<f32>,
    /// Must be 0 if given.
    pub frequency_penalty: Option<f32>,
    /// Must be empty if given.
    pub logit_bias: Option<Map<String, Json>>,
    /// An end-user id (accepted, unused).
    pub user: Option<String>,
    /// Keep generating past the end-of-sequence token (extension).
    pub ignore_eos: Option<bool>,
}

/// Declares a request struct with its own fields followed by the
/// [`Common`] fields, and `common()` copying them out.
macro_rules! sampling_request {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* }) => {
        $(#[$m])*
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
        /// Tokens to generate at most.
        #[serde(default)]
        pub max_tokens: Option<i64>,
        /// Sampling temperature (0..=2; 0 is greedy). OpenAI's default is 1.
        #[serde(default)]
        pub temperature: Option<f32>,
        /// Nucleus sampling mass (0 < p <= 1).
        #[serde(default)]
        pub top_p: Option<f32>,
        /// Keep the k most likely tokens (extension; 0 is off).
        #[serde(default)]
        pub top_k: Option<i64>,
        /// Seed of the sampler.
        #[serde(default)]
        pub seed: Option<i64>,
        /// Stop strings.
        #[serde(default)]
        pub stop: Option<Stop>,
        /// Server-sent events instead of one JSON answer.
        #[serde(default)]
        pub stream: Option<bool>,
        /// Options of the stream.
        #[serde(default)]
        pub stream_options: Option<StreamOptions>,
        /// Choices per request (1 only).
        #[serde(default)]
        pub n: Option<i64>,
        /// Must be 0 if given.
        #[serde(default)]
        pub presence_penalty: Option<f32>,
        /// Must be 0 if given.
        #[serde(default)]
        pub frequency_penalty: Option<f32>,
        /// Must be empty if given.
        #[serde(default)]
        pub logit_bias: Option<Map<String, Json>>,
        /// An end-user id (accepted, unused).
        #[serde(default)]
        pub user: Option<String>,
        /// Keep generating past the end-of-sequence token (extension).
        #[serde(default)]
        pub ignore_eos: Option<bool>,
        }

        impl $name {
            /// The shared sampling fields.
            pub fn common(&self) -> Common {
                Common {
                    max_tokens: self.max_tokens.clone(),
                    temperature: self.temperature.clone(),
                    top_p: self.top_p.clone(),
                    top_k: self.top_k.clone(),
                    seed: self.seed.clone(),
                    stop: self.stop.clone(),
                    stream: self.stream.clone(),
                    stream_options: self.stream_options.clone(),
                    n: self.n.clone(),
                    presence_penalty: self.presence_penalty.clone(),
                    frequency_penalty: self.frequency_penalty.clone(),
                    logit_bias: self.logit_bias.clone(),
                    user: self.user.clone(),
                    ignore_eos: self.ignore_eos.clone(),
                }
            }
        }
    };
}

sampling_request! {
/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The loaded model's name or `default`.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// OpenAI's newer name for `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    /// Must be false if given.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// Must be absent or 0.
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// Only `{"type": "text"}`.
    #[serde(default)]
    pub response_format: Option<Json>,
    /// Must be absent or empty.
    #[serde(default)]
    pub tools: Option<Vec<Json>>,
    /// Must be absent or `none`.
    #[serde(default)]
    pub tool_choice: Option<Json>,
    /// Accepted (no tools run here).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
}
}

/// `prompt` of a text completion.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<i64>),
    /// A batch of texts (one only).
    Texts(Vec<String>),
    /// A batch of id lists (one only).
    IdLists(Vec<Vec<i64>>),
}

sampling_request! {
/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    /// The loaded model's name or `default`.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Must be false if given.
    #[serde(default)]
    pub echo: Option<bool>,
    /// Must be absent or 1.
    #[serde(default)]
    pub best_of: Option<i64>,
    /// Must be absent or 0.
    #[serde(default)]
    pub logprobs: Option<i64>,
    /// Must be absent or empty.
    #[serde(default)]
    pub suffix: Option<String>,
}
}

/// `input` of an embeddings request.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// One text.
    One(String),
    /// Several texts.
    Many(Vec<String>),
}

/// `POST /v1/embeddings`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    /// The embeddings model's name or `default`.
    pub model: String,
    /// Texts to embed.
    pub input: EmbeddingInput,
    /// `float` (default) or `base64` (little-endian f32 bytes).
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Must be absent or the model's width.
    #[serde(default)]
    pub dimensions: Option<i64>,
    /// An end-user id (accepted, unused).
    #[serde(default)]
    pub user: Option<String>,
}

/// What the engine needs to run one generation, after validation.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// Tokens to generate at most (None: up to the context).
    pub max_tokens: Option<usize>,
    /// Sampling.
    pub sampling: ferrite_llm::Sampling,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep going past EOS.
    pub ignore_eos: bool,
    /// Stream the answer.
    pub stream: bool,
    /// Send usage in a last stream chunk.
    pub include_usage: bool,
}

/// Largest `max_tokens` accepted before the context check (any value
/// past the context fails that check anyway; this bounds the arithmetic).
const MAX_TOKENS_LIMIT: i64 = 1 << 30;

impl Common {
    /// Checks the shared fields; `default_seed` seeds sampling when the
    /// request gives no seed.
    pub fn params(
        &self,
        max_tokens: Option<i64>,
        default_seed: u64,
    ) -> Result<GenParams, ApiError> {
        let max_tokens = match max_tokens.or(self.max_tokens) {
            None => None,
            Some(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => Some(n as usize),
            Some(n) => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!("max_tokens must be at least 1, got {n}"),
                ))
            }
        };
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                "temperature",
                format!("temperature must be between 0 and 2, got {temperature}"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                "top_p",
                format!("top_p must be in (0, 1], got {top_p}"),
            ));
        }
        let top_k = match self.top_k.unwrap_or(0) {
            k if (0..=1 << 20).contains(&k) => k as usize,
            k => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("top_k must be 0 (off) or a positive count, got {k}"),
                ))
            }
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 4 {
            return Err(ApiError::invalid(
                "stop",
                format!("stop takes at most 4 strings, got {}", stop.len()),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop", "stop strings must not be empty"));
        }
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid(
                    "n",
                    format!("n must be 1 (one choice per request), got {n}"),
                ));
            }
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if let Some(v) = v {
                if v != 0.0 {
                    return Err(ApiError::invalid(
                        name,
                        format!("{name} is not supported (only 0), got {v}"),
                    ));
                }
            }
        }
        if self.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(ApiError::invalid(
                "logit_bias",
                "logit_bias is not supported (only an empty map)",
            ));
        }
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options is only allowed with stream: true",
            ));
        }
        let seed = match self.seed {
            Some(s) => s as u64,
            None => default_seed,
        };
        Ok(GenParams {
            max_tokens,
            sampling: ferrite_llm::Sampling {
                temperature,
                top_k,
                top_p,
                seed,
            },
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stream,
            include_usage: self
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        })
    }
}

impl ChatRequest {
    /// The messages as (role, text), checked.
    pub fn messages(&self) -> Result<Vec<ferrite_llm::chat::Message>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "messages must hold at least one message",
            ));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let role = match m.role.as_str() {
                    "system" | "developer" => "system",
                    "user" => "user",
                    "assistant" => "assistant",
                    other => {
                        return Err(ApiError::invalid(
                            &format!("messages[{i}].role"),
                            format!(
                            "role '{other}' is not supported (system, developer, user, assistant)"
                        ),
                        ))
                    }
                };
                let text = match &m.content {
                    None => String::new(),
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut text = String::new();
                        for (j, p) in parts.iter().enumerate() {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => text.push_str(t),
                                ("text", None) => {
                                    return Err(ApiError::invalid(
                                        &format!("messages[{i}].content[{j}].text"),
                                        "a text part needs 'text'",
                                    ))
                                }
                                (k, _) => {
                                    return Err(ApiError::invalid(
                                        &format!("messages[{i}].content[{j}].type"),
                                        format!("content part type '{k}' is not supported (text)"),
                                    ))
                                }
                            }
                        }
                        text
                    }
                };
                Ok(ferrite_llm::chat::Message::new(role, &text))
            })
            .collect()
    }

    /// Checks the chat-only fields and returns the generation parameters.
    pub fn params(&self, default_seed: u64) -> Result<GenParams, ApiError> {
        if self.logprobs == Some(true) {
            return Err(ApiError::invalid("logprobs", "logprobs is not supported"));
        }
        if self.top_logprobs.is_some_and(|n| n != 0) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs is not supported",
            ));
        }
        if let Some(f) = &self.response_format {
            if f.get("type").and_then(Json::as_str) != Some("text") {
                return Err(ApiError::invalid(
                    "response_format",
                    "response_format supports only {\"type\": \"text\"}",
                ));
            }
        }
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::invalid("tools", "tools are not supported"));
        }
        if let Some(c) = &self.tool_choice {
            if c.as_str() != Some("none") {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice supports only \"none\"",
                ));
            }
        }
        if self.max_completion_tokens.is_some() && self.max_tokens.is_some() {
            return Err(ApiError::invalid(
                "max_completion_tokens",
                "give max_tokens or max_completion_tokens, not both",
            ));
        }
        self.common()
            .params(self.max_completion_tokens, default_seed)
    }
}

/// A completion prompt after checking: text or ids.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    /// Text, to be tokenized.
    Text(String),
    /// Token ids as given.
    Ids(Vec<u32>),
}

fn ids_in_range(ids: &[i64], param: &str) -> Result<Vec<u32>, ApiError> {
    ids.iter()
        .map(|&i| {
            u32::try_from(i)
                .map_err(|_| ApiError::invalid(param, format!("token id {i} is not a valid id")))
        })
        .collect()
}

impl CompletionRequest {
    /// Checks the completion-only fields; returns the prompt and parameters.
    /// OpenAI's default `max_tokens` for completions is 16.
    pub fn checked(&self, default_seed: u64) -> Result<(PromptInput, GenParams), ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::invalid("echo", "echo is not supported"));
        }
        if self.best_of.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid("best_of", "best_of must be 1"));
        }
        if self.logprobs.is_some_and(|n| n != 0) {
            return Err(ApiError::invalid("logprobs", "logprobs is not supported"));
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "suffix is not supported"));
        }
        let prompt = match &self.prompt {
            Prompt::Text(t) => PromptInput::Text(t.clone()),
            Prompt::Ids(ids) => PromptInput::Ids(ids_in_range(ids, "prompt")?),
            Prompt::Texts(v) if v.len() == 1 => PromptInput::Text(v[0].clone()),
            Prompt::IdLists(v) if v.len() == 1 => PromptInput::Ids(ids_in_range(&v[0], "prompt")?),
            Prompt::Texts(v) if v.is_empty() => {
                return Err(ApiError::invalid("prompt", "prompt is an empty list"))
            }
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "a list of several prompts is not supported; send one prompt per request",
                ))
            }
        };
        let mut params = self.common().params(None, default_seed)?;
        params.max_tokens = Some(params.max_tokens.unwrap_or(16));
        Ok((prompt, params))
    }
}

impl EmbeddingRequest {
    /// The texts, checked against `max_inputs`.
    pub fn texts(&self, max_inputs: usize, width: usize) -> Result<Vec<String>, ApiError> {
        let texts = match &self.input {
            EmbeddingInput::One(t) => vec![t.clone()],
            EmbeddingInput::Many(v) => v.clone(),
        };
        if texts.is_empty() {
            return Err(ApiError::invalid("input", "input is an empty list"));
        }
        if texts.len() > max_inputs {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "input holds {} texts; at most {max_inputs} per request",
                    texts.len()
                ),
            ));
        }
        match self.encoding_format.as_deref() {
            None | Some("float") | Some("base64") => {}
            Some(other) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("encoding_format must be 'float' or 'base64', got '{other}'"),
                ))
            }
        }
        if let Some(d) = self.dimensions {
            if d != width as i64 {
                return Err(ApiError::invalid(
                    "dimensions",
                    format!("dimensions must be the model's {width}, got {d}"),
                ));
            }
        }
        Ok(texts)
    }

    /// True for `encoding_format: base64`.
    pub fn base64(&self) -> bool {
        self.encoding_format.as_deref() == Some("base64")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<ChatRequest, ApiError> {
        parse(body.as_bytes())
    }

    #[test]
    fn a_minimal_chat_request_parses_with_openai_defaults() {
        let r = chat(r#"{"model":"default","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        let p = r.params(7).unwrap();
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.sampling.temperature, 1.0);
        assert_eq!(p.sampling.top_p, 1.0);
        assert_eq!(p.sampling.seed, 7);
        assert!(!p.stream && !p.include_usage && !p.ignore_eos);
        let m = r.messages().unwrap();
        assert_eq!((m[0].role.as_str(), m[0].content.as_str()), ("user", "hi"));
    }

    #[test]
    fn unknown_fields_are_named_top_level_and_nested() {
        let e = chat(r#"{"model":"m","messages":[],"temprature":0}"#).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some("temprature"));
        assert!(e.message.contains("temprature"), "{}", e.message);
        let e = chat(r#"{"model":"m","messages":[{"role":"user","content":"x","colour":1}]}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].colour"));
    }

    #[test]
    fn wrong_types_and_missing_fields_name_the_field() {
        let e =
            chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}"#)
                .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = chat(r#"{"messages":[]}"#).unwrap_err();
        assert!(e.message.contains("model"), "{}", e.message);
        let e = chat(r#"{"model":"m","messages":[{"role":"user","content":5}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
    }

    #[test]
    fn malformed_json_is_a_400_saying_so() {
        let e = chat(r#"{"model":"m","messages":["#).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = chat("").unwrap_err();
        assert!(e.message.contains("empty"), "{}", e.message);
    }

    #[test]
    fn out_of_range_values_are_refused_by_name() {
        let base = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"#;
        for (field, value) in [
            ("max_tokens", "0"),
            ("temperature", "2.5"),
            ("top_p", "0"),
            ("top_k", "-1"),
            ("n", "2"),
            ("presence_penalty", "0.5"),
            ("logprobs", "true"),
            ("stop", r#"["a","b","c","d","e"]"#),
            ("tools", r#"[{"type":"function"}]"#),
        ] {
            let r = chat(&format!("{base}\"{field}\":{value}}}")).unwrap();
            let e = r.params(0).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{field}: {}", e.message);
        }
        let r = chat(&format!(
            "{base}\"stream_options\":{{\"include_usage\":true}}}}"
        ))
        .unwrap();
        assert_eq!(
            r.params(0).unwrap_err().param.as_deref(),
            Some("stream_options")
        );
        let r = chat(r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#).unwrap();
        assert_eq!(
            r.messages().unwrap_err().param.as_deref(),
            Some("messages[0].role")
        );
        let r = chat(r#"{"model":"m","messages":[]}"#).unwrap();
        assert_eq!(r.messages().unwrap_err().param.as_deref(), Some("messages"));
    }

    #[test]
    fn neutral_values_of_unimplemented_fields_are_accepted() {
        let r = chat(
            r#"{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
            "n":1,"presence_penalty":0,"frequency_penalty":0,"logit_bias":{},"logprobs":false,
            "response_format":{"type":"text"},"user":"u","stream":true,"stream_options":{"include_usage":true},
            "max_completion_tokens":5,"seed":3,"stop":"\n","temperature":0,"top_p":0.5,"top_k":4}"#,
        )
        .unwrap();
        let p = r.params(0).unwrap();
        assert_eq!(p.max_tokens, Some(5));
        assert_eq!(p.stop, vec!["\n".to_string()]);
        assert!(p.stream && p.include_usage);
        assert_eq!(
            (p.sampling.seed, p.sampling.top_k, p.sampling.top_p),
            (3, 4, 0.5)
        );
        assert_eq!(r.messages().unwrap()[0].content, "ab");
    }

    #[test]
    fn completion_prompts_take_text_ids_and_singleton_lists() {
        let c = |p: &str| -> Result<(PromptInput, GenParams), ApiError> {
            parse::<CompletionRequest>(format!(r#"{{"model":"m","prompt":{p}}}"#).as_bytes())?
                .checked(0)
        };
        let (p, g) = c(r#""hello""#).unwrap();
        assert_eq!(p, PromptInput::Text("hello".into()));
        assert_eq!(g.max_tokens, Some(16));
        assert_eq!(c("[1,2,3]").unwrap().0, PromptInput::Ids(vec![1, 2, 3]));
        assert_eq!(c(r#"["x"]"#).unwrap().0, PromptInput::Text("x".into()));
        assert_eq!(c("[[4]]").unwrap().0, PromptInput::Ids(vec![4]));
        assert_eq!(
            c(r#"["x","y"]"#).unwrap_err().param.as_deref(),
            Some("prompt")
        );
        assert_eq!(c("[-1]").unwrap_err().param.as_deref(), Some("prompt"));
        let e = parse::<CompletionRequest>(br#"{"model":"m","prompt":"x","echo":true}"#)
            .unwrap()
            .checked(0)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("echo"));
    }

    #[test]
    fn embedding_requests_are_checked() {
        let e: EmbeddingRequest =
            parse(br#"{"model":"m","input":["a","b"],"encoding_format":"base64"}"#).unwrap();
        assert_eq!(e.texts(8, 384).unwrap(), vec!["a", "b"]);
        assert!(e.base64());
        assert_eq!(e.texts(1, 384).unwrap_err().param.as_deref(), Some("input"));
        let e: EmbeddingRequest = parse(br#"{"model":"m","input":"a","dimensions":12}"#).unwrap();
        assert_eq!(
            e.texts(8, 384).unwrap_err().param.as_deref(),
            Some("dimensions")
        );
        let e: EmbeddingRequest =
            parse(br#"{"model":"m","input":"a","encoding_format":"hex"}"#).unwrap();
        assert_eq!(
            e.texts(8, 384).unwrap_err().param.as_deref(),
            Some("encoding_format")
        );
        let err = parse::<EmbeddingRequest>(br#"{"model":"m","input":"a","extra":1}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("extra"));
    }
}
