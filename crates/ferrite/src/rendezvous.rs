//! Channel defaults for one process per rank, from the environment that
//! common launchers set (`RANK`/`WORLD_SIZE`, Open MPI's and PMI's
//! variables), and the store named by `FERRITE_STORE` through which rank
//! 0's group identifier (the NCCL unique id) reaches the other ranks. A
//! TCP store needs the job's secret in `FERRITE_STORE_TOKEN`.
//!
//! This is the `ferrite-launch` crate, re-exported; its documentation
//! describes the variables, the stores and their protocol.
//!
//! ```no_run
//! # fn main() -> ferrite::Result<()> {
//! let instance = ferrite::Instance::new();
//! let session = match ferrite::rendezvous::from_env()? {
//!     Some(provider) => ferrite::Session::with_channel_provider(&instance, &["cuda"], provider)?,
//!     None => ferrite::Session::new(&instance, "cuda")?,
//! };
//! # let _ = session;
//! # Ok(())
//! # }
//! ```

pub use ferrite_launch::*;
