//! The link to libtorch's allocator: install the shim, read its counters.
//!
//! Raw calls (`sys`), then safe functions; the shim's contract is at the
//! top of `csrc/cpu_alloc.cpp`. colo's compute kernels on libtorch
//! tensors are colo-kernels'.

mod sys {
    extern "C" {
        pub fn colo_torch_install() -> bool;
        pub fn colo_torch_untagged(live: *mut i64, peak: *mut i64, allocs: *mut u64);
        pub fn colo_torch_reset_untagged_peak();
    }
}

/// Makes colo-mem libtorch's CPU allocator (idempotent; it is done when the
/// binary loads already). False if libtorch kept another allocator, in
/// which case regions cannot work.
pub fn install() -> bool {
    // SAFETY: the shim's install takes no arguments and only swaps a c10
    // registry pointer to a static allocator object that lives forever.
    unsafe { sys::colo_torch_install() }
}

/// Tensor memory made outside any region (libtorch's default allocator,
/// through colo's shim): what colo's accounting shows as untagged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Untagged {
    /// Bytes held now.
    pub live_bytes: u64,
    /// Highest `live_bytes` since the process started or the last
    /// [`reset_untagged_peak`].
    pub peak_bytes: u64,
    /// Allocations made so far.
    pub allocations: u64,
}

/// The untagged counters now.
pub fn untagged() -> Untagged {
    let (mut live, mut peak, mut allocs) = (0i64, 0i64, 0u64);
    // SAFETY: three valid, exclusive out-pointers to plain integers.
    unsafe { sys::colo_torch_untagged(&mut live, &mut peak, &mut allocs) };
    Untagged {
        live_bytes: live.max(0) as u64,
        peak_bytes: peak.max(0) as u64,
        allocations: allocs,
    }
}

/// Starts a new peak of untagged bytes from the current live bytes.
pub fn reset_untagged_peak() {
    // SAFETY: no arguments; stores to the shim's atomics.
    unsafe { sys::colo_torch_reset_untagged_peak() }
}
