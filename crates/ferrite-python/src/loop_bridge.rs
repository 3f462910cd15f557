//! `HalDeviceLoopBridge`: resolves asyncio futures when semaphores reach
//! payload values.
//!
//! One thread per bridge blocks (without the GIL) on every pending
//! timepoint plus a control semaphore that `on_semaphore` and `stop` signal
//! to wake it. Results go back to the event loop through
//! `loop.call_soon_threadsafe`, so futures are only touched on the loop's
//! thread: `set_result(value)` when reached, `set_exception(RuntimeError)`
//! when the semaphore failed, `cancel()` for what is still pending at
//! `stop()`.

use crate::hal::PyHalDevice;
use crate::semaphore::PyHalSemaphore;
use crate::status::PyContext;
use ferrite_base::wait::{wait_sources, WaitMode, WaitSource};
use ferrite_base::{Deadline, Status};
use ferrite_hal::semaphore::Semaphore;
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyUserWarning};
use pyo3::prelude::*;
use std::sync::Arc;
use std::thread::JoinHandle;

/// A future waiting for `semaphore >= value`, and what it resolves to.
struct Pending {
    semaphore: Arc<Semaphore>,
    value: u64,
    future: PyObject,
    result: PyObject,
}

/// How a pending future ends.
enum Outcome {
    Reached,
    Failed(Status),
    Cancelled,
}

struct Incoming {
    entries: Vec<Pending>,
    shutdown: bool,
    /// The next value to signal the control semaphore to.
    control_next: u64,
}

/// The bridge's waiting thread and what feeds it: futures queued by
/// `wait`, the control semaphore that wakes the thread when the queue
/// changes, and the loop's `call_soon_threadsafe` that resolves futures.
struct TimepointWaiter {
    incoming: Mutex<Incoming>,
    control: Arc<Semaphore>,
    call_soon: PyObject,
}

impl TimepointWaiter {
    /// Wakes the thread; called with `incoming` locked so values stay ordered.
    fn wake(&self, incoming: &mut Incoming) -> ferrite_base::Result<()> {
        let v = incoming.control_next;
        incoming.control_next += 1;
        self.control.signal(v)
    }

    fn run(&self) {
        let mut pending: Vec<Pending> = Vec::new();
        let mut next_wakeup = 1u64;
        loop {
            let shutdown = {
                let mut inc = self.incoming.lock();
                pending.append(&mut inc.entries);
                inc.shutdown
            };
            if shutdown {
                break;
            }
            let mut done = Vec::new();
            let mut keep = Vec::with_capacity(pending.len());
            for p in pending.drain(..) {
                match p.semaphore.query() {
                    Ok(v) if v >= p.value => done.push((p, Outcome::Reached)),
                    Ok(_) => keep.push(p),
                    Err(e) => done.push((p, Outcome::Failed(e))),
                }
            }
            pending = keep;
            self.deliver(done);
            let mut sources: Vec<Arc<dyn WaitSource>> = pending
                .iter()
                .map(|p| p.semaphore.timepoint(p.value) as Arc<dyn WaitSource>)
                .collect();
            sources.push(self.control.timepoint(next_wakeup));
            // A failure is picked up by the next poll; the control semaphore
            // is never failed, so this cannot spin.
            let _ = wait_sources(&sources, WaitMode::Any, Deadline::InfiniteFuture);
            next_wakeup = self.control.query().unwrap_or(next_wakeup) + 1;
        }
        self.deliver(
            pending
                .into_iter()
                .map(|p| (p, Outcome::Cancelled))
                .collect(),
        );
    }

    /// Hands finished futures to the loop. Errors (e.g. a closed loop) are
    /// reported as unraisable: no caller is left to see them.
    fn deliver(&self, done: Vec<(Pending, Outcome)>) {
        if done.is_empty() {
            return;
        }
        Python::with_gil(|py| {
            for (p, outcome) in done {
                let r = match outcome {
                    Outcome::Reached => {
                        let f = p.future.getattr(py, "set_result");
                        f.and_then(|f| self.call_soon.call1(py, (f, p.result)))
                    }
                    Outcome::Failed(status) => {
                        let exc = PyRuntimeError::new_err(status.to_string()).into_value(py);
                        let f = p.future.getattr(py, "set_exception");
                        f.and_then(|f| self.call_soon.call1(py, (f, exc)))
                    }
                    Outcome::Cancelled => {
                        let f = p.future.getattr(py, "cancel");
                        f.and_then(|f| self.call_soon.call1(py, (f,)))
                    }
                };
                if let Err(e) = r {
                    e.write_unraisable(py, Some(p.future.bind(py)));
                }
            }
        });
    }
}

/// Bridges semaphore timepoints of one device to an asyncio event loop.
#[pyclass(name = "HalDeviceLoopBridge", module = "ferrite._ferrite", frozen)]
pub struct PyHalDeviceLoopBridge {
    waiter: Arc<TimepointWaiter>,
    event_loop: PyObject,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl PyHalDeviceLoopBridge {
    fn stop_thread(&self, py: Python<'_>) -> PyResult<()> {
        let Some(handle) = self.thread.lock().take() else {
            return Ok(());
        };
        {
            let mut inc = self.waiter.incoming.lock();
            inc.shutdown = true;
            self.waiter
                .wake(&mut inc)
                .py_context("HalDeviceLoopBridge stop")?;
        }
        py.allow_threads(|| handle.join())
            .map_err(|_| PyRuntimeError::new_err("HalDeviceLoopBridge thread panicked"))
    }
}

#[pymethods]
impl PyHalDeviceLoopBridge {
    #[new]
    fn new(py: Python<'_>, device: &PyHalDevice, r#loop: PyObject) -> PyResult<Self> {
        let _ = device;
        let waiter = Arc::new(TimepointWaiter {
            incoming: Mutex::new(Incoming {
                entries: Vec::new(),
                shutdown: false,
                control_next: 1,
            }),
            control: Semaphore::new(0),
            call_soon: r#loop.getattr(py, "call_soon_threadsafe")?,
        });
        let runner = waiter.clone();
        let thread = std::thread::Builder::new()
            .name("HalDeviceLoopBridge".into())
            .spawn(move || runner.run())
            .map_err(|e| {
                PyRuntimeError::new_err(format!("could not start the bridge thread: {e}"))
            })?;
        Ok(PyHalDeviceLoopBridge {
            waiter,
            event_loop: r#loop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the thread; futures still pending are cancelled.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.stop_thread(py)
    }

    /// A future of the bridge's loop that resolves to `value` once
    /// `semaphore` reaches `payload` (or fails with its failure).
    fn on_semaphore(
        &self,
        py: Python<'_>,
        semaphore: &PyHalSemaphore,
        payload: u64,
        value: PyObject,
    ) -> PyResult<PyObject> {
        let future = self.event_loop.call_method0(py, "create_future")?;
        let mut inc = self.waiter.incoming.lock();
        if inc.shutdown {
            return Err(PyRuntimeError::new_err("HalDeviceLoopBridge is stopped"));
        }
        inc.entries.push(Pending {
            semaphore: semaphore.semaphore.clone(),
            value: payload,
            future: future.clone_ref(py),
            result: value,
        });
        self.waiter
            .wake(&mut inc)
            .py_context("HalDeviceLoopBridge on_semaphore")?;
        Ok(future)
    }
}

impl Drop for PyHalDeviceLoopBridge {
    fn drop(&mut self) {
        if self.thread.lock().is_none() {
            return;
        }
        Python::with_gil(|py| {
            let _ = PyErr::warn(
                py,
                &py.get_type::<PyUserWarning>(),
                c"HalDeviceLoopBridge deleted while running. Recommend explicitly calling stop() to avoid hanging the gc",
                1,
            );
            if let Err(e) = self.stop_thread(py) {
                e.write_unraisable(py, None);
            }
        });
    }
}
