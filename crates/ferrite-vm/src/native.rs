//! Native modules: VM modules whose functions are Rust closures.
//!
//! Functions are declared with calling-convention strings (`0ii_i`,
//! `0CiDi_i` for a variadic span of i32s). A function body receives its
//! arguments flattened (each span as its count followed by the elements)
//! and returns [`NativePoll::Ready`] with results or [`NativePoll::Pending`]
//! to suspend its caller; it is stepped again after the wait, with
//! [`NativeCall::resumed`] set and whatever it stored in `saved`.

use crate::cconv::{Cconv, CconvType};
use crate::in_place::{InPlaceCall, InPlaceFn};
use crate::instance::Instance;
use crate::module::{
    Dependency, ExportInfo, FunctionRef, ImportInfo, Module, ModuleState, Signature,
};
use crate::stack::{Args, NativeCall, NativePoll, NativeStep, Operand, Stack};
use crate::value::Variant;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result};
use std::sync::Arc;

/// The body of a native function.
pub type NativeFn = dyn Fn(&mut NativeCall<'_>) -> Result<NativePoll> + Send + Sync;

struct Function {
    name: String,
    cconv: Cconv,
    /// Shared so that a resolved import can hold the closure itself (see
    /// [`crate::module::FunctionTarget`]'s direct entry).
    body: Arc<NativeFn>,
    /// Its in-place entry, if registered ([`NativeModuleBuilder::in_place`]).
    in_place: Option<Arc<InPlaceFn>>,
}

impl NativeStep for Function {
    fn step(&self, call: &mut NativeCall<'_>) -> Result<NativePoll> {
        let r = (self.body)(call);
        self.finish(call, r)
    }

    fn direct(&self) -> Option<Arc<NativeFn>> {
        Some(self.body.clone())
    }

    fn in_place(&self) -> Option<Arc<InPlaceFn>> {
        self.in_place.clone()
    }

    fn finish(&self, call: &NativeCall<'_>, r: Result<NativePoll>) -> Result<NativePoll> {
        match &r {
            // Results written in place were checked as they were written.
            Ok(NativePoll::Ready(results)) if !call.written => {
                check_results(&self.name, &self.cconv, results)?;
                r
            }
            Ok(_) => r,
            Err(_) => r.annotate(|| format!("in native function '{}'", self.name)),
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}

fn check_results(name: &str, cconv: &Cconv, results: &[Variant]) -> Result<()> {
    if results.len() != cconv.results.len() {
        bail!(
            Internal,
            "native function '{name}' returned {} results, its signature {cconv} declares {}",
            results.len(),
            cconv.results.len()
        );
    }
    for (i, (v, t)) in results.iter().zip(&cconv.results).enumerate() {
        let ok = matches!(
            (t, v),
            (CconvType::I32, Variant::I32(_))
                | (CconvType::I64, Variant::I64(_))
                | (CconvType::F32, Variant::F32(_))
                | (CconvType::F64, Variant::F64(_))
                | (CconvType::Ref, Variant::Ref(_) | Variant::Null)
        );
        if !ok {
            bail!(
                Internal,
                "native function '{name}' result {i} is {}, signature {cconv} says otherwise",
                v.kind_name()
            );
        }
    }
    Ok(())
}

/// Builds a [`NativeModule`].
pub struct NativeModuleBuilder {
    name: String,
    version: u32,
    dependencies: Vec<Dependency>,
    functions: Vec<Arc<Function>>,
    exports: Vec<ExportInfo>,
}

impl NativeModuleBuilder {
    /// Starts a module named `name` at `version`.
    pub fn new(name: impl Into<String>, version: u32) -> NativeModuleBuilder {
        NativeModuleBuilder {
            name: name.into(),
            version,
            dependencies: Vec::new(),
            functions: Vec::new(),
            exports: Vec::new(),
        }
    }

    /// Declares a dependency on another module.
    pub fn dependency(mut self, name: &str, minimum_version: u32, optional: bool) -> Self {
        self.dependencies.push(Dependency {
            name: name.to_string(),
            minimum_version,
            optional,
        });
        self
    }

    /// Adds an exported function with calling convention `cconv`.
    pub fn function(
        mut self,
        name: &str,
        cconv: &str,
        body: impl Fn(&mut NativeCall<'_>) -> Result<NativePoll> + Send + Sync + 'static,
    ) -> Result<Self> {
        let parsed = Cconv::parse(cconv)
            .annotate(|| format!("declaring native function '{}.{name}'", self.name))?;
        if self.exports.iter().any(|e| e.name == name) {
            bail!(
                AlreadyExists,
                "native module '{}' already has a function '{name}'",
                self.name
            );
        }
        self.exports.push(ExportInfo {
            name: name.to_string(),
            signature: Signature::new(cconv),
        });
        self.functions.push(Arc::new(Function {
            name: format!("{}.{name}", self.name),
            cconv: parsed,
            body: Arc::new(body),
            in_place: None,
        }));
        Ok(self)
    }

    /// Gives the function added last an in-place entry (see
    /// [`crate::in_place`]): calls from bytecode try it first and run the
    /// body only when it declines, so it must decline, before any effect,
    /// wherever it would not do exactly what the body does.
    pub fn in_place(
        mut self,
        entry: impl Fn(&mut InPlaceCall<'_>) -> Result<bool> + Send + Sync + 'static,
    ) -> Result<Self> {
        let Some(f) = self.functions.last_mut().and_then(Arc::get_mut) else {
            bail!(
                FailedPrecondition,
                "native module '{}': an in-place entry follows the function it enters",
                self.name
            );
        };
        f.in_place = Some(Arc::new(entry));
        Ok(self)
    }

    /// Finishes the module.
    pub fn build(self) -> Arc<NativeModule> {
        Arc::new(NativeModule {
            name: self.name,
            version: self.version,
            dependencies: self.dependencies,
            functions: self.functions,
            exports: self.exports,
        })
    }
}

/// A module of Rust functions.
pub struct NativeModule {
    name: String,
    version: u32,
    dependencies: Vec<Dependency>,
    functions: Vec<Arc<Function>>,
    exports: Vec<ExportInfo>,
}

impl Module for NativeModule {
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> u32 {
        self.version
    }
    fn dependencies(&self) -> &[Dependency] {
        &self.dependencies
    }
    fn imports(&self) -> &[ImportInfo] {
        &[]
    }
    fn exports(&self) -> &[ExportInfo] {
        &self.exports
    }
    fn create_state(self: Arc<Self>, _instance: &Instance) -> Result<Arc<dyn ModuleState>> {
        Ok(Arc::new(NativeState { module: self }))
    }
}

struct NativeState {
    module: Arc<NativeModule>,
}

impl ModuleState for NativeState {
    fn module(&self) -> Arc<dyn Module> {
        self.module.clone()
    }

    fn resolve_import(&self, ordinal: usize, _target: Option<FunctionRef>) -> Result<()> {
        bail!(
            OutOfRange,
            "native module '{}' has no import {ordinal}",
            self.module.name
        )
    }

    fn begin_call(
        self: Arc<Self>,
        stack: &mut Stack,
        ordinal: u32,
        args: Vec<Variant>,
    ) -> Result<()> {
        let f = self.module.functions.get(ordinal as usize).ok_or_else(|| {
            status!(
                NotFound,
                "native module '{}' has no export {ordinal}",
                self.module.name
            )
        })?;
        stack.push_native(f.clone(), args)
    }

    fn native_body(&self, ordinal: u32) -> Option<Arc<dyn NativeStep>> {
        let f: Arc<dyn NativeStep> = self.module.functions.get(ordinal as usize)?.clone();
        Some(f)
    }
}

/// Reads the arguments of a native call in order, with checked types.
pub struct ArgReader<'a> {
    source: Source<'a>,
    at: usize,
}

/// What an [`ArgReader`] reads from (see [`Args`]).
enum Source<'a> {
    Values(&'a [Variant]),
    /// The in-place call's register view itself (one pointer to copy
    /// when a reader starts, not three slices).
    Registers(&'a crate::stack::InPlace<'a>),
}

/// A register operand's kind, for error messages.
fn operand_kind(op: &Operand) -> &'static str {
    match op {
        Operand::I32(_) | Operand::Count(_) => "i32",
        Operand::I64(_) => "i64",
        Operand::F32(_) => "f32",
        Operand::F64(_) => "f64",
        Operand::Ref(_) => "ref",
    }
}

impl<'a> ArgReader<'a> {
    /// Starts reading `call`'s arguments.
    pub fn new(call: &'a NativeCall<'_>) -> ArgReader<'a> {
        let source = match &call.args {
            Args::Values { args, .. } => Source::Values(args),
            Args::Registers(frame) => Source::Registers(frame),
        };
        ArgReader { source, at: 0 }
    }

    #[cold]
    #[inline(never)]
    fn missing(&self) -> ferrite_base::Status {
        status!(InvalidArgument, "missing argument {}", self.at)
    }

    #[cold]
    #[inline(never)]
    fn mismatch(&self, expected: &str, received: &str) -> ferrite_base::Status {
        status!(
            InvalidArgument,
            "argument {}: expected {expected}, received {received}",
            self.at - 1
        )
    }

    /// The next argument as a value (refs retained); None past the end.
    pub fn value(&mut self) -> Option<Variant> {
        let v = match &self.source {
            Source::Values(v) => v.get(self.at)?.clone(),
            Source::Registers(frame) => match *frame.operands.get(self.at)? {
                Operand::I32(r) => Variant::I32(*frame.regs.get(r as usize)? as i32),
                Operand::F32(r) => Variant::F32(f32::from_bits(*frame.regs.get(r as usize)?)),
                Operand::I64(r) => Variant::I64(reg_i64(frame.regs, r)?),
                Operand::F64(r) => Variant::F64(f64::from_bits(reg_i64(frame.regs, r)? as u64)),
                Operand::Ref(r) => Variant::from_ref(reg_ref(frame.refs, r)?.cloned()),
                Operand::Count(n) => Variant::I32(n),
            },
        };
        self.at += 1;
        Some(v)
    }

    /// The next argument as i32.
    #[inline(always)]
    pub fn i32(&mut self) -> Result<i32> {
        let at = self.at;
        self.at += 1;
        match &self.source {
            Source::Registers(frame) => match frame.operands.get(at) {
                Some(Operand::I32(r)) => match frame.regs.get(*r as usize) {
                    Some(&x) => Ok(x as i32),
                    None => Err(self.missing()),
                },
                Some(Operand::Count(n)) => Ok(*n),
                other => Err(self.operand_mismatch("i32", other)),
            },
            Source::Values(v) => self.value_i32(v, at),
        }
    }

    /// The next argument as i64.
    #[inline(always)]
    pub fn i64(&mut self) -> Result<i64> {
        let at = self.at;
        self.at += 1;
        match &self.source {
            Source::Registers(frame) => match frame.operands.get(at) {
                Some(Operand::I64(r)) => match reg_i64(frame.regs, *r) {
                    Some(x) => Ok(x),
                    None => Err(self.missing()),
                },
                other => Err(self.operand_mismatch("i64", other)),
            },
            Source::Values(v) => self.value_i64(v, at),
        }
    }

    /// The next argument as f32.
    #[inline(always)]
    pub fn f32(&mut self) -> Result<f32> {
        let at = self.at;
        self.at += 1;
        match &self.source {
            Source::Registers(frame) => match frame.operands.get(at) {
                Some(Operand::F32(r)) => match frame.regs.get(*r as usize) {
                    Some(&x) => Ok(f32::from_bits(x)),
                    None => Err(self.missing()),
                },
                other => Err(self.operand_mismatch("f32", other)),
            },
            Source::Values(v) => self.value_f32(v, at),
        }
    }

    /// The next argument as f64.
    #[inline(always)]
    pub fn f64(&mut self) -> Result<f64> {
        let at = self.at;
        self.at += 1;
        match &self.source {
            Source::Registers(frame) => match frame.operands.get(at) {
                Some(Operand::F64(r)) => match reg_i64(frame.regs, *r) {
                    Some(x) => Ok(f64::from_bits(x as u64)),
                    None => Err(self.missing()),
                },
                other => Err(self.operand_mismatch("f64", other)),
            },
            Source::Values(v) => self.value_f64(v, at),
        }
    }

    // The accessors inline only the in-place path (calls from bytecode);
    // argument values (host calls, resumed calls) and every error are read
    // out of line, so a native function's body holds one short path per
    // argument instead of two with their messages.

    #[cold]
    #[inline(never)]
    fn operand_mismatch(&self, expected: &str, operand: Option<&Operand>) -> ferrite_base::Status {
        match operand {
            Some(o) => self.mismatch(expected, operand_kind(o)),
            None => self.missing(),
        }
    }

    #[cold]
    #[inline(never)]
    fn value_mismatch(&self, expected: &str, value: Option<&Variant>) -> ferrite_base::Status {
        match value {
            Some(o) => self.mismatch(expected, o.kind_name()),
            None => self.missing(),
        }
    }

    #[inline(never)]
    fn value_i32(&self, v: &[Variant], at: usize) -> Result<i32> {
        match v.get(at) {
            Some(Variant::I32(x)) => Ok(*x),
            other => Err(self.value_mismatch("i32", other)),
        }
    }

    #[inline(never)]
    fn value_i64(&self, v: &[Variant], at: usize) -> Result<i64> {
        match v.get(at) {
            Some(Variant::I64(x)) => Ok(*x),
            other => Err(self.value_mismatch("i64", other)),
        }
    }

    #[inline(never)]
    fn value_f32(&self, v: &[Variant], at: usize) -> Result<f32> {
        match v.get(at) {
            Some(Variant::F32(x)) => Ok(*x),
            other => Err(self.value_mismatch("f32", other)),
        }
    }

    #[inline(never)]
    fn value_f64(&self, v: &[Variant], at: usize) -> Result<f64> {
        match v.get(at) {
            Some(Variant::F64(x)) => Ok(*x),
            other => Err(self.value_mismatch("f64", other)),
        }
    }

    #[inline(never)]
    fn value_ref(&self, v: &'a [Variant], at: usize) -> Result<Option<&'a crate::refs::Ref>> {
        match v.get(at) {
            Some(Variant::Ref(r)) => Ok(Some(r)),
            Some(Variant::Null) => Ok(None),
            other => Err(self.value_mismatch("ref", other)),
        }
    }

    /// The next argument as a (possibly null) ref.
    pub fn opt_ref(&mut self) -> Result<Option<crate::refs::Ref>> {
        Ok(self.opt_ref_borrowed()?.cloned())
    }

    /// The next argument as a borrowed (possibly null) ref: no reference
    /// count traffic, for functions that only look at the object.
    #[inline(always)]
    pub fn opt_ref_borrowed(&mut self) -> Result<Option<&'a crate::refs::Ref>> {
        let at = self.at;
        self.at += 1;
        match &self.source {
            Source::Registers(frame) => match frame.operands.get(at) {
                Some(Operand::Ref(r)) => match reg_ref(frame.refs, *r) {
                    Some(x) => Ok(x),
                    None => Err(self.missing()),
                },
                other => Err(self.operand_mismatch("ref", other)),
            },
            Source::Values(v) => self.value_ref(v, at),
        }
    }

    /// Whether the call owns the ref argument read last: true for owned
    /// argument values and for operands the caller moved into the call;
    /// false when the caller's register keeps its reference too.
    pub fn last_ref_owned(&self) -> bool {
        match &self.source {
            Source::Values(_) => true,
            Source::Registers(frame) => matches!(
                self.at.checked_sub(1).and_then(|i| frame.operands.get(i)),
                Some(Operand::Ref(r)) if r & crate::bytecode::verifier::MOVE_BIT != 0
            ),
        }
    }

    /// The next argument as a non-null ref.
    pub fn a_ref(&mut self) -> Result<crate::refs::Ref> {
        self.a_ref_borrowed().cloned()
    }

    /// The next argument as a borrowed non-null ref.
    #[inline(always)]
    pub fn a_ref_borrowed(&mut self) -> Result<&'a crate::refs::Ref> {
        let at = self.at;
        match self.opt_ref_borrowed()? {
            Some(r) => Ok(r),
            None => Err(null_ref(at)),
        }
    }
}

#[cold]
#[inline(never)]
fn null_ref(at: usize) -> ferrite_base::Status {
    status!(InvalidArgument, "argument {at}: ref is null")
}

/// A 64-bit register pair (None when out of range, which the verifier
/// already rules out).
#[inline]
fn reg_i64(regs: &[u32], r: u16) -> Option<i64> {
    let r = r as usize;
    Some((*regs.get(r)? as u64 | ((*regs.get(r + 1)? as u64) << 32)) as i64)
}

/// A ref register's content (the operand carries the ref and move bits).
#[inline]
fn reg_ref(refs: &[Option<crate::refs::Ref>], r: u16) -> Option<Option<&crate::refs::Ref>> {
    refs.get((r & crate::bytecode::verifier::REF_MASK) as usize)
        .map(Option::as_ref)
}
