//! What the scheduler drives: a model with KV-cache slots, a prefill of a
//! prompt piece into one slot and one decode step for several slots at
//! once. [`BatchEngine`] is the batch program (`ferrite_llm::BatchLlm`:
//! 16 slots; one `step` call per token boundary takes every running
//! sequence's next token and the prompt pieces admitted at that boundary,
//! so a prompt shares the pass over the weights with the decode rows); the
//! single-sequence [`ferrite_llm::Llm`] is such an engine with one slot
//! ([`LlmEngine`], for a program file given with `--module`).

use std::sync::Arc;

use ferrite::Session;
use ferrite_llm::{BatchLlm, Llm, Result, Status, StatusCode, StepRow};
use ferrite_tokenizer::Tokenizer;

/// One sequence's step in a batched decode: its slot, the token to append
/// and that token's position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// KV-cache slot.
    pub slot: usize,
    /// Token appended at `pos`.
    pub token: u32,
    /// Its position (the slot's cache holds positions `0..pos`).
    pub pos: usize,
}

/// A model the scheduler can run. Owned by the engine thread alone, so it
/// need not be `Send` after creation.
pub trait Engine {
    /// Sequences that can be in flight at once.
    fn slots(&self) -> usize;
    /// Positions a slot holds (prompt plus generated tokens).
    fn context_length(&self) -> usize;
    /// The end-of-sequence id, if any.
    fn eos(&self) -> Option<u32>;
    /// Vocabulary size (token ids are below it).
    fn vocab(&self) -> usize;
    /// The tokenizer, shared with the HTTP side (prompts, detokenizing).
    fn tokenizer(&self) -> Arc<Tokenizer>;
    /// The most prompt tokens one [`Engine::prefill`] call may take when it
    /// does not start at position 0; `None` when a prompt must be
    /// prefilled whole from position 0 (no chunking).
    fn prefill_chunk(&self) -> Option<usize>;
    /// Runs `ids` at positions `pos..` of `slot` and returns the logits
    /// after the last one.
    fn prefill(&mut self, slot: usize, ids: &[u32], pos: usize) -> Result<Vec<f32>>;
    /// One token for each entry (distinct slots); the logits per entry in
    /// order.
    fn decode(&mut self, steps: &[Step]) -> Result<Vec<Vec<f32>>>;
    /// The most rows one [`Engine::step`] call takes (decode rows and
    /// prompt rows together); 0 when the engine has no mixed step, and the
    /// scheduler uses [`Engine::prefill`] and [`Engine::decode`] instead.
    fn step_rows(&self) -> usize {
        0
    }
    /// One pass over `rows` (see [`ferrite_llm::BatchLlm::step`]): the
    /// logits of the rows with `logits` set, in order. Called only when
    /// [`Engine::step_rows`] is not 0.
    fn step(&mut self, rows: &[StepRow]) -> Result<Vec<Vec<f32>>> {
        let _ = rows;
        Err(Status::new(
            StatusCode::Unimplemented,
            "this engine has no mixed step (step_rows() is 0)",
        ))
    }
    /// Live allocator bytes per device and memory kind (`device_local`,
    /// `host_local`), when the engine can tell (for `/metrics`).
    fn device_memory(&self) -> Vec<(String, &'static str, u64)> {
        Vec::new()
    }
}

/// Live bytes of each device's allocators in `session` (the device
/// allocator and the queue-ordered pool, which holds the program's
/// transient and global buffers).
fn session_memory(session: &Session) -> Vec<(String, &'static str, u64)> {
    let mut out = Vec::new();
    for d in session.devices() {
        let hal = &d.hal().0;
        let (mut device, mut host) = (0u64, 0u64);
        for s in [
            hal.allocator().statistics(),
            hal.queue_allocator().statistics(),
        ] {
            device += s
                .device_bytes_allocated
                .saturating_sub(s.device_bytes_freed);
            host += s.host_bytes_allocated.saturating_sub(s.host_bytes_freed);
        }
        out.push((d.name().to_string(), "device_local", device));
        out.push((d.name().to_string(), "host_local", host));
    }
    out
}

/// The batch program as an engine: one slot per KV cache of the program.
pub struct BatchEngine {
    llm: BatchLlm,
}

impl BatchEngine {
    /// Wraps a loaded batch program.
    pub fn new(llm: BatchLlm) -> BatchEngine {
        BatchEngine { llm }
    }
}

impl Engine for BatchEngine {
    fn slots(&self) -> usize {
        self.llm.slots()
    }

    fn context_length(&self) -> usize {
        self.llm.context_length()
    }

    fn eos(&self) -> Option<u32> {
        self.llm.eos()
    }

    fn vocab(&self) -> usize {
        self.llm.vocab_size()
    }

    fn tokenizer(&self) -> Arc<Tokenizer> {
        self.llm.tokenizer().clone()
    }

    fn prefill_chunk(&self) -> Option<usize> {
        // Any piece at any position: the scheduler's budget bounds it.
        Some(usize::MAX)
    }

    fn prefill(&mut self, slot: usize, ids: &[u32], pos: usize) -> Result<Vec<f32>> {
        self.llm.prefill(slot, ids, pos)
    }

    fn decode(&mut self, steps: &[Step]) -> Result<Vec<Vec<f32>>> {
        let items: Vec<(usize, u32, usize)> =
            steps.iter().map(|s| (s.slot, s.token, s.pos)).collect();
        self.llm.decode_batch(&items)
    }

    fn step_rows(&self) -> usize {
        self.llm.step_rows()
    }

    fn step(&mut self, rows: &[StepRow]) -> Result<Vec<Vec<f32>>> {
        self.llm.step(rows)
    }

    fn device_memory(&self) -> Vec<(String, &'static str, u64)> {
        session_memory(self.llm.session())
    }
}

/// [`Llm`] as a one-slot engine.
pub struct LlmEngine {
    llm: Llm,
}

impl LlmEngine {
    /// Wraps a loaded model.
    pub fn new(llm: Llm) -> LlmEngine {
        LlmEngine { llm }
    }
}

fn only_slot_zero(slot: usize) -> Result<()> {
    if slot != 0 {
        return Err(Status::new(
            StatusCode::InvalidArgument,
            format!("slot {slot} does not exist: the single-sequence program has one KV cache"),
        ));
    }
    Ok(())
}

impl Engine for LlmEngine {
    fn slots(&self) -> usize {
        1
    }

    fn context_length(&self) -> usize {
        self.llm.context_length()
    }

    fn eos(&self) -> Option<u32> {
        self.llm.eos()
    }

    fn vocab(&self) -> usize {
        ferrite_llm::SMOLLM2_135M.vocab as usize
    }

    fn tokenizer(&self) -> Arc<Tokenizer> {
        self.llm.tokenizer().clone()
    }

    fn prefill_chunk(&self) -> Option<usize> {
        None
    }

    fn prefill(&mut self, slot: usize, ids: &[u32], pos: usize) -> Result<Vec<f32>> {
        only_slot_zero(slot)?;
        if pos != 0 {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                "the single-sequence engine prefills whole prompts from position 0",
            ));
        }
        self.llm.prefill(ids)
    }

    fn decode(&mut self, steps: &[Step]) -> Result<Vec<Vec<f32>>> {
        steps
            .iter()
            .map(|s| {
                only_slot_zero(s.slot)?;
                self.llm.decode_step(s.token, s.pos)
            })
            .collect()
    }
}
