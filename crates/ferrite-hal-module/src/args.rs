//! Reading `hal` function arguments: typed refs with messages that name
//! the expected type, and variadic spans.

use ferrite_base::{bail, status, Result};
use ferrite_vm::buffer::VmBuffer;
use ferrite_vm::native::ArgReader;
use ferrite_vm::refs::{Ref, RefObject};

/// Reads a non-null ref of type `T`.
pub fn obj<T: RefObject + Clone>(a: &mut ArgReader<'_>, what: &str) -> Result<T> {
    obj_ref(a, what).cloned()
}

/// Borrows a non-null ref argument of type `T` (no copy, no reference
/// count traffic: the call's arguments outlive the reader). Always inlined:
/// left to itself even fat LTO kept it (and [`opt_obj_ref`]) out of line,
/// one call per ref argument, and inlining took ~340 instructions and
/// 47-76 I1 misses off an add call (docs/figures.md, Cost, HR).
#[inline(always)]
pub fn obj_ref<'a, T: RefObject>(a: &mut ArgReader<'a>, what: &str) -> Result<&'a T> {
    match a.a_ref_borrowed() {
        Ok(r) => cast_ref(r, what),
        Err(e) => Err(annotated(e, what)),
    }
}

/// A failed argument read, annotated with what was expected (out of line:
/// the hot readers keep only their success path).
#[cold]
#[inline(never)]
fn annotated(e: ferrite_base::Status, what: &str) -> ferrite_base::Status {
    e.annotate(what.to_string())
}

/// Reads a possibly-null ref of type `T`.
pub fn opt_obj<T: RefObject + Clone>(a: &mut ArgReader<'_>, what: &str) -> Result<Option<T>> {
    Ok(opt_obj_ref(a, what)?.cloned())
}

/// Borrows a possibly-null ref argument of type `T`.
#[inline(always)]
pub fn opt_obj_ref<'a, T: RefObject>(a: &mut ArgReader<'a>, what: &str) -> Result<Option<&'a T>> {
    match a.opt_ref_borrowed()? {
        None => Ok(None),
        Some(r) => cast_ref(r, what).map(Some),
    }
}

/// Downcasts a ref, naming what was expected and what arrived.
pub fn cast<T: RefObject + Clone>(r: &Ref, what: &str) -> Result<T> {
    cast_ref(r, what).cloned()
}

/// Borrows a ref's object as a `T`, naming what was expected and what
/// arrived.
#[inline]
pub fn cast_ref<'r, T: RefObject>(r: &'r Ref, what: &str) -> Result<&'r T> {
    match r.downcast::<T>() {
        Some(t) => Ok(t),
        None => Err(wrong_type(r, what)),
    }
}

#[cold]
#[inline(never)]
fn wrong_type(r: &Ref, what: &str) -> ferrite_base::Status {
    status!(
        InvalidArgument,
        "{what}: expected a different ref type, received !{}",
        r.type_name()
    )
}

/// Reads a non-null `!vm.buffer` as a UTF-8 string (keys, names, formats).
pub fn string(a: &mut ArgReader<'_>, what: &str) -> Result<String> {
    let r = a.a_ref()?;
    let Some(b) = r.downcast::<VmBuffer>() else {
        bail!(
            InvalidArgument,
            "{what}: expected !vm.buffer, received !{}",
            r.type_name()
        );
    };
    b.with_bytes(|s| String::from_utf8_lossy(s).into_owned())
}

/// Reads a non-null `!vm.buffer`.
pub fn vm_buffer(a: &mut ArgReader<'_>, what: &str) -> Result<Ref> {
    let r = a.a_ref().map_err(|e| e.annotate(what.to_string()))?;
    if !r.is::<VmBuffer>() {
        bail!(
            InvalidArgument,
            "{what}: expected !vm.buffer, received !{}",
            r.type_name()
        );
    }
    Ok(r)
}

/// Reads a variadic span: its count, then `count` tuples read by `f`.
pub fn span<T>(
    a: &mut ArgReader<'_>,
    f: impl FnMut(&mut ArgReader<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let n = span_len(a)?;
    // Sized once rather than grown push by push (a dispatch's constants and
    // bindings were two or three reallocations each); the count comes from
    // the program, so the up-front reservation is bounded and a longer span
    // grows as before.
    let mut out = Vec::with_capacity(n.min(SPAN_RESERVE_MAX));
    read_span(a, n, &mut out, f)?;
    Ok(out)
}

/// The most elements [`span`] reserves before reading them.
const SPAN_RESERVE_MAX: usize = 64;

/// A container a variadic span is read into, one element at a time.
pub trait SpanSink<T> {
    /// Appends one element.
    fn push_item(&mut self, item: T);
}

impl<T> SpanSink<T> for Vec<T> {
    #[inline]
    fn push_item(&mut self, item: T) {
        self.push(item);
    }
}

impl<A: smallvec::Array> SpanSink<A::Item> for smallvec::SmallVec<A> {
    #[inline]
    fn push_item(&mut self, item: A::Item) {
        self.push(item);
    }
}

/// Reads a variadic span's element count, refusing a negative one.
#[inline]
pub fn span_len(a: &mut ArgReader<'_>) -> Result<usize> {
    let n = a.i32()?;
    usize::try_from(n).map_err(|_| negative_span(n))
}

#[cold]
#[inline(never)]
fn negative_span(n: i32) -> ferrite_base::Status {
    status!(InvalidArgument, "negative span length {n}")
}

/// [`span`] appended to `out` (e.g. a small vector that spares the
/// allocation on hot paths). The container is filled where it lives: one
/// `push` per element, rather than the generic `Extend` machinery per
/// element and a move of the whole container through the return value.
pub fn span_into<T, C: SpanSink<T>>(
    a: &mut ArgReader<'_>,
    out: &mut C,
    f: impl FnMut(&mut ArgReader<'_>) -> Result<T>,
) -> Result<()> {
    let n = span_len(a)?;
    read_span(a, n, out, f)
}

#[inline]
fn read_span<T, C: SpanSink<T>>(
    a: &mut ArgReader<'_>,
    n: usize,
    out: &mut C,
    mut f: impl FnMut(&mut ArgReader<'_>) -> Result<T>,
) -> Result<()> {
    for _ in 0..n {
        out.push_item(f(a)?);
    }
    Ok(())
}

/// Borrows a ref as a `!vm.buffer`.
pub fn as_vm_buffer<'r>(r: &'r Ref, what: &str) -> Result<&'r VmBuffer> {
    r.downcast::<VmBuffer>().ok_or_else(|| {
        status!(
            InvalidArgument,
            "{what}: expected !vm.buffer, received !{}",
            r.type_name()
        )
    })
}

/// In an in-place entry ([`ferrite_vm::in_place`]): the value, or decline
/// the call (`return Ok(false)`) so that the function's body runs and
/// renders the message, when an argument is not what the entry handles.
macro_rules! or_decline {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return Ok(false),
        }
    };
}
pub(crate) use or_decline;
