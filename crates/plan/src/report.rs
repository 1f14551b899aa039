//! The memory planner's answer: per-phase, per-component resident bytes on
//! one device, and a plain-text table of it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::config::GIB;

/// What occupies device memory. The order is the table's column order;
/// the snake-case names are the JSON keys (and, where colo-mem has the same
/// thing, its tag names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    /// CUDA context, communicator buffers, CUDA graphs, allocator slack.
    Runtime,
    /// The trainer's (sharded) parameters.
    TrainParams,
    /// The trainer's (sharded) gradients.
    TrainGrads,
    /// Optimizer states (fp32 master weights and AdamW moments).
    Optimizer,
    /// FSDP's unsharded parameters while a unit computes: the root unit
    /// (embeddings, head, final norm) and `fsdp_gathered_layers` decoder
    /// layers (PyTorch's two, current and prefetched; colo's one).
    FsdpGathered,
    /// Activations kept for backward (training) or one layer's working set
    /// (forward-only passes).
    Activations,
    /// fp32 logits of a micro-batch (and in training their gradient).
    Logits,
    /// The trainer's weights materialised for the weight sync.
    SyncBuffer,
    /// The rollout engine's weights.
    RolloutWeights,
    /// The rollout engine's KV-cache pool.
    KvCache,
    /// The reference model's (sharded) parameters.
    RefParams,
    /// The rollout engine's captured decode graphs: their inputs, outputs
    /// and working memory (colo-mem's tag `cuda_graph`).
    #[serde(rename = "cuda_graph")]
    CudaGraphs,
}

impl Component {
    /// The JSON / table name.
    pub fn name(self) -> &'static str {
        match self {
            Component::Runtime => "runtime",
            Component::TrainParams => "train_params",
            Component::TrainGrads => "train_grads",
            Component::Optimizer => "optimizer",
            Component::FsdpGathered => "fsdp_gathered",
            Component::Activations => "activations",
            Component::Logits => "logits",
            Component::SyncBuffer => "sync_buffer",
            Component::RolloutWeights => "rollout_weights",
            Component::KvCache => "kv_cache",
            Component::RefParams => "ref_params",
            Component::CudaGraphs => "cuda_graph",
        }
    }
}

/// Which part of the RL step a phase belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseKind {
    /// Between training and generation (offload, wake, weight sync).
    Transition,
    Generation,
    LogProb,
    Training,
}

/// Resident bytes on one device during one phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseMemory {
    pub name: String,
    pub kind: PhaseKind,
    pub total_bytes: u64,
    /// Only the components with non-zero bytes.
    pub components: BTreeMap<Component, u64>,
}

impl PhaseMemory {
    /// Bytes of one component (0 when absent).
    pub fn get(&self, c: Component) -> u64 {
        self.components.get(&c).copied().unwrap_or(0)
    }
}

/// Per-device memory over one RL step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryReport {
    pub peak_bytes: u64,
    pub peak_phase: String,
    /// What the device must hold beyond `peak_bytes`: the most any phase's
    /// total plus its margin ([`crate::memory::ACTIVATION_MARGIN`] of its
    /// activations) exceeds the peak by. A capacity of `peak_bytes +
    /// margin_bytes` is what the plan says suffices.
    pub margin_bytes: u64,
    pub device_bytes: u64,
    /// Whether every phase with its margin fits in the device
    /// (`peak_bytes + margin_bytes <= device_bytes`).
    pub fits: bool,
    /// Bytes the engine holds for weights + KV, as a fraction of the device
    /// (SGLang's `mem_fraction_static`).
    pub mem_fraction: f64,
    /// The largest `mem_fraction` at which every phase fits; `None` when
    /// none does (the phases without a KV cache overflow on their own, or
    /// what is left does not even hold the engine's weights).
    pub max_mem_fraction: Option<f64>,
    pub kv_cache_bytes: u64,
    /// KV-cache capacity of one generation replica, in tokens.
    pub kv_tokens: u64,
    /// The step's phases in order, starting after the previous step's
    /// training.
    pub phases: Vec<PhaseMemory>,
}

impl MemoryReport {
    /// The phase named `name`.
    pub fn phase(&self, name: &str) -> Option<&PhaseMemory> {
        self.phases.iter().find(|p| p.name == name)
    }

    /// The largest total over the phases of one kind.
    pub fn peak_of(&self, kind: PhaseKind) -> u64 {
        self.phases
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| p.total_bytes)
            .max()
            .unwrap_or(0)
    }

    /// A table with one row per phase and one column per component that is
    /// non-zero somewhere, in the unit of the peak (GiB, MiB or KiB), which
    /// the header names.
    pub fn table(&self) -> String {
        let mut cols: Vec<Component> = self
            .phases
            .iter()
            .flat_map(|p| p.components.keys().copied())
            .collect();
        cols.sort();
        cols.dedup();
        // The peak's unit: GiB for real models, MiB or KiB for colo's small
        // CPU runs (a 0.1 M-parameter model on a 24 GiB "device" is all
        // zeros in GiB).
        let (unit, scale) = unit_of(self.peak_bytes);
        let gib = |b: u64| format!("{:.1}", b as f64 / scale as f64);
        let sized = |b: u64| {
            let (unit, scale) = unit_of(b);
            format!("{:.1} {unit}", b as f64 / scale as f64)
        };
        let header = format!("phase, {unit}");
        let name_w = self
            .phases
            .iter()
            .map(|p| p.name.len())
            .max()
            .unwrap_or(0)
            .max(header.len());
        let widths: Vec<usize> = cols.iter().map(|c| c.name().len().max(6)).collect();
        let mut out = String::new();
        let _ = write!(out, "{header:<name_w$}");
        for (c, w) in cols.iter().zip(&widths) {
            let _ = write!(out, "  {:>w$}", c.name());
        }
        let _ = writeln!(out, "  {:>7}", "total");
        for p in &self.phases {
            let _ = write!(out, "{:<name_w$}", p.name);
            for (c, w) in cols.iter().zip(&widths) {
                let cell = match p.get(*c) {
                    0 => "-".to_string(),
                    b => gib(b),
                };
                let _ = write!(out, "  {cell:>w$}");
            }
            let mark = if p.name == self.peak_phase {
                "  <- peak"
            } else {
                ""
            };
            let _ = writeln!(out, "  {:>7}{mark}", gib(p.total_bytes));
        }
        let margin = match self.margin_bytes {
            0 => String::new(),
            m => format!(
                " + margin {} ({:.0}% of the activations)",
                sized(m),
                100.0 * crate::memory::ACTIVATION_MARGIN
            ),
        };
        let _ = writeln!(
            out,
            "\npeak {} {unit} in `{}`{margin} of {} per device: {}",
            gib(self.peak_bytes),
            self.peak_phase,
            sized(self.device_bytes),
            if self.fits { "fits" } else { "OUT OF MEMORY" }
        );
        let _ = writeln!(
            out,
            "engine: mem fraction {}, KV cache {} = {} tokens per replica",
            fraction(self.mem_fraction),
            sized(self.kv_cache_bytes),
            self.kv_tokens
        );
        match self.max_mem_fraction {
            Some(f) => {
                let _ = writeln!(out, "largest mem fraction that fits: {}", fraction(f));
            }
            None => {
                let _ = writeln!(out, "no mem fraction fits: {}", self.why_no_fraction_fits());
            }
        }
        out
    }

    /// Why no `mem_fraction` fits: a phase without the KV cache that is
    /// too large on its own, or the phase with the KV cache whose other
    /// contents leave too little for the engine's weights.
    fn why_no_fraction_fits(&self) -> String {
        let sized = |b: u64| {
            let (unit, scale) = unit_of(b);
            format!("{:.1} {unit}", b as f64 / scale as f64)
        };
        let device = self.device_bytes;
        // A phase's total with its margin.
        let need = |p: &PhaseMemory| p.total_bytes + crate::memory::phase_margin(&p.components);
        let alone =
            (self.phases.iter()).find(|p| p.get(Component::KvCache) == 0 && need(p) > device);
        if let Some(p) = alone {
            return format!(
                "`{}` needs {} without the KV cache, more than the {} of a device, \
                 whatever the fraction (lower its micro-batch, offload, or shard over more devices)",
                p.name,
                sized(need(p)),
                sized(device)
            );
        }
        let beside = |p: &PhaseMemory| {
            let engine = p.get(Component::KvCache) + p.get(Component::RolloutWeights);
            need(p).saturating_sub(engine)
        };
        let tightest = (self.phases.iter())
            .filter(|p| p.get(Component::KvCache) > 0)
            .max_by_key(|p| beside(p));
        match tightest {
            Some(p) => format!(
                "`{}` holds {} besides the engine, and of a device of {} that leaves \
                 no room for the engine's {} of weights and a KV cache",
                p.name,
                sized(beside(p)),
                sized(device),
                sized(p.get(Component::RolloutWeights))
            ),
            None => format!("the engine's weights do not fit in {}", sized(device)),
        }
    }
}

/// The binary unit a size reads best in: GiB from 1 GiB, MiB from 1 MiB,
/// else KiB; with its size in bytes.
fn unit_of(bytes: u64) -> (&'static str, u64) {
    match bytes {
        b if b >= GIB => ("GiB", GIB),
        b if b >= 1 << 20 => ("MiB", 1 << 20),
        _ => ("KiB", 1 << 10),
    }
}

/// A memory fraction with three decimals, or two significant digits
/// below 0.001 (a small model's KV cache on a large device).
fn fraction(f: f64) -> String {
    match f {
        f if f == 0.0 || f >= 1e-3 => format!("{f:.3}"),
        f => format!("{f:.1e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_the_unit_of_their_magnitude() {
        assert_eq!(unit_of(3 * GIB), ("GiB", GIB));
        assert_eq!(unit_of(GIB - 1), ("MiB", 1 << 20));
        assert_eq!(unit_of(320 << 10), ("KiB", 1 << 10));
        assert_eq!(fraction(0.9), "0.900");
        assert_eq!(fraction(2.2e-5), "2.2e-5");
        assert_eq!(fraction(0.0), "0.000");
    }

    fn phase(name: &str, parts: &[(Component, u64)]) -> PhaseMemory {
        PhaseMemory {
            name: name.into(),
            kind: PhaseKind::Training,
            components: parts.iter().copied().collect(),
            total_bytes: parts.iter().map(|(_, b)| b).sum(),
        }
    }

    /// `colo plan` says why no fraction fits: the phase too large alone, or
    /// what leaves the engine's weights no room.
    #[test]
    fn no_fitting_fraction_is_explained() {
        let mut r = MemoryReport {
            peak_bytes: 90 * GIB,
            peak_phase: "training".into(),
            margin_bytes: 9 * GIB,
            device_bytes: 80 * GIB,
            fits: false,
            mem_fraction: 0.5,
            max_mem_fraction: None,
            kv_cache_bytes: 30 * GIB,
            kv_tokens: 1,
            phases: vec![
                phase(
                    "rollout",
                    &[
                        (Component::RolloutWeights, 10 * GIB),
                        (Component::KvCache, 30 * GIB),
                        (Component::Optimizer, 75 * GIB),
                    ],
                ),
                phase("training", &[(Component::Activations, 90 * GIB)]),
            ],
        };
        let t = r.table();
        assert!(
            t.contains("no mem fraction fits: `training` needs 99.0 GiB without the KV cache, more than the 80.0 GiB of a device"),
            "{t}"
        );
        r.phases.pop();
        let t = r.table();
        assert!(
            t.contains("no mem fraction fits: `rollout` holds 75.0 GiB besides the engine, and of a device of 80.0 GiB that leaves no room for the engine's 10.0 GiB of weights"),
            "{t}"
        );
    }

    /// A 4.4 MiB peak on a 24 GiB device: the table in MiB, not zeros in
    /// GiB, and the margin in a unit of its own.
    #[test]
    fn a_small_run_on_a_large_device_is_tabled_in_mib() {
        let mut components = std::collections::BTreeMap::new();
        components.insert(Component::Activations, 4_600_000u64);
        let report = MemoryReport {
            peak_bytes: 4_600_000,
            peak_phase: "training".into(),
            margin_bytes: 460_000,
            device_bytes: 24 * GIB,
            fits: true,
            mem_fraction: 2.2e-5,
            max_mem_fraction: Some(1.0),
            kv_cache_bytes: 320 << 10,
            kv_tokens: 1280,
            phases: vec![PhaseMemory {
                name: "training".into(),
                kind: PhaseKind::Training,
                components,
                total_bytes: 4_600_000,
            }],
        };
        let t = report.table();
        assert!(
            t.contains("peak 4.4 MiB in `training` + margin 449.2 KiB (10% of the activations) of 24.0 GiB per device: fits")
                && t.contains("KV cache 320.0 KiB = 1280 tokens"),
            "{t}"
        );
        // The columns' unit is in the header.
        let header = t.lines().next().unwrap();
        assert!(header.starts_with("phase, MiB  "), "{t}");
        let row = t.lines().nth(1).unwrap();
        assert!(row.starts_with("training  ") && row.contains("4.4"), "{t}");
    }
}
