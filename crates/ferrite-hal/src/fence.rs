//! Fences (the `hal.fence` ref type): sets of semaphore timepoints.
//!
//! A fence holds at most one timepoint per semaphore: inserting a semaphore
//! already present keeps the larger value, and joining fences merges them the
//! same way. A fence is reached when every timepoint is reached; it is failed
//! as soon as any of its semaphores has failed. An empty fence is always
//! reached.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferrite_base::spin::SpinLock;
use ferrite_base::wait::{wait_sources, Helper, Helpers, Notifier, WaitMode, WaitSource};
use ferrite_base::RefObject;
use ferrite_base::{Result, Status, StatusCode, Timeout};
use smallvec::SmallVec;

use crate::semaphore::{failure_epoch, Semaphore, Timepoint};

/// A fence's timepoints, or a copy taken to act on them outside its lock.
/// Fences of the programs compiled today hold one or two, which then need
/// no allocation.
type Timepoints = SmallVec<[(Arc<Semaphore>, u64); 2]>;

/// Most fences a thread's pool keeps (see [`Fence::pooled_new`]); programs
/// hold only a few queue fences alive at once.
const POOLED_FENCES: usize = 8;

thread_local! {
    static FENCE_POOL: std::cell::RefCell<Vec<Arc<Fence>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// `Arc::get_mut` for the pool's reuse checks, with plain loads where
/// `get_mut` takes an atomic compare-exchange (locking the weak count). A
/// new reference to the object can only come from an `Arc` or a `Weak` of
/// it: with one strong count (this one, borrowed mutably here) and no
/// `Weak`, none can appear, so the object is ours alone.
#[inline]
fn unique_mut<T>(arc: &mut Arc<T>) -> Option<&mut T> {
    if Arc::strong_count(arc) != 1 || Arc::weak_count(arc) != 0 {
        return None;
    }
    // Pairs with the release decrement of the last other holder (as
    // `get_mut` does): its uses of the object happen before ours.
    std::sync::atomic::fence(Ordering::Acquire);
    // SAFETY: the object is reachable through this `Arc` only (see above)
    // and the `Arc` is borrowed mutably for the returned lifetime, so no
    // other reference to the object exists or can be made meanwhile; the
    // pointer from `Arc::as_ptr` stays valid while the `Arc` lives.
    Some(unsafe { &mut *(Arc::as_ptr(arc) as *mut T) })
}

/// A set of (semaphore, value) timepoints, one per semaphore.
#[derive(Default)]
pub struct Fence {
    timepoints: SpinLock<Timepoints>,
    /// 1 + the semaphore failure count (`semaphore::failure_epoch`) at which
    /// every timepoint was seen reached, 0 when not known: while the count is
    /// unchanged the fence is still reached and none of its semaphores has
    /// failed, so `query` and `wait` answer without the lock (the queue path
    /// asks each fence several times after it was signalled). Set under the
    /// lock; cleared under it (or through `&mut`) whenever timepoints change.
    reached_at: AtomicU64,
}

impl RefObject for Fence {
    fn type_name(&self) -> &'static str {
        "hal.fence"
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        // A fence is usually the last holder of the semaphore it was created
        // with (`hal.fence.create`): hand it back for reuse.
        for (sem, _) in self.timepoints.get_mut().drain(..) {
            Semaphore::recycle(sem);
        }
    }
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tps = self.timepoints.lock();
        f.debug_list()
            .entries(
                tps.iter()
                    .map(|(s, v)| format!("{:p}>={v}", Arc::as_ptr(s))),
            )
            .finish()
    }
}

impl Clone for Fence {
    /// A new fence with the same timepoints.
    fn clone(&self) -> Fence {
        Fence {
            timepoints: SpinLock::new(self.snapshot()),
            reached_at: AtomicU64::new(0),
        }
    }
}

impl Fence {
    /// An empty fence (always reached).
    pub fn new() -> Fence {
        Fence::default()
    }

    /// A shared empty fence, for optional fence arguments that are absent.
    /// Being shared, it must never gain timepoints: only wait on, query or
    /// signal it (all no-ops).
    pub fn empty() -> &'static Fence {
        static EMPTY: std::sync::OnceLock<Fence> = std::sync::OnceLock::new();
        EMPTY.get_or_init(Fence::new)
    }

    /// A fence with the single timepoint `semaphore >= value`.
    pub fn create_at(semaphore: Arc<Semaphore>, value: u64) -> Fence {
        Fence {
            timepoints: SpinLock::new(smallvec::smallvec![(semaphore, value)]),
            reached_at: AtomicU64::new(0),
        }
    }

    /// A fence at value 1 of a new semaphore (what `hal.fence.create`
    /// makes), as a shared object drawn from this thread's pool: fences of
    /// the pool that nobody else holds any more are reset and handed out
    /// again, so the queue operations of a running program allocate no
    /// fences or semaphores.
    pub fn pooled_new() -> Arc<Fence> {
        let pooled = FENCE_POOL.try_with(|pool| {
            let mut pool = pool.try_borrow_mut().ok()?;
            for f in pool.iter_mut() {
                if let Some(fence) = unique_mut(f) {
                    fence.reset_to_new_semaphore();
                    return Some(f.clone());
                }
            }
            let f = Arc::new(Fence::create_at(Semaphore::new(0), 1));
            if pool.len() < POOLED_FENCES {
                pool.push(f.clone());
            }
            Some(f)
        });
        pooled
            .ok()
            .flatten()
            .unwrap_or_else(|| Arc::new(Fence::create_at(Semaphore::new(0), 1)))
    }

    /// Makes an unshared fence equal to `create_at(new semaphore, 1)`,
    /// keeping its semaphore when nobody else holds it.
    fn reset_to_new_semaphore(&mut self) {
        *self.reached_at.get_mut() = 0;
        let tps = self.timepoints.get_mut();
        if tps.len() == 1 {
            if let Some(sem) = unique_mut(&mut tps[0].0) {
                sem.reset(0);
                tps[0].1 = 1;
                return;
            }
        }
        for (sem, _) in tps.drain(..) {
            Semaphore::recycle(sem);
        }
        tps.push((Semaphore::new(0), 1));
    }

    /// A fence with the timepoints of all `fences`, keeping the largest value
    /// per semaphore.
    pub fn join(fences: &[&Fence]) -> Fence {
        let out = Fence::new();
        for f in fences {
            out.extend(f);
        }
        out
    }

    /// Adds `semaphore >= value`; if the semaphore is already present the
    /// larger value is kept.
    pub fn insert(&self, semaphore: Arc<Semaphore>, value: u64) {
        let mut tps = self.timepoints.lock();
        self.reached_at.store(0, Ordering::Release);
        match tps.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &semaphore)) {
            Some((_, v)) => *v = (*v).max(value),
            None => tps.push((semaphore, value)),
        }
    }

    /// Adds every timepoint of `other` (max per semaphore).
    pub fn extend(&self, other: &Fence) {
        if std::ptr::eq(self, other) {
            return;
        }
        for (s, v) in other.timepoints() {
            self.insert(s, v);
        }
    }

    /// A snapshot of the timepoints.
    pub fn timepoints(&self) -> Vec<(Arc<Semaphore>, u64)> {
        self.timepoints.lock().to_vec()
    }

    fn snapshot(&self) -> Timepoints {
        self.timepoints.lock().clone()
    }

    /// The number of timepoints (distinct semaphores).
    pub fn timepoint_count(&self) -> usize {
        self.timepoints.lock().len()
    }

    /// True when the fence has no timepoints.
    pub fn is_empty(&self) -> bool {
        self.timepoints.lock().is_empty()
    }

    /// Signals every semaphore to its timepoint value. Stops at and returns
    /// the first error (e.g. a semaphore already signalled past its value).
    pub fn signal(&self) -> Result<()> {
        let epoch = failure_epoch();
        let single = match self.timepoints.lock().as_slice() {
            [] => return Ok(()),
            // Nothing scheduled on the semaphore: signal it right here.
            [(s, v)] => match s.signal_quiet(*v) {
                Some(Ok(())) => {
                    // Reached now, by this call (the lock is still held).
                    self.reached_at.store(epoch + 1, Ordering::Release);
                    return Ok(());
                }
                Some(outcome) => return outcome,
                None => Some((s.clone(), *v)),
            },
            _ => None,
        };
        if let Some((s, v)) = single {
            return s.signal(v);
        }
        for (s, v) in self.snapshot() {
            s.signal(v)?;
        }
        Ok(())
    }

    /// Fails every semaphore of the fence with `status`.
    pub fn fail(&self, status: Status) {
        for (s, _) in self.snapshot() {
            s.fail(status.clone());
        }
    }

    /// Tells each of the fence's semaphores that `queue`'s pending work
    /// will signal it to its value here (see [`Semaphore::signalled_by`]):
    /// threads blocked on them may run `queue`'s ready work meanwhile.
    pub fn signalled_by(&self, queue: &std::sync::Weak<dyn Helper>) {
        for (s, v) in self.timepoints.lock().iter() {
            s.signalled_by(*v, queue);
        }
    }

    /// `Ok(true)` when every timepoint is reached, `Ok(false)` while any is
    /// pending, the failure status once any semaphore has failed.
    pub fn query(&self) -> Result<bool> {
        if self.known_reached() {
            return Ok(true);
        }
        let epoch = failure_epoch();
        let tps = self.timepoints.lock();
        let mut reached = true;
        for (s, v) in tps.iter() {
            reached &= s.reached_fast(*v) || s.query()? >= *v;
        }
        if reached {
            self.reached_at.store(epoch + 1, Ordering::Release);
        }
        Ok(reached)
    }

    /// True when every timepoint was seen reached and no semaphore has
    /// failed since (see `reached_at`); false means "ask under the lock".
    #[inline]
    fn known_reached(&self) -> bool {
        let at = self.reached_at.load(Ordering::Acquire);
        at != 0 && at == failure_epoch().wrapping_add(1)
    }

    /// Blocks until reached (`Ok(true)`), the timeout passes (`Ok(false)`),
    /// or a semaphore fails (its status).
    pub fn wait(&self, timeout: Timeout) -> Result<bool> {
        if self.known_reached() {
            return Ok(true);
        }
        let deadline = timeout.to_deadline();
        let epoch = failure_epoch();
        let single = match self.timepoints.lock().as_slice() {
            [] => {
                self.reached_at.store(epoch + 1, Ordering::Release);
                return Ok(true);
            }
            [(s, v)] if s.reached_fast(*v) => {
                self.reached_at.store(epoch + 1, Ordering::Release);
                return Ok(true);
            }
            [(s, v)] => Some((s.clone(), *v)),
            _ => None,
        };
        let result = match single {
            Some((s, v)) => s.wait_until(v, deadline),
            None if ferrite_base::trace::enabled() => self.wait_all_traced(deadline),
            None => wait_sources(&self.wait_sources(), WaitMode::All, deadline),
        };
        match result {
            Ok(()) => Ok(true),
            Err(e) if e.code() == StatusCode::DeadlineExceeded && !self.any_failed() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The multi-semaphore wait while a trace is recorded: a span on the
    /// waiting thread naming the timepoints and who reached each last.
    fn wait_all_traced(&self, deadline: ferrite_base::Deadline) -> Result<()> {
        use ferrite_base::trace::{self, Arg};
        let start = trace::now_ns();
        let outcome = wait_sources(&self.wait_sources(), WaitMode::All, deadline);
        let timepoints = self.timepoints();
        let mut args = vec![(
            "values",
            Arg::List(timepoints.iter().map(|(_, v)| *v).collect()),
        )];
        let woken: Vec<String> = timepoints
            .iter()
            .filter_map(|(s, _)| s.woken_by())
            .collect();
        if !woken.is_empty() {
            args.push(("woken_by", Arg::Str(woken.join("; "))));
        }
        if let Err(e) = &outcome {
            args.push(("failed", Arg::Str(e.to_string())));
        }
        trace::complete("wait", "fence wait", trace::HOST_TRACK, start, args);
        outcome
    }

    fn any_failed(&self) -> bool {
        self.timepoints
            .lock()
            .iter()
            .any(|(s, _)| s.failure().is_some())
    }

    /// One wait source per timepoint (wait on them with mode ALL), e.g. for
    /// the VM's coroutine wait frames.
    pub fn wait_sources(&self) -> Vec<Arc<dyn WaitSource>> {
        self.timepoints
            .lock()
            .iter()
            .map(|(s, v)| {
                Arc::new(Timepoint {
                    semaphore: s.clone(),
                    value: *v,
                }) as Arc<dyn WaitSource>
            })
            .collect()
    }
}

/// A fence is itself a wait source: ready when reached, failed when any
/// semaphore failed. Use `Arc<Fence>` as `Arc<dyn WaitSource>`.
impl WaitSource for Fence {
    fn poll(&self) -> Result<bool> {
        self.query()
    }

    fn subscribe(&self, notifier: &Arc<Notifier>) {
        for tp in self.wait_sources() {
            tp.subscribe(notifier);
        }
    }

    fn unsubscribe(&self, notifier: &Arc<Notifier>) {
        for tp in self.wait_sources() {
            tp.unsubscribe(notifier);
        }
    }

    fn helpers(&self, out: &mut Helpers) {
        for (s, _) in self.timepoints.lock().iter() {
            s.helpers_into(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;
    use std::time::Duration;

    /// A fence answers "reached" from its cache only while that is still
    /// true: a later failure of its semaphore, or a new timepoint, is seen.
    #[test]
    fn reached_fence_still_sees_later_failure_and_new_timepoints() {
        let s = Semaphore::new(0);
        let f = Fence::create_at(s.clone(), 1);
        assert!(!f.query().unwrap());
        f.signal().unwrap();
        assert!(f.query().unwrap());
        assert!(f.wait(Timeout::INFINITE).unwrap());
        s.fail(Status::new(StatusCode::Aborted, "lost"));
        assert_eq!(f.query().unwrap_err().code(), StatusCode::Aborted);
        assert_eq!(
            f.wait(Timeout::INFINITE).unwrap_err().code(),
            StatusCode::Aborted
        );

        let t = Semaphore::new(0);
        let g = Fence::create_at(t.clone(), 1);
        t.signal(1).unwrap();
        assert!(g.query().unwrap());
        g.insert(t.clone(), 2);
        assert!(!g.query().unwrap());
        assert!(!g
            .wait(Timeout::from_duration(Duration::from_millis(1)))
            .unwrap());
        t.signal(2).unwrap();
        assert!(g.wait(Timeout::INFINITE).unwrap());

        // A pooled fence handed out again starts unreached.
        let p = Fence::pooled_new();
        p.signal().unwrap();
        assert!(p.query().unwrap());
        drop(p);
        let q = Fence::pooled_new();
        assert!(!q.query().unwrap());
    }

    #[test]
    fn join_keeps_max_per_semaphore() {
        let a = Semaphore::new(0);
        let b = Semaphore::new(0);
        let f1 = Fence::create_at(a.clone(), 3);
        let f2 = Fence::create_at(a.clone(), 5);
        f2.insert(b.clone(), 2);
        f2.insert(b.clone(), 1);
        let j = Fence::join(&[&f1, &f2, &f1]);
        assert_eq!(j.timepoint_count(), 2);
        let tps = j.timepoints();
        assert!(tps.iter().any(|(s, v)| Arc::ptr_eq(s, &a) && *v == 5));
        assert!(tps.iter().any(|(s, v)| Arc::ptr_eq(s, &b) && *v == 2));
        f1.extend(&f2);
        assert_eq!(f1.timepoint_count(), 2);
        f1.extend(&f1);
    }

    #[test]
    fn wait_true_false_error() {
        let a = Semaphore::new(0);
        let b = Semaphore::new(0);
        let f = Fence::create_at(a.clone(), 1);
        f.insert(b.clone(), 2);
        assert!(!f.query().unwrap());
        assert!(!f
            .wait(Timeout::from_duration(Duration::from_millis(10)))
            .unwrap());
        assert!(!f.wait(Timeout::IMMEDIATE).unwrap());
        let t = thread::spawn({
            let (a, b) = (a.clone(), b.clone());
            move || {
                thread::sleep(Duration::from_millis(5));
                a.signal(1).unwrap();
                thread::sleep(Duration::from_millis(5));
                b.signal(3).unwrap();
            }
        });
        assert!(f.wait(Timeout::INFINITE).unwrap());
        t.join().unwrap();
        assert!(f.query().unwrap());
        assert!(Fence::new().wait(Timeout::IMMEDIATE).unwrap());

        let c = Semaphore::new(0);
        let g = Fence::create_at(c.clone(), 1);
        g.insert(a.clone(), 1);
        let t = thread::spawn({
            let c = c.clone();
            move || {
                thread::sleep(Duration::from_millis(10));
                c.fail(Status::new(StatusCode::Internal, "kernel fault"));
            }
        });
        let e = g.wait(Timeout::INFINITE).unwrap_err();
        assert_eq!(e.message(), "kernel fault");
        t.join().unwrap();
        assert!(g.query().is_err());
        // Single-timepoint fast path sees the failure too.
        assert!(Fence::create_at(c, 0).wait(Timeout::IMMEDIATE).is_err());
    }

    #[test]
    fn signal_fail_and_wait_source() {
        let a = Semaphore::new(0);
        let b = Semaphore::new(0);
        let f = Fence::create_at(a.clone(), 2);
        f.insert(b.clone(), 4);
        let fa: Arc<Fence> = Arc::new(f.clone());
        let srcs: Vec<Arc<dyn WaitSource>> = vec![fa.clone()];
        let t = thread::spawn({
            let f = f.clone();
            move || {
                thread::sleep(Duration::from_millis(5));
                f.signal().unwrap();
            }
        });
        wait_sources(&srcs, WaitMode::All, ferrite_base::Deadline::InfiniteFuture).unwrap();
        t.join().unwrap();
        assert_eq!((a.query().unwrap(), b.query().unwrap()), (2, 4));
        assert!(f.signal().is_err()); // already signalled past
        f.fail(Status::new(StatusCode::Aborted, "x"));
        assert_eq!(b.query().unwrap_err().code(), StatusCode::Aborted);
        assert_eq!(fa.poll().unwrap_err().code(), StatusCode::Aborted);
    }
}
