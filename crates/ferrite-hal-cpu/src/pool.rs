//! The worker pool of `local-task`: a fixed set of threads that run queue
//! submissions and split each dispatch's workgroups between themselves.
//!
//! Two kinds of jobs share the threads: whole submissions (run when their
//! wait fence is reached) and dispatch slices. A dispatch is split by an
//! atomic counter of workgroup chunks that every participant (the workers
//! and the submitting thread) pulls from until none are left, so a slow
//! worker never holds up the others.
//!
//! An idle worker polls the queue for a short, bounded time ([`SPIN`],
//! yielding the CPU between polls) before it sleeps on the condition
//! variable: programs submit in quick succession (one submission per
//! dispatch), and a worker still awake takes the next job without the
//! futex wake-up a sleeping one needs.
//!
//! The queue is also a [`Helper`]: a thread blocked on a semaphore or fence
//! (the program waiting for its results) runs queued jobs itself while it
//! polls, instead of idling until a woken worker has run them. A new job
//! wakes a sleeping worker only when no thread is polling the queue (see
//! `Queue::push`): a waiter about to run the job itself is not raced by a
//! worker woken for nothing, which on a 2-core host would take the CPU from
//! it. Pools with a
//! requested worker stack size do not lend jobs to waiters, whose stacks
//! may be smaller.

use ferrite_base::wait::{register_helper, Helper};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Job = Box<dyn FnOnce() + Send>;

/// How long an idle worker (or a caller waiting for its dispatch's slices)
/// keeps polling before it sleeps. Short on purpose: 50 µs made 100 small
/// dispatches faster still but cost the 1024³ matmul about 15% on a 2-core
/// host, where the polling worker competes with the computing ones
/// (`scripts/bench-hal.py`).
pub(crate) const SPIN: Duration = Duration::from_micros(5);

struct Queue {
    jobs: Mutex<(VecDeque<Job>, bool)>,
    /// Jobs queued and not yet taken: lets idle workers poll without the lock.
    queued: AtomicUsize,
    /// Threads polling the queue right now (idle workers in their [`SPIN`]
    /// phase, blocked waiters lending their thread), not counting those
    /// running a job. While one polls, a new job needs no wake-up.
    pollers: AtomicUsize,
    ready: Condvar,
}

// The wake-up protocol: `push` bumps `queued` and then reads `pollers`; a
// poller that stops (to sleep, return, or run a job) drops `pollers` and
// then reads `queued`. Both sides use SeqCst, so at least one of them sees
// the other and wakes a worker: a queued job is never left with nobody
// polling and nobody woken.
impl Queue {
    fn push(&self, job: Job) {
        let mut g = self.jobs.lock();
        g.0.push_back(job);
        self.queued.fetch_add(1, Ordering::SeqCst);
        drop(g);
        if self.pollers.load(Ordering::SeqCst) == 0 {
            self.ready.notify_one();
        }
    }

    fn pop(&self) -> Option<Job> {
        let mut g = self.jobs.lock();
        let j = g.0.pop_front();
        if j.is_some() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        j
    }

    fn start_polling(&self) {
        self.pollers.fetch_add(1, Ordering::SeqCst);
    }

    fn stop_polling(&self) {
        self.pollers.fetch_sub(1, Ordering::SeqCst);
        if self.queued.load(Ordering::SeqCst) > 0 {
            self.ready.notify_one();
        }
    }

    /// A polling thread takes a job: it stops polling while it runs it (call
    /// `start_polling` again after).
    fn take_while_polling(&self) -> Option<Job> {
        if self.queued.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let job = self.pop()?;
        self.stop_polling();
        Some(job)
    }
}

impl Helper for Queue {
    fn start_polling(&self) {
        Queue::start_polling(self);
    }

    fn help_one(&self) -> bool {
        match self.take_while_polling() {
            Some(job) => {
                job();
                Queue::start_polling(self);
                true
            }
            None => false,
        }
    }

    fn stop_polling(&self) {
        Queue::stop_polling(self);
    }
}

/// A fixed-size pool of worker threads.
pub struct WorkerPool {
    queue: Arc<Queue>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// Starts `count` workers (at least one).
    pub fn new(count: usize) -> WorkerPool {
        WorkerPool::with_stack_size(count, None)
    }

    /// Starts `count` workers (at least one), each with a stack of
    /// `stack_size` bytes (None: the platform's default for new threads).
    pub fn with_stack_size(count: usize, stack_size: Option<usize>) -> WorkerPool {
        let queue = Arc::new(Queue {
            jobs: Mutex::new((VecDeque::new(), false)),
            queued: AtomicUsize::new(0),
            pollers: AtomicUsize::new(0),
            ready: Condvar::new(),
        });
        if stack_size.is_none() {
            let weak: Weak<dyn Helper> = Arc::downgrade(&queue) as Weak<dyn Helper>;
            register_helper(weak);
        }
        let threads = (0..count.max(1))
            .map(|i| {
                let q = queue.clone();
                let mut builder = std::thread::Builder::new().name(format!("ferrite-worker-{i}"));
                if let Some(size) = stack_size {
                    builder = builder.stack_size(size);
                }
                builder
                    .spawn(move || worker(q))
                    .expect("spawning a worker thread")
            })
            .collect();
        WorkerPool { queue, threads }
    }

    /// Number of worker threads.
    pub fn worker_count(&self) -> usize {
        self.threads.len()
    }

    /// Runs `job` on some worker.
    pub fn spawn(&self, job: Job) {
        self.queue.push(job);
    }

    /// Runs `task(i)` for every `i` in `0..count` using up to `parallelism`
    /// participants (the caller included) and returns once all are done.
    pub fn parallel_for(
        &self,
        count: u64,
        parallelism: usize,
        task: Arc<dyn Fn(u64) + Send + Sync>,
    ) {
        let helpers = parallelism
            .saturating_sub(1)
            .min(count.saturating_sub(1) as usize);
        if helpers == 0 {
            for i in 0..count {
                task(i);
            }
            return;
        }
        struct Shared {
            next: AtomicU64,
            /// Items finished; the participant finishing the last one wakes
            /// the caller.
            done: AtomicU64,
            lock: Mutex<()>,
            all_done: Condvar,
        }
        let shared = Arc::new(Shared {
            next: AtomicU64::new(0),
            done: AtomicU64::new(0),
            lock: Mutex::new(()),
            all_done: Condvar::new(),
        });
        // Completion counts items, not helpers: a helper that starts late
        // finds nothing left and exits, and the caller never waits on it.
        let run = {
            let shared = shared.clone();
            let task = task.clone();
            move || loop {
                let i = shared.next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                task(i);
                if shared.done.fetch_add(1, Ordering::AcqRel) + 1 == count {
                    // Taking the lock orders this wake-up after the caller's
                    // check-then-sleep below.
                    drop(shared.lock.lock());
                    shared.all_done.notify_all();
                }
            }
        };
        for _ in 0..helpers {
            let run = run.clone();
            self.spawn(Box::new(run));
        }
        run();
        let finished = || shared.done.load(Ordering::Acquire) >= count;
        let start = Instant::now();
        while !finished() && start.elapsed() < SPIN {
            std::thread::yield_now();
        }
        let mut g = shared.lock.lock();
        while !finished() {
            shared.all_done.wait(&mut g);
        }
    }
}

fn worker(q: Arc<Queue>) {
    loop {
        // Poll for a while before sleeping (see the module docs).
        let start = Instant::now();
        q.start_polling();
        let mut job = None;
        while start.elapsed() < SPIN {
            job = q.take_while_polling();
            if job.is_some() {
                break;
            }
            std::thread::yield_now();
        }
        let job = match job {
            Some(j) => j,
            None => {
                q.stop_polling();
                let mut g = q.jobs.lock();
                loop {
                    if let Some(j) = g.0.pop_front() {
                        q.queued.fetch_sub(1, Ordering::SeqCst);
                        break j;
                    }
                    if g.1 {
                        return;
                    }
                    q.ready.wait(&mut g);
                }
            }
        };
        job();
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.queue.jobs.lock().1 = true;
        self.queue.ready.notify_all();
        for t in self.threads.drain(..) {
            // A worker that panicked has already reported it.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stack size of the calling thread, as pthreads reports it.
    fn current_stack_size() -> usize {
        // SAFETY: `attr` is initialised by pthread_getattr_np before it is
        // read and destroyed once; `size` is a valid out-pointer; both calls
        // concern the calling thread, which is alive throughout.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
            let mut size = 0usize;
            assert_eq!(libc::pthread_attr_getstacksize(&attr, &mut size), 0);
            libc::pthread_attr_destroy(&mut attr);
            size
        }
    }

    #[test]
    fn jobs_queued_while_a_waiter_polls_still_run() {
        let pool = WorkerPool::new(1);
        let (tx, rx) = std::sync::mpsc::channel();
        for round in 0..200u32 {
            // A waiter polls (and may take the job) for at most a few µs,
            // then stops: whoever does not run the job must have woken a
            // worker for it.
            let waiter = std::thread::spawn(|| {
                let deadline = ferrite_base::time::Deadline::after(Duration::from_micros(20));
                ferrite_base::wait::spin_until(deadline, || false)
            });
            let tx = tx.clone();
            pool.spawn(Box::new(move || tx.send(round).unwrap()));
            waiter.join().unwrap();
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(round));
        }
    }

    #[test]
    fn parallel_for_runs_every_item_once() {
        let pool = WorkerPool::new(2);
        let hits: Arc<Vec<AtomicUsize>> =
            Arc::new((0..1000).map(|_| AtomicUsize::new(0)).collect());
        let h = hits.clone();
        pool.parallel_for(
            1000,
            3,
            Arc::new(move |i| {
                h[i as usize].fetch_add(1, Ordering::Relaxed);
            }),
        );
        assert!(hits.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn workers_get_the_requested_stack_size() {
        for wanted in [256 * 1024, 4 * 1024 * 1024] {
            let pool = WorkerPool::with_stack_size(1, Some(wanted));
            let (tx, rx) = std::sync::mpsc::channel();
            pool.spawn(Box::new(move || tx.send(current_stack_size()).unwrap()));
            let got = rx.recv().unwrap();
            // The system may round up to whole pages (and add a guard page).
            assert!(
                got >= wanted && got < wanted + 64 * 1024,
                "{got} for {wanted}"
            );
        }
    }
}
