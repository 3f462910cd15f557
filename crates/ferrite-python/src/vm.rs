//! VM objects: `VmInstance`, `VmModule`, `VmFunction`, `VmContext`,
//! `VmVariantList`, `VmRef`, `VmBuffer`.

use crate::hal::{PyHalBuffer, PyHalBufferView};
use crate::host_buffer::{fill_byte_view, HostBuffer};
use crate::status::PyContext;
use ferrite_base::{Status, StatusCode};
use ferrite_vm::buffer::{HostExport, VmBuffer};
use ferrite_vm::cconv::CconvType;
use ferrite_vm::list::VmList;
use ferrite_vm::types::TypeDef;
use ferrite_vm::{BytecodeModule, Context, Instance, Module, ModuleBytes, Ref, Variant};
use parking_lot::RwLock;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVmInstance>()?;
    m.add_class::<PyVmModule>()?;
    m.add_class::<PyVmFunction>()?;
    m.add_class::<PyVmContext>()?;
    m.add_class::<PyVmVariantList>()?;
    m.add_class::<PyVmRef>()?;
    m.add_class::<PyVmBuffer>()?;
    Ok(())
}

/// A VM instance: owns the type registry its modules resolve names in.
#[pyclass(name = "VmInstance", module = "ferrite._ferrite", frozen)]
pub struct PyVmInstance {
    pub instance: Instance,
}

#[pymethods]
impl PyVmInstance {
    #[new]
    fn new() -> Self {
        let instance = Instance::default();
        ferrite_hal_module::register_types(instance.types());
        PyVmInstance { instance }
    }
}

/// Linkage values as upstream numbers them.
pub const LINKAGE_EXPORT: u32 = 2;

/// A loaded module (bytecode or native).
#[pyclass(name = "VmModule", module = "ferrite._ferrite", frozen)]
pub struct PyVmModule {
    pub module: Arc<dyn Module>,
    destroy_callback: Option<PyObject>,
    /// The `.vmfb` bytes a bytecode module was loaded from.
    blob: Option<ModuleBytes>,
}

impl PyVmModule {
    pub fn new(module: Arc<dyn Module>) -> Self {
        PyVmModule {
            module,
            destroy_callback: None,
            blob: None,
        }
    }

    fn load(
        instance: &PyVmInstance,
        bytes: ModuleBytes,
        destroy_callback: Option<PyObject>,
    ) -> PyResult<Self> {
        let module = BytecodeModule::load(&instance.instance, bytes.clone())
            .py_context("Error creating vm module from aligned memory")?;
        Ok(PyVmModule {
            module,
            destroy_callback,
            blob: Some(bytes),
        })
    }

    fn copy_of(obj: &Bound<'_, PyAny>) -> PyResult<ModuleBytes> {
        let host = HostBuffer::get(obj)?;
        Ok(ModuleBytes::from_vec(host.to_vec()?))
    }

    /// The address of `obj`'s bytes when it does not meet
    /// [`MODULE_BUFFER_ALIGNMENT`], None when it does.
    fn misaligned_address(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        let host = HostBuffer::get(obj)?;
        let address = host.raw_parts()?.0 as usize;
        Ok((!address.is_multiple_of(MODULE_BUFFER_ALIGNMENT)).then_some(address))
    }

    /// Loads from a caller's buffer the way upstream's `from_buffer` does:
    /// an aligned buffer is taken as is, an unaligned one is copied, with a
    /// `UserWarning` unless `warn_if_copy` is false.
    fn from_any_buffer(
        instance: &PyVmInstance,
        buffer: &Bound<'_, PyAny>,
        warn_if_copy: bool,
    ) -> PyResult<Self> {
        if warn_if_copy && Self::misaligned_address(buffer)?.is_some() {
            let py = buffer.py();
            PyErr::warn(
                py,
                py.get_type::<pyo3::exceptions::PyUserWarning>().as_any(),
                UNALIGNED_COPY_WARNING,
                1,
            )?;
        }
        Self::load(instance, Self::copy_of(buffer)?, None)
    }
}

/// Alignment upstream requires of a module buffer it wraps without copying
/// (its heap buffer alignment); kept so the same inputs are accepted.
const MODULE_BUFFER_ALIGNMENT: usize = 64;

/// Warning `from_buffer` gives when it has to copy an unaligned buffer.
const UNALIGNED_COPY_WARNING: &std::ffi::CStr = c"Making copy of unaligned VmModule buffer. \
It is recommended to make this deterministic by calling `copy_buffer` to always make a copy \
or `mmap` to efficiently load from a file. This warning can be silenced by adding \
`warn_if_copy=False` to `from_buffer`";

impl Drop for PyVmModule {
    fn drop(&mut self) {
        if let Some(cb) = self.destroy_callback.take() {
            Python::with_gil(|py| {
                if let Err(e) = cb.call0(py) {
                    e.write_unraisable(py, None);
                }
            });
        }
    }
}

#[pymethods]
impl PyVmModule {
    /// Resolves a module a program depends on by name from the modules this
    /// runtime can create without configuration. Every built-in module
    /// needs some (`hal` a device, `io_parameters` its providers: use
    /// `create_hal_module` / `create_io_parameters_module`), so this is
    /// NOT_FOUND for every name, as upstream's Python build answers.
    #[staticmethod]
    #[pyo3(signature = (instance, name, minimum_version = 0))]
    fn resolve_module_dependency(
        instance: &PyVmInstance,
        name: &str,
        minimum_version: u32,
    ) -> PyResult<PyVmModule> {
        let _ = (instance, minimum_version);
        let hint = match name {
            "hal" => " (create it with create_hal_module(instance, device))",
            "io_parameters" => {
                " (create it with create_io_parameters_module(instance, *providers))"
            }
            _ => "",
        };
        Err(PyValueError::new_err(format!(
            "Error resolving module dependency: NOT_FOUND; required module '{name}' not \
             available without configuration{hint}"
        )))
    }

    #[staticmethod]
    #[pyo3(signature = (instance, buffer, warn_if_copy = true))]
    fn from_flatbuffer(
        instance: &PyVmInstance,
        buffer: &Bound<'_, PyAny>,
        warn_if_copy: bool,
    ) -> PyResult<Self> {
        Self::from_any_buffer(instance, buffer, warn_if_copy)
    }

    #[staticmethod]
    #[pyo3(signature = (instance, buffer, warn_if_copy = true))]
    fn from_buffer(
        instance: &PyVmInstance,
        buffer: &Bound<'_, PyAny>,
        warn_if_copy: bool,
    ) -> PyResult<Self> {
        Self::from_any_buffer(instance, buffer, warn_if_copy)
    }

    #[staticmethod]
    fn copy_buffer(instance: &PyVmInstance, buffer: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::load(instance, Self::copy_of(buffer)?, None)
    }

    #[staticmethod]
    #[pyo3(signature = (instance, buffer, destroy_callback = None, close_buffer = false))]
    fn wrap_buffer(
        instance: &PyVmInstance,
        buffer: &Bound<'_, PyAny>,
        destroy_callback: Option<PyObject>,
        close_buffer: bool,
    ) -> PyResult<Self> {
        // Upstream wraps without copying and so refuses unaligned memory;
        // refusing the same inputs keeps code written against it portable.
        if let Some(address) = Self::misaligned_address(buffer)? {
            return Err(PyValueError::new_err(format!(
                "VmModule.from_aligned_memory received an unaligned buffer. \
                 Got {address:#x}, expected alignment {MODULE_BUFFER_ALIGNMENT}"
            )));
        }
        let bytes = Self::copy_of(buffer)?;
        if close_buffer {
            buffer.call_method0("close")?;
        }
        Self::load(instance, bytes, destroy_callback)
    }

    #[staticmethod]
    #[pyo3(signature = (instance, filepath, destroy_callback = None))]
    fn mmap(
        py: Python<'_>,
        instance: &PyVmInstance,
        filepath: std::path::PathBuf,
        destroy_callback: Option<PyObject>,
    ) -> PyResult<Self> {
        // A file that cannot be opened raises the `OSError` subclass
        // Python's own `open` raises (`FileNotFoundError`, ...), as upstream.
        crate::args::check_readable_file(py, &filepath)?;
        let bytes = ModuleBytes::map_file(&filepath)
            .py_context(&format!("Error mapping file '{}'", filepath.display()))?;
        Self::load(instance, bytes, destroy_callback)
    }

    #[getter]
    fn name(&self) -> String {
        self.module.name().to_string()
    }

    /// The `.vmfb` a bytecode module was loaded from (None for native modules).
    #[getter]
    fn stashed_flatbuffer_blob<'py>(
        &self,
        py: Python<'py>,
    ) -> Option<Bound<'py, pyo3::types::PyBytes>> {
        self.blob
            .as_ref()
            .map(|b| pyo3::types::PyBytes::new(py, b.as_slice()))
    }

    #[getter]
    fn version(&self) -> u32 {
        self.module.version()
    }

    #[getter]
    fn function_names(&self) -> Vec<String> {
        self.module
            .exports()
            .iter()
            .map(|e| e.name.clone())
            .collect()
    }

    #[pyo3(signature = (name, linkage = None))]
    fn lookup_function(
        &self,
        name: &str,
        linkage: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<PyVmFunction>> {
        let linkage: u32 = linkage.map(int_of).transpose()?.unwrap_or(LINKAGE_EXPORT);
        if name.is_empty() {
            // As upstream (whatever the linkage): ValueError, not None.
            return Err(Status::new(
                StatusCode::InvalidArgument,
                "function name required for query",
            ))
            .py_context("Error looking up function");
        }
        if linkage != LINKAGE_EXPORT {
            return Ok(None);
        }
        Ok(self
            .module
            .lookup_export(name)
            .map(|ordinal| PyVmFunction::new(&self.module, ordinal)))
    }

    fn __repr__(&self) -> String {
        format!(
            "<VmModule {} : [{}]>",
            self.module.name(),
            self.function_names().join(", ")
        )
    }
}

/// Reads an int or an object with `__index__`/`value` (our enums).
pub fn int_of<T: for<'a> FromPyObject<'a>>(obj: &Bound<'_, PyAny>) -> PyResult<T> {
    match obj.extract::<T>() {
        Ok(v) => Ok(v),
        Err(e) => match obj.getattr("value") {
            Ok(v) => v.extract::<T>(),
            Err(_) => Err(e),
        },
    }
}

/// An exported function of a module.
#[pyclass(name = "VmFunction", module = "ferrite._ferrite", frozen)]
pub struct PyVmFunction {
    /// The module's name and the export, copied: as upstream's, a function
    /// does not keep its module alive (a context that has the module calls
    /// it, resolving it by name), so the module is released, and a
    /// `PyModuleInterface` reports `destroyed`, when its contexts and
    /// `VmModule` go.
    pub module_name: String,
    export: ferrite_vm::module::ExportInfo,
    pub ordinal: u32,
}

impl PyVmFunction {
    fn new(module: &Arc<dyn Module>, ordinal: u32) -> Self {
        PyVmFunction {
            module_name: module.name().to_string(),
            export: module.exports()[ordinal as usize].clone(),
            ordinal,
        }
    }

    pub(crate) fn export(&self) -> &ferrite_vm::module::ExportInfo {
        &self.export
    }
}

#[pymethods]
impl PyVmFunction {
    #[getter]
    fn name(&self) -> String {
        self.export().name.clone()
    }

    #[getter]
    fn module_name(&self) -> String {
        self.module_name.clone()
    }

    #[getter]
    fn ordinal(&self) -> u32 {
        self.ordinal
    }

    #[getter]
    fn linkage(&self) -> u32 {
        LINKAGE_EXPORT
    }

    #[getter]
    fn reflection<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.export().signature.attrs {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let e = self.export();
        let reflection = self.reflection(py)?.repr()?.to_string();
        Ok(format!(
            "<VmFunction {}({}), reflection = {}>",
            e.name, e.signature.cconv, reflection
        ))
    }
}

static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A context: modules linked together, with per-context state.
#[pyclass(name = "VmContext", module = "ferrite._ferrite", frozen)]
pub struct PyVmContext {
    pub(crate) context: RwLock<Context>,
    id: u64,
    /// Made with a non-empty module list: as upstream's static contexts,
    /// it refuses `register_modules` afterwards.
    is_static: bool,
}

#[pymethods]
impl PyVmContext {
    #[new]
    #[pyo3(signature = (instance, modules = None))]
    fn new(instance: &PyVmInstance, modules: Option<Vec<PyRef<'_, PyVmModule>>>) -> PyResult<Self> {
        let is_static = modules.as_ref().is_some_and(|m| !m.is_empty());
        let modules: Vec<Arc<dyn Module>> = modules
            .unwrap_or_default()
            .iter()
            .map(|m| m.module.clone())
            .collect();
        let context = Context::with_modules(&instance.instance, &modules)
            .py_context("Error creating context")?;
        Ok(PyVmContext {
            context: RwLock::new(context),
            id: NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed),
            is_static,
        })
    }

    #[getter]
    fn context_id(&self) -> u64 {
        self.id
    }

    fn register_modules(
        &self,
        py: Python<'_>,
        modules: Vec<PyRef<'_, PyVmModule>>,
    ) -> PyResult<()> {
        if self.is_static {
            // Upstream's words and exception class (RuntimeError).
            return Err(Status::new(
                StatusCode::FailedPrecondition,
                "context was allocated as static and cannot register modules after creation",
            ))
            .py_context("Error registering modules");
        }
        let modules: Vec<Arc<dyn Module>> = modules.iter().map(|m| m.module.clone()).collect();
        py.allow_threads(|| {
            let mut ctx = self.context.write();
            for m in modules {
                ctx.register(m)?;
            }
            Ok::<_, Status>(())
        })
        .py_context("Error registering modules")
    }

    fn invoke(
        &self,
        py: Python<'_>,
        function: &PyVmFunction,
        inputs: &PyVmVariantList,
        outputs: &PyVmVariantList,
    ) -> PyResult<()> {
        let name = format!("{}.{}", function.module_name, function.export().name);
        let args = (0..inputs.list.size())
            .map(|i| inputs.list.get_variant(i))
            .collect::<ferrite_base::Result<Vec<_>>>()
            .py_context("Error invoking function")?;
        let results = py
            .allow_threads(|| {
                let ctx = self.context.read();
                let f = ctx.lookup_function(&name)?;
                if args.len() != f.cconv.args.len() {
                    return Err(Status::new(
                        StatusCode::InvalidArgument,
                        format!(
                            "input list and function mismatch; expected {} arguments but passed {}",
                            f.cconv.args.len(),
                            args.len()
                        ),
                    ));
                }
                let args = args
                    .into_iter()
                    .zip(f.cconv.args.iter())
                    .enumerate()
                    .map(|(i, (v, t))| coerce(v, t, i))
                    .collect::<ferrite_base::Result<Vec<_>>>()?;
                ctx.invoke(&f, args)
            })
            .py_context("Error invoking function")?;
        // As upstream, the results replace what the list held (a failed call
        // leaves it as it was).
        outputs.list.clear();
        for r in results {
            outputs
                .list
                .push_variant(r)
                .py_context("Error invoking function")?;
        }
        Ok(())
    }
}

/// Converts a list variant to what the calling convention expects (lists
/// built from Python hold i64/f64; functions may take i32/f32).
pub(crate) fn coerce(v: Variant, ty: &CconvType, index: usize) -> ferrite_base::Result<Variant> {
    Ok(match (v, ty) {
        (Variant::I64(x), CconvType::I32) => Variant::I32(x as i32),
        (Variant::I32(x), CconvType::I64) => Variant::I64(x as i64),
        (Variant::F64(x), CconvType::F32) => Variant::F32(x as f32),
        (Variant::F32(x), CconvType::F64) => Variant::F64(x as f64),
        (Variant::I32(x), CconvType::F32) => Variant::F32(x as f32),
        (Variant::I64(x), CconvType::F32) => Variant::F32(x as f32),
        (Variant::I32(x), CconvType::F64) => Variant::F64(x as f64),
        (Variant::I64(x), CconvType::F64) => Variant::F64(x as f64),
        (v @ Variant::Ref(_), CconvType::Ref) | (v @ Variant::Null, CconvType::Ref) => v,
        (v @ Variant::I32(_), CconvType::I32)
        | (v @ Variant::I64(_), CconvType::I64)
        | (v @ Variant::F32(_), CconvType::F32)
        | (v @ Variant::F64(_), CconvType::F64) => v,
        (v, t) => {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                format!(
                    "argument {index} is {} but the function expects {t:?}",
                    v.kind_name()
                ),
            ))
        }
    })
}

fn serialized_trace_value(py: Python<'_>, v: Variant) -> PyResult<PyObject> {
    let record = PyDict::new(py);
    match v {
        Variant::Null => record.set_item("type", "null")?,
        Variant::I32(x) => record.set_item("i32", x)?,
        Variant::I64(x) => record.set_item("i64", x)?,
        Variant::F32(x) => record.set_item("f32", x)?,
        Variant::F64(x) => record.set_item("f64", x)?,
        Variant::Ref(r) => {
            if let Some(list) = r.downcast::<VmList>() {
                record.set_item("type", "vm.list")?;
                let mut items = Vec::with_capacity(list.size() as usize);
                for i in 0..list.size() {
                    let item = list.get_variant(i).py_context(LIST_ACCESS)?;
                    items.push(serialized_trace_value(py, item)?);
                }
                record.set_item("items", items)?;
            } else if let Some(view) = r.downcast::<ferrite_hal::buffer_view::BufferView>() {
                record.set_item("type", "hal.buffer_view")?;
                record.set_item("shape", view.shape().to_vec())?;
                record.set_item("element_type", view.element_type().to_string())?;
                let bytes = view.buffer().to_vec().py_context("Could not map memory")?;
                record.set_item("contents", pyo3::types::PyBytes::new(py, &bytes))?;
            } else {
                return Err(PyValueError::new_err(
                    "Unsupported VM to Python Type Conversion",
                ));
            }
        }
    }
    if !record.contains("type")? {
        record.set_item("type", "value")?;
    }
    Ok(record.into_any().unbind())
}

/// A list of variants (`!vm.list<?>`).
#[pyclass(name = "VmVariantList", module = "ferrite._ferrite", frozen)]
pub struct PyVmVariantList {
    pub list: Arc<VmList>,
}

const LIST_ACCESS: &str = "Could not access list element";

impl PyVmVariantList {
    fn variant(&self, index: usize) -> PyResult<Variant> {
        let i = u32::try_from(index).unwrap_or(u32::MAX);
        self.list.get_variant(i).py_context(LIST_ACCESS)
    }

    fn ref_at(&self, index: usize) -> PyResult<Ref> {
        match self.variant(index)? {
            Variant::Ref(r) => Ok(r),
            _ => Err(PyValueError::new_err("list element is not a ref")),
        }
    }

    fn push(&self, v: Variant) -> PyResult<()> {
        self.list
            .push_variant(v)
            .py_context("Could not push to list")
    }
}

#[pymethods]
impl PyVmVariantList {
    #[new]
    fn new(capacity: &Bound<'_, PyAny>) -> PyResult<Self> {
        let capacity: u32 = crate::args::uint(capacity, "VmVariantList capacity")?;
        let list = VmList::new(TypeDef::Any, capacity).py_context("Could not create list")?;
        Ok(PyVmVariantList {
            list: Arc::new(list),
        })
    }

    #[getter]
    fn size(&self) -> u32 {
        self.list.size()
    }

    fn __len__(&self) -> usize {
        self.list.size() as usize
    }

    #[getter]
    fn r#ref(&self) -> PyVmRef {
        PyVmRef(Ref::from_arc(self.list.clone()))
    }

    #[getter]
    fn __iree_vm_ref__(&self) -> PyVmRef {
        self.r#ref()
    }

    /// Lists are equal when they are the same VM list (as upstream compares
    /// the wrapped pointer), so a list and its ref's cast compare equal.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match ref_of(other) {
            Ok(r) => r
                .downcast::<VmList>()
                .is_some_and(|l| std::ptr::eq(l, &*self.list)),
            Err(_) => false,
        }
    }

    fn __hash__(&self) -> u64 {
        Arc::as_ptr(&self.list) as usize as u64
    }

    /// The list a VM ref holds; ValueError when it holds something else.
    #[staticmethod]
    fn __iree_vm_cast__(py: Python<'_>, r#ref: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        vm_cast(py, r#ref, &py.get_type::<PyVmVariantList>())
    }

    fn push_int(&self, value: i64) -> PyResult<()> {
        self.push(Variant::I64(value))
    }

    fn push_float(&self, value: f64) -> PyResult<()> {
        self.push(Variant::F64(value))
    }

    fn push_list(&self, value: &PyVmVariantList) -> PyResult<()> {
        self.push(Variant::Ref(Ref::from_arc(value.list.clone())))
    }

    fn push_ref(&self, r#ref: &Bound<'_, PyAny>) -> PyResult<()> {
        let r = ref_of(r#ref)?;
        self.push(Variant::Ref(r))
    }

    fn get_variant(&self, py: Python<'_>, index: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        let index = crate::args::list_index(index, self.list.size())?;
        Ok(match self.variant(index)? {
            Variant::Null => py.None(),
            Variant::I32(v) => v.into_pyobject(py)?.into_any().unbind(),
            Variant::I64(v) => v.into_pyobject(py)?.into_any().unbind(),
            Variant::F32(v) => (v as f64).into_pyobject(py)?.into_any().unbind(),
            Variant::F64(v) => v.into_pyobject(py)?.into_any().unbind(),
            Variant::Ref(r) => object_of(py, r)?,
        })
    }

    /// Element `index` as a trace record (a dict): `{"type": "value", "i64":
    /// v}` (or `i32`/`f32`/`f64`), `{"type": "null"}`, `{"type": "vm.list",
    /// "items": [...]}`, or `{"type": "hal.buffer_view", "shape", "element_type",
    /// "contents"}`; ValueError for other refs.
    fn get_serialized_trace_value(&self, py: Python<'_>, index: usize) -> PyResult<PyObject> {
        serialized_trace_value(py, self.variant(index)?)
    }

    fn get_as_ref(&self, index: usize) -> PyResult<PyVmRef> {
        Ok(PyVmRef(self.ref_at(index)?))
    }

    fn get_as_list(&self, index: usize) -> PyResult<PyVmVariantList> {
        let r = self.ref_at(index)?;
        match r.downcast_arc::<VmList>() {
            Some(list) => Ok(PyVmVariantList { list }),
            None => Err(PyValueError::new_err(format!(
                "list element {index} is a {}, not a list",
                r.type_name()
            ))),
        }
    }

    #[pyo3(signature = (index, clazz = None))]
    fn get_as_object(
        &self,
        py: Python<'_>,
        index: usize,
        clazz: Option<&Bound<'_, PyType>>,
    ) -> PyResult<PyObject> {
        let r = self.ref_at(index)?;
        match clazz {
            None => object_of(py, r),
            Some(c) => deref_as(py, &r, c)?.ok_or_else(|| {
                PyValueError::new_err(format!(
                    "Cannot cast VM ref of type {} to {}",
                    r.type_name(),
                    c.name().map(|n| n.to_string()).unwrap_or_default()
                ))
            }),
        }
    }

    fn __repr__(&self) -> String {
        self.__str__()
    }

    fn __str__(&self) -> String {
        let n = self.list.size();
        let mut out = format!("<VmVariantList({n}): [");
        format_items(&self.list, &mut out, 0);
        out.push_str("]>");
        out
    }
}

fn format_items(list: &VmList, out: &mut String, depth: usize) {
    for i in 0..list.size() {
        if i > 0 {
            out.push_str(", ");
        }
        match list.get_variant(i) {
            Err(_) => out.push_str("Error"),
            Ok(Variant::Null) => out.push_str("None"),
            Ok(Variant::I32(v)) => out.push_str(&v.to_string()),
            Ok(Variant::I64(v)) => out.push_str(&v.to_string()),
            Ok(Variant::F32(v)) => out.push_str(&format!("{:.6}", v)),
            Ok(Variant::F64(v)) => out.push_str(&format!("{:.6}", v)),
            Ok(Variant::Ref(r)) => {
                if let Some(bv) = r.downcast::<ferrite_hal::buffer_view::BufferView>() {
                    let shape: Vec<String> = bv.shape().iter().map(|d| d.to_string()).collect();
                    out.push_str(&format!(
                        "HalBufferView({}:0x{:08x})",
                        shape.join("x"),
                        bv.element_type().value().swap_bytes()
                    ));
                } else if let Some(l) = r.downcast::<VmList>() {
                    out.push_str("List[");
                    if depth > 8 {
                        out.push_str("...circular...");
                    } else {
                        format_items(l, out, depth + 1);
                    }
                    out.push(']');
                } else if let Some(fence) = r.downcast::<ferrite_hal::fence::Fence>() {
                    out.push_str(&format!("fence({})", fence.timepoint_count()));
                } else {
                    out.push_str(&format!("Unknown({})", r.type_name()));
                }
            }
        }
    }
}

/// The VM ref an object carries: a `VmRef`, or anything with `__iree_vm_ref__`.
pub fn ref_of(obj: &Bound<'_, PyAny>) -> PyResult<Ref> {
    if let Ok(r) = obj.downcast::<PyVmRef>() {
        return Ok(r.get().0.clone());
    }
    let r = obj.getattr("__iree_vm_ref__")?;
    match r.downcast::<PyVmRef>() {
        Ok(r) => Ok(r.get().0.clone()),
        Err(_) => Err(PyTypeError::new_err(
            "__iree_vm_ref__ did not return a VmRef",
        )),
    }
}

/// The natural Python object for a ref.
pub(crate) fn object_of(py: Python<'_>, r: Ref) -> PyResult<PyObject> {
    if let Some(list) = r.downcast_arc::<VmList>() {
        return Ok(Py::new(py, PyVmVariantList { list })?.into_any());
    }
    if let Some(b) = r.downcast_arc::<VmBuffer>() {
        return Ok(Py::new(py, PyVmBuffer { buffer: b })?.into_any());
    }
    if let Some(bv) = r.downcast_arc::<ferrite_hal::buffer_view::BufferView>() {
        return Ok(Py::new(py, PyHalBufferView { view: bv })?.into_any());
    }
    if let Some(b) = r.downcast_arc::<ferrite_hal::buffer::Buffer>() {
        return Ok(Py::new(py, PyHalBuffer { buffer: b })?.into_any());
    }
    if let Some(o) = crate::hal::sync_object_of(py, &r)? {
        return Ok(o);
    }
    Ok(Py::new(py, PyVmRef(r))?.into_any())
}

/// `ref` as an instance of `clazz`, or None when it is of another type.
fn deref_as(py: Python<'_>, r: &Ref, clazz: &Bound<'_, PyType>) -> PyResult<Option<PyObject>> {
    let is = |t: Bound<'_, PyType>| clazz.is(&t);
    let ok = (is(py.get_type::<PyVmVariantList>()) && r.is::<VmList>())
        || (is(py.get_type::<PyVmBuffer>()) && r.is::<VmBuffer>())
        || (is(py.get_type::<PyHalBufferView>()) && r.is::<ferrite_hal::buffer_view::BufferView>())
        || (is(py.get_type::<PyHalBuffer>()) && r.is::<ferrite_hal::buffer::Buffer>())
        || crate::hal::sync_class_matches(py, r, clazz);
    if ok {
        return object_of(py, r.clone()).map(Some);
    }
    if is(py.get_type::<PyVmRef>()) {
        return Ok(Some(Py::new(py, PyVmRef(r.clone()))?.into_any()));
    }
    Ok(None)
}

/// `obj` (a `VmRef` or anything with `__iree_vm_ref__`) as an instance of
/// `clazz`: the `__iree_vm_cast__` of the ref-backed classes.
pub fn vm_cast(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    clazz: &Bound<'_, PyType>,
) -> PyResult<PyObject> {
    let r = ref_of(obj)?;
    deref_as(py, &r, clazz)?.ok_or_else(|| {
        PyValueError::new_err(format!(
            "Cannot cast VM ref of type {} to {}",
            r.type_name(),
            clazz.name().map(|n| n.to_string()).unwrap_or_default()
        ))
    })
}

/// A reference to any VM object.
#[pyclass(name = "VmRef", module = "ferrite._ferrite", frozen)]
pub struct PyVmRef(pub Ref);

#[pymethods]
impl PyVmRef {
    #[pyo3(signature = (value, optional = false))]
    fn deref(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyType>,
        optional: bool,
    ) -> PyResult<PyObject> {
        match deref_as(py, &self.0, value)? {
            Some(o) => Ok(o),
            None if optional => Ok(py.None()),
            None => Err(PyValueError::new_err(format!(
                "Cannot cast VM ref of type {} to {}",
                self.0.type_name(),
                value.name()?
            ))),
        }
    }

    fn isinstance(&self, py: Python<'_>, ref_type: &Bound<'_, PyType>) -> PyResult<bool> {
        Ok(deref_as(py, &self.0, ref_type)?.is_some() && !ref_type.is(py.get_type::<PyVmRef>()))
    }

    #[getter]
    fn __iree_vm_ref__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match ref_of(other) {
            Ok(r) => r.ptr_eq(&self.0),
            Err(_) => false,
        }
    }

    fn __hash__(&self) -> u64 {
        ref_address(&self.0) as u64
    }

    fn __repr__(&self) -> String {
        format!(
            "<VmRef {} at 0x{:x}>",
            self.0.type_name(),
            ref_address(&self.0)
        )
    }
}

/// The address of a ref's object, for reprs and hashing.
fn ref_address(r: &Ref) -> usize {
    if let Some(b) = r.downcast::<VmBuffer>() {
        return b as *const VmBuffer as usize;
    }
    if let Some(l) = r.downcast::<VmList>() {
        return l as *const VmList as usize;
    }
    if let Some(bv) = r.downcast::<ferrite_hal::buffer_view::BufferView>() {
        return bv as *const _ as usize;
    }
    if let Some(b) = r.downcast::<ferrite_hal::buffer::Buffer>() {
        return b as *const _ as usize;
    }
    crate::hal::sync_ref_address(r)
}

/// A `!vm.buffer`, exposing its bytes through the buffer protocol.
#[pyclass(name = "VmBuffer", module = "ferrite._ferrite", frozen)]
pub struct PyVmBuffer {
    pub buffer: Arc<VmBuffer>,
}

#[pymethods]
impl PyVmBuffer {
    #[new]
    #[pyo3(signature = (length, alignment = 0, mutable = true))]
    fn new(length: u64, alignment: u32, mutable: bool) -> PyResult<Self> {
        let buffer = if mutable {
            VmBuffer::new(length, alignment).py_context("Error creating buffer")?
        } else {
            VmBuffer::from_vec(vec![0; length as usize], false)
        };
        Ok(PyVmBuffer {
            buffer: Arc::new(buffer),
        })
    }

    #[getter]
    fn r#ref(&self) -> PyVmRef {
        PyVmRef(Ref::from_arc(self.buffer.clone()))
    }

    #[getter]
    fn __iree_vm_ref__(&self) -> PyVmRef {
        self.r#ref()
    }

    /// The buffer a VM ref holds; ValueError when it holds something else.
    #[staticmethod]
    fn __iree_vm_cast__(py: Python<'_>, r#ref: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        vm_cast(py, r#ref, &py.get_type::<PyVmBuffer>())
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match ref_of(other) {
            Ok(r) => r
                .downcast::<VmBuffer>()
                .is_some_and(|b| std::ptr::eq(b, &*self.buffer)),
            Err(_) => false,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<VmBuffer size {} at 0x{:x}>",
            self.buffer.len(),
            &*self.buffer as *const VmBuffer as usize
        )
    }

    /// Exports the bytes (writable for a mutable buffer, as upstream). The
    /// export holds the buffer's write lock until released: VM operations
    /// on the buffer meanwhile fail with an error naming the live export,
    /// so release it (`del` the array, `memoryview.release()`) before
    /// invoking a function that uses the buffer.
    // SAFETY: CPython calls this with a `Py_buffer` to fill for `slf`; the
    // body hands `fill_byte_view` memory that the export stored in
    // `view.internal` keeps valid and unaliased until `__releasebuffer__`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let b = slf.get().buffer.clone();
        // The first export waits for VM operations in flight (each holds
        // the lock for one operation); the GIL is released meanwhile.
        let export = Box::new(slf.py().allow_threads(|| b.export_host()));
        let (ptr, len, readonly) = (export.as_ptr(), export.len(), !export.is_writable());
        // SAFETY: `export` holds the buffer's write lock (mutable buffers)
        // or its immutable shared bytes (read-only ones), so `ptr` stays
        // valid for `len` bytes, and no Rust reference to them exists, for
        // as long as the export lives; it is stored in `view.internal`
        // below and dropped only by `__releasebuffer__`, which CPython calls
        // once, when the last consumer of this view is done with it. The
        // view is writable only when the export is.
        unsafe { fill_byte_view(slf.as_any(), view, flags, ptr, len, readonly)? };
        // SAFETY: `fill_byte_view` succeeded, so `view` is CPython's
        // non-null, filled `Py_buffer`; `internal` is the exporter's field.
        unsafe { (*view).internal = Box::into_raw(export).cast() };
        Ok(())
    }

    // SAFETY: CPython calls this once for each successful `__getbuffer__`
    // with the same `view`, whose `internal` holds that call's export.
    unsafe fn __releasebuffer__(&self, view: *mut pyo3::ffi::Py_buffer) {
        // SAFETY: `view` is the buffer `__getbuffer__` filled (CPython's
        // contract); `internal` is either null or the `Box<HostExport>` it
        // leaked there, taken back exactly once here (and nulled).
        unsafe {
            if view.is_null() {
                return;
            }
            let export = (*view).internal as *mut HostExport;
            (*view).internal = std::ptr::null_mut();
            if !export.is_null() {
                drop(Box::from_raw(export));
            }
        }
    }
}
