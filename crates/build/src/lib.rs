//! Build-script helper shared by every colo package that produces a binary
//! or a test binary.
//!
//! `cargo:rustc-link-arg` applies only to the package whose build script
//! prints it, so each such package calls [`link_libtorch`] from its
//! `build.rs`. It adds:
//!
//! - an rpath to libtorch's `lib/` directory, so binaries run without
//!   `LD_LIBRARY_PATH` (torch's own libraries carry `$ORIGIN` rpaths that
//!   find libc10, libgomp and the CUDA libraries from there);
//! - `libtorch_cuda` as a needed library even though no symbol of it is
//!   referenced: with rustc's default `--as-needed` it would be dropped,
//!   libtorch would not register its CUDA backend, and a GPU would read as
//!   unavailable.
//!
//! libtorch is found through `LIBTORCH`, which `.cargo/config.toml` points at
//! the project's virtual environment (made by `./x`).

use std::path::PathBuf;

/// libtorch's root (`include/`, `lib/`), resolved through symlinks.
pub fn libtorch_dir() -> PathBuf {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let dir = std::env::var_os("LIBTORCH")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("LIBTORCH is not set; run cargo from the repository (see .cargo/config.toml)")
        });
    match dir.canonicalize() {
        Ok(d) if d.join("lib/libtorch_cpu.so").is_file() => d,
        _ => panic!(
            "libtorch not found at {} (no lib/libtorch_cpu.so): run `./x setup` once, \
             which installs torch==2.11.0 from PyPI into .venv",
            dir.display()
        ),
    }
}

/// Prints the link arguments described in the crate docs.
pub fn link_libtorch() {
    let lib = libtorch_dir().join("lib");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // The CUDA runtime of the nvidia-* wheels, for colo-mem's CUDA shim
    // (feature `cuda`), which links libcudart directly.
    let cuda = lib.join("../../nvidia/cu13/lib");
    if let Ok(cuda) = cuda.canonicalize() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", cuda.display());
    }
    if lib.join("libtorch_cuda.so").is_file() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}

/// A C++ build against libtorch's headers: C++17, the two include
/// directories, and libtorch's C++ ABI flag (`LIBTORCH_CXX11_ABI`, 1 by
/// default; a mismatch would link and then fail at run time the first time
/// a std::string crosses into libtorch). Each FFI crate adds its sources
/// and flags.
pub fn libtorch_cpp() -> cc::Build {
    let torch = libtorch_dir();
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    let mut b = cc::Build::new();
    b.cpp(true)
        .std("c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .include(torch.join("include"))
        .include(torch.join("include/torch/csrc/api/include"))
        .warnings(false);
    b
}
