//! Demand-paged aligned copies of parameter bytes that sit misaligned in a
//! file (Linux `userfaultfd`).
//!
//! Kernels bind parameters at 64-byte aligned addresses, so a parameter at
//! a misaligned file offset (every tensor of a safetensors file whose JSON
//! header length is not a multiple of 64) cannot be mapped in place and
//! needs a copy. Copying it whole at load time makes every byte resident
//! even when a call reads a few rows of it (an embedding table, of which a
//! call gathers one row per token). Here the copy is made on demand: the
//! aligned buffer is anonymous read-only memory registered with
//! `userfaultfd`, and the first access to each chunk ([`chunk_size`]) blocks
//! while one helper thread of the process reads that chunk from the file
//! (`pread`, so the file's page cache is never mapped into the process) and
//! installs it (`UFFDIO_COPY`). Chunks never touched never become resident.
//!
//! The mechanism is optional: where `userfaultfd` is missing or refused
//! (other systems, container seccomp profiles, kernels before 5.11 for
//! unprivileged processes) [`DemandPaged::new`] returns None and callers
//! copy eagerly. The limits are those of a memory-mapped parameter file,
//! plus one:
//! - the file must not shrink while a copy lives. Where it does (or a read
//!   fails otherwise), the process neither aborts nor hangs nor takes a
//!   SIGBUS (what touching a truncated map does): the chunk is installed
//!   zero-filled so the faulting thread goes on, the failure is printed
//!   once and recorded ([`failures`], [`DemandPaged::failure`]), and
//!   parameter operations after it fail with `DATA_LOSS`; results computed
//!   from the zeros are wrong, and the error says so;
//! - a forked child (a Python `DataLoader` worker) gets copies of its own:
//!   the parent's mappings are not inherited (`MADV_DONTFORK`: an
//!   inherited one would read zeros where the parent had not filled it,
//!   since the parent's descriptor serves only the parent), and a fork
//!   handler in the child maps fresh ones at the same addresses and starts
//!   the child's own pager for them (or, where it cannot, fills them
//!   eagerly from the files), so objects the child inherited read the
//!   file's bytes;
//! - without the privilege to handle kernel-mode faults, the descriptor is
//!   user-mode only, and a system call that reads a chunk not yet present
//!   straight from the buffer (`write(2)` of its bytes) fails with EFAULT.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;

/// Bytes installed per fault (at least a page): large enough that reading a
/// whole weight matrix takes few faults, small enough that gathering a row
/// of a table touches little of it.
pub fn chunk_size() -> usize {
    const CHUNK: usize = 64 * 1024;
    CHUNK.max(page_size())
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096).max(4096)
}

// The userfaultfd ABI (linux/userfaultfd.h): ioctl numbers are
// _IOC(dir, 0xAA, nr, size) with dir 3 (read/write) or 2 (read).
const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFDIO_API: u64 = 0xC018_AA3F;
const UFFDIO_REGISTER: u64 = 0xC020_AA00;
const UFFDIO_UNREGISTER: u64 = 0x8010_AA01;
const UFFDIO_WAKE: u64 = 0x8010_AA02;
const UFFDIO_COPY: u64 = 0xC028_AA03;
/// Bit of `uffdio_register.ioctls` saying UFFDIO_COPY works on the range.
const UFFDIO_COPY_BIT: u64 = 1 << 3;
/// `sizeof(struct uffd_msg)`; a page fault's address is at byte 16.
const MSG_SIZE: usize = 32;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// Read failures of the pager so far (file, offset, error), in order.
static FAILURES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Every read failure the process's pager met so far (a parameter file
/// truncated or unreadable while a demand-paged copy of it lived): the
/// chunks concerned read as zeros.
pub fn failures() -> Vec<String> {
    FAILURES.lock().clone()
}

/// Where the bytes of one registered buffer come from.
struct Region {
    /// Length of the mapping (the bytes rounded up to whole pages).
    mapped_len: usize,
    /// Bytes from the file; the rest of the last page reads as zeros.
    len: usize,
    file: Arc<File>,
    offset: u64,
    name: Arc<str>,
    /// The first read failure for this buffer.
    failure: Arc<Mutex<Option<String>>>,
}

/// The process's userfaultfd and the buffers registered with it, served by
/// one helper thread.
struct Pager {
    uffd: OwnedFd,
    /// The process whose address space `uffd` serves (a forked child
    /// inherits the descriptor but must not use it).
    pid: u32,
    /// Registered buffers by start address. The helper holds the lock while
    /// it fills a chunk, so a buffer is never unmapped under a fill.
    regions: Mutex<BTreeMap<usize, Region>>,
    /// The helper stopped (the descriptor failed): no new registrations.
    stopped: std::sync::atomic::AtomicBool,
}

/// The pager of this process.
enum PagerState {
    Unstarted,
    /// userfaultfd is unavailable (copies are made eagerly).
    Unavailable,
    Running(&'static Pager),
}

static PAGER: Mutex<PagerState> = Mutex::new(PagerState::Unstarted);

/// The process's pager, started on first use; None where userfaultfd is
/// unavailable or the pager stopped.
fn pager() -> Option<&'static Pager> {
    let mut state = PAGER.lock();
    if matches!(*state, PagerState::Unstarted) {
        *state = match Pager::start() {
            Some(p) => PagerState::Running(p),
            None => PagerState::Unavailable,
        };
        fork::register_handlers();
    }
    match *state {
        PagerState::Running(p)
            if p.pid == std::process::id()
                && !p.stopped.load(std::sync::atomic::Ordering::Acquire) =>
        {
            Some(p)
        }
        _ => None,
    }
}

/// The process's pager, stopped or not (for unregistering).
fn current_pager() -> Option<&'static Pager> {
    match *PAGER.lock() {
        PagerState::Running(p) if p.pid == std::process::id() => Some(p),
        _ => None,
    }
}

/// `ioctl(fd, request, arg)`, as an io::Result.
///
/// # Safety
/// `arg` must point to the structure `request` reads and writes.
unsafe fn uffd_ioctl<T>(fd: &OwnedFd, request: u64, arg: *mut T) -> std::io::Result<()> {
    // SAFETY: the caller passes the structure the request expects.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Pager {
    /// A new descriptor for this process's address space and its
    /// serving thread (the pager lives as long as the process).
    fn start() -> Option<&'static Pager> {
        // Privileged descriptors also serve faults taken inside system
        // calls; unprivileged processes get a user-mode-only one.
        let uffd = [0, UFFD_USER_MODE_ONLY].into_iter().find_map(|mode| {
            // SAFETY: userfaultfd takes a flags word and returns a new
            // descriptor (or -1); it touches no memory of ours.
            let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | mode) };
            let fd = libc::c_int::try_from(fd).ok().filter(|fd| *fd >= 0)?;
            // SAFETY: `fd` is a descriptor just opened and owned by no one else.
            Some(unsafe { OwnedFd::from_raw_fd(fd) })
        })?;
        let mut api = UffdioApi {
            api: UFFD_API,
            features: 0,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes a `struct uffdio_api`.
        unsafe { uffd_ioctl(&uffd, UFFDIO_API, &mut api) }.ok()?;
        let pager: &'static Pager = Box::leak(Box::new(Pager {
            uffd,
            pid: std::process::id(),
            regions: Mutex::new(BTreeMap::new()),
            stopped: std::sync::atomic::AtomicBool::new(false),
        }));
        let started = std::thread::Builder::new()
            .name("ferrite-param-pager".into())
            .spawn(move || pager.serve());
        if started.is_err() {
            pager
                .stopped
                .store(true, std::sync::atomic::Ordering::Release);
            return None;
        }
        Some(pager)
    }

    /// Answers page faults forever: each fault installs the chunk holding
    /// the faulting address.
    fn serve(&self) {
        let mut bounce = vec![0u8; chunk_size()];
        loop {
            let mut msg = [0u8; MSG_SIZE];
            // SAFETY: reads at most MSG_SIZE bytes into a MSG_SIZE buffer.
            let n = unsafe { libc::read(self.uffd.as_raw_fd(), msg.as_mut_ptr().cast(), MSG_SIZE) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
                    continue;
                }
                // Nothing would serve faults any more: every buffer is
                // handed back to the kernel, so waiting threads go on.
                self.stop(&format!("reading userfaultfd events: {e}"));
                return;
            }
            if n as usize != MSG_SIZE || msg[0] != UFFD_EVENT_PAGEFAULT {
                continue;
            }
            let mut address = [0u8; 8];
            address.copy_from_slice(&msg[16..24]);
            self.fill(u64::from_ne_bytes(address) as usize, &mut bounce);
        }
    }

    /// Installs the chunk that holds `address`, read from its file.
    fn fill(&self, address: usize, bounce: &mut [u8]) {
        let regions = self.regions.lock();
        let found = regions
            .range(..=address)
            .next_back()
            .filter(|(start, r)| address < *start + r.mapped_len);
        let Some((&start, region)) = found else {
            // A fault on a buffer dropped meanwhile: nothing to install.
            self.wake(address & !(page_size() - 1), page_size());
            return;
        };
        let chunk = chunk_size();
        let at = (address - start) / chunk * chunk;
        let length = chunk.min(region.mapped_len - at);
        let data = length.min(region.len.saturating_sub(at));
        if let Err(e) = region
            .file
            .read_exact_at(&mut bounce[..data], region.offset + at as u64)
        {
            // The faulting thread cannot be handed an error: it gets
            // zeros, and the failure is recorded for the next parameter
            // operation to report.
            let what = format!(
                "reading {data} bytes at offset {} of parameter file '{}': {e} (was the file truncated while in use?); those bytes read as zeros",
                region.offset + at as u64,
                region.name
            );
            record(region, what);
            bounce[..data].fill(0);
        }
        bounce[data..length].fill(0);
        if let Err(e) = self.install(start + at, &bounce[..length]) {
            // The bytes cannot be installed: the buffer is handed back to
            // the kernel, so the faulting thread (and later ones) read the
            // mapping's zero pages instead of waiting forever.
            let what = format!(
                "installing bytes of parameter file '{}' (UFFDIO_COPY): {e}; its copy reads as zeros from here on",
                region.name
            );
            record(region, what);
            self.unregister(start, region.mapped_len);
        }
    }

    /// Registers the mapping `[start, start+len)` (missing-page faults);
    /// false where that fails or UFFDIO_COPY would not work on it.
    fn register(&self, start: usize, len: usize) -> bool {
        let mut register = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes a `struct
        // uffdio_register`; the range is a mapping of this process the
        // caller made for this.
        let registered = unsafe { uffd_ioctl(&self.uffd, UFFDIO_REGISTER, &mut register) };
        registered.is_ok() && register.ioctls & UFFDIO_COPY_BIT != 0
    }

    /// Hands `[start, start+len)` back to the kernel: faults on it are no
    /// longer reported to this descriptor (threads waiting are woken and
    /// retry without it).
    fn unregister(&self, start: usize, len: usize) {
        let mut range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_UNREGISTER reads a `struct uffdio_range` of a
        // mapping this pager registered.
        let _ = unsafe { uffd_ioctl(&self.uffd, UFFDIO_UNREGISTER, &mut range) };
    }

    /// The descriptor failed: every buffer is handed back to the kernel
    /// (and marked failed), and no new ones are registered.
    fn stop(&self, what: &str) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::Release);
        let regions = self.regions.lock();
        for (&start, region) in regions.iter() {
            record(
                region,
                format!(
                    "{what}; parameter file '{}' copy reads as zeros from here on",
                    region.name
                ),
            );
            self.unregister(start, region.mapped_len);
        }
    }

    /// Copies `bytes` to the missing pages at `dst` and wakes the threads
    /// waiting on them.
    fn install(&self, dst: usize, bytes: &[u8]) -> std::io::Result<()> {
        let mut done = 0usize;
        while done < bytes.len() {
            let mut copy = UffdioCopy {
                dst: (dst + done) as u64,
                src: bytes[done..].as_ptr() as u64,
                len: (bytes.len() - done) as u64,
                mode: 0,
                copy: 0,
            };
            // SAFETY: UFFDIO_COPY reads `len` bytes at `src` (inside
            // `bytes`) and installs them at `dst`, a range of a registered
            // mapping this pager owns (its lock is held by the caller).
            match unsafe { uffd_ioctl(&self.uffd, UFFDIO_COPY, &mut copy) } {
                Ok(()) => return Ok(()),
                Err(e) => match e.raw_os_error() {
                    // Interrupted by a change of the address space: go on
                    // after what was copied.
                    Some(libc::EAGAIN) => done += usize::try_from(copy.copy).unwrap_or(0),
                    // Already present: wake whoever waits.
                    Some(libc::EEXIST) => {
                        self.wake(dst, bytes.len());
                        return Ok(());
                    }
                    // The mapping is gone: no one can be waiting on it.
                    Some(libc::ENOENT | libc::ESRCH) => return Ok(()),
                    _ => return Err(e),
                },
            }
        }
        Ok(())
    }

    fn wake(&self, start: usize, len: usize) {
        let mut range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_WAKE reads a `struct uffdio_range`. A failure
        // leaves nothing waiting that a later fill would not wake.
        let _ = unsafe { uffd_ioctl(&self.uffd, UFFDIO_WAKE, &mut range) };
    }
}

/// Records a failure of `region` (its first one) and the process's list,
/// and says it once on stderr.
fn record(region: &Region, what: String) {
    eprintln!("ferrite: demand-paged parameters: {what}");
    region.failure.lock().get_or_insert_with(|| what.clone());
    FAILURES.lock().push(what);
}

/// An aligned, read-only copy of `len` bytes of a file, filled on first
/// access chunk by chunk. Dropping it unmaps it.
pub struct DemandPaged {
    ptr: NonNull<u8>,
    len: usize,
    mapped_len: usize,
    failure: Arc<Mutex<Option<String>>>,
}

// SAFETY: the memory is read-only for its whole life (pages are installed
// once, by the pager, before any reader proceeds); sharing a pointer to it
// between threads is sharing an immutable byte slice.
unsafe impl Send for DemandPaged {}
// SAFETY: as above.
unsafe impl Sync for DemandPaged {}

impl DemandPaged {
    /// A page-aligned copy of `len` bytes at `offset` of `file` (`name` says
    /// which file in messages), or None where userfaultfd is unavailable,
    /// `len` is zero or the mapping cannot be made. The range must lie
    /// inside the file (the caller checks it).
    pub fn new(file: &Arc<File>, offset: u64, len: usize, name: &str) -> Option<DemandPaged> {
        if len == 0 {
            return None;
        }
        let pager: &'static Pager = pager()?;
        let page = page_size();
        let mapped_len = len.checked_next_multiple_of(page)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let ptr = NonNull::new(raw.cast::<u8>())?;
        let unmap = || {
            // SAFETY: unmaps the mapping made above, which nothing else uses.
            unsafe { libc::munmap(raw, mapped_len) };
        };
        // SAFETY: advice on the mapping made above.
        if unsafe { libc::madvise(raw, mapped_len, libc::MADV_DONTFORK) } != 0 {
            unmap();
            return None;
        }
        // Registered under the lock so that a fault (none can come before
        // the pointer is handed out) always finds the region.
        let mut regions = pager.regions.lock();
        if !pager.register(raw as usize, mapped_len) {
            drop(regions);
            unmap();
            return None;
        }
        let failure = Arc::new(Mutex::new(None));
        regions.insert(
            raw as usize,
            Region {
                mapped_len,
                len,
                file: file.clone(),
                offset,
                name: name.into(),
                failure: failure.clone(),
            },
        );
        Some(DemandPaged {
            ptr,
            len,
            mapped_len,
            failure,
        })
    }

    /// The first failure to read this buffer's bytes from its file (those
    /// chunks read as zeros), if any.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Which of the buffer's pages are resident (`mincore`), for tests and
    /// diagnostics.
    pub fn resident_pages(&self) -> Vec<bool> {
        let page = page_size();
        let mut v = vec![0u8; self.mapped_len / page];
        // SAFETY: the range is this buffer's mapping; `v` has one byte per page.
        let r = unsafe { libc::mincore(self.ptr.as_ptr().cast(), self.mapped_len, v.as_mut_ptr()) };
        if r != 0 {
            return Vec::new();
        }
        v.into_iter().map(|b| b & 1 == 1).collect()
    }
}

impl AsRef<[u8]> for DemandPaged {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` maps `mapped_len >= len` readable bytes for as long
        // as `self` lives; a read of a page not yet present blocks until
        // the pager installs the file's bytes, which never change after.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for DemandPaged {
    fn drop(&mut self) {
        let start = self.ptr.as_ptr() as usize;
        // Under the lock: the pager is not filling this buffer, and will
        // find no region for any fault still queued for it. (In a forked
        // child the pager is the child's, which adopted the region.)
        let pager = current_pager();
        let regions = pager.map(|p| {
            let mut regions = p.regions.lock();
            if regions.remove(&start).is_some() {
                p.unregister(start, self.mapped_len);
            }
            regions
        });
        // SAFETY: the mapping made in `new` (or remade at the same address
        // in a forked child); no reference into it outlives `self` (slices
        // borrow `self`). Unmapping an address range with no mapping is
        // harmless.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped_len) };
        drop(regions);
    }
}

/// Demand-paged copies across `fork` (see the module documentation).
mod fork {
    use super::{page_size, PagerState, Region, PAGER};
    use std::collections::BTreeMap;
    use std::os::unix::fs::FileExt;

    /// Registers the fork handlers once per process (children inherit them).
    pub(super) fn register_handlers() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: the three handlers are `extern "C"` functions that
            // live for the process.
            unsafe { libc::pthread_atfork(Some(before), Some(in_parent), Some(in_child)) };
        });
    }

    /// Before `fork`, in the forking thread: the pager state and its
    /// regions are locked so the child's image of them is consistent (no
    /// other thread of the parent is halfway through them).
    extern "C" fn before() {
        std::mem::forget(PAGER.lock());
        // SAFETY: locked just above by this thread.
        if let PagerState::Running(p) = unsafe { &*PAGER.data_ptr() } {
            std::mem::forget(p.regions.lock());
        }
    }

    /// After `fork`, in the parent: unlocks what [`before`] locked.
    extern "C" fn in_parent() {
        // SAFETY: [`before`] locked both in this thread and forgot the
        // guards; nothing else unlocks them.
        unsafe {
            if let PagerState::Running(p) = &*PAGER.data_ptr() {
                p.regions.force_unlock();
            }
            PAGER.force_unlock();
        }
    }

    /// After `fork`, in the child (one thread, holding what [`before`]
    /// locked): the parent's buffers were not inherited (MADV_DONTFORK),
    /// so their addresses are free; each is mapped again there and served
    /// by the child's own pager, or filled from its file at once where that
    /// cannot be. Nothing here prints or takes a lock another thread of the
    /// parent may have held at the fork.
    extern "C" fn in_child() {
        // SAFETY: [`before`] locked both in the forking thread, which is
        // this thread in the child; no other thread exists here.
        unsafe {
            let state = &mut *PAGER.data_ptr();
            if let PagerState::Running(parent) = *state {
                let regions = std::mem::take(&mut *parent.regions.data_ptr());
                parent.regions.force_unlock();
                *state = adopt(regions);
            }
            PAGER.force_unlock();
        }
    }

    /// Maps the parent's buffers again in this (child) process.
    fn adopt(regions: BTreeMap<usize, Region>) -> PagerState {
        let pager = super::Pager::start();
        for (start, region) in regions {
            if !map_at(start, region.mapped_len) {
                // Left unmapped: touching it faults, as before.
                continue;
            }
            let served = pager.filter(|p| p.register(start, region.mapped_len));
            if served.is_none() {
                fill_now(start, &region);
            }
            protect_read_only(start, region.mapped_len);
            if let Some(p) = served {
                // No fault can come before this: the child's one thread is
                // here.
                p.regions.lock().insert(start, region);
            }
        }
        match pager {
            Some(p) => PagerState::Running(p),
            None => PagerState::Unavailable,
        }
    }

    /// A writable private anonymous mapping of `len` bytes at exactly
    /// `start`, not inherited by further forks.
    fn map_at(start: usize, len: usize) -> bool {
        // SAFETY: a fresh anonymous mapping at an address range no mapping
        // of this process holds (MAP_FIXED_NOREPLACE fails otherwise).
        let raw = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return false;
        }
        if raw as usize != start {
            // SAFETY: the mapping just made elsewhere, unused.
            unsafe { libc::munmap(raw, len) };
            return false;
        }
        // SAFETY: advice on the mapping just made.
        unsafe { libc::madvise(raw, len, libc::MADV_DONTFORK) };
        true
    }

    /// Reads the region's bytes from its file into its mapping now; bytes
    /// that cannot be read stay zero.
    fn fill_now(start: usize, region: &Region) {
        // SAFETY: `[start, start + mapped_len)` is the writable mapping
        // `map_at` just made, referenced by nothing yet in this process
        // but the inherited buffer object, which no thread uses here.
        let bytes = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, region.len) };
        let _ = region.file.read_exact_at(bytes, region.offset);
    }

    fn protect_read_only(start: usize, len: usize) {
        debug_assert_eq!(len % page_size(), 0);
        // SAFETY: changes the protection of the mapping made by `map_at`.
        unsafe { libc::mprotect(start as *mut libc::c_void, len, libc::PROT_READ) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_paged_copies_hold_the_file_bytes_and_fill_only_touched_chunks() {
        let dir = std::env::temp_dir().join(format!("ferrite-dp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.bin");
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        // A misaligned offset and a length ending mid-page.
        let (offset, len) = (24u64, 5 * chunk_size() + 1234);
        let Some(copy) = DemandPaged::new(&file, offset, len, "p.bin") else {
            ferrite_testkit::skip_or_fail(
                "demand_paged_copies_hold_the_file_bytes_and_fill_only_touched_chunks",
                "userfaultfd is unavailable here",
            );
            return;
        };
        let bytes = copy.as_ref();
        assert_eq!(bytes.as_ptr() as usize % page_size(), 0);
        assert!(
            copy.resident_pages().iter().all(|r| !r),
            "filled before use"
        );
        // One byte of the third chunk fills that chunk only.
        let probe = 2 * chunk_size() + 100;
        assert_eq!(bytes[probe], data[offset as usize + probe]);
        let per_chunk = chunk_size() / page_size();
        let resident = copy.resident_pages();
        for (page, r) in resident.iter().enumerate() {
            assert_eq!(*r, page / per_chunk == 2, "page {page}");
        }
        // All bytes, read from several threads at once.
        std::thread::scope(|s| {
            for t in 0..4 {
                let data = &data;
                s.spawn(move || {
                    for i in (t..len).step_by(997) {
                        assert_eq!(bytes[i], data[offset as usize + i], "byte {i}");
                    }
                });
            }
        });
        assert_eq!(bytes, &data[offset as usize..offset as usize + len]);
        drop(copy);
        // A second buffer after the first is gone works the same.
        let again = DemandPaged::new(&file, 3, 100, "p.bin").unwrap();
        assert_eq!(again.as_ref(), &data[3..103]);

        // A forked child reads the parent's buffer (chunks the parent
        // filled and chunks it did not), makes copies of its own, and
        // dropping its image of the parent's buffer leaves the parent's
        // one served.
        let fresh = DemandPaged::new(&file, 5, 3 * chunk_size(), "p.bin").unwrap();
        assert_eq!(fresh.as_ref()[10], data[15]);
        // SAFETY: the child reads memory, makes and drops buffers (its own
        // pager serves them) and ends with `_exit`.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
        if child == 0 {
            let inherited = fresh.as_ref() == &data[5..5 + 3 * chunk_size()];
            let own = DemandPaged::new(&file, 7, 2 * chunk_size(), "p.bin")
                .is_some_and(|c| c.as_ref() == &data[7..7 + 2 * chunk_size()]);
            drop(fresh);
            // SAFETY: ends the child without running the parent's exit hooks.
            unsafe { libc::_exit(if inherited && own { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child status {status:#x}"
        );
        assert_eq!(fresh.as_ref(), &data[5..5 + 3 * chunk_size()]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_file_truncated_under_a_copy_reads_zeros_and_records_the_failure() {
        let dir = std::env::temp_dir().join(format!("ferrite-dp-trunc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.bin");
        let data = vec![7u8; 4 * chunk_size()];
        std::fs::write(&path, &data).unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        let Some(copy) = DemandPaged::new(&file, 8, 3 * chunk_size(), "t.bin") else {
            ferrite_testkit::skip_or_fail(
                "a_file_truncated_under_a_copy_reads_zeros_and_records_the_failure",
                "userfaultfd is unavailable here",
            );
            return;
        };
        assert_eq!(copy.as_ref()[0], 7);
        assert_eq!(copy.failure(), None);
        // Another process shrinks the file: the next chunk cannot be read.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(chunk_size() as u64)
            .unwrap();
        // The faulting read returns (no abort, no hang, no SIGBUS).
        assert_eq!(copy.as_ref()[2 * chunk_size()], 0);
        let why = copy.failure().expect("the failure is recorded");
        assert!(
            why.contains("'t.bin'") && why.contains("truncated"),
            "{why}"
        );
        assert!(failures().iter().any(|f| f == &why));
        std::fs::remove_dir_all(&dir).ok();
    }
}
