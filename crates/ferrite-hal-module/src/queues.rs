//! `hal.devices.*`, `hal.device.*` (allocator, queries, queue operations),
//! `hal.ex.file.from_memory` and the collective channels `hal.channel.*`.

use super::args::{
    as_vm_buffer, obj, obj_ref, opt_obj_ref, or_decline, span_into, string, vm_buffer,
};
use super::state::ModuleState;
use ferrite_base::{bail, Result};
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::channel::{ChannelParams, ChannelRef};
use ferrite_hal::command_buffer::{Binding, BindingTable, CommandBuffer};
use ferrite_hal::device::{queue, DeviceRef};
use ferrite_hal::fence::Fence;
use ferrite_hal::memory::{BufferUsage, MemoryType};
use ferrite_vm::in_place::InPlaceArgs;
use ferrite_vm::native::{ArgReader, NativeModuleBuilder};
use ferrite_vm::refs::RefObject;
use ferrite_vm::{Ref, Variant};
use std::sync::Arc;

/// A file (`hal.file`): host memory (a `vm.buffer`) that queue reads and
/// writes transfer from and to.
#[derive(Clone)]
pub struct File {
    memory: Ref,
    offset: u64,
    length: u64,
    access: u32,
}

impl RefObject for File {
    fn type_name(&self) -> &'static str {
        "hal.file"
    }
}

const FILE_READ: u32 = 1 << 0;
const FILE_WRITE: u32 = 1 << 1;

/// A binding table of uncounted copies of buffers the call's arguments
/// hold: building it takes no reference counts (atomic updates) and
/// dropping it releases none. The copies are forgotten, never dropped; the
/// table must not outlive the call (see `device.queue.execute.indirect`),
/// and whatever keeps a binding past it clones it (a counted reference).
struct BorrowedBindings(BindingTable);

impl Drop for BorrowedBindings {
    fn drop(&mut self) {
        // SAFETY: the entries are uncounted copies (see above): forgetting
        // them, without running their drops, is their only correct end.
        // Length 0 is always within capacity.
        unsafe { self.0.set_len(0) }
    }
}

impl super::args::SpanSink<Binding> for BorrowedBindings {
    #[inline]
    fn push_item(&mut self, item: Binding) {
        self.0.push(item);
    }
}

/// Reads `(device, affinity, wait fence, signal fence)`, the head of every
/// queue operation, borrowing them from the call's arguments. Null fences
/// mean "no wait" and "nothing to signal" (the shared empty fence).
fn queue_head<'a>(
    a: &mut ArgReader<'a>,
) -> Result<(
    &'a Arc<dyn ferrite_hal::device::Device>,
    &'a Fence,
    &'a Fence,
)> {
    let device: &DeviceRef = obj_ref(a, "device")?;
    let _affinity = a.i64()?;
    let wait: Option<&Fence> = opt_obj_ref(a, "wait fence")?;
    let signal: Option<&Fence> = opt_obj_ref(a, "signal fence")?;
    Ok((
        &device.0,
        wait.unwrap_or(Fence::empty()),
        signal.unwrap_or(Fence::empty()),
    ))
}

/// [`queue_head`] for in-place entries (`None`: decline).
#[inline(always)]
fn queue_head_in_place<'a>(
    a: &mut InPlaceArgs<'a>,
) -> Option<(
    &'a Arc<dyn ferrite_hal::device::Device>,
    &'a Fence,
    &'a Fence,
)> {
    let device: &DeviceRef = a.obj()?;
    let _affinity = a.i64()?;
    let wait: Option<&Fence> = a.opt_obj()?;
    let signal: Option<&Fence> = a.opt_obj()?;
    Some((
        &device.0,
        wait.unwrap_or(Fence::empty()),
        signal.unwrap_or(Fence::empty()),
    ))
}

pub(super) fn register(
    b: NativeModuleBuilder,
    shared: &Arc<ModuleState>,
) -> Result<NativeModuleBuilder> {
    let s1 = shared.clone();
    let s2 = shared.clone();
    let s3 = shared.clone();
    let s4 = shared.clone();
    let s5 = shared.clone();
    b.function("devices.count", "0v_i", move |c| {
        c.ready_i32(s1.devices.len() as i32)
    })?
    .function("devices.get", "0i_r", move |c| {
        let i = ArgReader::new(c).i32()?;
        match usize::try_from(i).ok().and_then(|i| s2.devices.get(i)) {
            Some(d) => c.ready_ref(Ref::new(d.clone())),
            None => c.ready_one(Variant::Null),
        }
    })?
    .function("device.allocator", "0r_r", move |c| {
        let device: &DeviceRef = obj_ref(&mut ArgReader::new(c), "device")?;
        let r = s3.allocator_ref(device);
        c.ready_ref(r)
    })?
    .in_place(move |c| {
        let out = or_decline!(c.ref_result());
        let device: &DeviceRef = or_decline!(c.args().obj());
        let r = s5.allocator_ref(device);
        c.finish_ref(out, r);
        Ok(true)
    })?
    .function("device.query.i64", "0rrr_iI", |c| {
        let mut a = ArgReader::new(c);
        let device: DeviceRef = obj(&mut a, "device")?;
        let category = string(&mut a, "category")?;
        let key = string(&mut a, "key")?;
        match device.0.query_i64(&category, &key) {
            Ok(Some(v)) => c.ready([Variant::I32(1), Variant::I64(v)]),
            _ => c.ready([Variant::I32(0), Variant::I64(0)]),
        }
    })?
    .function("device.queue.alloca", "0rIrrIiiII_r", |c| {
        let mut a = ArgReader::new(c);
        let (device, wait, signal) = queue_head(&mut a)?;
        let pool = a.i64()?;
        if pool != 0 {
            bail!(
                Unimplemented,
                "queue alloca from pool {pool}: only the default pool (0) exists"
            );
        }
        let (types, usage, size, _flags) = (a.i32()?, a.i32()?, a.i64()?, a.i64()?);
        let params = BufferParams {
            memory_type: MemoryType::from_bits_retain(types as u32),
            usage: BufferUsage::from_bits_retain(usage as u32),
            ..BufferParams::default()
        };
        let buffer = queue::alloca(device, wait, signal, &params, size as u64)?;
        c.ready_ref(Ref::new(buffer))
    })?
    .in_place(|c| {
        let out = or_decline!(c.ref_result());
        let mut a = c.args();
        let (device, wait, signal) = or_decline!(queue_head_in_place(&mut a));
        if or_decline!(a.i64()) != 0 {
            return Ok(false);
        }
        let (types, usage) = (or_decline!(a.i32()), or_decline!(a.i32()));
        let (size, _flags) = (or_decline!(a.i64()), or_decline!(a.i64()));
        let params = BufferParams {
            memory_type: MemoryType::from_bits_retain(types as u32),
            usage: BufferUsage::from_bits_retain(usage as u32),
            ..BufferParams::default()
        };
        let buffer = queue::alloca(device, wait, signal, &params, size as u64)?;
        c.finish_ref(out, Ref::new(buffer));
        Ok(true)
    })?
    .function("device.queue.dealloca", "0rIrrrI_v", |c| {
        let mut a = ArgReader::new(c);
        let (device, wait, signal) = queue_head(&mut a)?;
        let buffer: Buffer = obj(&mut a, "buffer")?;
        let _flags = a.i64()?;
        queue::dealloca(device, wait, signal, buffer)?;
        c.ready_none()
    })?
    .function("device.queue.fill", "0rIrrrIIIiI_v", |c| {
        let mut a = ArgReader::new(c);
        let (device, wait, signal) = queue_head(&mut a)?;
        let target: Buffer = obj(&mut a, "target buffer")?;
        let (offset, length, pattern, pattern_length, _flags) = (
            a.i64()? as u64,
            a.i64()? as u64,
            a.i64()? as u64,
            a.i32()?,
            a.i64()?,
        );
        if !matches!(pattern_length, 1 | 2 | 4 | 8) {
            bail!(
                InvalidArgument,
                "fill pattern length must be 1, 2, 4 or 8 bytes, got {pattern_length}"
            );
        }
        let pattern = pattern.to_le_bytes()[..pattern_length as usize].to_vec();
        queue::fill(device, wait, signal, target, offset, length, pattern)?;
        c.ready_none()
    })?
    .function("device.queue.update", "0rIrrrIrIII_v", |c| {
        let mut a = ArgReader::new(c);
        let (device, wait, signal) = queue_head(&mut a)?;
        let source = vm_buffer(&mut a, "source buffer")?;
        let source_offset = a.i64()? as u64;
        let target: Buffer = obj(&mut a, "target buffer")?;
        let (target_offset, length, _flags) = (a.i64()? as u64, a.i64()? as u64, a.i64()?);
        let mut data = vec![0u8; length as usize];
        as_vm_buffer(&source, "source buffer")?.read(source_offset, &mut data)?;
        queue::update(device, wait, signal, data, target, target_offset)?;
        c.ready_none()
    })?
    .function("device.queue.copy", "0rIrrrIrIII_v", |c| {
        let mut a = ArgReader::new(c);
        let (device, wait, signal) = queue_head(&mut a)?;
        let source: Buffer = obj(&mut a, "source buffer")?;
        let source_offset = a.i64()? as u64;
        let target: Buffer = obj(&mut a, "target buffer")?;
        let (target_offset, length, _flags) = (a.i64()? as u64, a.i64()? as u64, a.i64()?);
        queue::copy(
            device,
            wait,
            signal,
            source,
            source_offset,
            target,
            target_offset,
            length,
        )?;
        c.ready_none()
    })?
    .function("device.queue.read", "0rIrrrIrIII_v", |c| {
        let mut a = ArgReader::new(c);
        let (device, wait, signal) = queue_head(&mut a)?;
        let file: File = obj(&mut a, "source file")?;
        let source_offset = a.i64()? as u64;
        let target: Buffer = obj(&mut a, "target buffer")?;
        let (target_offset, length, _flags) = (a.i64()? as u64, a.i64()? as u64, a.i64()?);
        if file.access & FILE_READ == 0 {
            bail!(PermissionDenied, "file does not allow reads");
        }
        if source_offset
            .checked_add(length)
            .is_none_or(|e| e > file.length)
        {
            bail!(
                OutOfRange,
                "file read {source_offset}+{length} exceeds the file's {} bytes",
                file.length
            );
        }
        let mut data = vec![0u8; length as usize];
        as_vm_buffer(&file.memory, "file memory")?.read(file.offset + source_offset, &mut data)?;
        queue::update(device, wait, signal, data, target, target_offset)?;
        c.ready_none()
    })?
    .function("device.queue.write", "0rIrrrIrIII_v", |c| {
        let mut a = ArgReader::new(c);
        let (device, wait, signal) = queue_head(&mut a)?;
        let source: Buffer = obj(&mut a, "source buffer")?;
        let source_offset = a.i64()? as u64;
        let file: File = obj(&mut a, "target file")?;
        let (target_offset, length, _flags) = (a.i64()? as u64, a.i64()? as u64, a.i64()?);
        if file.access & FILE_WRITE == 0 {
            bail!(PermissionDenied, "file does not allow writes");
        }
        if target_offset
            .checked_add(length)
            .is_none_or(|e| e > file.length)
        {
            bail!(
                OutOfRange,
                "file write {target_offset}+{length} exceeds the file's {} bytes",
                file.length
            );
        }
        let memory = file.memory.clone();
        let at = file.offset + target_offset;
        device.submit(
            wait,
            signal,
            Box::new(move || {
                let mut data = vec![0u8; length as usize];
                source.device_read(source_offset, &mut data)?;
                as_vm_buffer(&memory, "file memory")?.write(at, &data)
            }),
        )?;
        c.ready_none()
    })?
    .function("device.queue.barrier", "0rIrrI_v", |c| {
        let mut a = ArgReader::new(c);
        let (device, wait, signal) = queue_head(&mut a)?;
        let _flags = a.i64()?;
        queue::barrier(device, wait, signal)?;
        c.ready_none()
    })?
    .function("device.queue.execute", "0rIrrrI_v", |c| {
        let mut a = ArgReader::new(c);
        let (device, wait, signal) = queue_head(&mut a)?;
        let cb = a.opt_ref_borrowed()?;
        let _flags = a.i64()?;
        let cb = match cb {
            Some(r) => Some(r.downcast::<CommandBuffer>().ok_or_else(|| {
                ferrite_base::status!(
                    InvalidArgument,
                    "expected !hal.command_buffer, received !{}",
                    r.type_name()
                )
            })?),
            None => None,
        };
        queue::execute(device, wait, signal, cb, Vec::new())?;
        c.ready_none()
    })?
    .function("device.queue.execute.indirect", "0rIrrrICrIID_v", |c| {
        let mut a = ArgReader::new(c);
        let (device, wait, signal) = queue_head(&mut a)?;
        let cb = a.a_ref_borrowed()?;
        let _flags = a.i64()?;
        let mut bindings = BorrowedBindings(BindingTable::new());
        span_into(&mut a, &mut bindings, |a| {
            let buffer: Option<&Buffer> = opt_obj_ref(a, "binding buffer")?;
            let (offset, length) = (a.i64()? as u64, a.i64()? as u64);
            match buffer {
                Some(buffer) => Ok(Binding {
                    // SAFETY: an uncounted copy of a buffer in the call's
                    // argument registers, which hold it (and stay as they
                    // are) until the call returns; `BorrowedBindings` never
                    // drops it and is dropped before the call returns.
                    buffer: unsafe { std::ptr::read(buffer) },
                    offset,
                    length,
                }),
                None => bail!(InvalidArgument, "binding table entry has a null buffer"),
            }
        })?;
        let Some(cb) = cb.downcast::<CommandBuffer>() else {
            bail!(
                InvalidArgument,
                "expected !hal.command_buffer, received !{}",
                cb.type_name()
            );
        };
        queue::execute_borrowed(device, wait, signal, cb, &bindings.0)?;
        // Before the registers are released (`ready_none`).
        drop(bindings);
        c.ready_none()
    })?
    .in_place(|c| {
        if !c.no_results() {
            return Ok(false);
        }
        let mut a = c.args();
        let (device, wait, signal) = or_decline!(queue_head_in_place(&mut a));
        let cb: &CommandBuffer = or_decline!(a.obj());
        let _flags = or_decline!(a.i64());
        let n = or_decline!(a.count());
        let mut bindings = BorrowedBindings(BindingTable::new());
        for _ in 0..n {
            let buffer: &Buffer = or_decline!(or_decline!(a.opt_obj()));
            let (offset, length) = (or_decline!(a.i64()) as u64, or_decline!(a.i64()) as u64);
            bindings.0.push(Binding {
                // SAFETY: as in the body: an uncounted copy of a buffer in
                // the call's argument registers, which hold it (and stay as
                // they are) until the call returns; `BorrowedBindings`
                // never drops it and is dropped before the call returns.
                buffer: unsafe { std::ptr::read(buffer) },
                offset,
                length,
            });
        }
        queue::execute_borrowed(device, wait, signal, cb, &bindings.0)?;
        // Before the registers are released (`finish`).
        drop(bindings);
        c.finish();
        Ok(true)
    })?
    .function("device.queue.flush", "0rI_v", |c| {
        let mut a = ArgReader::new(c);
        let _device: DeviceRef = obj(&mut a, "device")?;
        let _affinity = a.i64()?;
        c.ready_none()
    })?
    .function("ex.file.from_memory", "0rIirIIi_r", |c| {
        let mut a = ArgReader::new(c);
        let _device: DeviceRef = obj(&mut a, "device")?;
        let _affinity = a.i64()?;
        let access = a.i32()? as u32;
        let memory = vm_buffer(&mut a, "file memory")?;
        let (offset, length, _flags) = (a.i64()? as u64, a.i64()? as u64, a.i32()?);
        let len = as_vm_buffer(&memory, "file memory")?.len();
        if offset.checked_add(length).is_none_or(|e| e > len) {
            bail!(
                OutOfRange,
                "file range {offset}+{length} exceeds the memory's {len} bytes"
            );
        }
        c.ready_ref(Ref::new(File {
            memory,
            offset,
            length,
            access,
        }))
    })?
    .function("channel.create", "0rIIrrii_r", move |c| {
        let mut a = ArgReader::new(c);
        let device: &DeviceRef = obj_ref(&mut a, "device")?;
        let (queue_affinity, flags) = (a.i64()? as u64, a.i64()? as u64);
        let id = opt_bytes(&mut a, "channel id")?.unwrap_or_default();
        let group = opt_bytes(&mut a, "channel group")?
            .map(|g| String::from_utf8_lossy(&g).into_owned())
            .unwrap_or_default();
        let (rank, count) = (a.i32()?, a.i32()?);
        let params = ChannelParams {
            flags,
            id,
            group,
            rank: default_or_count(rank, "channel rank")?,
            count: default_or_count(count, "channel count")?,
        };
        let provider = s4.options.channel_provider.as_ref();
        let channel = device.0.create_channel(queue_affinity, params, provider)?;
        c.ready_ref(Ref::new(channel))
    })?
    .function("channel.split", "0riiI_r", |c| {
        let mut a = ArgReader::new(c);
        let channel: &ChannelRef = obj_ref(&mut a, "channel")?;
        let (color, key, flags) = (a.i32()?, a.i32()?, a.i64()? as u64);
        let split = channel.0.split(color, key, flags)?;
        c.ready_one(split.map_or(Variant::Null, |s| Variant::Ref(Ref::new(s))))
    })?
    .function("channel.rank_and_count", "0r_ii", |c| {
        let mut a = ArgReader::new(c);
        let channel: &ChannelRef = obj_ref(&mut a, "channel")?;
        let (rank, count) = (channel.0.rank(), channel.0.count());
        c.ready([Variant::I32(rank as i32), Variant::I32(count as i32)])
    })
}

/// Reads a possibly-null `!vm.buffer` as bytes.
fn opt_bytes(a: &mut ArgReader<'_>, what: &str) -> Result<Option<Vec<u8>>> {
    match a.opt_ref_borrowed()? {
        None => Ok(None),
        Some(r) => Ok(Some(as_vm_buffer(r, what)?.with_bytes(|b| b.to_vec())?)),
    }
}

/// `-1` asks the environment; other negative values are refused.
fn default_or_count(v: i32, what: &str) -> Result<Option<u32>> {
    match v {
        -1 => Ok(None),
        v if v < 0 => bail!(
            InvalidArgument,
            "{what} must be -1 (from the environment) or non-negative, got {v}"
        ),
        v => Ok(Some(v as u32)),
    }
}
