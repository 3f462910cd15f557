//! Submission: queue operations enqueued on the device's stream in
//! submission order (waits, work, signals, completion events), or kept on
//! the host while they wait on something only the host can release (see
//! the `device` module's docs and [`crate::device::deferral`]).

use crate::completion::{Completion, InFlightResources};
use crate::context::QueueOrder;
use crate::device::CudaDevice;
use crate::device::{Body, Deferred, Queue};
use crate::ffi::{self, CUdeviceptr, CUstream};
use crate::memory::CudaTimeline;
use crate::stream_encoder::AtIndirect;
use ferrite_base::{bail, status, Result};
use ferrite_hal::command_buffer::{Binding, BufferRef, Command};
use ferrite_hal::device::Work;
use ferrite_hal::fence::Fence;
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl CudaDevice {
    /// Enqueues one queue operation (see the module docs) now, or keeps it
    /// on the host ([`crate::device::deferral`]) when the stream is too full
    /// behind a gate; `entries` estimates its stream entries besides its
    /// waits, signals and completion event.
    pub(crate) fn enqueue(
        &self,
        wait: &Fence,
        signal: &Fence,
        keep: InFlightResources,
        work: Option<Work>,
        entries: u64,
        body: Body,
    ) -> Result<()> {
        let mut q = self.queue.lock();
        let work_entries = entries;
        let (defers, entries) = self.defers(&mut q, wait, signal, work_entries);
        if defers {
            self.defer(
                &mut q,
                Deferred {
                    wait: wait.clone(),
                    signal: signal.clone(),
                    keep,
                    work,
                    work_entries,
                    body: Some(body),
                },
            );
        } else {
            self.enqueue_locked(&mut q, wait, signal, keep, work, entries, body);
        }
        Ok(())
    }

    /// The stream entries of an operation waiting on `wait`, signalling
    /// `signal`, with `work` entries of work (its signals and completion
    /// event besides), and whether it must wait on the host: a wait
    /// timepoint neither reached (or failed) nor signalled by earlier work
    /// on this stream.
    ///
    /// Such an operation is never enqueued behind a stream wait on the
    /// semaphore's word: the GPU cannot skip work, so a wait released by a
    /// failure would let the work run. It is kept on the host until its
    /// waits are reached, then enqueued, or failed with the wait's status
    /// without running ([`crate::device::deferral`]), as upstream's driver does.
    pub(crate) fn entries(&self, wait: &Fence, signal: &Fence, work: u64) -> (u64, bool) {
        let waits_on_host = wait.timepoints().iter().any(|(sem, value)| {
            if sem.query().map_or(true, |v| v >= *value) {
                return false;
            }
            !sem.attached_timeline()
                .and_then(|t| t.as_any().downcast_ref::<CudaTimeline>())
                .is_some_and(|t| {
                    Arc::ptr_eq(&t.shared, &self.shared)
                        && t.stream_signaled.load(Ordering::Acquire) >= *value
                })
        });
        (work + signal.timepoints().len() as u64 + 1, waits_on_host)
    }

    /// Whether an operation (see [`Self::entries`]) must be kept on the
    /// host ([`crate::device::deferral`]), and its stream entries.
    pub(crate) fn defers(
        &self,
        q: &mut Queue,
        wait: &Fence,
        signal: &Fence,
        work: u64,
    ) -> (bool, u64) {
        let (entries, waits_on_host) = self.entries(wait, signal, work);
        let defers = waits_on_host
            || !q.deferred.is_empty()
            || !q.fits(self.shared.completions.reported(), entries);
        (defers, entries)
    }

    /// Keeps `op` on the host until the drain thread enqueues it.
    pub(crate) fn defer(&self, q: &mut Queue, op: Deferred) {
        self.kept_on_host.fetch_add(1, Ordering::Relaxed);
        self.hold(q, op);
    }

    /// Orders every queue operation submitted so far before `consumer`
    /// (see [`CudaContext::order_queue_before`]): operations kept on the host
    /// get a marker behind them that releases the consumer once the queue
    /// stream has run them.
    ///
    /// # Safety
    /// As [`CudaContext::order_queue_before`].
    pub(crate) unsafe fn order_before_consumer(&self, consumer: Option<CUstream>) -> Result<()> {
        self.shared.make_current()?;
        let mut q = self.queue.lock();
        if q.deferred.is_empty() {
            drop(q);
            // SAFETY: the queue stream is ours; the caller vouches for
            // `consumer`.
            return unsafe { self.shared.order(self.shared.stream, consumer) };
        }
        // The marker has no waits, so it is enqueued right after the last
        // operation kept now, also when some of them fail; it signals
        // nothing but `signal`.
        let marker = |signal: Fence, body: Body| Deferred {
            wait: Fence::new(),
            signal,
            keep: InFlightResources::default(),
            work: None,
            work_entries: 1,
            body: Some(body),
        };
        match consumer {
            Some(stream) => {
                // SAFETY: the context is current; the caller vouches for
                // `stream`.
                let release = unsafe { self.shared.consumer_waits.add(&self.shared, stream) }?;
                // Dropped unrun (the device released first), the release
                // writes the word from the host.
                let body: Body = Box::new(move |d, _| release.enqueue(d.shared.stream));
                self.hold(&mut q, marker(Fence::new(), body));
                Ok(())
            }
            None => {
                // Its report comes after every earlier operation's (reports
                // keep stream order) and after the stream reached it.
                let reached = ferrite_hal::Semaphore::new(0);
                let body: Body = Box::new(|_, _| Ok(()));
                self.hold(&mut q, marker(Fence::create_at(reached.clone(), 1), body));
                drop(q);
                reached.wait(1, ferrite_base::Timeout::INFINITE)
            }
        }
    }

    /// Keeps `op` (a queue operation or a marker) on the host, in order
    /// behind what is kept already, and makes sure a drain thread runs.
    pub(crate) fn hold(&self, q: &mut Queue, op: Deferred) {
        q.deferred.push_back(op);
        // The gates' operations must be reported for the drain to go on,
        // also when nobody waits on them.
        self.shared.completions.watch();
        if q.start_draining() {
            let me = self.me.clone();
            let started = std::thread::Builder::new()
                .name(format!("ferrite-cuda{}-deferred", self.shared.ordinal))
                .spawn(move || crate::device::deferral::drain(me));
            if let Err(e) = started {
                // Nothing would enqueue them: fail what is kept.
                let e = status!(
                    ResourceExhausted,
                    "starting the thread for queue operations waiting on the host: {e}"
                );
                for mut op in q.deferred.drain(..) {
                    op.body = None;
                    op.signal.fail(e.clone());
                }
                q.stop_draining();
            }
        }
    }

    /// Enqueues a kept operation (the drain thread).
    pub(crate) fn enqueue_deferred(&self, q: &mut Queue, mut op: Deferred) {
        let Some(body) = op.body.take() else {
            return;
        };
        let keep = std::mem::take(&mut op.keep);
        let work = op.work.take();
        let (entries, _) = self.entries(&op.wait, &op.signal, op.work_entries);
        self.enqueue_locked(q, &op.wait, &op.signal, keep, work, entries, body);
    }

    /// Enqueues one queue operation on the stream: waits, `body`, signal
    /// writes, completion event. `body` failing fails `signal`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_locked(
        &self,
        q: &mut Queue,
        wait: &Fence,
        signal: &Fence,
        mut keep: InFlightResources,
        work: Option<Work>,
        entries: u64,
        body: impl FnOnce(&Self, &mut InFlightResources) -> Result<()>,
    ) {
        let mut gated = false;
        // Host work runs only once the stream has reached the operation
        // (on the completion thread or a polling waiter), so its signals
        // are not reached by stream order: later work on this stream that
        // waits on them is kept on the host until the report.
        let host_work = work.is_some();
        let log = crate::diagnostics::log_queue();
        let mut logged: Vec<String> = Vec::new();
        let outcome = (|| -> Result<()> {
            self.shared.make_current()?;
            for (sem, value) in wait.timepoints() {
                match sem.query() {
                    Ok(v) if v >= value => {
                        if log {
                            logged.push(format!("wait >= {value}: reached"));
                        }
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => return Err(e),
                }
                // Not reached: enqueued only when earlier work on this
                // stream signals it (the operation is kept on the host
                // until then otherwise, see `defers`), so stream order
                // covers it and a failure of that work is known before
                // this operation's report (a failed stream faults every
                // later operation).
                let covered = sem
                    .attached_timeline()
                    .and_then(|t| {
                        t.as_any().downcast_ref::<CudaTimeline>().map(|ct| {
                            Arc::ptr_eq(&ct.shared, &self.shared)
                                && ct.stream_signaled.load(Ordering::Acquire) >= value
                        })
                    })
                    .unwrap_or(false);
                if !covered {
                    bail!(
                        Internal,
                        "queue operation enqueued before its wait (>= {value}) was reached"
                    );
                }
                if log {
                    logged.push(format!("wait >= {value}: stream order"));
                }
            }
            // While a trace is recorded: the operation's span on the
            // stream, in device time (`crate::profile`).
            let timing = match keep.traced.as_mut() {
                Some(op) => {
                    let t = self
                        .shared
                        .clock
                        .begin(&self.shared, self.shared.stream, None);
                    op.reference = t.as_ref().map(|t| t.reference());
                    t
                }
                None => None,
            };
            if let Err(e) = body(self, &mut keep) {
                if let Some(op) = keep.traced.take() {
                    let mut args = op.args;
                    args.push(("failed", ferrite_base::trace::Arg::Str(e.to_string())));
                    let track = crate::profile::track_name(self.shared.ordinal);
                    let track = ferrite_base::trace::device_track(&track);
                    ferrite_base::trace::instant("queue", op.op, track, args);
                }
                return Err(e);
            }
            match (timing, keep.traced.take()) {
                (Some(t), Some(op)) => {
                    let stream = self.shared.stream;
                    let clock = &self.shared.clock;
                    if let Some(t) = t.end(clock, stream, "queue", op.op.into(), op.args) {
                        keep.timings.push(t);
                    }
                }
                // No timing events (the driver refused them): the
                // operation is still listed, at its host time.
                (None, Some(op)) => {
                    let track = crate::profile::track_name(self.shared.ordinal);
                    let track = ferrite_base::trace::device_track(&track);
                    ferrite_base::trace::instant("queue", op.op, track, op.args);
                }
                _ => {}
            }
            // Whether the stream passing this operation reaches its
            // signals: not for host work, and not for work a
            // continuation finishes (an indirect dispatch's gate), whose
            // outcome is known only when it is reported.
            let reached_by_stream = !host_work && keep.gates.is_empty();
            for (sem, value) in signal.timepoints() {
                let t = self.timeline(&sem)?;
                let Some(ct) = t.as_any().downcast_ref::<CudaTimeline>() else {
                    continue;
                };
                if !Arc::ptr_eq(&ct.shared, &self.shared) {
                    continue;
                }
                if !reached_by_stream {
                    // Reached when reported (the host work ran, the
                    // continuation succeeded): later work waiting on it
                    // is kept on the host until then.
                    ct.host_signaled.fetch_max(value, Ordering::AcqRel);
                    if log {
                        logged.push(format!("signal {value}: when reported"));
                    }
                    continue;
                }
                // Host waiters and other devices see the value when the
                // operation is reported.
                ct.stream_signaled.fetch_max(value, Ordering::AcqRel);
                if log {
                    logged.push(format!("signal {value}: in stream order"));
                }
            }
            Ok(())
        })();
        // A continuation's gate word is a gate too.
        gated |= !keep.gates.is_empty();
        if let Err(e) = outcome {
            if !gated {
                signal.fail(e);
                return;
            }
            // A wait is in the stream already: the operation completes
            // (failing) once the stream passes it, so the gate is counted
            // and later work keeps its order.
            keep.outcomes.push(Arc::new(Mutex::new(Some(e))));
        }
        let (event, probe) = match self.event().and_then(|e| match self.shared.take_probe() {
            Ok(p) => Ok((e, p)),
            Err(err) => {
                self.shared.give_event(e);
                Err(err)
            }
        }) {
            Ok(pair) => pair,
            Err(e) => {
                signal.fail(e);
                return;
            }
        };
        let api = self.shared.api;
        // SAFETY: events of this context, recorded on its queue stream;
        // neither is pending (fresh or reached).
        let r = unsafe {
            match (api.cuEventRecord)(probe, self.shared.stream) {
                ffi::CUDA_SUCCESS => (api.cuEventRecord)(event, self.shared.stream),
                r => r,
            }
        };
        if r != ffi::CUDA_SUCCESS {
            // Possibly recorded: destroyed (deferred by the driver until
            // reached) rather than re-recorded from the pools.
            // SAFETY: events of this context, not used after this.
            unsafe {
                (api.cuEventDestroy_v2)(probe);
                (api.cuEventDestroy_v2)(event);
            }
            signal.fail(ffi::to_status(r, "recording a completion event"));
            return;
        }
        let seq = q.enqueued(entries, gated);
        if log {
            eprintln!(
                "cuda queue op {seq}{}: {}",
                if host_work { " (host work)" } else { "" },
                logged.join(", ")
            );
        }
        self.shared.completions.push(
            Completion {
                event,
                probe,
                seq,
                signal: signal.clone(),
                waits: wait.clone(),
                keep,
                work,
            },
            &self.shared,
        );
    }

    /// True when an operation waiting on `wait` and signalling `signal`
    /// may complete on the host now: every wait is reached and no earlier
    /// operation on this device's stream still has to signal one of the
    /// signal semaphores (a host signal would overtake it).
    pub(crate) fn completes_at_once(&self, wait: &Fence, signal: &Fence) -> bool {
        if !wait
            .timepoints()
            .iter()
            .all(|(s, v)| s.query().is_ok_and(|c| c >= *v))
        {
            return false;
        }
        signal.timepoints().iter().all(|(s, _)| {
            let Ok(current) = s.query() else {
                return false;
            };
            s.attached_timeline()
                .and_then(|t| t.as_any().downcast_ref::<CudaTimeline>())
                .is_none_or(|t| {
                    t.stream_signaled.load(Ordering::Acquire) <= current
                        && t.host_signaled.load(Ordering::Acquire) <= current
                })
        })
    }

    /// A completion event from the pool (or a new one).
    pub(crate) fn event(&self) -> Result<ffi::CUevent> {
        self.shared.take_event()
    }

    /// The device address of a binding reference under `table` (range
    /// checked).
    pub(crate) fn resolve_address(&self, r: &BufferRef, table: &[Binding]) -> Result<CUdeviceptr> {
        crate::stream_encoder::resolve(&self.shared, r, table).map(|(_, p, _)| p)
    }

    /// Enqueues recorded commands on the queue stream ([`crate::stream_encoder`]);
    /// from the first indirect dispatch on, a continuation runs them
    /// ([`crate::indirect`]). `keep` holds the commands (their direct
    /// buffers and executables) and the table's buffers until the stream
    /// has passed them.
    pub(crate) fn enqueue_commands(
        &self,
        commands: &Arc<[Command]>,
        table: &[Binding],
        keep: &mut InFlightResources,
    ) -> Result<()> {
        keep.commands.push(commands.clone());
        self.enqueue_held_commands(commands, table, keep)
    }

    /// [`Self::enqueue_commands`] for commands the caller keeps alive until
    /// the operation is reported (`keep` holds only the table's buffers).
    pub(crate) fn enqueue_held_commands(
        &self,
        commands: &[Command],
        table: &[Binding],
        keep: &mut InFlightResources,
    ) -> Result<()> {
        for b in table {
            keep.buffers.push(b.buffer.clone());
        }
        let shared = &self.shared;
        match crate::stream_encoder::replay(
            shared,
            shared.stream,
            commands,
            table,
            keep,
            AtIndirect::Stop,
        )? {
            None => Ok(()),
            Some(i) => crate::indirect::defer(shared, commands[i..].into(), table, keep),
        }
    }
}

impl QueueOrder for CudaDevice {
    unsafe fn order_before_consumer(&self, consumer: Option<CUstream>) -> Result<()> {
        // SAFETY: the caller keeps the contract of the trait's method, which
        // is this method's.
        unsafe { CudaDevice::order_before_consumer(self, consumer) }
    }
}
