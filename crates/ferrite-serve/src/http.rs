//! The HTTP side (axum): routes, bearer-token check, body limit, request
//! metrics, and the OpenAI response shapes (JSON and server-sent events
//! ending with `data: [DONE]`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use ferrite_tokenizer::Tokenizer;
use serde_json::{json, Value as JsonValue};
use tokio::sync::mpsc;

use crate::api::{self, ChatRequest, CompletionRequest, EmbeddingRequest, GenParams, PromptInput};
use crate::embeddings::{self, Embedder};
use crate::error::ApiError;
use crate::metrics::{Metrics, RequestLabels};
use crate::scheduler::{Event, FinishReason, Job, Queue};

/// What the HTTP side knows of the loaded language model.
pub struct ModelInfo {
    /// The tokenizer (prompts are tokenized on the request's task).
    pub tokenizer: Arc<Tokenizer>,
    /// KV-cache positions per sequence.
    pub context: usize,
    /// Vocabulary size (prompt ids must be below it).
    pub vocab: usize,
    /// The file's chat template.
    pub chat_template: Option<String>,
    /// Text of the BOS token (for the template).
    pub bos_text: String,
    /// Text of the EOS token (for the template).
    pub eos_text: String,
}

/// Shared by every handler.
pub struct AppState {
    /// The language model's name (`/v1/models`; requests may also say
    /// `default`).
    pub model_name: String,
    /// Set once the engine thread has loaded the model.
    pub model: OnceLock<ModelInfo>,
    /// Whether an embeddings model was asked for.
    pub embeddings_expected: bool,
    /// Set once the embeddings model is loaded.
    pub embedder: OnceLock<Embedder>,
    /// The engine's queue.
    pub queue: Arc<Queue>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// `--api_key`.
    pub api_key: Option<String>,
    /// Body size limit in bytes.
    pub max_body: usize,
    /// Texts per embeddings request at most.
    pub max_embedding_inputs: usize,
    next_id: AtomicU64,
    started: u64,
}

impl AppState {
    /// State for a server of `model_name` in front of `queue`.
    pub fn new(
        model_name: String,
        queue: Arc<Queue>,
        metrics: Arc<Metrics>,
        api_key: Option<String>,
        max_body: usize,
        embeddings_expected: bool,
    ) -> AppState {
        AppState {
            model_name,
            model: OnceLock::new(),
            embeddings_expected,
            embedder: OnceLock::new(),
            queue,
            metrics,
            api_key,
            max_body,
            max_embedding_inputs: 256,
            next_id: AtomicU64::new(1),
            started: unix_now(),
        }
    }

    fn ready(&self) -> bool {
        self.model.get().is_some() && (!self.embeddings_expected || self.embedder.get().is_some())
    }

    fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if model == self.model_name || model == "default" {
            Ok(())
        } else {
            Err(ApiError::status(
                StatusCode::NOT_FOUND,
                format!(
                    "model '{model}' is not served here; use '{}' or 'default'",
                    self.model_name
                ),
            )
            .with_code("model_not_found"))
        }
    }

    fn loaded_model(&self) -> Result<&ModelInfo, ApiError> {
        self.model.get().ok_or_else(|| {
            ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the model is still loading; /health answers 200 once it is ready",
            )
            .with_retry_after(1)
        })
    }

    /// A seed for a request that gives none: differs per request.
    fn fresh_seed(&self) -> u64 {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn request_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{:x}{:06x}",
            self.started,
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The router with every route and layer.
pub fn router(state: Arc<AppState>) -> Router {
    let max_body = state.max_body;
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(middleware::from_fn_with_state(state.clone(), count_request))
        .with_state(state)
}

const ENDPOINTS: &[&str] = &[
    "/health",
    "/metrics",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
];

async fn count_request(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let endpoint = ENDPOINTS
        .iter()
        .find(|e| **e == path)
        .map_or("other", |e| e)
        .to_string();
    let r = next.run(req).await;
    s.metrics
        .requests
        .get_or_create(&RequestLabels {
            endpoint,
            status: r.status().as_u16(),
        })
        .inc();
    r
}

/// Constant-time comparison, so the key cannot be guessed byte by byte
/// from response times.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authorize(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(g) if same_secret(g.trim().as_bytes(), key.as_bytes()) => {}
            Some(_) => {
                return ApiError::status(StatusCode::UNAUTHORIZED, "incorrect API key")
                    .with_code("invalid_api_key")
                    .into_response()
            }
            None => {
                return ApiError::status(
                    StatusCode::UNAUTHORIZED,
                    "missing API key: send 'Authorization: Bearer <key>'",
                )
                .with_code("invalid_api_key")
                .into_response()
            }
        }
    }
    next.run(req).await
}

async fn not_found(req: Request) -> ApiError {
    ApiError::status(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    if s.ready() {
        (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "loading"})),
        )
            .into_response()
    }
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    s.metrics.queue_depth.set(s.queue.depth() as i64);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        s.metrics.render(),
    )
        .into_response()
}

async fn models(State(s): State<Arc<AppState>>) -> Json<JsonValue> {
    let mut data = vec![json!({
        "id": s.model_name, "object": "model", "created": s.started, "owned_by": "ferrite"
    })];
    if s.embeddings_expected {
        data.push(json!({
            "id": embeddings::MODEL_NAME, "object": "model", "created": s.started, "owned_by": "ferrite"
        }));
    }
    Json(json!({"object": "list", "data": data}))
}

fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::status(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is larger than {limit} bytes (--max_body)"),
            )
        } else {
            ApiError::status(r.status(), format!("reading the request body: {r}"))
        }
    })
}

/// Response shapes of the two generation endpoints.
#[derive(Clone)]
struct Shape {
    chat: bool,
    id: String,
    created: u64,
    model: String,
}

impl Shape {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.chat, chunk) {
            (true, true) => "chat.completion.chunk",
            (true, false) => "chat.completion",
            (false, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: JsonValue) -> JsonValue {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    fn choice(&self, text: Option<&str>, role: bool, finish: Option<FinishReason>) -> JsonValue {
        let finish = finish.map(FinishReason::as_str);
        if self.chat {
            let mut delta = serde_json::Map::new();
            if role {
                delta.insert("role".into(), json!("assistant"));
            }
            if let Some(t) = text {
                delta.insert("content".into(), json!(t));
            }
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
        }
    }

    fn chunk(&self, text: Option<&str>, role: bool, finish: Option<FinishReason>) -> String {
        self.envelope(true, json!([self.choice(text, role, finish)]))
            .to_string()
    }

    fn usage(prompt: usize, completion: usize) -> JsonValue {
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
    }

    fn usage_chunk(&self, prompt: usize, completion: usize) -> String {
        let mut v = self.envelope(true, json!([]));
        v["usage"] = Self::usage(prompt, completion);
        v.to_string()
    }

    fn whole(
        &self,
        text: &str,
        finish: FinishReason,
        prompt: usize,
        completion: usize,
    ) -> JsonValue {
        let choice = if self.chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish.as_str()})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish.as_str()})
        };
        let mut v = self.envelope(false, json!([choice]));
        v["usage"] = Self::usage(prompt, completion);
        v
    }
}

async fn chat(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = body_bytes(body, s.max_body)?;
    let req: ChatRequest = api::parse(&body)?;
    s.check_model(&req.model)?;
    let params = req.params(s.fresh_seed())?;
    let messages = req.messages()?;
    let info = s.loaded_model()?;
    let template = info.chat_template.as_deref().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "the model file has no chat template (tokenizer.chat_template); use /v1/completions",
        )
    })?;
    let text = ferrite_llm::chat::render(template, &messages, true, &info.bos_text, &info.eos_text)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let ids = info
        .tokenizer
        .encode(&text, false, false)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let shape = Shape {
        chat: true,
        id: s.request_id("chatcmpl"),
        created: unix_now(),
        model: s.model_name.clone(),
    };
    generate(&s, info, ids, params, shape, "messages", arrived).await
}

async fn completions(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let body = body_bytes(body, s.max_body)?;
    let req: CompletionRequest = api::parse(&body)?;
    s.check_model(&req.model)?;
    let (prompt, params) = req.checked(s.fresh_seed())?;
    let info = s.loaded_model()?;
    let ids = match prompt {
        PromptInput::Text(t) => info
            .tokenizer
            .encode(&t, false, false)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
        PromptInput::Ids(ids) => {
            if let Some(bad) = ids.iter().find(|&&i| i as usize >= info.vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary of {}", info.vocab),
                ));
            }
            ids
        }
    };
    let shape = Shape {
        chat: false,
        id: s.request_id("cmpl"),
        created: unix_now(),
        model: s.model_name.clone(),
    };
    generate(&s, info, ids, params, shape, "prompt", arrived).await
}

/// Checks the prompt against the context, queues the job and answers
/// (JSON or SSE).
async fn generate(
    s: &AppState,
    info: &ModelInfo,
    ids: Vec<u32>,
    params: GenParams,
    shape: Shape,
    prompt_field: &str,
    arrived: Instant,
) -> Result<Response, ApiError> {
    if ids.is_empty() {
        return Err(ApiError::invalid(prompt_field, "the prompt is empty"));
    }
    let room = info.context.saturating_sub(ids.len());
    if room == 0 {
        return Err(ApiError::invalid(
            prompt_field,
            format!(
                "the prompt has {} tokens; the model's context holds {} (prompt and completion together)",
                ids.len(),
                info.context
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let max_tokens = match params.max_tokens {
        None => room,
        Some(m) if m <= room => m,
        Some(m) => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!(
                "the context holds {} tokens; the prompt has {} and max_tokens asks for {m} more",
                info.context,
                ids.len()
            ),
            )
            .with_code("context_length_exceeded"))
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    s.queue.submit(Job {
        prompt: ids,
        max_tokens,
        sampling: params.sampling.clone(),
        stop: params.stop.clone(),
        ignore_eos: params.ignore_eos,
        events: tx,
        arrived,
    })?;
    if params.stream {
        return Ok(stream_response(rx, shape, params.include_usage));
    }
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
            } => {
                return Ok(
                    Json(shape.whole(&text, finish, prompt_tokens, completion_tokens))
                        .into_response(),
                )
            }
            Event::Error(e) => return Err(e),
        }
    }
    Err(ApiError::status(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the engine stopped before the generation ended",
    ))
}

struct StreamState {
    rx: mpsc::UnboundedReceiver<Event>,
    shape: Shape,
    include_usage: bool,
    out: VecDeque<String>,
    done: bool,
}

/// Server-sent events as OpenAI sends them: one `data:` JSON chunk per
/// piece of text (chat streams open with the assistant role), a chunk with
/// the finish reason, optionally one with usage, then `data: [DONE]`. A
/// failure after the headers went out is an `{"error": ...}` chunk (the
/// openai clients raise it) followed by `[DONE]`.
fn stream_response(
    rx: mpsc::UnboundedReceiver<Event>,
    shape: Shape,
    include_usage: bool,
) -> Response {
    let mut out = VecDeque::new();
    if shape.chat {
        out.push_back(shape.chunk(Some(""), true, None));
    }
    let state = StreamState {
        rx,
        shape,
        include_usage,
        out,
        done: false,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(data) = st.out.pop_front() {
                return Some((Ok::<_, Infallible>(SseEvent::default().data(data)), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(Event::Text(t)) => st.out.push_back(st.shape.chunk(Some(&t), false, None)),
                Some(Event::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    st.out.push_back(st.shape.chunk(None, false, Some(finish)));
                    if st.include_usage {
                        st.out
                            .push_back(st.shape.usage_chunk(prompt_tokens, completion_tokens));
                    }
                    st.out.push_back("[DONE]".into());
                    st.done = true;
                }
                Some(Event::Error(e)) => {
                    st.out.push_back(e.body().to_string());
                    st.out.push_back("[DONE]".into());
                    st.done = true;
                }
                None => {
                    let e = ApiError::status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the engine stopped before the generation ended",
                    );
                    st.out.push_back(e.body().to_string());
                    st.out.push_back("[DONE]".into());
                    st.done = true;
                }
            }
        }
    });
    Sse::new(stream).into_response()
}

async fn embeddings(
    State(s): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, s.max_body)?;
    let req: EmbeddingRequest = api::parse(&body)?;
    if !s.embeddings_expected {
        return Err(ApiError::status(
            StatusCode::NOT_FOUND,
            "no embeddings model is loaded: start the server with --embeddings=DIR (MiniLM: model.safetensors and tokenizer.json)",
        )
        .with_code("model_not_found"));
    }
    if req.model != embeddings::MODEL_NAME && req.model != "default" {
        return Err(ApiError::status(
            StatusCode::NOT_FOUND,
            format!(
                "model '{}' is not served here; use '{}' or 'default'",
                req.model,
                embeddings::MODEL_NAME
            ),
        )
        .with_code("model_not_found"));
    }
    let texts = req.texts(s.max_embedding_inputs, embeddings::WIDTH)?;
    let embedder = s.embedder.get().ok_or_else(|| {
        ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the embeddings model is still loading",
        )
        .with_retry_after(1)
    })?;
    let out = embedder
        .embed(texts)
        .await
        .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let b64 = req.base64();
    let data: Vec<JsonValue> = out
        .vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if b64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": embeddings::MODEL_NAME,
        "usage": {"prompt_tokens": out.tokens, "total_tokens": out.tokens},
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
    }

    #[test]
    fn stream_chunks_have_openai_shapes() {
        let shape = Shape {
            chat: true,
            id: "chatcmpl-1".into(),
            created: 5,
            model: "m".into(),
        };
        let first: JsonValue = serde_json::from_str(&shape.chunk(Some(""), true, None)).unwrap();
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert!(first["choices"][0]["finish_reason"].is_null());
        let last: JsonValue =
            serde_json::from_str(&shape.chunk(None, false, Some(FinishReason::Length))).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["choices"][0]["delta"], json!({}));
        let usage: JsonValue = serde_json::from_str(&shape.usage_chunk(3, 4)).unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 7);
        let text = Shape {
            chat: false,
            ..shape
        };
        let whole = text.whole("hi", FinishReason::Stop, 2, 1);
        assert_eq!(whole["object"], "text_completion");
        assert_eq!(whole["choices"][0]["text"], "hi");
        assert_eq!(whole["usage"]["prompt_tokens"], 2);
    }
}
