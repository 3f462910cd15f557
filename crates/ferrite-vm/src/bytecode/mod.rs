//! IREE VM bytecode modules (`.vmfb`, bytecode version 17.0).
//!
//! - [`archive`]: reading the FlatBuffer container, defensively.
//! - [`isa`] (generated from the ISA description) and [`isa_types`]: opcodes
//!   and operand encodings.
//! - [`verifier`]: verifying and decoding each function once at load.
//! - `interp`: the interpreter (frames, calls, the native bridge and the
//!   dispatch loop), which relies on the verifier's facts as its unsafe
//!   contract: only verified bytecode is interpreted.
//! - [`jit`] (feature `jit`): the compiling tier (Cranelift).
//! - [`module`]: bytecode modules and their per-context state.

pub mod archive;
mod cmath;
pub mod disasm;
pub(crate) mod interp;
pub mod isa;
pub mod isa_types;
#[cfg(feature = "jit")]
pub mod jit;
pub mod module;
pub mod verifier;
