//! The invocation stack: frames of bytecode and native functions plus the
//! register arenas bytecode frames slice into.
//!
//! Frames live here rather than on the Rust stack so that an invocation can
//! yield at any depth (`DEFERRED`) and be resumed later exactly where it
//! stopped: the stack is the coroutine.

use crate::bytecode::module::BytecodeState;
use crate::refs::Ref;
use crate::value::Variant;
use ferrite_base::wait::WaitMode;
use ferrite_base::{Deadline, WaitSource};
use std::any::Any;
use std::sync::Arc;

/// Default maximum number of frames before a call fails with
/// `RESOURCE_EXHAUSTED`.
///
/// Frames and their registers live on the heap (this stack), not on the
/// thread's stack, so what bounds recursion is the memory they take: the
/// register budget [`MAX_REGISTER_BYTES`] and this frame count (a frame's
/// own bookkeeping is about a hundred bytes, so 65,536 frames take a few
/// MB). Upstream's fixed-size stack admits about 5,000-6,500 frames of a
/// small recursive function; a program upstream runs must run here too,
/// so the limit is set well above that rather than at a round number
/// below it.
pub const DEFAULT_MAX_DEPTH: usize = 65_536;

/// The most bytes of registers (i32 slots and ref slots together) one
/// stack's frames may hold. A module picks its functions' register counts
/// (up to 32K i32 and 16K ref registers each), so deep recursion through
/// large frames is bounded here as well as by the frame count; past the
/// limit a call fails with `RESOURCE_EXHAUSTED`, as upstream's stack does
/// past its (smaller) size limit.
pub const MAX_REGISTER_BYTES: usize = 256 << 20;

/// What a suspended invocation waits for before it can resume.
#[derive(Clone)]
pub struct Wait {
    /// Sources to wait on; empty for a plain yield (resume at once).
    pub sources: Vec<Arc<dyn WaitSource>>,
    /// Whether all or any source must be ready.
    pub mode: WaitMode,
    /// When waiting gives up with `DEADLINE_EXCEEDED`.
    pub deadline: Deadline,
    /// When true, a failed or timed-out wait is handed to the yielding
    /// function ([`NativeCall::wait_status`]) instead of failing the
    /// invocation (`hal.fence.await` returns `DEADLINE_EXCEEDED` as a value).
    pub handles_failure: bool,
}

impl Wait {
    /// A yield with nothing to wait for.
    pub fn yield_now() -> Wait {
        Wait {
            sources: Vec::new(),
            mode: WaitMode::All,
            deadline: Deadline::InfiniteFuture,
            handles_failure: false,
        }
    }
}

impl std::fmt::Debug for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Wait({} sources, {:?}, {:?})",
            self.sources.len(),
            self.mode,
            self.deadline
        )
    }
}

/// A native function's progress report to the invocation loop.
pub enum NativePoll {
    /// Finished with these results.
    Ready(Vec<Variant>),
    /// Suspend the invocation until `Wait` is satisfied, then step again.
    Pending(Wait),
}

/// One argument of a native call read in place from the caller's
/// registers: which register (with its ref/move bits) and as what type, or
/// the element count a variadic span is passed as.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operand {
    I32(u16),
    I64(u16),
    F32(u16),
    F64(u16),
    Ref(u16),
    Count(i32),
}

/// Where a native call's arguments are.
pub(crate) enum Args<'a> {
    /// Owned values: calls from the host, and calls that yielded (their
    /// arguments then outlive the caller's registers being reused), with
    /// a recycled vector for the results (see [`NativeCall::ready`]); an
    /// in-place call has no result vector to set up or release.
    Values {
        args: Vec<Variant>,
        results: Vec<Variant>,
    },
    /// The calling bytecode frame's registers, borrowed for the duration of
    /// one step: no values are built and no reference counts touched.
    Registers(InPlace<'a>),
}

/// A native call stepped inside the caller's frame: its arguments are the
/// caller's registers and [`NativeCall::ready`] writes the results straight
/// into the caller's result registers (no result vector in between).
pub(crate) struct InPlace<'a> {
    pub(crate) regs: &'a mut [u32],
    pub(crate) refs: &'a mut [Option<Ref>],
    pub(crate) operands: &'a [Operand],
    /// The ref operands the caller moves into the call, when listed at
    /// decode time (else `operands` are scanned for move bits).
    pub(crate) moved: Option<&'a [Operand]>,
    /// The caller's result registers (ref registers carry the ref bit).
    pub(crate) results: &'a [u32],
    /// The callee's declared result types, which the values must match.
    pub(crate) result_types: &'a [crate::cconv::CconvType],
}

impl InPlace<'_> {
    /// Releases the ref operands the caller moved into the call (the callee
    /// only borrowed them), then writes `values` to the result registers.
    /// The release comes first: a result may go to a register it frees.
    #[inline(always)]
    fn finish(&mut self, values: impl IntoIterator<Item = Variant>) -> ferrite_base::Result<()> {
        crate::bytecode::interp::native_bridge::release_moved_operands(
            self.refs,
            self.moved.unwrap_or(self.operands),
        );
        let mut n = 0;
        for v in values {
            let (Some(&reg), Some(ty)) = (self.results.get(n), self.result_types.get(n)) else {
                ferrite_base::bail!(
                    Internal,
                    "returned more than the {} results its signature declares",
                    self.result_types.len()
                );
            };
            crate::bytecode::interp::values::write_typed(self.regs, self.refs, reg, ty, v)
                .map_err(|e| e.annotate(format!("result {n}")))?;
            n += 1;
        }
        if n != self.results.len() {
            ferrite_base::bail!(
                Internal,
                "returned {n} results, its signature declares {}",
                self.results.len()
            );
        }
        Ok(())
    }
}

/// A native function returned `returned` results where its signature
/// declares `declared`.
#[cold]
#[inline(never)]
fn result_count_mismatch(returned: usize, declared: usize) -> ferrite_base::Status {
    ferrite_base::status!(
        Internal,
        "returned {returned} results, its signature declares {declared}"
    )
}

/// Per-call data of a native function, kept across yields.
pub struct NativeCall<'a> {
    /// Arguments, flattened per the function's calling convention (read
    /// them with [`crate::native::ArgReader`]).
    pub(crate) args: Args<'a>,
    /// Whatever the function saved before yielding (None on first step).
    pub saved: Option<Box<dyn Any + Send>>,
    /// True when stepping after a yield.
    pub resumed: bool,
    /// Outcome of the wait this call yielded on, set before it is stepped
    /// again: Ok when satisfied, else (only for waits with
    /// [`Wait::handles_failure`]) `DEADLINE_EXCEEDED` or the failing
    /// source's status.
    pub wait_status: Option<ferrite_base::Result<()>>,
    /// Set when [`NativeCall::ready`] wrote the results into the caller's
    /// registers ([`Args::Registers`]); the `Ready` vector is then empty.
    pub(crate) written: bool,
}

impl NativeCall<'_> {
    /// A call with owned argument values (as a host or test would make).
    pub fn with_values(args: Vec<Variant>) -> NativeCall<'static> {
        NativeCall {
            args: Args::Values {
                args,
                results: Vec::new(),
            },
            saved: None,
            resumed: false,
            wait_status: None,
            written: false,
        }
    }

    /// Finishes the call with `values` as its results: written straight into
    /// the caller's registers for an in-place call, else in a vector the
    /// stack recycles (no allocation per call, unlike building a new one).
    #[inline(always)]
    pub fn ready(
        &mut self,
        values: impl IntoIterator<Item = Variant>,
    ) -> ferrite_base::Result<NativePoll> {
        let results = match &mut self.args {
            Args::Registers(frame) => {
                frame.finish(values)?;
                self.written = true;
                return Ok(NativePoll::Ready(Vec::new()));
            }
            Args::Values { results, .. } => results,
        };
        let mut out = std::mem::take(results);
        out.clear();
        out.extend(values);
        Ok(NativePoll::Ready(out))
    }

    /// [`NativeCall::ready`] with no results, out of line: one copy of the
    /// result handling (release of moved operands, the vector fallback)
    /// shared by every function that calls it, where the inlined `ready`
    /// puts a copy in each function body and the bodies one program call
    /// runs spread over more instruction-cache lines.
    #[inline(never)]
    pub fn ready_none(&mut self) -> ferrite_base::Result<NativePoll> {
        if let Args::Registers(frame) = &mut self.args {
            if !frame.results.is_empty() {
                return Err(result_count_mismatch(0, frame.results.len()));
            }
            crate::bytecode::interp::native_bridge::release_moved_operands(
                frame.refs,
                frame.moved.unwrap_or(frame.operands),
            );
            self.written = true;
            return Ok(NativePoll::Ready(Vec::new()));
        }
        self.ready([])
    }

    /// [`NativeCall::ready`] with one result, out of line (see
    /// [`NativeCall::ready_none`]).
    #[inline(never)]
    pub fn ready_one(&mut self, value: Variant) -> ferrite_base::Result<NativePoll> {
        if let Args::Registers(frame) = &mut self.args {
            let ([reg], [ty]) = (frame.results, frame.result_types) else {
                return Err(result_count_mismatch(1, frame.results.len()));
            };
            // Released first: the result may go to a register it frees.
            crate::bytecode::interp::native_bridge::release_moved_operands(
                frame.refs,
                frame.moved.unwrap_or(frame.operands),
            );
            crate::bytecode::interp::values::write_typed(frame.regs, frame.refs, *reg, ty, value)
                .map_err(|e| e.annotate("result 0".to_string()))?;
            self.written = true;
            return Ok(NativePoll::Ready(Vec::new()));
        }
        self.ready([value])
    }

    /// [`NativeCall::ready_one`] with a non-null ref result, for functions
    /// that make or hand out an object: an in-place call whose single
    /// declared result is a ref stores it straight into the caller's ref
    /// register, without a [`Variant`] to build and match (anything else
    /// goes through `ready_one`, which also reports a mismatch).
    #[inline(never)]
    pub fn ready_ref(&mut self, value: Ref) -> ferrite_base::Result<NativePoll> {
        use crate::bytecode::verifier::{REF_BIT, REF_MASK};
        if let Args::Registers(frame) = &mut self.args {
            if let ([reg], [crate::cconv::CconvType::Ref]) = (frame.results, frame.result_types) {
                let reg = *reg as u16;
                let slot = (reg & REF_MASK) as usize;
                if reg & REF_BIT != 0 && slot < frame.refs.len() {
                    // Released first: the result may go to a register it frees.
                    crate::bytecode::interp::native_bridge::release_moved_operands(
                        frame.refs,
                        frame.moved.unwrap_or(frame.operands),
                    );
                    frame.refs[slot] = Some(value);
                    self.written = true;
                    return Ok(NativePoll::Ready(Vec::new()));
                }
            }
        }
        self.ready_one(Variant::Ref(value))
    }

    /// [`NativeCall::ready_ref`] for a single i32 result (a status code, a
    /// flag): stored straight into the caller's register.
    #[inline(never)]
    pub fn ready_i32(&mut self, value: i32) -> ferrite_base::Result<NativePoll> {
        use crate::bytecode::verifier::REF_BIT;
        if let Args::Registers(frame) = &mut self.args {
            if let ([reg], [crate::cconv::CconvType::I32]) = (frame.results, frame.result_types) {
                let reg = *reg as u16;
                if reg & REF_BIT == 0 && (reg as usize) < frame.regs.len() {
                    crate::bytecode::interp::native_bridge::release_moved_operands(
                        frame.refs,
                        frame.moved.unwrap_or(frame.operands),
                    );
                    frame.regs[reg as usize] = value as u32;
                    self.written = true;
                    return Ok(NativePoll::Ready(Vec::new()));
                }
            }
        }
        self.ready_one(Variant::I32(value))
    }

    /// Takes the ref of argument `index` (a flattened argument, as
    /// [`crate::native::ArgReader`] counts them) when the call owns it: an
    /// owned argument value, or a register operand the caller moved into
    /// the call (see [`crate::native::ArgReader::last_ref_owned`]). The
    /// argument is then empty (null): the reference moves to the callee
    /// instead of being copied by it and released when the call finishes,
    /// two atomic count updates fewer. `None` when the call only borrows
    /// the ref, or the argument is null or not a ref; read the arguments
    /// first, as they are not there to read again after this.
    pub fn take_owned_ref(&mut self, index: usize) -> Option<Ref> {
        match &mut self.args {
            Args::Values { args: v, .. } => match v.get_mut(index)? {
                slot @ Variant::Ref(_) => match std::mem::replace(slot, Variant::Null) {
                    Variant::Ref(r) => Some(r),
                    _ => None,
                },
                _ => None,
            },
            Args::Registers(frame) => match *frame.operands.get(index)? {
                Operand::Ref(reg) if reg & crate::bytecode::verifier::MOVE_BIT != 0 => frame
                    .refs
                    .get_mut((reg & crate::bytecode::verifier::REF_MASK) as usize)?
                    .take(),
                _ => None,
            },
        }
    }

    /// Takes the outcome of the wait this call last yielded on.
    pub fn take_wait_status(&mut self) -> Option<ferrite_base::Result<()>> {
        self.wait_status.take()
    }

    /// True when dropping the call releases nothing: arguments in the
    /// caller's registers (so no result vector either), nothing saved, no
    /// wait outcome (the state of an in-place call that finished in place).
    #[inline(always)]
    pub(crate) fn holds_nothing(&self) -> bool {
        matches!(self.args, Args::Registers(_))
            && self.saved.is_none()
            && self.wait_status.is_none()
    }

    /// The number of flattened arguments.
    pub fn arg_count(&self) -> usize {
        match &self.args {
            Args::Values { args, .. } => args.len(),
            Args::Registers(frame) => frame.operands.len(),
        }
    }

    /// The arguments as values (refs retained), for functions that hand
    /// them on as a whole, e.g. to another language.
    pub fn arg_values(&self) -> Vec<Variant> {
        let mut reader = crate::native::ArgReader::new(self);
        (0..self.arg_count())
            .filter_map(|_| reader.value())
            .collect()
    }
}

/// A native function body, stepped until it returns [`NativePoll::Ready`].
pub trait NativeStep: Send + Sync {
    /// Runs (or resumes) the call.
    fn step(&self, call: &mut NativeCall<'_>) -> ferrite_base::Result<NativePoll>;
    /// The closure a step calls, when a step is that call followed by
    /// [`NativeStep::finish`] (functions of native modules): a resolved
    /// import keeps it ([`crate::module::FunctionTarget`]) and the
    /// interpreter calls it itself, with no dynamic call to find it first.
    fn direct(&self) -> Option<Arc<crate::native::NativeFn>> {
        None
    }
    /// The function's in-place entry, when it has one ([`crate::in_place`]):
    /// a resolved import keeps it and the interpreter tries it first on
    /// calls from bytecode.
    fn in_place(&self) -> Option<Arc<crate::in_place::InPlaceFn>> {
        None
    }
    /// What a step does with the outcome of a [`NativeStep::direct`] call
    /// (checks results not written in place, names the function in errors).
    fn finish(
        &self,
        call: &NativeCall<'_>,
        outcome: ferrite_base::Result<NativePoll>,
    ) -> ferrite_base::Result<NativePoll> {
        let _ = call;
        outcome
    }
    /// `module.function`, for backtraces.
    fn name(&self) -> &str;
}

/// A bytecode function activation.
pub(crate) struct BytecodeFrame {
    /// The module state, for frames entered from outside the module; None
    /// for internal calls (see `interp::frame_state`).
    pub state: Option<Arc<BytecodeState>>,
    pub function: u32,
    /// Index of the next instruction to run.
    pub pc: u32,
    /// Index of the instruction being run when the frame made a call or
    /// failed (for backtraces).
    pub current: u32,
    pub i32_base: u32,
    pub ref_base: u32,
    /// Pool index of the caller-side result register list awaiting this
    /// frame's callee results (`u32::MAX` when none).
    pub pending_results: u32,
    /// True when a different module (or the host) called this frame, so its
    /// return leaves the interpreter.
    pub external: bool,
}

/// A native function activation.
pub(crate) struct NativeFrame {
    pub body: Arc<dyn NativeStep>,
    pub call: NativeCall<'static>,
}

pub(crate) enum Frame {
    Bytecode(BytecodeFrame),
    /// Boxed: native frames are rare (host calls into native modules, and
    /// native calls that yielded), and a small `Frame` keeps the pushes and
    /// pops of every bytecode call cheap.
    Native(Box<NativeFrame>),
}

/// An invocation's stack of frames.
pub struct Stack {
    pub(crate) frames: Vec<Frame>,
    /// Register arena; grows only. Live frames use `[0, i32_top)`.
    pub(crate) i32_regs: Vec<u32>,
    pub(crate) i32_top: usize,
    /// Ref register arena; grows only. Slots at or above `ref_top` are None.
    pub(crate) ref_regs: Vec<Option<Ref>>,
    pub(crate) ref_top: usize,
    pub(crate) max_depth: usize,
    /// Emptied argument/result vectors kept for reuse: cross-module calls
    /// would otherwise allocate and free one per call.
    pub(crate) spare_values: Vec<Vec<Variant>>,
    /// The operand list of native calls made in place (reused).
    pub(crate) operands: Vec<Operand>,
    /// The result vector of native calls made in place (reused).
    pub(crate) native_results: Vec<Variant>,
    /// The module state of the last externally entered bytecode frame that
    /// returned: an invocation of a function of the same state takes it
    /// instead of counting a new reference, and the return that ends it
    /// puts it back instead of releasing it (two atomic updates fewer per
    /// call). Kept across [`Stack::unwind`]; a stack holding it keeps that
    /// state alive, as the context it belongs to does anyway.
    pub(crate) kept_state: Option<Arc<dyn crate::module::ModuleState>>,
    /// Per-op execution flags, when coverage recording is on.
    pub(crate) coverage: Option<Vec<bool>>,
    /// Where executed ops are traced (`--trace_execution`), when on.
    pub(crate) trace: Option<std::sync::Arc<crate::bytecode::trace::ExecutionTrace>>,
    /// Bytecode functions entered and not yet returned while a trace
    /// (`ferrite_base::trace`) is recorded: each becomes a span at its
    /// return.
    pub(crate) spans: Vec<FunctionSpan>,
}

/// A bytecode function call in progress, for the trace.
pub(crate) struct FunctionSpan {
    /// When it was entered (trace clock).
    pub(crate) start_ns: u64,
    /// `module.function`.
    pub(crate) name: String,
    /// Whether the compiling tier runs it.
    pub(crate) compiled: bool,
}

impl Default for Stack {
    fn default() -> Self {
        Stack::new(DEFAULT_MAX_DEPTH)
    }
}

impl Stack {
    /// An empty stack allowing at most `max_depth` frames.
    pub fn new(max_depth: usize) -> Stack {
        Stack {
            frames: Vec::new(),
            i32_regs: Vec::with_capacity(256),
            i32_top: 0,
            ref_regs: Vec::with_capacity(64),
            ref_top: 0,
            spare_values: Vec::new(),
            operands: Vec::new(),
            native_results: Vec::new(),
            kept_state: None,
            max_depth,
            coverage: None,
            trace: None,
            spans: Vec::new(),
        }
    }

    /// Number of live frames.
    pub fn depth(&self) -> usize {
        self.frames.len()
    }

    /// Turns on recording of which ops ran (see [`Stack::take_coverage`]).
    pub fn record_coverage(&mut self) {
        self.coverage = Some(vec![false; crate::bytecode::isa::OP_VARIANTS]);
    }

    /// Traces every op this stack executes to `trace` (`None`: off). While
    /// on, compiled functions are interpreted (see
    /// [`crate::bytecode::trace`]).
    pub fn set_trace(
        &mut self,
        trace: Option<std::sync::Arc<crate::bytecode::trace::ExecutionTrace>>,
    ) {
        self.trace = trace;
    }

    /// The ops executed since coverage recording began.
    pub fn take_coverage(&mut self) -> Vec<crate::bytecode::isa::Op> {
        let Some(cov) = self.coverage.as_mut() else {
            return Vec::new();
        };
        let ops = crate::bytecode::isa::ALL_OPS
            .iter()
            .filter(|op| cov[**op as usize])
            .copied()
            .collect();
        cov.iter_mut().for_each(|c| *c = false);
        ops
    }

    /// Reserves the register arenas for a frame of `i32_count` i32 slots
    /// and `ref_count` ref slots on top of the live ones, and returns the
    /// frame's bases (the tops before it). Fails with `RESOURCE_EXHAUSTED`
    /// past [`MAX_REGISTER_BYTES`] or when memory cannot be had, leaving
    /// the stack as it was.
    #[inline]
    pub(crate) fn push_registers(
        &mut self,
        i32_count: usize,
        ref_count: usize,
    ) -> ferrite_base::Result<(usize, usize)> {
        let (ib, rb) = (self.i32_top, self.ref_top);
        let (it, rt) = (ib + i32_count, rb + ref_count);
        if self.i32_regs.len() < it || self.ref_regs.len() < rt {
            self.grow_registers(it, rt)?;
        }
        // A frame's primitive registers start at zero, as upstream's frames
        // do (and as compiled code assumes); ref registers are already
        // clear, released when their frame popped.
        self.i32_regs[ib..it].fill(0);
        self.i32_top = it;
        self.ref_top = rt;
        Ok((ib, rb))
    }

    #[cold]
    #[inline(never)]
    fn grow_registers(&mut self, i32_top: usize, ref_top: usize) -> ferrite_base::Result<()> {
        let bytes = i32_top
            .saturating_mul(std::mem::size_of::<u32>())
            .saturating_add(ref_top.saturating_mul(std::mem::size_of::<Option<Ref>>()));
        if bytes > MAX_REGISTER_BYTES {
            ferrite_base::bail!(
                ResourceExhausted,
                "stack overflow: {bytes} bytes of registers would exceed the limit of {MAX_REGISTER_BYTES}"
            );
        }
        let exhausted = |_| {
            ferrite_base::status!(
                ResourceExhausted,
                "cannot allocate {bytes} bytes of registers"
            )
        };
        if self.i32_regs.len() < i32_top {
            self.i32_regs
                .try_reserve(i32_top - self.i32_regs.len())
                .map_err(exhausted)?;
            self.i32_regs.resize(i32_top, 0);
        }
        if self.ref_regs.len() < ref_top {
            self.ref_regs
                .try_reserve(ref_top - self.ref_regs.len())
                .map_err(exhausted)?;
            self.ref_regs.resize(ref_top, None);
        }
        Ok(())
    }

    pub(crate) fn check_depth(&self) -> ferrite_base::Result<()> {
        if self.frames.len() >= self.max_depth {
            ferrite_base::bail!(
                ResourceExhausted,
                "stack overflow: call depth would exceed the limit of {} frames",
                self.max_depth
            );
        }
        Ok(())
    }

    /// Pushes a native frame (used by native modules' `begin_call`).
    pub fn push_native(
        &mut self,
        body: Arc<dyn NativeStep>,
        args: Vec<Variant>,
    ) -> ferrite_base::Result<()> {
        self.check_depth()?;
        let call = self.native_call(args);
        self.push_native_call(body, call);
        Ok(())
    }

    /// A fresh call record for `args`, with a recycled result vector.
    pub(crate) fn native_call(&mut self, args: Vec<Variant>) -> NativeCall<'static> {
        let results = self.spare_values.pop().unwrap_or_default();
        Stack::native_call_with(args, results)
    }

    /// A fresh call record for `args` that returns its results in
    /// `results`.
    pub(crate) fn native_call_with(
        args: Vec<Variant>,
        results: Vec<Variant>,
    ) -> NativeCall<'static> {
        NativeCall {
            args: Args::Values { args, results },
            saved: None,
            resumed: false,
            wait_status: None,
            written: false,
        }
    }

    /// Pushes a frame for a call already begun (see [`Stack::native_call`]).
    pub(crate) fn push_native_call(
        &mut self,
        body: Arc<dyn NativeStep>,
        call: NativeCall<'static>,
    ) {
        self.frames
            .push(Frame::Native(Box::new(NativeFrame { body, call })));
    }

    /// Keeps an emptied vector for the next call's arguments.
    pub(crate) fn recycle_values(&mut self, mut values: Vec<Variant>) {
        if self.spare_values.len() < 8 && (1..=64).contains(&values.capacity()) {
            values.clear();
            self.spare_values.push(values);
        }
    }

    /// Drops every frame and releases the live ref registers (after a
    /// failure, and before a kept stack runs the next invocation). The
    /// arenas keep their length: slots at or above the tops are already
    /// clear (ref slots `None`, i32 slots zeroed when a frame is pushed), so
    /// the next invocation neither grows nor zeroes them again.
    pub(crate) fn unwind(&mut self) {
        self.spans.clear();
        self.frames.clear();
        let top = self.ref_top.min(self.ref_regs.len());
        for r in &mut self.ref_regs[..top] {
            if r.is_some() {
                *r = None;
            }
        }
        debug_assert!(
            self.ref_regs[top..].iter().all(Option::is_none),
            "a ref register above the top holds a ref"
        );
        self.i32_top = 0;
        self.ref_top = 0;
    }
}
