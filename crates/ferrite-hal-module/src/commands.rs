//! `hal.command_buffer.*` and `hal.executable.*`.

use super::args::{as_vm_buffer, obj, opt_obj, span, string, vm_buffer};
use super::state::{ModuleState, COMMAND_RESERVE_MAX};
use ferrite_base::{bail, Result};
use ferrite_hal::buffer::Buffer;
use ferrite_hal::channel::{ChannelRef, CollectiveOp};
use ferrite_hal::command_buffer::{BufferRef, CommandBuffer};
use ferrite_hal::device::DeviceRef;
use ferrite_hal::executable::ExecutableRef;
use ferrite_vm::native::{ArgReader, NativeModuleBuilder};
use ferrite_vm::stack::{NativeCall, NativePoll};
use ferrite_vm::{Ref, Variant};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A buffer operand that is either a direct buffer (non-null) or a binding
/// table slot (null buffer).
fn buffer_ref(buffer: Option<Buffer>, slot: i32, offset: i64, length: i64) -> BufferRef {
    let (offset, length) = (offset as u64, length as u64);
    match buffer {
        Some(buffer) => BufferRef::Direct {
            buffer,
            offset,
            length,
        },
        None => BufferRef::Slot {
            slot: slot as u32,
            offset,
            length,
        },
    }
}

/// The command buffer argument, borrowed from the call's registers (no
/// reference count traffic: a decode step of an LLM records ~900 commands,
/// each of which cloned and dropped the ref twice).
fn cb<'a>(a: &mut ArgReader<'a>) -> Result<&'a CommandBuffer> {
    let r = a.a_ref_borrowed()?;
    r.downcast::<CommandBuffer>().ok_or_else(|| {
        ferrite_base::status!(
            InvalidArgument,
            "expected !hal.command_buffer, received !{}",
            r.type_name()
        )
    })
}

fn dispatch_tail(a: &mut ArgReader<'_>) -> Result<(Vec<u32>, Vec<BufferRef>)> {
    let constants = span(a, |a| Ok(a.i32()? as u32))?;
    let bindings = span(a, |a| {
        let _ordinal = a.i32()?;
        let slot = a.i32()?;
        let buffer: Option<Buffer> = opt_obj(a, "dispatch binding buffer")?;
        let (offset, length) = (a.i64()?, a.i64()?);
        Ok(buffer_ref(buffer, slot, offset, length))
    })?;
    Ok((constants, bindings))
}

/// `command_buffer.flush_buffer` and `command_buffer.invalidate_buffer`:
/// host memory is coherent, so there is nothing to flush or invalidate; the
/// operands are still read and type-checked.
fn coherent_range(c: &mut NativeCall<'_>) -> Result<NativePoll> {
    let mut a = ArgReader::new(c);
    cb(&mut a)?;
    let _slot = a.i32()?;
    let _buffer: Option<Buffer> = opt_obj(&mut a, "buffer")?;
    let (_offset, _length) = (a.i64()?, a.i64()?);
    c.ready_none()
}

pub(super) fn register(
    b: NativeModuleBuilder,
    shared: &Arc<ModuleState>,
) -> Result<NativeModuleBuilder> {
    let (on_create, on_finalize) = (shared.clone(), shared.clone());
    b.function("command_buffer.create", "0riiIi_r", move |c| {
        let mut a = ArgReader::new(c);
        let _device: DeviceRef = obj(&mut a, "device")?;
        let (modes, categories, affinity, capacity) = (a.i32()?, a.i32()?, a.i64()?, a.i32()?);
        let cb = CommandBuffer::new(
            modes as u32,
            categories as u32,
            affinity as u64,
            capacity as u32,
        );
        let hint = on_create.command_hint.load(Ordering::Relaxed);
        if hint > 0 {
            cb.reserve(hint);
        }
        c.ready_ref(Ref::new(cb))
    })?
    .function("command_buffer.finalize", "0r_v", move |c| {
        let cb = cb(&mut ArgReader::new(c))?;
        cb.finalize()?;
        let count = cb.command_count().min(COMMAND_RESERVE_MAX);
        on_finalize.command_hint.store(count, Ordering::Relaxed);
        c.ready_none()
    })?
    .function("command_buffer.begin_debug_group", "0rr_v", |c| {
        let mut a = ArgReader::new(c);
        cb(&mut a)?;
        let _label = string(&mut a, "debug group label")?;
        c.ready_none()
    })?
    .function("command_buffer.end_debug_group", "0r_v", |c| {
        cb(&mut ArgReader::new(c))?;
        c.ready_none()
    })?
    .function("command_buffer.execution_barrier", "0riiI_v", |c| {
        let mut a = ArgReader::new(c);
        let cb = cb(&mut a)?;
        let (_src, _dst, _flags) = (a.i32()?, a.i32()?, a.i64()?);
        cb.execution_barrier()?;
        c.ready_none()
    })?
    .function("command_buffer.advise_buffer", "0rrIIIi_v", |c| {
        // Host memory is coherent: advice has nothing to do.
        let mut a = ArgReader::new(c);
        cb(&mut a)?;
        let _buffer: Option<Buffer> = opt_obj(&mut a, "buffer")?;
        let (_flags, _a0, _a1, _slot) = (a.i64()?, a.i64()?, a.i64()?, a.i32()?);
        c.ready_none()
    })?
    .function("command_buffer.flush_buffer", "0rirII_v", coherent_range)?
    .function(
        "command_buffer.invalidate_buffer",
        "0rirII_v",
        coherent_range,
    )?
    .function("command_buffer.fill_buffer", "0rrIIiIiI_v", |c| {
        let mut a = ArgReader::new(c);
        let cb = cb(&mut a)?;
        let target: Option<Buffer> = opt_obj(&mut a, "target buffer")?;
        let (offset, length, slot) = (a.i64()?, a.i64()?, a.i32()?);
        let (pattern, pattern_length, _flags) = (a.i64()?, a.i32()?, a.i64()?);
        cb.fill_buffer(
            buffer_ref(target, slot, offset, length),
            pattern as u64,
            pattern_length as u32,
        )?;
        c.ready_none()
    })?
    .function("command_buffer.update_buffer", "0rrIrIIiI_v", |c| {
        let mut a = ArgReader::new(c);
        let cb = cb(&mut a)?;
        let source = vm_buffer(&mut a, "source buffer")?;
        let source_offset = a.i64()? as u64;
        let target: Option<Buffer> = opt_obj(&mut a, "target buffer")?;
        let (offset, length, slot, _flags) = (a.i64()?, a.i64()?, a.i32()?, a.i64()?);
        let src = as_vm_buffer(&source, "source buffer")?;
        let mut data = vec![0u8; length as usize];
        src.read(source_offset, &mut data)?;
        cb.update_buffer(data, buffer_ref(target, slot, offset, length))?;
        c.ready_none()
    })?
    .function("command_buffer.copy_buffer", "0riirIrIII_v", |c| {
        let mut a = ArgReader::new(c);
        let cb = cb(&mut a)?;
        let (source_slot, target_slot) = (a.i32()?, a.i32()?);
        let source: Option<Buffer> = opt_obj(&mut a, "source buffer")?;
        let source_offset = a.i64()?;
        let target: Option<Buffer> = opt_obj(&mut a, "target buffer")?;
        let (target_offset, length, _flags) = (a.i64()?, a.i64()?, a.i64()?);
        cb.copy_buffer(
            buffer_ref(source, source_slot, source_offset, length),
            buffer_ref(target, target_slot, target_offset, length),
        )?;
        c.ready_none()
    })?
    .function("command_buffer.collective", "0rriiiirrIIIII_v", |c| {
        let mut a = ArgReader::new(c);
        let cb = cb(&mut a)?;
        let channel: ChannelRef = obj(&mut a, "channel")?;
        let op = CollectiveOp::from_packed(a.i32()? as u32)?;
        let param = a.i32()? as u32;
        let (send_slot, recv_slot) = (a.i32()?, a.i32()?);
        let send: Option<Buffer> = opt_obj(&mut a, "send buffer")?;
        let recv: Option<Buffer> = opt_obj(&mut a, "recv buffer")?;
        let (send_offset, send_length) = (a.i64()?, a.i64()?);
        let (recv_offset, recv_length) = (a.i64()?, a.i64()?);
        let element_count = a.i64()?;
        if element_count < 0 {
            bail!(
                InvalidArgument,
                "collective element count {element_count} is negative"
            );
        }
        // A null buffer names a binding table slot; an operand the kind does
        // not use is dropped rather than resolved.
        let send = op
            .kind
            .uses_send()
            .then(|| buffer_ref(send, send_slot, send_offset, send_length));
        let recv = op
            .kind
            .uses_recv()
            .then(|| buffer_ref(recv, recv_slot, recv_offset, recv_length));
        cb.collective(channel, op, param, send, recv, element_count as u64)?;
        c.ready_none()
    })?
    .function("command_buffer.dispatch", "0rrIiiiICiDCiirIID_v", |c| {
        let mut a = ArgReader::new(c);
        let cb = cb(&mut a)?;
        let exe: ExecutableRef = obj(&mut a, "executable")?;
        let function = a.i64()?;
        let workgroups = [a.i32()? as u32, a.i32()? as u32, a.i32()? as u32];
        let _flags = a.i64()?;
        let (constants, bindings) = dispatch_tail(&mut a)?;
        cb.dispatch(exe, function as u32, workgroups, None, constants, bindings)?;
        c.ready_none()
    })?
    .function(
        "command_buffer.dispatch.indirect",
        "0rrIirIICiDCiirIID_v",
        |c| {
            let mut a = ArgReader::new(c);
            let cb = cb(&mut a)?;
            let exe: ExecutableRef = obj(&mut a, "executable")?;
            let function = a.i64()?;
            let slot = a.i32()?;
            let wg_buffer: Option<Buffer> = opt_obj(&mut a, "workgroup count buffer")?;
            let (wg_offset, _flags) = (a.i64()?, a.i64()?);
            let (constants, bindings) = dispatch_tail(&mut a)?;
            let indirect = buffer_ref(wg_buffer, slot, wg_offset, 12);
            cb.dispatch(
                exe,
                function as u32,
                [0; 3],
                Some(indirect),
                constants,
                bindings,
            )?;
            c.ready_none()
        },
    )?
    .function("executable.create", "0rIrrr_r", |c| {
        let mut a = ArgReader::new(c);
        let device: DeviceRef = obj(&mut a, "device")?;
        let _affinity = a.i64()?;
        let format = string(&mut a, "executable format")?;
        let data = vm_buffer(&mut a, "executable data")?;
        let constants = match a.opt_ref()? {
            Some(r) => {
                let b = as_vm_buffer(&r, "executable constants")?;
                b.with_bytes(|s| {
                    s.chunks_exact(4)
                        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                        .collect()
                })?
            }
            None => Vec::new(),
        };
        let data = as_vm_buffer(&data, "executable data")?;
        let exe =
            data.with_bytes(|bytes| device.0.create_executable(&format, bytes, &constants))??;
        c.ready_ref(Ref::new(ExecutableRef(exe)))
    })?
    .function("executable.lookup.function", "0rr_I", |c| {
        let mut a = ArgReader::new(c);
        let exe: ExecutableRef = obj(&mut a, "executable")?;
        let name = string(&mut a, "function name")?;
        match exe.0.lookup_export(&name) {
            Some(i) => c.ready_one(Variant::I64(i as i64)),
            None => bail!(
                NotFound,
                "executable has no export named '{name}' (exports: {})",
                exe.0
                    .exports()
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    })
}
