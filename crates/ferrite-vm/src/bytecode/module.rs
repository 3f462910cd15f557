//! Bytecode modules: a verified [`Archive`] plus decoded functions, and the
//! per-context [`BytecodeState`] (globals and resolved imports).

use super::archive::Archive;
use super::interp::frames;
use super::interp::ops_global::RefGlobal;
use super::interp::values;
use super::verifier::{decode_function, DecodedFunction, ModuleEnv};
use crate::buffer::VmBuffer;
use crate::bytes::ModuleBytes;
use crate::cconv::Cconv;
use crate::instance::Instance;
use crate::module::{
    Dependency, ExportInfo, FunctionRef, ImportInfo, Module, ModuleState, Signature,
};
use crate::refs::Ref;
use crate::stack::{Frame, Stack};
use crate::types::TypeDef;
use crate::value::Variant;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, OnceLock};

/// The most bytes of primitive globals (`global_bytes_capacity`) a module
/// may declare. The count comes from the file and is allocated per context,
/// so it is bounded before anything is allocated; compiled programs use a
/// few hundred bytes (tensors live in ref globals).
pub const MAX_GLOBAL_BYTES: u32 = 64 << 20;

/// The most ref globals (`global_ref_count`) a module may declare: 16 MiB
/// of per-context slots, far above what compiled programs use (one per
/// parameter or cached buffer).
pub const MAX_REF_GLOBALS: u32 = 1 << 20;

/// A loaded, verified bytecode module. Immutable and shareable across
/// contexts and threads.
pub struct BytecodeModule {
    archive: Archive,
    dependencies: Vec<Dependency>,
    imports: Vec<ImportInfo>,
    exports: Vec<ExportInfo>,
    export_functions: Vec<u32>,
    pub(crate) functions: Vec<DecodedFunction>,
    pub(crate) function_names: Vec<String>,
    pub(crate) types: Vec<TypeDef>,
    pub(crate) strings: Vec<Box<str>>,
    pub(crate) rodata: Vec<Ref>,
    /// Natively compiled functions (None when the tier is off).
    #[cfg(feature = "jit")]
    pub(crate) jit: Option<super::jit::JitCode>,
}

impl BytecodeModule {
    /// Parses, resolves types against `instance` and verifies every function.
    pub fn load(instance: &Instance, bytes: ModuleBytes) -> Result<Arc<BytecodeModule>> {
        let (start, size) = (ferrite_base::trace::start_span(), bytes.len() as u64);
        let archive = Archive::parse(bytes)?;
        let name = archive.name().to_string();
        let module = Self::from_archive(instance, archive)
            .annotate(|| format!("loading bytecode module '{name}'"));
        ferrite_base::trace::end_span("load", start, || {
            (
                format!("load module {name}"),
                vec![("bytes", ferrite_base::trace::Arg::U64(size))],
            )
        });
        module
    }

    fn from_archive(instance: &Instance, archive: Archive) -> Result<Arc<BytecodeModule>> {
        let types = archive
            .types()
            .iter()
            .enumerate()
            .map(|(i, t)| {
                instance
                    .types()
                    .resolve(t)
                    .annotate(|| format!("resolving type [{i}]"))
            })
            .collect::<Result<Vec<_>>>()?;
        let imports: Vec<ImportInfo> = archive
            .imports()
            .iter()
            .map(|i| ImportInfo {
                full_name: i.full_name.clone(),
                signature: Signature {
                    cconv: i.signature.calling_convention.clone().unwrap_or_default(),
                    attrs: i.signature.attrs.clone(),
                },
                optional: i.optional,
            })
            .collect();
        let import_cconvs = imports
            .iter()
            .map(|i| {
                if i.signature.cconv.is_empty() {
                    Ok(None)
                } else {
                    Cconv::parse(&i.signature.cconv)
                        .map(Some)
                        .annotate(|| format!("import '{}'", i.full_name))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let sigs = archive.function_signatures();
        let descs = archive.function_descriptors();
        if sigs.len() != descs.len() {
            bail!(
                InvalidArgument,
                "module has {} function signatures but {} function descriptors",
                sigs.len(),
                descs.len()
            );
        }
        let function_cconvs = sigs
            .iter()
            .enumerate()
            .map(|(i, s)| match &s.calling_convention {
                Some(c) => Cconv::parse(c).annotate(|| format!("function {i}")),
                None => bail!(InvalidArgument, "function {i} has no calling convention"),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut function_names: Vec<String> =
            (0..descs.len()).map(|i| format!("func_{i}")).collect();
        if let Some(db) = archive.debug_database() {
            for (i, f) in db.functions.iter().enumerate().take(descs.len()) {
                if !f.local_name.is_empty() {
                    function_names[i] = f.local_name.clone();
                }
            }
        }
        let mut exports = Vec::new();
        let mut export_functions = Vec::new();
        for e in archive.exports() {
            let f = e.internal_ordinal as usize;
            let sig = sigs.get(f).ok_or_else(|| {
                status!(
                    InvalidArgument,
                    "export '{}' names function {f}, which does not exist",
                    e.local_name
                )
            })?;
            function_names[f] = e.local_name.clone();
            exports.push(ExportInfo {
                name: e.local_name.clone(),
                signature: Signature {
                    cconv: sig.calling_convention.clone().unwrap_or_default(),
                    attrs: sig.attrs.clone(),
                },
            });
            export_functions.push(e.internal_ordinal);
        }
        let ms = archive.module_state();
        check_module_state(ms.global_bytes_capacity, ms.global_ref_count)?;
        let mut strings = Vec::new();
        let mut env = ModuleEnv {
            type_count: types.len() as u32,
            import_cconvs: &import_cconvs,
            function_cconvs: &function_cconvs,
            rodata_count: archive.rodata_segments().len() as u32,
            global_bytes: ms.global_bytes_capacity,
            global_refs: ms.global_ref_count,
            strings: &mut strings,
        };
        let mut functions = Vec::with_capacity(descs.len());
        let verify_start = ferrite_base::trace::start_span();
        for (i, d) in descs.iter().enumerate() {
            let code = archive.function_bytecode(i);
            let f = decode_function(&function_names[i], code, d, &function_cconvs[i], &mut env)
                .annotate(|| format!("verifying function {i} '{}'", function_names[i]))?;
            functions.push(f);
        }
        ferrite_base::trace::end_span("load", verify_start, || {
            (
                format!("verify module {}", archive.name()),
                vec![(
                    "functions",
                    ferrite_base::trace::Arg::U64(descs.len() as u64),
                )],
            )
        });
        let shared: crate::buffer::SharedBytes = Arc::new(archive.bytes().clone());
        let rodata = archive
            .rodata_segments()
            .iter()
            .map(|s| VmBuffer::from_shared(shared.clone(), s.range()).map(Ref::new))
            .collect::<Result<Vec<_>>>()?;
        let dependencies = archive
            .dependencies()
            .iter()
            .map(|d| Dependency {
                name: d.name.clone(),
                minimum_version: d.minimum_version,
                optional: d.optional,
            })
            .collect();
        #[cfg(feature = "jit")]
        let jit = instance.options().jit.then(|| {
            ferrite_base::trace::timed(
                "load",
                |_| (format!("jit compile module {}", archive.name()), Vec::new()),
                || super::jit::compile(&functions),
            )
        });
        Ok(Arc::new(BytecodeModule {
            #[cfg(feature = "jit")]
            jit,
            archive,
            dependencies,
            imports,
            exports,
            export_functions,
            functions,
            function_names,
            types,
            strings,
            rodata,
        }))
    }

    /// The parsed archive (metadata, rodata, debug database).
    pub fn archive(&self) -> &Archive {
        &self.archive
    }

    /// Decoded functions, by internal ordinal.
    pub fn functions(&self) -> &[DecodedFunction] {
        &self.functions
    }

    /// Names of internal functions (export or debug names).
    pub fn function_names(&self) -> &[String] {
        &self.function_names
    }

    /// What the compiling tier did with each function (None when it was
    /// off for this module, or not built in).
    #[cfg(feature = "jit")]
    pub fn jit(&self) -> Option<&super::jit::JitCode> {
        self.jit.as_ref()
    }

    /// A text report of which functions run compiled (the `jit` dump of
    /// `ferrite dump-module --output=jit`): per function its tier and
    /// native code size or the reason it stays interpreted, then the
    /// compile time per KB of bytecode compiled.
    pub fn tier_report(&self) -> String {
        #[cfg(feature = "jit")]
        {
            match &self.jit {
                Some(j) => j.report(&self.function_names, &self.functions),
                None => "compiling tier: off (FERRITE_VM_JIT=0 or --vm_jit=false)\n".into(),
            }
        }
        #[cfg(not(feature = "jit"))]
        {
            "compiling tier: not built in (ferrite-vm without the `jit` feature)\n".into()
        }
    }

    /// Source location of an instruction, from the debug database.
    pub fn location(&self, function: u32, insn: u32) -> Option<String> {
        let off = *self
            .functions
            .get(function as usize)?
            .offsets
            .get(insn as usize)?;
        self.archive.resolve_location(function as usize, off)
    }
}

impl std::fmt::Debug for BytecodeModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BytecodeModule")
            .field("name", &self.archive.name())
            .field("version", &self.archive.version())
            .field("functions", &self.functions.len())
            .field("imports", &self.imports.len())
            .field("exports", &self.exports.len())
            .finish()
    }
}

impl Module for BytecodeModule {
    fn name(&self) -> &str {
        self.archive.name()
    }
    fn version(&self) -> u32 {
        self.archive.version()
    }
    fn dependencies(&self) -> &[Dependency] {
        &self.dependencies
    }
    fn imports(&self) -> &[ImportInfo] {
        &self.imports
    }
    fn exports(&self) -> &[ExportInfo] {
        &self.exports
    }
    fn create_state(self: Arc<Self>, _instance: &Instance) -> Result<Arc<dyn ModuleState>> {
        let ms = self.archive.module_state();
        check_module_state(ms.global_bytes_capacity, ms.global_ref_count)?;
        let words = (ms.global_bytes_capacity as usize).div_ceil(4);
        Ok(Arc::new(BytecodeState {
            globals: try_filled(words, "global words", || AtomicU32::new(0))?,
            ref_globals: try_filled(ms.global_ref_count as usize, "ref globals", || {
                RefGlobal::new(None)
            })?,
            imports: try_filled(self.imports.len(), "import slots", OnceLock::new)?,
            module: self,
        }))
    }
}

/// Checks the module state sizes a file declares against
/// [`MAX_GLOBAL_BYTES`] and [`MAX_REF_GLOBALS`] (`RESOURCE_EXHAUSTED`, as
/// upstream answers a state it cannot allocate).
fn check_module_state(global_bytes: u32, ref_globals: u32) -> Result<()> {
    if global_bytes > MAX_GLOBAL_BYTES {
        bail!(
            ResourceExhausted,
            "module state declares {global_bytes} bytes of globals; the limit is {MAX_GLOBAL_BYTES}"
        );
    }
    if ref_globals > MAX_REF_GLOBALS {
        bail!(
            ResourceExhausted,
            "module state declares {ref_globals} ref globals; the limit is {MAX_REF_GLOBALS}"
        );
    }
    Ok(())
}

/// `n` values from `make`, failing with `RESOURCE_EXHAUSTED` instead of
/// aborting when the memory cannot be had.
fn try_filled<T>(n: usize, what: &str, make: impl FnMut() -> T) -> Result<Box<[T]>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| status!(ResourceExhausted, "cannot allocate {n} {what}"))?;
    v.extend(std::iter::repeat_with(make).take(n));
    Ok(v.into_boxed_slice())
}

/// Per-context state of a bytecode module.
pub struct BytecodeState {
    pub(crate) module: Arc<BytecodeModule>,
    /// Primitive globals as 32-bit words (i64/f64 span two).
    pub(crate) globals: Box<[AtomicU32]>,
    pub(crate) ref_globals: Box<[RefGlobal]>,
    imports: Box<[OnceLock<Option<FunctionRef>>]>,
}

impl BytecodeState {
    /// The resolved target of import `ordinal`.
    /// Inlined into every import call; the failure (never taken by a
    /// verified, linked module) is built out of line.
    #[inline]
    pub(crate) fn import_ref(&self, ordinal: u32) -> Result<&FunctionRef> {
        match self.imports.get(ordinal as usize).and_then(|c| c.get()) {
            Some(Some(f)) => Ok(f),
            _ => Err(self.unresolved_import(ordinal)),
        }
    }

    #[cold]
    #[inline(never)]
    fn unresolved_import(&self, ordinal: u32) -> ferrite_base::Status {
        let name = self
            .module
            .imports
            .get(ordinal as usize)
            .map_or("?", |i| i.full_name.as_str());
        status!(
            NotFound,
            "import '{name}' (ordinal {ordinal}) is not resolved"
        )
    }

    /// Whether import `ordinal` resolved to a function.
    pub(crate) fn import_resolved(&self, ordinal: u32) -> bool {
        matches!(
            self.imports.get(ordinal as usize).and_then(|c| c.get()),
            Some(Some(_))
        )
    }

    /// The module this state belongs to.
    pub fn bytecode_module(&self) -> &Arc<BytecodeModule> {
        &self.module
    }
}

impl ModuleState for BytecodeState {
    fn module(&self) -> Arc<dyn Module> {
        self.module.clone()
    }

    fn resolve_import(&self, ordinal: usize, target: Option<FunctionRef>) -> Result<()> {
        let slot = self
            .imports
            .get(ordinal)
            .ok_or_else(|| status!(OutOfRange, "import ordinal {ordinal} out of range"))?;
        slot.set(target).map_err(|_| {
            status!(
                FailedPrecondition,
                "import ordinal {ordinal} already resolved"
            )
        })
    }

    fn begin_call(
        self: Arc<Self>,
        stack: &mut Stack,
        ordinal: u32,
        args: Vec<Variant>,
    ) -> Result<()> {
        let f = *self
            .module
            .export_functions
            .get(ordinal as usize)
            .ok_or_else(|| status!(NotFound, "export ordinal {ordinal} out of range"))?;
        let func = &self.module.functions[f as usize];
        // The frame is pushed without its state, which is moved in once the
        // arguments are placed: borrowing the module from `self` until then
        // spares a reference-count round trip on the module per call.
        let (ib, rb) = frames::push_frame(stack, &self.module, None, f)?;
        let regs = &mut stack.i32_regs[ib..ib + func.i32_count as usize];
        let refs = &mut stack.ref_regs[rb..rb + func.ref_count as usize];
        let mut args = args;
        let placed = values::place_args(regs, refs, &mut args, &func.cconv.args);
        stack.recycle_values(args);
        if let Err(e) = placed {
            frames::pop_frame(stack, ib, rb);
            return Err(e);
        }
        if let Some(Frame::Bytecode(frame)) = stack.frames.last_mut() {
            frame.state = Some(self);
            frame.external = true;
        }
        Ok(())
    }
}
