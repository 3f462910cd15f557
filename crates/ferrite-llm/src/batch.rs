//! Continuous batching: the batch program (`examples/llm/smollm2_batch.vmfb`)
//! holds `slots()` independent KV caches on the device, and one call decodes
//! one token for each of up to `slots()` sequences, each in its own slot at
//! its own position.
//!
//! [`BatchLlm`] is the engine a server drives from one thread: it assigns
//! slots to requests, [`BatchLlm::prefill`]s each prompt into its slot
//! (whole or in chunks at increasing positions, between decode steps), and
//! calls [`BatchLlm::decode_batch`] once per step with every running
//! sequence; sequences join and leave the batch at any step. With
//! [`BatchLlm::step`] prompt tokens ride in the same call as the decode
//! rows (one pass over the weights for both; logits only for the rows that
//! need them). Slots are
//! plain indices: nothing needs freeing, a new prompt prefilled at
//! position 0 simply replaces what the slot held (attention reads only
//! positions `0..=pos` of a row's own slot).
//!
//! ```no_run
//! # fn main() -> ferrite::Result<()> {
//! use ferrite_llm::BatchLlm;
//! let llm = BatchLlm::load("SmolLM2-135M-Instruct.Q4_1.gguf", "local-task")?;
//! let a = llm.chat_prompt("What is the capital of France?")?;
//! let b = llm.encode("The capital of Italy is")?;
//! let argmax = |l: &[f32]| (0..l.len()).max_by(|&i, &j| l[i].total_cmp(&l[j])).unwrap() as u32;
//! // Slot 0 and slot 3, prompts of different lengths.
//! let mut next = [argmax(&llm.prefill(0, &a, 0)?), argmax(&llm.prefill(3, &b, 0)?)];
//! let mut pos = [a.len(), b.len()];
//! for _ in 0..16 {
//!     let rows = llm.decode_batch(&[(0, next[0], pos[0]), (3, next[1], pos[1])])?;
//!     for i in 0..2 {
//!         next[i] = argmax(&rows[i]);
//!         pos[i] += 1;
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ferrite::{Instance, OwnedFunction, Session, Tensor, Value};
use ferrite_tokenizer::Tokenizer;

use crate::model::{check_model, finish_load, read_logits, TextSide, SMOLLM2_135M};
use crate::{chat, gguf};
use ferrite::{Result, Status, StatusCode};

/// The committed batch program for SmolLM2-135M, compiled from
/// `examples/llm/model.py` (`build_batch_mlir`): entry points
/// `prefill_slot`, `decode_slot`, `decode_batch`, `decode_batch_wide`,
/// `step`, `step_wide`, `slots`, `context_length`, `wide_batch_min`,
/// `step_rows`.
pub static SMOLLM2_BATCH_VMFB: &[u8] = include_bytes!("../../../examples/llm/smollm2_batch.vmfb");

/// One row of a [`BatchLlm::decode_batch`] call: `(slot, token, position)`,
/// the token to append at `position` of `slot`'s sequence.
pub type BatchItem = (usize, u32, usize);

/// One row of a [`BatchLlm::step`] call: `token` at position `pos` of
/// `slot`'s sequence. A running sequence's next token is one row; a prompt
/// piece is several rows of one slot at consecutive positions (each row
/// attends to its slot's positions up to its own, those written by the
/// call's earlier rows included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRow {
    /// KV-cache slot.
    pub slot: usize,
    /// Token written at `pos`.
    pub token: u32,
    /// Its position (positions below it must be in the slot already or
    /// come earlier in the same call).
    pub pos: usize,
    /// Whether the call returns this row's next-token logits.
    pub logits: bool,
}

/// A loaded batch program: the `.gguf` as its parameters, `slots()` KV
/// caches of `context_length()` positions each on the device, and the
/// tokenizer and chat template from the same file.
pub struct BatchLlm {
    // Field order: the function handles go before the session they call.
    prefill_slot: OwnedFunction,
    decode_slot: OwnedFunction,
    decode_batch: OwnedFunction,
    decode_batch_wide: OwnedFunction,
    /// `step` and `step_wide`, absent from programs built before them.
    step: Option<(OwnedFunction, OwnedFunction)>,
    session: Session,
    text: TextSide,
    vocab: usize,
    slots: usize,
    context: usize,
    wide_min: usize,
    step_rows: usize,
    gguf_path: PathBuf,
    /// The host copy of the last call's logits, reused by every call: a
    /// fresh 3 MB buffer per 16-row step cost ~4 ms of page faults on an
    /// H100 host, more than the step's GPU time.
    logits: Mutex<Vec<f32>>,
}

fn query_i32(session: &Session, name: &str) -> Result<usize> {
    session
        .call(name, &[])?
        .first()
        .and_then(Value::as_i32)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| {
            Status::new(
                StatusCode::Internal,
                format!("the batch program's {name}() returned no non-negative i32"),
            )
        })
}

impl BatchLlm {
    /// Loads the `.gguf` at `gguf` with the built-in batch program on
    /// `device` (`local-sync`, `local-task`, `cuda`, ...).
    pub fn load(gguf: impl AsRef<Path>, device: &str) -> Result<BatchLlm> {
        BatchLlm::load_with_program(gguf, device, None)
    }

    /// As [`BatchLlm::load`], with a program file instead of the built-in
    /// one (the same entry points; e.g. the program compiled for `cuda`).
    pub fn load_with_program(
        gguf: impl AsRef<Path>,
        device: &str,
        program: Option<&Path>,
    ) -> Result<BatchLlm> {
        let path = gguf.as_ref();
        let file = gguf::GgufFile::open(path)?;
        check_model(&file, &SMOLLM2_135M)?;
        let text = TextSide::load(&file)?;
        // The parsed header (its vocabulary arrays) is not needed past here.
        drop(file);
        let instance = Instance::new();
        let mut session = Session::new(&instance, device)?;
        session.add_parameter_file("model", path)?;
        match program {
            Some(p) => session.load_file(p)?,
            None => session.load_static(SMOLLM2_BATCH_VMFB)?,
        };
        let slots = query_i32(&session, "slots")?;
        let context = query_i32(&session, "context_length")?;
        let wide_min = query_i32(&session, "wide_batch_min")?;
        // A program file built before the mixed step (e.g. a cuda program
        // compiled earlier) still serves, prompts going through
        // prefill_slot.
        let (step, step_rows) = match session.function_owned("step") {
            Ok(f) => (
                Some((f, session.function_owned("step_wide")?)),
                query_i32(&session, "step_rows")?,
            ),
            Err(e) if e.code() == StatusCode::NotFound => (None, 0),
            Err(e) => return Err(e),
        };
        let llm = BatchLlm {
            prefill_slot: session.function_owned("prefill_slot")?,
            decode_slot: session.function_owned("decode_slot")?,
            decode_batch: session.function_owned("decode_batch")?,
            decode_batch_wide: session.function_owned("decode_batch_wide")?,
            step,
            session,
            text,
            vocab: SMOLLM2_135M.vocab as usize,
            slots,
            context,
            wide_min,
            step_rows,
            gguf_path: path.to_path_buf(),
            logits: Mutex::new(Vec::new()),
        };
        finish_load(&llm.text.tokenizer)?;
        Ok(llm)
    }

    /// Number of KV-cache slots: the most sequences one
    /// [`BatchLlm::decode_batch`] call takes.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Positions per slot (prompt plus generated tokens of one sequence).
    pub fn context_length(&self) -> usize {
        self.context
    }

    /// The row count from which [`BatchLlm::decode_batch`] calls the
    /// program's `decode_batch_wide` (each matrix dequantized once per step
    /// and shared by the rows) instead of `decode_batch` (fused kernels,
    /// cheaper for a few rows); both give the same tokens.
    pub fn wide_batch_min(&self) -> usize {
        self.wide_min
    }

    /// The most rows one [`BatchLlm::step`] takes; 0 when the program has
    /// no `step` entry point (built before it).
    pub fn step_rows(&self) -> usize {
        self.step_rows
    }

    /// Logits per row (the vocabulary size).
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.text.tokenizer
    }

    /// The end-of-sequence id, if the file names one.
    pub fn eos(&self) -> Option<u32> {
        self.text.eos
    }

    /// The `.gguf` this model was loaded from.
    pub fn gguf_path(&self) -> &Path {
        &self.gguf_path
    }

    /// The session the program runs in (its device, for statistics).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Token ids of `text`, as [`crate::Llm::encode`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.text.tokenizer.encode(text, false, false)
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.text.tokenizer.decode(ids, true)
    }

    /// The file's chat template applied to one user message, with the
    /// assistant's turn opened; returns its token ids.
    pub fn chat_prompt(&self, user: &str) -> Result<Vec<u32>> {
        self.chat_prompt_messages(&[chat::Message::new("user", user)])
    }

    /// The chat template over `messages`, generation prompt added.
    pub fn chat_prompt_messages(&self, messages: &[chat::Message]) -> Result<Vec<u32>> {
        self.text.chat_prompt_messages(messages)
    }

    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.slots {
            return Err(Status::new(
                StatusCode::OutOfRange,
                format!(
                    "slot {slot} is out of range: the program has {} slots (0..{})",
                    self.slots, self.slots
                ),
            ));
        }
        Ok(())
    }

    fn check_token(&self, id: u32) -> Result<()> {
        if id as usize >= self.vocab {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                format!("token id {id} is outside the vocabulary of {}", self.vocab),
            ));
        }
        Ok(())
    }

    /// Writes `ids` at positions `pos..pos + ids.len()` of `slot`'s cache
    /// (positions below `pos` must hold this sequence's earlier tokens:
    /// `pos` is 0 for a new prompt, or where the previous chunk ended) and
    /// returns the logits after the last of them.
    pub fn prefill(&self, slot: usize, ids: &[u32], pos: usize) -> Result<Vec<f32>> {
        self.check_slot(slot)?;
        if ids.is_empty() {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                "the prompt is empty",
            ));
        }
        if pos + ids.len() > self.context {
            return Err(Status::new(
                StatusCode::OutOfRange,
                format!(
                    "{} tokens at position {pos} pass the context of {} positions per slot",
                    ids.len(),
                    self.context
                ),
            ));
        }
        for &id in ids {
            self.check_token(id)?;
        }
        let v: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let t = Tensor::from_i32(&[v.len() as u64], &v)?;
        let out = self.prefill_slot.call(&[
            Value::I32(slot as i32),
            Value::from(t),
            Value::I32(pos as i32),
        ])?;
        let logits = first_tensor(out)?.to_f32_vec()?;
        if logits.len() != self.vocab {
            return Err(Status::new(
                StatusCode::Internal,
                format!(
                    "prefill_slot returned {} logits, not {}",
                    logits.len(),
                    self.vocab
                ),
            ));
        }
        Ok(logits)
    }

    /// One decode step for every item: appends `token` at `position` of
    /// `slot`'s sequence (the slot holds that sequence's positions
    /// `0..position`) and returns each item's next logits, in order. Every
    /// slot appears at most once; 1 to `slots()` items. One item runs the
    /// program's `decode_slot`, from [`BatchLlm::wide_batch_min`] items on
    /// `decode_batch_wide`, `decode_batch` between.
    pub fn decode_batch(&self, items: &[BatchItem]) -> Result<Vec<Vec<f32>>> {
        if items.is_empty() || items.len() > self.slots {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                format!(
                    "decode_batch takes 1 to {} items, got {}",
                    self.slots,
                    items.len()
                ),
            ));
        }
        let mut seen = vec![false; self.slots];
        let (mut slots, mut toks, mut pos) = (Vec::new(), Vec::new(), Vec::new());
        for &(slot, tok, p) in items {
            self.check_slot(slot)?;
            if std::mem::replace(&mut seen[slot], true) {
                return Err(Status::new(
                    StatusCode::InvalidArgument,
                    format!("slot {slot} appears twice in one decode_batch"),
                ));
            }
            self.check_token(tok)?;
            if p >= self.context {
                return Err(Status::new(
                    StatusCode::OutOfRange,
                    format!(
                        "position {p} of slot {slot} is past the context of {} positions per slot",
                        self.context
                    ),
                ));
            }
            slots.push(slot as i32);
            toks.push(tok as i32);
            pos.push(p as i32);
        }
        if let [(slot, tok, p)] = *items {
            // One row: the program's static one-row kernels.
            let out = self.decode_slot.call_device(&[
                Value::I32(slot as i32),
                Value::I32(tok as i32),
                Value::I32(p as i32),
            ])?;
            return self.logits_rows("decode_slot", out, 1);
        }
        let n = items.len() as u64;
        let entry = if items.len() >= self.wide_min {
            &self.decode_batch_wide
        } else {
            &self.decode_batch
        };
        let out = entry.call_device(&[
            Value::from(Tensor::from_i32(&[n], &slots)?),
            Value::from(Tensor::from_i32(&[n], &toks)?),
            Value::from(Tensor::from_i32(&[n], &pos)?),
        ])?;
        self.logits_rows("decode_batch", out, items.len())
    }

    /// One pass of the model over `rows` (decode rows and prompt pieces of
    /// any slots, in any order; 1 to [`BatchLlm::step_rows`] rows, no
    /// `(slot, pos)` twice): writes every row's K/V into its slot and
    /// returns the next-token logits of the rows with `logits` set, in the
    /// order of `rows`. The weights are read once for all rows, so prompt
    /// tokens cost little more than the matrix products of their rows; a
    /// prompt piece needs logits only on a prompt's last token.
    pub fn step(&self, rows: &[StepRow]) -> Result<Vec<Vec<f32>>> {
        let Some((step, step_wide)) = &self.step else {
            return Err(Status::new(
                StatusCode::Unimplemented,
                "the batch program has no step entry point (rebuild it from examples/llm/model.py)",
            ));
        };
        if rows.is_empty() || rows.len() > self.step_rows {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                format!(
                    "step takes 1 to {} rows, got {}",
                    self.step_rows,
                    rows.len()
                ),
            ));
        }
        for r in rows {
            self.check_slot(r.slot)?;
            self.check_token(r.token)?;
            if r.pos >= self.context {
                return Err(Status::new(
                    StatusCode::OutOfRange,
                    format!(
                        "position {} of slot {} is past the context of {} positions per slot",
                        r.pos, r.slot, self.context
                    ),
                ));
            }
        }
        // The program takes the rows sorted by (slot, position) (so that
        // it can check in one pass that no pair comes twice).
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| (rows[i].slot, rows[i].pos));
        for w in order.windows(2) {
            let (a, b) = (rows[w[0]], rows[w[1]]);
            if (a.slot, a.pos) == (b.slot, b.pos) {
                return Err(Status::new(
                    StatusCode::InvalidArgument,
                    format!(
                        "slot {} position {} appears twice in one step",
                        a.slot, a.pos
                    ),
                ));
            }
        }
        let wanted = rows.iter().filter(|r| r.logits).count();
        let distinct_slots = order.windows(2).all(|w| rows[w[0]].slot != rows[w[1]].slot);
        if wanted == rows.len() && distinct_slots && rows.len() > 1 {
            // Decode rows only: decode_batch's entry points, the same
            // kernels without the choice of rows.
            let items: Vec<BatchItem> = rows.iter().map(|r| (r.slot, r.token, r.pos)).collect();
            return self.decode_batch(&items);
        }
        if rows.len() == 1 {
            // One row: the program's static one-row kernels.
            let r = rows[0];
            let out = self.decode_slot.call_device(&[
                Value::I32(r.slot as i32),
                Value::I32(r.token as i32),
                Value::I32(r.pos as i32),
            ])?;
            let logits = self.logits_rows("decode_slot", out, 1)?;
            return Ok(if r.logits { logits } else { Vec::new() });
        }
        let (mut slots, mut toks, mut pos, mut out) = (
            Vec::with_capacity(rows.len()),
            Vec::with_capacity(rows.len()),
            Vec::with_capacity(rows.len()),
            Vec::with_capacity(wanted),
        );
        // back[k]: where the k-th returned row goes in the answer.
        let mut back = Vec::with_capacity(wanted);
        for (sorted, &i) in order.iter().enumerate() {
            let r = rows[i];
            slots.push(r.slot as i32);
            toks.push(r.token as i32);
            pos.push(r.pos as i32);
            if r.logits {
                out.push(sorted as i32);
                back.push(rows[..i].iter().filter(|r| r.logits).count());
            }
        }
        if out.is_empty() {
            // The program returns at least one row: take the last one's
            // and drop it.
            out.push(rows.len() as i32 - 1);
        }
        let entry = if rows.len() >= self.wide_min {
            step_wide
        } else {
            step
        };
        let n = rows.len() as u64;
        let result = entry.call_device(&[
            Value::from(Tensor::from_i32(&[n], &slots)?),
            Value::from(Tensor::from_i32(&[n], &toks)?),
            Value::from(Tensor::from_i32(&[n], &pos)?),
            Value::from(Tensor::from_i32(&[out.len() as u64], &out)?),
        ])?;
        let got = self.logits_rows("step", result, out.len())?;
        if wanted == 0 {
            return Ok(Vec::new());
        }
        let mut answer = vec![Vec::new(); wanted];
        for (row, k) in got.into_iter().zip(back) {
            answer[k] = row;
        }
        Ok(answer)
    }

    /// The logits `entry` returned, as `n` rows of the vocabulary (read
    /// through the reused host buffer).
    fn logits_rows(&self, entry: &str, results: Vec<Value>, n: usize) -> Result<Vec<Vec<f32>>> {
        read_logits(entry, results, n, self.vocab, &self.logits, |l| {
            l.chunks_exact(self.vocab).map(<[f32]>::to_vec).collect()
        })
    }
}

fn first_tensor(results: Vec<Value>) -> Result<Tensor> {
    results
        .into_iter()
        .next()
        .and_then(Value::into_tensor)
        .ok_or_else(|| {
            Status::new(
                StatusCode::Internal,
                "the program returned no logits tensor",
            )
        })
}
