//! Continuous batching: the batch program (`examples/llm/smollm2_batch.vmfb`)
//! holds `slots()` independent KV caches on the device, and one call decodes
//! one token for each of up to `slots()` sequences, each in its own slot at
//! its own position.
//!
//! [`BatchLlm`] is the engine a server drives from one thread: it assigns
//! slots to requests, [`BatchLlm::prefill`]s each prompt into its slot
//! (whole or in chunks at increasing positions, between decode steps), and
//! calls [`BatchLlm::decode_batch`] once per step with every running
//! sequence; sequences join and leave the batch at any step. Slots are
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
use std::sync::Arc;

use ferrite::{Instance, OwnedFunction, Session, Tensor, Value};
use ferrite_tokenizer::Tokenizer;

use crate::{chat, check_model, gguf, Result, Status, StatusCode, TextSide, SMOLLM2_135M};

/// The committed batch program for SmolLM2-135M, compiled from
/// `examples/llm/model.py` (`build_batch_mlir`): entry points
/// `prefill_slot`, `decode_slot`, `decode_batch`, `decode_batch_wide`,
/// `slots`, `context_length`, `wide_batch_min`.
pub static SMOLLM2_BATCH_VMFB: &[u8] = include_bytes!("../../../examples/llm/smollm2_batch.vmfb");

/// One row of a [`BatchLlm::decode_batch`] call: `(slot, token, position)`,
/// the token to append at `position` of `slot`'s sequence.
pub type BatchItem = (usize, u32, usize);

/// A loaded batch program: the `.gguf` as its parameters, `slots()` KV
/// caches of `context_length()` positions each on the device, and the
/// tokenizer and chat template from the same file.
pub struct BatchLlm {
    // Field order: the function handles go before the session they call.
    prefill_slot: OwnedFunction,
    decode_slot: OwnedFunction,
    decode_batch: OwnedFunction,
    decode_batch_wide: OwnedFunction,
    session: Session,
    text: TextSide,
    vocab: usize,
    slots: usize,
    context: usize,
    wide_min: usize,
    gguf_path: PathBuf,
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
        Ok(BatchLlm {
            prefill_slot: session.function_owned("prefill_slot")?,
            decode_slot: session.function_owned("decode_slot")?,
            decode_batch: session.function_owned("decode_batch")?,
            decode_batch_wide: session.function_owned("decode_batch_wide")?,
            session,
            text,
            vocab: SMOLLM2_135M.vocab as usize,
            slots,
            context,
            wide_min,
            gguf_path: path.to_path_buf(),
        })
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
            let out = self.decode_slot.call(&[
                Value::I32(slot as i32),
                Value::I32(tok as i32),
                Value::I32(p as i32),
            ])?;
            let logits = first_tensor(out)?.to_f32_vec()?;
            if logits.len() != self.vocab {
                return Err(Status::new(
                    StatusCode::Internal,
                    format!(
                        "decode_slot returned {} logits, not {}",
                        logits.len(),
                        self.vocab
                    ),
                ));
            }
            return Ok(vec![logits]);
        }
        let n = items.len() as u64;
        let entry = if items.len() >= self.wide_min {
            &self.decode_batch_wide
        } else {
            &self.decode_batch
        };
        let out = entry.call(&[
            Value::from(Tensor::from_i32(&[n], &slots)?),
            Value::from(Tensor::from_i32(&[n], &toks)?),
            Value::from(Tensor::from_i32(&[n], &pos)?),
        ])?;
        let flat = first_tensor(out)?.to_f32_vec()?;
        if flat.len() != items.len() * self.vocab {
            return Err(Status::new(
                StatusCode::Internal,
                format!(
                    "decode_batch returned {} logits for {} rows of {}",
                    flat.len(),
                    items.len(),
                    self.vocab
                ),
            ));
        }
        Ok(flat.chunks_exact(self.vocab).map(<[f32]>::to_vec).collect())
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
