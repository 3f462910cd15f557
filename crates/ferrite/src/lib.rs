//! Ferrite's Rust API: load programs compiled by the IREE compiler (`.vmfb`)
//! and call their functions, without touching the VM or HAL layers.
//!
//! ```no_run
//! use ferrite::{Instance, Session, Tensor, Value};
//!
//! # fn main() -> ferrite::Result<()> {
//! let instance = Instance::new();
//! let mut session = Session::new(&instance, "local-task")?;
//! session.load_file("model.vmfb")?;
//! let predict = session.function("predict")?;
//! let x = Tensor::from_f32(&[2, 4], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])?;
//! let results = predict.call(&[Value::from(x)])?;
//! let classes = results[0].as_tensor().unwrap().to_vec::<i32>()?;
//! # let _ = classes;
//! # Ok(())
//! # }
//! ```
//!
//! - [`Instance`]: the root object (a VM instance with the HAL's ref types
//!   registered); one per process is usual, several never interfere.
//! - [`driver`]: the driver registry (every driver of this build, in one
//!   list) and device URIs: `local-sync`, `local-task`,
//!   `local-task://?workers=N`; [`Device`] creates devices through it.
//! - [`Session`]: devices plus loaded modules (the `hal` module first, then
//!   program modules in load order) in one VM context.
//! - [`Function`]: an exported function; [`Function::call`] takes and
//!   returns [`Value`]s: scalars and [`Tensor`]s (host data, copied to and
//!   from device buffers at the call boundary).
//! - [`OwnedFunction`] ([`Session::function_owned`]): the same, borrowing
//!   nothing (`Send + Sync`, `Clone`), for structs that keep a function.
//! - [`DeviceTensor`] ([`Session::upload`]) and [`IoBinding`]
//!   ([`Session::io_binding`]): tensors kept in device buffers across
//!   calls, inputs bound once and outputs left on the device, as `ort`'s
//!   `IoBinding`.
//! - [`tokenizer`] (default feature `tokenizer`): HuggingFace
//!   `tokenizer.json` and tiktoken files, the `ferrite-tokenizer` crate.
//! - `Tensor::from_array` / `Tensor::to_array` (feature `ndarray`):
//!   tensors to and from `ndarray` arrays.
//! - Calls as futures: [`Function::call_async`] (also on [`Session`] and
//!   [`OwnedFunction`]) returns a [`CallFuture`] resolved when the call's
//!   work is done, with no thread blocked per call; functions compiled
//!   with `--iree-execution-model=async-external` get their fences added.
//!   [`Semaphore::wait_async`] and [`Fence::wait_async`] are the HAL's
//!   waits as futures. Any executor drives them (see [`async_call`]).
//! - [`spmd`]: one program on several ranks in one process (each rank its
//!   own thread, devices and session; their collectives connect them).
//! - [`rendezvous`]: one process per rank, started by a launcher (torchrun,
//!   mpirun, Slurm): rank and world size from its environment variables,
//!   the group identifier through the store `FERRITE_STORE` names (a TCP
//!   store needs the job's secret in `FERRITE_STORE_TOKEN`); the
//!   `ferrite-launch` crate, re-exported.
//!
//! The Rust snippets of the README are [`guide`]'s, compiled as doc tests
//! (`cargo test -p ferrite --doc`); a test keeps the README's copies equal
//! to them.
#![deny(missing_docs)]

pub mod async_call;
pub mod device;
pub mod driver;
mod instance;
#[cfg(feature = "ndarray")]
mod ndarray_interop;
pub mod rendezvous;
mod session;
pub mod spmd;
mod value;

pub use async_call::{CallFuture, VariantCallFuture};
pub use device::Device;
pub use ferrite_base::{Result, Status, StatusCode, Timeout};
pub use ferrite_hal::{ElementType, Fence, Semaphore, TimepointWait};
/// Parameter files, indexes and providers (see [`Session::add_parameter_file`]).
pub use ferrite_modules::io_parameters as parameters;
pub use instance::Instance;
pub use session::{Function, IoBinding, OwnedFunction, Session};
pub use value::{DeviceTensor, Element, Tensor, Value};

/// Execution traces in the Chrome/Perfetto JSON format: invocations, VM
/// function spans (interpreted or compiled), dispatches named by their
/// executable export with workgroup counts (on `local-task`, the tiles each
/// worker thread ran), queue operations and semaphore waits with what woke
/// them, per thread and device. One recording per process; off, it costs a
/// relaxed atomic load where an event could be recorded.
///
/// ```no_run
/// # fn main() -> ferrite::Result<()> {
/// ferrite::trace::start()?;
/// // ... calls to trace ...
/// if let Some(trace) = ferrite::trace::stop() {
///     trace.write_chrome_json(std::path::Path::new("trace.json"))?;
/// }
/// # Ok(())
/// # }
/// ```
pub use ferrite_base::trace;

/// Text to token ids and back: HuggingFace `tokenizer.json` and tiktoken
/// files with upstream `iree.runtime.Tokenizer`'s semantics (the
/// `ferrite-tokenizer` crate; default feature `tokenizer`).
///
/// ```
/// use ferrite::tokenizer::Tokenizer;
///
/// # fn main() -> ferrite::Result<()> {
/// // Usually std::fs::read_to_string("tokenizer.json")?
/// let json = r#"{
///   "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
///   "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
///   "post_processor": null, "decoder": null,
///   "model": {"type": "WordLevel", "unk_token": "[UNK]",
///             "vocab": {"[UNK]": 0, "hello": 1, "world": 2}}
/// }"#;
/// let tokenizer = Tokenizer::from_json(json)?;
/// let ids = tokenizer.encode("hello world again", true, false)?;
/// assert_eq!(ids, [1, 2, 0]);
/// let (padded, mask) = Tokenizer::pad(&ids, 5, 0);
/// assert_eq!((padded, mask), (vec![1, 2, 0, 0, 0], vec![1, 1, 1, 0, 0]));
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "tokenizer")]
pub mod tokenizer {
    pub use ferrite_tokenizer::*;
}

/// The Rust usage of the README (`docs/rust-api.md`), compiled as doc tests
/// so that it cannot go stale.
#[doc = include_str!("../../../docs/rust-api.md")]
pub mod guide {}
