//! Contexts: an ordered set of module states with imports linked by name.

use crate::cconv::Cconv;
use crate::instance::Instance;
use crate::invocation::Invocation;
use crate::module::{FunctionRef, Module, ModuleState};
use crate::value::Variant;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result};
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
        let stack = self.spare_stacks.lock().pop();
        let mut stack = stack.unwrap_or_else(|| {
            Box::new(crate::stack::Stack::new(
                self.instance.options().max_stack_depth,
            ))
        });
        stack.set_trace(self.trace.clone());
        let mut invocation = Invocation::begin_on(function, args, stack)?;
        let result = invocation.run_to_end();
        let mut spare = self.spare_stacks.lock();
        if spare.len() < 4 {
            spare.push(invocation.into_stack());
        }
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
        let stack = self.spare_stacks.lock().pop();
        let mut stack = stack.unwrap_or_else(|| {
            Box::new(crate::stack::Stack::new(
                self.instance.options().max_stack_depth,
            ))
        });
        stack.set_trace(self.trace.clone());
        let mut owned = stack.spare_values.pop().unwrap_or_default();
        owned.extend(args.iter().cloned());
        let mut invocation = Invocation::begin_on(function, owned, stack)?;
        let outcome = invocation.run_to_end();
        let mut stack = invocation.into_stack();
        let result = match outcome {
            Ok(values) => {
                let old = std::mem::replace(results, values);
                stack.recycle_values(old);
                Ok(())
            }
            Err(e) => Err(e),
        };
        let mut spare = self.spare_stacks.lock();
        if spare.len() < 4 {
            spare.push(stack);
        }
        result
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
