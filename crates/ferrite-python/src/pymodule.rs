//! `PyModuleInterface`: VM modules whose functions are Python callables.
//!
//! Declared like upstream's: `PyModuleInterface(name, ctor)`, then
//! `export(name, cconv, callable)` per function, then `create()` freezes it
//! into a `VmModule`. Each context that registers the module calls
//! `ctor(iface)` once for its per-context state; an export is called as
//! `callable(state, *args)` with arguments unpacked per its calling
//! convention, and its return value packed the same way (a single result
//! as itself, several as a sequence). A Python exception fails the VM call
//! with the exception's type and text. Calls run synchronously (holding the
//! GIL) through the VM's native-frame protocol, like any Rust native module.

use crate::vm::{ref_of, PyVmModule, PyVmRef};
use ferrite_base::{bail, status, Result, Status, StatusCode};
use ferrite_vm::cconv::{Cconv, CconvType};
use ferrite_vm::module::{Dependency, ExportInfo, FunctionRef, ImportInfo, ModuleState, Signature};
use ferrite_vm::stack::{NativeCall, NativePoll, NativeStep, Stack};
use ferrite_vm::{Instance, Module, Variant};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PySequence, PyTuple};
use std::sync::{Arc, Weak};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyModuleInterface>()?;
    Ok(())
}

/// One exported Python function.
struct PyExport {
    /// `module.function`, for messages and backtraces.
    full_name: String,
    cconv: Cconv,
    callable: PyObject,
}

/// Builder of a Python-defined module; frozen by `create()`.
#[pyclass(name = "PyModuleInterface", module = "ferrite._ferrite")]
pub struct PyModuleInterface {
    name: String,
    ctor: PyObject,
    exports: Vec<ExportInfo>,
    functions: Vec<Arc<PyExport>>,
    /// The module `create()` made; dead once every user released it.
    created: Option<Weak<PyNativeModule>>,
}

#[pymethods]
impl PyModuleInterface {
    #[new]
    fn new(module_name: String, ctor: PyObject) -> Self {
        PyModuleInterface {
            name: module_name,
            ctor,
            exports: Vec::new(),
            functions: Vec::new(),
            created: None,
        }
    }

    /// Adds an export: `callable(state, *args)` with calling convention
    /// `cconv` (`0ii_i`; variadic spans are not supported).
    fn export(&mut self, name: String, cconv: String, callable: PyObject) -> PyResult<()> {
        if self.created.is_some() {
            return Err(PyRuntimeError::new_err(
                "Attempt to mutate a frozen PyModuleInterface",
            ));
        }
        if self.exports.iter().any(|e| e.name == name) {
            return Err(PyValueError::new_err(format!(
                "PyModule function already defined: {name}"
            )));
        }
        // Upstream accepts a cconv without results (`0ii`); spell it out so
        // that it links against importers' `0ii_v`.
        let cconv = if cconv.contains('_') {
            cconv
        } else {
            format!("{cconv}_v")
        };
        let parsed = Cconv::parse(&cconv)
            .map_err(|s| crate::status::to_py_err("Unparsable calling convention", &s))?;
        if parsed.is_variadic()
            || parsed
                .results
                .iter()
                .any(|t| matches!(t, CconvType::Span(_)))
        {
            return Err(PyValueError::new_err(format!(
                "Unparsable calling convention: INVALID_ARGUMENT; '{cconv}' of '{name}': \
                 PyModules do not support variadic arguments or results"
            )));
        }
        self.functions.push(Arc::new(PyExport {
            full_name: format!("{}.{name}", self.name),
            cconv: parsed,
            callable,
        }));
        self.exports.push(ExportInfo {
            name,
            signature: Signature::new(cconv),
        });
        Ok(())
    }

    /// Freezes the interface into a module (once).
    fn create(slf: Bound<'_, Self>) -> PyResult<PyVmModule> {
        let iface = slf.clone().unbind();
        let mut this = slf.borrow_mut();
        if this.created.is_some() {
            return Err(PyRuntimeError::new_err(
                "Attempt to mutate a frozen PyModuleInterface",
            ));
        }
        let module = Arc::new(PyNativeModule {
            name: this.name.clone(),
            iface: iface.into_any(),
            ctor: this.ctor.clone_ref(slf.py()),
            exports: this.exports.clone(),
            functions: this.functions.clone(),
        });
        this.created = Some(Arc::downgrade(&module));
        Ok(PyVmModule::new(module))
    }

    /// True once `create()` has been called.
    #[getter]
    fn initialized(&self) -> bool {
        self.created.is_some()
    }

    /// True once the created module has been released by every user.
    #[getter]
    fn destroyed(&self) -> bool {
        self.created.as_ref().is_some_and(|w| w.strong_count() == 0)
    }

    fn __str__(&self) -> String {
        let state = match (self.initialized(), self.destroyed()) {
            (false, _) => "",
            (true, false) => " initialized",
            (true, true) => " destroyed",
        };
        format!("<ferrite.runtime.PyModuleInterface '{}'{state}>", self.name)
    }

    fn __repr__(&self) -> String {
        self.__str__()
    }
}

/// The frozen module.
struct PyNativeModule {
    name: String,
    /// The `PyModuleInterface` object, passed to `ctor`.
    iface: PyObject,
    ctor: PyObject,
    exports: Vec<ExportInfo>,
    functions: Vec<Arc<PyExport>>,
}

/// The Python error's type and text, as a VM failure. The exception
/// itself is kept (see [`crate::status::stash_python_cause`]) and becomes
/// the `__cause__` of the `RuntimeError` the caller sees.
fn python_failure(py: Python<'_>, what: &str, e: &PyErr) -> Status {
    crate::status::stash_python_cause(e.clone_ref(py));
    let kind = e
        .get_type(py)
        .qualname()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".to_string());
    Status::new(
        StatusCode::Unknown,
        format!("{what}: {kind}: {}", e.value(py)),
    )
}

impl Module for PyNativeModule {
    fn name(&self) -> &str {
        &self.name
    }
    fn version(&self) -> u32 {
        0
    }
    fn dependencies(&self) -> &[Dependency] {
        &[]
    }
    fn imports(&self) -> &[ImportInfo] {
        &[]
    }
    fn exports(&self) -> &[ExportInfo] {
        &self.exports
    }
    fn create_state(self: Arc<Self>, _instance: &Instance) -> Result<Arc<dyn ModuleState>> {
        let state = Python::with_gil(|py| {
            self.ctor
                .call1(py, (self.iface.clone_ref(py),))
                .map_err(|e| python_failure(py, "Exception in call to PyModule constructor", &e))
        })?;
        let calls = Python::with_gil(|py| {
            self.functions
                .iter()
                .map(|f| {
                    Arc::new(BoundExport {
                        export: f.clone(),
                        state: state.clone_ref(py),
                    }) as Arc<dyn NativeStep>
                })
                .collect()
        });
        Ok(Arc::new(PyModuleState {
            module: self,
            calls,
        }))
    }
}

/// Per-context state: the ctor's object, bound into each export.
struct PyModuleState {
    module: Arc<PyNativeModule>,
    calls: Vec<Arc<dyn NativeStep>>,
}

impl ModuleState for PyModuleState {
    fn module(&self) -> Arc<dyn Module> {
        self.module.clone()
    }

    fn resolve_import(&self, ordinal: usize, _target: Option<FunctionRef>) -> Result<()> {
        bail!(
            Unimplemented,
            "Python module '{}' has no imports (asked to resolve import {ordinal})",
            self.module.name
        )
    }

    fn begin_call(
        self: Arc<Self>,
        stack: &mut Stack,
        ordinal: u32,
        args: Vec<Variant>,
    ) -> Result<()> {
        let call = self.calls.get(ordinal as usize).ok_or_else(|| {
            status!(
                InvalidArgument,
                "function ordinal out of bounds: {ordinal} >= {} in Python module '{}'",
                self.calls.len(),
                self.module.name
            )
        })?;
        stack.push_native(call.clone(), args)
    }
}

/// An export bound to one context's state object.
struct BoundExport {
    export: Arc<PyExport>,
    state: PyObject,
}

fn to_python(py: Python<'_>, v: &Variant) -> PyResult<PyObject> {
    Ok(match v {
        Variant::I32(x) => x.into_pyobject(py)?.into_any().unbind(),
        Variant::I64(x) => x.into_pyobject(py)?.into_any().unbind(),
        Variant::F32(x) => (*x as f64).into_pyobject(py)?.into_any().unbind(),
        Variant::F64(x) => x.into_pyobject(py)?.into_any().unbind(),
        Variant::Ref(r) => Py::new(py, PyVmRef(r.clone()))?.into_any(),
        _ => py.None(),
    })
}

fn from_python(value: &Bound<'_, PyAny>, ty: &CconvType, index: usize) -> Result<Variant> {
    let bad = |e: PyErr| {
        status!(
            InvalidArgument,
            "result {index}: expected {}, the Python function returned {} ({e})",
            type_name(ty),
            value
                .get_type()
                .qualname()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )
    };
    Ok(match ty {
        CconvType::I32 => Variant::I32(value.extract().map_err(bad)?),
        CconvType::I64 => Variant::I64(value.extract().map_err(bad)?),
        CconvType::F32 => Variant::F32(value.extract::<f64>().map_err(bad)? as f32),
        CconvType::F64 => Variant::F64(value.extract().map_err(bad)?),
        CconvType::Ref => {
            if value.is_none() {
                bail!(
                    FailedPrecondition,
                    "expected ref returned from Python function but got None"
                );
            }
            Variant::Ref(ref_of(value).map_err(bad)?)
        }
        CconvType::Span(_) => bail!(Unimplemented, "variadic results are not supported"),
    })
}

fn type_name(ty: &CconvType) -> &'static str {
    match ty {
        CconvType::I32 => "i32",
        CconvType::I64 => "i64",
        CconvType::F32 => "f32",
        CconvType::F64 => "f64",
        CconvType::Ref => "a ref (VmRef or an object with __iree_vm_ref__)",
        CconvType::Span(_) => "a variadic span",
    }
}

impl NativeStep for BoundExport {
    fn step(&self, call: &mut NativeCall) -> Result<NativePoll> {
        let cconv = &self.export.cconv;
        let values = call.arg_values();
        if values.len() != cconv.args.len() {
            bail!(
                InvalidArgument,
                "{} takes {} arguments, received {}",
                self.export.full_name,
                cconv.args.len(),
                values.len()
            );
        }
        Python::with_gil(|py| {
            let mut args = Vec::with_capacity(values.len() + 1);
            args.push(self.state.clone_ref(py));
            for v in &values {
                args.push(to_python(py, v).map_err(|e| {
                    python_failure(py, "Converting an argument for a Python module", &e)
                })?);
            }
            let args = PyTuple::new(py, args)
                .map_err(|e| python_failure(py, "Packing Python module arguments", &e))?;
            let returned = self
                .export
                .callable
                .bind(py)
                .call1(args)
                .map_err(|e| python_failure(py, "Exception raised from Python module", &e))?;
            let results = match cconv.results.as_slice() {
                [] => Vec::new(),
                [one] => vec![from_python(&returned, one, 0)?],
                many => {
                    let seq = returned.downcast::<PySequence>().map_err(|_| {
                        status!(
                            InvalidArgument,
                            "{} must return a sequence of {} results",
                            self.export.full_name,
                            many.len()
                        )
                    })?;
                    let n = seq.len().unwrap_or(0);
                    if n != many.len() {
                        bail!(
                            InvalidArgument,
                            "{} returned {n} results, its calling convention declares {}",
                            self.export.full_name,
                            many.len()
                        );
                    }
                    many.iter()
                        .enumerate()
                        .map(|(i, t)| {
                            let item = seq.get_item(i).map_err(|e| {
                                python_failure(py, "Reading a Python module result", &e)
                            })?;
                            from_python(&item, t, i)
                        })
                        .collect::<Result<Vec<_>>>()?
                }
            };
            Ok(NativePoll::Ready(results))
        })
    }

    fn name(&self) -> &str {
        &self.export.full_name
    }
}
