//! Native VM modules beyond `hal` that programs may import.
//!
//! - [`check`]: the `check` module (`check.expect_true`, `check.expect_eq`,
//!   `check.expect_almost_eq`, ...) that self-checking test programs call;
//!   `ferrite check-module` registers it and reports each failure.
//! - [`e2e`]: the `matmul_test`, `conv2d_test` and `attention_test` modules
//!   of upstream's generated e2e suites (random inputs, host reference
//!   checks); run by `ferrite e2e-{matmul,conv2d,attention}-test`.
//! - [`io_parameters`]: the `io_parameters` module serving parameters from
//!   `.irpa`, `.gguf` and `.safetensors` files (`--parameters=scope=file`).

pub mod check;
pub mod e2e;
pub mod io_parameters;
