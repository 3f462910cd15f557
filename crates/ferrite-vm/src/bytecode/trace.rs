//! `--trace_execution`: one line per executed bytecode op, in upstream's
//! layout (`[module.function+OFFSET]    op text`, the offset as 8
//! uppercase hex digits, the text as the disassembly prints the op).
//!
//! Tracing runs on the interpreter's instrumented path (the one coverage
//! recording uses): while a stack carries an [`ExecutionTrace`], compiled
//! functions are interpreted instead, so every op is seen. With no trace
//! the dispatch loop is the uninstrumented one, unchanged.
//!
//! The interpreter executes decoded instructions, some of them fused (a
//! compare sunk next to the conditional branch it feeds, see the
//! verifier). The lines are kept in bytecode order regardless: executing
//! decoded slot `s` prints the raw ops whose offsets lie after slot
//! `s - 1`'s offset and up to slot `s`'s, which is exactly the ops
//! upstream's interpreter runs in that stretch, in its order.

use super::disasm::op_lines;
use super::module::BytecodeModule;
use super::verifier::DecodedFunction;
use ferrite_base::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

type Sink = dyn Fn(&str) + Send + Sync;

/// Where traced lines go, with the per-function line tables built on first
/// use.
pub struct ExecutionTrace {
    sink: Box<Sink>,
    functions: Mutex<HashMap<(usize, usize), Arc<TracedFunction>>>,
}

impl std::fmt::Debug for ExecutionTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionTrace").finish_non_exhaustive()
    }
}

impl ExecutionTrace {
    /// A trace printing each line to stderr, as upstream's tools do.
    pub fn stderr() -> Arc<ExecutionTrace> {
        ExecutionTrace::with_sink(|line| {
            use std::io::Write;
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{line}");
        })
    }

    /// A trace handing each line (without its newline) to `sink`.
    pub fn with_sink(sink: impl Fn(&str) + Send + Sync + 'static) -> Arc<ExecutionTrace> {
        Arc::new(ExecutionTrace {
            sink: Box::new(sink),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The line table of `module`'s function `ordinal` (built once).
    pub(crate) fn function(
        &self,
        module: &Arc<BytecodeModule>,
        ordinal: usize,
    ) -> Result<Arc<TracedFunction>> {
        let key = (Arc::as_ptr(module) as usize, ordinal);
        if let Some(f) = self.functions.lock().get(&key) {
            return Ok(f.clone());
        }
        let f = Arc::new(TracedFunction::new(module, ordinal)?);
        self.functions.lock().insert(key, f.clone());
        Ok(f)
    }
}

/// One function's traced lines and which of them each decoded slot prints.
pub(crate) struct TracedFunction {
    /// Keeps the module (and so the key's address) alive while cached.
    _module: Arc<BytecodeModule>,
    lines: Vec<String>,
    /// Per decoded slot, the range of `lines` it prints.
    slots: Vec<(u32, u32)>,
}

impl TracedFunction {
    fn new(module: &Arc<BytecodeModule>, ordinal: usize) -> Result<TracedFunction> {
        let (name, ops) = op_lines(module, ordinal)?;
        let prefix = format!("[{}{}", module.archive().name(), name);
        let lines: Vec<String> = ops
            .iter()
            .map(|(offset, text)| format!("{prefix}+{offset:08X}]    {text}"))
            .collect();
        let slots = slot_ranges(
            &module.functions[ordinal],
            &ops.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        );
        Ok(TracedFunction {
            _module: module.clone(),
            lines,
            slots,
        })
    }

    /// Prints the lines of decoded slot `slot` to `trace`'s sink.
    #[cold]
    pub(crate) fn emit(&self, trace: &ExecutionTrace, slot: usize) {
        if let Some(&(start, end)) = self.slots.get(slot) {
            for line in &self.lines[start as usize..end as usize] {
                (trace.sink)(line);
            }
        }
    }
}

/// For each decoded slot, the raw ops (as indices into `raw_offsets`,
/// bytecode order) with offsets in `(offset of slot - 1, offset of slot]`.
fn slot_ranges(func: &DecodedFunction, raw_offsets: &[u32]) -> Vec<(u32, u32)> {
    let mut out = Vec::with_capacity(func.offsets.len());
    let mut prev_end = 0usize;
    for &o in &func.offsets {
        // First raw op past `o`.
        let end = raw_offsets.partition_point(|&r| r <= o).max(prev_end);
        out.push((prev_end as u32, end as u32));
        prev_end = end;
    }
    out
}
