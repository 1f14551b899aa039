//! `region(tag)`: allocations made by ordinary Rust code land in the pool.

use colo_mem::{os, Error, Policy, Pool, PoolConfig, TagState};

const MIB: usize = 1 << 20;

fn os_resident(p: &Pool) -> u64 {
    let (base, len) = p.address_range();
    os::resident_in_range(base, len).unwrap()
}

#[test]
fn a_vec_made_inside_a_region_is_counted_under_its_tag_and_paused_with_it() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    pool.set_policy("weights", Policy::Backup).unwrap();
    let guard = pool.region("weights").unwrap();
    let v: Vec<f32> = (0..4 * MIB).map(|i| i as f32).collect();
    let small = Vec::from([1u8; 100]); // below the threshold: ordinary heap
    guard.finish().unwrap();
    let outside = vec![2u8; 8 * MIB]; // after the region: ordinary heap

    let addr = v.as_ptr() as u64;
    assert!(pool.contains(addr));
    assert_eq!(pool.tag_of(addr).as_deref(), Some("weights"));
    assert!(!pool.contains(small.as_ptr() as u64));
    assert!(!pool.contains(outside.as_ptr() as u64));
    let w = pool.stats().tag("weights").unwrap().clone();
    assert_eq!(w.allocated_bytes, 16 * MIB as u64);

    let before = os_resident(&pool);
    pool.pause(&["weights"]).unwrap();
    assert!(before - os_resident(&pool) >= 16 * MIB as u64 * 95 / 100);
    assert_eq!(pool.stats().tag("weights").unwrap().resident_bytes, 0);
    pool.resume(&["weights"]).unwrap();
    assert_eq!(v.as_ptr() as u64, addr);
    assert!(
        v.iter().enumerate().all(|(i, &x)| x == i as f32),
        "restored bit-exactly"
    );
    drop(v);
    assert_eq!(
        pool.stats().tag("weights").unwrap().allocations,
        0,
        "drop routed the free to the pool"
    );
}

#[test]
fn a_candle_tensor_made_inside_a_region_lives_in_the_pool() {
    use candle_core::{Device, Tensor};
    let pool = Pool::host(PoolConfig::default()).unwrap();
    pool.set_policy("weights", Policy::Backup).unwrap();
    let t = {
        let _g = pool.region("weights").unwrap();
        Tensor::arange(0f32, (2 * MIB) as f32, &Device::Cpu)
            .unwrap()
            .reshape((2048, 1024))
            .unwrap()
    };
    let w = pool.stats().tag("weights").unwrap().clone();
    assert_eq!((w.allocations, w.allocated_bytes), (1, 8 * MIB as u64));
    let sum_before = t.sum_all().unwrap().to_scalar::<f32>().unwrap();

    pool.pause(&["weights"]).unwrap();
    assert_eq!(pool.stats().resident_bytes, 0);
    assert!(os_resident(&pool) < MIB as u64 / 2);
    pool.resume(&["weights"]).unwrap();
    assert_eq!(t.sum_all().unwrap().to_scalar::<f32>().unwrap(), sum_before);
    drop(t);
    assert_eq!(pool.stats().tag("weights").unwrap().allocations, 0);
}

#[test]
fn frees_on_other_threads_are_routed_by_address() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let bufs: Vec<Vec<u8>> = {
        let _g = pool.region("kv_cache").unwrap();
        (0..8).map(|i| vec![i as u8; MIB]).collect()
    };
    assert_eq!(pool.stats().tag("kv_cache").unwrap().allocations, 8);
    std::thread::spawn(move || drop(bufs)).join().unwrap();
    assert_eq!(pool.stats().tag("kv_cache").unwrap().allocations, 0);
}

#[test]
fn only_the_guarding_thread_is_redirected() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let _g = pool.region("weights").unwrap();
    let other = std::thread::spawn(|| vec![0u8; 4 * MIB]).join().unwrap();
    assert!(!pool.contains(other.as_ptr() as u64));
    let mine = vec![0u8; 4 * MIB];
    assert!(pool.contains(mine.as_ptr() as u64));
}

#[test]
fn guards_nest_and_restore() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let outer = pool.region("a").unwrap();
    let x = vec![0u8; MIB];
    let inner = pool.region("b").unwrap();
    let y = vec![0u8; MIB];
    drop(inner);
    let z = vec![0u8; MIB];
    drop(outer);
    let w = vec![0u8; MIB];
    let tag = |v: &Vec<u8>| pool.tag_of(v.as_ptr() as u64);
    assert_eq!(
        (tag(&x).as_deref(), tag(&y).as_deref(), tag(&z).as_deref()),
        (Some("a"), Some("b"), Some("a"))
    );
    assert_eq!(tag(&w), None);
}

#[test]
fn a_region_in_a_paused_tag_is_refused() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    pool.alloc("kv_cache", 4096).unwrap();
    pool.pause(&["kv_cache"]).unwrap();
    let e = pool.region("kv_cache").err().unwrap();
    assert_eq!(
        e.to_string(),
        "cannot open a region in tag `kv_cache`: it is paused"
    );
}

#[test]
fn refused_region_allocations_fall_back_to_the_heap_and_are_reported() {
    let pool = Pool::host(PoolConfig::with_capacity(4 * MIB as u64)).unwrap();
    let guard = pool.region("weights").unwrap();
    let fits = vec![0u8; 3 * MIB];
    let too_big = vec![7u8; 2 * MIB]; // over capacity: served by the heap
    let err = guard.finish().unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert!(pool.contains(fits.as_ptr() as u64));
    assert!(!pool.contains(too_big.as_ptr() as u64));
    assert!(too_big.iter().all(|&b| b == 7));
    assert_eq!(
        pool.stats().tag("weights").unwrap().region_fallback_bytes,
        2 * MIB as u64
    );
    assert_eq!(pool.tag_state("weights"), Some(TagState::Active));
}

#[test]
fn vec_growth_inside_a_region_stays_in_the_pool() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let _g = pool.region("kv_cache").unwrap();
    let mut v: Vec<u64> = Vec::new();
    for i in 0..(1 << 20) {
        v.push(i);
    }
    assert!(pool.contains(v.as_ptr() as u64));
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    // Intermediate buffers were freed into the cache: one live allocation.
    assert_eq!(pool.stats().tag("kv_cache").unwrap().allocations, 1);
}
