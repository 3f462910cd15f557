//! The worker pool of `local-task`: a fixed set of threads that run queue
//! submissions and split each dispatch's workgroups between themselves.
//!
//! Two kinds of jobs share the threads: whole submissions (run when their
//! wait fence is reached) and dispatch slices. A dispatch is split by an
//! atomic counter of workgroup chunks that every participant (the workers
//! and the submitting thread) pulls from until none are left, so a slow
//! worker never holds up the others.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

struct Queue {
    jobs: Mutex<(VecDeque<Job>, bool)>,
    ready: Condvar,
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
            ready: Condvar::new(),
        });
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
        let mut g = self.queue.jobs.lock();
        g.0.push_back(job);
        drop(g);
        self.queue.ready.notify_one();
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
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        // Completion counts items, not helpers: a helper that starts late
        // finds nothing left and exits, and the caller never waits on it.
        let done = Arc::new((Mutex::new(0u64), Condvar::new()));
        let run = {
            let next = next.clone();
            let done = done.clone();
            let task = task.clone();
            move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    break;
                }
                task(i);
                let mut d = done.0.lock();
                *d += 1;
                if *d == count {
                    done.1.notify_all();
                }
            }
        };
        for _ in 0..helpers {
            let run = run.clone();
            self.spawn(Box::new(run));
        }
        run();
        let mut finished = done.0.lock();
        while *finished < count {
            done.1.wait(&mut finished);
        }
    }
}

fn worker(q: Arc<Queue>) {
    loop {
        let job = {
            let mut g = q.jobs.lock();
            loop {
                if let Some(j) = g.0.pop_front() {
                    break j;
                }
                if g.1 {
                    return;
                }
                q.ready.wait(&mut g);
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
