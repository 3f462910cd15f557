//! The `check` VM module: assertions that self-checking test programs call
//! (`check.expect_true`, `check.expect_eq`, `check.expect_almost_eq`, ...).
//!
//! Exports, with the calling conventions the compiler's imports declare
//! (all return nothing):
//!
//! | function           | cconv      | arguments                          |
//! |--------------------|------------|------------------------------------|
//! | `expect_true`      | `0i_v`     | operand                            |
//! | `expect_false`     | `0i_v`     | operand                            |
//! | `expect_all_true`  | `0rr_v`    | device, view                       |
//! | `expect_eq`        | `0rrr_v`   | device, lhs view, rhs view         |
//! | `expect_almost_eq` | `0rrrff_v` | device, lhs, rhs, atol, rtol       |
//!
//! The `*_const` forms of the compiler's `check` dialect lower to these
//! (the constant becomes a buffer view), and the default tolerances of
//! `expect_almost_eq` are filled in by the compiler.
//!
//! A failed expectation does not stop the program (as a gtest `EXPECT_*`):
//! its message goes to the module's [`CheckLog`] and the call returns
//! normally. Errors (an element type a check cannot compare, an unmappable
//! buffer) fail the call instead.
//!
//! `expect_almost_eq` accepts `lhs` when
//! `lhs == rhs || both NaN || (isfinite(rhs) && |lhs - rhs| <= atol + rtol * |rhs|)`,
//! evaluated in f64 on values widened from the storage type (f64, f32, f16,
//! bf16 and the f8 types). `rhs` is the expected value, so the check is
//! asymmetric, as upstream's.

use std::sync::Arc;

use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result, Timeout};
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer_view::DEFAULT_MAX_ELEMENT_COUNT;
use ferrite_hal::device::{queue, DeviceRef};
use ferrite_hal::numerics::{self, format_g};
use ferrite_hal::{
    BufferUsage, BufferView, ElementType, Fence, MemoryAccess, MemoryType, Semaphore,
};
use ferrite_vm::native::{ArgReader, NativeModule, NativeModuleBuilder};
use ferrite_vm::refs::{Ref, RefObject};
use ferrite_vm::stack::{NativeCall, NativePoll};
use parking_lot::Mutex;

/// The module's version (upstream's `check` module is version 0).
pub const CHECK_MODULE_VERSION: u32 = 0;

/// The exports and their calling conventions, in export order.
pub const CHECK_EXPORTS: [(&str, &str); 5] = [
    ("expect_true", "0i_v"),
    ("expect_false", "0i_v"),
    ("expect_all_true", "0rr_v"),
    ("expect_eq", "0rrr_v"),
    ("expect_almost_eq", "0rrrff_v"),
];

/// Failure messages of failed expectations, in the order they happened.
/// Clones share the same log.
#[derive(Clone, Default)]
pub struct CheckLog(Arc<Mutex<Vec<String>>>);

impl CheckLog {
    /// An empty log.
    pub fn new() -> CheckLog {
        CheckLog::default()
    }

    /// Appends a failure.
    pub fn record(&self, message: String) {
        self.0.lock().push(message);
    }

    /// The failures so far.
    pub fn failures(&self) -> Vec<String> {
        self.0.lock().clone()
    }

    /// Removes and returns the failures so far.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock())
    }

    /// How many expectations failed.
    pub fn len(&self) -> usize {
        self.0.lock().len()
    }

    /// True when no expectation failed.
    pub fn is_empty(&self) -> bool {
        self.0.lock().is_empty()
    }
}

/// Builds the `check` module; failures go to the returned log.
pub fn create_check_module() -> Result<(Arc<NativeModule>, CheckLog)> {
    let log = CheckLog::new();
    Ok((create_check_module_with_log(log.clone())?, log))
}

/// Builds the `check` module recording failures in `log`.
pub fn create_check_module_with_log(log: CheckLog) -> Result<Arc<NativeModule>> {
    let b = NativeModuleBuilder::new("check", CHECK_MODULE_VERSION);
    let l = log.clone();
    let b = b.function("expect_true", "0i_v", move |c| {
        let v = ArgReader::new(c).i32()?;
        if v == 0 {
            l.record(format!("Expected {v} to be nonzero."));
        }
        done()
    })?;
    let l = log.clone();
    let b = b.function("expect_false", "0i_v", move |c| {
        let v = ArgReader::new(c).i32()?;
        if v != 0 {
            l.record(format!("Expected {v} to be zero."));
        }
        done()
    })?;
    let l = log.clone();
    let b = b.function("expect_all_true", "0rr_v", move |c| {
        let (device, views) = device_and_views(c, 1)?;
        if let Some(m) = expect_all_true(device.as_ref(), &views[0])? {
            l.record(m);
        }
        done()
    })?;
    let l = log.clone();
    let b = b.function("expect_eq", "0rrr_v", move |c| {
        let (device, views) = device_and_views(c, 2)?;
        if let Some(m) = expect_eq(device.as_ref(), &views[0], &views[1])? {
            l.record(m);
        }
        done()
    })?;
    let l = log;
    let b = b.function("expect_almost_eq", "0rrrff_v", move |c| {
        let (device, views) = device_and_views(c, 2)?;
        let mut a = ArgReader::new(c);
        for _ in 0..3 {
            a.opt_ref()?;
        }
        let (atol, rtol) = (a.f32()?, a.f32()?);
        if let Some(m) = expect_almost_eq(device.as_ref(), &views[0], &views[1], atol, rtol)? {
            l.record(m);
        }
        done()
    })?;
    Ok(b.build())
}

fn done() -> Result<NativePoll> {
    Ok(NativePoll::Ready(Vec::new()))
}

/// Reads the leading device (may be null) and `n` non-null buffer views.
fn device_and_views(c: &NativeCall, n: usize) -> Result<(Option<DeviceRef>, Vec<BufferView>)> {
    let mut a = ArgReader::new(c);
    let device = match a.opt_ref()? {
        None => None,
        Some(r) => Some(downcast::<DeviceRef>(&r, "device")?),
    };
    let names: &[&str] = if n == 1 {
        &["operand"]
    } else {
        &["lhs", "rhs"]
    };
    let mut views = Vec::with_capacity(n);
    for &what in names.iter().take(n) {
        let r = a.a_ref().annotate(|| what.to_string())?;
        views.push(downcast::<BufferView>(&r, what)?);
    }
    Ok((device, views))
}

fn downcast<T: RefObject + Clone>(r: &Ref, what: &str) -> Result<T> {
    r.downcast::<T>().cloned().ok_or_else(|| {
        status!(
            InvalidArgument,
            "{what}: expected a different ref type, received !{}",
            r.type_name()
        )
    })
}

/// The view itself when the host can map its buffer, else a copy into a
/// host-local buffer made on `device`'s queue.
pub fn host_view(device: Option<&DeviceRef>, view: &BufferView) -> Result<BufferView> {
    let buffer = view.buffer();
    if buffer.memory_type().contains(MemoryType::HOST_VISIBLE)
        && buffer.allowed_usage().contains(BufferUsage::MAPPING_SCOPED)
    {
        return Ok(view.clone());
    }
    let Some(device) = device else {
        bail!(
            InvalidArgument,
            "buffer view is not host-visible and no device was given to transfer it"
        );
    };
    let length = buffer.byte_length();
    let params = BufferParams {
        usage: BufferUsage::TRANSFER | BufferUsage::MAPPING,
        access: MemoryAccess::ALL,
        memory_type: MemoryType::HOST_LOCAL | MemoryType::DEVICE_VISIBLE,
        queue_affinity: 0,
        min_alignment: 0,
    };
    let target = device.0.allocator().allocate(&params, length)?;
    let semaphore = Semaphore::new(0);
    let signal = Fence::create_at(semaphore, 1);
    queue::copy(
        &device.0,
        &Fence::new(),
        &signal,
        buffer.clone(),
        0,
        target.clone(),
        0,
        length,
    )?;
    if !signal.wait(Timeout::INFINITE)? {
        bail!(
            DeadlineExceeded,
            "transfer of a buffer view to the host timed out"
        );
    }
    BufferView::new(
        target,
        view.shape(),
        view.element_type(),
        view.encoding_type(),
    )
}

/// The view's bytes (its byte length from the start of its buffer).
pub fn contents(view: &BufferView) -> Result<Vec<u8>> {
    let map = view.buffer().map_read(0, view.byte_length())?;
    Ok(map.to_vec())
}

fn text(view: &BufferView) -> Result<String> {
    view.format(Some(DEFAULT_MAX_ELEMENT_COUNT))
}

fn unsupported(et: ElementType) -> ferrite_base::Status {
    status!(InvalidArgument, "unsupported element type {et}")
}

/// The index and value of the first zero element, or None when all are
/// nonzero. `UNSUPPORTED` for types other than 8..64-bit integers, f32, f64.
fn first_zero(bytes: &[u8], et: ElementType) -> Result<Option<(usize, String)>> {
    macro_rules! scan {
        ($t:ty) => {{
            const N: usize = std::mem::size_of::<$t>();
            for (i, c) in bytes.chunks_exact(N).enumerate() {
                let v = <$t>::from_le_bytes(c.try_into().unwrap_or([0; N]));
                #[allow(clippy::float_cmp)]
                if v == (0 as $t) {
                    return Ok(Some((i, v.to_string())));
                }
            }
            Ok(None)
        }};
    }
    match et {
        ElementType::INT_8 | ElementType::SINT_8 => scan!(i8),
        ElementType::UINT_8 => scan!(u8),
        ElementType::INT_16 | ElementType::SINT_16 => scan!(i16),
        ElementType::UINT_16 => scan!(u16),
        ElementType::INT_32 | ElementType::SINT_32 => scan!(i32),
        ElementType::UINT_32 => scan!(u32),
        ElementType::INT_64 | ElementType::SINT_64 => scan!(i64),
        ElementType::UINT_64 => scan!(u64),
        ElementType::FLOAT_32 => scan!(f32),
        ElementType::FLOAT_64 => scan!(f64),
        other => Err(unsupported(other)),
    }
}

/// `check.expect_all_true`: None when every element is nonzero, else the
/// failure message.
pub fn expect_all_true(device: Option<&DeviceRef>, view: &BufferView) -> Result<Option<String>> {
    let view = host_view(device, view)?;
    let bytes = contents(&view)?;
    match first_zero(&bytes, view.element_type())? {
        None => Ok(None),
        Some((index, value)) => Ok(Some(format!(
            "Expected all elements to be nonzero; element #{index} is {value}.\n  operand:\n    {}",
            text(&view)?
        ))),
    }
}

/// `check.expect_eq`: None when element types, shapes and bytes are equal,
/// else the failure message (both views printed).
pub fn expect_eq(
    device: Option<&DeviceRef>,
    lhs: &BufferView,
    rhs: &BufferView,
) -> Result<Option<String>> {
    let lhs = host_view(device, lhs)?;
    let rhs = host_view(device, rhs)?;
    let types_eq = lhs.element_type() == rhs.element_type();
    let shapes_eq = lhs.shape() == rhs.shape();
    let contents_eq = contents(&lhs)? == contents(&rhs)?;
    if types_eq && shapes_eq && contents_eq {
        return Ok(None);
    }
    let mut m = mismatch_header("equality", types_eq, shapes_eq);
    if !contents_eq {
        m.push_str(" Contents does not match.");
    }
    append_views(&mut m, &lhs, &rhs)?;
    Ok(Some(m))
}

/// The start of an `expect_eq`/`expect_almost_eq` failure message (as
/// upstream words it): what was expected, then which of element types and
/// shapes differ.
fn mismatch_header(expected: &str, types_eq: bool, shapes_eq: bool) -> String {
    let mut m = format!("Expected {expected} of these values.");
    if !types_eq {
        m.push_str(" Element types do not match.");
    }
    if !shapes_eq {
        m.push_str(" Shapes do not match.");
    }
    m
}

fn append_views(m: &mut String, lhs: &BufferView, rhs: &BufferView) -> Result<()> {
    m.push_str("\n  lhs:\n    ");
    m.push_str(&text(lhs)?);
    m.push_str("\n  rhs:\n    ");
    m.push_str(&text(rhs)?);
    Ok(())
}

/// Upstream's fuzzy comparison: `expected` is the reference.
pub fn fuzzy_compare(actual: f64, expected: f64, atol: f64, rtol: f64) -> bool {
    if actual == expected || (actual.is_nan() && expected.is_nan()) {
        return true;
    }
    if !expected.is_finite() {
        return false;
    }
    (actual - expected).abs() <= atol + rtol * expected.abs()
}

/// Widens the elements of `bytes` to f64; `UNSUPPORTED` for non-float types.
fn load_floats(bytes: &[u8], et: ElementType) -> Result<Vec<f64>> {
    let v = match et {
        ElementType::FLOAT_64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
        ElementType::FLOAT_32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as f64)
            .collect(),
        ElementType::FLOAT_16 | ElementType::BFLOAT_16 => {
            let f = if et == ElementType::FLOAT_16 {
                numerics::f16_to_f32
            } else {
                numerics::bf16_to_f32
            };
            bytes
                .chunks_exact(2)
                .map(|c| f(u16::from_le_bytes([c[0], c[1]])) as f64)
                .collect()
        }
        _ => {
            let f: fn(u8) -> f32 = match et {
                ElementType::FLOAT_8_E4M3_FN => numerics::f8e4m3fn_to_f32,
                ElementType::FLOAT_8_E4M3_FNUZ => numerics::f8e4m3fnuz_to_f32,
                ElementType::FLOAT_8_E5M2 => numerics::f8e5m2_to_f32,
                ElementType::FLOAT_8_E5M2_FNUZ => numerics::f8e5m2fnuz_to_f32,
                ElementType::FLOAT_8_E8M0_FNU => numerics::f8e8m0fnu_to_f32,
                other => return Err(unsupported(other)),
            };
            bytes.iter().map(|&b| f(b) as f64).collect()
        }
    };
    Ok(v)
}

/// C++ `std::scientific` with precision 3: `-1.000e-03`, `inf`, `nan`.
fn format_sci3(x: f64) -> String {
    if !x.is_finite() {
        return format_g(x);
    }
    let s = format!("{x:.3e}");
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mant}e{sign}{:02}", exp.abs())
}

/// `check.expect_almost_eq`: None when element types and shapes match and
/// every element is within tolerance, else the failure message naming the
/// first element that is not (both views printed).
pub fn expect_almost_eq(
    device: Option<&DeviceRef>,
    lhs: &BufferView,
    rhs: &BufferView,
    atol: f32,
    rtol: f32,
) -> Result<Option<String>> {
    let lhs = host_view(device, lhs)?;
    let rhs = host_view(device, rhs)?;
    let types_eq = lhs.element_type() == rhs.element_type();
    let shapes_eq = lhs.shape() == rhs.shape();
    let mut first_failure = None;
    if types_eq && shapes_eq {
        let l = load_floats(&contents(&lhs)?, lhs.element_type())?;
        let r = load_floats(&contents(&rhs)?, rhs.element_type())?;
        first_failure = l
            .iter()
            .zip(&r)
            .enumerate()
            .find(|(_, (a, e))| !fuzzy_compare(**a, **e, atol as f64, rtol as f64))
            .map(|(i, (a, e))| (i, *a, *e));
    }
    if types_eq && shapes_eq && first_failure.is_none() {
        return Ok(None);
    }
    let mut m = mismatch_header("near equality", types_eq, shapes_eq);
    if let Some((i, a, e)) = first_failure {
        m.push_str(&format!(
            " Contents does not match to tolerance parameters atol={}, rtol={}. \
             The first failure occurs at index {i} as the lhs value {} differs from \
             the rhs value {} by {}.",
            format_g(atol as f64),
            format_g(rtol as f64),
            format_g(a),
            format_g(e),
            format_sci3(e - a)
        ));
    }
    append_views(&mut m, &lhs, &rhs)?;
    Ok(Some(m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_hal::allocator::HeapAllocator;
    use ferrite_vm::Module;

    fn view(text: &str) -> BufferView {
        let alloc = HeapAllocator::new();
        BufferView::parse(text, &alloc).unwrap()
    }

    #[test]
    fn exports_and_cconvs_match_upstream() {
        let (m, _) = create_check_module().unwrap();
        assert_eq!(m.name(), "check");
        assert_eq!(m.version(), CHECK_MODULE_VERSION);
        let got: Vec<(String, String)> = m
            .exports()
            .iter()
            .map(|e| (e.name.clone(), e.signature.cconv.clone()))
            .collect();
        let want: Vec<(String, String)> = CHECK_EXPORTS
            .iter()
            .map(|(n, c)| (n.to_string(), c.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn expect_eq_reports_which_parts_differ() {
        assert_eq!(
            expect_eq(None, &view("2xi32=1 2"), &view("2xi32=1 2")).unwrap(),
            None
        );
        let m = expect_eq(None, &view("2xi32=1 2"), &view("2xi32=1 3"))
            .unwrap()
            .unwrap();
        assert_eq!(
            m,
            "Expected equality of these values. Contents does not match.\n  lhs:\n    2xi32=1 2\n  rhs:\n    2xi32=1 3"
        );
        let m = expect_eq(None, &view("2xi32=1 2"), &view("1x2xf32=1 2"))
            .unwrap()
            .unwrap();
        assert!(m.starts_with(
            "Expected equality of these values. Element types do not match. Shapes do not match. Contents does not match."
        ), "{m}");
        // Same bytes, different shapes.
        let m = expect_eq(None, &view("2xi32=1 2"), &view("1x2xi32=1 2"))
            .unwrap()
            .unwrap();
        assert!(
            m.starts_with("Expected equality of these values. Shapes do not match.\n"),
            "{m}"
        );
    }

    #[test]
    fn expect_almost_eq_messages_as_upstream() {
        // The failure texts of upstream's check/test/failure.mlir.
        let mismatch = |l: &str, r: &str, atol: f32, rtol: f32| {
            expect_almost_eq(None, &view(l), &view(r), atol, rtol)
                .unwrap()
                .unwrap()
        };
        let m = mismatch("5xf32=1 2 3 4 5", "5xf32=0.999 2 3 4 5", 1e-4, 0.0);
        assert!(m.starts_with("Expected near equality of these values. Contents does not match to tolerance parameters atol=0.0001, rtol=0. The first failure occurs at index 0 as the lhs value 1 differs from the rhs value 0.999 by -1.000e-03.\n"), "{m}");
        let m = mismatch("5xf64=1 2 3 4 5", "5xf64=0.98 2 3 4 5", 1e-2, 0.0);
        assert!(m.contains("atol=0.01, rtol=0. The first failure occurs at index 0 as the lhs value 1 differs from the rhs value 0.98 by -2.000e-02."), "{m}");
        let m = mismatch("2xf16=0 100", "2xf16=0.011 99", 1e-2, 1e-2);
        assert!(m.contains("atol=0.01, rtol=0.01. The first failure occurs at index 0 as the lhs value 0 differs from the rhs value 0.0110016 by 1.100e-02."), "{m}");
        let m = mismatch("2xbf16=0 100", "2xbf16=0.009 98", 1e-2, 1e-2);
        assert!(m.contains("The first failure occurs at index 1 as the lhs value 100 differs from the rhs value 98 by -2.000e+00."), "{m}");
        let m = mismatch("2xf8E5M2=0 100", "2xf8E5M2=0.25 75", 0.1, 0.1);
        assert!(m.contains("atol=0.1, rtol=0.1. The first failure occurs at index 0 as the lhs value 0 differs from the rhs value 0.25 by 2.500e-01."), "{m}");
    }

    #[test]
    fn expect_almost_eq_tolerances() {
        let ok = |l: &str, r: &str, atol: f32, rtol: f32| {
            expect_almost_eq(None, &view(l), &view(r), atol, rtol)
                .unwrap()
                .is_none()
        };
        assert!(ok("3xf32=1 2 3", "3xf32=1.00001 2 3", 1e-4, 0.0));
        assert!(!ok("3xf32=1 2 3", "3xf32=1.001 2 3", 1e-4, 0.0));
        // rtol scales with the rhs (expected) value.
        assert!(ok("1xf32=101", "1xf32=100", 0.0, 0.011));
        assert!(!ok("1xf32=100", "1xf32=101", 0.0, 0.0099));
        // NaN equals NaN; infinities only equal themselves.
        assert!(ok("2xf32=NAN INF", "2xf32=NAN INF", 0.0, 0.0));
        assert!(!ok("1xf32=1", "1xf32=INF", 1e30, 0.0));
        assert!(!ok("1xf32=INF", "1xf32=1", 1.0, 0.0));
        // Mismatched shapes or types fail without comparing contents.
        let m = expect_almost_eq(None, &view("2xf32=1 2"), &view("2xf16=1 2"), 1e-4, 0.0)
            .unwrap()
            .unwrap();
        assert!(
            m.starts_with("Expected near equality of these values. Element types do not match.\n"),
            "{m}"
        );
        // Integers are not supported.
        let e =
            expect_almost_eq(None, &view("2xi32=1 2"), &view("2xi32=1 2"), 1e-4, 0.0).unwrap_err();
        assert!(
            e.to_string().contains("unsupported element type i32"),
            "{e}"
        );
    }

    #[test]
    fn expect_all_true_finds_the_first_zero() {
        assert_eq!(expect_all_true(None, &view("3xi32=1 -1 7")).unwrap(), None);
        assert_eq!(expect_all_true(None, &view("2xf32=0.5 NAN")).unwrap(), None);
        let m = expect_all_true(None, &view("3xi8=1 0 0")).unwrap().unwrap();
        assert_eq!(
            m,
            "Expected all elements to be nonzero; element #1 is 0.\n  operand:\n    3xi8=1 0 0"
        );
        assert!(expect_all_true(None, &view("1xf64=-0")).unwrap().is_some());
        let e = expect_all_true(None, &view("1xf16=1")).unwrap_err();
        assert!(
            e.to_string().contains("unsupported element type f16"),
            "{e}"
        );
    }

    #[test]
    fn sci3_is_cxx_scientific() {
        assert_eq!(format_sci3(-0.001), "-1.000e-03");
        assert_eq!(format_sci3(2.0), "2.000e+00");
        assert_eq!(format_sci3(12345.0), "1.234e+04");
        assert_eq!(format_sci3(1e-100), "1.000e-100");
    }

    /// Calls through the VM: a context with only `check`, invoking its
    /// exports directly, records failures and returns normally.
    #[test]
    fn calls_through_the_vm_record_failures() {
        use ferrite_vm::{Context, Instance, Variant};
        let instance = Instance::default();
        ferrite_hal_module::register_types(instance.types());
        let (m, log) = create_check_module().unwrap();
        let mut ctx = Context::new(&instance);
        ctx.register(m).unwrap();
        let f = ctx.lookup_function("check.expect_true").unwrap();
        ctx.invoke(&f, vec![Variant::I32(3)]).unwrap();
        assert!(log.is_empty());
        ctx.invoke(&f, vec![Variant::I32(0)]).unwrap();
        let f = ctx.lookup_function("check.expect_false").unwrap();
        ctx.invoke(&f, vec![Variant::I32(5)]).unwrap();
        let f = ctx.lookup_function("check.expect_eq").unwrap();
        let (a, b) = (view("2xi32=1 2"), view("2xi32=1 2"));
        ctx.invoke(
            &f,
            vec![
                Variant::Null,
                Variant::Ref(Ref::new(a)),
                Variant::Ref(Ref::new(b)),
            ],
        )
        .unwrap();
        let f = ctx.lookup_function("check.expect_almost_eq").unwrap();
        let (a, b) = (view("1xf32=1"), view("1xf32=2"));
        ctx.invoke(
            &f,
            vec![
                Variant::Null,
                Variant::Ref(Ref::new(a)),
                Variant::Ref(Ref::new(b)),
                Variant::F32(0.5),
                Variant::F32(0.0),
            ],
        )
        .unwrap();
        let failures = log.take();
        assert_eq!(failures.len(), 3, "{failures:?}");
        assert_eq!(failures[0], "Expected 0 to be nonzero.");
        assert_eq!(failures[1], "Expected 5 to be zero.");
        assert!(failures[2].contains("atol=0.5, rtol=0"), "{}", failures[2]);
        // A ref of the wrong type is an error, not a failure.
        let f = ctx.lookup_function("check.expect_eq").unwrap();
        let e = ctx
            .invoke(&f, vec![Variant::Null, Variant::Null, Variant::Null])
            .unwrap_err();
        assert!(e.to_string().contains("lhs"), "{e}");
    }
}
