//! Tensor memory made outside any region is counted as untagged. The
//! counter is process-wide, so this test has a binary to itself: tests
//! running beside it on other threads would move the count.

use colo_mem::{untagged, Pool, PoolConfig};
use tch::{Kind, Tensor};

const MIB: usize = 1 << 20;

fn ramp(mib: usize) -> Tensor {
    Tensor::arange((mib * MIB / 4) as i64, (Kind::Float, tch::Device::Cpu))
}

fn addr(t: &Tensor) -> u64 {
    t.data_ptr() as u64
}

#[test]
fn only_the_guarding_thread_is_redirected_and_the_rest_is_counted_untagged() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let _g = pool.region("weights").unwrap();
    let before = untagged().live_bytes;
    let other = std::thread::spawn(|| ramp(4)).join().unwrap();
    assert!(!pool.contains(addr(&other)));
    let counted = untagged().live_bytes;
    assert!(
        counted >= before + 4 * MIB as u64 - MIB as u64,
        "{before} → {counted}"
    );
    let mine = ramp(4);
    assert!(pool.contains(addr(&mine)));
    drop(other);
    assert!(untagged().live_bytes < counted);
}
