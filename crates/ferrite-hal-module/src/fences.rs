//! `hal.fence.*`, including `fence.await`: blocking in synchronous mode, a
//! coroutine yield otherwise.

use super::args::{obj_ref, or_decline, span};
use super::state::ModuleState;
use ferrite_base::wait::{WaitMode, WaitSource};
use ferrite_base::{bail, Deadline, Result, Status, StatusCode, Timeout};
use ferrite_hal::device::DeviceRef;
use ferrite_hal::fence::Fence;
use ferrite_hal::semaphore::Semaphore;
use ferrite_vm::native::{ArgReader, NativeModuleBuilder};
use ferrite_vm::stack::{NativeCall, NativePoll, Wait};
use ferrite_vm::{Ref, Variant};
use std::sync::Arc;
use std::time::Duration;

fn fence_arc(a: &mut ArgReader<'_>) -> Result<Arc<Fence>> {
    let r = a.a_ref()?;
    r.downcast_arc::<Fence>().ok_or_else(|| {
        ferrite_base::status!(
            InvalidArgument,
            "expected !hal.fence, received !{}",
            r.type_name()
        )
    })
}

/// The i32 a wait outcome becomes: 0 when reached, `DEADLINE_EXCEEDED` as a
/// value; any other failure fails the invocation.
fn await_result(c: &mut NativeCall, outcome: Result<()>) -> Result<NativePoll> {
    match outcome {
        Ok(()) => c.ready_i32(0),
        Err(e) if e.code() == StatusCode::DeadlineExceeded => {
            c.ready_i32(StatusCode::DeadlineExceeded as i32)
        }
        Err(e) => Err(e),
    }
}

pub(super) fn register(
    b: NativeModuleBuilder,
    shared: &Arc<ModuleState>,
) -> Result<NativeModuleBuilder> {
    let synchronous = shared.options.synchronous;
    b.function("fence.create", "0rI_r", |c| {
        let mut a = ArgReader::new(c);
        let _device: &DeviceRef = obj_ref(&mut a, "device")?;
        let _flags = a.i64()?;
        c.ready_ref(Ref::from_arc(Fence::pooled_new()))
    })?
    .in_place(|c| {
        let out = or_decline!(c.ref_result());
        let mut a = c.args();
        let _device: &DeviceRef = or_decline!(a.obj());
        let _flags = or_decline!(a.i64());
        c.finish_ref(out, Ref::from_arc(Fence::pooled_new()));
        Ok(true)
    })?
    .function("fence.join", "0ICrD_r", |c| {
        let mut a = ArgReader::new(c);
        let _flags = a.i64()?;
        let fences = span(&mut a, |a| {
            Ok(match a.opt_ref()? {
                Some(r) => Some(r.downcast_arc::<Fence>().ok_or_else(|| {
                    ferrite_base::status!(
                        InvalidArgument,
                        "expected !hal.fence, received !{}",
                        r.type_name()
                    )
                })?),
                None => None,
            })
        })?;
        let fences: Vec<&Fence> = fences.iter().flatten().map(|f| &**f).collect();
        let joined = Fence::join(&fences);
        if joined.is_empty() {
            return c.ready_one(Variant::Null);
        }
        c.ready_ref(Ref::new(joined))
    })?
    .function("fence.query", "0r_i", |c| {
        let fence = fence_arc(&mut ArgReader::new(c))?;
        let code = match fence.query() {
            Ok(true) => StatusCode::Ok,
            Ok(false) => StatusCode::Deferred,
            Err(e) => e.code(),
        };
        c.ready_i32(code as i32)
    })?
    .function("fence.signal", "0r_v", |c| {
        fence_arc(&mut ArgReader::new(c))?.signal()?;
        c.ready_none()
    })?
    .function("fence.fail", "0ri_v", |c| {
        let mut a = ArgReader::new(c);
        let fence = fence_arc(&mut a)?;
        let code = StatusCode::from_u32(a.i32()? as u32);
        fence.fail(Status::new(code, "fence failed by the program"));
        c.ready_none()
    })?
    .function("fence.await", "0iICrD_i", move |c| {
        if c.resumed {
            return {
                let outcome = c.take_wait_status().unwrap_or(Ok(()));
                await_result(c, outcome)
            };
        }
        let mut a = ArgReader::new(c);
        let timeout_ms = a.i32()? as u32;
        let _flags = a.i64()?;
        let count = a.i32()?;
        if count < 0 {
            bail!(InvalidArgument, "negative span length {count}");
        }
        // Reached fences are elided (the common case allocates nothing); a
        // failed one fails the call at once.
        let mut pending: Vec<&Fence> = Vec::new();
        for _ in 0..count {
            if let Some(r) = a.opt_ref_borrowed()? {
                let Some(f) = r.downcast::<Fence>() else {
                    bail!(
                        InvalidArgument,
                        "expected !hal.fence, received !{}",
                        r.type_name()
                    );
                };
                if !f.query()? {
                    pending.push(f);
                }
            }
        }
        if pending.is_empty() {
            return c.ready_i32(0);
        }
        let deadline = if timeout_ms == u32::MAX {
            Deadline::InfiniteFuture
        } else {
            Timeout::from_duration(Duration::from_millis(timeout_ms as u64)).to_deadline()
        };
        if synchronous {
            for f in &pending {
                match f.wait(Timeout::Absolute(deadline)) {
                    Ok(true) => {}
                    Ok(false) => {
                        return await_result(
                            c,
                            Err(Status::new(
                                StatusCode::DeadlineExceeded,
                                "fence wait timed out",
                            )),
                        )
                    }
                    Err(e) => return await_result(c, Err(e)),
                }
            }
            return c.ready_i32(0);
        }
        // One timepoint per semaphore across all fences, keeping the max.
        let mut timepoints: Vec<(Arc<Semaphore>, u64)> = Vec::new();
        for f in &pending {
            for (s, v) in f.timepoints() {
                match timepoints.iter_mut().find(|(t, _)| Arc::ptr_eq(t, &s)) {
                    Some(tp) => tp.1 = tp.1.max(v),
                    None => timepoints.push((s, v)),
                }
            }
        }
        let sources: Vec<Arc<dyn WaitSource>> = timepoints
            .iter()
            .map(|(s, v)| s.timepoint(*v) as Arc<dyn WaitSource>)
            .collect();
        Ok(NativePoll::Pending(Wait {
            sources,
            mode: WaitMode::All,
            deadline,
            handles_failure: true,
        }))
    })?
    .in_place(|c| {
        // Fences all reached (or null): 0 at once. A pending or failed
        // fence declines: the body waits, yields or fails.
        let out = or_decline!(c.i32_result());
        let mut a = c.args();
        let (_timeout, _flags) = (or_decline!(a.i32()), or_decline!(a.i64()));
        for _ in 0..or_decline!(a.count()) {
            if let Some(f) = or_decline!(a.opt_obj::<Fence>()) {
                if !matches!(f.query(), Ok(true)) {
                    return Ok(false);
                }
            }
        }
        c.finish_i32(out, 0);
        Ok(true)
    })
}
