//! The [`Buffer`] type (a byte range of an allocation), defined apart from
//! its methods (the parent module and its siblings) so that the modules
//! handing out buffers and device uses name it here, not the parent module
//! that names them.

use std::sync::Arc;

use super::storage::Allocation;

/// A byte range of a host-memory allocation (the `hal.buffer` ref type).
#[derive(Clone)]
pub struct Buffer {
    pub(super) alloc: Arc<Allocation>,
    pub(super) offset: u64,
    pub(super) length: u64,
}
