//! IREE CPU executables (`embedded-elf-*` and `system-elf-*`).
//!
//! Layers, bottom up:
//! - [`container`]: what surrounds the ELF in a module's rodata (a bare ELF or a
//!   FatELF holding one ELF per architecture) and format inference.
//! - [`elf`]: a defensive ELF64 shared-object parser and loader (one private
//!   mapping, x86-64 RELA relocations, per-segment protections).
//! - [`dylib`]: `system-elf-*` shared objects opened with the system loader
//!   (`dlopen`), bounded by their program headers.
//! - [`abi`]: `#[repr(C)]` mirrors of the executable library ABI (version 0.6).
//! - [`library`]: [`library::ExecutableLibrary`]: query, validation, exports,
//!   imports and serial dispatch.
//!
//! Native code is trusted, as upstream: once a library is loaded its functions
//! are called as they are. Everything *around* the code (container, ELF headers,
//! dynamic table, relocations, symbol table, library tables) is checked.

pub mod abi;
pub mod container;
pub mod dylib;
pub mod elf;
pub mod library;

use std::ffi::CStr;

/// Bounds-checked reads of a loaded library image at runtime addresses; the
/// library tables are read only through this.
pub trait ImageView {
    /// The `len` bytes at `addr`, if they lie inside the readable image.
    fn slice_at(&self, addr: usize, len: usize) -> Option<&[u8]>;

    /// The NUL-terminated string at `addr`, if it starts and ends inside the
    /// image.
    fn c_str_at(&self, addr: usize) -> Option<&CStr>;

    /// Whether `addr` lies in executable pages of the image.
    fn is_executable(&self, addr: usize) -> bool;

    /// Reads a `T` at `addr` if all of it lies inside the image. `T` is
    /// plain old data ([`abi::ImagePod`]): any bytes make a valid `T`.
    /// Sound for any implementation of [`ImageView::slice_at`]: a slice of
    /// the wrong length is refused, never read past.
    fn read<T: abi::ImagePod>(&self, addr: usize) -> Option<T> {
        let size = std::mem::size_of::<T>();
        let bytes = self.slice_at(addr, size)?;
        if bytes.len() != size {
            return None;
        }
        // SAFETY: `bytes` holds exactly `size_of::<T>()` readable bytes
        // (checked above, whatever `slice_at` returned); the read is
        // unaligned; `T: ImagePod` is valid for every bit pattern.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
    }
}

impl ImageView for elf::LoadedElf {
    fn slice_at(&self, addr: usize, len: usize) -> Option<&[u8]> {
        let off = addr.checked_sub(self.base() as usize)?;
        self.bytes().get(off..off.checked_add(len)?)
    }

    fn c_str_at(&self, addr: usize) -> Option<&CStr> {
        elf::LoadedElf::c_str_at(self, addr)
    }

    fn is_executable(&self, addr: usize) -> bool {
        elf::LoadedElf::is_executable(self, addr)
    }
}

#[cfg(test)]
mod tests {
    use super::ImageView;
    use std::ffi::CStr;

    /// An image whose `slice_at` returns fewer bytes than asked for.
    struct Short(Vec<u8>);

    impl ImageView for Short {
        fn slice_at(&self, _addr: usize, _len: usize) -> Option<&[u8]> {
            Some(&self.0)
        }
        fn c_str_at(&self, _addr: usize) -> Option<&CStr> {
            None
        }
        fn is_executable(&self, _addr: usize) -> bool {
            false
        }
    }

    /// Whatever an implementation returns, `read` never reads past it.
    #[test]
    fn read_refuses_a_short_slice() {
        let image = Short(vec![1, 2, 3]);
        assert_eq!(image.read::<u64>(0), None);
        assert_eq!(image.read::<u16>(0), None, "a longer slice is refused too");
        let exact = Short(vec![1, 0, 0, 0]);
        assert_eq!(exact.read::<u32>(0), Some(1));
    }
}
