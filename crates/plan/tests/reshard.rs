//! 3D-HybridEngine resharding: HybridFlow's Figure 8 example and the
//! zero-redundancy property over every valid layout up to 64 devices.

use colo_plan::config::divisors;
use colo_plan::reshard::{plan_reshard, Scheme};

#[test]
fn hybridflow_figure_8_groups() {
    // Training 1-4-2 → generation 1-2-2-2 on 8 devices.
    let plan = plan_reshard(8, (1, 4, 2), (1, 2), 1 << 30).unwrap();
    assert_eq!(plan.gen, (1, 2, 2, 2));
    assert_eq!(
        plan.gen_tp_groups,
        vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
    );
    assert_eq!(
        plan.micro_dp_groups,
        vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
    );
    assert_eq!(plan.per_device[3].gather_group, vec![2, 3]);
}

/// For every `N ≤ 64`, every training `p·t·d = N` and every generation
/// layout with `pg | p`, `tg | t`: each device's training shard lies inside
/// its generation shard; the micro-DP group's training shards tile that
/// generation shard exactly; generation groups partition the devices; and
/// HybridFlow's Table 2 volume is what the micro-DP all-gather receives.
#[test]
fn training_shard_within_generation_shard_for_all_layouts() {
    let mut checked = 0;
    for n in 1..=64u64 {
        for p in divisors(n) {
            for t in divisors(n / p) {
                let d = n / (p * t);
                for pg in divisors(p) {
                    for tg in divisors(t) {
                        let plan = plan_reshard(n, (p, t, d), (pg, tg), 1 << 30).unwrap();
                        let dg = plan.gen.2;
                        assert_eq!(dg * pg * tg, p * t);
                        for dev in &plan.per_device {
                            assert!(
                                dev.train_shard.within(&dev.gen_shard),
                                "{n} {p}-{t}-{d} → {pg}-{tg}: {dev:?}"
                            );
                            // Every member of the gather group ends with the same shard.
                            for &r in &dev.gather_group {
                                assert_eq!(plan.per_device[r as usize].gen_shard, dev.gen_shard);
                            }
                            assert_eq!(dev.gather_group.len() as u64, dg);
                        }
                        for groups in [
                            &plan.gen_tp_groups,
                            &plan.gen_pp_groups,
                            &plan.micro_dp_groups,
                        ] {
                            let mut all: Vec<u64> = groups.concat();
                            all.sort();
                            assert_eq!(all, (0..n).collect::<Vec<_>>());
                        }
                        assert!(plan.gen_tp_groups.iter().all(|g| g.len() as u64 == tg));
                        assert!(plan.gen_pp_groups.iter().all(|g| g.len() as u64 == pg));
                        if pg == p {
                            // Micro-DP groups are consecutive ranks.
                            for g in &plan.micro_dp_groups {
                                assert!(g.windows(2).all(|w| w[1] == w[0] + 1), "{g:?}");
                            }
                        }
                        let m = (1u64 << 30) as f64;
                        let hf = plan
                            .schemes
                            .iter()
                            .find(|c| c.scheme == Scheme::HybridFlow)
                            .unwrap();
                        let received = (dg - 1) as f64 * m / (p * t) as f64;
                        assert!((hf.comm_bytes - received).abs() < 1e-3 * m);
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 1000, "{checked}");
}

#[test]
fn table_2_orders_the_schemes() {
    // HybridFlow never moves or holds more than the other two.
    let plan = plan_reshard(16, (1, 8, 2), (1, 2), 1 << 34).unwrap();
    let get = |s| plan.schemes.iter().find(|c| c.scheme == s).unwrap();
    let (ds, v, hf) = (
        get(Scheme::DeepSpeedChat),
        get(Scheme::HybridFlowV),
        get(Scheme::HybridFlow),
    );
    assert!(hf.comm_bytes < v.comm_bytes && v.comm_bytes < ds.comm_bytes);
    assert!(hf.peak_bytes < v.peak_bytes && hf.redundant_bytes == 0.0);
    assert_eq!(ds.peak_bytes, (1u64 << 34) as f64);
}

/// Device counts the plan cannot list rank by rank, and products that
/// overflow, are refused by name (they panicked or ran out of memory).
#[test]
fn device_counts_out_of_range_are_refused() {
    for (devices, train) in [
        (0, (1, 1, 1)),
        (u64::MAX, (u64::MAX, 1, 1)),
        (1 << 40, (1, 1, 1 << 40)),
    ] {
        let e = plan_reshard(devices, train, (1, 1), 1 << 30)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("invalid devices = {devices}")),
            "{e}"
        );
    }
    let e = plan_reshard(8, (u64::MAX, 2, 4), (1, 1), 1 << 30)
        .unwrap_err()
        .to_string();
    assert!(e.contains("p × t × d must equal the device count"), "{e}");
}
