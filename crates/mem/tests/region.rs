//! `region(tag)`: tensors libtorch allocates inside a region land in the
//! pool, through colo-mem's c10 CPU allocator.

use colo_mem::{os, Error, Policy, Pool, PoolConfig, TagState};
use tch::{Kind, Tensor};

const MIB: usize = 1 << 20;

fn os_resident(p: &Pool) -> u64 {
    let (base, len) = p.address_range();
    os::resident_in_range(base, len).unwrap()
}

/// A float32 tensor of `mib` MiB filled with 0, 1, 2, …
fn ramp(mib: usize) -> Tensor {
    Tensor::arange((mib * MIB / 4) as i64, (Kind::Float, tch::Device::Cpu))
}

fn addr(t: &Tensor) -> u64 {
    t.data_ptr() as u64
}

fn checksum(t: &Tensor) -> f64 {
    t.sum(Kind::Double).double_value(&[])
}

#[test]
fn a_tensor_made_inside_a_region_is_counted_under_its_tag_and_paused_with_it() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    pool.set_policy("weights", Policy::Backup).unwrap();
    let guard = pool.region("weights").unwrap();
    let t = ramp(16);
    let small = Tensor::from_slice(&[1f32; 25]); // below the threshold: libtorch's default
    guard.finish().unwrap();
    let outside = ramp(8); // after the region: libtorch's default

    let a = addr(&t);
    assert_eq!(pool.tag_of(a).as_deref(), Some("weights"));
    assert!(!pool.contains(addr(&small)));
    assert!(!pool.contains(addr(&outside)));
    let w = pool.stats().tag("weights").unwrap().clone();
    assert_eq!((w.allocations, w.allocated_bytes), (1, 16 * MIB as u64));
    let sum_before = checksum(&t);

    let before = os_resident(&pool);
    pool.pause(&["weights"]).unwrap();
    assert!(before - os_resident(&pool) >= 16 * MIB as u64 * 95 / 100);
    assert_eq!(pool.stats().tag("weights").unwrap().resident_bytes, 0);
    // libtorch keeps working while the tag is paused.
    assert_eq!(checksum(&(&outside * 2.0)), 2.0 * checksum(&outside));
    pool.resume(&["weights"]).unwrap();
    assert_eq!(addr(&t), a, "same address after resume");
    assert_eq!(checksum(&t), sum_before, "restored bit-exactly");
    assert!(t.equal(&ramp(16)));
    drop(t);
    assert_eq!(
        pool.stats().tag("weights").unwrap().allocations,
        0,
        "dropping the tensor freed its block in the pool"
    );
}

#[test]
fn autograd_and_in_place_updates_stay_in_the_tag() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    pool.set_policy("params", Policy::Backup).unwrap();
    let mut w = {
        let _g = pool.region_with_threshold("params", 1).unwrap();
        Tensor::randn([256, 256], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true)
    };
    let a = addr(&w);
    let x = Tensor::randn([8, 256], (Kind::Float, tch::Device::Cpu));
    {
        let _g = pool.region("activations").unwrap();
        x.matmul(&w).sum(Kind::Float).backward();
    }
    let g = w.grad();
    assert_eq!(
        pool.tag_of(addr(&g)).as_deref(),
        Some("activations"),
        "backward ran in the region"
    );
    tch::no_grad(|| {
        let _ = w.f_sub_(&(&g * 0.1)).unwrap();
    });
    assert_eq!(addr(&w), a, "an in-place update keeps the storage");
    let before = checksum(&w);
    pool.pause(&["params"]).unwrap();
    pool.resume(&["params"]).unwrap();
    assert_eq!(checksum(&w), before);
}

#[test]
fn frees_on_other_threads_are_routed_by_address() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let bufs: Vec<Tensor> = {
        let _g = pool.region("kv_cache").unwrap();
        (0..8).map(|_| ramp(1)).collect()
    };
    assert_eq!(pool.stats().tag("kv_cache").unwrap().allocations, 8);
    std::thread::spawn(move || drop(bufs)).join().unwrap();
    assert_eq!(pool.stats().tag("kv_cache").unwrap().allocations, 0);
}

#[test]
fn guards_nest_and_the_innermost_live_one_wins_in_any_drop_order() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let tag = |t: &Tensor| pool.tag_of(addr(t));

    let outer = pool.region("a").unwrap();
    let x = ramp(1);
    let inner = pool.region("b").unwrap();
    let y = ramp(1);
    drop(inner);
    let z = ramp(1);
    drop(outer);
    let w = ramp(1);
    assert_eq!(
        (tag(&x).as_deref(), tag(&y).as_deref(), tag(&z).as_deref()),
        (Some("a"), Some("b"), Some("a"))
    );
    assert_eq!(tag(&w), None);

    // Out of order: the outer guard goes first; the inner one stays in
    // force, and once both are gone nothing is redirected.
    let g1 = pool.region("outer").unwrap();
    let g2 = pool.region("inner").unwrap();
    drop(g1);
    let still_inner = ramp(1);
    drop(g2);
    let none = ramp(1);
    assert_eq!(tag(&still_inner).as_deref(), Some("inner"));
    assert_eq!(tag(&none), None);
    pool.pause(&["outer"]).unwrap();
    let after_pause = ramp(1);
    assert_eq!(tag(&after_pause), None);
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

/// The other way round: a tag with a region open, on any thread, cannot be
/// paused (what the region makes would land in memory going away); nothing
/// changes, and once the guards are dropped the pause goes through.
#[test]
fn a_tag_with_an_open_region_is_not_paused() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    pool.alloc("activations", 4096).unwrap();
    let here = pool.region("activations").unwrap();
    let (opened, close) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    let other = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            let _guard = pool.region("activations").unwrap();
            opened.0.send(()).unwrap();
            close.1.recv().unwrap();
        })
    };
    opened.1.recv().unwrap();
    let e = pool.pause(&["activations"]).err().unwrap();
    assert!(matches!(e, Error::RegionOpen { regions: 2, .. }), "{e}");
    assert!(e.to_string().contains("tag `activations`"), "{e}");
    assert_eq!(
        pool.stats().tag("activations").unwrap().state,
        TagState::Active
    );
    drop(here);
    let e = pool.pause(&["activations"]).err().unwrap();
    assert!(matches!(e, Error::RegionOpen { regions: 1, .. }), "{e}");
    close.0.send(()).unwrap();
    other.join().unwrap();
    pool.pause(&["activations"]).unwrap();
    pool.resume(&["activations"]).unwrap();
}

#[test]
fn refused_region_allocations_fall_back_to_libtorch_and_are_reported() {
    let pool = Pool::host(PoolConfig::with_capacity(4 * MIB as u64)).unwrap();
    let guard = pool.region("weights").unwrap();
    let fits = ramp(3);
    let too_big = Tensor::full([MIB as i64 / 2], 7.0, (Kind::Float, tch::Device::Cpu)); // 2 MiB: over capacity
    let err = guard.finish().unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert!(pool.contains(addr(&fits)));
    assert!(!pool.contains(addr(&too_big)));
    assert_eq!(checksum(&too_big), 7.0 * (MIB / 2) as f64);
    assert_eq!(
        pool.stats().tag("weights").unwrap().region_fallback_bytes,
        2 * MIB as u64
    );
    assert_eq!(pool.tag_state("weights"), Some(TagState::Active));
}

#[test]
fn transient_tensors_are_reused_from_the_tag_cache() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let _g = pool.region("activations").unwrap();
    let mut acc = ramp(1);
    for _ in 0..100 {
        acc = (&acc + 1.0) * 0.5; // a fresh 1 MiB tensor each time, the old one freed
    }
    assert!(pool.contains(addr(&acc)));
    let s = pool.stats().tag("activations").unwrap().clone();
    assert!(s.allocations <= 2, "{s:?}");
    assert!(
        s.resident_bytes <= 4 * MIB as u64,
        "freed blocks were reused: {s:?}"
    );
}
