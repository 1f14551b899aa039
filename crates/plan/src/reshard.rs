//! 3D-HybridEngine resharding plans: how the actor's weights move from its
//! training layout `p-t-d` to its generation layout `pg-tg-dg-d` on the
//! same devices.
//!
//! Sheng et al., *HybridFlow: A Flexible and Efficient RLHF Framework*
//! (EuroSys 2025), §5 and Table 2. Generation runs `dg = (p·t)/(pg·tg)`
//! replicas inside each training model-parallel group. Generation tensor
//! and pipeline groups take *strided* ranks and the `dg` ranks whose
//! training shards together make one generation shard form a *micro-DP
//! group*; each device all-gathers over its micro-DP group only, and its
//! own training shard already lies inside the generation shard it ends up
//! with, so nothing is held twice.
//!
//! Rank order (an assumption the paper's figures share): training ranks
//! are `rank = d_i·(p·t) + pp_i·t + tp_i`, i.e. model-parallel groups are
//! consecutive with tensor parallel fastest. A generation shard nests
//! training shards only when `pg | p` and `tg | t`; those are the valid
//! generation layouts. With `pg = p` (always the case without training
//! pipeline parallelism) the micro-DP groups are consecutive ranks.
//!
//! [`plan_fsdp_reshard`] is the reshard colo executes: training sharded
//! FSDP-style over `N` workers (`[cluster] sharding = "full"`, layout
//! `1-1-N`), generation tensor-parallel over `tg` of them. Each worker
//! gathers every unit whole (colo-train's units: the root — everything
//! outside the decoder layers — and one per layer, each flattened and
//! padded to a multiple of `N`) and keeps its `1/tg` slice of it, against
//! the 3D-HybridEngine's zero-redundancy ideal for the same layout, where
//! a worker receives only the part of its generation shard it does not
//! hold.

use serde::Serialize;

use crate::config::divisors;
use crate::error::{PlanError, Result};
use crate::model::{DType, ModelSpec};

/// A block of the parameter space: layers `[pp_index/pp, (pp_index+1)/pp)`
/// of the model, tensor slice `[tp_index/tp, (tp_index+1)/tp)` of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Shard {
    pub pp_index: u64,
    pub pp: u64,
    pub tp_index: u64,
    pub tp: u64,
}

impl Shard {
    /// Whether `self` lies entirely inside `outer`.
    pub fn within(&self, outer: &Shard) -> bool {
        let nested = |a: u64, n: u64, b: u64, m: u64| a * m >= b * n && (a + 1) * m <= (b + 1) * n;
        nested(self.pp_index, self.pp, outer.pp_index, outer.pp)
            && nested(self.tp_index, self.tp, outer.tp_index, outer.tp)
    }
}

/// A rank's generation coordinates: (data index, replica within the
/// training model-parallel group, generation pp index, generation tp index).
type GenCoords = (u64, u64, u64, u64);

/// One device's part in the resharding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceReshard {
    pub rank: u64,
    pub train_shard: Shard,
    pub gen_shard: Shard,
    /// The micro-DP group this device all-gathers over (itself included).
    pub gather_group: Vec<u64>,
}

/// The three schemes of HybridFlow's Table 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// All-gather the whole model over all `p·t·d` devices (ZeRO-3 style).
    DeepSpeedChat,
    /// HybridFlow's vanilla engine: all-gather the whole model over the
    /// training model-parallel group, keep the generation shard.
    HybridFlowV,
    /// The 3D-HybridEngine: all-gather over the micro-DP group only.
    HybridFlow,
}

/// Per-device cost of a scheme, in bytes, for a model of `M` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SchemeCost {
    pub scheme: Scheme,
    /// Bytes each device receives during the transition.
    pub comm_bytes: f64,
    /// Peak bytes of weights gathered on a device.
    pub peak_bytes: f64,
    /// Bytes of training weights held a second time during generation.
    pub redundant_bytes: f64,
}

/// HybridFlow Table 2's formulas, per device, for `model_bytes = M`.
///
/// DeepSpeed-Chat: `(tpd−1)/tpd·M`, peak `M`, redundancy `M/tpd`;
/// HybridFlow-V: `(tp−1)/tp·M`, peak `M`, redundancy `M/tp`;
/// HybridFlow: `(tp − tg·pg)/(tg·pg·tp)·M`, peak `M/(tg·pg)`, redundancy 0.
pub fn scheme_cost(
    scheme: Scheme,
    model_bytes: f64,
    train: (u64, u64, u64),
    gen: (u64, u64),
) -> SchemeCost {
    let (p, t, d) = train;
    let (pg, tg) = gen;
    let m = model_bytes;
    let (tp, tpd, g) = ((t * p) as f64, (t * p * d) as f64, (tg * pg) as f64);
    let (comm_bytes, peak_bytes, redundant_bytes) = match scheme {
        Scheme::DeepSpeedChat => ((tpd - 1.0) / tpd * m, m, m / tpd),
        Scheme::HybridFlowV => ((tp - 1.0) / tp * m, m, m / tp),
        Scheme::HybridFlow => ((tp - g) / (g * tp) * m, m / g, 0.0),
    };
    SchemeCost {
        scheme,
        comm_bytes,
        peak_bytes,
        redundant_bytes,
    }
}

/// A resharding plan for one (training, generation) pair of layouts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReshardPlan {
    pub devices: u64,
    /// Training `(p, t, d)`.
    pub train: (u64, u64, u64),
    /// Generation `(pg, tg, dg, d)`.
    pub gen: (u64, u64, u64, u64),
    pub gen_tp_groups: Vec<Vec<u64>>,
    pub gen_pp_groups: Vec<Vec<u64>>,
    pub micro_dp_groups: Vec<Vec<u64>>,
    pub per_device: Vec<DeviceReshard>,
    pub schemes: Vec<SchemeCost>,
}

/// The most devices a resharding plan lists rank by rank.
pub const MAX_RESHARD_DEVICES: u64 = 1 << 16;

/// Check a (training, generation) layout pair on `devices` devices.
pub fn validate_layouts(devices: u64, train: (u64, u64, u64), gen: (u64, u64)) -> Result<()> {
    let (p, t, d) = train;
    let (pg, tg) = gen;
    if !(1..=MAX_RESHARD_DEVICES).contains(&devices) {
        return Err(crate::error::out_of_range(
            "devices",
            devices,
            format!("in 1..={MAX_RESHARD_DEVICES} (the plan lists every rank)"),
        ));
    }
    let err = |reason: String| PlanError::InvalidLayout {
        layout: format!("train {p}-{t}-{d} → gen pg{pg}-tg{tg}"),
        devices,
        reason,
    };
    let product = p.checked_mul(t).and_then(|pt| pt.checked_mul(d));
    if p == 0 || t == 0 || d == 0 || product != Some(devices) {
        return Err(err(format!(
            "p × t × d must equal the device count; p × t must be one of {:?}",
            divisors(devices)
        )));
    }
    if pg == 0 || p % pg != 0 {
        return Err(err(format!(
            "pg must divide p = {p}: one of {:?}",
            divisors(p)
        )));
    }
    if tg == 0 || t % tg != 0 {
        return Err(err(format!(
            "tg must divide t = {t}: one of {:?}",
            divisors(t)
        )));
    }
    Ok(())
}

/// Plan the training → generation resharding of a model of `model_bytes`
/// (HybridFlow §5.3, Figure 8 and Table 2).
pub fn plan_reshard(
    devices: u64,
    train: (u64, u64, u64),
    gen: (u64, u64),
    model_bytes: u64,
) -> Result<ReshardPlan> {
    validate_layouts(devices, train, gen)?;
    let (p, t, d) = train;
    let (pg, tg) = gen;
    let (bp, bt) = (p / pg, t / tg); // training stages / slices per generation shard
    let dg = bp * bt;
    let mp = p * t;

    // Generation coordinates of each rank: (data index, replica in the
    // model-parallel group, generation pp index, generation tp index).
    let coords: Vec<GenCoords> = (0..devices)
        .map(|rank| {
            let (di, r) = (rank / mp, rank % mp);
            let (ppi, tpi) = (r / t, r % t);
            let replica = (ppi % bp) * bt + tpi % bt;
            (di, replica, ppi / bp, tpi / bt)
        })
        .collect();
    let group_by = |key: &dyn Fn(&GenCoords) -> (u64, u64, u64)| {
        let mut groups: std::collections::BTreeMap<(u64, u64, u64), Vec<u64>> = Default::default();
        for (rank, c) in coords.iter().enumerate() {
            groups.entry(key(c)).or_default().push(rank as u64);
        }
        let mut v: Vec<Vec<u64>> = groups.into_values().collect();
        v.sort();
        v
    };
    let gen_tp_groups = group_by(&|&(di, rep, gpp, _)| (di, rep, gpp));
    let gen_pp_groups = group_by(&|&(di, rep, _, gtp)| (di, rep, gtp));
    let micro_dp_groups = group_by(&|&(di, _, gpp, gtp)| (di, gpp, gtp));

    let per_device = coords
        .iter()
        .enumerate()
        .map(|(rank, &(di, _, gpp, gtp))| {
            let r = rank as u64 % mp;
            DeviceReshard {
                rank: rank as u64,
                train_shard: Shard {
                    pp_index: r / t,
                    pp: p,
                    tp_index: r % t,
                    tp: t,
                },
                gen_shard: Shard {
                    pp_index: gpp,
                    pp: pg,
                    tp_index: gtp,
                    tp: tg,
                },
                gather_group: micro_dp_groups
                    .iter()
                    .find(|g| g.contains(&(rank as u64)))
                    .cloned()
                    .unwrap_or_else(|| {
                        panic!("rank {rank} of data index {di} is in no micro-DP group")
                    }),
            }
        })
        .collect();
    let m = model_bytes as f64;
    Ok(ReshardPlan {
        devices,
        train,
        gen: (pg, tg, dg, d),
        gen_tp_groups,
        gen_pp_groups,
        micro_dp_groups,
        per_device,
        schemes: [
            Scheme::DeepSpeedChat,
            Scheme::HybridFlowV,
            Scheme::HybridFlow,
        ]
        .map(|s| scheme_cost(s, m, train, gen))
        .to_vec(),
    })
}

impl ReshardPlan {
    /// A readable description: groups, the gather each device does, and the
    /// three schemes' costs in GiB.
    pub fn describe(&self) -> String {
        use std::fmt::Write as _;
        let gib = |b: f64| b / crate::config::GIB as f64;
        let (p, t, d) = self.train;
        let (pg, tg, dg, _) = self.gen;
        let mut out = String::new();
        let _ = writeln!(out, "training p-t-d = {p}-{t}-{d} → generation pg-tg-dg-d = {pg}-{tg}-{dg}-{d} on {} devices", self.devices);
        let _ = writeln!(out, "generation tensor groups:   {:?}", self.gen_tp_groups);
        let _ = writeln!(out, "generation pipeline groups: {:?}", self.gen_pp_groups);
        let _ = writeln!(
            out,
            "micro-DP (all-gather) groups: {:?}",
            self.micro_dp_groups
        );
        let _ = writeln!(
            out,
            "\nrank  train shard (pp/tp)  gen shard (pp/tp)  all-gather over"
        );
        for dev in &self.per_device {
            let s = |s: &Shard| format!("{}/{} , {}/{}", s.pp_index, s.pp, s.tp_index, s.tp);
            let _ = writeln!(
                out,
                "{:>4}  {:>19}  {:>17}  {:?}",
                dev.rank,
                s(&dev.train_shard),
                s(&dev.gen_shard),
                dev.gather_group
            );
        }
        let _ = writeln!(
            out,
            "\nscheme            comm GiB/device  peak GiB  redundant GiB"
        );
        for c in &self.schemes {
            let name = match c.scheme {
                Scheme::DeepSpeedChat => "DeepSpeed-Chat",
                Scheme::HybridFlowV => "HybridFlow-V",
                Scheme::HybridFlow => "HybridFlow",
            };
            let _ = writeln!(
                out,
                "{name:<16}  {:>15.2}  {:>8.2}  {:>13.2}",
                gib(c.comm_bytes),
                gib(c.peak_bytes),
                gib(c.redundant_bytes)
            );
        }
        out
    }
}

/// Bytes one worker moves in one train → rollout switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SwitchBytes {
    /// Sent to the other workers (each all-gather's own shard, `N − 1`
    /// times: the ring's count, gloo's and NCCL's, and a direct
    /// exchange's).
    pub sent_bytes: u64,
    /// Received from the other workers.
    pub received_bytes: u64,
    /// The most gathered weight bytes held at once.
    pub peak_bytes: u64,
}

/// The reshard of a run sharded over `workers` with a rollout
/// tensor-parallel over `gen_tp` of them, per worker and switch (every
/// worker moves the same bytes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FsdpReshard {
    pub model: String,
    pub dtype: DType,
    pub workers: u64,
    pub gen_tp: u64,
    /// The weights' bytes, unpadded.
    pub model_bytes: u64,
    /// Elements of each unit a worker keeps (root first, then the layers),
    /// padded: `⌈unit / N⌉`.
    pub shard_elements: Vec<u64>,
    /// What colo executes: every unit gathered whole over the `N` workers,
    /// one at a time, `(N − 1)` shards of each received.
    pub executed: SwitchBytes,
    /// The 3D-HybridEngine's zero-redundancy reshard of the same layout:
    /// the `N` training shards nested in the `tg` generation shards, each
    /// worker gathering only over its micro-DP group of `N / tg` workers
    /// (HybridFlow Table 2's `(tp − tg)/(tg·tp)·M` with `tp = N`), each
    /// unit's padding as colo's.
    pub zero_redundancy: SwitchBytes,
}

/// Plans [`FsdpReshard`] for `model` in `dtype` on `workers` workers with
/// a rollout tensor-parallel over `gen_tp`: `gen_tp` divides the workers
/// and the model's attention and key/value heads, as colo's run config
/// requires.
pub fn plan_fsdp_reshard(
    model: &ModelSpec,
    dtype: DType,
    workers: u64,
    gen_tp: u64,
) -> Result<FsdpReshard> {
    if !(1..=MAX_RESHARD_DEVICES).contains(&workers) {
        return Err(crate::error::out_of_range(
            "workers",
            workers,
            format!("in 1..={MAX_RESHARD_DEVICES}"),
        ));
    }
    let err = |reason: String| PlanError::InvalidLayout {
        layout: format!("train 1-1-{workers} sharded → gen 1-{gen_tp}"),
        devices: workers,
        reason,
    };
    if gen_tp == 0 || !workers.is_multiple_of(gen_tp) {
        return Err(err(format!(
            "tg must divide the {workers} workers: one of {:?}",
            divisors(workers)
        )));
    }
    for (what, heads) in [
        ("attention heads", model.heads),
        ("key/value heads", model.kv_heads),
    ] {
        if heads % gen_tp != 0 {
            return Err(err(format!(
                "tg must divide the model's {heads} {what}: one of {:?}",
                divisors(heads)
            )));
        }
    }
    let elt = dtype.bytes();
    let units = std::iter::once(model.non_layer_params())
        .chain((0..model.layers).map(|_| model.layer_params()));
    let shard_elements: Vec<u64> = units.map(|n| n.div_ceil(workers)).collect();
    let largest = shard_elements.iter().copied().max().unwrap_or(0);
    let too_large = || err("the bytes moved exceed 2^64".into());
    let held = (shard_elements.iter()).try_fold(0u64, |a, &n| a.checked_add(n));
    let held = held.ok_or_else(too_large)?;
    // `held` elements a peer, gathered over `peers` peers, `elt` bytes each.
    let bytes = |elements: u64, peers: u64| elements.checked_mul(peers)?.checked_mul(elt);
    let moved = |peers: u64| bytes(held, peers.saturating_sub(1)).ok_or_else(too_large);
    let micro_dp = workers / gen_tp;
    Ok(FsdpReshard {
        model: model.name.clone(),
        dtype,
        workers,
        gen_tp,
        model_bytes: model.weight_bytes(dtype),
        executed: SwitchBytes {
            sent_bytes: moved(workers)?,
            received_bytes: moved(workers)?,
            peak_bytes: bytes(largest, workers).ok_or_else(too_large)?,
        },
        zero_redundancy: SwitchBytes {
            sent_bytes: moved(micro_dp)?,
            received_bytes: moved(micro_dp)?,
            peak_bytes: bytes(held, micro_dp).ok_or_else(too_large)?,
        },
        shard_elements,
    })
}

impl FsdpReshard {
    /// A readable description: the layout, and per worker the bytes each
    /// reshard sends and receives.
    pub fn describe(&self) -> String {
        use std::fmt::Write as _;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let (n, tg) = (self.workers, self.gen_tp);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "training 1-1-{n} sharded (FSDP over {n} workers, {} units) → generation 1-{tg} \
             ({} tensor-parallel group{} of {tg})",
            self.shard_elements.len(),
            n / tg,
            if n / tg == 1 { "" } else { "s" },
        );
        let _ = writeln!(
            out,
            "model {:.3} MiB of {} weights; per worker and switch, every worker alike:\n",
            mib(self.model_bytes),
            format!("{:?}", self.dtype).to_lowercase()
        );
        let _ = writeln!(
            out,
            "{:<34} {:>12} {:>12} {:>12}",
            "reshard", "sent MiB", "received MiB", "peak MiB"
        );
        for (name, b) in [
            ("colo (each unit gathered whole)", self.executed),
            ("3D-HybridEngine (zero redundancy)", self.zero_redundancy),
        ] {
            let _ = writeln!(
                out,
                "{name:<34} {:>12.3} {:>12.3} {:>12.3}",
                mib(b.sent_bytes),
                mib(b.received_bytes),
                mib(b.peak_bytes)
            );
        }
        let _ = writeln!(
            out,
            "\nexact bytes: colo sends {} and receives {}; the ideal {} and {}",
            self.executed.sent_bytes,
            self.executed.received_bytes,
            self.zero_redundancy.sent_bytes,
            self.zero_redundancy.received_bytes
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hybridflow_volume_is_what_the_micro_dp_gather_receives() {
        let m = 1u64 << 40;
        let plan = plan_reshard(16, (2, 4, 2), (1, 2), m).unwrap();
        let (p, t, _) = plan.train;
        let received = (plan.gen.2 - 1) as f64 * m as f64 / (p * t) as f64;
        let hf = plan
            .schemes
            .iter()
            .find(|c| c.scheme == Scheme::HybridFlow)
            .unwrap();
        assert!((hf.comm_bytes - received).abs() < 1.0);
        assert!((hf.peak_bytes - m as f64 / 2.0).abs() < 1.0);
    }

    /// colo's reshard receives `(N − 1)/N` of the weights, up to each
    /// unit's padding; the zero-redundancy ideal as much at `tg = 1`,
    /// nothing at `tg = N`, and HybridFlow's Table 2 volume between.
    #[test]
    fn fsdp_reshard_against_the_zero_redundancy_ideal() {
        let m = crate::presets::preset("qwen2.5-0.5b").unwrap();
        let model = m.weight_bytes(DType::Bf16);
        for n in [1u64, 2, 4, 8] {
            let one = plan_fsdp_reshard(&m, DType::Bf16, n, 1).unwrap();
            let moved = |b: SwitchBytes| (b.sent_bytes, b.received_bytes);
            assert_eq!(moved(one.executed), moved(one.zero_redundancy), "{n}, tg 1");
            // One unit gathered at a time against the whole model at once.
            assert_eq!(
                one.zero_redundancy.peak_bytes,
                one.shard_elements.iter().sum::<u64>() * n * 2
            );
            let units = 1 + m.layers;
            assert_eq!(one.shard_elements.len() as u64, units);
            let floor = model * (n - 1) / n;
            let got = one.executed.received_bytes;
            assert!(
                got >= floor && got < floor + units * n * 2,
                "{n}: {got} vs {floor}"
            );
            assert_eq!(one.executed.sent_bytes, got);
            let largest = m.non_layer_params().div_ceil(n) * n * 2;
            assert_eq!(one.executed.peak_bytes, largest);
            for tg in [2u64, 4, 8]
                .into_iter()
                .filter(|tg| n % tg == 0 && 14 % tg == 0)
            {
                let p = plan_fsdp_reshard(&m, DType::Bf16, n, tg).unwrap();
                assert_eq!(p.executed, one.executed, "colo's gathers ignore tg");
                let hf = scheme_cost(Scheme::HybridFlow, model as f64, (1, n, 1), (1, tg));
                let ideal = p.zero_redundancy.received_bytes as f64;
                assert!(
                    (ideal - hf.comm_bytes).abs() <= (units * n * 2) as f64,
                    "{n}, {tg}"
                );
                if tg == n {
                    assert_eq!(p.zero_redundancy.received_bytes, 0);
                }
            }
        }
        // The padding: units of 7 and 5 elements on 4 workers keep 2 each.
        let tiny = crate::model::ModelSpec {
            name: "t".into(),
            hidden: 1,
            intermediate: 1,
            layers: 1,
            heads: 1,
            kv_heads: 1,
            head_dim: 1,
            vocab: 2,
            tie_embeddings: true,
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
        };
        let p = plan_fsdp_reshard(&tiny, DType::F32, 4, 1).unwrap();
        assert_eq!((tiny.non_layer_params(), tiny.layer_params()), (3, 9));
        assert_eq!(p.shard_elements, [1, 3]);
        assert_eq!(p.executed.received_bytes, (1 + 3) * 3 * 4);
    }

    #[test]
    fn fsdp_reshard_refuses_a_tg_that_does_not_divide() {
        let m = crate::presets::preset("qwen2.5-0.5b").unwrap();
        let e = plan_fsdp_reshard(&m, DType::Bf16, 4, 3)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tg must divide the 4 workers: one of [1, 2, 4]"),
            "{e}"
        );
        let e = plan_fsdp_reshard(&m, DType::Bf16, 8, 4)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tg must divide the model's 14 attention heads"),
            "{e}"
        );
        assert!(plan_fsdp_reshard(&m, DType::Bf16, 0, 1).is_err());
    }

    #[test]
    fn invalid_generation_layout_names_the_valid_ones() {
        let err = plan_reshard(8, (1, 4, 2), (1, 3), 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("[1, 2, 4]"), "{err}");
        let err = plan_reshard(8, (2, 1, 4), (1, 2), 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("tg must divide t = 1"), "{err}");
        assert!(plan_reshard(8, (1, 4, 3), (1, 1), 1).is_err());
    }

    #[test]
    fn shard_nesting() {
        let half = Shard {
            pp_index: 0,
            pp: 1,
            tp_index: 1,
            tp: 2,
        };
        let quarter = Shard {
            pp_index: 0,
            pp: 1,
            tp_index: 2,
            tp: 4,
        };
        let wrong = Shard {
            pp_index: 0,
            pp: 1,
            tp_index: 1,
            tp: 4,
        };
        assert!(quarter.within(&half));
        assert!(!wrong.within(&half));
        assert!(!half.within(&quarter));
    }
}
