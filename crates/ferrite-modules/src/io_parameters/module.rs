//! The `io_parameters` VM module (version 0) that programs compiled with
//! parameters import:
//!
//! | function  | cconv            | arguments |
//! |-----------|------------------|-----------|
//! | `load`    | `0rIrrrIiirrr_r` | device, queue affinity, wait fence, signal fence, source scope, target affinity, memory types, buffer usage, key table, key data, spans → list of buffers |
//! | `gather`  | `0rIrrrrrrr_v`   | device, queue affinity, wait fence, signal fence, source scope, target buffer, key table, key data, spans |
//! | `scatter` | `0rIrrrrrrr_v`   | device, queue affinity, wait fence, signal fence, source buffer, target scope, key table, key data, spans |
//!
//! Requests name parameters indirectly: the key table holds one
//! `(offset: u32, length: u32)` pair per span into the key data, and the
//! spans buffer holds `(parameter offset, buffer offset, length)` as three
//! u64s per span. The scope (a null buffer means the empty scope) picks the
//! first registered provider that answers for it.

use std::sync::Arc;

use ferrite_base::{bail, status, Result};
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::device::DeviceRef;
use ferrite_hal::{BufferUsage, Fence, MemoryType};
use ferrite_hal_module::args::{as_vm_buffer, obj, opt_obj};
use ferrite_vm::list::VmList;
use ferrite_vm::native::{ArgReader, NativeModule, NativeModuleBuilder};
use ferrite_vm::refs::{Ref, RefType};
use ferrite_vm::stack::NativePoll;
use ferrite_vm::types::TypeDef;
use ferrite_vm::Variant;

use super::provider::{ParameterProvider, Span};

/// The module's version (upstream's `io_parameters` is version 0).
pub const IO_PARAMETERS_MODULE_VERSION: u32 = 0;

/// The exports and their calling conventions, in export order.
pub const IO_PARAMETERS_EXPORTS: [(&str, &str); 3] = [
    ("gather", "0rIrrrrrrr_v"),
    ("load", "0rIrrrIiirrr_r"),
    ("scatter", "0rIrrrrrrr_v"),
];

const KEY_ENTRY_SIZE: u64 = 8;
const SPAN_ENTRY_SIZE: u64 = 24;

/// Builds the `io_parameters` module serving `providers` (searched in
/// order for the first that answers for a request's scope).
pub fn create_io_parameters_module(providers: Vec<ParameterProvider>) -> Result<Arc<NativeModule>> {
    let providers = Arc::new(providers);
    let (p1, p2, p3) = (providers.clone(), providers.clone(), providers);
    let b = NativeModuleBuilder::new("io_parameters", IO_PARAMETERS_MODULE_VERSION)
        .dependency("hal", ferrite_hal_module::HAL_MODULE_VERSION, false)
        .function("gather", IO_PARAMETERS_EXPORTS[0].1, move |c| {
            let mut a = ArgReader::new(c);
            let (device, wait, signal) = queue_head(&mut a)?;
            let scope = scope(&mut a, "source scope")?;
            let target: Buffer = obj(&mut a, "target buffer")?;
            let spans = spans(&mut a)?;
            resolve(&p1, &scope)?.gather(&device.0, &wait, &signal, &target, &spans)?;
            Ok(NativePoll::Ready(vec![]))
        })?
        .function("load", IO_PARAMETERS_EXPORTS[1].1, move |c| {
            let mut a = ArgReader::new(c);
            let (device, wait, signal) = queue_head(&mut a)?;
            let scope = scope(&mut a, "source scope")?;
            let target_affinity = a.i64()?;
            let memory_type = MemoryType::from_bits_retain(a.i32()? as u32);
            let usage = BufferUsage::from_bits_retain(a.i32()? as u32);
            let spans = spans(&mut a)?;
            let params = BufferParams {
                memory_type,
                usage,
                queue_affinity: target_affinity as u64,
                ..BufferParams::default()
            };
            let buffers = resolve(&p2, &scope)?.load(&device.0, &wait, &signal, &params, &spans)?;
            let list = VmList::new(
                TypeDef::Ref(RefType::of::<Buffer>("hal.buffer")),
                buffers.len() as u32,
            )?;
            list.resize(buffers.len() as u32)?;
            for (i, b) in buffers.into_iter().enumerate() {
                list.set_ref(i as u32, Some(Ref::new(b)))?;
            }
            Ok(NativePoll::Ready(vec![Variant::Ref(Ref::new(list))]))
        })?
        .function("scatter", IO_PARAMETERS_EXPORTS[2].1, move |c| {
            let mut a = ArgReader::new(c);
            let (device, wait, signal) = queue_head(&mut a)?;
            let source: Buffer = obj(&mut a, "source buffer")?;
            let scope = scope(&mut a, "target scope")?;
            let spans = spans(&mut a)?;
            resolve(&p3, &scope)?.scatter(&device.0, &wait, &signal, &source, &spans)?;
            Ok(NativePoll::Ready(vec![]))
        })?;
    Ok(b.build())
}

fn resolve<'p>(providers: &'p [ParameterProvider], scope: &str) -> Result<&'p ParameterProvider> {
    providers.iter().find(|p| p.supports(scope)).ok_or_else(|| {
        status!(
            NotFound,
            "no provider registered that handles scopes like '{scope}'"
        )
    })
}

/// `(device, affinity, wait fence, signal fence)`; null fences mean no
/// wait and nothing to signal.
fn queue_head(a: &mut ArgReader<'_>) -> Result<(DeviceRef, Fence, Fence)> {
    let device: DeviceRef = obj(a, "device")?;
    let _affinity = a.i64()?;
    let wait: Option<Fence> = opt_obj(a, "wait fence")?;
    let signal: Option<Fence> = opt_obj(a, "signal fence")?;
    Ok((device, wait.unwrap_or_default(), signal.unwrap_or_default()))
}

/// A scope string; a null buffer is the empty scope.
fn scope(a: &mut ArgReader<'_>, what: &str) -> Result<String> {
    match a.opt_ref()? {
        None => Ok(String::new()),
        Some(r) => as_vm_buffer(&r, what)?.with_bytes(|b| String::from_utf8_lossy(b).into_owned()),
    }
}

/// Reads the key table, key data and span buffers into spans.
fn spans(a: &mut ArgReader<'_>) -> Result<Vec<Span>> {
    let (table, data, spans) = (a.a_ref()?, a.a_ref()?, a.a_ref()?);
    let table = as_vm_buffer(&table, "key table")?.to_vec()?;
    let data = as_vm_buffer(&data, "key data")?.to_vec()?;
    let spans = as_vm_buffer(&spans, "spans")?.to_vec()?;
    if !(spans.len() as u64).is_multiple_of(SPAN_ENTRY_SIZE) {
        bail!(
            InvalidArgument,
            "span buffer of {} bytes is not a whole number of {SPAN_ENTRY_SIZE} byte span entries",
            spans.len()
        );
    }
    let count = spans.len() as u64 / SPAN_ENTRY_SIZE;
    if (table.len() as u64) < count * KEY_ENTRY_SIZE {
        bail!(
            InvalidArgument,
            "key table of {} bytes is too small for {count} spans ({} bytes needed)",
            table.len(),
            count * KEY_ENTRY_SIZE
        );
    }
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |b: &[u8], i: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(x)
    };
    (0..count as usize)
        .map(|i| {
            let (offset, length) = (u32_at(&table, i * 8), u32_at(&table, i * 8 + 4));
            let end = offset as u64 + length as u64;
            if end > data.len() as u64 {
                bail!(
                    OutOfRange,
                    "key {i} at {offset}+{length} is outside the {} byte key data",
                    data.len()
                );
            }
            let key = std::str::from_utf8(&data[offset as usize..end as usize])
                .map_err(|_| status!(InvalidArgument, "key {i} is not UTF-8"))?
                .to_string();
            let s = i * SPAN_ENTRY_SIZE as usize;
            Ok(Span {
                key,
                parameter_offset: u64_at(&spans, s),
                buffer_offset: u64_at(&spans, s + 8),
                length: u64_at(&spans, s + 16),
            })
        })
        .collect()
}
