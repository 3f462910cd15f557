//! [`Session`], [`Function`] and [`OwnedFunction`]: loaded programs and
//! calling them.

use std::path::Path;
use std::sync::Arc;

use ferrite_hal::fence::Fence;

use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result};
use ferrite_hal_module::HalModuleOptions;
use ferrite_modules::io_parameters::{
    create_io_parameters_module, formats, FileHandle, ParameterIndex, ParameterProvider,
};
use ferrite_vm::cconv::CconvType;
use ferrite_vm::{BytecodeModule, Context, FunctionRef, Module, ModuleBytes, Ref, Variant};

use crate::async_call::{self, CallFuture, VariantCallFuture};
use crate::device::Device;
use crate::instance::Instance;
use crate::value::{DeviceTensor, Tensor, Value};

/// Devices plus loaded modules in one VM context.
///
/// A session with devices registers the `hal` module over them first, then
/// each program module in the order it is loaded, so later modules may
/// import from earlier ones. Functions are looked up by name with
/// [`Session::function`] (a handle borrowing the session) or
/// [`Session::function_owned`] (a handle that keeps what it needs alive, for
/// structs that hold it beside or instead of the session).
pub struct Session {
    instance: Instance,
    devices: Vec<Device>,
    /// Shared with the [`OwnedFunction`]s taken from the session: the
    /// context (and its modules' states) lives until the last of them.
    context: Arc<Context>,
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
            context: Arc::new(context),
            parameters: Parameters::default(),
        })
    }

    /// A session without devices and without the `hal` module, for
    /// programs that use the VM only.
    pub fn without_devices(instance: &Instance) -> Session {
        Session {
            instance: instance.clone(),
            devices: Vec::new(),
            context: Arc::new(Context::new(instance.vm())),
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
    ///
    /// Fails with `FAILED_PRECONDITION` while owned handles of the session
    /// ([`OwnedFunction`], [`IoBinding`]) are alive: they share the context,
    /// which only changes while nothing else holds it. Load every module
    /// before taking owned handles.
    pub fn register(&mut self, module: Arc<dyn Module>) -> Result<()> {
        let name = module.name().to_string();
        let Some(context) = Arc::get_mut(&mut self.context) else {
            bail!(
                FailedPrecondition,
                "registering module '{name}': owned function handles of this session (OwnedFunction, IoBinding) are alive; load every module before taking them"
            );
        };
        context
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

    /// [`Session::function`] as a handle that borrows nothing: it holds the
    /// session's context (shared) and first device, so a struct can keep it
    /// with or without the session, and it is `Send + Sync` and cheap to
    /// clone. Modules cannot be loaded into the session while owned handles
    /// are alive (see [`Session::register`]).
    ///
    /// ```no_run
    /// use ferrite::{Instance, OwnedFunction, Session, Tensor, Value};
    ///
    /// struct Classifier {
    ///     predict: OwnedFunction,
    /// }
    ///
    /// impl Classifier {
    ///     fn new(path: &str) -> ferrite::Result<Classifier> {
    ///         let mut session = Session::new(&Instance::new(), "local-task")?;
    ///         session.load_file(path)?;
    ///         Ok(Classifier { predict: session.function_owned("predict")? })
    ///     }
    ///
    ///     fn classify(&self, x: Tensor) -> ferrite::Result<Vec<i32>> {
    ///         let out = self.predict.call(&[Value::from(x)])?;
    ///         out[0].as_tensor().unwrap().to_i32_vec()
    ///     }
    /// }
    /// # fn main() -> ferrite::Result<()> {
    /// # let c = Classifier::new("model.vmfb")?;
    /// # let _ = c.classify(Tensor::from_f32(&[1, 4], &[0.0; 4])?)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn function_owned(&self, name: &str) -> Result<OwnedFunction> {
        Ok(self.function(name)?.to_owned())
    }

    /// An [`IoBinding`] of `name`: inputs and outputs kept as device
    /// buffers between calls.
    pub fn io_binding(&self, name: &str) -> Result<IoBinding> {
        Ok(IoBinding::new(self.function_owned(name)?))
    }

    /// Copies `tensor` into a new buffer of the session's first device.
    /// Pass the result ([`Value::from`]) to calls as often as needed without
    /// copying again; update it in place with [`DeviceTensor::write`].
    pub fn upload(&self, tensor: &Tensor) -> Result<DeviceTensor> {
        DeviceTensor::upload(self.devices.first(), tensor)
    }

    /// Looks up and calls `name` once: shorthand for
    /// `session.function(name)?.call(args)`.
    pub fn call(&self, name: &str, args: &[Value]) -> Result<Vec<Value>> {
        self.function(name)?.call(args)
    }

    /// Looks up and calls `name`, returning a future of the results:
    /// shorthand for `session.function(name)?.call_async(args)`, with a
    /// lookup failure delivered by the future. See [`Function::call_async`].
    pub fn call_async(&self, name: &str, args: &[Value]) -> CallFuture {
        match self.function(name) {
            Ok(f) => f.call_async(args),
            Err(e) => CallFuture::new(async_call::failed(self.shared_context(), name, e)),
        }
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

    /// The context shared with owned handles.
    fn shared_context(&self) -> Arc<Context> {
        self.context.clone()
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
    fn target(&self) -> Target<'_> {
        Target {
            context: &self.session.context,
            device: self.session.devices.first(),
            f: &self.f,
        }
    }

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
        self.target().call(args)
    }

    /// Calls the function with VM values as they are (no conversion).
    pub fn call_variants(&self, args: Vec<Variant>) -> Result<Vec<Variant>> {
        self.target().call_variants(args)
    }

    /// As [`Function::call`], with tensor results left on the device: each
    /// comes back as a [`Value::Ref`] to its buffer view, for
    /// [`DeviceTensor::from_ref`] (then [`DeviceTensor::read_into`] a buffer
    /// the caller reuses, or pass it to the next call without a copy).
    pub fn call_device(&self, args: &[Value]) -> Result<Vec<Value>> {
        self.target().call_device(args)
    }

    /// Issues the call now and returns a future of its results (tensors
    /// copied to the host, as [`Function::call`]), resolved once the call's
    /// work is done, without a thread blocked for it; any executor drives
    /// it. For a function compiled with
    /// `--iree-execution-model=async-external`, pass only its own
    /// arguments: the wait and signal fences are added (or pass both
    /// yourself). Dropping the future gives up the results, not the call.
    /// See the [`async_call`](crate::async_call) module for the details.
    /// Errors (arguments, the program, the device) come out of the future.
    ///
    /// The future holds the session's context: the session cannot load
    /// modules until it is gone (see [`Session::register`]).
    pub fn call_async(&self, args: &[Value]) -> CallFuture {
        CallFuture::new(
            self.target()
                .call_async(self.session.shared_context(), args, None),
        )
    }

    /// [`Function::call_async`] ordered after `wait`: an async-external
    /// function gets `wait` as its wait fence (its device work starts once
    /// `wait` is reached; the call returns at once); any other function
    /// begins once `wait` is reached. A failed `wait` fails the call. Pass
    /// the [`CallFuture::signal_fence`] of an earlier call to chain calls
    /// on the device.
    pub fn call_async_after(&self, args: &[Value], wait: &Arc<Fence>) -> CallFuture {
        CallFuture::new(self.target().call_async(
            self.session.shared_context(),
            args,
            Some(wait.clone()),
        ))
    }

    /// [`Function::call_async`] with VM values as they are: no conversion
    /// of the arguments (beyond adding the fences of an async-external
    /// function) and none of the results, whose tensors stay in their
    /// device buffers.
    pub fn call_async_variants(&self, args: Vec<Variant>) -> VariantCallFuture {
        let inline = self.target().inline();
        async_call::start(self.session.shared_context(), &self.f, args, None, inline)
    }

    /// The same function as a handle that borrows nothing (see
    /// [`Session::function_owned`]).
    pub fn to_owned(&self) -> OwnedFunction {
        OwnedFunction {
            context: self.session.shared_context(),
            device: self.session.devices.first().cloned(),
            f: self.f.clone(),
        }
    }
}

/// What calling a function needs: the context, the device tensors go to,
/// the function.
struct Target<'a> {
    context: &'a Context,
    device: Option<&'a Device>,
    f: &'a FunctionRef,
}

impl Target<'_> {
    fn call(&self, args: &[Value]) -> Result<Vec<Value>> {
        let variants = self.convert_args(args)?;
        let results = self.call_variants(variants)?;
        results
            .into_iter()
            .map(Value::from_variant)
            .collect::<Result<Vec<_>>>()
            .annotate(|| format!("reading results of '{}'", self.f.name))
    }

    fn call_device(&self, args: &[Value]) -> Result<Vec<Value>> {
        let variants = self.convert_args(args)?;
        let results = self.call_variants(variants)?;
        Ok(results
            .into_iter()
            .map(Value::from_variant_on_device)
            .collect())
    }

    fn call_variants(&self, args: Vec<Variant>) -> Result<Vec<Variant>> {
        self.context
            .invoke(self.f, args)
            .annotate(|| format!("invoking function '{}'", self.f.name))
    }

    /// Converts `args` (the function's own arguments; for an
    /// async-external function optionally followed by its two fences) and
    /// starts the call.
    fn call_async(
        &self,
        context: Arc<Context>,
        args: &[Value],
        after: Option<Arc<Fence>>,
    ) -> VariantCallFuture {
        match self.convert_async_args(args) {
            Ok(variants) => async_call::start(context, self.f, variants, after, self.inline()),
            Err(e) => async_call::failed(context, &self.f.name, e),
        }
    }

    /// Whether the device runs queue work on the submitting thread
    /// (`local-sync`): such a device blocks a submission until its wait
    /// fence is reached, so calls wait for their fence on the host.
    fn inline(&self) -> bool {
        self.device.is_some_and(|d| d.hal().0.runs_inline())
    }

    fn convert_async_args(&self, args: &[Value]) -> Result<Vec<Variant>> {
        let types = &self.f.cconv.args;
        if !async_call::is_coarse_fences(self.f) {
            return self.convert_args(args);
        }
        self.check_fixed_arity()?;
        let own = types.len() - 2;
        if args.len() != own && args.len() != types.len() {
            bail!(
                InvalidArgument,
                "'{}' takes {own} argument(s) ({}) before its wait and signal fences (async-external), but {} were passed",
                self.f.name,
                types[..own].iter().map(type_name).collect::<Vec<_>>().join(", "),
                args.len()
            );
        }
        args.iter()
            .enumerate()
            .map(|(i, arg)| self.convert_arg(i, arg))
            .collect()
    }

    fn check_fixed_arity(&self) -> Result<()> {
        if self
            .f
            .cconv
            .args
            .iter()
            .any(|t| matches!(t, CconvType::Span(_)))
        {
            bail!(
                Unimplemented,
                "'{}' takes variadic arguments; use Function::call_variants",
                self.f.name
            );
        }
        Ok(())
    }

    fn convert_args(&self, args: &[Value]) -> Result<Vec<Variant>> {
        let types = &self.f.cconv.args;
        let name = &self.f.name;
        self.check_fixed_arity()?;
        if args.len() != types.len() {
            bail!(
                InvalidArgument,
                "'{name}' takes {} argument(s) ({}) but {} were passed",
                types.len(),
                types.iter().map(type_name).collect::<Vec<_>>().join(", "),
                args.len()
            );
        }
        args.iter()
            .enumerate()
            .map(|(i, arg)| self.convert_arg(i, arg))
            .collect()
    }

    fn convert_arg(&self, i: usize, arg: &Value) -> Result<Variant> {
        let name = &self.f.name;
        let Some(ty) = self.f.cconv.args.get(i) else {
            bail!(
                OutOfRange,
                "'{name}' takes {} argument(s); there is no argument {i}",
                self.f.cconv.args.len()
            );
        };
        Ok(match (ty, arg) {
            (CconvType::I32, Value::I32(x)) => Variant::I32(*x),
            (CconvType::I64, Value::I64(x)) => Variant::I64(*x),
            (CconvType::I64, Value::I32(x)) => Variant::I64(*x as i64),
            (CconvType::F32, Value::F32(x)) => Variant::F32(*x),
            (CconvType::F64, Value::F64(x)) => Variant::F64(*x),
            (CconvType::Ref, Value::Null) => Variant::Null,
            (CconvType::Ref, Value::Ref(r)) => Variant::Ref(r.clone()),
            (CconvType::Ref, Value::Tensor(t)) => {
                let Some(device) = self.device else {
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
        })
    }
}

/// An exported function as a handle that borrows nothing: it holds the
/// session's VM context (shared; the modules' states live until the last
/// holder goes) and the device tensors are copied to. `Send + Sync`, cheap
/// to clone. Made by [`Session::function_owned`] or [`Function::to_owned`].
#[derive(Clone)]
pub struct OwnedFunction {
    context: Arc<Context>,
    device: Option<Device>,
    f: FunctionRef,
}

impl OwnedFunction {
    fn target(&self) -> Target<'_> {
        Target {
            context: &self.context,
            device: self.device.as_ref(),
            f: &self.f,
        }
    }

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

    /// As [`Function::call`].
    pub fn call(&self, args: &[Value]) -> Result<Vec<Value>> {
        self.target().call(args)
    }

    /// As [`Function::call_variants`].
    pub fn call_variants(&self, args: Vec<Variant>) -> Result<Vec<Variant>> {
        self.target().call_variants(args)
    }

    /// As [`Function::call_device`].
    pub fn call_device(&self, args: &[Value]) -> Result<Vec<Value>> {
        self.target().call_device(args)
    }

    /// As [`Function::call_async`].
    pub fn call_async(&self, args: &[Value]) -> CallFuture {
        CallFuture::new(self.target().call_async(self.context.clone(), args, None))
    }

    /// As [`Function::call_async_after`].
    pub fn call_async_after(&self, args: &[Value], wait: &Arc<Fence>) -> CallFuture {
        CallFuture::new(
            self.target()
                .call_async(self.context.clone(), args, Some(wait.clone())),
        )
    }

    /// As [`Function::call_async_variants`].
    pub fn call_async_variants(&self, args: Vec<Variant>) -> VariantCallFuture {
        let inline = self.target().inline();
        async_call::start(self.context.clone(), &self.f, args, None, inline)
    }

    /// Copies `tensor` into a new buffer of the function's device (see
    /// [`Session::upload`]).
    pub fn upload(&self, tensor: &Tensor) -> Result<DeviceTensor> {
        DeviceTensor::upload(self.device.as_ref(), tensor)
    }

    /// An [`IoBinding`] of this function.
    pub fn io_binding(&self) -> IoBinding {
        IoBinding::new(self.clone())
    }
}

impl std::fmt::Debug for OwnedFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OwnedFunction({})", self.f.name)
    }
}

/// Inputs and outputs of one function kept as device buffers between calls,
/// as `ort`'s `IoBinding`: a host tensor bound as an input is copied to the
/// device once, not at every call; outputs stay on the device until read
/// ([`IoBinding::output`] to host, [`IoBinding::output_tensor`] on device);
/// an output can become an input of the next call without leaving the
/// device ([`IoBinding::bind_output_to_input`]).
///
/// ```no_run
/// use ferrite::{Instance, Session, Tensor, Value};
///
/// # fn main() -> ferrite::Result<()> {
/// let mut session = Session::new(&Instance::new(), "local-task")?;
/// session.load_file("step.vmfb")?;
/// // step(state: tensor<4xf32>, x: f32) -> tensor<4xf32>
/// let mut binding = session.io_binding("step")?;
/// binding.bind_input(0, Tensor::from_f32(&[4], &[0.0; 4])?)?; // copied once
/// for i in 0..10 {
///     binding.bind_input(1, i as f32)?;
///     binding.run()?;
///     binding.bind_output_to_input(0, 0)?; // the new state stays on the device
/// }
/// let state = binding.output(0)?.into_tensor().unwrap().to_f32_vec()?;
/// # let _ = state;
/// # Ok(())
/// # }
/// ```
pub struct IoBinding {
    function: OwnedFunction,
    inputs: Vec<Variant>,
    bound: Vec<bool>,
    outputs: Vec<Variant>,
    runs: u64,
}

impl IoBinding {
    /// A binding of `function` with no input bound yet.
    pub fn new(function: OwnedFunction) -> IoBinding {
        let n = function.arg_count();
        IoBinding {
            function,
            inputs: vec![Variant::Null; n],
            bound: vec![false; n],
            outputs: Vec::new(),
            runs: 0,
        }
    }

    /// The function bound.
    pub fn function(&self) -> &OwnedFunction {
        &self.function
    }

    /// Binds argument `index`: a host [`Tensor`] is copied to the device now
    /// (and not again at each [`IoBinding::run`]); a [`DeviceTensor`]
    /// (`Value::from(device_tensor)`) is bound as it is, so changes written
    /// to it later are seen by later runs; scalars are checked against the
    /// signature as in [`Function::call`].
    pub fn bind_input(&mut self, index: usize, value: impl Into<Value>) -> Result<()> {
        let target = self.function.target();
        target.check_fixed_arity()?;
        let v = target.convert_arg(index, &value.into())?;
        self.inputs[index] = v;
        self.bound[index] = true;
        Ok(())
    }

    /// Binds the output `output` of the last run as argument `input`,
    /// without copying it off the device (a state carried from call to call).
    pub fn bind_output_to_input(&mut self, output: usize, input: usize) -> Result<()> {
        let Some(v) = self.outputs.get(output) else {
            bail!(
                OutOfRange,
                "output {output} of '{}': the last run returned {} output(s){}",
                self.function.name(),
                self.outputs.len(),
                if self.runs == 0 {
                    " (nothing has run yet)"
                } else {
                    ""
                }
            );
        };
        let v = v.clone();
        if input >= self.inputs.len() {
            bail!(
                OutOfRange,
                "'{}' takes {} argument(s); there is no argument {input}",
                self.function.name(),
                self.inputs.len()
            );
        }
        if let (CconvType::Ref, Variant::Ref(_) | Variant::Null)
        | (CconvType::I32, Variant::I32(_))
        | (CconvType::I64, Variant::I64(_))
        | (CconvType::F32, Variant::F32(_))
        | (CconvType::F64, Variant::F64(_)) = (&self.function.f.cconv.args[input], &v)
        {
            self.inputs[input] = v;
            self.bound[input] = true;
            Ok(())
        } else {
            bail!(
                InvalidArgument,
                "output {output} of '{}' cannot be argument {input}: the argument is {}",
                self.function.name(),
                type_name(&self.function.f.cconv.args[input])
            )
        }
    }

    /// Calls the function on the bound inputs; the outputs replace those
    /// of the previous run and stay on the device. Fails with
    /// `FAILED_PRECONDITION` naming the first argument not bound.
    pub fn run(&mut self) -> Result<()> {
        if let Some(i) = self.bound.iter().position(|b| !b) {
            bail!(
                FailedPrecondition,
                "argument {i} of '{}' is not bound (IoBinding::bind_input)",
                self.function.name()
            );
        }
        let f = &self.function;
        f.context
            .invoke_into(&f.f, &self.inputs, &mut self.outputs)
            .annotate(|| format!("invoking function '{}'", f.f.name))?;
        self.runs += 1;
        Ok(())
    }

    /// Number of outputs of the last run (0 before the first).
    pub fn output_count(&self) -> usize {
        self.outputs.len()
    }

    fn output_variant(&self, index: usize) -> Result<&Variant> {
        self.outputs.get(index).ok_or_else(|| {
            ferrite_base::status!(
                OutOfRange,
                "output {index} of '{}': the last run returned {} output(s){}",
                self.function.name(),
                self.outputs.len(),
                if self.runs == 0 {
                    " (nothing has run yet)"
                } else {
                    ""
                }
            )
        })
    }

    /// Output `index` of the last run, tensors copied to the host.
    pub fn output(&self, index: usize) -> Result<Value> {
        Value::from_variant(self.output_variant(index)?.clone())
    }

    /// Output `index` of the last run as the device tensor it is (no copy).
    /// Fails with `INVALID_ARGUMENT` when the output is not a tensor.
    pub fn output_tensor(&self, index: usize) -> Result<DeviceTensor> {
        match self.output_variant(index)? {
            Variant::Ref(r) => DeviceTensor::from_ref(r.clone()),
            v => bail!(
                InvalidArgument,
                "output {index} of '{}' is not a tensor ({v:?})",
                self.function.name()
            ),
        }
    }

    /// Every output of the last run, tensors copied to the host.
    pub fn outputs(&self) -> Result<Vec<Value>> {
        (0..self.outputs.len()).map(|i| self.output(i)).collect()
    }
}

impl std::fmt::Debug for IoBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBinding")
            .field("function", &self.function.name())
            .field("bound", &self.bound)
            .field("outputs", &self.outputs.len())
            .finish()
    }
}

impl std::fmt::Debug for Function<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Function({})", self.f.name)
    }
}
