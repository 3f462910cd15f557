//! `ferrite serve`: an OpenAI-compatible HTTP server for a GGUF language
//! model (and optionally MiniLM embeddings) on Ferrite.
//!
//! ```text
//! ferrite serve --gguf=SmolLM2-135M-Instruct.Q4_1.gguf [--embeddings=.cache/minilm]
//!     [--device=local-task] [--host=127.0.0.1] [--port=8000] [--api_key=KEY]
//!     [--max_batch=N] [--max_queue=N]
//! ```
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (JSON,
//! or server-sent events with `"stream": true`), `POST /v1/embeddings`,
//! `GET /v1/models`, `GET /health` (200 once the models are loaded, 503
//! before), `GET /metrics` (Prometheus text).
//!
//! Layout:
//! - [`api`]: request bodies, parsed strictly, checked by field;
//! - [`http`]: routes, auth, limits, response shapes and streaming;
//! - [`scheduler`]: the queue and the engine thread's continuous batching;
//! - [`engine`]: the model interface the scheduler drives;
//! - [`stop`]: stop strings over streamed text;
//! - [`embeddings`]: MiniLM, called as futures;
//! - [`metrics`]: the Prometheus registry.
//!
//! The server binds 127.0.0.1 unless `--host` says otherwise, prints
//! `ferrite serve: listening on http://ADDR` on stderr once bound (port 0
//! picks a free port), and on SIGTERM or Ctrl-C stops accepting requests,
//! fails queued ones (503), lets running generations finish for up to
//! `--shutdown_timeout` seconds, cancels what is left (an error event on
//! the stream) and exits; a second signal cancels at once.
#![deny(missing_docs)]

pub mod api;
pub mod embeddings;
pub mod engine;
pub mod error;
pub mod http;
pub mod metrics;
pub mod scheduler;
pub mod stop;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrite_llm::{BatchLlm, Llm, Result, Status, StatusCode};
use tokio::sync::Notify;

use crate::engine::{BatchEngine, Engine, LlmEngine};
use crate::http::{AppState, ModelInfo};
use crate::metrics::Metrics;
use crate::scheduler::{Queue, Scheduler, SchedulerConfig};

/// Arguments of `ferrite serve`.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// The language model (.gguf; SmolLM2-135M's architecture).
    #[arg(long)]
    pub gguf: PathBuf,
    /// MiniLM for /v1/embeddings: the directory holding model.safetensors
    /// and tokenizer.json (`python examples/minilm/assets.py` fills
    /// .cache/minilm). Without it /v1/embeddings answers 404.
    #[arg(long)]
    pub embeddings: Option<PathBuf>,
    /// A MiniLM program file instead of the built-in one.
    #[arg(long = "embeddings_module")]
    pub embeddings_module: Option<PathBuf>,
    /// The device (local-sync, local-task, local-task://?workers=N, cuda).
    #[arg(long, default_value = "local-task")]
    pub device: String,
    /// The address to bind (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port (0: any free port; the bound address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer <KEY>` on every request.
    #[arg(long = "api_key")]
    pub api_key: Option<String>,
    /// Sequences decoded together at most (capped by the program's slots).
    #[arg(long = "max_batch", default_value_t = 16)]
    pub max_batch: usize,
    /// Requests waiting for a slot at most; more are answered 429.
    #[arg(long = "max_queue", default_value_t = 64)]
    pub max_queue: usize,
    /// Request bodies larger than this many bytes are answered 413.
    #[arg(long = "max_body", default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Prompt tokens prefilled per step while other sequences decode.
    #[arg(long = "prefill_chunk", default_value_t = 64)]
    pub prefill_chunk: usize,
    /// Seconds running generations may go on after SIGTERM.
    #[arg(long = "shutdown_timeout", default_value_t = 10.0)]
    pub shutdown_timeout: f64,
    /// A batch program to use instead of the built-in one (entry points
    /// `prefill_slot`, `decode_batch`, `slots`, `context_length`; e.g. one
    /// compiled for cuda).
    #[arg(long = "batch_module", conflicts_with = "module")]
    pub batch_module: Option<PathBuf>,
    /// A single-sequence program instead (entry points `prefill`, `decode`,
    /// as `ferrite generate --module`): one sequence at a time.
    #[arg(long)]
    pub module: Option<PathBuf>,
}

fn io_error(what: &str, e: std::io::Error) -> Status {
    Status::new(StatusCode::Unavailable, format!("{what}: {e}"))
}

/// The model's name: the file name without `.gguf`.
pub fn model_name(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "model".into());
    name.strip_suffix(".gguf").unwrap_or(&name).to_string()
}

/// Loads the engine named by the arguments: the batch program unless a
/// single-sequence program is given with `--module`.
fn load_engine(args: &ServeArgs) -> Result<Box<dyn Engine>> {
    if let Some(module) = &args.module {
        let llm = Llm::load_with_program(&args.gguf, &args.device, Some(module))?;
        if args.max_batch > 1 {
            eprintln!(
                "ferrite serve: the single-sequence program runs one sequence at a time (--max_batch={} capped to 1)",
                args.max_batch
            );
        }
        return Ok(Box::new(LlmEngine::new(llm)));
    }
    let llm = BatchLlm::load_with_program(&args.gguf, &args.device, args.batch_module.as_deref())?;
    Ok(Box::new(BatchEngine::new(llm)))
}

/// What the HTTP side needs of the model: tokenizer and context from the
/// engine, chat template and BOS/EOS text from the file's metadata.
fn model_info(engine: &dyn Engine, gguf: &Path) -> Result<ModelInfo> {
    let file = ferrite_llm::gguf::GgufFile::open(gguf)?;
    let tokenizer = engine.tokenizer();
    let text = |key: &str| {
        file.int(key)
            .ok()
            .and_then(|v| u32::try_from(v).ok())
            .and_then(|id| tokenizer.id_to_token(id))
            .unwrap_or_default()
    };
    Ok(ModelInfo {
        context: engine.context_length(),
        vocab: engine.vocab(),
        chat_template: file.str("tokenizer.chat_template").ok().map(str::to_string),
        bos_text: text("tokenizer.ggml.bos_token_id"),
        eos_text: text("tokenizer.ggml.eos_token_id"),
        tokenizer,
    })
}

/// Runs the server until SIGTERM / Ctrl-C (or a failure to load).
pub fn run(args: &ServeArgs) -> Result<()> {
    if args.max_batch == 0 {
        return Err(Status::new(
            StatusCode::InvalidArgument,
            "--max_batch must be at least 1",
        ));
    }
    if !(args.shutdown_timeout.is_finite() && args.shutdown_timeout >= 0.0) {
        return Err(Status::new(
            StatusCode::InvalidArgument,
            "--shutdown_timeout must be a non-negative number of seconds",
        ));
    }
    if !args.gguf.exists() {
        return Err(Status::new(
            StatusCode::NotFound,
            format!("--gguf {}: no such file", args.gguf.display()),
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ferrite-serve-http")
        .enable_all()
        .build()
        .map_err(|e| io_error("starting the async runtime", e))?;
    runtime.block_on(serve(args.clone()))
}

async fn serve(args: ServeArgs) -> Result<()> {
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| io_error(&format!("binding {addr}"), e))?;
    let bound: SocketAddr = listener
        .local_addr()
        .map_err(|e| io_error("reading the bound address", e))?;

    let metrics = Arc::new(Metrics::new());
    let queue = Arc::new(Queue::new(args.max_queue, metrics.clone()));
    let state = Arc::new(AppState::new(
        model_name(&args.gguf),
        queue.clone(),
        metrics.clone(),
        args.api_key.clone(),
        args.max_body,
        args.embeddings.is_some(),
    ));
    let failure: Arc<Mutex<Option<Status>>> = Arc::default();
    let fail = Arc::new(Notify::new());
    let stop_now = Arc::new(AtomicBool::new(false));
    let report = {
        let (failure, fail) = (failure.clone(), fail.clone());
        move |e: Status| {
            if let Ok(mut f) = failure.lock() {
                f.get_or_insert(e);
            }
            fail.notify_one();
        }
    };

    let mut signals = Signals::new();
    eprintln!("ferrite serve: listening on http://{bound}");
    eprintln!(
        "ferrite serve: loading {} on {}",
        args.gguf.display(),
        args.device
    );

    // The engine thread: loads the model, publishes what the handlers need,
    // then schedules until the queue closes.
    let engine_thread = {
        let (state, queue, metrics, stop_now, report) = (
            state.clone(),
            queue.clone(),
            metrics.clone(),
            stop_now.clone(),
            report.clone(),
        );
        let args = args.clone();
        std::thread::Builder::new()
            .name("ferrite-serve-engine".into())
            .spawn(move || {
                let mut engine = match load_engine(&args) {
                    Ok(e) => e,
                    Err(e) => return report(e),
                };
                match model_info(engine.as_ref(), &args.gguf) {
                    Ok(info) => {
                        let _ = state.model.set(info);
                    }
                    Err(e) => return report(e),
                }
                eprintln!(
                    "ferrite serve: model '{}' loaded ({} slot(s), context {})",
                    state.model_name,
                    engine.slots().min(args.max_batch),
                    engine.context_length()
                );
                let config = SchedulerConfig {
                    max_batch: args.max_batch,
                    prefill_chunk: args.prefill_chunk,
                    shutdown_grace: Duration::from_secs_f64(args.shutdown_timeout),
                };
                // A bug that panics here must not leave requests waiting on
                // a queue nobody serves: close it and shut the server down.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    Scheduler::new(engine.as_mut(), queue.clone(), metrics, config).run(&stop_now)
                }));
                if ran.is_err() {
                    queue.close();
                    report(Status::new(
                        StatusCode::Internal,
                        "the engine thread panicked; shutting down",
                    ));
                }
            })
            .map_err(|e| io_error("starting the engine thread", e))?
    };
    if let Some(dir) = args.embeddings.clone() {
        let (state, report) = (state.clone(), report.clone());
        let (module, device) = (args.embeddings_module.clone(), args.device.clone());
        tokio::task::spawn_blocking(move || {
            match embeddings::Embedder::load(&dir, module.as_deref(), &device) {
                Ok(e) => {
                    let _ = state.embedder.set(e);
                    eprintln!(
                        "ferrite serve: embeddings model '{}' loaded",
                        embeddings::MODEL_NAME
                    );
                }
                Err(e) => report(e),
            }
        });
    }

    let shutdown = {
        let (queue, stop_now, fail) = (queue.clone(), stop_now.clone(), fail.clone());
        async move {
            let why = tokio::select! {
                s = signals.next() => s,
                _ = fail.notified() => "fatal error",
            };
            eprintln!("ferrite serve: {why}: shutting down");
            queue.close();
            tokio::spawn(async move {
                let s = signals.next().await;
                eprintln!("ferrite serve: {s} again: cancelling running generations");
                stop_now.store(true, Ordering::Relaxed);
            });
        }
    };
    let served = axum::serve(listener, http::router(state.clone()))
        .with_graceful_shutdown(shutdown)
        .await;
    // The engine ends once every running sequence has finished or been
    // cancelled; make sure it stops even if the server ended on an error.
    queue.close();
    let joined = tokio::task::spawn_blocking(move || engine_thread.join()).await;
    if let Ok(Err(_)) | Err(_) = joined {
        return Err(Status::new(
            StatusCode::Internal,
            "the engine thread panicked",
        ));
    }
    if let Some(e) = failure.lock().ok().and_then(|mut f| f.take()) {
        return Err(e);
    }
    served.map_err(|e| io_error("serving", e))?;
    eprintln!("ferrite serve: stopped");
    Ok(())
}

/// SIGTERM and Ctrl-C (SIGINT). The SIGTERM handler is installed when this
/// is made (before the server says it is listening), so a SIGTERM that
/// comes early still shuts down cleanly instead of killing the process.
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Signals {
        Signals {
            #[cfg(unix)]
            term: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok(),
        }
    }

    /// Resolves at the next SIGTERM or SIGINT; says which.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        if let Some(term) = &mut self.term {
            return tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    }
}
