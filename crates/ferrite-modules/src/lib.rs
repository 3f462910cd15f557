//! Native VM modules beyond `hal` that programs may import.
//!
//! - [`check`]: the `check` module (`check.expect_true`, `check.expect_eq`,
//!   `check.expect_almost_eq`, ...) that self-checking test programs call;
//!   `ferrite check-module` registers it and reports each failure.

pub mod check;
