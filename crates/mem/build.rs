//! Compiles colo-mem's C++ shims (libtorch's CPU allocator; with the
//! `cuda` feature, the CUDA allocator and graphs) against the project's
//! libtorch headers with libtorch's C++ ABI flag (a mismatch would link and
//! then fail at run time the first time a std::string crosses into
//! libtorch), and links the crate's own tests and benches against libtorch.

fn main() {
    println!("cargo:rerun-if-changed=csrc/cpu_alloc.cpp");
    println!("cargo:rerun-if-changed=csrc/shim_error.h");
    colo_build::libtorch_cpp()
        .file("csrc/cpu_alloc.cpp")
        .compile("colo_torch_shim");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        build_cuda_shim(&colo_build::libtorch_dir());
    }
    colo_build::link_libtorch();
    // The allocator is a c10 one.
    println!("cargo:rustc-link-lib=c10");
}

/// The CUDA side (feature `cuda`): compiled against the CUDA headers of the
/// venv's `nvidia-*` wheels (`./x setup` adds `nvidia-cuda-crt`, which torch
/// does not pull in but `cuda_runtime.h` needs), linked against
/// libtorch_cuda and libc10_cuda. Builds without a GPU; runs only with one.
fn build_cuda_shim(torch: &std::path::Path) {
    println!("cargo:rerun-if-changed=csrc/cuda_alloc.cpp");
    println!("cargo:rerun-if-changed=csrc/cuda_graph.cpp");
    let cuda_include = torch.join("../nvidia/cu13/include");
    if !cuda_include.join("crt/host_config.h").is_file() {
        panic!(
            "the cuda feature needs CUDA headers at {} (with crt/): run `./x setup`",
            cuda_include.display()
        );
    }
    colo_build::libtorch_cpp()
        .include(&cuda_include)
        .file("csrc/cuda_alloc.cpp")
        .file("csrc/cuda_graph.cpp")
        .compile("colo_torch_cuda_shim");
    println!("cargo:rustc-link-lib=torch_cuda");
    println!("cargo:rustc-link-lib=c10_cuda");
    // Inline CUDA-runtime calls in c10's headers; the wheel ships only the
    // versioned library. colo-build's rpath covers this directory.
    let cuda_lib = torch.join("../nvidia/cu13/lib");
    println!("cargo:rustc-link-search=native={}", cuda_lib.display());
    println!("cargo:rustc-link-lib=dylib:+verbatim=libcudart.so.13");
}
