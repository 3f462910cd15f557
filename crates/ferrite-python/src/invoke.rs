//! `FunctionInvoker`: calls a VM function with Python values, in native code.
//!
//! Upstream marshals arguments in C++ too; doing it here keeps the per-call
//! cost of `module.add(a, b)` to one trip through Python. Arguments are
//! checked against the function's `iree.abi.declaration` (parsed once) before
//! the call, so a wrong rank, element type, dimension or kind is a ValueError
//! naming the argument instead of a failure deep inside the program. Numpy
//! inputs that are writable, C-contiguous and aligned as device buffers must
//! be are imported without a copy (as read-only buffers); others, and
//! `iree.abi.output` arguments, are copied, as upstream does.

use crate::declaration::{parse_arguments, ArgDecl, ArgType};
use crate::hal::{PyHalBufferView, PyHalDevice};
use crate::host_data::{HostArray, Placement};
use crate::status::{to_py_err, PyContext};
use crate::vm::{coerce, object_of, ref_of, PyVmContext, PyVmFunction};
use ferrite_base::{Status, StatusCode};
use ferrite_hal::allocator::{Allocator, BufferParams};
use ferrite_hal::buffer_view::{format_shape, BufferView};
use ferrite_hal::element_type::ElementType;
use ferrite_hal::memory::{BufferUsage, MemoryType};
use ferrite_hal_module::element_types_compatible;
use ferrite_vm::list::VmList;
use ferrite_vm::module::FunctionRef;
use ferrite_vm::types::TypeDef;
use ferrite_vm::{Ref, Variant};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyTuple, PyType};
use std::sync::{Arc, OnceLock};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFunctionInvoker>()
}

/// Python classes the invoker recognizes, looked up once per process.
struct Classes {
    device_array: Py<PyType>,
    np_generic: Py<PyType>,
    np_integer: Py<PyType>,
    np_floating: Py<PyType>,
    np_bool: Py<PyType>,
}

static CLASSES: GILOnceCell<Classes> = GILOnceCell::new();

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let np = py.import("numpy")?;
        let ty = |name: &str| -> PyResult<Py<PyType>> {
            Ok(np.getattr(name)?.downcast_into::<PyType>()?.unbind())
        };
        let device_array = py
            .import("ferrite.runtime.array_interop")?
            .getattr("DeviceArray")?
            .downcast_into::<PyType>()?
            .unbind();
        Ok(Classes {
            device_array,
            np_generic: ty("generic")?,
            np_integer: ty("integer")?,
            np_floating: ty("floating")?,
            np_bool: ty("bool_")?,
        })
    })
}

/// Memory type and usage of argument buffers (upstream's implicit transfer).
fn argument_params() -> BufferParams {
    BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT)
}

/// Calls `vm_function` in `vm_context`; numpy inputs go to `device`.
#[pyclass(name = "FunctionInvoker", module = "ferrite._ferrite", frozen)]
pub struct PyFunctionInvoker {
    context: Py<PyVmContext>,
    device: Py<PyHalDevice>,
    function: Py<PyVmFunction>,
    allocator: Arc<dyn Allocator>,
    /// Resolved at the first call (the context may gain modules until then).
    target: OnceLock<FunctionRef>,
    /// Declared arguments, when the function has a declaration we parse.
    declared: Option<Vec<ArgDecl>>,
}

#[pymethods]
impl PyFunctionInvoker {
    #[new]
    #[pyo3(signature = (vm_context, device, vm_function, tracer = None))]
    fn new(
        vm_context: Py<PyVmContext>,
        device: Py<PyHalDevice>,
        vm_function: Py<PyVmFunction>,
        tracer: Option<PyObject>,
    ) -> Self {
        let _ = tracer;
        let allocator = device.get().device.0.allocator();
        let declared = vm_function
            .get()
            .export()
            .signature
            .attrs
            .iter()
            .find(|(k, _)| k == "iree.abi.declaration")
            .and_then(|(_, v)| parse_arguments(v));
        PyFunctionInvoker {
            context: vm_context,
            device,
            function: vm_function,
            allocator,
            target: OnceLock::new(),
            declared,
        }
    }

    #[getter]
    fn vm_function(&self, py: Python<'_>) -> Py<PyVmFunction> {
        self.function.clone_ref(py)
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyObject> {
        if kwargs.is_some_and(|k| !k.is_empty()) {
            return Err(PyValueError::new_err(
                "kwargs not supported for dynamic dispatch functions",
            ));
        }
        let target = self.target()?;
        let arity = target.cconv.args.len();
        if args.len() != arity {
            return Err(to_py_err(
                "Error invoking function",
                &Status::new(
                    StatusCode::InvalidArgument,
                    format!(
                        "input list and function mismatch; expected {arity} arguments but passed {}",
                        args.len()
                    ),
                ),
            ));
        }
        let declared = self.declared.as_ref().filter(|d| d.len() == arity);
        let mut values = Vec::with_capacity(arity);
        for (i, arg) in args.iter().enumerate() {
            let decl = declared.map(|d| &d[i]);
            let name = decl.map_or_else(|| format!("input{i}"), |d| d.name.clone());
            values.push(self.variant(&arg, decl, &name)?);
        }
        let context = self.context.get();
        // The arguments' last references are dropped here, with the GIL held,
        // rather than in the VM: imported arrays need the GIL to be released.
        let _keep_alive: Vec<Variant> = values.clone();
        let results = py
            .allow_threads(|| {
                let args = values
                    .into_iter()
                    .zip(target.cconv.args.iter())
                    .enumerate()
                    .map(|(i, (v, t))| coerce(v, t, i))
                    .collect::<ferrite_base::Result<Vec<_>>>()?;
                context.context.read().invoke(target, args)
            })
            .py_context("Error invoking function")?;
        match results.len() {
            0 => Ok(py.None()),
            1 => self.to_python(py, results.into_iter().next().unwrap_or(Variant::Null)),
            _ => {
                let items = results
                    .into_iter()
                    .map(|r| self.to_python(py, r))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(PyTuple::new(py, items)?.into_any().unbind())
            }
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.function.bind(py).repr()?.to_string())
    }
}

impl PyFunctionInvoker {
    fn target(&self) -> PyResult<&FunctionRef> {
        if let Some(t) = self.target.get() {
            return Ok(t);
        }
        let f = self.function.get();
        let name = format!("{}.{}", f.module_name, f.export().name);
        let t = self
            .context
            .get()
            .context
            .read()
            .lookup_function(&name)
            .py_context("Error invoking function")?;
        Ok(self.target.get_or_init(|| t))
    }

    /// The VM value for one argument (`name` as declared, e.g. `input0`).
    fn variant(
        &self,
        obj: &Bound<'_, PyAny>,
        decl: Option<&ArgDecl>,
        name: &str,
    ) -> PyResult<Variant> {
        let py = obj.py();
        if let Ok(f) = obj.downcast_exact::<PyFloat>() {
            check_scalar(obj, decl, name, false)?;
            return Ok(Variant::F64(f.value()));
        }
        if obj.is_instance_of::<PyBool>() {
            // As upstream: a bool is not an integer argument.
            return Err(not_convertible(obj, name));
        }
        if obj.is_instance_of::<PyInt>() {
            check_scalar(obj, decl, name, true)?;
            return Ok(Variant::I64(obj.extract()?));
        }
        if let Ok(bv) = obj.downcast::<PyHalBufferView>() {
            return view_variant(&bv.get().view, decl, name);
        }
        let classes = classes(py)?;
        if obj.is_instance(classes.device_array.bind(py))? {
            let bv = obj.getattr(intern!(py, "_buffer_view"))?;
            let bv = bv.downcast::<PyHalBufferView>()?;
            return view_variant(&bv.get().view, decl, name);
        }
        if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
            let items: Vec<Bound<'_, PyAny>> = obj.try_iter()?.collect::<PyResult<_>>()?;
            return self.list_variant(obj, decl, name, items);
        }
        if let Ok(d) = obj.downcast::<PyDict>() {
            let mut keys: Vec<Bound<'_, PyAny>> = d.keys().iter().collect();
            let sorted = py
                .import("builtins")?
                .call_method1("sorted", (PyList::new(py, &keys)?,))?;
            keys = sorted.try_iter()?.collect::<PyResult<_>>()?;
            let items = keys
                .iter()
                .map(|k| d.as_any().get_item(k))
                .collect::<PyResult<Vec<_>>>()?;
            return self.list_variant(obj, decl, name, items);
        }
        if obj.is_instance(classes.np_generic.bind(py))? {
            if obj.is_instance(classes.np_bool.bind(py))? {
                // Refused as Python's bool is (upstream refuses both).
                return Err(not_convertible(obj, name));
            }
            if obj.is_instance(classes.np_integer.bind(py))? {
                check_scalar(obj, decl, name, true)?;
                return Ok(Variant::I64(obj.extract()?));
            }
            if obj.is_instance(classes.np_floating.bind(py))? {
                check_scalar(obj, decl, name, false)?;
                return Ok(Variant::F64(obj.extract()?));
            }
        }
        // SAFETY: `obj` is a live object and we hold the GIL; the call only
        // inspects its type's buffer slot.
        if unsafe { pyo3::ffi::PyObject_CheckBuffer(obj.as_ptr()) } != 0 {
            return self.array_variant(obj, decl, name);
        }
        if obj.hasattr(intern!(py, "__iree_vm_ref__"))? {
            if let Some(d) = decl.filter(|d| !matches!(d.ty, ArgType::Other)) {
                return Err(PyValueError::new_err(format!(
                    "{name} is declared {} but received {}",
                    d.text,
                    describe(obj)
                )));
            }
            return Ok(Variant::Ref(ref_of(obj)?));
        }
        // A CUDA tensor (PyTorch's, ...) is used in place through DLPack:
        // the CUDA device of its ordinal wraps its memory, any other device
        // refuses it with the reason (never a host copy through numpy,
        // which cannot read device memory).
        if crate::dlpack::is_cuda_tensor(obj) {
            let view = crate::dlpack::import(py, &self.device.get().device.0, obj)
                .map_err(|e| PyValueError::new_err(format!("{name}: {}", e.value(py))))?;
            return view_variant(&Arc::new(view), decl, name);
        }
        self.array_variant(obj, decl, name)
    }

    fn list_variant(
        &self,
        obj: &Bound<'_, PyAny>,
        decl: Option<&ArgDecl>,
        name: &str,
        items: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Variant> {
        if let Some(d) = decl.filter(|d| !matches!(d.ty, ArgType::Other)) {
            return Err(PyValueError::new_err(format!(
                "{name} is declared {} but received {}",
                d.text,
                describe(obj)
            )));
        }
        let capacity = u32::try_from(items.len()).unwrap_or(u32::MAX);
        let list = VmList::new(TypeDef::Any, capacity).py_context("Could not create list")?;
        for (j, item) in items.iter().enumerate() {
            let v = self.variant(item, None, &format!("{name}[{j}]"))?;
            list.push_variant(v).py_context("Could not push to list")?;
        }
        Ok(Variant::Ref(Ref::from_arc(Arc::new(list))))
    }

    /// A numpy array (or anything numpy can make one of) as a buffer view:
    /// the array's own memory when it can stand as a device buffer
    /// (writable, so programs that write their inputs in place write memory
    /// its owner allows writing; aligned as device buffers are) and the
    /// argument is not an `iree.abi.output` (which upstream copies and so
    /// never writes back); else a copy.
    fn array_variant(
        &self,
        obj: &Bound<'_, PyAny>,
        decl: Option<&ArgDecl>,
        name: &str,
    ) -> PyResult<Variant> {
        let array = HostArray::from_object(obj, name, || not_convertible(obj, name))?;
        if let Some(d) = decl {
            check_array(d, name, &array.shape, array.element_type, || describe(obj))?;
        }
        let placement = if decl.is_none_or(|d| !d.is_output) {
            Placement::ImportIfAligned
        } else {
            Placement::Copy
        };
        let view = array.into_view(&*self.allocator, &argument_params(), placement)?;
        Ok(Variant::Ref(Ref::from_arc(Arc::new(view))))
    }

    /// The Python value of a result: buffer views become DeviceArrays (their
    /// host copy made on use), lists Python lists.
    fn to_python(&self, py: Python<'_>, v: Variant) -> PyResult<PyObject> {
        Ok(match v {
            Variant::Null => py.None(),
            Variant::I32(x) => x.into_pyobject(py)?.into_any().unbind(),
            Variant::I64(x) => x.into_pyobject(py)?.into_any().unbind(),
            Variant::F32(x) => (x as f64).into_pyobject(py)?.into_any().unbind(),
            Variant::F64(x) => x.into_pyobject(py)?.into_any().unbind(),
            Variant::Ref(r) => {
                if let Some(view) = r.downcast_arc::<BufferView>() {
                    let bv = Py::new(py, PyHalBufferView { view })?;
                    let device = self.device.clone_ref(py);
                    classes(py)?.device_array.call1(py, (device, bv, true))?
                } else if let Some(list) = r.downcast_arc::<VmList>() {
                    let items = (0..list.size())
                        .map(|i| {
                            let v = list.get_variant(i).py_context("Could not access list")?;
                            self.to_python(py, v)
                        })
                        .collect::<PyResult<Vec<_>>>()?;
                    PyList::new(py, items)?.into_any().unbind()
                } else {
                    object_of(py, r)?
                }
            }
        })
    }
}

/// ValueError: `obj` has no VM form (upstream's words), shown bounded.
fn not_convertible(obj: &Bound<'_, PyAny>, name: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{name}: could not convert python value to VM: {}",
        bounded_repr(obj)
    ))
}

/// `obj` for an error message, bounded whatever its size: small values as
/// `repr` prints them, large ones (a 1000x16 list) as their nested lengths
/// and first few items (`ferrite.runtime._packing._shown`, the rule the
/// Python invoker follows too).
fn bounded_repr(obj: &Bound<'_, PyAny>) -> String {
    let py = obj.py();
    py.import("ferrite.runtime._packing")
        .and_then(|m| m.getattr("_shown"))
        .and_then(|f| f.call1((obj,)))
        .and_then(|s| s.extract::<String>())
        .unwrap_or_else(|_| format!("<{} object>", type_name(obj)))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// `ndarray((2, 2), float32)`, `int 3`, `list 1000x16 of float [[1.0, ...],
/// ...]`: what a message says was received, bounded whatever its size.
fn describe(obj: &Bound<'_, PyAny>) -> String {
    let py = obj.py();
    let shape = obj.getattr(intern!(py, "shape")).and_then(|s| s.str());
    let dtype = obj.getattr(intern!(py, "dtype")).and_then(|s| s.str());
    if let (Ok(shape), Ok(dtype)) = (shape, dtype) {
        if !obj.is_instance_of::<PyBool>() {
            return format!("ndarray({shape}, {dtype})");
        }
    }
    let ty = type_name(obj);
    let shown = bounded_repr(obj);
    // A large list already reads `list 1000x16 of float [[...], ...]`.
    if shown.starts_with(&format!("{ty} ")) {
        return shown;
    }
    format!("{ty} {shown}")
}

/// A scalar is fine for a scalar (or undeclared) argument, though a float
/// cannot stand for an integer.
fn check_scalar(
    obj: &Bound<'_, PyAny>,
    decl: Option<&ArgDecl>,
    name: &str,
    is_int: bool,
) -> PyResult<()> {
    let Some(d) = decl else { return Ok(()) };
    let ok = match d.ty {
        ArgType::Int => is_int,
        ArgType::Float | ArgType::Other => true,
        ArgType::Tensor { .. } => false,
    };
    if ok {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "{name} is declared {} but received {}",
        d.text,
        describe(obj)
    )))
}

/// Checks an array against its declaration, in the order and words of
/// `hal.buffer_view.assert` (element type, rank, then each static dimension).
fn check_array(
    d: &ArgDecl,
    name: &str,
    shape: &[u64],
    et: ElementType,
    received: impl Fn() -> String,
) -> PyResult<()> {
    let (dims, want_et) = match &d.ty {
        ArgType::Tensor { dims, element_type } => (dims, *element_type),
        ArgType::Other => return Ok(()),
        ArgType::Int | ArgType::Float => {
            return Err(PyValueError::new_err(format!(
                "{name} is declared {} but received {}",
                d.text,
                received()
            )))
        }
    };
    let declared = || format!(" ({name} is declared {})", d.text);
    let expected_shape = || {
        dims.iter()
            .map(|x| x.map_or_else(|| "?".to_string(), |v| v.to_string()))
            .collect::<Vec<_>>()
            .join("x")
    };
    let fail = |msg: String| {
        Err(to_py_err(
            "Error invoking function",
            &Status::new(StatusCode::InvalidArgument, msg + &declared()),
        ))
    };
    if let Some(want) = want_et {
        if !element_types_compatible(et, want) {
            return fail(format!(
                "{name} element type mismatch; expected {want} ({:08X}) but have {et} ({:08X})",
                want.0, et.0
            ));
        }
    }
    if dims.len() != shape.len() {
        return fail(format!(
            "{name} shape rank mismatch; expected {} but have {}; expected shape `{}`, actual shape `{}`",
            dims.len(),
            shape.len(),
            expected_shape(),
            format_shape(shape)
        ));
    }
    for (i, (want, have)) in dims.iter().zip(shape).enumerate() {
        if let Some(want) = want {
            if want != have {
                return fail(format!(
                    "{name} shape dimension {i} mismatch; expected {want} but have {have}; expected shape `{}`, actual shape `{}`",
                    expected_shape(),
                    format_shape(shape)
                ));
            }
        }
    }
    Ok(())
}

/// A buffer view argument, checked against its declaration.
fn view_variant(view: &Arc<BufferView>, decl: Option<&ArgDecl>, name: &str) -> PyResult<Variant> {
    if let Some(d) = decl {
        if let ArgType::Tensor { .. } = d.ty {
            let shape = view.shape().to_vec();
            let et = view.element_type();
            check_array(d, name, &shape, et, || "a buffer view".to_string())?;
        } else if !matches!(d.ty, ArgType::Other) {
            return Err(PyValueError::new_err(format!(
                "{name} is declared {} but received a buffer view",
                d.text
            )));
        }
    }
    Ok(Variant::Ref(Ref::from_arc(view.clone())))
}
