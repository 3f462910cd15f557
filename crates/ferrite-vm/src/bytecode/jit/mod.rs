//! The compiling tier: verified bytecode functions translated to native code
//! with Cranelift when a module loads.
//!
//! # What compiles
//! A function compiles when every instruction in it is on the tier's
//! allow-list ([`allow`], [`compiles`]) and every internal function it calls compiles
//! too and passes no refs. Inline: scalar i32/i64/f32/f64 arithmetic,
//! compares, conversions, constants, select/switch on primitives, all
//! branches, internal calls, `vm.return`/`vm.fail` and primitive globals.
//! Through helpers ([`runtime`]): libm math, buffer loads/stores/length, ref
//! globals, lists, `select`/`switch`/`cast` on refs and the ref bookkeeping
//! ops. Import calls, yields and buffer allocation/clone/copy/compare/fill/
//! hash keep a function in the interpreter.
//!
//! # How the tiers meet
//! The interpreter pushes frames as before; when it is about to run a
//! compiled function from its first instruction it calls [`run`] instead,
//! which enters native code with the frame's registers and comes back with
//! the executed `vm.return`'s register list, so returning (to the host or
//! to an interpreted caller) is the interpreter's own code. Compiled
//! functions call each other natively. On failure each compiled frame
//! records `(function, instruction)`; [`run`] turns them into frame records
//! on the stack, so backtraces read `module.function@offset` in both tiers,
//! with the same status and message.
//!
//! # Safety
//! Only functions the verifier accepted are compiled, and the translator
//! re-checks every register index it uses. Compiled code touches memory in
//! three places only: its own `Ctx` block (fixed offsets), the module's
//! global words (bounds-checked against `Ctx::global_words` before every
//! access, as the interpreter checks) and, at entry, the frame's argument
//! registers (checked to fit the frame when compiling). Everything else
//! (ref registers, buffers) goes through helpers in [`runtime`] that check
//! their indices again. Division by zero and `MIN / -1` are tested before
//! the divide, and call depth and the native stack before every call, so no
//! instruction can fault: there is no signal handler.
//!
//! Two facts the checks rest on: global words are `AtomicU32`s, which
//! compiled code reads and writes with plain aligned 32/64-bit accesses (on
//! the hosts Cranelift targets these are the instructions relaxed atomics
//! compile to; an i64 global is one 8-byte access where the interpreter
//! makes two 4-byte ones, a difference only racing threads could see); and
//! a chain of compiled calls may use at most 1 MiB of native stack below the
//! point the interpreter entered it (the thread running an invocation needs
//! that much headroom; deeper chains fail with `RESOURCE_EXHAUSTED` before
//! reaching it), besides the frame limit both tiers share. Frames larger
//! than a page are probed page by page (Cranelift inline stack probes), so
//! on a thread with less headroom than that a chain stops at the thread's
//! guard page (Rust's stack-overflow report) instead of writing past it.
//!
//! # Switch
//! [`crate::instance::InstanceOptions::jit`] (default: on unless the
//! environment variable `FERRITE_VM_JIT` is `0`/`false`/`off`); the CLI's
//! `--vm_jit=false` sets it.

pub mod allow;
mod runtime;
mod translate;

pub use allow::compiles;

use super::isa::Op;
use super::module::BytecodeState;
use super::verifier::{pool_list, DecodedFunction, IMPORT_BIT, REF_BIT};
use crate::cconv::CconvType;
use crate::stack::{BytecodeFrame, Frame, Stack};
use cranelift_codegen::ir::{self, types, AbiParam, InstBuilder, MemFlagsData, UserFuncName};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module};
use ferrite_base::{status, Status};
use runtime::Ctx;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Native stack compiled calls may use below the point where the
/// interpreter entered them; deeper chains fail with `RESOURCE_EXHAUSTED`.
const NATIVE_STACK_BUDGET: u64 = 1 << 20;

type EntryFn = unsafe extern "C" fn(*mut Ctx, *const u32, i64) -> i64;

/// What the tier did with one function.
#[derive(Clone, Debug)]
pub enum FunctionTier {
    /// Compiled: bytes of native code.
    Compiled {
        /// Size of the body's machine code.
        code_bytes: usize,
    },
    /// Left to the interpreter, and why.
    Interpreted(String),
}

/// A module's compiled functions and what the compiler reported.
pub struct JitCode {
    module: Option<JITModule>,
    entries: Vec<Option<EntryFn>>,
    /// Per function: compiled or why not.
    pub tiers: Vec<FunctionTier>,
    /// Wall time spent compiling, in nanoseconds.
    pub compile_ns: u64,
    /// Bytes of bytecode of the functions compiled.
    pub bytecode_bytes: usize,
    /// The ops the translator emitted code for, over all compiled functions
    /// (a subset of the allow-list; tests check every listed op shows up).
    pub translated_ops: BTreeSet<Op>,
    /// Per function: how many times the interpreter entered its compiled
    /// code (compiled-to-compiled calls are not counted), so a test can
    /// tell a function that ran compiled from one that only compiled.
    entered: Vec<AtomicU64>,
}

// SAFETY: after `finalize_definitions` the JIT module is never used again
// except to free its memory on drop (which needs `&mut self`); the code it
// holds is immutable, and the entry pointers are plain functions that take
// all their state as arguments. Sharing them across threads is sound.
unsafe impl Send for JitCode {}
// SAFETY: as above: no method reaches the `JITModule` through `&self`.
unsafe impl Sync for JitCode {}

impl Drop for JitCode {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: the code is referenced only through `entries`, owned by
            // this value; a `JitCode` lives in its `BytecodeModule`, which
            // outlives every state and so every call running its code.
            unsafe { m.free_memory() };
        }
    }
}

impl std::fmt::Debug for JitCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitCode")
            .field("compiled", &self.compiled_count())
            .field("functions", &self.tiers.len())
            .finish()
    }
}

impl JitCode {
    /// Number of functions compiled.
    pub fn compiled_count(&self) -> usize {
        self.entries.iter().filter(|e| e.is_some()).count()
    }

    /// How many times the interpreter has entered function `f`'s compiled
    /// code (0 for a function left interpreted or out of range).
    pub fn entered(&self, f: usize) -> u64 {
        self.entered.get(f).map_or(0, |c| c.load(Relaxed))
    }

    /// Whether function `f` runs compiled.
    #[inline]
    pub(crate) fn entry(&self, f: usize) -> Option<EntryFn> {
        self.entries.get(f).copied().flatten()
    }

    /// The per-function table `dump-module --output=jit` prints.
    pub(crate) fn report(&self, names: &[String], functions: &[DecodedFunction]) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "compiling tier: {} of {} functions compiled",
            self.compiled_count(),
            self.tiers.len()
        );
        for (i, t) in self.tiers.iter().enumerate() {
            let name = names.get(i).map_or("?", |s| s.as_str());
            let bytes = functions
                .get(i)
                .and_then(|f| f.offsets.last())
                .copied()
                .unwrap_or(0);
            match t {
                FunctionTier::Compiled { code_bytes } => {
                    let _ = writeln!(
                        out,
                        "  [{i:3}] {name}: compiled ({bytes} bytes of bytecode -> {code_bytes} bytes of native code)"
                    );
                }
                FunctionTier::Interpreted(why) => {
                    let _ = writeln!(out, "  [{i:3}] {name}: interpreted ({why})");
                }
            }
        }
        let ms = self.compile_ns as f64 / 1e6;
        let kb = self.bytecode_bytes as f64 / 1024.0;
        let _ = write!(out, "compile time: {ms:.3} ms for {kb:.2} KB of bytecode");
        if self.bytecode_bytes > 0 {
            let _ = write!(out, " ({:.2} ms/KB)", ms / kb);
        }
        out.push('\n');
        out
    }

    fn interpreted(functions: &[DecodedFunction], why: &str) -> JitCode {
        JitCode {
            module: None,
            entries: vec![None; functions.len()],
            tiers: vec![FunctionTier::Interpreted(why.to_string()); functions.len()],
            compile_ns: 0,
            bytecode_bytes: 0,
            translated_ops: BTreeSet::new(),
            entered: counters(functions.len()),
        }
    }
}

fn counters(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// Why function `f` cannot compile on its own account (its ops and
/// signature), or None when it can.
fn own_obstacle(f: &DecodedFunction) -> Option<String> {
    if let Some(i) = f.insns.iter().find(|i| !compiles(i.op())) {
        return Some(format!(
            "uses {} (not on the allow-list)",
            i.op().mnemonic()
        ));
    }
    if f.insns
        .iter()
        .any(|i| i.op() == super::isa::Op::Call && i.a & IMPORT_BIT != 0)
    {
        return Some("calls an import".into());
    }
    if f.cconv
        .args
        .iter()
        .chain(&f.cconv.results)
        .any(|t| matches!(t, CconvType::Span(_)))
    {
        return Some("variadic signature".into());
    }
    let prims = f
        .cconv
        .results
        .iter()
        .filter(|t| !matches!(t, CconvType::Ref))
        .count();
    if prims > runtime::MAX_RESULTS {
        return Some(format!("more than {} results", runtime::MAX_RESULTS));
    }
    let need = translate::arg_slots(&f.cconv.args)
        .last()
        .map_or(0, |(s, t)| s + t.i32_slots());
    let refs = f
        .cconv
        .args
        .iter()
        .filter(|t| matches!(t, CconvType::Ref))
        .count();
    if need > f.i32_count as usize || refs > f.ref_count as usize {
        return Some("arguments do not fit the register file".into());
    }
    None
}

fn passes_refs(f: &DecodedFunction) -> bool {
    f.cconv
        .args
        .iter()
        .chain(&f.cconv.results)
        .any(|t| matches!(t, CconvType::Ref))
}

/// Compiles what can be compiled of `module`'s functions. Never fails:
/// anything the compiler rejects stays interpreted, with the reason kept.
pub(crate) fn compile(functions: &[DecodedFunction]) -> JitCode {
    let t0 = Instant::now();
    let r = std::panic::catch_unwind(|| compile_inner(functions));
    let mut code = match r {
        Ok(Ok(code)) => code,
        Ok(Err(why)) => JitCode::interpreted(functions, &why),
        Err(_) => JitCode::interpreted(functions, "the code generator panicked"),
    };
    code.compile_ns = t0.elapsed().as_nanos() as u64;
    code
}

fn compile_inner(functions: &[DecodedFunction]) -> Result<JitCode, String> {
    let n = functions.len();
    let mut why: Vec<Option<String>> = functions.iter().map(own_obstacle).collect();
    // Callers of functions that stay interpreted (or pass refs) stay too.
    loop {
        let mut changed = false;
        for i in 0..n {
            if why[i].is_some() {
                continue;
            }
            for insn in &functions[i].insns {
                if insn.op() != super::isa::Op::Call || insn.a & IMPORT_BIT != 0 {
                    continue;
                }
                let c = insn.a as usize;
                let reason = match (why.get(c), functions.get(c)) {
                    (Some(None), Some(cf)) if !passes_refs(cf) => None,
                    (Some(None), Some(_)) => Some(format!("calls func {c}, which passes refs")),
                    _ => Some(format!("calls func {c}, which is interpreted")),
                };
                if reason.is_some() {
                    why[i] = reason;
                    changed = true;
                    break;
                }
            }
        }
        if !changed {
            break;
        }
    }
    if why.iter().all(|w| w.is_some()) {
        let tiers = why
            .into_iter()
            .map(|w| FunctionTier::Interpreted(w.unwrap_or_default()))
            .collect();
        return Ok(JitCode {
            module: None,
            entries: vec![None; n],
            tiers,
            compile_ns: 0,
            bytecode_bytes: 0,
            translated_ops: BTreeSet::new(),
            entered: counters(n),
        });
    }

    let mut flag_builder = settings::builder();
    let set = |fb: &mut settings::Builder, k: &str, v: &str| {
        fb.set(k, v).map_err(|e| format!("cranelift flag {k}: {e}"))
    };
    set(&mut flag_builder, "use_colocated_libcalls", "false")?;
    set(&mut flag_builder, "is_pic", "false")?;
    set(&mut flag_builder, "opt_level", "speed")?;
    // Frames larger than a page touch each page in order (inline probes):
    // the per-call budget check bounds how deep compiled calls go, not how
    // large one frame is, and a frame that moved the stack pointer past
    // the thread's guard page in one step would write beyond it.
    set(&mut flag_builder, "enable_probestack", "true")?;
    set(&mut flag_builder, "probestack_strategy", "inline")?;
    let isa_builder =
        cranelift_native::builder().map_err(|e| format!("host not supported: {e}"))?;
    let isa = isa_builder
        .finish(settings::Flags::new(flag_builder))
        .map_err(|e| format!("cranelift ISA: {e}"))?;
    let mut jit = JITModule::new(JITBuilder::with_isa(
        isa,
        cranelift_module::default_libcall_names(),
    ));
    let call_conv = jit.isa().default_call_conv();

    // Declare every compiled body and its entry trampoline.
    let mut bodies: HashMap<u32, FuncId> = HashMap::new();
    let mut entries: HashMap<u32, FuncId> = HashMap::new();
    for (i, f) in functions.iter().enumerate() {
        if why[i].is_some() {
            continue;
        }
        let sig = translate::body_signature(f, call_conv).ok_or("bad signature")?;
        let id = jit
            .declare_function(&format!("body{i}"), Linkage::Local, &sig)
            .map_err(|e| e.to_string())?;
        bodies.insert(i as u32, id);
        let mut esig = ir::Signature::new(call_conv);
        esig.params.extend([AbiParam::new(types::I64); 3]);
        esig.returns.push(AbiParam::new(types::I64));
        let eid = jit
            .declare_function(&format!("entry{i}"), Linkage::Local, &esig)
            .map_err(|e| e.to_string())?;
        entries.insert(i as u32, eid);
    }

    let mut ctx = jit.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let mut tiers: Vec<FunctionTier> = Vec::with_capacity(n);
    let mut bytecode_bytes = 0usize;
    let mut translated_ops = BTreeSet::new();
    for (i, f) in functions.iter().enumerate() {
        if let Some(w) = &why[i] {
            tiers.push(FunctionTier::Interpreted(w.clone()));
            continue;
        }
        // The body.
        let id = bodies[&(i as u32)];
        ctx.func.signature = translate::body_signature(f, call_conv).ok_or("bad signature")?;
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        {
            let mut callees = HashMap::new();
            for insn in &f.insns {
                if insn.op() == super::isa::Op::Call && insn.a & IMPORT_BIT == 0 {
                    let c = insn.a;
                    if let std::collections::hash_map::Entry::Vacant(e) = callees.entry(c) {
                        let cid = *bodies.get(&c).ok_or("callee not declared")?;
                        let func = jit.declare_func_in_func(cid, &mut ctx.func);
                        e.insert(translate::Callee {
                            func,
                            ref_count: functions[c as usize].ref_count,
                        });
                    }
                }
            }
            let b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let mut t = translate::Translator::new(b, f, i as u32, functions, callees, call_conv);
            t.translate().map_err(|e| format!("function {i}: {e}"))?;
            translated_ops.extend(std::mem::take(&mut t.translated));
            t.b.finalize(jit.target_config());
        }
        jit.define_function(id, &mut ctx)
            .map_err(|e| format!("function {i}: {e:?}"))?;
        let code_bytes = ctx.compiled_code().map_or(0, |c| c.code_buffer().len());
        jit.clear_context(&mut ctx);
        tiers.push(FunctionTier::Compiled { code_bytes });
        bytecode_bytes += f.offsets.last().copied().unwrap_or(0) as usize;

        // The entry trampoline: arguments from the frame's registers.
        let eid = entries[&(i as u32)];
        let mut esig = ir::Signature::new(call_conv);
        esig.params.extend([AbiParam::new(types::I64); 3]);
        esig.returns.push(AbiParam::new(types::I64));
        ctx.func.signature = esig;
        ctx.func.name = UserFuncName::user(0, eid.as_u32());
        {
            let body = jit.declare_func_in_func(id, &mut ctx.func);
            let cfg = jit.target_config();
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let blk = b.create_block();
            b.append_block_params_for_function_params(blk);
            b.switch_to_block(blk);
            b.seal_block(blk);
            let p = b.block_params(blk).to_vec();
            let mut args = vec![p[0], p[2]];
            let mem = MemFlagsData::new().with_notrap();
            for (slot, t) in translate::arg_slots(&f.cconv.args) {
                let ty = match t {
                    CconvType::I32 => types::I32,
                    CconvType::F32 => types::F32,
                    CconvType::I64 => types::I64,
                    _ => types::F64,
                };
                args.push(b.ins().load(ty, mem, p[1], (slot * 4) as i32));
            }
            let call = b.ins().call(body, &args);
            let r = b.inst_results(call)[0];
            b.ins().return_(&[r]);
            b.finalize(cfg);
        }
        jit.define_function(eid, &mut ctx)
            .map_err(|e| format!("function {i} entry: {e:?}"))?;
        jit.clear_context(&mut ctx);
    }
    jit.finalize_definitions().map_err(|e| e.to_string())?;
    let mut ptrs = vec![None; n];
    for (&i, &eid) in &entries {
        let p = jit.get_finalized_function(eid);
        // SAFETY: `eid` was defined above with the signature
        // `(i64, i64, i64) -> i64` in the host's default calling convention,
        // which is what `extern "C"` means for these argument types.
        ptrs[i as usize] = Some(unsafe { std::mem::transmute::<*const u8, EntryFn>(p) });
    }
    Ok(JitCode {
        module: Some(jit),
        entries: ptrs,
        tiers,
        compile_ns: 0,
        bytecode_bytes,
        translated_ops,
        entered: counters(n),
    })
}

/// A compiled call that failed: its status, and the instruction the
/// innermost frame failed at (the interpreter records it on the top frame).
pub(crate) struct Failure {
    pub status: Status,
    pub innermost_pc: usize,
}

/// Runs compiled function `function` on the top frame of `stack` (entered
/// at its first instruction, its arguments already in its registers at
/// `ib`/`rb`). On success the results are in the registers named by the
/// returned `vm.return` register list (a pool index), ready for the
/// interpreter's return path. On failure the compiled frames that were live
/// are pushed as frame records above it, for the backtrace.
pub(crate) fn run(
    entry: EntryFn,
    state: &BytecodeState,
    stack: &mut Stack,
    function: usize,
    ib: usize,
    ic: usize,
) -> Result<usize, Failure> {
    let func = &state.module.functions[function];
    if let Some(c) = state
        .module
        .jit
        .as_ref()
        .and_then(|j| j.entered.get(function))
    {
        c.fetch_add(1, Relaxed);
    }
    let rb = match stack.frames.last() {
        Some(Frame::Bytecode(f)) => f.ref_base as i64,
        _ => {
            return Err(Failure {
                status: status!(Internal, "compiled function entered without its frame"),
                innermost_pc: 0,
            })
        }
    };
    let marker = 0u8;
    let here = std::ptr::addr_of!(marker) as u64;
    let mut ctx = Ctx {
        depth: stack.frames.len() as u64,
        max_depth: stack.max_depth as u64,
        stack_limit: here.saturating_sub(NATIVE_STACK_BUDGET),
        globals: state.globals.as_ptr().cast::<u32>(),
        global_words: state.globals.len() as u64,
        scratch: 0,
        ret: [0; runtime::MAX_RESULTS],
        state,
        stack,
        error: None,
        trace: Vec::new(),
    };
    // Registers of the frame, which `compile` checked hold the arguments.
    let regs = match stack_regs(&ctx, ib, ic) {
        Some(p) => p,
        None => {
            return Err(Failure {
                status: status!(Internal, "frame registers out of range"),
                innermost_pc: 0,
            })
        }
    };
    // SAFETY: `entry` is this function's compiled entry (see `compile`); it
    // reads the argument slots of `regs`, which has the function's
    // `i32_count` slots (checked above and at compile time), before any
    // helper runs; `ctx` is exclusively ours for the call and its pointers
    // (state, globals, stack) are live for its duration.
    let r = unsafe { entry(&mut ctx, regs, rb) };
    if r >= 0 {
        let list = r as usize;
        // Primitive results travel in `ret`; write them where the
        // interpreter's return path reads them.
        // SAFETY: `ctx.stack` is the `&mut Stack` we were given; compiled
        // code has returned, so this is the only live reference.
        let stack = unsafe { &mut *ctx.stack };
        let regs = &mut stack.i32_regs[ib..ib + ic];
        let mut k = 0;
        for (&reg, t) in pool_list(&func.pool, list).iter().zip(&func.cconv.results) {
            let reg = reg as usize;
            if reg as u16 & REF_BIT != 0 || matches!(t, CconvType::Ref) {
                continue;
            }
            let bits = ctx.ret[k];
            k += 1;
            match t {
                CconvType::I32 | CconvType::F32 => {
                    if let Some(s) = regs.get_mut(reg) {
                        *s = bits as u32;
                    }
                }
                _ => {
                    if let Some(s) = regs.get_mut(reg..reg + 2) {
                        s[0] = bits as u32;
                        s[1] = (bits >> 32) as u32;
                    }
                }
            }
        }
        return Ok(list);
    }
    let status = ctx
        .error
        .take()
        .unwrap_or_else(|| status!(Internal, "compiled code failed without a status"));
    // SAFETY: as above.
    let stack = unsafe { &mut *ctx.stack };
    // The trace is innermost first and ends with this frame.
    let mut trace = std::mem::take(&mut ctx.trace);
    let (_, own_pc) = trace.pop().unwrap_or((function as u32, 0));
    let mut innermost = own_pc as usize;
    if let Some(Frame::Bytecode(f)) = stack.frames.last_mut() {
        f.current = own_pc;
    }
    for &(f, pc) in trace.iter().rev() {
        stack.frames.push(Frame::Bytecode(BytecodeFrame {
            state: None,
            function: f,
            pc: pc + 1,
            current: pc,
            i32_base: stack.i32_top as u32,
            ref_base: stack.ref_top as u32,
            pending_results: u32::MAX,
            external: false,
        }));
        innermost = pc as usize;
    }
    Err(Failure {
        status,
        innermost_pc: innermost,
    })
}

fn stack_regs(ctx: &Ctx, ib: usize, ic: usize) -> Option<*const u32> {
    // SAFETY: `ctx.stack` was just made from a live `&mut Stack` and no
    // reference derived from it is alive here.
    let stack = unsafe { &*ctx.stack };
    stack.i32_regs.get(ib..ib + ic).map(|s| s.as_ptr())
}
