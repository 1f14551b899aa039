//! `region(tag)` on a CUDA pool: libtorch's CUDA tensors land in the tag
//! through the MemPool shim, pause releases their memory as the driver
//! reports it, resume brings it back at the same address, bit-exact.
//! Runs only where a CUDA device is present (it says so when it skips).
#![cfg(feature = "cuda")]

use colo_mem::cuda::{unavailable_reason, CudaBackend};
use colo_mem::{Policy, Pool, PoolConfig};
use tch::{Device, Kind, Tensor};

fn skip() -> bool {
    let reason = unavailable_reason().or_else(|| {
        (!tch::Cuda::is_available()).then(|| "libtorch sees no CUDA device".to_string())
    });
    if let Some(reason) = reason {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: CUDA region test: {reason}");
        return true;
    }
    false
}

/// Free device memory in bytes, as the driver reports it (after a sync).
fn driver_free_bytes() -> u64 {
    tch::Cuda::synchronize(0);
    colo_mem::cuda::mem_get_info().expect("cuMemGetInfo").0
}

#[test]
fn cuda_tensors_in_a_region_pause_and_resume_at_the_same_address() {
    if skip() {
        return;
    }
    let pool = Pool::new(
        Box::new(CudaBackend::new(0).unwrap()),
        PoolConfig::default(),
    )
    .unwrap();
    pool.set_policy("weights", Policy::Backup).unwrap();
    let dev = Device::Cuda(0);
    let (w, grad_tagged) = {
        let _g = pool.region("weights").unwrap();
        let w = Tensor::randn([4096, 4096], (Kind::Float, dev)).set_requires_grad(true);
        // The backward's gradient is made on the autograd device thread: the
        // process-wide routing must catch it.
        (&w * 2.0).sum(Kind::Float).backward();
        let g = w.grad();
        (w, pool.tag_of(g.data_ptr() as u64))
    };
    assert_eq!(
        grad_tagged.as_deref(),
        Some("weights"),
        "autograd thread's gradient"
    );
    let addr = w.data_ptr() as u64;
    assert_eq!(pool.tag_of(addr).as_deref(), Some("weights"));
    let before = w.to_device(Device::Cpu);

    let free0 = driver_free_bytes();
    pool.pause(&["weights"]).unwrap();
    let free1 = driver_free_bytes();
    assert!(
        free1 >= free0 + 120 * (1 << 20),
        "driver free {free0} → {free1}"
    );
    pool.resume(&["weights"]).unwrap();
    assert_eq!(w.data_ptr() as u64, addr, "same address");
    assert!(w.to_device(Device::Cpu).equal(&before), "bit-exact");
}
