//! Continuous batching: one engine thread owns the model. At every token
//! boundary it drops sequences whose client went away, admits queued
//! requests into free slots, prefills (in bounded chunks while other
//! sequences are decoding, so running streams stall for at most one chunk),
//! runs one batched decode step for every running sequence, samples each
//! sequence with its own parameters and sends the new text over the
//! sequence's channel.
//!
//! The queue in front of it is bounded (`--max_queue`): a request that
//! finds it full is refused at once (429), never parked.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use ferrite_llm::sampling::{self, Rng};
use ferrite_llm::Sampling;
use ferrite_tokenizer::{DecodeStream, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use crate::engine::{Engine, Step};
use crate::error::ApiError;
use crate::metrics::{DeviceLabels, Metrics};
use crate::stop::StopText;

/// Why a generation ended, as OpenAI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    /// OpenAI's `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What a sequence's channel carries.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New text (never empty).
    Text(String),
    /// The end, with the token counts.
    Done {
        /// Why it ended.
        finish: FinishReason,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens (an end-of-sequence token is not counted).
        completion_tokens: usize,
    },
    /// The generation failed (or the server is shutting down).
    Error(ApiError),
}

/// One generation request, checked and tokenized.
pub struct Job {
    /// Prompt ids (non-empty; prompt plus `max_tokens` fit the context).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Sampling parameters.
    pub sampling: Sampling,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep going past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Where the sequence's events go; a closed channel cancels it.
    pub events: UnboundedSender<Event>,
    /// When the request arrived (time to first token counts from here).
    pub arrived: Instant,
}

struct QueueState {
    jobs: VecDeque<Job>,
    closing: bool,
}

/// The bounded queue between the HTTP handlers and the engine thread.
pub struct Queue {
    state: Mutex<QueueState>,
    wake: Condvar,
    capacity: usize,
    metrics: Arc<Metrics>,
}

impl Queue {
    /// A queue holding at most `capacity` waiting requests.
    pub fn new(capacity: usize, metrics: Arc<Metrics>) -> Queue {
        Queue {
            state: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                closing: false,
            }),
            wake: Condvar::new(),
            capacity,
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic while holding the lock leaves plain data behind: keep
        // serving rather than poisoning every later request.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`, or refuses it: 429 with `Retry-After` when full, 503
    /// while shutting down.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let mut s = self.lock();
        if s.closing {
            return Err(ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
            ));
        }
        if s.jobs.len() >= self.capacity {
            return Err(ApiError::status(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "the queue is full ({} requests waiting); retry later",
                    s.jobs.len()
                ),
            )
            .with_retry_after(1));
        }
        s.jobs.push_back(job);
        self.metrics.queue_depth.set(s.jobs.len() as i64);
        drop(s);
        self.wake.notify_one();
        Ok(())
    }

    /// Refuses new requests and fails the queued ones (503); the engine
    /// then finishes or cancels the running ones and returns.
    pub fn close(&self) {
        let mut s = self.lock();
        s.closing = true;
        for job in s.jobs.drain(..) {
            let _ = job.events.send(Event::Error(ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
            )));
        }
        self.metrics.queue_depth.set(0);
        drop(s);
        self.wake.notify_all();
    }

    /// Requests waiting.
    pub fn depth(&self) -> usize {
        self.lock().jobs.len()
    }

    fn pop(&self) -> Option<Job> {
        let mut s = self.lock();
        let job = s.jobs.pop_front();
        self.metrics.queue_depth.set(s.jobs.len() as i64);
        job
    }

    fn closing(&self) -> bool {
        self.lock().closing
    }

    /// Waits up to `timeout` for a job or for closing.
    fn wait(&self, timeout: Duration) {
        let s = self.lock();
        if s.jobs.is_empty() && !s.closing {
            let _ = self.wake.wait_timeout(s, timeout);
        }
    }
}

/// Scheduling knobs.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Sequences decoded together at most (capped by the engine's slots).
    pub max_batch: usize,
    /// Prompt tokens prefilled per token boundary while other sequences are
    /// decoding (bounds how long running streams stall for a newcomer).
    pub prefill_chunk: usize,
    /// After shutdown begins, how long running sequences may go on before
    /// they are cancelled.
    pub shutdown_grace: Duration,
}

struct Seq {
    job: Job,
    slot: usize,
    /// Prompt tokens already in the slot's cache.
    prefilled: usize,
    /// The last sampled token, not yet in the cache (None while prefilling).
    pending: Option<u32>,
    generated: usize,
    detok: DecodeStream,
    text: StopText,
    rng: Rng,
    last_token_at: Option<Instant>,
}

impl Seq {
    /// The position the pending token goes to.
    fn next_pos(&self) -> usize {
        self.job.prompt.len() + self.generated - 1
    }
}

/// The engine thread's state.
pub struct Scheduler<'e> {
    engine: &'e mut dyn Engine,
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
    config: SchedulerConfig,
    tokenizer: Arc<Tokenizer>,
    eos: Option<u32>,
    free: Vec<usize>,
    active: Vec<Seq>,
    window_start: Instant,
    window_tokens: u64,
}

/// How one sequence's token ended up.
enum Outcome {
    Continue,
    Finished(FinishReason),
    /// The sequence failed and was removed (its error already sent).
    Gone,
}

impl<'e> Scheduler<'e> {
    /// A scheduler over `engine`.
    pub fn new(
        engine: &'e mut dyn Engine,
        queue: Arc<Queue>,
        metrics: Arc<Metrics>,
        mut config: SchedulerConfig,
    ) -> Scheduler<'e> {
        config.max_batch = config.max_batch.clamp(1, engine.slots().max(1));
        config.prefill_chunk = config.prefill_chunk.max(1);
        let free = (0..config.max_batch).rev().collect();
        Scheduler {
            tokenizer: engine.tokenizer(),
            eos: engine.eos(),
            engine,
            queue,
            metrics,
            config,
            free,
            active: Vec::new(),
            window_start: Instant::now(),
            window_tokens: 0,
        }
    }

    /// Runs until the queue is closed and every running sequence has ended
    /// (or the shutdown grace has passed and they were cancelled).
    /// `stop_now` cancels the running ones at the next boundary.
    pub fn run(&mut self, stop_now: &AtomicBool) {
        self.update_memory();
        let mut deadline: Option<Instant> = None;
        loop {
            self.drop_cancelled();
            let closing = self.queue.closing();
            if closing {
                let d =
                    *deadline.get_or_insert_with(|| Instant::now() + self.config.shutdown_grace);
                if self.active.is_empty() {
                    break;
                }
                if Instant::now() >= d || stop_now.load(Ordering::Relaxed) {
                    self.cancel_all("the server shut down before this generation finished");
                    break;
                }
            } else {
                self.admit();
            }
            if self.active.is_empty() {
                self.metrics.tokens_per_second.set(0.0);
                self.queue.wait(Duration::from_millis(200));
                continue;
            }
            self.prefill_step();
            self.decode_step();
            self.metrics.running.set(self.active.len() as i64);
        }
        self.metrics.running.set(0);
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].job.events.is_closed() {
                self.metrics.cancelled.inc();
                self.release(i);
            } else {
                i += 1;
            }
        }
    }

    fn release(&mut self, i: usize) -> Seq {
        let seq = self.active.swap_remove(i);
        self.free.push(seq.slot);
        self.metrics.running.set(self.active.len() as i64);
        seq
    }

    fn cancel_all(&mut self, why: &str) {
        while !self.active.is_empty() {
            let seq = self.release(0);
            let _ = seq.job.events.send(Event::Error(ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                why,
            )));
        }
    }

    fn admit(&mut self) {
        while !self.free.is_empty() {
            let Some(job) = self.queue.pop() else { break };
            if job.events.is_closed() {
                self.metrics.cancelled.inc();
                continue;
            }
            let slot = self.free.pop().unwrap_or(0);
            let stop = job.stop.clone();
            let seed = job.sampling.seed;
            self.active.push(Seq {
                job,
                slot,
                prefilled: 0,
                pending: None,
                generated: 0,
                detok: DecodeStream::new(self.tokenizer.clone(), true),
                text: StopText::new(stop),
                rng: Rng::new(seed),
                last_token_at: None,
            });
        }
        self.metrics.running.set(self.active.len() as i64);
    }

    /// Prefills waiting sequences, oldest first. While others are decoding
    /// at most `prefill_chunk` tokens go in per boundary (an engine without
    /// chunking prefills whole prompts; it has one slot, so nobody waits).
    fn prefill_step(&mut self) {
        let decoding = self.active.iter().any(|s| s.pending.is_some());
        let mut budget = if decoding {
            self.config.prefill_chunk
        } else {
            usize::MAX
        };
        let engine_chunk = self.engine.prefill_chunk();
        let mut i = 0;
        while i < self.active.len() && budget > 0 {
            let seq = &self.active[i];
            if seq.pending.is_some() {
                i += 1;
                continue;
            }
            let left = seq.job.prompt.len() - seq.prefilled;
            let n = match engine_chunk {
                None => left,
                Some(c) => left.min(c.max(1)).min(budget),
            };
            let (slot, from) = (seq.slot, seq.prefilled);
            let result = self
                .engine
                .prefill(slot, &seq.job.prompt[from..from + n], from);
            budget = budget.saturating_sub(n);
            match result {
                Err(e) => {
                    let seq = self.release(i);
                    let _ = seq.job.events.send(Event::Error(ApiError::status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("prefill failed: {e}"),
                    )));
                    continue;
                }
                Ok(logits) => {
                    self.metrics.prompt_tokens.inc_by(n as u64);
                    let seq = &mut self.active[i];
                    seq.prefilled += n;
                    if seq.prefilled < seq.job.prompt.len() {
                        i += 1;
                        continue;
                    }
                    let id = sampling::sample(&logits, &seq.job.sampling, &mut seq.rng) as u32;
                    self.metrics
                        .time_to_first_token
                        .observe(seq.job.arrived.elapsed().as_secs_f64());
                    match self.accept(i, id) {
                        Outcome::Continue => i += 1,
                        Outcome::Finished(f) => self.finish(i, f),
                        Outcome::Gone => {}
                    }
                }
            }
        }
    }

    fn decode_step(&mut self) {
        let steps: Vec<Step> = self
            .active
            .iter()
            .filter_map(|s| {
                s.pending.map(|token| Step {
                    slot: s.slot,
                    token,
                    pos: s.next_pos(),
                })
            })
            .collect();
        if steps.is_empty() {
            return;
        }
        let result = self.engine.decode(&steps);
        self.metrics.batch_size.observe(steps.len() as f64);
        let logits = match result {
            Ok(l) if l.len() == steps.len() => l,
            Ok(l) => {
                self.fail_slots(
                    &steps,
                    format!(
                        "decode returned {} logits rows for {} sequences",
                        l.len(),
                        steps.len()
                    ),
                );
                return;
            }
            Err(e) => {
                self.fail_slots(&steps, format!("decode failed: {e}"));
                return;
            }
        };
        self.count_tokens(steps.len() as u64);
        for (step, row) in steps.iter().zip(logits) {
            let Some(i) = self.active.iter().position(|s| s.slot == step.slot) else {
                continue;
            };
            let seq = &mut self.active[i];
            let id = sampling::sample(&row, &seq.job.sampling, &mut seq.rng) as u32;
            match self.accept(i, id) {
                Outcome::Continue | Outcome::Gone => {}
                Outcome::Finished(f) => self.finish(i, f),
            }
        }
    }

    /// Counts decoded tokens; once a second updates the rate and the
    /// device memory gauges.
    fn count_tokens(&mut self, n: u64) {
        self.window_tokens += n;
        let elapsed = self.window_start.elapsed();
        if elapsed >= Duration::from_secs(1) {
            self.metrics
                .tokens_per_second
                .set(self.window_tokens as f64 / elapsed.as_secs_f64());
            self.window_start = Instant::now();
            self.window_tokens = 0;
            self.update_memory();
        }
    }

    fn update_memory(&self) {
        for (device, memory, bytes) in self.engine.device_memory() {
            self.metrics
                .device_memory
                .get_or_create(&DeviceLabels {
                    device,
                    memory: memory.to_string(),
                })
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    fn fail_slots(&mut self, steps: &[Step], message: String) {
        for step in steps {
            if let Some(i) = self.active.iter().position(|s| s.slot == step.slot) {
                let seq = self.release(i);
                let _ = seq.job.events.send(Event::Error(ApiError::status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    message.clone(),
                )));
            }
        }
    }

    /// Takes sampled token `id` for sequence `i`: stop checks, text out.
    fn accept(&mut self, i: usize, id: u32) -> Outcome {
        let eos = self.eos;
        let seq = &mut self.active[i];
        let now = Instant::now();
        if let Some(t) = seq.last_token_at.replace(now) {
            self.metrics
                .inter_token_latency
                .observe((now - t).as_secs_f64());
        }
        if !seq.job.ignore_eos && Some(id) == eos {
            return Outcome::Finished(FinishReason::Stop);
        }
        seq.generated += 1;
        self.metrics.generated_tokens.inc();
        let piece = match seq.detok.push(&[id]) {
            Ok(p) => p,
            Err(e) => {
                let _ = seq.job.events.send(Event::Error(ApiError::status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("detokenizing id {id}: {e}"),
                )));
                let _ = self.release(i);
                return Outcome::Gone;
            }
        };
        let out = seq.text.push(&piece);
        if !out.text.is_empty() {
            let _ = seq.job.events.send(Event::Text(out.text));
        }
        if out.stopped {
            return Outcome::Finished(FinishReason::Stop);
        }
        if seq.generated >= seq.job.max_tokens {
            return Outcome::Finished(FinishReason::Length);
        }
        if seq.next_pos() + 1 > self.engine.context_length() {
            // Checked at admission; kept so a wrong check can never write
            // past the cache.
            return Outcome::Finished(FinishReason::Length);
        }
        seq.pending = Some(id);
        Outcome::Continue
    }

    fn finish(&mut self, i: usize, finish: FinishReason) {
        let mut seq = self.release(i);
        let rest = seq.text.flush();
        // Text held back as a possible stop-string start is real text
        // when the sequence ends otherwise (after a stop it is empty).
        if !rest.is_empty() {
            let _ = seq.job.events.send(Event::Text(rest));
        }
        let _ = seq.job.events.send(Event::Done {
            finish,
            prompt_tokens: seq.job.prompt.len(),
            completion_tokens: seq.generated,
        });
    }
}
