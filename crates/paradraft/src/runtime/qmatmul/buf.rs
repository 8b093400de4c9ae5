//! Weight buffers on transparent huge pages.
//!
//! A decode step streams every weight of the model once. On 4 KiB pages that is a TLB miss every
//! 4 KiB of weights (~350,000 a token for a 1.4 GB model). On a 2-vCPU Zen 4 a plain two-thread
//! read streamed 25–27 GB/s on 4 KiB pages against 45–56 GB/s on 2 MiB ones, and the 1.7 B-shaped
//! Q6_K decode ran 23.0 / 23.6 → 24.5 / 25.1 tok/s (`docs/gguf.md`, "Weights on huge pages").
//! A buffer of at least one huge page therefore starts on a 2 MiB boundary and its whole huge
//! pages are advised `MADV_HUGEPAGE` before anything touches them, so that the kernel backs them
//! with huge pages when it can (`transparent_hugepage` set to `madvise` or `always`); the tail
//! stays on ordinary pages. Smaller buffers are carved from shared 32 MiB chunks advised alike
//! (SmolLM2-135M's matrices are ~0.5 MB each: it decoded 257 → 296 tok/s so, median of 6 pairs),
//! a chunk freed when its last buffer is; a chunk's unused tail is never touched, so costs no
//! memory. Elsewhere, or where the system declines, the pages are ordinary ones.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

/// The huge page size asked for (x86-64 and AArch64 with 4 KiB base pages).
const HUGE: usize = 2 << 20;
/// Buffers smaller than a huge page are carved, 64-byte aligned, from shared chunks of this size,
/// so that a small model's many small matrices share huge pages too.
const CHUNK: usize = 16 * HUGE;
/// Alignment of a carved buffer (a cache line).
const LINE: usize = 64;

/// One 2 MiB-aligned allocation, advised onto huge pages; freed when its last buffer goes.
struct Chunk {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a Chunk is a plain allocation; its buffers are disjoint ranges of it.
unsafe impl Send for Chunk {}
// SAFETY: as above: the chunk itself is never accessed through a shared reference.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// `bytes` (> 0) of untouched memory starting on a huge page boundary.
    fn new(bytes: usize) -> Arc<Chunk> {
        let Ok(layout) = Layout::from_size_align(bytes, HUGE) else {
            alloc::handle_alloc_error(Layout::new::<u8>())
        };
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        #[cfg(target_os = "linux")]
        if bytes >= HUGE {
            // SAFETY: the range lies inside the allocation; the advice changes no contents
            // (its result is ignored: ordinary pages are a correct fallback).
            unsafe {
                libc::madvise(
                    raw as *mut libc::c_void,
                    bytes / HUGE * HUGE,
                    libc::MADV_HUGEPAGE,
                )
            };
        }
        Arc::new(Chunk { ptr, layout })
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// The chunk small buffers are being carved from (weakly: it goes when its buffers do), and how
/// many of its bytes are taken.
static CURRENT: Mutex<Option<(Weak<Chunk>, usize)>> = Mutex::new(None);

/// The element types a [`HugeBuf`] holds: plain values for which all-zero bytes are a valid
/// value (the integer and f16 planes of the packed formats); sealed, so no other type can be.
pub trait Plain: Copy + Send + Sync + private::Sealed {}

mod private {
    pub trait Sealed {}
}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl private::Sealed for $t {}
        impl Plain for $t {}
    )*};
}
plain!(u8, i8, u16, i16, u64, half::f16);

/// A fixed-length, zero-initialised buffer of plain values (see the module docs).
pub struct HugeBuf<T: Plain> {
    ptr: NonNull<T>,
    len: usize,
    /// The chunk the values live in (none for an empty buffer).
    _chunk: Option<Arc<Chunk>>,
}

// SAFETY: a HugeBuf owns its range of the chunk as a Vec owns its allocation.
unsafe impl<T: Plain + Send> Send for HugeBuf<T> {}
// SAFETY: shared access only reads.
unsafe impl<T: Plain + Sync> Sync for HugeBuf<T> {}

impl<T: Plain> HugeBuf<T> {
    /// `len` values whose bytes are all zero.
    pub fn zeroed(len: usize) -> Self {
        let Some(bytes) = len.checked_mul(std::mem::size_of::<T>()) else {
            alloc::handle_alloc_error(Layout::new::<T>())
        };
        if bytes == 0 {
            return HugeBuf {
                ptr: NonNull::dangling(),
                len,
                _chunk: None,
            };
        }
        assert!(std::mem::align_of::<T>() <= LINE);
        let (chunk, at) = if bytes >= HUGE {
            // Its own chunk: whole huge pages, the tail on ordinary pages.
            (Chunk::new(bytes), 0)
        } else {
            let mut cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
            let live = cur
                .as_ref()
                .filter(|(_, used)| used + bytes <= CHUNK)
                .and_then(|(c, used)| Some((c.upgrade()?, *used)));
            let (c, at) = live.unwrap_or_else(|| (Chunk::new(CHUNK), 0));
            *cur = Some((Arc::downgrade(&c), (at + bytes).next_multiple_of(LINE)));
            (c, at)
        };
        // SAFETY: [at, at + bytes) lies inside the chunk and belongs to this buffer alone
        // (carved ranges never overlap nor return to the chunk); zero bytes are a valid T.
        let ptr = unsafe {
            let p = chunk.ptr.as_ptr().add(at);
            std::ptr::write_bytes(p, 0, bytes);
            NonNull::new_unchecked(p.cast::<T>())
        };
        HugeBuf {
            ptr,
            len,
            _chunk: Some(chunk),
        }
    }
}

impl<T: Plain> Deref for HugeBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: ptr holds len initialised values (or is dangling with no bytes).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Plain> DerefMut for HugeBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for deref, and &mut self is unique (no other buffer shares the range).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Plain> Clone for HugeBuf<T> {
    fn clone(&self) -> Self {
        let mut c = Self::zeroed(self.len);
        c.copy_from_slice(self);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_aligned_and_hold_their_values() {
        for len in [
            0usize,
            1,
            3,
            4095,
            HUGE / 2 - 1,
            HUGE / 2,
            HUGE / 2 + 7,
            3 * HUGE / 2 + 5,
        ] {
            let mut b = HugeBuf::<u16>::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&v| v == 0));
            if len * 2 >= HUGE {
                assert_eq!(b.as_ptr() as usize % HUGE, 0, "len {len}");
            } else if len > 0 {
                assert_eq!(b.as_ptr() as usize % LINE, 0, "len {len}");
            }
            for (i, v) in b.iter_mut().enumerate() {
                *v = i as u16;
            }
            let small = HugeBuf::<u8>::zeroed(100);
            let c = b.clone();
            drop(b);
            assert!(c.iter().enumerate().all(|(i, &v)| v == i as u16));
            assert!(small.iter().all(|&v| v == 0));
        }
    }
}
