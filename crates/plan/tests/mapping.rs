//! HybridFlow auto device mapping on small, checkable problems.

use colo_plan::config::GIB;
use colo_plan::cost::{Hardware, Role, Workload};
use colo_plan::mapping::{auto_map, MappingProblem};
use colo_plan::presets::preset;

fn ppo(model: &str, devices: u64, hw: Hardware) -> MappingProblem {
    let m = preset(model).unwrap();
    MappingProblem {
        models: Role::ALL.iter().map(|&r| (r, m.clone())).collect(),
        devices,
        hardware: hw,
        workload: Workload::default(),
        top: 5,
    }
}

#[test]
fn mappings_are_sorted_feasible_and_deterministic() {
    let pb = ppo("qwen2.5-1.5b", 8, Hardware::h100());
    let a = auto_map(&pb).unwrap();
    let b = auto_map(&pb).unwrap();
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    assert_eq!(a.len(), 5);
    for w in a.windows(2) {
        assert!(w[0].iteration_s <= w[1].iteration_s);
    }
    for m in &a {
        assert_eq!(m.allocation.iter().sum::<u64>(), 8);
        assert!(m.set_peak_bytes.iter().all(|&b| b <= 80 * GIB));
        assert_eq!(m.models.len(), 4);
        for asg in &m.models {
            let l = asg.layout;
            assert_eq!(l.p * l.t * l.d, m.allocation[asg.set], "{asg:?}");
        }
        let sum = m.transition_s + m.generation_s + m.prepare_s + m.train_s;
        assert!((sum - m.iteration_s).abs() < 1e-9);
    }
}

#[test]
fn a_large_model_needs_sharding_and_small_devices_can_fail() {
    // Four 32B models cannot share one 80 GiB device…
    let small = ppo("qwen2.5-32b", 1, Hardware::h100());
    let err = auto_map(&small).unwrap_err().to_string();
    assert!(err.contains("do not fit on 1 devices"), "{err}");
    // …but on 16 devices every set's layout shards the 32B actor.
    let pb = ppo("qwen2.5-32b", 16, Hardware::h100());
    let best = &auto_map(&pb).unwrap()[0];
    let actor = best.models.iter().find(|a| a.role == Role::Actor).unwrap();
    assert!(
        actor.layout.p * actor.layout.t >= 2 || actor.layout.d >= 4,
        "{actor:?}"
    );
}

/// GRPO's models (actor and reference, no critic or reward model) of a
/// small preset on four H100s.
fn grpo_on_four() -> MappingProblem {
    let m = preset("qwen2.5-0.5b").unwrap();
    MappingProblem {
        models: vec![(Role::Actor, m.clone()), (Role::Reference, m)],
        devices: 4,
        hardware: Hardware::h100(),
        workload: Workload::default(),
        top: 10,
    }
}

#[test]
fn grpo_without_critic_and_reward_model() {
    let pb = grpo_on_four();
    let maps = auto_map(&pb).unwrap();
    // Two placements (together or apart) × their allocations.
    assert!(maps.iter().any(|m| m.placement.len() == 1));
    assert!(maps.iter().any(|m| m.placement.len() == 2));
    let apart = maps.iter().filter(|m| m.placement.len() == 2).count();
    assert_eq!(apart, 3, "allocations 1+3, 2+2, 3+1");
}

#[test]
fn only_colocated_data_parallel_mappings_name_a_colo_layout() {
    let pb = grpo_on_four();
    let maps = auto_map(&pb).unwrap();
    let mut runnable = 0;
    for map in &maps {
        let colocated_dp = map.allocation.len() == 1
            && map.models.iter().all(|a| {
                a.layout.p == 1 && a.layout.t == 1 && a.layout.gen.is_none_or(|g| g == (1, 1))
            });
        match map.colo_layout() {
            Some(l) => {
                assert!(colocated_dp, "{l} for {:?}", map.placement);
                assert_eq!(l, "1-1-4");
                runnable += 1;
            }
            None => assert!(!colocated_dp, "{:?} runs in colo", map.placement),
        }
    }
    assert!(runnable >= 1, "the fused 1-1-4 mapping is among the best");
}

/// More devices than the search handles, and an empty workload, are
/// refused at once by name (1,000 devices ran out of 24 GB).
#[test]
fn searches_beyond_the_device_cap_or_with_no_work_are_refused() {
    let mut pb = grpo_on_four();
    pb.devices = 1000;
    let e = auto_map(&pb).unwrap_err().to_string();
    assert!(
        e.starts_with("invalid devices = 1000: must be in 1..=128"),
        "{e}"
    );
    let mut pb = grpo_on_four();
    pb.workload.prompts = 0;
    let e = auto_map(&pb).unwrap_err().to_string();
    assert_eq!(e, "invalid prompts = 0: must be >= 1");
}
