//! A safe software-prefetch hint.
//!
//! Hash-table lookups over tables much larger than the caches spend their time waiting for
//! DRAM. Issuing the loads of a batch's cache lines before reading any of them puts many
//! misses in flight at once. A plain load can do that too, but a load blocks retirement
//! until its line arrives, so only a handful fit in the reorder window; a prefetch retires
//! at once, so a whole batch of them is in flight together.
//!
//! On x86_64 this is `prefetcht0`; elsewhere it compiles to nothing (the code that calls it
//! stays correct, only slower).

#![warn(missing_docs)]

/// Starts loading the cache line holding `value` into every cache level, without waiting.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` is a hint. It does not fault and does not read or write memory
    // architecturally, whatever the address; here the address is a live reference anyway.
    // The intrinsic needs `sse`, which every x86_64 CPU has.
    #[allow(unsafe_code)]
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
