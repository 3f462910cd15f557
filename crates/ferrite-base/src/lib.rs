//! Ferrite's base layer: IREE status codes and errors, timeouts and deadlines,
//! and the wait primitives that every higher layer blocks on.
//!
//! Nothing here knows about the VM or the HAL; both build on these types.
#![deny(missing_docs)]

pub mod object;
pub mod printf_float;
pub mod spin;
pub mod status;
pub mod time;
pub mod trace;
pub mod wait;

pub use object::RefObject;
pub use status::{Result, Status, StatusCode};
pub use time::{Deadline, Timeout};
pub use wait::{Notifier, WaitMode, WaitSource};
