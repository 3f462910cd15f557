//! Native runtime VM modules beyond `hal` that programs may import (the
//! e2e test-runner modules live with the test tooling, in `ferrite-e2e`).
//!
//! - [`check`]: the `check` module (`check.expect_true`, `check.expect_eq`,
//!   `check.expect_almost_eq`, ...) that self-checking test programs call;
//!   `ferrite check-module` registers it and reports each failure.
//! - [`io_parameters`]: the `io_parameters` module serving parameters from
//!   `.irpa`, `.gguf` and `.safetensors` files (`--parameters=scope=file`).

pub mod check;
pub mod io_parameters;
