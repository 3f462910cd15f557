//! Device uses held for the life of a submission: the HAL's half of the
//! rule "host access racing device work is refused", for every driver.
//!
//! [`crate::device::queue::execute`] counts a device use on every
//! allocation the command buffer reaches (direct references and the
//! resolved binding table) before the work is handed to the driver, and
//! hands the uses to the submission's signal semaphores
//! ([`crate::semaphore::Semaphore`] keeps them): they end, under the
//! semaphore's lock and before the reached value is published, once a
//! signal semaphore has reached its value or failed. So a host waiter that
//! sees the signal fence reached finds the buffers free, and host access
//! before that is refused with `FAILED_PRECONDITION` whether or not the
//! driver's kernels reach the memory through host pointers (a GPU writing
//! pinned memory does not). The CPU drivers additionally mark each stage
//! as it runs ([`crate::buffer::Buffer::binding_range`]).

use crate::buffer::DeviceUse;
use crate::command_buffer::{Binding, BufferRef, Command};
use ferrite_base::Result;
use smallvec::SmallVec;

/// The device uses of one submission, ended when one of its signal
/// semaphores is reached or failed.
pub(crate) struct SubmissionUses {
    uses: SmallVec<[DeviceUse; 4]>,
}

impl SubmissionUses {
    /// Counts a device use on each buffer `commands` reach under `table`:
    /// a writer where a command may write (transfer targets, dispatch
    /// bindings, whose executables may write any of them, collective
    /// results), a reader where it only reads. References that do not
    /// resolve are skipped: the work fails on them when it runs.
    /// `FAILED_PRECONDITION` (and nothing counted) while the host maps one
    /// of them in a conflicting way.
    pub(crate) fn register(commands: &[Command], table: &[Binding]) -> Result<SubmissionUses> {
        let mut uses: SmallVec<[DeviceUse; 4]> = SmallVec::new();
        let mut add = |r: &BufferRef, write: bool| -> Result<()> {
            if let Ok((buffer, _, _)) = r.resolve(table) {
                uses.push(buffer.begin_device_use(write)?);
            }
            Ok(())
        };
        for c in commands {
            match c {
                Command::Barrier => {}
                Command::Fill { target, .. } | Command::Update { target, .. } => add(target, true)?,
                Command::Copy { source, target } => {
                    add(source, false)?;
                    add(target, true)?;
                }
                Command::Dispatch {
                    indirect, bindings, ..
                } => {
                    if let Some(r) = indirect {
                        add(r, false)?;
                    }
                    for r in bindings {
                        add(r, true)?;
                    }
                }
                Command::Collective { send, recv, .. } => {
                    if let Some(r) = send {
                        add(r, false)?;
                    }
                    if let Some(r) = recv {
                        add(r, true)?;
                    }
                }
            }
        }
        Ok(SubmissionUses { uses })
    }

    /// True when no buffer is used.
    pub(crate) fn is_empty(&self) -> bool {
        self.uses.is_empty()
    }

    /// A signal semaphore of the submission was reached or failed: the
    /// work is over (drivers signal and fail a submission's semaphores only
    /// once it ended), so the uses end; later calls do nothing. Only
    /// atomics: called under the semaphore's lock.
    pub(crate) fn settled(&self) {
        for u in &self.uses {
            u.end();
        }
    }
}
