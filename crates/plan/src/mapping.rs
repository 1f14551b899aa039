//! HybridFlow's auto device mapping (Sheng et al., *HybridFlow*, EuroSys
//! 2025, §6, Algorithms 1 and 2): which models share devices, how many
//! devices each colocated set gets, and each model's parallel layout.
//!
//! Algorithm 1 enumerates the placements of the models into colocated sets
//! (the set partitions: 15 for actor, critic, reference and reward), finds
//! the fewest devices each set needs to avoid running out of memory, and
//! enumerates every allocation of the `N` devices that gives each set at
//! least that many. Algorithm 2 (`auto_parallel`) picks, for a set on `A`
//! devices, the layout of each of its models that minimises the set's
//! latency within memory. The iteration's latency follows the dataflow:
//! generation (in the actor's set, after the resharding), then the forward
//! passes, then the updates; models in one set take turns (their latencies
//! add up) while sets run concurrently (a stage lasts as long as its
//! slowest set). Everything is enumerated in a fixed order and ties are
//! broken by that order, so the answer is deterministic.

use std::collections::HashMap;

use serde::Serialize;

use crate::config::divisors;
use crate::cost::{generation_s, model_cost, Hardware, Layout, ModelCost, Role, Workload};
use crate::error::{PlanError, Result};
use crate::model::ModelSpec;

/// The search's input.
#[derive(Debug, Clone)]
pub struct MappingProblem {
    /// The models, each role at most once; the actor is required.
    pub models: Vec<(Role, ModelSpec)>,
    pub devices: u64,
    pub hardware: Hardware,
    pub workload: Workload,
    /// How many mappings to return.
    pub top: usize,
}

/// One model's place in a mapping.
#[derive(Debug, Clone, Serialize)]
pub struct Assignment {
    pub role: Role,
    /// Index of its colocated set in [`Mapping::placement`].
    pub set: usize,
    pub layout: Layout,
    pub persistent_bytes: u64,
    pub transient_bytes: u64,
}

/// A complete device mapping and its estimated cost.
#[derive(Debug, Clone, Serialize)]
pub struct Mapping {
    /// Colocated sets of models.
    pub placement: Vec<Vec<Role>>,
    /// Devices per set.
    pub allocation: Vec<u64>,
    pub models: Vec<Assignment>,
    pub transition_s: f64,
    pub generation_s: f64,
    pub prepare_s: f64,
    pub train_s: f64,
    pub iteration_s: f64,
    /// Peak bytes per device in each set.
    pub set_peak_bytes: Vec<u64>,
}

impl Mapping {
    /// The `[cluster] layout` under which `colo train` executes this
    /// mapping, if it can: every model colocated on the same devices, each
    /// purely data-parallel (`p = t = 1`, generation `1-1`). colo's hybrid
    /// worker holds all of a device's roles, so this is the layout
    /// `"1-1-N"`; anything else is a plan only.
    pub fn colo_layout(&self) -> Option<String> {
        let [devices] = self.allocation[..] else {
            return None;
        };
        let data_parallel = self.models.iter().all(|m| {
            let l = m.layout;
            l.p == 1 && l.t == 1 && l.d == devices && l.gen.is_none_or(|g| g == (1, 1))
        });
        data_parallel.then(|| format!("1-1-{devices}"))
    }
}

/// Every partition of `{0, …, n−1}` into non-empty blocks, in the order of
/// their restricted growth strings (Bell number B(n) of them: 1, 1, 2, 5,
/// 15, 52, …). Blocks are listed by their smallest element.
pub fn set_partitions(n: usize) -> Vec<Vec<Vec<usize>>> {
    fn grow(i: usize, n: usize, rgs: &mut Vec<usize>, out: &mut Vec<Vec<Vec<usize>>>) {
        if i == n {
            let blocks = rgs.iter().copied().max().map_or(0, |m| m + 1);
            let mut parts = vec![Vec::new(); blocks];
            for (elem, &b) in rgs.iter().enumerate() {
                parts[b].push(elem);
            }
            out.push(parts);
            return;
        }
        let next = rgs.iter().copied().max().map_or(0, |m| m + 1);
        for b in 0..=next {
            rgs.push(b);
            grow(i + 1, n, rgs, out);
            rgs.pop();
        }
    }
    let mut out = Vec::new();
    grow(0, n, &mut Vec::with_capacity(n), &mut out);
    out
}

/// Every way to write `total` as an ordered sum with part `i` at least
/// `mins[i]`, in lexicographic order.
pub fn allocations(total: u64, mins: &[u64]) -> Vec<Vec<u64>> {
    fn rec(left: u64, mins: &[u64], cur: &mut Vec<u64>, out: &mut Vec<Vec<u64>>) {
        match mins {
            [] => {}
            [last] => {
                if left >= *last {
                    cur.push(left);
                    out.push(cur.clone());
                    cur.pop();
                }
            }
            [first, rest @ ..] => {
                let reserve: u64 = rest.iter().sum();
                for a in *first..=left.saturating_sub(reserve) {
                    cur.push(a);
                    rec(left - a, rest, cur, out);
                    cur.pop();
                }
            }
        }
    }
    let mut out = Vec::new();
    rec(total, mins, &mut Vec::new(), &mut out);
    out
}

/// The layouts `role` may take on `a` devices: `p·t·d = a`, `t` within a
/// node and dividing the heads, `p` dividing the layers; the actor also
/// picks a generation layout with `pg | p`, `tg | t` (see [`crate::reshard`]).
pub fn layouts(role: Role, m: &ModelSpec, a: u64, hw: &Hardware) -> Vec<Layout> {
    let mut out = Vec::new();
    for t in divisors(a) {
        if t > hw.devices_per_node || !m.heads.is_multiple_of(t) {
            continue;
        }
        for p in divisors(a / t) {
            if !m.layers.is_multiple_of(p) {
                continue;
            }
            let d = a / (t * p);
            if role == Role::Actor {
                for pg in divisors(p) {
                    for tg in divisors(t) {
                        out.push(Layout {
                            p,
                            t,
                            d,
                            gen: Some((pg, tg)),
                        });
                    }
                }
            } else {
                out.push(Layout { p, t, d, gen: None });
            }
        }
    }
    out
}

/// A colocated set's best layouts on its devices (Algorithm 2's result).
#[derive(Debug, Clone)]
struct SetPlan {
    costs: Vec<ModelCost>,
    generation_s: f64,
    transition_s: f64,
    prepare_s: f64,
    train_s: f64,
    peak_bytes: u64,
}

/// Drop the candidates another one beats on latency and both memories.
fn pareto(mut cands: Vec<ModelCost>) -> Vec<ModelCost> {
    let key = |c: &ModelCost| {
        (
            c.prepare_s + c.train_s,
            c.persistent_bytes,
            c.transient_bytes,
        )
    };
    cands.sort_by(|a, b| key(a).0.total_cmp(&key(b).0).then(a.layout.cmp(&b.layout)));
    let mut kept: Vec<ModelCost> = Vec::new();
    for c in cands {
        let (_, ps, tr) = key(&c);
        if !kept
            .iter()
            .any(|k| k.persistent_bytes <= ps && k.transient_bytes <= tr)
        {
            kept.push(c);
        }
    }
    kept
}

/// Algorithm 2: the layouts of `members` on `a` devices that minimise the
/// set's summed latency while its peak fits, or `None`.
fn auto_parallel(pb: &MappingProblem, members: &[usize], a: u64) -> Option<SetPlan> {
    let (hw, w) = (&pb.hardware, &pb.workload);
    let cands: Vec<Vec<ModelCost>> = members
        .iter()
        .map(|&i| {
            let (role, m) = (pb.models[i].0, &pb.models[i].1);
            let all = layouts(role, m, a, hw)
                .into_iter()
                .map(|l| model_cost(role, m, l, a, hw, w))
                .collect();
            if role == Role::Actor {
                all
            } else {
                pareto(all)
            }
        })
        .collect();
    if cands.iter().any(|c| c.is_empty()) {
        return None;
    }
    let mut best: Option<(f64, SetPlan)> = None;
    let mut idx = vec![0usize; members.len()];
    loop {
        let combo: Vec<ModelCost> = idx.iter().zip(&cands).map(|(&i, c)| c[i]).collect();
        if let Some(plan) = evaluate_set(pb, members, &combo, a) {
            let total = plan.generation_s + plan.transition_s + plan.prepare_s + plan.train_s;
            if best.as_ref().is_none_or(|(b, _)| total < *b) {
                best = Some((total, plan));
            }
        }
        // Odometer over the candidate lists.
        let mut k = 0;
        while k < idx.len() {
            idx[k] += 1;
            if idx[k] < cands[k].len() {
                break;
            }
            idx[k] = 0;
            k += 1;
        }
        if k == idx.len() {
            break;
        }
    }
    best.map(|(_, p)| p)
}

/// Memory and latency of one combination of layouts in one set.
fn evaluate_set(
    pb: &MappingProblem,
    members: &[usize],
    combo: &[ModelCost],
    a: u64,
) -> Option<SetPlan> {
    let (hw, w) = (&pb.hardware, &pb.workload);
    let persistent: u64 = combo.iter().map(|c| c.persistent_bytes).sum();
    let base = hw.runtime_overhead_bytes + persistent;
    let mut generation = 0.0;
    let mut transient = combo.iter().map(|c| c.transient_bytes).max().unwrap_or(0);
    for (c, &i) in combo.iter().zip(members) {
        if c.role == Role::Actor {
            // The engine keeps whatever the set leaves for its KV cache.
            let kv_budget = hw.device_bytes.checked_sub(base + c.gen_weight_bytes)?;
            generation = generation_s(&pb.models[i].1, c, a, kv_budget, hw, w)?;
            let one_seq = c.kv_bytes_per_token * w.seq_len();
            transient = transient.max(c.gen_weight_bytes + one_seq);
        }
    }
    let peak_bytes = base + transient;
    if peak_bytes > hw.device_bytes {
        return None;
    }
    Some(SetPlan {
        costs: combo.to_vec(),
        generation_s: generation,
        transition_s: combo.iter().map(|c| c.transition_s).sum(),
        prepare_s: combo.iter().map(|c| c.prepare_s).sum(),
        train_s: combo.iter().map(|c| c.train_s).sum(),
        peak_bytes,
    })
}

/// The most devices [`auto_map`] searches: 128 took 1.7 s and 0.7 GB here,
/// 256 took 11 s and 2.8 GB, 1,000 ran out of 24 GB.
pub const MAX_MAP_DEVICES: u64 = 128;

/// Algorithm 1: the `top` best mappings of `pb.models` onto `pb.devices`
/// devices, fastest first.
pub fn auto_map(pb: &MappingProblem) -> Result<Vec<Mapping>> {
    let roles: Vec<Role> = pb.models.iter().map(|(r, _)| *r).collect();
    if !roles.contains(&Role::Actor) {
        return Err(PlanError::NoFeasibleMapping(
            "the models must include an actor".into(),
        ));
    }
    for (i, r) in roles.iter().enumerate() {
        if roles[..i].contains(r) {
            return Err(PlanError::NoFeasibleMapping(format!(
                "role `{}` is given twice",
                r.name()
            )));
        }
    }
    if !(1..=MAX_MAP_DEVICES).contains(&pb.devices) {
        return Err(crate::error::out_of_range(
            "devices",
            pb.devices,
            format!(
                "in 1..={MAX_MAP_DEVICES}: the search enumerates every split of the devices \
                 between the colocated sets, which grows too fast beyond (HybridFlow's largest \
                 cluster had 128 GPUs)"
            ),
        ));
    }
    let w = &pb.workload;
    for (name, value) in [
        ("prompts", w.prompts),
        ("samples_per_prompt", w.samples_per_prompt),
        ("prompt_len", w.prompt_len),
        ("response_len", w.response_len),
        ("micro_batch_tokens", w.micro_batch_tokens),
        ("ppo_epochs", w.ppo_epochs),
    ] {
        if value == 0 {
            return Err(crate::error::out_of_range(name, value, ">= 1"));
        }
    }
    let n = pb.devices;
    let mut memo: HashMap<(Vec<usize>, u64), Option<SetPlan>> = HashMap::new();
    let mut set_plan = |members: &Vec<usize>, a: u64| -> Option<SetPlan> {
        memo.entry((members.clone(), a))
            .or_insert_with(|| auto_parallel(pb, members, a))
            .clone()
    };
    let mut found = Vec::new();
    for placement in set_partitions(pb.models.len()) {
        // get_min_alloc: the fewest devices each set fits on.
        let mut mins = Vec::with_capacity(placement.len());
        for set in &placement {
            match (1..=n).find(|&a| set_plan(set, a).is_some()) {
                Some(a) => mins.push(a),
                None => break,
            }
        }
        if mins.len() < placement.len() || mins.iter().sum::<u64>() > n {
            continue;
        }
        for alloc in allocations(n, &mins) {
            let plans: Option<Vec<SetPlan>> = placement
                .iter()
                .zip(&alloc)
                .map(|(s, &a)| set_plan(s, a))
                .collect();
            if let Some(plans) = plans {
                found.push(combine(pb, &placement, alloc, &plans));
            }
        }
    }
    if found.is_empty() {
        return Err(PlanError::NoFeasibleMapping(format!(
            "the models do not fit on {n} devices of {:.1} GiB in any placement",
            pb.hardware.device_bytes as f64 / crate::config::GIB as f64
        )));
    }
    // Stable sort: equal costs keep enumeration order.
    found.sort_by(|a, b| a.iteration_s.total_cmp(&b.iteration_s));
    found.truncate(pb.top.max(1));
    Ok(found)
}

/// The iteration's latency from its sets' plans (HybridFlow's `d_cost`).
fn combine(
    pb: &MappingProblem,
    placement: &[Vec<usize>],
    allocation: Vec<u64>,
    plans: &[SetPlan],
) -> Mapping {
    let max = |f: fn(&SetPlan) -> f64| plans.iter().map(f).fold(0.0, f64::max);
    let (transition_s, generation_s) = (max(|p| p.transition_s), max(|p| p.generation_s));
    let (prepare_s, train_s) = (max(|p| p.prepare_s), max(|p| p.train_s));
    let models = placement
        .iter()
        .zip(plans)
        .enumerate()
        .flat_map(|(set, (_, plan))| {
            plan.costs.iter().map(move |c| Assignment {
                role: c.role,
                set,
                layout: c.layout,
                persistent_bytes: c.persistent_bytes,
                transient_bytes: c.transient_bytes,
            })
        })
        .collect();
    Mapping {
        placement: placement
            .iter()
            .map(|s| s.iter().map(|&i| pb.models[i].0).collect())
            .collect(),
        allocation,
        models,
        transition_s,
        generation_s,
        prepare_s,
        train_s,
        iteration_s: transition_s + generation_s + prepare_s + train_s,
        set_peak_bytes: plans.iter().map(|p| p.peak_bytes).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bell_numbers() {
        let counts: Vec<usize> = (0..=6).map(|n| set_partitions(n).len()).collect();
        assert_eq!(counts, [1, 1, 2, 5, 15, 52, 203]);
    }

    #[test]
    fn partitions_cover_every_element_once_and_are_distinct() {
        let parts = set_partitions(4);
        for p in &parts {
            let mut all: Vec<usize> = p.concat();
            all.sort();
            assert_eq!(all, [0, 1, 2, 3]);
        }
        let mut sorted = parts.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), parts.len());
    }

    #[test]
    fn allocations_respect_minimums_and_sum() {
        let a = allocations(6, &[1, 2, 1]);
        assert_eq!(a.len(), 6); // compositions of 6 − 4 + 3 = 5 into 3 parts ≥ 1: C(4, 2)
        assert!(a.iter().all(|v| v.iter().sum::<u64>() == 6 && v[1] >= 2));
        assert!(allocations(3, &[2, 2]).is_empty());
    }
}
