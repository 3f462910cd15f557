//! Sleeping on a 32-bit word until another thread changes it: the one
//! blocking primitive of the pool (a futex on Linux).
//!
//! A sleeper reads the word, re-checks its condition, then calls
//! [`wait`] with the value it read: the kernel compares and sleeps
//! atomically, so a change made between the read and the call is never
//! missed. A waker changes the word, then calls [`wake`] with how many
//! sleepers it wants: one system call however many threads it wakes, and
//! none of them contends for a lock on the way out (unlike a condition
//! variable's `notify_all`, whose woken threads queue on its mutex).

use std::sync::atomic::AtomicU32;

/// Sleeps while `word` holds `expected` (returns at once if it does not;
/// may return spuriously: callers re-check their condition).
#[cfg(target_os = "linux")]
pub(crate) fn wait(word: &AtomicU32, expected: u32) {
    futex_wait(word, expected, None);
}

/// As [`wait`], for at most `timeout` (returns at its end whether or not
/// the word changed; callers re-check).
#[cfg(target_os = "linux")]
pub(crate) fn wait_for(word: &AtomicU32, expected: u32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    futex_wait(word, expected, Some(&ts));
}

/// FUTEX_WAIT on `word` while it holds `expected`, with an optional
/// relative timeout.
#[cfg(target_os = "linux")]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<&libc::timespec>) {
    let ts = timeout.map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word` (an AtomicU32
    // has u32's layout and lives for the call) and, when not null, the
    // relative timeout behind `ts`, borrowed for the call (null: no
    // timeout). The kernel writes nothing.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            ts,
        );
    }
}

/// Wakes up to `count` threads sleeping in [`wait`] on `word`.
#[cfg(target_os = "linux")]
pub(crate) fn wake(word: &AtomicU32, count: u32) {
    let count = count.min(i32::MAX as u32) as libc::c_int;
    // SAFETY: FUTEX_WAKE only uses the address of `word` as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            count,
        );
    }
}

/// Without futexes: poll the word every 50 µs (correct, not frugal).
#[cfg(not(target_os = "linux"))]
pub(crate) fn wait(word: &AtomicU32, expected: u32) {
    if word.load(std::sync::atomic::Ordering::SeqCst) == expected {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// Without futexes: as [`wait`], the poll no longer than `timeout`.
#[cfg(not(target_os = "linux"))]
pub(crate) fn wait_for(word: &AtomicU32, expected: u32, timeout: std::time::Duration) {
    if word.load(std::sync::atomic::Ordering::SeqCst) == expected {
        std::thread::sleep(timeout.min(std::time::Duration::from_micros(50)));
    }
}

/// Without futexes sleepers poll; nothing to do.
#[cfg(not(target_os = "linux"))]
pub(crate) fn wake(_word: &AtomicU32, _count: u32) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_change_and_wake_release_the_sleeper() {
        let word = Arc::new(AtomicU32::new(0));
        let sleeper = {
            let word = word.clone();
            std::thread::spawn(move || {
                while word.load(Ordering::SeqCst) == 0 {
                    wait(&word, 0);
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        word.store(1, Ordering::SeqCst);
        wake(&word, 1);
        sleeper.join().unwrap();
    }

    #[test]
    fn a_timed_wait_ends_at_its_timeout() {
        let word = AtomicU32::new(0);
        let start = std::time::Instant::now();
        wait_for(&word, 0, Duration::from_millis(5));
        assert!(start.elapsed() >= Duration::from_millis(4));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn waiting_on_a_stale_value_returns_at_once() {
        let word = AtomicU32::new(5);
        wait(&word, 4);
    }
}
