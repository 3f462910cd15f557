//! Contexts: an ordered set of module states with imports linked by name.

use crate::cconv::Cconv;
use crate::instance::Instance;
use crate::invocation::Invocation;
use crate::module::{FunctionRef, Module, ModuleState};
use crate::value::Variant;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

struct Entry {
    module: Arc<dyn Module>,
    state: Arc<dyn ModuleState>,
}

/// Modules registered in order; later modules import from earlier ones.
///
/// Registration checks dependency versions, resolves every import by its
/// fully qualified name, checks calling conventions, and runs the module's
/// `__init` export. Dropping the context runs `__deinit` in reverse order.
pub struct Context {
    instance: Instance,
    entries: Vec<Entry>,
    /// Stacks of finished invocations, reused so a call does not allocate
    /// its frame and register arrays anew.
    // Boxed: a kept stack moves into and out of an invocation as a pointer.
    #[allow(clippy::vec_box)]
    spare_stacks: parking_lot::Mutex<Vec<Box<crate::stack::Stack>>>,
    /// One more kept stack, taken and given back with one atomic exchange
    /// each where the list's lock costs two (lock and unlock): the common
    /// case of one thread calling in a loop.
    stack_slot: StackSlot,
    /// Where calls trace their ops (`--trace_execution`), when on.
    trace: Option<Arc<crate::bytecode::trace::ExecutionTrace>>,
}

impl Context {
    /// An empty context.
    pub fn new(instance: &Instance) -> Context {
        Context {
            instance: instance.clone(),
            entries: Vec::new(),
            spare_stacks: parking_lot::Mutex::new(Vec::new()),
            stack_slot: StackSlot::default(),
            trace: None,
        }
    }

    /// A context with `modules` registered in order.
    pub fn with_modules(instance: &Instance, modules: &[Arc<dyn Module>]) -> Result<Context> {
        let mut c = Context::new(instance);
        for m in modules {
            c.register(m.clone())?;
        }
        Ok(c)
    }

    /// Traces every bytecode op later calls execute to `trace` (`None`:
    /// off), as upstream's `--trace_execution`; while on, compiled
    /// functions are interpreted (see [`crate::bytecode::trace`]).
    pub fn set_trace_execution(
        &mut self,
        trace: Option<Arc<crate::bytecode::trace::ExecutionTrace>>,
    ) {
        self.trace = trace;
    }

    /// The instance this context belongs to.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// Registered modules in order.
    pub fn modules(&self) -> impl Iterator<Item = &Arc<dyn Module>> {
        self.entries.iter().map(|e| &e.module)
    }

    /// Registers a module: checks dependencies, links imports, runs `__init`.
    pub fn register(&mut self, module: Arc<dyn Module>) -> Result<()> {
        let name = module.name().to_string();
        ferrite_base::trace::timed(
            "load",
            |_| (format!("register module {name}"), Vec::new()),
            || self.register_inner(module),
        )
        .annotate(|| format!("registering module '{name}'"))
    }

    fn register_inner(&mut self, module: Arc<dyn Module>) -> Result<()> {
        for dep in module.dependencies() {
            match self.entries.iter().rev().find(|e| e.module.name() == dep.name) {
                Some(e) if e.module.version() < dep.minimum_version => bail!(
                    Incompatible,
                    "dependency '{}' has version {}, but version >= {} is required",
                    dep.name,
                    e.module.version(),
                    dep.minimum_version
                ),
                Some(_) => {}
                None if dep.optional => {}
                None => bail!(
                    NotFound,
                    "required dependency '{}' (version >= {}) is not registered; registered modules: [{}]",
                    dep.name,
                    dep.minimum_version,
                    self.entries.iter().map(|e| e.module.name().to_string()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
        let state = module.clone().create_state(&self.instance)?;
        for (i, imp) in module.imports().iter().enumerate() {
            let target = self.resolve(&imp.full_name)?;
            match target {
                Some(f) => {
                    if !imp.signature.cconv.is_empty() {
                        let want = Cconv::parse(&imp.signature.cconv)?;
                        if want != *f.cconv {
                            bail!(
                                InvalidArgument,
                                "import '{}' expects signature {}, but the export has signature {}",
                                imp.full_name,
                                imp.signature.cconv,
                                f.cconv
                            );
                        }
                    }
                    state.resolve_import(i, Some(f))?;
                }
                None if imp.optional => state.resolve_import(i, None)?,
                None => bail!(
                    NotFound,
                    "required import '{}' not found in any registered module",
                    imp.full_name
                ),
            }
        }
        self.entries.push(Entry {
            module: module.clone(),
            state: state.clone(),
        });
        if let Some(ord) = module.lookup_export("__init") {
            let f = function_ref(&module, &state, ord)?;
            let r = Invocation::begin(&f, Vec::new(), self.instance.options().max_stack_depth)
                .and_then(|i| i.run())
                .annotate(|| "running __init".to_string());
            if let Err(e) = r {
                self.entries.pop();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Finds an export by `module.function`; None when nothing matches.
    fn resolve(&self, full_name: &str) -> Result<Option<FunctionRef>> {
        let Some((m, f)) = full_name.split_once('.') else {
            bail!(
                InvalidArgument,
                "import name '{full_name}' is not of the form module.function"
            );
        };
        for e in self.entries.iter().rev() {
            if e.module.name() == m {
                if let Some(ord) = e.module.lookup_export(f) {
                    return function_ref(&e.module, &e.state, ord).map(Some);
                }
            }
        }
        Ok(None)
    }

    /// Looks up `module.function`, or a bare `function` in the last-registered
    /// module that exports it.
    pub fn lookup_function(&self, name: &str) -> Result<FunctionRef> {
        if let Some((m, f)) = name.split_once('.') {
            if self.entries.iter().any(|e| e.module.name() == m) {
                return self
                    .resolve(name)?
                    .ok_or_else(|| status!(NotFound, "function '{f}' not found in module '{m}'"));
            }
        }
        for e in self.entries.iter().rev() {
            if let Some(ord) = e.module.lookup_export(name) {
                return function_ref(&e.module, &e.state, ord);
            }
        }
        let available: Vec<String> = self
            .entries
            .last()
            .map(|e| e.module.exports().iter().map(|x| x.name.clone()).collect())
            .unwrap_or_default();
        bail!(
            NotFound,
            "function '{name}' not found; exports of the main module: [{}]",
            available.join(", ")
        )
    }

    /// Calls a function synchronously (yields are waited on and resumed).
    pub fn invoke(&self, function: &FunctionRef, args: Vec<Variant>) -> Result<Vec<Variant>> {
        let mut stack = self.take_stack();
        stack.set_trace(self.trace.clone());
        let result = crate::invocation::run_on_stack(function, args, &mut stack);
        self.keep_stack(stack);
        result
    }

    /// [`Context::invoke`] for hot loops: the arguments are borrowed (refs
    /// retained as the call takes them) and the results replace the contents
    /// of `results`, whose allocation is reused, as upstream's invoke takes
    /// an input list it keeps and an output list it refills. After a few
    /// calls neither the arguments nor the results allocate.
    pub fn invoke_into(
        &self,
        function: &FunctionRef,
        args: &[Variant],
        results: &mut Vec<Variant>,
    ) -> Result<()> {
        let mut stack = self.take_stack();
        stack.set_trace(self.trace.clone());
        let mut owned = stack.spare_values.pop().unwrap_or_default();
        owned.extend(args.iter().cloned());
        let outcome = crate::invocation::run_on_stack(function, owned, &mut stack);
        let result = match outcome {
            Ok(values) => {
                let old = std::mem::replace(results, values);
                stack.recycle_values(old);
                Ok(())
            }
            Err(e) => Err(e),
        };
        self.keep_stack(stack);
        result
    }

    /// A kept stack (the slot's first, then the list's) or a new one.
    fn take_stack(&self) -> Box<crate::stack::Stack> {
        self.stack_slot
            .take()
            .or_else(|| self.spare_stacks.lock().pop())
            .unwrap_or_else(|| {
                Box::new(crate::stack::Stack::new(
                    self.instance.options().max_stack_depth,
                ))
            })
    }

    /// Keeps a finished invocation's stack for the next call (the slot
    /// first; at most four more in the list).
    fn keep_stack(&self, stack: Box<crate::stack::Stack>) {
        if let Some(stack) = self.stack_slot.put(stack) {
            let mut spare = self.spare_stacks.lock();
            if spare.len() < 4 {
                spare.push(stack);
            }
        }
    }

    /// Begins an invocation the caller drives with [`Invocation::step`].
    pub fn begin(&self, function: &FunctionRef, args: Vec<Variant>) -> Result<Invocation> {
        let mut stack = Box::new(crate::stack::Stack::new(
            self.instance.options().max_stack_depth,
        ));
        stack.set_trace(self.trace.clone());
        Invocation::begin_on(function, args, stack)
    }
}

/// A slot holding at most one kept stack, behind an atomic pointer.
#[derive(Default)]
struct StackSlot(AtomicPtr<crate::stack::Stack>);

// The slot hands stacks between threads as the list's mutex does, which
// needs `Stack: Send` (an `AtomicPtr` would not ask for it).
const _: fn() = || {
    fn send<T: Send>() {}
    send::<crate::stack::Stack>();
};

impl StackSlot {
    /// Takes the kept stack, if any.
    fn take(&self) -> Option<Box<crate::stack::Stack>> {
        let p = self.0.swap(std::ptr::null_mut(), Ordering::Acquire);
        // SAFETY: a non-null pointer in the slot came from `Box::into_raw`
        // in `put`, and the swap took it out: no one else can take it.
        (!p.is_null()).then(|| unsafe { Box::from_raw(p) })
    }

    /// Keeps `stack` when the slot is empty; gives it back otherwise.
    fn put(&self, stack: Box<crate::stack::Stack>) -> Option<Box<crate::stack::Stack>> {
        let p = Box::into_raw(stack);
        match self.0.compare_exchange(
            std::ptr::null_mut(),
            p,
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(_) => None,
            // SAFETY: `p` came from `Box::into_raw` just above and was not
            // published (the exchange failed): it is still ours alone.
            Err(_) => Some(unsafe { Box::from_raw(p) }),
        }
    }
}

impl Drop for StackSlot {
    fn drop(&mut self) {
        drop(self.take());
    }
}

fn function_ref(
    module: &Arc<dyn Module>,
    state: &Arc<dyn ModuleState>,
    ordinal: u32,
) -> Result<FunctionRef> {
    let e = &module.exports()[ordinal as usize];
    let cconv = Cconv::parse(if e.signature.cconv.is_empty() {
        "0v_v"
    } else {
        &e.signature.cconv
    })
    .annotate(|| format!("export '{}.{}'", module.name(), e.name))?;
    Ok(FunctionRef::new(
        state.clone(),
        ordinal,
        Arc::new(cconv),
        format!("{}.{}", module.name(), e.name).into(),
    ))
}

impl Drop for Context {
    fn drop(&mut self) {
        while let Some(e) = self.entries.pop() {
            if let Some(ord) = e.module.lookup_export("__deinit") {
                if let Ok(f) = function_ref(&e.module, &e.state, ord) {
                    // Teardown cannot report failures; a failing __deinit
                    // must not keep the rest of the context alive.
                    let _ =
                        Invocation::begin(&f, Vec::new(), self.instance.options().max_stack_depth)
                            .and_then(|i| i.run());
                }
            }
            e.state.teardown();
        }
    }
}
