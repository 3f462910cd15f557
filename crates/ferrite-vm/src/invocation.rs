//! Invocations: running a function to completion across yields.
//!
//! [`Invocation::step`] runs frames until the call returns or something
//! yields; a yield hands back the [`Wait`] to satisfy before stepping again.
//! [`Invocation::run`] is the built-in scheduler: it blocks on the wait
//! sources (polling only briefly first) and resumes, so synchronous callers see a plain
//! call while asynchronous hosts can drive `step` themselves.

use crate::bytecode::interp::{self, Step};
use crate::cconv::CconvType;
use crate::module::FunctionRef;
use crate::stack::{Frame, NativePoll, Stack, Wait};
use crate::value::Variant;
use ferrite_base::status::BacktraceFrame;
use ferrite_base::wait::wait_sources;
use ferrite_base::{bail, Result, Status};
use std::sync::Arc;

/// Progress of an invocation.
#[derive(Debug)]
pub enum Poll {
    /// The function returned these results.
    Done(Vec<Variant>),
    /// The function yielded; satisfy the wait, then call `step` again.
    Pending(Wait),
}

/// A function call in progress, with its own stack.
pub struct Invocation {
    /// Boxed so that handing a kept stack in and out moves a pointer.
    stack: Box<Stack>,
    function: FunctionRef,
    done: bool,
    /// Whether the frame that last yielded handles wait failures itself.
    handles_failure: bool,
}

impl Invocation {
    /// Checks `args` against the function's calling convention and pushes
    /// its first frame.
    pub fn begin(
        function: &FunctionRef,
        args: Vec<Variant>,
        max_depth: usize,
    ) -> Result<Invocation> {
        Invocation::begin_on(function, args, Box::new(Stack::new(max_depth)))
    }

    /// [`Invocation::begin`] on a stack kept from an earlier invocation
    /// (see [`Invocation::into_stack`]), reusing its allocations.
    pub fn begin_on(
        function: &FunctionRef,
        args: Vec<Variant>,
        mut stack: Box<Stack>,
    ) -> Result<Invocation> {
        begin_frames(function, args, &mut stack)?;
        Ok(Invocation {
            stack,
            function: function.clone(),
            done: false,
            handles_failure: false,
        })
    }

    /// Records which ops run (see [`Invocation::take_coverage`]).
    pub fn record_coverage(&mut self) {
        self.stack.record_coverage();
    }

    /// Ops executed so far, when recording was on.
    pub fn take_coverage(&mut self) -> Vec<crate::bytecode::isa::Op> {
        self.stack.take_coverage()
    }

    /// Runs until the call completes or yields.
    pub fn step(&mut self) -> Result<Poll> {
        if self.done {
            bail!(
                FailedPrecondition,
                "invocation of '{}' already completed",
                self.function.name
            );
        }
        match run_frames(&mut self.stack) {
            Ok(Poll::Done(v)) => {
                self.done = true;
                Ok(Poll::Done(v))
            }
            Ok(Poll::Pending(w)) => {
                self.handles_failure = w.handles_failure;
                Ok(Poll::Pending(w))
            }
            Err(e) => {
                self.done = true;
                Err(e)
            }
        }
    }

    /// Hands the outcome of the last [`Poll::Pending`] wait to the frame that
    /// yielded. Hosts that drive [`Invocation::step`] themselves call this
    /// before stepping again. A failed wait fails the invocation unless the
    /// wait was made with [`Wait::handles_failure`].
    pub fn complete_wait(&mut self, outcome: Result<()>) -> Result<()> {
        let r = hand_wait_outcome(&mut self.stack, self.handles_failure, outcome);
        if r.is_err() {
            self.done = true;
        }
        r
    }

    /// Runs to completion, blocking on whatever the call waits for.
    pub fn run(mut self) -> Result<Vec<Variant>> {
        self.run_to_end()
    }

    /// Gives back the stack for another invocation (cleared first).
    pub fn into_stack(mut self) -> Box<Stack> {
        self.stack.unwind();
        self.stack
    }

    /// Runs to completion, keeping the invocation (and its stack).
    pub fn run_to_end(&mut self) -> Result<Vec<Variant>> {
        if ferrite_base::trace::enabled() {
            return self.run_to_end_traced();
        }
        self.run_to_end_untraced()
    }

    /// [`Invocation::run_to_end`] while a trace is recorded: the call as an
    /// `invocation` span (its failure noted), and each wait for a yield as
    /// a `wait` span.
    fn run_to_end_traced(&mut self) -> Result<Vec<Variant>> {
        use ferrite_base::trace::{self, Arg};
        let start = trace::now_ns();
        let name = self.function.name.to_string();
        let outcome = self.run_to_end_untraced();
        let mut args = Vec::new();
        if let Err(e) = &outcome {
            args.push(("failed", Arg::Str(e.to_string())));
        }
        trace::complete("invocation", name, trace::HOST_TRACK, start, args);
        outcome
    }

    fn run_to_end_untraced(&mut self) -> Result<Vec<Variant>> {
        if self.done {
            bail!(
                FailedPrecondition,
                "invocation of '{}' already completed",
                self.function.name
            );
        }
        // Whatever the outcome, the invocation is over when this returns.
        self.done = true;
        drive(&mut self.stack)
    }
}

/// Checks `args` against `function`'s calling convention and pushes its
/// first frame on `stack` (cleared first).
fn begin_frames(function: &FunctionRef, args: Vec<Variant>, stack: &mut Stack) -> Result<()> {
    stack.unwind();
    check_args(function, &args)?;
    // The state the stack kept from its last call, when it is this one.
    let state = match stack.kept_state.take() {
        Some(kept) if std::ptr::addr_eq(Arc::as_ptr(&kept), Arc::as_ptr(&function.state)) => kept,
        _ => function.state.clone(),
    };
    state.begin_call(stack, function.ordinal, args)
}

/// Calls `function` to completion on a kept `stack`, blocking on whatever
/// it waits for: [`Invocation::begin_on`] and [`Invocation::run_to_end`]
/// without the invocation record, which would hold (and count a reference
/// to) the function for messages only this path never gives. The stack is
/// left cleared.
pub(crate) fn run_on_stack(
    function: &FunctionRef,
    args: Vec<Variant>,
    stack: &mut Stack,
) -> Result<Vec<Variant>> {
    begin_frames(function, args, stack)?;
    let outcome = if ferrite_base::trace::enabled() {
        use ferrite_base::trace::{self, Arg};
        let start = trace::now_ns();
        let outcome = drive(stack);
        let mut args = Vec::new();
        if let Err(e) = &outcome {
            args.push(("failed", Arg::Str(e.to_string())));
        }
        trace::complete(
            "invocation",
            function.name.to_string(),
            trace::HOST_TRACK,
            start,
            args,
        );
        outcome
    } else {
        drive(stack)
    };
    stack.unwind();
    outcome
}

/// Runs `stack`'s frames to completion, waiting on each yield's sources
/// and handing the outcome to the frame that yielded.
fn drive(stack: &mut Stack) -> Result<Vec<Variant>> {
    loop {
        match run_frames(stack)? {
            Poll::Done(v) => return Ok(v),
            Poll::Pending(w) => {
                let outcome = if w.sources.is_empty() {
                    Ok(())
                } else if ferrite_base::trace::enabled() {
                    let start = ferrite_base::trace::now_ns();
                    let outcome = wait_sources(&w.sources, w.mode, w.deadline);
                    ferrite_base::trace::complete(
                        "wait",
                        "invocation wait (yield)",
                        ferrite_base::trace::HOST_TRACK,
                        start,
                        vec![(
                            "sources",
                            ferrite_base::trace::Arg::U64(w.sources.len() as u64),
                        )],
                    );
                    outcome
                } else {
                    wait_sources(&w.sources, w.mode, w.deadline)
                };
                hand_wait_outcome(stack, w.handles_failure, outcome)?;
            }
        }
    }
}

/// Hands a wait's outcome to the native frame that yielded on it (when it
/// succeeded, or the frame handles failures); otherwise fails the call
/// with the stack's backtrace and clears the stack.
fn hand_wait_outcome(stack: &mut Stack, handles_failure: bool, outcome: Result<()>) -> Result<()> {
    match stack.frames.last_mut() {
        Some(Frame::Native(nf)) if outcome.is_ok() || handles_failure => {
            nf.call.wait_status = Some(outcome);
            Ok(())
        }
        _ => outcome.map_err(|e| {
            let e = with_backtrace(stack, e);
            stack.unwind();
            e
        }),
    }
}

/// Calls `function` synchronously.
pub fn invoke(function: &FunctionRef, args: Vec<Variant>) -> Result<Vec<Variant>> {
    Invocation::begin(function, args, crate::stack::DEFAULT_MAX_DEPTH)?.run()
}

/// Checks `args` against `function`'s calling convention: one pass over
/// the pairs for the common case (every argument of its declared type),
/// the full check with its messages (and the variadic rule) out of line.
#[inline]
fn check_args(function: &FunctionRef, args: &[Variant]) -> Result<()> {
    let c = &function.cconv;
    if args.len() == c.args.len() {
        let mut all_match = true;
        for (a, t) in args.iter().zip(&c.args) {
            match (t, a) {
                (CconvType::I32, Variant::I32(_))
                | (CconvType::I64, Variant::I64(_))
                | (CconvType::F32, Variant::F32(_))
                | (CconvType::F64, Variant::F64(_))
                | (CconvType::Ref, Variant::Ref(_) | Variant::Null) => {}
                // A variadic function's arguments are not checked here.
                (CconvType::Span(_), _) => return Ok(()),
                _ => {
                    all_match = false;
                    break;
                }
            }
        }
        if all_match {
            return Ok(());
        }
    }
    check_args_slow(function, args)
}

#[cold]
#[inline(never)]
fn check_args_slow(function: &FunctionRef, args: &[Variant]) -> Result<()> {
    let c = &function.cconv;
    if c.is_variadic() {
        return Ok(());
    }
    if args.len() != c.args.len() {
        bail!(
            InvalidArgument,
            "function '{}' expects {} arguments ({}), received {}",
            function.name,
            c.args.len(),
            c,
            args.len()
        );
    }
    for (i, (a, t)) in args.iter().zip(&c.args).enumerate() {
        let ok = matches!(
            (t, a),
            (CconvType::I32, Variant::I32(_))
                | (CconvType::I64, Variant::I64(_))
                | (CconvType::F32, Variant::F32(_))
                | (CconvType::F64, Variant::F64(_))
                | (CconvType::Ref, Variant::Ref(_) | Variant::Null)
        );
        if !ok {
            bail!(
                InvalidArgument,
                "function '{}' argument {i}: expected {}, received {}",
                function.name,
                type_name(t),
                a.kind_name()
            );
        }
    }
    Ok(())
}

fn type_name(t: &CconvType) -> &'static str {
    match t {
        CconvType::I32 => "i32",
        CconvType::I64 => "i64",
        CconvType::F32 => "f32",
        CconvType::F64 => "f64",
        CconvType::Ref => "ref",
        CconvType::Span(_) => "variadic span",
    }
}

/// The trampoline: steps the top frame until the bottom frame returns.
fn run_frames(stack: &mut Stack) -> Result<Poll> {
    loop {
        let step = match stack.frames.last_mut() {
            None => bail!(FailedPrecondition, "no frame to run"),
            Some(Frame::Bytecode(_)) => interp::run(stack),
            Some(Frame::Native(nf)) => {
                let r = nf.body.step(&mut nf.call);
                nf.call.resumed = true;
                match r {
                    Ok(NativePoll::Ready(v)) => {
                        if let Some(Frame::Native(nf)) = stack.frames.pop() {
                            if let crate::stack::Args::Values { args, results } = nf.call.args {
                                stack.recycle_values(args);
                                stack.recycle_values(results);
                            }
                        }
                        Ok(Step::Return(v))
                    }
                    Ok(NativePoll::Pending(w)) => Ok(Step::Yield(w)),
                    Err(e) => Err(e),
                }
            }
        };
        let result = match step {
            Ok(Step::Return(values)) => {
                if stack.frames.is_empty() {
                    return Ok(Poll::Done(values));
                }
                interp::deliver_results(stack, values)
            }
            Ok(Step::Call(target, args)) => {
                target.state.clone().begin_call(stack, target.ordinal, args)
            }
            Ok(Step::Yield(w)) => return Ok(Poll::Pending(w)),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            let e = with_backtrace(stack, e);
            stack.unwind();
            return Err(e);
        }
    }
}

fn with_backtrace(stack: &Stack, mut e: Status) -> Status {
    for (index, frame) in stack.frames.iter().enumerate().rev() {
        match frame {
            Frame::Bytecode(f) => {
                let Some(state) = interp::frame_state(&stack.frames, index) else {
                    continue;
                };
                let m = &state.module;
                let func = &m.functions[f.function as usize];
                let offset = func.offsets.get(f.current as usize).copied().unwrap_or(0);
                e.push_frame(BacktraceFrame {
                    function: format!(
                        "{}.{}",
                        crate::module::Module::name(&**m),
                        m.function_names[f.function as usize]
                    ),
                    offset,
                    location: m.location(f.function, f.current),
                });
            }
            Frame::Native(n) => e.push_frame(BacktraceFrame {
                function: n.body.name().to_string(),
                offset: 0,
                location: None,
            }),
        }
    }
    e
}
