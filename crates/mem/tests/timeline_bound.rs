//! The timeline's memory is bounded by default (issue 10): a ring buffer of
//! the last `timeline_limit` events, measured by the process's resident
//! bytes with seven tags, as in an RL run.

use colo_mem::{os, Pool, PoolConfig};

#[test]
fn the_default_timeline_is_a_ring_of_a_few_tens_of_mib() {
    let p = Pool::host(PoolConfig::with_capacity(u64::MAX)).unwrap();
    let limit = PoolConfig::default().timeline_limit;
    for tag in [
        "weights",
        "kv_cache",
        "train_params",
        "train_grads",
        "optimizer",
        "activations",
        "ref",
    ] {
        let a = p.alloc(tag, 4096).unwrap();
        p.free(a).unwrap();
    }
    let before = os::resident_bytes().unwrap();
    for i in 0..2 * limit {
        p.set_phase(if i % 2 == 0 { "generate" } else { "train" });
    }
    let after = os::resident_bytes().unwrap();
    let events = p.timeline();
    assert_eq!(events.len(), limit, "the oldest events are dropped");
    assert_eq!(events.last().unwrap().phase, "train");
    let per_event = after.saturating_sub(before) as f64 / limit as f64;
    eprintln!(
        "timeline: {limit} events kept, {:.0} bytes each by RSS, {:.1} MiB in all",
        per_event,
        after.saturating_sub(before) as f64 / (1 << 20) as f64
    );
    assert!(
        after.saturating_sub(before) < 64 << 20,
        "the default timeline holds {} bytes",
        after - before
    );
}
