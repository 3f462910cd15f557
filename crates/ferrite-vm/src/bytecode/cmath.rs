//! The C library's error function, so `erf` results match upstream's
//! bit for bit (Rust's std has no `erf`; a pure-Rust port may differ in the
//! last place).

#[allow(unsafe_code)]
mod ffi {
    extern "C" {
        pub fn erf(x: f64) -> f64;
        pub fn erff(x: f32) -> f32;
    }
}

/// C `erf`.
pub fn erf(x: f64) -> f64 {
    // SAFETY: `erf` from the platform's libm (linked by std) is a pure
    // function of its argument: no pointers, no global state, defined for
    // every input including NaN and infinities.
    unsafe { ffi::erf(x) }
}

/// C `erff`.
pub fn erff(x: f32) -> f32 {
    // SAFETY: as for `erf`: a pure libm function defined for every f32.
    unsafe { ffi::erff(x) }
}
