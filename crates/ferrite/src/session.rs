//! [`Session`] and [`Function`]: loaded programs and calling them.

use std::path::Path;
use std::sync::Arc;

use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result};
use ferrite_hal_module::HalModuleOptions;
use ferrite_modules::io_parameters::{
    create_io_parameters_module, formats, FileHandle, ParameterIndex, ParameterProvider,
};
use ferrite_vm::cconv::CconvType;
use ferrite_vm::{BytecodeModule, Context, FunctionRef, Module, ModuleBytes, Ref, Variant};

use crate::device::Device;
use crate::instance::Instance;
use crate::value::Value;

/// Devices plus loaded modules in one VM context.
///
/// A session with devices registers the `hal` module over them first, then
/// each program module in the order it is loaded, so later modules may
/// import from earlier ones. Functions are looked up by name with
/// [`Session::function`].
pub struct Session {
    instance: Instance,
    devices: Vec<Device>,
    context: Context,
    parameters: Parameters,
}

/// Parameter scopes added to a session, served by the `io_parameters`
/// module once a program that imports it is loaded.
#[derive(Default)]
struct Parameters {
    scopes: Vec<(String, ParameterIndex)>,
    providers: Vec<ParameterProvider>,
    registered: bool,
}

impl Session {
    /// A session on one device named as the [device registry](crate::device)
    /// accepts (`local-sync`, `local-task`, `local-task://?workers=N`).
    pub fn new(instance: &Instance, device: &str) -> Result<Session> {
        Session::with_devices(instance, &[device])
    }

    /// A session on several devices (`hal.devices.get(i)` returns the
    /// `i`-th); tensors passed to functions are allocated on the first.
    /// Collective channels take their defaults from the launcher's
    /// environment when one started this process
    /// ([`crate::rendezvous::process_default`]).
    pub fn with_devices(instance: &Instance, devices: &[&str]) -> Result<Session> {
        let devices = devices
            .iter()
            .map(|n| Device::create(n))
            .collect::<Result<Vec<_>>>()?;
        let options = HalModuleOptions {
            channel_provider: crate::rendezvous::process_default(),
            ..HalModuleOptions::default()
        };
        Session::from_devices(instance, devices, options)
    }

    /// A session on several devices whose `hal` module answers the
    /// channel defaults of `hal.channel.create` (rank, count, group
    /// identifier) from `provider`: a rank of an in-process group
    /// ([`crate::spmd`]), or a provider of launcher environment variables.
    pub fn with_channel_provider(
        instance: &Instance,
        devices: &[&str],
        provider: Arc<dyn ferrite_hal::channel::ChannelProvider>,
    ) -> Result<Session> {
        let devices = devices
            .iter()
            .map(|n| Device::create(n))
            .collect::<Result<Vec<_>>>()?;
        let options = HalModuleOptions {
            channel_provider: Some(provider),
            ..HalModuleOptions::default()
        };
        Session::from_devices(instance, devices, options)
    }

    /// A session over devices already made (e.g. [`Device::from_hal`]) and
    /// explicit `hal` module options.
    pub fn from_devices(
        instance: &Instance,
        devices: Vec<Device>,
        options: HalModuleOptions,
    ) -> Result<Session> {
        let mut context = Context::new(instance.vm());
        if !devices.is_empty() {
            let hal = ferrite_hal_module::create_hal_module(
                devices.iter().map(|d| d.hal().clone()).collect(),
                options,
            )?;
            context.register(hal)?;
        }
        Ok(Session {
            instance: instance.clone(),
            devices,
            context,
            parameters: Parameters::default(),
        })
    }

    /// A session without devices and without the `hal` module, for
    /// programs that use the VM only.
    pub fn without_devices(instance: &Instance) -> Session {
        Session {
            instance: instance.clone(),
            devices: Vec::new(),
            context: Context::new(instance.vm()),
            parameters: Parameters::default(),
        }
    }

    /// Loads a `.vmfb` from bytes and registers it after the modules
    /// already loaded. Returns the module's name.
    pub fn load_bytes(&mut self, bytes: impl Into<Vec<u8>>) -> Result<String> {
        self.load_module_bytes(ModuleBytes::from_vec(bytes.into()))
    }

    /// Loads a `.vmfb` embedded in the binary (`include_bytes!`). Returns the
    /// module's name. The bytes are copied once: static data lives in
    /// read-only pages, and a program may write its constants in place
    /// (see `ferrite_vm::ModuleBytes`).
    pub fn load_static(&mut self, bytes: &'static [u8]) -> Result<String> {
        self.load_module_bytes(ModuleBytes::from_vec(bytes.to_vec()))
    }

    /// Loads a `.vmfb` file, memory-mapped read-only. Returns the module's
    /// name.
    pub fn load_file(&mut self, path: impl AsRef<Path>) -> Result<String> {
        let path = path.as_ref();
        let bytes = ModuleBytes::map_file(path)
            .annotate(|| format!("loading bytecode module at '{}'", path.display()))?;
        self.load_module_bytes(bytes)
            .annotate(|| format!("loading bytecode module at '{}'", path.display()))
    }

    /// Loads module bytes held however the caller likes. Returns the
    /// module's name.
    pub fn load_module_bytes(&mut self, bytes: ModuleBytes) -> Result<String> {
        let module = BytecodeModule::load(self.instance.vm(), bytes)?;
        let needs_hal = module.dependencies().iter().any(|d| d.name == "hal")
            || module
                .imports()
                .iter()
                .any(|i| i.full_name.starts_with("hal."));
        if needs_hal && self.devices.is_empty() {
            bail!(
                FailedPrecondition,
                "module '{}' uses the HAL but the session has no device; create it with Session::new(&instance, \"local-task\")",
                module.name()
            );
        }
        let needs_parameters = module
            .imports()
            .iter()
            .any(|i| i.full_name.starts_with("io_parameters."));
        if needs_parameters && !self.parameters.registered {
            let p = std::mem::take(&mut self.parameters);
            let mut providers: Vec<ParameterProvider> = p
                .scopes
                .into_iter()
                .map(|(scope, index)| ParameterProvider::new(&scope, index))
                .collect();
            providers.extend(p.providers);
            self.register(create_io_parameters_module(providers)?)?;
            self.parameters.registered = true;
        }
        let name = module.name().to_string();
        self.register(module as Arc<dyn Module>)?;
        Ok(name)
    }

    /// Makes the parameters of a `.irpa`, `.gguf` or `.safetensors` file
    /// (memory-mapped; format from the extension) available to programs
    /// under `scope` (`""` for the anonymous scope), like the CLI's
    /// `--parameters=scope=path`. Files of one scope are searched in the
    /// order added. Add parameters before loading the programs that use
    /// them.
    pub fn add_parameter_file(&mut self, scope: &str, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        self.check_parameters_open()?;
        let handle = FileHandle::open(path)?;
        let i = match self.parameters.scopes.iter().position(|(s, _)| s == scope) {
            Some(i) => i,
            None => {
                self.parameters
                    .scopes
                    .push((scope.to_string(), ParameterIndex::new()));
                self.parameters.scopes.len() - 1
            }
        };
        formats::parse_into(&mut self.parameters.scopes[i].1, &handle, None)
    }

    /// Serves parameters from `provider` (an index built by hand, e.g. over
    /// host memory), after the scopes of [`Session::add_parameter_file`].
    pub fn add_parameter_provider(&mut self, provider: ParameterProvider) -> Result<()> {
        self.check_parameters_open()?;
        self.parameters.providers.push(provider);
        Ok(())
    }

    fn check_parameters_open(&self) -> Result<()> {
        if self.parameters.registered {
            bail!(
                FailedPrecondition,
                "parameters must be added before loading a program that uses them (the io_parameters module is already registered)"
            );
        }
        Ok(())
    }

    /// Registers any VM module (a native module, a module loaded by hand)
    /// after the modules already loaded.
    pub fn register(&mut self, module: Arc<dyn Module>) -> Result<()> {
        let name = module.name().to_string();
        self.context
            .register(module)
            .annotate(|| format!("registering module '{name}'"))
    }

    /// Looks up `function` or `module.function` (a bare name is searched
    /// in the most recently loaded module first).
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let f = self
            .context
            .lookup_function(name)
            .annotate(|| format!("looking up function '{name}'"))?;
        Ok(Function { session: self, f })
    }

    /// Looks up and calls `name` once: shorthand for
    /// `session.function(name)?.call(args)`.
    pub fn call(&self, name: &str, args: &[Value]) -> Result<Vec<Value>> {
        self.function(name)?.call(args)
    }

    /// The session's devices, in `hal.devices.get` order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The instance the session belongs to.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// The underlying VM context, for code that works at the VM layer.
    pub fn context(&self) -> &Context {
        &self.context
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let modules: Vec<&str> = self.context.modules().map(|m| m.name()).collect();
        f.debug_struct("Session")
            .field("devices", &self.devices)
            .field("modules", &modules)
            .finish()
    }
}

/// An exported function of a session's modules, ready to call.
pub struct Function<'s> {
    session: &'s Session,
    f: FunctionRef,
}

fn type_name(t: &CconvType) -> String {
    match t {
        CconvType::I32 => "i32".into(),
        CconvType::I64 => "i64".into(),
        CconvType::F32 => "f32".into(),
        CconvType::F64 => "f64".into(),
        CconvType::Ref => "ref".into(),
        CconvType::Span(_) => "variadic".into(),
    }
}

impl<'s> Function<'s> {
    /// `module.function`.
    pub fn name(&self) -> &str {
        &self.f.name
    }

    /// Number of arguments the function takes.
    pub fn arg_count(&self) -> usize {
        self.f.cconv.args.len()
    }

    /// Number of results the function returns.
    pub fn result_count(&self) -> usize {
        self.f.cconv.results.len()
    }

    /// The VM function, for code that works at the VM layer.
    pub fn vm_function(&self) -> &FunctionRef {
        &self.f
    }

    /// Calls the function. Tensors are copied into buffers from the first
    /// device's allocator; tensor results are copied back out. Arguments
    /// are checked against the function's signature first: a wrong count
    /// or kind fails with `INVALID_ARGUMENT` naming the argument.
    pub fn call(&self, args: &[Value]) -> Result<Vec<Value>> {
        let variants = self.convert_args(args)?;
        let results = self.call_variants(variants)?;
        results
            .into_iter()
            .map(Value::from_variant)
            .collect::<Result<Vec<_>>>()
            .annotate(|| format!("reading results of '{}'", self.f.name))
    }

    /// Calls the function with VM values as they are (no conversion).
    pub fn call_variants(&self, args: Vec<Variant>) -> Result<Vec<Variant>> {
        self.session
            .context
            .invoke(&self.f, args)
            .annotate(|| format!("invoking function '{}'", self.f.name))
    }

    fn convert_args(&self, args: &[Value]) -> Result<Vec<Variant>> {
        let types = &self.f.cconv.args;
        let name = &self.f.name;
        if types.iter().any(|t| matches!(t, CconvType::Span(_))) {
            bail!(
                Unimplemented,
                "'{name}' takes variadic arguments; use Function::call_variants"
            );
        }
        if args.len() != types.len() {
            bail!(
                InvalidArgument,
                "'{name}' takes {} argument(s) ({}) but {} were passed",
                types.len(),
                types.iter().map(type_name).collect::<Vec<_>>().join(", "),
                args.len()
            );
        }
        let mut out = Vec::with_capacity(args.len());
        for (i, (arg, ty)) in args.iter().zip(types).enumerate() {
            let v = match (ty, arg) {
                (CconvType::I32, Value::I32(x)) => Variant::I32(*x),
                (CconvType::I64, Value::I64(x)) => Variant::I64(*x),
                (CconvType::I64, Value::I32(x)) => Variant::I64(*x as i64),
                (CconvType::F32, Value::F32(x)) => Variant::F32(*x),
                (CconvType::F64, Value::F64(x)) => Variant::F64(*x),
                (CconvType::Ref, Value::Null) => Variant::Null,
                (CconvType::Ref, Value::Ref(r)) => Variant::Ref(r.clone()),
                (CconvType::Ref, Value::Tensor(t)) => {
                    let Some(device) = self.session.devices.first() else {
                        bail!(
                            FailedPrecondition,
                            "argument {i} of '{name}' is a tensor but the session has no device"
                        );
                    };
                    let view = t
                        .to_buffer_view(&*device.hal().0.allocator())
                        .annotate(|| format!("argument {i} of '{name}'"))?;
                    Variant::Ref(Ref::new(view))
                }
                (ty, arg) => bail!(
                    InvalidArgument,
                    "argument {i} of '{name}' must be {} but a {} was passed",
                    match ty {
                        CconvType::Ref => "a tensor or ref".to_string(),
                        t => format!("an {}", type_name(t)),
                    },
                    arg.kind_name()
                ),
            };
            out.push(v);
        }
        Ok(out)
    }
}

impl std::fmt::Debug for Function<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Function({})", self.f.name)
    }
}
