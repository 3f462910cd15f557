//! Continuous batching: one engine thread owns the model. At every token
//! boundary it drops sequences whose client went away, admits queued
//! requests into free slots, prefills (in bounded chunks while other
//! sequences are decoding, so running streams stall for at most one chunk),
//! runs one batched decode step for every running sequence, samples each
//! sequence with its own parameters and sends the new text over the
//! sequence's channel. With an engine that has a mixed step (the batch
//! program's `step`), the prompt chunks and the decode rows of a boundary
//! are one call: the pass over the weights, which is most of a step's
//! cost, is shared by both.
//!
//! The queue in front of it is bounded (`--max_queue`): a request that
//! finds it full is refused at once (429), never parked.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use ferrite_llm::sampling::{self, Rng};
use ferrite_llm::{Sampling, StepRow};
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
    /// The engine's mixed-step rows (0: separate prefill and decode calls).
    step_rows: usize,
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
        // A mixed step must hold every running sequence's row beside a
        // prompt row; an engine allowing fewer rows keeps separate calls.
        let step_rows = match engine.step_rows() {
            n if n > config.max_batch => n,
            _ => 0,
        };
        Scheduler {
            step_rows,
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
            if self.step_rows > 0 {
                self.mixed_step();
            } else {
                self.prefill_step();
                self.decode_step();
            }
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

    /// One engine call for the boundary: every decoding sequence's next
    /// token, then prompt pieces of the waiting sequences, oldest first, up
    /// to `prefill_chunk` prompt tokens while others are decoding (up to
    /// the engine's row limit when none is). Logits come back for the
    /// decode rows and for each prompt's last token only.
    fn mixed_step(&mut self) {
        let mut rows = Vec::new();
        // Per logits row: the slot and whether it ends a prompt (its
        // sampled token is the sequence's first).
        let mut owners = Vec::new();
        for s in &self.active {
            if let Some(token) = s.pending {
                rows.push(StepRow {
                    slot: s.slot,
                    token,
                    pos: s.next_pos(),
                    logits: true,
                });
                owners.push((s.slot, false));
            }
        }
        let decoded = rows.len();
        let mut budget = if decoded > 0 {
            self.config.prefill_chunk
        } else {
            usize::MAX
        };
        budget = budget.min(self.step_rows.saturating_sub(decoded));
        let mut waiting: Vec<usize> = (0..self.active.len())
            .filter(|&i| {
                let s = &self.active[i];
                s.pending.is_none() && s.prefilled < s.job.prompt.len()
            })
            .collect();
        waiting.sort_by_key(|&i| self.active[i].job.arrived);
        // (slot, prompt tokens) of each piece, applied once the call works.
        let mut pieces = Vec::new();
        for i in waiting {
            if budget == 0 {
                break;
            }
            let s = &self.active[i];
            let from = s.prefilled;
            let n = (s.job.prompt.len() - from).min(budget);
            let ends = from + n == s.job.prompt.len();
            for (j, &token) in s.job.prompt[from..from + n].iter().enumerate() {
                rows.push(StepRow {
                    slot: s.slot,
                    token,
                    pos: from + j,
                    logits: ends && j + 1 == n,
                });
            }
            if ends {
                owners.push((s.slot, true));
            }
            pieces.push((s.slot, n));
            budget -= n;
        }
        if rows.is_empty() {
            return;
        }
        let result = self.engine.step(&rows);
        if decoded > 0 {
            self.metrics.batch_size.observe(decoded as f64);
        }
        let logits = match result {
            Ok(l) if l.len() == owners.len() => l,
            Ok(l) => {
                let why = format!(
                    "step returned {} logits rows for {} sequences",
                    l.len(),
                    owners.len()
                );
                self.fail_rows(&rows, why);
                return;
            }
            Err(e) => {
                self.fail_rows(&rows, format!("step failed: {e}"));
                return;
            }
        };
        for (slot, n) in pieces {
            if let Some(s) = self.active.iter_mut().find(|s| s.slot == slot) {
                s.prefilled += n;
                self.metrics.prompt_tokens.inc_by(n as u64);
            }
        }
        self.count_tokens(decoded as u64);
        for ((slot, first), row) in owners.into_iter().zip(logits) {
            let Some(i) = self.active.iter().position(|s| s.slot == slot) else {
                continue;
            };
            let seq = &mut self.active[i];
            let id = sampling::sample(&row, &seq.job.sampling, &mut seq.rng) as u32;
            if first {
                self.metrics
                    .time_to_first_token
                    .observe(seq.job.arrived.elapsed().as_secs_f64());
            }
            match self.accept(i, id) {
                Outcome::Continue | Outcome::Gone => {}
                Outcome::Finished(f) => self.finish(i, f),
            }
        }
    }

    /// Fails every sequence with a row in a failed step.
    fn fail_rows(&mut self, rows: &[StepRow], message: String) {
        for row in rows {
            if let Some(i) = self.active.iter().position(|s| s.slot == row.slot) {
                let seq = self.release(i);
                let _ = seq.job.events.send(Event::Error(ApiError::status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    message.clone(),
                )));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Step;
    use ferrite_llm::{Result, Status, StatusCode as Code};
    use serde_json::json;
    use std::thread;
    use tokio::sync::mpsc::UnboundedReceiver;

    /// Letters a..z are ids 0..26 (byte-level BPE without merges), id 26
    /// is `<eos>`.
    fn letters() -> Arc<Tokenizer> {
        let mut vocab = serde_json::Map::new();
        for (i, c) in ('a'..='z').enumerate() {
            vocab.insert(c.to_string(), json!(i));
        }
        vocab.insert("<eos>".into(), json!(26));
        let doc = json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 26, "content": "<eos>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vocab, "merges": []}
        });
        Arc::new(Tokenizer::from_json(&doc.to_string()).unwrap())
    }

    /// The next token of a sequence depends on that sequence's whole
    /// history only, so a slot given another sequence's tokens (or a wrong
    /// position) changes the text. EOS after 12 tokens of history.
    fn next(history: &[u32]) -> u32 {
        if history.len() >= 12 {
            return 26;
        }
        let h = history.iter().enumerate().fold(7u32, |a, (i, &t)| {
            a.wrapping_mul(31).wrapping_add(t + i as u32)
        });
        h % 26
    }

    fn one_hot(id: u32) -> Vec<f32> {
        let mut l = vec![0.0; 27];
        l[id as usize] = 1.0;
        l
    }

    #[derive(Default)]
    struct Record {
        prefills: Vec<(usize, usize, usize)>,
        batches: Vec<usize>,
        /// Per mixed step: (decode rows, prompt rows).
        steps: Vec<(usize, usize)>,
        sampled: Vec<bool>,
    }

    struct Fake {
        slots: Vec<Vec<u32>>,
        tokenizer: Arc<Tokenizer>,
        record: Arc<Mutex<Record>>,
        /// When set, decode steps wait until it turns true (lets a test
        /// queue a request while a sequence is known to be decoding).
        gate: Option<Arc<AtomicBool>>,
        /// Rows of a mixed step (0: the engine has none).
        step_rows: usize,
    }

    /// Whether `slot`'s last row so far was given logits (so the next row
    /// of the slot is a sampled token: a decode row).
    fn sampled(sampled: &mut Vec<bool>, slot: usize) -> &mut bool {
        if sampled.len() <= slot {
            sampled.resize(slot + 1, false);
        }
        &mut sampled[slot]
    }

    impl Engine for Fake {
        fn slots(&self) -> usize {
            self.slots.len()
        }
        fn context_length(&self) -> usize {
            64
        }
        fn eos(&self) -> Option<u32> {
            Some(26)
        }
        fn vocab(&self) -> usize {
            27
        }
        fn tokenizer(&self) -> Arc<Tokenizer> {
            self.tokenizer.clone()
        }
        fn prefill_chunk(&self) -> Option<usize> {
            Some(usize::MAX)
        }
        fn prefill(&mut self, slot: usize, ids: &[u32], pos: usize) -> Result<Vec<f32>> {
            self.record
                .lock()
                .unwrap()
                .prefills
                .push((slot, ids.len(), pos));
            let h = &mut self.slots[slot];
            h.truncate(pos);
            if h.len() != pos {
                return Err(Status::new(Code::Internal, "prefill past the history"));
            }
            h.extend_from_slice(ids);
            Ok(one_hot(next(h)))
        }
        fn decode(&mut self, steps: &[Step]) -> Result<Vec<Vec<f32>>> {
            if let Some(gate) = &self.gate {
                while !gate.load(Ordering::Acquire) {
                    thread::sleep(Duration::from_millis(1));
                }
            }
            self.record.lock().unwrap().batches.push(steps.len());
            steps
                .iter()
                .map(|s| {
                    let h = &mut self.slots[s.slot];
                    if h.len() != s.pos {
                        return Err(Status::new(Code::Internal, "decode at a wrong position"));
                    }
                    h.push(s.token);
                    Ok(one_hot(next(h)))
                })
                .collect()
        }
        fn step_rows(&self) -> usize {
            self.step_rows
        }
        fn step(&mut self, rows: &[StepRow]) -> Result<Vec<Vec<f32>>> {
            assert!(self.step_rows > 0 && rows.len() <= self.step_rows);
            // Rows apply in (slot, position) order, as the batch program's;
            // a row at position 0 starts its slot over.
            let mut order: Vec<usize> = (0..rows.len()).collect();
            order.sort_by_key(|&i| (rows[i].slot, rows[i].pos));
            let mut out = vec![None; rows.len()];
            let (mut decode_rows, mut prompt_rows) = (0, 0);
            let mut record = self.record.lock().unwrap();
            for i in order {
                let r = rows[i];
                let h = &mut self.slots[r.slot];
                h.truncate(r.pos);
                if h.len() != r.pos {
                    return Err(Status::new(Code::Internal, "a row past its slot's history"));
                }
                h.push(r.token);
                let was_sampled = sampled(&mut record.sampled, r.slot);
                if *was_sampled && r.pos > 0 {
                    decode_rows += 1;
                } else {
                    prompt_rows += 1;
                }
                *was_sampled = r.logits;
                if r.logits {
                    out[i] = Some(one_hot(next(h)));
                }
            }
            record.steps.push((decode_rows, prompt_rows));
            Ok(out.into_iter().flatten().collect())
        }
    }

    fn expected(prompt: &[u32], max_tokens: usize) -> String {
        let mut h = prompt.to_vec();
        let mut out = String::new();
        while out.len() < max_tokens {
            let t = next(&h);
            if t == 26 {
                break;
            }
            out.push((b'a' + t as u8) as char);
            h.push(t);
        }
        out
    }

    struct Run {
        texts: Vec<(String, Option<FinishReason>)>,
        record: Record,
    }

    /// Runs `jobs` (prompt, max_tokens) through a scheduler over a fake
    /// engine of `slots` slots, all queued before the engine starts.
    /// `step_rows`: the fake engine's mixed step (0: none).
    fn run(
        slots: usize,
        jobs: &[(Vec<u32>, usize)],
        prefill_chunk: usize,
        step_rows: usize,
    ) -> Run {
        let metrics = Arc::new(Metrics::new());
        let queue = Arc::new(Queue::new(64, metrics.clone()));
        let mut rxs = Vec::new();
        for (prompt, max_tokens) in jobs {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            queue
                .submit(Job {
                    prompt: prompt.clone(),
                    max_tokens: *max_tokens,
                    sampling: Sampling::default(),
                    stop: Vec::new(),
                    ignore_eos: false,
                    events: tx,
                    arrived: Instant::now(),
                })
                .unwrap();
            rxs.push(rx);
        }
        let record = Arc::new(Mutex::new(Record::default()));
        let engine_record = record.clone();
        let q = queue.clone();
        let engine = thread::spawn(move || {
            let mut fake = Fake {
                slots: vec![Vec::new(); slots],
                tokenizer: letters(),
                record: engine_record,
                gate: None,
                step_rows,
            };
            let config = SchedulerConfig {
                max_batch: slots,
                prefill_chunk,
                shutdown_grace: Duration::from_secs(5),
            };
            Scheduler::new(&mut fake, q, metrics, config).run(&AtomicBool::new(false));
        });
        let texts = rxs
            .into_iter()
            .map(|mut rx| {
                let mut text = String::new();
                let mut finish = None;
                while let Some(ev) = rx.blocking_recv() {
                    match ev {
                        Event::Text(t) => text.push_str(&t),
                        Event::Done { finish: f, .. } => {
                            finish = Some(f);
                            break;
                        }
                        Event::Error(e) => panic!("{e}"),
                    }
                }
                (text, finish)
            })
            .collect();
        queue.close();
        engine.join().unwrap();
        let record = std::mem::take(&mut *record.lock().unwrap());
        Run { texts, record }
    }

    fn jobs() -> Vec<(Vec<u32>, usize)> {
        (0..10u32)
            .map(|i| {
                (
                    (0..(3 + i % 4 * 5)).map(|j| (i * 7 + j) % 26).collect(),
                    4 + i as usize,
                )
            })
            .collect()
    }

    #[test]
    fn batched_sequences_never_mix_and_match_one_at_a_time() {
        let jobs = jobs();
        let batched = run(4, &jobs, 4, 0);
        for ((prompt, max_tokens), (text, finish)) in jobs.iter().zip(&batched.texts) {
            let want = expected(prompt, *max_tokens);
            assert_eq!(text, &want, "prompt {prompt:?}");
            let reason = if want.len() == *max_tokens {
                FinishReason::Length
            } else {
                FinishReason::Stop
            };
            assert_eq!(*finish, Some(reason));
        }
        assert!(batched.record.batches.iter().any(|&b| b > 1));
        assert!(batched.record.batches.iter().all(|&b| b <= 4));
        let single = run(1, &jobs, 4, 0);
        assert_eq!(single.texts, batched.texts);
        assert!(single.record.batches.iter().all(|&b| b == 1));
    }

    #[test]
    fn mixed_steps_carry_prompt_pieces_beside_decode_rows_and_never_mix() {
        let jobs = jobs();
        let mixed = run(4, &jobs, 4, 12);
        let separate = run(4, &jobs, 4, 0);
        assert_eq!(mixed.texts, separate.texts);
        for ((prompt, max_tokens), (text, _)) in jobs.iter().zip(&mixed.texts) {
            assert_eq!(text, &expected(prompt, *max_tokens), "prompt {prompt:?}");
        }
        let steps = &mixed.record.steps;
        assert!(mixed.record.prefills.is_empty() && mixed.record.batches.is_empty());
        let mut shared = false;
        for &(decode_rows, prompt_rows) in steps {
            assert!(decode_rows + prompt_rows <= 12, "{steps:?}");
            assert!(decode_rows <= 4, "{steps:?}");
            if decode_rows > 0 && prompt_rows > 0 {
                // With sequences decoding, prefill_chunk (4) prompt rows
                // at most.
                shared = true;
                assert!(prompt_rows <= 4, "{steps:?}");
            }
        }
        assert!(shared, "no step carried prompt rows beside decode rows");
    }

    fn submit(queue: &Queue, prompt: Vec<u32>, max_tokens: usize) -> UnboundedReceiver<Event> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        queue
            .submit(Job {
                prompt,
                max_tokens,
                sampling: Sampling::default(),
                stop: Vec::new(),
                ignore_eos: false,
                events: tx,
                arrived: Instant::now(),
            })
            .unwrap();
        rx
    }

    fn collect(rx: &mut UnboundedReceiver<Event>) -> String {
        let mut text = String::new();
        while let Some(ev) = rx.blocking_recv() {
            match ev {
                Event::Text(t) => text.push_str(&t),
                Event::Done { .. } => break,
                Event::Error(e) => panic!("{e}"),
            }
        }
        text
    }

    #[test]
    fn prompts_are_prefilled_in_bounded_chunks_while_others_decode() {
        let metrics = Arc::new(Metrics::new());
        let queue = Arc::new(Queue::new(8, metrics.clone()));
        let record = Arc::new(Mutex::new(Record::default()));
        let gate = Arc::new(AtomicBool::new(false));
        let (q, r, g) = (queue.clone(), record.clone(), gate.clone());
        let engine = thread::spawn(move || {
            let mut fake = Fake {
                slots: vec![Vec::new(); 2],
                tokenizer: letters(),
                record: r,
                gate: Some(g),
                step_rows: 0,
            };
            let config = SchedulerConfig {
                max_batch: 2,
                prefill_chunk: 4,
                shutdown_grace: Duration::from_secs(5),
            };
            Scheduler::new(&mut fake, q, metrics, config).run(&AtomicBool::new(false));
        });
        let mut a = submit(&queue, vec![1, 2], 8);
        // Once the first sequence is decoding (its first token out, its
        // decode steps held at the gate), a long prompt arrives.
        assert!(matches!(a.blocking_recv(), Some(Event::Text(_))));
        let long: Vec<u32> = (0..20).map(|j| j % 26).collect();
        let mut b = submit(&queue, long.clone(), 3);
        gate.store(true, Ordering::Release);
        collect(&mut a);
        assert_eq!(collect(&mut b), expected(&long, 3));
        queue.close();
        engine.join().unwrap();
        let record = record.lock().unwrap();
        let first_slot = record.prefills[0].0;
        let pieces: Vec<_> = record.prefills[1..].to_vec();
        assert!(
            pieces.iter().all(|p| p.0 != first_slot && p.1 <= 4),
            "{pieces:?}"
        );
        let mut pos = 0;
        for p in &pieces {
            assert_eq!(p.2, pos);
            pos += p.1;
        }
        assert_eq!(pos, long.len());
    }

    #[test]
    fn a_full_queue_refuses_with_retry_after_and_a_closed_one_with_503() {
        let queue = Queue::new(1, Arc::new(Metrics::new()));
        let job = || {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let job = Job {
                prompt: vec![1],
                max_tokens: 1,
                sampling: Sampling::default(),
                stop: Vec::new(),
                ignore_eos: false,
                events: tx,
                arrived: Instant::now(),
            };
            (job, rx)
        };
        let (a, mut a_rx) = job();
        queue.submit(a).unwrap();
        let (b, _b_rx) = job();
        let e = queue.submit(b).unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.retry_after, Some(1));
        queue.close();
        match a_rx.try_recv() {
            Ok(Event::Error(e)) => assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE),
            other => panic!("queued job got {other:?}"),
        }
        let (c, _c_rx) = job();
        assert_eq!(
            queue.submit(c).unwrap_err().status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn a_closed_channel_cancels_and_frees_the_slot() {
        let metrics = Arc::new(Metrics::new());
        let queue = Arc::new(Queue::new(8, metrics.clone()));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        queue
            .submit(Job {
                prompt: vec![1, 2, 3],
                max_tokens: 50,
                sampling: Sampling::default(),
                stop: Vec::new(),
                ignore_eos: true,
                events: tx,
                arrived: Instant::now(),
            })
            .unwrap();
        drop(rx);
        let r = run_with_queue(1, 0, queue.clone(), metrics.clone(), vec![(vec![4, 5], 3)]);
        assert_eq!(r[0].0, expected(&[4, 5], 3));
        assert_eq!(metrics.cancelled.get(), 1);
    }

    fn run_with_queue(
        slots: usize,
        step_rows: usize,
        queue: Arc<Queue>,
        metrics: Arc<Metrics>,
        jobs: Vec<(Vec<u32>, usize)>,
    ) -> Vec<(String, Option<FinishReason>)> {
        let q = queue.clone();
        let engine = thread::spawn(move || {
            let mut fake = Fake {
                slots: vec![Vec::new(); slots],
                tokenizer: letters(),
                record: Arc::default(),
                gate: None,
                step_rows,
            };
            let config = SchedulerConfig {
                max_batch: slots,
                prefill_chunk: 64,
                shutdown_grace: Duration::from_secs(5),
            };
            Scheduler::new(&mut fake, q, metrics, config).run(&AtomicBool::new(false));
        });
        let mut out = Vec::new();
        for (prompt, max_tokens) in jobs {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            queue
                .submit(Job {
                    prompt,
                    max_tokens,
                    sampling: Sampling::default(),
                    stop: Vec::new(),
                    ignore_eos: false,
                    events: tx,
                    arrived: Instant::now(),
                })
                .unwrap();
            let mut text = String::new();
            let mut finish = None;
            while let Some(ev) = rx.blocking_recv() {
                match ev {
                    Event::Text(t) => text.push_str(&t),
                    Event::Done { finish: f, .. } => {
                        finish = Some(f);
                        break;
                    }
                    Event::Error(e) => panic!("{e}"),
                }
            }
            out.push((text, finish));
        }
        queue.close();
        engine.join().unwrap();
        out
    }
}
