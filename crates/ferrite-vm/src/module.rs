//! The module ABI shared by bytecode and native (Rust) modules.
//!
//! A [`Module`] is immutable, loaded once and shared; a context asks it for
//! a [`ModuleState`] (globals, resolved imports) per context. Calls go
//! through [`ModuleState::begin_call`], which pushes a frame onto the
//! invocation's [`Stack`]; the invocation loop then steps frames until they
//! return or yield. That one protocol serves bytecode and native functions,
//! so any import may suspend its caller.

use crate::cconv::Cconv;
use crate::instance::Instance;
use crate::stack::Stack;
use crate::value::Variant;
use ferrite_base::Result;
use std::sync::Arc;

/// A function signature: calling convention plus reflection attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Signature {
    /// The calling convention string (`0ii_r`); empty when unknown.
    pub cconv: String,
    /// Reflection attributes (`iree.abi.declaration`, ...).
    pub attrs: Vec<(String, String)>,
}

impl Signature {
    /// A signature with only a calling convention.
    pub fn new(cconv: impl Into<String>) -> Signature {
        Signature {
            cconv: cconv.into(),
            attrs: Vec::new(),
        }
    }

    /// Looks up a reflection attribute.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// An exported function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// Local name (`add`).
    pub name: String,
    /// Signature.
    pub signature: Signature,
}

/// An imported function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportInfo {
    /// Fully qualified name (`hal.buffer.subspan`).
    pub full_name: String,
    /// Expected signature (cconv may be empty when the module omits it).
    pub signature: Signature,
    /// Optional imports may stay unresolved (`vm.import.resolved` is 0).
    pub optional: bool,
}

/// A module this module needs registered before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dependency {
    /// Module name.
    pub name: String,
    /// Minimum acceptable version.
    pub minimum_version: u32,
    /// Optional dependencies may be absent.
    pub optional: bool,
}

/// A loaded module: bytecode or native.
pub trait Module: Send + Sync {
    /// Module name (`hal`, `check`, or the bytecode module's name).
    fn name(&self) -> &str;
    /// Module version, checked against dependents' minimum versions.
    fn version(&self) -> u32;
    /// Modules this one depends on.
    fn dependencies(&self) -> &[Dependency];
    /// Functions this module imports, in ordinal order.
    fn imports(&self) -> &[ImportInfo];
    /// Functions this module exports, in ordinal order.
    fn exports(&self) -> &[ExportInfo];
    /// Creates the per-context state (globals, import table).
    fn create_state(self: Arc<Self>, instance: &Instance) -> Result<Arc<dyn ModuleState>>;

    /// Looks up an export ordinal by name.
    fn lookup_export(&self, name: &str) -> Option<u32> {
        self.exports()
            .iter()
            .position(|e| e.name == name)
            .map(|i| i as u32)
    }
}

/// A function of a specific module state, as imports resolve to.
///
/// One shared allocation: import calls clone it per call, so it costs a
/// single reference-count update.
#[derive(Clone)]
pub struct FunctionRef(Arc<FunctionTarget>);

/// What a [`FunctionRef`] points at (reachable through `Deref`).
pub struct FunctionTarget {
    /// The state whose export is called.
    pub state: Arc<dyn ModuleState>,
    /// Export ordinal within that module.
    pub ordinal: u32,
    /// The callee's parsed calling convention.
    pub cconv: Arc<Cconv>,
    /// `module.function`, for messages and backtraces.
    pub name: Arc<str>,
    /// The callee's body when it is a native function: the interpreter
    /// steps it in place, without a frame of its own, unless it yields.
    pub native: Option<Arc<dyn crate::stack::NativeStep>>,
    /// `native`'s closure when a step is that closure plus
    /// [`crate::stack::NativeStep::finish`] (native module functions), taken
    /// once here: an in-place import call makes one dynamic call, not two.
    pub(crate) direct: Option<Arc<crate::native::NativeFn>>,
    /// The callee's in-place entry, when it has one (see
    /// [`crate::in_place`]), taken once here like `direct`.
    pub(crate) in_place: Option<Arc<crate::in_place::InPlaceFn>>,
}

impl FunctionRef {
    /// A reference to export `ordinal` of `state`.
    pub fn new(
        state: Arc<dyn ModuleState>,
        ordinal: u32,
        cconv: Arc<Cconv>,
        name: Arc<str>,
    ) -> FunctionRef {
        let native = state.native_body(ordinal);
        let direct = native.as_ref().and_then(|n| n.direct());
        let in_place = native.as_ref().and_then(|n| n.in_place());
        FunctionRef(Arc::new(FunctionTarget {
            native,
            direct,
            in_place,
            state,
            ordinal,
            cconv,
            name,
        }))
    }
}

impl std::ops::Deref for FunctionRef {
    type Target = FunctionTarget;
    fn deref(&self) -> &FunctionTarget {
        &self.0
    }
}

impl std::fmt::Debug for FunctionRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name)
    }
}

/// Per-context state of a module.
pub trait ModuleState: Send + Sync {
    /// The module this state belongs to.
    fn module(&self) -> Arc<dyn Module>;
    /// Binds import `ordinal` to `target` (None leaves an optional import unresolved).
    fn resolve_import(&self, ordinal: usize, target: Option<FunctionRef>) -> Result<()>;
    /// Pushes a frame that will run export `ordinal` with `args` (already
    /// checked against the export's calling convention).
    fn begin_call(
        self: Arc<Self>,
        stack: &mut Stack,
        ordinal: u32,
        args: Vec<Variant>,
    ) -> Result<()>;
    /// Releases resources before the context drops the state (`__deinit` has
    /// already run); breaks reference cycles through resolved imports.
    fn teardown(&self) {}
    /// The body of export `ordinal` when it is a native function that may be
    /// stepped directly by a calling interpreter (see
    /// [`FunctionTarget::native`]); None makes calls go through
    /// [`ModuleState::begin_call`].
    fn native_body(&self, _ordinal: u32) -> Option<Arc<dyn crate::stack::NativeStep>> {
        None
    }
}
