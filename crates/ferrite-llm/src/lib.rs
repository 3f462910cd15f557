//! Text generation with GGUF language models on Ferrite.
//!
//! One implementation under the CLI (`ferrite generate`), Python
//! (`ferrite.llm`) and Rust callers:
//!
//! - [`gguf`]: the file's metadata and tensor table; the architecture and
//!   every tensor the program reads are checked against it before loading
//!   (a missing tensor or one of an unexpected type is an error naming it);
//! - [`tokenizer`]: the tokenizer from `tokenizer.ggml.*`;
//! - [`chat`]: the chat template from `tokenizer.chat_template`;
//! - [`sampling`]: greedy, temperature, top-k, top-p, seeded;
//! - [`Llm`]: the compiled program (`examples/llm/smollm2.vmfb`, built into
//!   this crate; its `prefill`/`decode` read the weights from the `.gguf`
//!   by name, the KV cache is program state on the device, allocated by
//!   its `init_cache` for the context asked for at load) and the generate
//!   loop with streaming and stop conditions.
//!
//! ```no_run
//! # fn main() -> ferrite::Result<()> {
//! let mut llm = ferrite_llm::Llm::load("SmolLM2-135M-Instruct.Q4_1.gguf", "local-task")?;
//! let prompt = llm.chat_prompt("What is the capital of France?")?;
//! let out = llm.generate(&prompt, &ferrite_llm::Options::default(), |_, text| {
//!     print!("{text}");
//!     true
//! })?;
//! eprintln!("{} tokens", out.ids.len());
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod batch;
pub mod chat;
pub mod gguf;
mod model;
pub mod pipeline;
pub mod sampling;
pub mod tokenizer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrite::{Instance, Session, Tensor, Value};
pub use ferrite::{Result, Status, StatusCode};
use ferrite_tokenizer::{DecodeStream, Tokenizer};

pub use batch::{BatchLlm, StepRow, SMOLLM2_BATCH_VMFB};
pub use model::{check_model, Architecture, SMOLLM2_135M};
pub use sampling::Sampling;

use model::{chat_ids, finish_load, TextSide};

/// The committed program for SmolLM2-135M (llama architecture, Q4_1 matrices
/// and a Q8_0 tied embedding), compiled from `examples/llm/model.py`.
pub static SMOLLM2_VMFB: &[u8] = include_bytes!("../../../examples/llm/smollm2.vmfb");

/// The KV cache's capacity in positions when the caller asks for none: the
/// cache then takes 45 KiB per position on the device (30 layers x K and V
/// x 3 heads x 64 f32), 90 MiB for 2048.
pub const DEFAULT_CONTEXT: usize = 2048;

/// The largest context the program's `init_cache` accepts (SmolLM2's
/// trained `llama.context_length`).
pub const MAX_CONTEXT: usize = 8192;

/// Bytes of the single-sequence program's KV cache for `context` positions.
pub fn kv_cache_bytes(context: usize) -> usize {
    let a = &SMOLLM2_135M;
    (a.layers * 2 * a.kv_heads * (a.dim / a.heads) * 4) as usize * context
}

/// Options of one generation.
#[derive(Clone, Debug)]
pub struct Options {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// How tokens are chosen.
    pub sampling: Sampling,
    /// Stop at the end-of-sequence token (on by default).
    pub stop_at_eos: bool,
    /// Stop when the generated text contains one of these (the text
    /// returned ends before it).
    pub stop: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_tokens: 128,
            sampling: Sampling::default(),
            stop_at_eos: true,
            stop: Vec::new(),
        }
    }
}

/// Why a generation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The end-of-sequence token came (not included in the ids).
    Eos,
    /// `max_tokens` were generated.
    Length,
    /// A stop string appeared.
    Stop,
    /// The callback asked to stop.
    Cancelled,
}

/// The result of [`Llm::generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated token ids.
    pub ids: Vec<u32>,
    /// Their text (special tokens skipped; cut before a stop string).
    pub text: String,
    /// Why it ended.
    pub finish: Finish,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Time to the first token: prefill plus choosing it.
    pub time_to_first_token: Duration,
    /// Time of the decode steps (each step: one `decode` call and a choice).
    pub decode_time: Duration,
    /// Number of decode steps.
    pub decode_steps: usize,
}

impl Generation {
    /// Decode tokens per second.
    pub fn decode_tokens_per_second(&self) -> f64 {
        if self.decode_steps == 0 {
            return 0.0;
        }
        self.decode_steps as f64 / self.decode_time.as_secs_f64()
    }
}

/// A loaded model: the program on a device with the `.gguf` as its
/// parameters, the tokenizer and chat template from the same file.
pub struct Llm {
    session: Session,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<String>,
    bos: Option<u32>,
    eos: Option<u32>,
    vocab: usize,
    context: usize,
    /// The largest context `set_context` accepts (the file's trained
    /// context, at most [`MAX_CONTEXT`]).
    max_context: usize,
    gguf_path: PathBuf,
    /// The host copy of the last call's logits, reused by every call (a
    /// fresh buffer per token costs page faults; see
    /// [`ferrite::DeviceTensor::read_into`]).
    logits_buf: Mutex<Vec<f32>>,
    /// Whether the program has `decode_greedy` (the cuda program): greedy
    /// generation then runs [`pipeline::decode`].
    greedy_step: bool,
}

fn check_context(context: usize, max: usize) -> Result<()> {
    if context == 0 || context > max {
        return Err(Status::new(
            StatusCode::InvalidArgument,
            format!(
                "context of {context} positions asked for; it must be 1..={max} \
                 (the model's trained context, at most {MAX_CONTEXT})"
            ),
        ));
    }
    Ok(())
}

impl Llm {
    /// Loads the `.gguf` at `path` with the built-in program on `device`
    /// (`local-sync`, `local-task`, `local-task://?workers=N`, ...), its KV
    /// cache sized for [`DEFAULT_CONTEXT`] positions.
    pub fn load(path: impl AsRef<Path>, device: &str) -> Result<Llm> {
        Llm::load_with_program(path, device, None)
    }

    /// As [`Llm::load`], with a program file instead of the built-in one
    /// (the same entry points: `init_cache`, `prefill`, `decode`,
    /// `context_length`).
    pub fn load_with_program(
        path: impl AsRef<Path>,
        device: &str,
        program: Option<&Path>,
    ) -> Result<Llm> {
        Llm::load_with_context(path, device, program, DEFAULT_CONTEXT)
    }

    /// As [`Llm::load_with_program`], with the KV cache allocated on the
    /// device for exactly `context` positions (prompt plus generated
    /// tokens; 1 up to the file's `llama.context_length` and
    /// [`MAX_CONTEXT`]). Positions past it are an error.
    pub fn load_with_context(
        path: impl AsRef<Path>,
        device: &str,
        program: Option<&Path>,
        context: usize,
    ) -> Result<Llm> {
        let path = path.as_ref();
        if program.is_none() && device.starts_with("cuda") {
            // The built-in program holds only llvm-cpu executables.
            return Err(Status::new(
                StatusCode::InvalidArgument,
                format!(
                    "the built-in program is compiled for the CPU; device '{device}' needs a program \
                     compiled for cuda: examples/llm/build_cuda.py writes \
                     build/llm/smollm2-cuda.vmfb (ferrite generate --module=PATH, ferrite.llm.load(..., program=PATH))"
                ),
            ));
        }
        let file = gguf::GgufFile::open(path)?;
        check_model(&file, &SMOLLM2_135M)?;
        // Checked before anything is allocated: the file's trained context
        // bounds what the model can attend to meaningfully.
        let trained = file
            .int("llama.context_length")
            .ok()
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(MAX_CONTEXT);
        check_context(context, trained.min(MAX_CONTEXT))?;
        let TextSide {
            tokenizer,
            chat_template,
            bos,
            eos,
        } = TextSide::load(&file)?;
        // The parsed header (its vocabulary arrays) is not needed past here.
        drop(file);
        let instance = Instance::new();
        let mut session = Session::new(&instance, device)?;
        session.add_parameter_file("model", path)?;
        match program {
            Some(p) => session.load_file(p)?,
            None => session.load_static(SMOLLM2_VMFB)?,
        };
        let mut llm = Llm {
            session,
            tokenizer,
            chat_template,
            bos,
            eos,
            vocab: SMOLLM2_135M.vocab as usize,
            context: 0,
            max_context: trained.min(MAX_CONTEXT),
            gguf_path: path.to_path_buf(),
            logits_buf: Mutex::new(Vec::new()),
            greedy_step: false,
        };
        llm.greedy_step = llm.session.function(pipeline::ENTRY).is_ok();
        llm.set_context(context)?;
        finish_load(&llm.tokenizer)?;
        Ok(llm)
    }

    /// Re-allocates the KV cache on the device for `context` positions
    /// (the program's `init_cache`; the old cache is released, so what it
    /// held is gone: the next generation starts from its prompt as always).
    pub fn set_context(&mut self, context: usize) -> Result<()> {
        check_context(context, self.max_context)?;
        self.session
            .call("init_cache", &[Value::I32(context as i32)])?;
        // The program's own view of its capacity (the cache's dimension),
        // so that the host checks and the program's asserts agree.
        let got = self
            .session
            .call("context_length", &[])?
            .first()
            .and_then(Value::as_i32)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| Status::new(StatusCode::Internal, "context_length returned no i32"))?;
        if got != context {
            return Err(Status::new(
                StatusCode::Internal,
                format!("init_cache({context}) left a cache of {got} positions"),
            ));
        }
        self.context = got;
        Ok(())
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The KV cache's capacity in positions (prompt plus generated tokens),
    /// as the program reports it.
    pub fn context_length(&self) -> usize {
        self.context
    }

    /// Bytes live in the device allocator now (allocated minus freed): the
    /// KV cache, the weights the device copied and anything else the
    /// program keeps; what a context's cache costs shows as the difference
    /// between two contexts.
    pub fn device_bytes_live(&self) -> u64 {
        let Some(device) = self.session.devices().first() else {
            return 0;
        };
        let hal = &device.hal().0;
        // The program's state (the cache) comes from queue-ordered
        // allocations, the rest from the device allocator; count both
        // (once where the device has no separate queue pool).
        let (main, queue) = (hal.allocator(), hal.queue_allocator());
        let same = std::ptr::eq(
            Arc::as_ptr(&main) as *const (),
            Arc::as_ptr(&queue) as *const (),
        );
        [Some(main), (!same).then_some(queue)]
            .iter()
            .flatten()
            .map(|a| {
                let s = a.statistics();
                // Host-local heaps (the CPU devices) count as host bytes,
                // device-local ones (cuda) as device bytes; a heap that is
                // both counts in both, so take the larger.
                let host = s.host_bytes_allocated.saturating_sub(s.host_bytes_freed);
                let dev = s
                    .device_bytes_allocated
                    .saturating_sub(s.device_bytes_freed);
                host.max(dev)
            })
            .sum()
    }

    /// The largest context [`Llm::set_context`] accepts for this file.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// The end-of-sequence id, if the file names one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The `.gguf` this model was loaded from.
    pub fn gguf_path(&self) -> &Path {
        &self.gguf_path
    }

    /// Token ids of `text` (special tokens in the text are matched; no BOS
    /// added, as `tokenizer.ggml.add_bos_token` says for SmolLM2).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(text, false, false)
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, true)
    }

    /// The file's chat template applied to one user message, with the
    /// assistant's turn opened; returns its token ids.
    pub fn chat_prompt(&self, user: &str) -> Result<Vec<u32>> {
        self.chat_prompt_messages(&[chat::Message::new("user", user)])
    }

    /// The chat template over `messages`, generation prompt added.
    pub fn chat_prompt_messages(&self, messages: &[chat::Message]) -> Result<Vec<u32>> {
        chat_ids(
            &self.tokenizer,
            self.chat_template.as_deref(),
            self.bos,
            self.eos,
            messages,
        )
    }

    /// Calls `entry` with its tensor results left on the device and reads
    /// the logits through the reused host buffer.
    fn call_logits(&self, entry: &str, args: &[Value]) -> Result<Vec<f32>> {
        let results = self.session.function(entry)?.call_device(args)?;
        model::read_logits(
            entry,
            results,
            1,
            self.vocab,
            &self.logits_buf,
            <[f32]>::to_vec,
        )
    }

    /// Runs the prompt from position 0 and returns the logits after its
    /// last token.
    pub fn prefill(&self, ids: &[u32]) -> Result<Vec<f32>> {
        if ids.is_empty() {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                "the prompt is empty",
            ));
        }
        if ids.len() > self.context {
            return Err(Status::new(
                StatusCode::OutOfRange,
                format!(
                    "the prompt has {} tokens; the context holds {}",
                    ids.len(),
                    self.context
                ),
            ));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.vocab) {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                format!("token id {bad} is outside the vocabulary of {}", self.vocab),
            ));
        }
        let v: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let t = Tensor::from_i32(&[v.len() as u64], &v)?;
        self.call_logits("prefill", &[Value::from(t), Value::I32(0)])
    }

    /// Appends token `id` at position `pos` (the cache holds positions
    /// 0..pos) and returns the next logits.
    pub fn decode_step(&self, id: u32, pos: usize) -> Result<Vec<f32>> {
        if pos >= self.context {
            return Err(Status::new(
                StatusCode::OutOfRange,
                format!(
                    "position {pos} is past the context of {} positions",
                    self.context
                ),
            ));
        }
        self.call_logits("decode", &[Value::I32(id as i32), Value::I32(pos as i32)])
    }

    /// Generates after `prompt` (token ids). `on_token(id, text)` is called
    /// for each generated token with the new text it completes (possibly
    /// empty, mid-character); returning false stops.
    ///
    /// Greedy generation with a program that has `decode_greedy` (the cuda
    /// program, `examples/llm/build_cuda.py`) chooses tokens on the device
    /// and queues each step before the previous one has run
    /// ([`pipeline`]); the ids are the same as choosing on the host.
    /// `FERRITE_LLM_PIPELINE=0` chooses on the host instead.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &Options,
        mut on_token: impl FnMut(u32, &str) -> bool,
    ) -> Result<Generation> {
        let start = Instant::now();
        let mut rng = sampling::Rng::new(opts.sampling.seed);
        let mut logits = self.prefill(prompt)?;
        let mut sink = TokenSink::new(self, prompt.len(), opts);
        if opts.max_tokens > 0
            && self.greedy_step
            && opts.sampling.is_greedy()
            && pipeline::enabled()
        {
            let first = sampling::argmax(&logits) as u32;
            sink.out.time_to_first_token = start.elapsed();
            if sink.accept(first, 0, &mut on_token)? {
                pipeline::decode(self, &mut sink, first, &mut on_token)?;
            }
            return Ok(sink.out);
        }
        let mut step_start = None;
        for (n, pos) in (0..opts.max_tokens).zip(prompt.len()..) {
            if n > 0 {
                let t = Instant::now();
                logits = self.decode_step(*sink.out.ids.last().unwrap_or(&0), pos - 1)?;
                sink.out.decode_steps += 1;
                step_start.get_or_insert(t);
            }
            let id = sampling::sample(&logits, &opts.sampling, &mut rng) as u32;
            if n == 0 {
                sink.out.time_to_first_token = start.elapsed();
            }
            if !sink.accept(id, n, &mut on_token)? {
                break;
            }
        }
        if let Some(t) = step_start {
            sink.out.decode_time = t.elapsed();
        }
        Ok(sink.out)
    }
}

/// What [`Llm::generate`] does with each chosen token, whichever loop chose
/// it: stop conditions, text and the callback.
pub(crate) struct TokenSink<'a> {
    pub(crate) out: Generation,
    stream: DecodeStream,
    opts: &'a Options,
    eos: Option<u32>,
    context: usize,
}

impl<'a> TokenSink<'a> {
    fn new(llm: &Llm, prompt_tokens: usize, opts: &'a Options) -> TokenSink<'a> {
        TokenSink {
            out: Generation {
                ids: Vec::new(),
                text: String::new(),
                finish: Finish::Length,
                prompt_tokens,
                time_to_first_token: Duration::ZERO,
                decode_time: Duration::ZERO,
                decode_steps: 0,
            },
            stream: DecodeStream::new(llm.tokenizer.clone(), true),
            opts,
            eos: llm.eos,
            context: llm.context,
        }
    }

    /// The most tokens this generation may produce.
    pub(crate) fn max_tokens(&self) -> usize {
        self.opts.max_tokens
    }

    /// Takes token `id`, the `n`th generated (from 0): whether generation
    /// goes on. The token after it needs position `prompt + n`: past the
    /// context that is an error, unless `max_tokens` ends here anyway.
    pub(crate) fn accept(
        &mut self,
        id: u32,
        n: usize,
        on_token: &mut impl FnMut(u32, &str) -> bool,
    ) -> Result<bool> {
        let out = &mut self.out;
        if self.opts.stop_at_eos && Some(id) == self.eos {
            out.finish = Finish::Eos;
            return Ok(false);
        }
        out.ids.push(id);
        let piece = self.stream.push(&[id])?;
        let before = out.text.len();
        out.text.push_str(&piece);
        if let Some(cut) = self
            .opts
            .stop
            .iter()
            .filter_map(|s| out.text.find(s.as_str()))
            .min()
        {
            let shown = &out.text[before.min(cut)..cut];
            if !shown.is_empty() {
                on_token(id, shown);
            }
            out.text.truncate(cut);
            out.finish = Finish::Stop;
            return Ok(false);
        }
        if !on_token(id, &piece) {
            out.finish = Finish::Cancelled;
            return Ok(false);
        }
        if n + 1 >= self.opts.max_tokens {
            return Ok(false);
        }
        let pos = out.prompt_tokens + n;
        if pos >= self.context {
            return Err(Status::new(
                StatusCode::OutOfRange,
                format!(
                    "generation filled the context of {} positions (prompt {} + {} generated); \
                     ask for fewer tokens or load with a larger context",
                    self.context,
                    out.prompt_tokens,
                    out.ids.len()
                ),
            ));
        }
        Ok(true)
    }
}
