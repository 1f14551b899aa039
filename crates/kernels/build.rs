//! Compiles colo-kernels' C++ against the project's libtorch headers with
//! libtorch's C++ ABI flag (a mismatch would link and then fail at run time
//! the first time a std::string crosses into libtorch), and links the
//! crate's own tests against libtorch.

const SOURCES: [&str; 8] = [
    "csrc/sdp_backend.cpp",
    "csrc/fused_adamw.cpp",
    "csrc/rms_norm.cpp",
    "csrc/token_logprobs.cpp",
    "csrc/rope.cpp",
    "csrc/paged_attention.cpp",
    "csrc/skinny_linear.cpp",
    "csrc/grad_sum.cpp",
];
const HEADERS: [&str; 3] = ["csrc/shim_error.h", "csrc/vec_math.h", "csrc/bf16_bits.h"];

fn main() {
    for f in SOURCES.iter().chain(&HEADERS) {
        println!("cargo:rerun-if-changed={f}");
    }
    colo_build::libtorch_cpp()
        // `#pragma omp simd` in the kernels (vectorisation only, no OpenMP
        // runtime); floating-point operations do not trap (colo enables no
        // FP exceptions), without which GCC vectorises no loop with a float
        // comparison for AVX2. Neither changes a result. No contraction
        // of a product and a sum into one fused multiply-add: the kernels
        // round where libtorch's separate ops round (RoPE in float32 is
        // then bit-identical to transformers' formula). The kernels'
        // `target_clones` (AVX-512, AVX2, baseline x86-64) are attributes
        // in the sources.
        .flag("-fopenmp-simd")
        .flag("-fno-trapping-math")
        .flag("-ffp-contract=off")
        .files(SOURCES)
        .compile("colo_kernels_shim");
    colo_build::link_libtorch();
    // The autograd functions, ATen's ops and its global context (the
    // attention switch) are libtorch_cpu's; c10 holds the tensor core.
    println!("cargo:rustc-link-lib=torch_cpu");
    println!("cargo:rustc-link-lib=c10");
}
