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
//! - [`spmd`]: one program on several ranks in one process (each rank its
//!   own thread, devices and session; their collectives connect them).
//! - [`rendezvous`]: one process per rank, started by a launcher (torchrun,
//!   mpirun, Slurm): rank and world size from its environment variables,
//!   the group identifier through the store `FERRITE_STORE` names (a TCP
//!   store needs the job's secret in `FERRITE_STORE_TOKEN`); the
//!   `ferrite-launch` crate, re-exported.
#![deny(missing_docs)]

pub mod device;
pub mod driver;
mod instance;
pub mod rendezvous;
mod session;
pub mod spmd;
mod value;

pub use device::Device;
pub use ferrite_base::{Result, Status, StatusCode};
pub use ferrite_hal::ElementType;
/// Parameter files, indexes and providers (see [`Session::add_parameter_file`]).
pub use ferrite_modules::io_parameters as parameters;
pub use instance::Instance;
pub use session::{Function, Session};
pub use value::{Element, Tensor, Value};
