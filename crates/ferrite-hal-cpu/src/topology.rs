//! Where `local-task`'s default workers run: one per physical core the
//! process may use, each pinned to its core (its logical CPU and that
//! CPU's SMT siblings, [`core_cpus`]), as upstream's `physical_cores`
//! topology mode places its workers (issue 25).
//!
//! Why pin: on a machine whose CPUs are all busy, an unpinned worker is
//! moved by the scheduler's load balancing, and two workers can share a
//! CPU (each getting a third of it beside a busy process) while another
//! CPU runs none; a stage then waits for the slowest of them. A pinned
//! worker shares its CPU with whatever else runs there, never with
//! another worker of the pool. Upstream pins its workers the same way
//! (worker `k` on core `k` counted from the one after the creating
//! thread's core), so the two runtimes meet the same scheduler.
//!
//! `FERRITE_LOCAL_TASK_PIN=0` restores the placement used before: one
//! unpinned worker per available CPU (a measuring aid, to compare both on
//! one binary); `FERRITE_LOCAL_TASK_PIN=cpu` pins each worker to its one
//! logical CPU only (the default until the whole core was measured better
//! under load).

/// Logical CPU ids this process may run on (its affinity mask), ascending;
/// None when the system does not say.
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: `set` is a plain bit set the kernel fills; its size is
    // passed, and CPU_ISSET reads only bits below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect();
        (!cpus.is_empty()).then_some(cpus)
    }
}

/// Without affinity masks: unknown.
#[cfg(not(target_os = "linux"))]
pub fn allowed_cpus() -> Option<Vec<usize>> {
    None
}

/// The logical CPU the calling thread runs on now (None: unknown).
#[cfg(target_os = "linux")]
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments and has no memory effects.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// Without sched_getcpu: unknown.
#[cfg(not(target_os = "linux"))]
pub fn current_cpu() -> Option<usize> {
    None
}

/// The (package, core) a logical CPU belongs to, from sysfs (None: not
/// known, the CPU then counts as a core of its own).
pub fn sysfs_core_of(cpu: usize) -> Option<(u64, u64)> {
    let read = |leaf: &str| -> Option<u64> {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{leaf}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some((read("physical_package_id")?, read("core_id")?))
}

/// One logical CPU per physical core among `allowed` (the lowest id of
/// each core, `core_of` naming a CPU's core), in core order starting with
/// the core after the one `current` belongs to (so the first worker does
/// not land on the creating thread's core), at most `cap` of them.
pub fn worker_cpus(
    allowed: &[usize],
    core_of: impl Fn(usize) -> Option<(u64, u64)>,
    current: Option<usize>,
    cap: usize,
) -> Vec<usize> {
    // (core key, its lowest allowed CPU), in the order cores first appear
    // among the ascending CPU ids; an unknown core is its CPU alone.
    let mut cores: Vec<(Option<(u64, u64)>, usize)> = Vec::new();
    let mut sorted = allowed.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    for cpu in sorted {
        let key = core_of(cpu);
        if key.is_none() || !cores.iter().any(|(k, _)| *k == key) {
            cores.push((key, cpu));
        }
    }
    // The entry of the creating thread's core (by core, or by CPU when its
    // core is unknown).
    let start = current
        .and_then(|c| {
            let key = core_of(c);
            cores.iter().position(|&(k, first)| match key {
                Some(_) => k == key,
                None => first == c,
            })
        })
        .map_or(0, |i| i + 1);
    let n = cores.len();
    (0..n.min(cap)).map(|k| cores[(start + k) % n].1).collect()
}

/// The default workers' CPUs on this host: one per physical core the
/// process may use, at most `cap` (and never more than the available
/// parallelism, which also counts a cgroup's CPU quota). Empty when the
/// host does not say which CPUs the process may use.
pub fn default_worker_cpus(cap: usize) -> Vec<usize> {
    let Some(allowed) = allowed_cpus() else {
        return Vec::new();
    };
    let parallelism = std::thread::available_parallelism().map_or(1, |n| n.get());
    worker_cpus(
        &allowed,
        sysfs_core_of,
        current_cpu(),
        cap.min(parallelism).max(1),
    )
}

/// Whether `FERRITE_LOCAL_TASK_PIN` (`0`/`false`/`off`) turns default
/// pinning off.
pub fn pinning_disabled(value: Option<&std::ffi::OsStr>) -> bool {
    value
        .and_then(|v| v.to_str())
        .is_some_and(|v| matches!(v.trim(), "0" | "false" | "off"))
}

/// The environment variable read by [`pinning_disabled`] and
/// [`pins_one_cpu`].
pub const PIN_VAR: &str = "FERRITE_LOCAL_TASK_PIN";

/// Whether `FERRITE_LOCAL_TASK_PIN=cpu` asks the default placement to pin
/// each worker to its one logical CPU instead of its whole core.
pub fn pins_one_cpu(value: Option<&std::ffi::OsStr>) -> bool {
    value
        .and_then(|v| v.to_str())
        .is_some_and(|v| v.trim() == "cpu")
}

/// The CPUs a worker placed on `cpu` by default may run on: every CPU of
/// `allowed` on the same physical core as `cpu` (its SMT siblings, `cpu`
/// first), or `cpu` alone when its core is unknown.
///
/// Why the whole core: on a busy machine a worker pinned to one logical
/// CPU shares it with whatever else runs there and waits for that one CPU
/// after every preemption; allowed on its core's siblings it runs on
/// whichever frees first. Upstream's default topology does the same (a
/// processor's affinity covers its SMT pair). On an idle machine the
/// siblings share the core's caches, so nothing is lost.
pub fn core_cpus(
    cpu: usize,
    allowed: &[usize],
    core_of: impl Fn(usize) -> Option<(u64, u64)>,
) -> Vec<usize> {
    let mut out = vec![cpu];
    if let Some(key) = core_of(cpu) {
        let mut rest: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|&c| c != cpu && core_of(c) == Some(key))
            .collect();
        rest.sort_unstable();
        rest.dedup();
        out.extend(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4 cores of 2 hardware threads each: CPUs 0-3 are thread 0 of cores
    /// 0-3, CPUs 4-7 their siblings (a common Linux numbering).
    fn smt(cpu: usize) -> Option<(u64, u64)> {
        Some((0, (cpu % 4) as u64))
    }

    #[test]
    fn one_cpu_per_core_starting_after_the_callers_core() {
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(worker_cpus(&all, smt, None, 64), [0, 1, 2, 3]);
        // The caller on CPU 5 (core 1): workers from core 2 on.
        assert_eq!(worker_cpus(&all, smt, Some(5), 64), [2, 3, 0, 1]);
        assert_eq!(worker_cpus(&all, smt, Some(3), 2), [0, 1]);
        // Only the siblings allowed: one worker per core still, on them.
        assert_eq!(worker_cpus(&[4, 5, 6, 7], smt, Some(4), 64), [5, 6, 7, 4]);
        // Two packages with the same core ids are different cores.
        let two = |cpu: usize| Some(((cpu / 2) as u64, (cpu % 2) as u64));
        assert_eq!(worker_cpus(&[0, 1, 2, 3], two, None, 64), [0, 1, 2, 3]);
        // Unknown topology: each CPU a core of its own.
        assert_eq!(worker_cpus(&[0, 2, 9], |_| None, Some(2), 64), [9, 0, 2]);
        assert_eq!(worker_cpus(&[], smt, None, 64), Vec::<usize>::new());
    }

    #[test]
    fn this_hosts_default_is_within_the_affinity_mask() {
        let Some(allowed) = allowed_cpus() else {
            assert!(default_worker_cpus(64).is_empty());
            return;
        };
        let cpus = default_worker_cpus(64);
        assert!(!cpus.is_empty());
        assert!(cpus.iter().all(|c| allowed.contains(c)), "{cpus:?}");
        let mut unique = cpus.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), cpus.len(), "{cpus:?}");
        assert_eq!(default_worker_cpus(1).len(), 1);
    }

    #[test]
    fn a_default_worker_may_run_on_its_whole_core() {
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(core_cpus(1, &all, smt), [1, 5]);
        assert_eq!(core_cpus(6, &all, smt), [6, 2]);
        // Siblings outside the affinity mask are not added.
        assert_eq!(core_cpus(1, &[0, 1, 2, 3], smt), [1]);
        // Unknown topology: the CPU alone.
        assert_eq!(core_cpus(3, &all, |_| None), [3]);
        // Two packages with the same core ids are different cores.
        let two = |cpu: usize| Some(((cpu / 2) as u64, 0));
        assert_eq!(core_cpus(0, &[0, 1, 2, 3], two), [0, 1]);
    }

    #[test]
    fn the_pin_variable() {
        assert!(pins_one_cpu(Some(std::ffi::OsStr::new("cpu"))));
        assert!(!pins_one_cpu(Some(std::ffi::OsStr::new("1"))));
        assert!(!pins_one_cpu(None));
        use std::ffi::OsStr;
        assert!(pinning_disabled(Some(OsStr::new("0"))));
        assert!(pinning_disabled(Some(OsStr::new("off"))));
        assert!(!pinning_disabled(Some(OsStr::new("1"))));
        assert!(!pinning_disabled(None));
    }
}
