//! Greedy decoding with the token chosen on the device and each step queued
//! before the previous one has run.
//!
//! With host sampling a decode step is serial: the host records the step's
//! ~490 dispatches, the device runs them, the logits come back, the host
//! chooses the next token, and only then can the next step be recorded. On
//! `cuda` the recording alone is about a third of a step, during which the
//! GPU is idle.
//!
//! A program with the entry point [`ENTRY`] (the cuda program,
//! `examples/llm/model.py` `_decode(greedy=True)`) takes the step's state
//! `[token, position]` as a device tensor and returns the next state, with
//! the argmax of the logits as the token; it follows the coarse-fences model
//! (a wait and a signal fence after its own arguments; the call returns once
//! its work is queued). So step n + 1 is called on step n's result tensor and
//! fence before step n has run, and the host reads step n's 8-byte state
//! while the device runs step n + 1: the recording of a step overlaps the
//! device's work. On the CPU devices the loop reads each step before
//! queuing the next (`reads_beside_later_steps`): the same ids, no
//! overlap.
//!
//! The ids are the host's greedy ids: the program's argmax is
//! [`crate::sampling::argmax`]'s (first index of the largest value, NaNs
//! never chosen). A generation that stops early (end of sequence, a stop
//! string, the callback) has queued up to [`depth`] steps past its last
//! token: they run (writing cache positions no later token reads before a
//! prefill rewrites them) and are waited for before `generate` returns.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use ferrite::{DeviceTensor, Fence, Semaphore, Status, StatusCode, Tensor, Timeout, Value};

use crate::{Llm, Result, TokenSink};

/// The program's entry point for one greedy step on the device.
pub const ENTRY: &str = "decode_greedy";

/// Steps queued ahead of the one being read, unless `FERRITE_LLM_PIPELINE`
/// says otherwise.
pub const DEFAULT_DEPTH: usize = 1;

/// Steps queued ahead of the one whose token is being read:
/// `FERRITE_LLM_PIPELINE` (`0`: choose tokens on the host, the loop without
/// this module; a positive number: that many), else [`DEFAULT_DEPTH`].
pub fn depth() -> usize {
    std::env::var("FERRITE_LLM_PIPELINE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_DEPTH)
}

/// Whether greedy generation uses this loop (when the program has
/// [`ENTRY`]).
pub(crate) fn enabled() -> bool {
    depth() > 0
}

/// A step queued on the device: which token it yields, its state tensor
/// and the fence its work signals.
struct Queued {
    n: usize,
    state: DeviceTensor,
    done: Arc<Fence>,
}

/// The decode steps of a greedy generation whose first token, `first`,
/// the host chose from the prefill's logits (and `sink` accepted): step n
/// appends token n - 1 at position prompt + n - 1 and yields token n.
pub(crate) fn decode(
    llm: &Llm,
    sink: &mut TokenSink<'_>,
    first: u32,
    on_token: &mut impl FnMut(u32, &str) -> bool,
) -> Result<()> {
    let f = llm.session.function(ENTRY)?;
    let prompt = sink.out.prompt_tokens;
    let max = sink.max_tokens();
    let ahead = if reads_beside_later_steps(llm) {
        depth()
    } else {
        0
    };
    // One timeline for the generation: step n signals value n.
    let timeline = Semaphore::new(0);
    let mut state = llm
        .session
        .upload(&Tensor::from_i32(&[2], &[first as i32, position(prompt)?])?)?;
    let mut after = Arc::new(Fence::new());
    let mut queued: VecDeque<Queued> = VecDeque::with_capacity(ahead + 1);
    let mut next = 1;
    let start = Instant::now();
    let outcome = (|| -> Result<()> {
        loop {
            // Queue up to `ahead` steps beyond the one read next, within
            // max_tokens and the context (a step past the context is the
            // sink's error at its token, as in the host loop).
            while queued.len() <= ahead && next < max && prompt + next - 1 < llm.context {
                let done = Arc::new(Fence::create_at(timeline.clone(), next as u64));
                let results = f.call_device(&[
                    Value::from(&state),
                    Value::I32(position(prompt + next - 1)?),
                    Value::from(after),
                    Value::from(done.clone()),
                ])?;
                state = state_tensor(results)?;
                queued.push_back(Queued {
                    n: next,
                    state: state.clone(),
                    done: done.clone(),
                });
                after = done;
                next += 1;
            }
            let Some(step) = queued.pop_front() else {
                return Ok(());
            };
            step.done.wait(Timeout::INFINITE)?;
            let mut got = [0i32; 2];
            step.state.read_into(&mut got)?;
            sink.out.decode_steps += 1;
            let id = check_state(got, prompt + step.n, llm.vocab)?;
            if !sink.accept(id, step.n, on_token)? {
                return Ok(());
            }
        }
    })();
    // Steps queued past the last token still run; wait for them so that
    // nothing of this generation is in flight once it returns. A failure
    // here matters only if the generation itself succeeded.
    let drained = match queued.back() {
        Some(last) => last.done.wait(Timeout::INFINITE).map(|_| ()),
        None => Ok(()),
    };
    sink.out.decode_time = start.elapsed();
    outcome.and(drained)
}

/// Whether the host may read a step's state while the next step, which
/// binds it, is queued: on `cuda`, whose executables mark read-only
/// bindings and whose step results are device-only memory (read by driver
/// copies), that step holds a reader's use of it (see the HAL's device-use
/// rule). The CPU devices' executables mark no binding read-only, so there
/// every bound buffer counts as written and a read before the step ends is
/// refused: the loop reads each step before queuing the next (no overlap,
/// the same ids).
fn reads_beside_later_steps(llm: &Llm) -> bool {
    llm.session
        .devices()
        .first()
        .is_some_and(|d| d.id() == "cuda")
}

fn position(p: usize) -> Result<i32> {
    i32::try_from(p).map_err(|_| {
        Status::new(
            StatusCode::OutOfRange,
            format!("position {p} does not fit the program's i32"),
        )
    })
}

fn state_tensor(results: Vec<Value>) -> Result<DeviceTensor> {
    let bad = || {
        Status::new(
            StatusCode::Internal,
            format!("{ENTRY} returned no [token, position] tensor"),
        )
    };
    match results.into_iter().next() {
        Some(Value::Ref(r)) => {
            let t = DeviceTensor::from_ref(r).map_err(|_| bad())?;
            if t.shape() != [2] {
                return Err(bad());
            }
            Ok(t)
        }
        _ => Err(bad()),
    }
}

/// The token of a step's state `[token, position]`, after checking that
/// the device advanced to `pos` and chose a token of the vocabulary.
fn check_state(got: [i32; 2], pos: usize, vocab: usize) -> Result<u32> {
    let [id, p] = got;
    if usize::try_from(p).ok() != Some(pos) {
        return Err(Status::new(
            StatusCode::Internal,
            format!("{ENTRY} left position {p}; the host expected {pos}"),
        ));
    }
    match usize::try_from(id) {
        Ok(i) if i < vocab => Ok(id as u32),
        _ => Err(Status::new(
            StatusCode::Internal,
            format!("{ENTRY} chose token {id}, outside the vocabulary of {vocab}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_must_hold_the_expected_position_and_a_vocabulary_token() {
        assert_eq!(check_state([7, 12], 12, 100).unwrap(), 7);
        let e = check_state([7, 11], 12, 100).unwrap_err();
        assert!(e.to_string().contains("left position 11"), "{e}");
        let e = check_state([100, 12], 12, 100).unwrap_err();
        assert!(e.to_string().contains("outside the vocabulary"), "{e}");
        assert!(check_state([-1, 12], 12, 100).is_err());
    }
}
