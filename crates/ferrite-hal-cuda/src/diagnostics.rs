//! Diagnostics for wrong results, chosen by environment variables:
//!
//! - `FERRITE_CUDA_ALLOCA_INIT=zero|none|poison`: what a queue allocation
//!   (`hal.device.queue.alloca`) holds when handed out. `zero` (the
//!   default) fills it with zeros on the queue stream; `none` leaves it as
//!   it is (a reused block keeps its last user's bytes, and an idle block
//!   is handed out with no stream operation); `poison` fills it with 0xFF
//!   bytes (NaN as floats, -1 as integers), which makes a kernel that reads
//!   memory it never wrote stand out.
//!
//!   Why zero by default: the HAL leaves a queue allocation's contents
//!   undefined, but the pinned compiler's kernel for upstream's e2e
//!   `topk_2d_dim1_max` (top-k.mlir, topk_v2.mlir) never writes row 0's
//!   initial outputs and has threads 1-63 read them from memory: it passes
//!   zeroed and with upstream's driver (by what its pool hands out), and
//!   fails with whatever a reused block held. Programs upstream runs
//!   correctly must run correctly here. The cost is one stream operation
//!   per allocation: on an H200 (issue 24) `add` went from 12.5 to 17-18
//!   µs per call (0.09x to 0.13x upstream) and the chain of 100 dispatches
//!   from 1.1-1.2 to 1.4-1.6 ms (0.33x to 0.45x upstream); MiniLM and a
//!   2048 matmul did not change. `none` buys that back for programs known
//!   not to read memory they never wrote.
//! - `FERRITE_CUDA_LOG_LAUNCHES=1`: one line per kernel launch on stderr
//!   (`cuda launch`: export, grid, block, dynamic shared memory, binding
//!   addresses, push constants), for comparing launches with another
//!   runtime's. Graphs (module `graph`) print `cuda graph node` per node
//!   when built, `cuda graph node update` per node whose parameters
//!   changed, and one `cuda graph launch: N nodes, U updated` line per
//!   launch.
//! - `FERRITE_CUDA_LOG_QUEUE=1`: one line per queue operation enqueued on
//!   the queue stream on stderr: its sequence number, whether it carries
//!   host work, and for each wait and signal how it is ordered (already
//!   reached, covered by stream order, a GPU wait on the semaphore's word;
//!   signalled in stream order or by the host after its work).

use std::sync::OnceLock;

/// What a fresh queue allocation is filled with before it is handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocaInit {
    /// Left as it is.
    None,
    /// Every byte 0.
    Zero,
    /// Every byte 0xFF.
    Poison,
}

impl AllocaInit {
    /// The byte to fill with, if any.
    pub fn byte(self) -> Option<u8> {
        match self {
            AllocaInit::None => None,
            AllocaInit::Zero => Some(0),
            AllocaInit::Poison => Some(0xFF),
        }
    }

    fn parse(v: Option<&str>) -> AllocaInit {
        match v {
            Some("none") => AllocaInit::None,
            Some("poison") => AllocaInit::Poison,
            _ => AllocaInit::Zero,
        }
    }
}

/// The mode `FERRITE_CUDA_ALLOCA_INIT` selects (zero when unset).
pub fn alloca_init() -> AllocaInit {
    static MODE: OnceLock<AllocaInit> = OnceLock::new();
    *MODE.get_or_init(|| {
        AllocaInit::parse(std::env::var("FERRITE_CUDA_ALLOCA_INIT").ok().as_deref())
    })
}

/// Whether `FERRITE_CUDA_LOG_LAUNCHES` is set to something other than 0.
pub fn log_launches() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRITE_CUDA_LOG_LAUNCHES").is_ok_and(|v| v != "0"))
}

/// Whether `FERRITE_CUDA_LOG_QUEUE` is set to something other than 0.
pub fn log_queue() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("FERRITE_CUDA_LOG_QUEUE").is_ok_and(|v| v != "0"))
}

/// Prints one launch, or one graph node's parameters (`what`: `launch`,
/// `graph node`, `graph node update`; see the module docs).
pub fn print_launch(
    what: &str,
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    shared_memory: u32,
    bindings: &[u64],
    constants: &[u32],
) {
    let b: Vec<String> = bindings.iter().map(|p| format!("{p:#x}")).collect();
    eprintln!(
        "cuda {what} {name}: grid {grid:?} block {block:?} shared {shared_memory} bindings [{}] constants {constants:?}",
        b.join(", ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modes() {
        assert_eq!(AllocaInit::parse(None), AllocaInit::Zero);
        assert_eq!(AllocaInit::parse(Some("none")).byte(), None);
        assert_eq!(AllocaInit::parse(Some("poison")).byte(), Some(0xFF));
        assert_eq!(AllocaInit::parse(Some("zero")).byte(), Some(0));
    }
}
