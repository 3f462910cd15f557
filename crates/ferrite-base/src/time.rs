//! Timeouts and deadlines.
//!
//! Every wait API takes a [`Timeout`] and converts it once, at the top, to an
//! absolute [`Deadline`]; nested waits then share the caller's budget instead
//! of each restarting a relative timeout.

use std::time::{Duration, Instant};

/// An absolute point in time by which a wait must finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Deadline {
    /// Already passed: waits only poll.
    InfinitePast,
    /// A monotonic instant.
    At(Instant),
    /// Never expires.
    InfiniteFuture,
}

/// How long a caller is willing to wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    /// Relative to now, in nanoseconds (`0` means poll).
    Relative(u64),
    /// An absolute deadline.
    Absolute(Deadline),
}

impl Timeout {
    /// Poll without blocking.
    pub const IMMEDIATE: Timeout = Timeout::Absolute(Deadline::InfinitePast);
    /// Wait forever.
    pub const INFINITE: Timeout = Timeout::Absolute(Deadline::InfiniteFuture);

    /// A relative timeout from a [`Duration`].
    pub fn from_duration(d: Duration) -> Timeout {
        Timeout::Relative(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Converts to an absolute deadline, anchored at `now`.
    pub fn to_deadline(self) -> Deadline {
        match self {
            Timeout::Absolute(d) => d,
            Timeout::Relative(0) => Deadline::InfinitePast,
            Timeout::Relative(ns) => match Instant::now().checked_add(Duration::from_nanos(ns)) {
                Some(t) => Deadline::At(t),
                None => Deadline::InfiniteFuture,
            },
        }
    }
}

impl Deadline {
    /// A deadline `d` from now.
    pub fn after(d: Duration) -> Deadline {
        Timeout::from_duration(d).to_deadline()
    }

    /// True once the deadline has passed (always for `InfinitePast`).
    pub fn has_passed(self) -> bool {
        match self {
            Deadline::InfinitePast => true,
            Deadline::At(t) => Instant::now() >= t,
            Deadline::InfiniteFuture => false,
        }
    }

    /// Time left, `None` for an infinite future, zero once passed.
    pub fn remaining(self) -> Option<Duration> {
        match self {
            Deadline::InfinitePast => Some(Duration::ZERO),
            Deadline::At(t) => Some(t.saturating_duration_since(Instant::now())),
            Deadline::InfiniteFuture => None,
        }
    }

    /// The earlier of two deadlines.
    pub fn min(self, other: Deadline) -> Deadline {
        std::cmp::min(self, other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_and_conversion() {
        assert!(Deadline::InfinitePast < Deadline::after(Duration::from_secs(1)));
        assert!(Deadline::after(Duration::from_secs(1)) < Deadline::InfiniteFuture);
        assert_eq!(Timeout::Relative(0).to_deadline(), Deadline::InfinitePast);
        assert!(Timeout::IMMEDIATE.to_deadline().has_passed());
        assert!(!Timeout::INFINITE.to_deadline().has_passed());
        assert_eq!(Deadline::InfiniteFuture.remaining(), None);
    }
}
