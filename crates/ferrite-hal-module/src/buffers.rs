//! `hal.allocator.*`, `hal.buffer.*` and `hal.buffer_view.*`.

use super::args::{
    as_vm_buffer, cast, cast_ref, obj, obj_ref, or_decline, span, span_into, string, vm_buffer,
};
use super::state::ModuleState;
use ferrite_base::{bail, Result};
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::{Buffer, HostMemory};
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal::device::{AllocatorRef, DeviceRef};
use ferrite_hal::element_type::{ElementType, EncodingType};
use ferrite_hal::memory::{BufferUsage, MemoryType};
use ferrite_vm::buffer::{SharedBytes, VmBuffer};
use ferrite_vm::native::{ArgReader, NativeModuleBuilder};
use ferrite_vm::{Ref, Variant};
use smallvec::SmallVec;
use std::sync::Arc;

/// Alignment imported host bytes must have to be used in place: CPU kernels
/// assume 64-byte aligned bindings (aligned vector loads fault otherwise).
pub const IMPORT_ALIGNMENT: usize = 64;

/// A range of a read-only `vm.buffer`'s shared bytes, imported in place.
struct SharedRange {
    bytes: SharedBytes,
    start: usize,
    end: usize,
}

impl SharedRange {
    /// The bytes `offset..offset + length` of `src` when `src` is a
    /// read-only view and they start on an [`IMPORT_ALIGNMENT`] boundary;
    /// `None` otherwise. The range was checked against `src.len()`.
    fn of(src: &VmBuffer, offset: u64, length: u64) -> Option<SharedRange> {
        let (bytes, range) = src.shared_view()?;
        let start = range.start.checked_add(usize::try_from(offset).ok()?)?;
        let end = start.checked_add(usize::try_from(length).ok()?)?;
        let all = (**bytes).as_ref();
        if end > range.end || end > all.len() {
            return None;
        }
        let aligned = (all.as_ptr() as usize).wrapping_add(start) % IMPORT_ALIGNMENT == 0;
        aligned.then(|| SharedRange {
            bytes: bytes.clone(),
            start,
            end,
        })
    }
}

impl AsRef<[u8]> for SharedRange {
    fn as_ref(&self) -> &[u8] {
        &(*self.bytes).as_ref()[self.start..self.end]
    }
}

fn params(memory_types: i32, usage: i32, affinity: i64) -> BufferParams {
    BufferParams {
        memory_type: MemoryType::from_bits_retain(memory_types as u32),
        usage: BufferUsage::from_bits_retain(usage as u32),
        queue_affinity: affinity as u64,
        ..BufferParams::default()
    }
}

pub(super) fn register(
    b: NativeModuleBuilder,
    shared: &Arc<ModuleState>,
) -> Result<NativeModuleBuilder> {
    let _ = shared;
    b.function("allocator.allocate", "0rIiiI_r", |c| {
        let mut a = ArgReader::new(c);
        let alloc: AllocatorRef = obj(&mut a, "allocator")?;
        let affinity = a.i64()?;
        let (types, usage, size) = (a.i32()?, a.i32()?, a.i64()?);
        let buffer = alloc.0.allocate(&params(types, usage, affinity), size as u64)?;
        c.ready_ref(Ref::new(buffer))
    })?
    .function("allocator.import", "0riIiirII_r", |c| {
        let mut a = ArgReader::new(c);
        let alloc: AllocatorRef = obj(&mut a, "allocator")?;
        let is_try = a.i32()? != 0;
        let affinity = a.i64()?;
        let (types, usage) = (a.i32()?, a.i32()?);
        let source = vm_buffer(&mut a, "source")?;
        let (offset, length) = (a.i64()? as u64, a.i64()? as u64);
        let src = as_vm_buffer(&source, "source")?;
        let end = offset.checked_add(length).filter(|&e| e <= src.len());
        let Some(_) = end else {
            bail!(OutOfRange, "import range {offset}+{length} exceeds the source's {} bytes", src.len());
        };
        let p = params(types, usage, affinity);
        // Read-only shared bytes (module rodata, memory-mapped or static) are
        // imported in place when kernels may bind them as they are: the
        // buffer keeps the bytes alive and stays read-only whatever was asked.
        if let Some(view) = SharedRange::of(src, offset, length) {
            let memory = if p.usage.contains(BufferUsage::SHARING_IMMUTABLE) {
                // SAFETY: the program imports these bytes for constant use
                // (SHARING_IMMUTABLE, as upstream requires of an immutable
                // source); the compiler emits that usage only for constants
                // its dispatches never write.
                unsafe { HostMemory::program_constant(Arc::new(view)) }
            } else {
                HostMemory::ReadOnly(Arc::new(view))
            };
            if let Ok(b) = alloc.0.import_host(&p, memory) {
                return c.ready_ref(Ref::new(b));
            }
        }
        // Otherwise one copy, straight from the source's bytes into an
        // allocator block (64-byte aligned, as kernels expect).
        let imported = alloc.0.allocate(&p, length).and_then(|b| {
            src.with_bytes(|bytes| b.write(0, &bytes[offset as usize..(offset + length) as usize]))??;
            Ok(b)
        });
        match imported {
            Ok(b) => c.ready_ref(Ref::new(b)),
            Err(_) if is_try => c.ready_one(Variant::Null),
            Err(e) => Err(e),
        }
    })?
    .function("allocator.select", "0iiICrID_rI", |c| {
        let mut a = ArgReader::new(c);
        let (_types, _usage, _flags) = (a.i32()?, a.i32()?, a.i64()?);
        let pairs = span(&mut a, |a| Ok((obj::<DeviceRef>(a, "device")?, a.i64()?)))?;
        let Some((device, affinity)) = pairs.into_iter().next() else {
            bail!(NotFound, "no devices to select from");
        };
        c.ready([Variant::Ref(Ref::new(device)), Variant::I64(affinity)])
    })?
    .function("buffer.assert", "0rrrIii_v", |c| {
        if buffer_assert_passes(&mut ArgReader::new(c))? {
            return c.ready_none();
        }
        // Failing: read again, now rendering the message for the error.
        let mut a = ArgReader::new(c);
        let buffer = a.opt_ref()?;
        let message = string(&mut a, "message")?;
        let _alloc: &AllocatorRef = obj_ref(&mut a, "allocator")?;
        let (min_len, types, usage) = (a.i64()? as u64, a.i32()?, a.i32()?);
        let Some(buffer) = buffer else {
            bail!(InvalidArgument, "{message} buffer is null");
        };
        let buffer: Buffer = cast(&buffer, &message)?;
        if buffer.byte_length() < min_len {
            bail!(
                OutOfRange,
                "{message} buffer byte length {} less than expected minimum {min_len}",
                buffer.byte_length()
            );
        }
        buffer.validate_memory_type(MemoryType::from_bits_retain(types as u32))?;
        buffer.validate_usage(BufferUsage::from_bits_retain(usage as u32))?;
        c.ready_none()
    })?
    .in_place(|c| {
        // Passing asserts only; a failing one declines (the body renders
        // its message).
        let mut a = c.args();
        let buffer = or_decline!(a.opt_ref());
        let _message = or_decline!(a.a_ref());
        let _alloc: &AllocatorRef = or_decline!(a.obj());
        let (min_len, types, usage) = (or_decline!(a.i64()), or_decline!(a.i32()), or_decline!(a.i32()));
        let buffer = or_decline!(buffer.and_then(|b| b.downcast::<Buffer>()));
        if !(buffer_passes(buffer, min_len as u64, types, usage) && c.no_results()) {
            return Ok(false);
        }
        c.finish();
        Ok(true)
    })?
    .function("buffer.allocation.preserve", "0r_v", |c| {
        let mut a = ArgReader::new(c);
        let _: Buffer = obj(&mut a, "buffer")?;
        c.ready_none()
    })?
    .function("buffer.allocation.discard", "0r_i", |c| {
        let mut a = ArgReader::new(c);
        let _: Buffer = obj(&mut a, "buffer")?;
        c.ready_i32(1)
    })?
    .function("buffer.allocation.is_terminal", "0r_i", |c| {
        let mut a = ArgReader::new(c);
        let r = a.a_ref()?;
        let _: Buffer = cast(&r, "buffer")?;
        // Terminal when the call's reference (handed over, not shared
        // with a live register) is the only one besides this read's.
        let terminal = a.last_ref_owned() && r.strong_count() <= 2;
        c.ready_i32(terminal as i32)
    })?
    .function("buffer.subspan", "0rII_r", |c| {
        let mut a = ArgReader::new(c);
        let buffer: Buffer = obj(&mut a, "source buffer")?;
        let (offset, length) = (a.i64()? as u64, a.i64()? as u64);
        let sub = buffer.subspan(offset, length).map_err(|e| {
            e.annotate(format!(
                "invalid subspan of an existing buffer (source_offset={offset}, length={length})"
            ))
        })?;
        c.ready_ref(Ref::new(sub))
    })?
    .function("buffer.length", "0r_I", |c| {
        let mut a = ArgReader::new(c);
        let buffer: Buffer = obj(&mut a, "buffer")?;
        c.ready_one(Variant::I64(buffer.byte_length() as i64))
    })?
    .function("buffer.load", "0rIi_i", |c| {
        let mut a = ArgReader::new(c);
        let buffer: Buffer = obj(&mut a, "source buffer")?;
        let (offset, length) = (a.i64()? as u64, a.i32()?);
        if !(0..=4).contains(&length) {
            bail!(InvalidArgument, "load length byte count {length} exceeds max");
        }
        let mut v = [0u8; 4];
        buffer.read(offset, &mut v[..length as usize])?;
        c.ready_i32(i32::from_le_bytes(v))
    })?
    .function("buffer.store", "0irIi_v", |c| {
        let mut a = ArgReader::new(c);
        let value = a.i32()?;
        let buffer: Buffer = obj(&mut a, "target buffer")?;
        let (offset, length) = (a.i64()? as u64, a.i32()?);
        if !(0..=4).contains(&length) {
            bail!(InvalidArgument, "store length byte count {length} exceeds max");
        }
        if offset.saturating_add(length as u64) > buffer.byte_length() {
            bail!(
                OutOfRange,
                "store out of bounds (target_offset={offset}, length={length} into max {})",
                buffer.byte_length()
            );
        }
        buffer.write(offset, &value.to_le_bytes()[..length as usize])?;
        c.ready_none()
    })?
    .function("buffer_view.create", "0rIIiiCID_r", |c| {
        let mut a = ArgReader::new(c);
        let source = a.a_ref_borrowed()?;
        let buffer: &Buffer = cast_ref(source, "source buffer")?;
        let (offset, length) = (a.i64()? as u64, a.i64()? as u64);
        let (et, enc) = (a.i32()? as u32, a.i32()? as u32);
        let mut shape = SmallVec::<[u64; 4]>::new();
        span_into(&mut a, &mut shape, |a| Ok(a.i64()? as u64))?;
        let (et, enc) = (ElementType(et), EncodingType(enc));
        let view = if offset != 0 || length != buffer.byte_length() {
            let sub = buffer.subspan(offset, length).map_err(|e| {
                e.annotate(format!(
                    "invalid subspan of an existing buffer (source_offset={offset}, length={length})"
                ))
            })?;
            BufferView::new(sub, &shape, et, enc)?
        } else {
            // The whole buffer: the view shares the caller's object, so
            // `buffer_view.buffer` returns a ref equal to `source`. A source
            // the caller hands over (its last use) moves into the view.
            let shared = match c.take_owned_ref(0) {
                Some(r) => r.into_arc::<Buffer>(),
                None => ArgReader::new(c).a_ref_borrowed()?.downcast_arc::<Buffer>(),
            };
            let Some(shared) = shared else {
                bail!(InvalidArgument, "source buffer: expected !hal.buffer");
            };
            BufferView::over_shared(shared, &shape, et, enc)?
        };
        c.ready_ref(Ref::new(view))
    })?
    .in_place(|c| {
        // A view over a whole buffer (a subspan declines: the body handles
        // it and its message).
        let out = or_decline!(c.ref_result());
        let mut a = c.args();
        let buffer: &Buffer = or_decline!(a.obj());
        let (offset, length) = (or_decline!(a.i64()) as u64, or_decline!(a.i64()) as u64);
        let (et, enc) = (or_decline!(a.i32()) as u32, or_decline!(a.i32()) as u32);
        let n = or_decline!(a.count());
        let mut shape = SmallVec::<[u64; 4]>::new();
        for _ in 0..n {
            shape.push(or_decline!(a.i64()) as u64);
        }
        if offset != 0 || length != buffer.byte_length() {
            return Ok(false);
        }
        let (et, enc) = (ElementType(et), EncodingType(enc));
        // As the body: a source the caller hands over moves into the view.
        let shared = match c.take_moved_ref(0) {
            Some(r) => r.into_arc::<Buffer>(),
            None => c.args().a_ref().and_then(|r| r.downcast_arc::<Buffer>()),
        };
        let Some(shared) = shared else {
            bail!(InvalidArgument, "source buffer: expected !hal.buffer");
        };
        let view = BufferView::over_shared(shared, &shape, et, enc)?;
        c.finish_ref(out, Ref::new(view));
        Ok(true)
    })?
    .function("buffer_view.assert", "0rriiCID_v", |c| {
        if view_assert_passes(&mut ArgReader::new(c))? {
            return c.ready_none();
        }
        // Failing: read again, now rendering the message for the error.
        let mut a = ArgReader::new(c);
        let view = a.opt_ref()?;
        let message = string(&mut a, "message")?;
        let (et, enc) = (a.i32()? as u32, a.i32()? as u32);
        let shape = span(&mut a, |a| Ok(a.i64()? as u64))?;
        assert_view(view, &message, ElementType(et), EncodingType(enc), &shape)?;
        c.ready_none()
    })?
    .in_place(|c| {
        // As `buffer.assert`'s entry: passing asserts only.
        let mut a = c.args();
        let view = or_decline!(a.opt_ref());
        let _message = or_decline!(a.a_ref());
        let (et, enc) = (or_decline!(a.i32()), or_decline!(a.i32()));
        let rank = or_decline!(a.i32());
        let view = or_decline!(view.and_then(|v| v.downcast::<BufferView>()));
        if !view_header_matches(view, ElementType(et as u32), EncodingType(enc as u32), rank) {
            return Ok(false);
        }
        for &have in view.shape() {
            if or_decline!(a.i64()) as u64 != have {
                return Ok(false);
            }
        }
        if !c.no_results() {
            return Ok(false);
        }
        c.finish();
        Ok(true)
    })?
    .function("buffer_view.buffer", "0r_r", |c| {
        let mut a = ArgReader::new(c);
        let view: &BufferView = obj_ref(&mut a, "buffer view")?;
        c.ready_ref(Ref::from_arc(view.shared_buffer()))
    })?
    .in_place(|c| {
        let out = or_decline!(c.ref_result());
        let view: &BufferView = or_decline!(c.args().obj());
        let buffer = Ref::from_arc(view.shared_buffer());
        c.finish_ref(out, buffer);
        Ok(true)
    })?
    .function("buffer_view.element_type", "0r_i", |c| {
        let mut a = ArgReader::new(c);
        let view: &BufferView = obj_ref(&mut a, "buffer view")?;
        c.ready_i32(view.element_type().0 as i32)
    })?
    .function("buffer_view.encoding_type", "0r_i", |c| {
        let mut a = ArgReader::new(c);
        let view: &BufferView = obj_ref(&mut a, "buffer view")?;
        c.ready_i32(view.encoding_type().0 as i32)
    })?
    .function("buffer_view.rank", "0r_i", |c| {
        let mut a = ArgReader::new(c);
        let view: &BufferView = obj_ref(&mut a, "buffer view")?;
        c.ready_i32(view.rank() as i32)
    })?
    .function("buffer_view.dim", "0ri_I", |c| {
        let mut a = ArgReader::new(c);
        let view: &BufferView = obj_ref(&mut a, "buffer view")?;
        let i = a.i32()?;
        let Some(d) = usize::try_from(i).ok().and_then(|i| view.shape().get(i)) else {
            bail!(OutOfRange, "dimension index {i} out of range (rank {})", view.rank());
        };
        c.ready_one(Variant::I64(*d as i64))
    })?
    .function("buffer_view.trace", "0rCrD_v", {
        let shared = shared.clone();
        move |c| {
            let mut a = ArgReader::new(c);
            let key = string(&mut a, "trace key")?;
            let views = span(&mut a, |a| obj::<BufferView>(a, "buffer view"))?;
            if let Some(sink) = &shared.options.trace_sink {
                sink(&key, &views)?;
            }
            c.ready_none()
        }
    })
}

/// The common case of `buffer.assert`, without rendering its message:
/// true when every check passes (false sends the caller down the path that
/// reports the failure).
fn buffer_assert_passes(a: &mut ArgReader<'_>) -> Result<bool> {
    let buffer = a.opt_ref_borrowed()?;
    let _message = a.a_ref_borrowed()?;
    let _alloc: &AllocatorRef = obj_ref(a, "allocator")?;
    let (min_len, types, usage) = (a.i64()? as u64, a.i32()?, a.i32()?);
    let Some(buffer) = buffer.and_then(|b| b.downcast::<Buffer>()) else {
        return Ok(false);
    };
    Ok(buffer_passes(buffer, min_len, types, usage))
}

/// Whether `buffer` passes `buffer.assert` (length, memory type, usage).
#[inline]
fn buffer_passes(buffer: &Buffer, min_len: u64, types: i32, usage: i32) -> bool {
    buffer.byte_length() >= min_len
        && buffer
            .validate_memory_type(MemoryType::from_bits_retain(types as u32))
            .is_ok()
        && buffer
            .validate_usage(BufferUsage::from_bits_retain(usage as u32))
            .is_ok()
}

/// Whether `view` has the element type, encoding and rank
/// `buffer_view.assert` expects (its dimensions are checked after).
#[inline]
fn view_header_matches(view: &BufferView, et: ElementType, enc: EncodingType, rank: i32) -> bool {
    element_types_compatible(view.element_type(), et)
        && view.encoding_type() == enc
        && usize::try_from(rank).ok() == Some(view.rank())
}

/// The common case of `buffer_view.assert` (see [`buffer_assert_passes`]).
fn view_assert_passes(a: &mut ArgReader<'_>) -> Result<bool> {
    let view = a.opt_ref_borrowed()?;
    let _message = a.a_ref_borrowed()?;
    let (et, enc) = (ElementType(a.i32()? as u32), EncodingType(a.i32()? as u32));
    let rank = a.i32()?;
    let Some(view) = view.and_then(|v| v.downcast::<BufferView>()) else {
        return Ok(false);
    };
    if !view_header_matches(view, et, enc, rank) {
        return Ok(false);
    }
    for &have in view.shape() {
        if a.i64()? as u64 != have {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Checks a program-supplied view against its expected type and shape,
/// with upstream's messages (`input0 shape dimension 0 mismatch; ...`).
fn assert_view(
    view: Option<Ref>,
    message: &str,
    et: ElementType,
    enc: EncodingType,
    shape: &[u64],
) -> Result<()> {
    let Some(view) = view else {
        bail!(
            InvalidArgument,
            "{message} is null; expected a tensor<{}>",
            shape_text(shape, et)
        );
    };
    let Some(view) = view.downcast::<BufferView>() else {
        bail!(
            InvalidArgument,
            "{message} is a !{}; expected a tensor (!hal.buffer_view)",
            view.type_name()
        );
    };
    if !element_types_compatible(view.element_type(), et) {
        bail!(
            InvalidArgument,
            "{message} element type mismatch; expected {} ({:08X}) but have {} ({:08X})",
            et,
            et.0,
            view.element_type(),
            view.element_type().0
        );
    }
    if view.encoding_type() != enc {
        bail!(
            InvalidArgument,
            "{message} encoding mismatch; expected {:08X} but have {:08X}",
            enc.0,
            view.encoding_type().0
        );
    }
    if view.rank() != shape.len() {
        bail!(
            InvalidArgument,
            "{message} shape rank mismatch; expected {} but have {}; expected shape `{}`, actual shape `{}`",
            shape.len(),
            view.rank(),
            ferrite_hal::buffer_view::format_shape(shape),
            ferrite_hal::buffer_view::format_shape(view.shape())
        );
    }
    for (i, (want, have)) in shape.iter().zip(view.shape()).enumerate() {
        if want != have {
            bail!(
                InvalidArgument,
                "{message} shape dimension {i} mismatch; expected {want} but have {have}; expected shape `{}`, actual shape `{}`",
                ferrite_hal::buffer_view::format_shape(shape),
                ferrite_hal::buffer_view::format_shape(view.shape())
            );
        }
    }
    Ok(())
}

fn shape_text(shape: &[u64], et: ElementType) -> String {
    let mut s: String = shape.iter().map(|d| format!("{d}x")).collect();
    s.push_str(&et.to_string());
    s
}

/// Whether a view of `actual` satisfies an `expected` element type: opaque
/// data matches anything, and integers of one width match regardless of
/// signedness (a signless `i32` accepts `si32` and `ui32`), as upstream.
pub fn element_types_compatible(actual: ElementType, expected: ElementType) -> bool {
    let numerical = |t: ElementType| (t.0 >> 24) as u8;
    let is_integer = |t: ElementType| numerical(t) & 0xF0 == 0x10;
    actual == expected
        || numerical(actual) == 0
        || (is_integer(actual)
            && is_integer(expected)
            && actual.bit_count() == expected.bit_count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signless_integers_accept_either_signedness() {
        assert!(element_types_compatible(
            ElementType::SINT_32,
            ElementType::INT_32
        ));
        assert!(element_types_compatible(
            ElementType::UINT_32,
            ElementType::INT_32
        ));
        assert!(!element_types_compatible(
            ElementType::SINT_16,
            ElementType::INT_32
        ));
        assert!(!element_types_compatible(
            ElementType::FLOAT_32,
            ElementType::INT_32
        ));
        assert!(element_types_compatible(
            ElementType::OPAQUE_32,
            ElementType::FLOAT_32
        ));
    }

    /// 256 bytes on a 64-byte boundary.
    #[repr(C, align(64))]
    struct Aligned([u8; 256]);

    impl AsRef<[u8]> for Aligned {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    #[test]
    fn rodata_is_imported_in_place_only_when_aligned_and_read_only() {
        let mut data = Aligned([0; 256]);
        data.0
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        let shared: SharedBytes = Arc::new(data);
        let base = (*shared).as_ref().as_ptr();
        // A view starting 64 bytes in: offsets 0 and 64 within it are
        // aligned, 8 is not.
        let view = VmBuffer::from_shared(shared.clone(), 64..256).unwrap();
        let r = SharedRange::of(&view, 64, 32).expect("aligned range imports in place");
        assert_eq!(r.as_ref().as_ptr(), base.wrapping_add(128));
        assert_eq!(
            r.as_ref(),
            &(128..160).map(|i| i as u8).collect::<Vec<_>>()[..]
        );
        assert!(SharedRange::of(&view, 0, 192).is_some());
        assert!(
            SharedRange::of(&view, 8, 32).is_none(),
            "misaligned: copied"
        );
        assert!(SharedRange::of(&view, 64, 129).is_none(), "past the view");
        // Owned (mutable) buffers are always copied.
        let owned = VmBuffer::from_vec(vec![0; 256], true);
        assert!(SharedRange::of(&owned, 0, 64).is_none());
    }
}
