//! Compiles colo-mem's C++ shim against the project's libtorch headers with
//! libtorch's C++ ABI flag (a mismatch would link and then fail at run time
//! the first time a std::string crosses into libtorch), and links the
//! crate's own tests and benches against libtorch.

fn main() {
    let torch = colo_build::libtorch_dir();
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    println!("cargo:rerun-if-changed=csrc/cpu_alloc.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .include(torch.join("include"))
        .include(torch.join("include/torch/csrc/api/include"))
        .warnings(false)
        .file("csrc/cpu_alloc.cpp")
        .compile("colo_torch_shim");
    colo_build::link_libtorch();
    println!("cargo:rustc-link-lib=c10");
}
