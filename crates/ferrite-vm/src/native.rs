//! Native modules: VM modules whose functions are Rust closures.
//!
//! Functions are declared with calling-convention strings (`0ii_i`,
//! `0CiDi_i` for a variadic span of i32s). A function body receives its
//! arguments flattened (each span as its count followed by the elements)
//! and returns [`NativePoll::Ready`] with results or [`NativePoll::Pending`]
//! to suspend its caller; it is stepped again after the wait, with
//! [`NativeCall::resumed`] set and whatever it stored in `saved`.

use crate::cconv::{Cconv, CconvType};
use crate::instance::Instance;
use crate::module::{
    Dependency, ExportInfo, FunctionRef, ImportInfo, Module, ModuleState, Signature,
};
use crate::stack::{NativeCall, NativePoll, NativeStep, Stack};
use crate::value::Variant;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result};
use std::sync::Arc;

/// The body of a native function.
pub type NativeFn = dyn Fn(&mut NativeCall) -> Result<NativePoll> + Send + Sync;

struct Function {
    name: String,
    cconv: Cconv,
    body: Box<NativeFn>,
}

impl NativeStep for Function {
    fn step(&self, call: &mut NativeCall) -> Result<NativePoll> {
        let r = (self.body)(call).annotate(|| format!("in native function '{}'", self.name))?;
        if let NativePoll::Ready(results) = &r {
            check_results(&self.name, &self.cconv, results)?;
        }
        Ok(r)
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
        body: impl Fn(&mut NativeCall) -> Result<NativePoll> + Send + Sync + 'static,
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
            body: Box::new(body),
        }));
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
    args: &'a [Variant],
    at: usize,
}

impl<'a> ArgReader<'a> {
    /// Starts reading `call`'s arguments.
    pub fn new(call: &'a NativeCall) -> ArgReader<'a> {
        ArgReader {
            args: &call.args,
            at: 0,
        }
    }

    fn next(&mut self) -> Result<&'a Variant> {
        let v = self
            .args
            .get(self.at)
            .ok_or_else(|| status!(InvalidArgument, "missing argument {}", self.at))?;
        self.at += 1;
        Ok(v)
    }

    /// The next argument as i32.
    pub fn i32(&mut self) -> Result<i32> {
        match self.next()? {
            Variant::I32(v) => Ok(*v),
            v => bail!(
                InvalidArgument,
                "argument {}: expected i32, received {}",
                self.at - 1,
                v.kind_name()
            ),
        }
    }

    /// The next argument as i64.
    pub fn i64(&mut self) -> Result<i64> {
        match self.next()? {
            Variant::I64(v) => Ok(*v),
            v => bail!(
                InvalidArgument,
                "argument {}: expected i64, received {}",
                self.at - 1,
                v.kind_name()
            ),
        }
    }

    /// The next argument as f32.
    pub fn f32(&mut self) -> Result<f32> {
        match self.next()? {
            Variant::F32(v) => Ok(*v),
            v => bail!(
                InvalidArgument,
                "argument {}: expected f32, received {}",
                self.at - 1,
                v.kind_name()
            ),
        }
    }

    /// The next argument as f64.
    pub fn f64(&mut self) -> Result<f64> {
        match self.next()? {
            Variant::F64(v) => Ok(*v),
            v => bail!(
                InvalidArgument,
                "argument {}: expected f64, received {}",
                self.at - 1,
                v.kind_name()
            ),
        }
    }

    /// The next argument as a (possibly null) ref.
    pub fn opt_ref(&mut self) -> Result<Option<crate::refs::Ref>> {
        Ok(self.opt_ref_borrowed()?.cloned())
    }

    /// The next argument as a borrowed (possibly null) ref: no reference
    /// count traffic, for functions that only look at the object.
    pub fn opt_ref_borrowed(&mut self) -> Result<Option<&'a crate::refs::Ref>> {
        match self.next()? {
            Variant::Ref(r) => Ok(Some(r)),
            Variant::Null => Ok(None),
            v => bail!(
                InvalidArgument,
                "argument {}: expected ref, received {}",
                self.at - 1,
                v.kind_name()
            ),
        }
    }

    /// The next argument as a non-null ref.
    pub fn a_ref(&mut self) -> Result<crate::refs::Ref> {
        self.a_ref_borrowed().cloned()
    }

    /// The next argument as a borrowed non-null ref.
    pub fn a_ref_borrowed(&mut self) -> Result<&'a crate::refs::Ref> {
        let at = self.at;
        self.opt_ref_borrowed()?
            .ok_or_else(|| status!(InvalidArgument, "argument {at}: ref is null"))
    }
}
