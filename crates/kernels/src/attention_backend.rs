//! libtorch's cuDNN attention backend, on or off for the process
//! (`csrc/sdp_backend.cpp`), which tch does not expose.

mod sys {
    extern "C" {
        pub fn colo_torch_set_cudnn_sdp(on: bool);
        pub fn colo_torch_cudnn_sdp() -> bool;
    }
}

/// Turns libtorch's cuDNN backend of `scaled_dot_product_attention` on or
/// off for the process (`csrc/sdp_backend.cpp` says why colo turns it off
/// on CUDA: a kernel compiled at run time for every new shape).
pub fn set_cudnn_attention(on: bool) {
    // SAFETY: sets a plain flag in libtorch's global context; no pointers.
    unsafe { sys::colo_torch_set_cudnn_sdp(on) }
}

/// Whether libtorch may pick its cuDNN attention backend.
pub fn cudnn_attention() -> bool {
    // SAFETY: reads a plain flag in libtorch's global context.
    unsafe { sys::colo_torch_cudnn_sdp() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cudnn_attention_switch_reaches_libtorch() {
        let before = super::cudnn_attention();
        for on in [false, true, false] {
            super::set_cudnn_attention(on);
            assert_eq!(super::cudnn_attention(), on);
        }
        super::set_cudnn_attention(before);
    }
}
