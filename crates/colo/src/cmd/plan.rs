//! `colo plan`: per-phase memory of a colocated RL step (default),
//! `colo plan map`: HybridFlow's auto device mapping,
//! `colo plan reshard`: a 3D-HybridEngine resharding plan.
//!
//! All arithmetic lives in `colo-plan`; this file turns flags into its
//! input types and prints its answers. `--config run.toml` (a `colo
//! train` run config) goes through `plan_config`, which predicts that
//! run's memory timeline.

use anyhow::{bail, Context, Result};
use clap::{Args as ClapArgs, Subcommand};
use colo_plan::config::{ModelSource, Offload, PlanInput, TrainLayout, WeightSync, GIB};
use colo_plan::cost::{Hardware, Role, Workload};
use colo_plan::lora::LoraInput;
use colo_plan::mapping::{auto_map, MappingProblem};
use colo_plan::memory::estimate;
use colo_plan::presets::preset;
use colo_plan::reshard::plan_reshard;

#[derive(ClapArgs)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    sub: Option<Sub>,
    #[command(flatten)]
    memory: MemoryArgs,
}

#[derive(Subcommand)]
enum Sub {
    /// HybridFlow auto device mapping: placements, device counts and layouts of actor, critic, reference and reward.
    Map(MapArgs),
    /// 3D-HybridEngine resharding from a training p-t-d to a generation pg-tg layout.
    Reshard(ReshardArgs),
}

/// The flags that describe a job, which a run config (`--config
/// run.toml`, `--builtin-run`) describes whole: refused beside one.
const JOB_FLAGS: [&str; 24] = [
    "param_dtype",
    "kv_dtype",
    "devices",
    "device_gib",
    "overhead_gib",
    "fsdp",
    "tp",
    "pp",
    "dp",
    "no_distributed_optimizer",
    "optimizer",
    "no_checkpointing",
    "tokens",
    "logprob_tokens",
    "gen_tp",
    "gen_pp",
    "mem_fraction",
    "kv_tokens",
    "mode",
    "offload",
    "weight_sync",
    "reference",
    "lora_rank",
    "lora_targets",
];

/// Flags of the per-phase memory estimate. The run's own (`--builtin-run`)
/// comes whole from colo's built-in job, so the flags that describe a job
/// are refused beside it rather than ignored.
#[derive(ClapArgs)]
#[command(group(clap::ArgGroup::new("job").multiple(true).args(JOB_FLAGS)))]
#[command(group(clap::ArgGroup::new("megatron").multiple(true).args(["tp", "pp", "dp"])))]
struct MemoryArgs {
    /// Model preset (see the error of an unknown one for the list).
    #[arg(long, default_value = "qwen2.5-7b", conflicts_with = "config")]
    preset: String,
    /// A Hugging Face config.json instead of a preset, or a `colo train`
    /// run config (*.toml): then everything else comes from the run
    /// config (device capacity, f32 on one device, colocation mode and
    /// offloads, KV budget, micro-batches, sequence length from the data)
    /// and the plan predicts the run's peak device bytes.
    #[arg(long)]
    config: Option<String>,
    /// Plan the built-in `colo train` run (what `colo train` runs without
    /// a config).
    #[arg(long, conflicts_with_all = ["config", "preset", "job"])]
    builtin_run: bool,
    /// Weights' dtype.
    #[arg(long, default_value = "bf16")]
    param_dtype: String,
    /// KV-cache dtype.
    #[arg(long, default_value = "bf16")]
    kv_dtype: String,
    /// Devices in the job.
    #[arg(long, default_value_t = 8)]
    devices: u64,
    /// Memory per device, GiB.
    #[arg(long, default_value_t = 80.0)]
    device_gib: f64,
    /// Always-resident runtime (CUDA context, NCCL, CUDA graphs), GiB.
    #[arg(long, default_value_t = 6.0)]
    overhead_gib: f64,
    /// Training: FSDP shard count (default: all devices, unless --tp/--pp/--dp).
    #[arg(long, conflicts_with_all = ["tp", "pp"])]
    fsdp: Option<u64>,
    /// Training tensor parallel (Megatron layout).
    #[arg(long)]
    tp: Option<u64>,
    /// Training pipeline parallel (Megatron layout).
    #[arg(long)]
    pp: Option<u64>,
    /// Training data parallel (Megatron layout; default fills the devices).
    #[arg(long)]
    dp: Option<u64>,
    /// Megatron without the distributed optimizer (optimizer states not
    /// sharded over dp); needs the Megatron layout (--tp, --pp or --dp).
    #[arg(long, requires = "megatron")]
    no_distributed_optimizer: bool,
    /// adamw-mixed (2+2+12 bytes/param), adamw-mixed-fp32-grads (2+4+12) or adamw-fp32 (4+4+8).
    #[arg(long, default_value = "adamw-mixed")]
    optimizer: String,
    /// Turn activation checkpointing off.
    #[arg(long)]
    no_checkpointing: bool,
    /// Tokens per training micro-batch per data-parallel rank.
    #[arg(long, default_value_t = 8192)]
    tokens: u64,
    /// Tokens per log-prob micro-batch (default: --tokens).
    #[arg(long)]
    logprob_tokens: Option<u64>,
    /// Generation tensor parallel.
    #[arg(long, default_value_t = 1)]
    gen_tp: u64,
    /// Generation pipeline parallel.
    #[arg(long, default_value_t = 1)]
    gen_pp: u64,
    /// Engine memory fraction (SGLang mem_fraction_static), in (0, 1]; default 0.9.
    #[arg(long, conflicts_with = "kv_tokens")]
    mem_fraction: Option<f64>,
    /// Explicit KV-cache budget, tokens per generation replica.
    #[arg(long)]
    kv_tokens: Option<u64>,
    /// Colocation mode: naive, sleep or staged.
    #[arg(long, default_value = "staged")]
    mode: String,
    /// What is offloaded to the host while the engine runs: a comma list of
    /// param, grad, optimizer, ref; or none.
    #[arg(long, default_value = "param,grad,optimizer,ref")]
    offload: String,
    /// Weight sync: full (trainer materialises the whole model), in-place
    /// (gather straight into the engine), gather (FSDP's units one by one
    /// through a buffer), or a bucket size in MiB.
    #[arg(long, default_value = "full")]
    weight_sync: String,
    /// A reference model is colocated (for a KL term).
    #[arg(long)]
    reference: bool,
    /// The trainer trains LoRA adapters of this rank on frozen weights:
    /// gradients and optimizer state for the adapters only, the reference
    /// (with --reference) is the trainer's weights with the adapters off.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    lora_rank: Option<u64>,
    /// The projections that get adapters: all-linear, or a comma list of
    /// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
    #[arg(long, default_value = "all-linear", requires = "lora_rank")]
    lora_targets: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(ClapArgs)]
struct MapArgs {
    /// Preset of every model (override per role below).
    #[arg(long, default_value = "qwen2.5-7b")]
    preset: String,
    #[arg(long)]
    critic: Option<String>,
    #[arg(long)]
    reward: Option<String>,
    /// Models in the dataflow: a comma list of actor, critic, reference, reward.
    #[arg(long, default_value = "actor,critic,reference,reward")]
    roles: String,
    #[arg(long, default_value_t = 8)]
    devices: u64,
    /// h100 or h200.
    #[arg(long, default_value = "h100")]
    gpu: String,
    /// Override the device memory, GiB.
    #[arg(long)]
    device_gib: Option<f64>,
    #[arg(long, default_value_t = 1024)]
    prompts: u64,
    #[arg(long, default_value_t = 1)]
    samples: u64,
    #[arg(long, default_value_t = 1024)]
    prompt_len: u64,
    #[arg(long, default_value_t = 1024)]
    response_len: u64,
    /// How many mappings to print.
    #[arg(long, default_value_t = 5, value_parser = super::bench::count::<1, 1000>)]
    top: usize,
    #[arg(long)]
    json: bool,
}

/// `colo plan reshard`: HybridFlow's `p-t-d → pg-tg` plan, or with
/// `--sharding full` (or a sharded run config) colo's executed reshard
/// against the 3D-HybridEngine's.
#[derive(ClapArgs)]
struct ReshardArgs {
    /// Devices (default: p × t × d of --train).
    #[arg(long, conflicts_with = "config")]
    devices: Option<u64>,
    /// Training layout p-t-d, e.g. 1-4-2; with --sharding full, 1-1-N.
    #[arg(long, required_unless_present = "config", conflicts_with = "config")]
    train: Option<String>,
    /// Generation layout pg-tg, e.g. 1-2.
    #[arg(long, required_unless_present = "config", conflicts_with = "config")]
    gen: Option<String>,
    /// `full`: training sharded FSDP-style over the N workers of a 1-1-N
    /// layout (`[cluster] sharding = "full"`), as colo executes it: the
    /// bytes each worker sends and receives per switch, colo's against
    /// the 3D-HybridEngine's zero-redundancy reshard.
    #[arg(long, default_value = "none", value_parser = ["none", "full"], conflicts_with = "config")]
    sharding: String,
    /// Model preset, for the bytes moved.
    #[arg(long, default_value = "qwen2.5-7b", conflicts_with = "config")]
    preset: String,
    /// The weights' dtype (bf16, fp16, fp32).
    #[arg(long, default_value = "bf16", conflicts_with = "config")]
    param_dtype: String,
    /// A sharded `colo train` run config (*.toml): its model, dtype,
    /// `[cluster] workers` and `[rollout] tensor_model_parallel_size`.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    #[arg(long)]
    json: bool,
}

/// `matches`: clap's parse of `colo plan`, to tell the flags given from
/// their defaults.
pub fn run(args: Args, matches: Option<&clap::ArgMatches>) -> Result<()> {
    match args.sub {
        None => memory(args.memory, matches),
        Some(Sub::Map(a)) => map(a),
        Some(Sub::Reshard(a)) => reshard(a),
    }
}

fn parse_offload(s: &str) -> Result<Offload> {
    let mut o = Offload {
        train_param: false,
        train_grad: false,
        optimizer: false,
        ref_param: false,
    };
    let items: Vec<&str> = s.split(',').map(str::trim).collect();
    if items.iter().any(|x| x.is_empty()) || (items.contains(&"none") && items.len() > 1) {
        bail!("--offload {s:?}: a comma list of param, grad, optimizer, ref, or `none` alone");
    }
    for &item in items.iter().filter(|&&x| x != "none") {
        match item {
            "param" => o.train_param = true,
            "grad" => o.train_grad = true,
            "optimizer" => o.optimizer = true,
            "ref" => o.ref_param = true,
            other => {
                bail!("unknown --offload item `{other}`; valid: param, grad, optimizer, ref, none")
            }
        }
    }
    Ok(o)
}

fn parse_sync(s: &str) -> Result<WeightSync> {
    Ok(match s {
        "full" => WeightSync::Full,
        "in-place" | "inplace" => WeightSync::InPlace,
        "gather" => WeightSync::Gather,
        mib => {
            let mib: f64 = mib.parse().with_context(|| {
                format!(
                    "--weight-sync `{mib}`: valid are full, in-place, gather, or a bucket size in MiB"
                )
            })?;
            WeightSync::Bucket((mib * (1u64 << 20) as f64) as u64)
        }
    })
}

/// Whether `--config` names a `colo train` run config (else a Hugging
/// Face config.json).
fn is_run_config(path: &str) -> bool {
    path.to_ascii_lowercase().ends_with(".toml")
}

/// `colo plan --config run.toml` / `--builtin-run`.
fn run_config(a: &MemoryArgs) -> Result<Option<super::plan_config::RunPlan>> {
    use super::plan_config;
    if a.builtin_run {
        return Ok(Some(plan_config::from_config(&colo_rl::Config::builtin())?));
    }
    match &a.config {
        Some(path) if is_run_config(path) => {
            let path = std::path::Path::new(path);
            if !path.is_file() {
                bail!("--config `{}`: no such run config file", path.display());
            }
            Ok(Some(plan_config::from_file(path)?))
        }
        _ => Ok(None),
    }
}

/// The job flags given on the command line (not defaulted), as typed.
fn job_flags_given(matches: Option<&clap::ArgMatches>) -> Vec<String> {
    let Some(m) = matches else {
        return Vec::new();
    };
    JOB_FLAGS
        .iter()
        .filter(|id| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| format!("--{}", id.replace('_', "-")))
        .collect()
}

fn memory(a: MemoryArgs, matches: Option<&clap::ArgMatches>) -> Result<()> {
    // `--builtin-run` conflicts with the job flags in clap; `--config`
    // cannot, as it also takes a config.json, beside which they apply.
    if let Some(path) = a.config.as_deref().filter(|p| is_run_config(p)) {
        let given = job_flags_given(matches);
        if !given.is_empty() {
            bail!(
                "--config `{path}` is a `colo train` run config, which describes the whole job; \
                 {} would be ignored (change the run config instead, or give a Hugging Face \
                 config.json to plan with flags)",
                given.join(", ")
            );
        }
    }
    if let Some(run) = run_config(&a)? {
        return print_run_plan(&run, a.json);
    }
    let input = PlanInput {
        model: match a.config {
            Some(path) => ModelSource::ConfigPath(path),
            None => ModelSource::Preset(a.preset),
        },
        param_dtype: a.param_dtype,
        kv_dtype: a.kv_dtype,
        devices: a.devices,
        device_memory_gib: a.device_gib,
        runtime_overhead_gib: a.overhead_gib,
        fsdp: a.fsdp,
        pp: a.pp,
        tp: a.tp,
        dp: a.dp,
        distributed_optimizer: !a.no_distributed_optimizer,
        optimizer: a.optimizer,
        activation_checkpointing: !a.no_checkpointing,
        tokens_per_micro_batch: a.tokens,
        logprob_tokens_per_micro_batch: a.logprob_tokens,
        gen_pp: a.gen_pp,
        gen_tp: a.gen_tp,
        mem_fraction: a.mem_fraction,
        kv_tokens: a.kv_tokens,
        mode: a.mode,
        offload: parse_offload(&a.offload)?,
        weight_sync: parse_sync(&a.weight_sync)?,
        reference: a.reference,
        lora: a.lora_rank.map(|rank| LoraInput {
            rank,
            target_modules: a
                .lora_targets
                .split(',')
                .map(|t| t.trim().to_owned())
                .collect(),
        }),
        ..PlanInput::default()
    };
    let plan = input.validate()?;
    let report = estimate(&plan)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let m = &plan.model;
        let lora = match &plan.lora {
            Some(l) => format!(
                " (LoRA rank {}: {:.2}M trained)",
                l.rank,
                m.lora_params(l) as f64 / 1e6
            ),
            None => String::new(),
        };
        println!(
            "{}: {:.2}B params{lora}, {:.2} GiB weights, {} KV bytes/token; {} devices × {:.0} GiB; train {}; gen pp{}-tp{}; mode {}\n",
            m.name,
            m.params() as f64 / 1e9,
            m.weight_bytes(plan.param_dtype) as f64 / GIB as f64,
            m.kv_bytes_per_token(plan.kv_dtype),
            plan.devices,
            plan.device_bytes as f64 / GIB as f64,
            match plan.train {
                TrainLayout::Fsdp { shards } => format!("fsdp over {shards}"),
                TrainLayout::Megatron { p, t, d, .. } => format!("p-t-d {p}-{t}-{d}"),
            },
            plan.gen_pp,
            plan.gen_tp,
            format!("{:?}", plan.mode).to_lowercase()
        );
        print!("{}", report.table());
    }
    Ok(())
}

/// A `colo train` run config's plan: JSON, or its header line and table.
fn print_run_plan(run: &super::plan_config::RunPlan, json: bool) -> Result<()> {
    let plan = run.input.validate()?;
    let report = estimate(&plan)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let m = &plan.model;
    println!(
        "colo train run, {}: {:.2}M params ({}), capacity {}, mode {}, longest prompt {} tokens, {} KV tokens\n",
        run.scope(),
        m.params() as f64 / 1e6,
        run.input.param_dtype,
        colo_mem::fmt_bytes(run.capacity),
        run.input.mode,
        run.max_prompt_tokens,
        report.kv_tokens,
    );
    print!("{}", report.table());
    Ok(())
}

fn map(a: MapArgs) -> Result<()> {
    let mut hardware = match a.gpu.to_ascii_lowercase().as_str() {
        "h100" => Hardware::h100(),
        "h200" => Hardware::h200(),
        other => bail!("unknown --gpu `{other}`; valid: h100, h200"),
    };
    if let Some(g) = a.device_gib {
        if g.is_nan() || g <= 0.0 {
            bail!("--device-gib must be > 0, got {g}");
        }
        hardware.device_bytes = (g * GIB as f64) as u64;
    }
    let mut models = Vec::new();
    for name in a.roles.split(',').map(str::trim) {
        let role = match name {
            "actor" => Role::Actor,
            "critic" => Role::Critic,
            "reference" | "ref" => Role::Reference,
            "reward" => Role::Reward,
            other => bail!("unknown role `{other}`; valid: actor, critic, reference, reward"),
        };
        let p = match role {
            Role::Critic => a.critic.as_deref().unwrap_or(&a.preset),
            Role::Reward => a.reward.as_deref().unwrap_or(&a.preset),
            _ => &a.preset,
        };
        models.push((role, preset(p)?));
    }
    let pb = MappingProblem {
        models,
        devices: a.devices,
        hardware,
        workload: Workload {
            prompts: a.prompts,
            samples_per_prompt: a.samples,
            prompt_len: a.prompt_len,
            response_len: a.response_len,
            ..Workload::default()
        },
        top: a.top,
    };
    let maps = auto_map(&pb)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&maps)?);
        return Ok(());
    }
    print!("{}", map_table(&maps));
    Ok(())
}

/// `colo plan map`'s table: a row per mapping, each time with its unit.
fn map_table(maps: &[colo_plan::mapping::Mapping]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4}  {:>8}  {:>7} {:>7} {:>7} {:>7}  placement / layouts (peak per device)",
        "rank", "iter s", "gen s", "trans s", "prep s", "train s"
    );
    for (i, m) in maps.iter().enumerate() {
        let sets: Vec<String> = m
            .allocation
            .iter()
            .zip(&m.set_peak_bytes)
            .enumerate()
            .map(|(s, (n, peak))| {
                let layouts: Vec<String> = m
                    .models
                    .iter()
                    .filter(|x| x.set == s)
                    .map(|x| {
                        let l = x.layout;
                        let gen = l
                            .gen
                            .map(|(pg, tg)| format!(" gen {pg}-{tg}"))
                            .unwrap_or_default();
                        format!("{} {}-{}-{}{gen}", x.role.name(), l.p, l.t, l.d)
                    })
                    .collect();
                format!(
                    "[{}] on {n} ({:.1} GiB)",
                    layouts.join(", "),
                    *peak as f64 / GIB as f64
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "{:>4}  {:>8.2}  {:>7.2} {:>7.2} {:>7.2} {:>7.2}  {}",
            i + 1,
            m.iteration_s,
            m.generation_s,
            m.transition_s,
            m.prepare_s,
            m.train_s,
            sets.join("  ")
        );
        if let Some(layout) = m.colo_layout() {
            let _ = writeln!(
                out,
                "{:>49}colo train runs it: [cluster] layout = \"{layout}\"",
                ""
            );
        }
    }
    let _ = writeln!(
        out,
        "(colo train executes data-parallel layouts with every role colocated, 1-1-N, replicated \
         or with [cluster] sharding = \"full\" (FSDP), and a rollout split over \
         [rollout] tensor_model_parallel_size workers; the others are plans: tensor/pipeline \
         parallelism in training and split placements are not executed)"
    );
    out
}

fn parse_dims<const N: usize>(s: &str, what: &str) -> Result<[u64; N]> {
    let parts: Vec<u64> = s
        .split('-')
        .map(|x| x.trim().parse::<u64>())
        .collect::<std::result::Result<_, _>>()
        .with_context(|| format!("{what} `{s}`: expected {N} numbers joined by '-'"))?;
    parts
        .try_into()
        .map_err(|_| anyhow::anyhow!("{what} `{s}`: expected {N} numbers joined by '-'"))
}

fn reshard(a: ReshardArgs) -> Result<()> {
    if let Some(path) = &a.config {
        return fsdp_reshard_of_run(path, a.json);
    }
    let (train, gen) = (a.train.as_deref(), a.gen.as_deref());
    let [p, t, d] = parse_dims::<3>(train.unwrap_or_default(), "--train p-t-d")?;
    let [pg, tg] = parse_dims::<2>(gen.unwrap_or_default(), "--gen pg-tg")?;
    let m = preset(&a.preset)?;
    let dtype = colo_plan::model::DType::parse(&a.param_dtype)?;
    let devices = a.devices.unwrap_or(p.saturating_mul(t).saturating_mul(d));
    if a.sharding == "full" {
        if (p, t, pg) != (1, 1, 1) || devices != d {
            bail!(
                "--sharding full: --train {}-{}-{} --gen {}-{} on {} devices; expected --train \
                 1-1-N (FSDP over N workers, no model parallelism in training) and --gen 1-tg \
                 (colo's rollout has no pipeline), N the device count",
                p,
                t,
                d,
                pg,
                tg,
                devices
            );
        }
        let plan = colo_plan::reshard::plan_fsdp_reshard(&m, dtype, d, tg)?;
        return print_fsdp_reshard(&plan, a.json);
    }
    let plan = plan_reshard(devices, (p, t, d), (pg, tg), m.weight_bytes(dtype)).map_err(|e| {
        let colos = (p, t, pg) == (1, 1, 1) && tg > 1 && d % tg == 0;
        match colos {
            true => anyhow::anyhow!(
                "{e}; colo trains 1-1-{d} sharded (FSDP) with a tensor-parallel rollout: add \
                 --sharding full"
            ),
            false => e.into(),
        }
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        println!("model {} ({} weights)", m.name, a.param_dtype);
        print!("{}", plan.describe());
    }
    Ok(())
}

/// `colo plan reshard --config run.toml`: the sharded run's reshard.
fn fsdp_reshard_of_run(path: &std::path::Path, json: bool) -> Result<()> {
    if !path.is_file() {
        bail!("--config `{}`: no such run config file", path.display());
    }
    if !is_run_config(&path.to_string_lossy()) {
        bail!(
            "--config `{}`: expected a colo train run config (*.toml); for a model's config.json \
             use --train, --gen and --preset",
            path.display()
        );
    }
    let run = super::plan_config::from_file(path)?;
    if !run.sharded {
        bail!(
            "--config `{}`: {}: every worker holds the whole model and a switch moves no weights \
             between workers; the reshard is a sharded run's ([cluster] sharding = \"full\"; \
             on one worker it moves nothing)",
            path.display(),
            run.scope()
        );
    }
    let plan = run.input.validate()?;
    let reshard = colo_plan::reshard::plan_fsdp_reshard(
        &plan.model,
        plan.param_dtype,
        run.workers as u64,
        plan.gen_tp,
    )?;
    print_fsdp_reshard(&reshard, json)
}

fn print_fsdp_reshard(plan: &colo_plan::reshard::FsdpReshard, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(plan)?);
    } else {
        println!("model {}", plan.model);
        print!("{}", plan.describe());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in run's plan is the built-in job's: a flag describing
    /// another job is refused beside it, not ignored.
    #[test]
    fn builtin_run_refuses_job_flags() {
        let parse = matches;
        let e = parse(&["plan", "--builtin-run", "--devices", "4"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
        assert!(parse(&["plan", "--builtin-run", "--json"]).is_ok());
        assert!(parse(&["plan", "--devices", "4"]).is_ok());
    }

    fn matches(argv: &[&str]) -> clap::error::Result<clap::ArgMatches> {
        <Args as clap::Args>::augment_args(clap::Command::new("plan")).try_get_matches_from(argv)
    }

    fn plan(argv: &[&str]) -> String {
        let m = matches(argv).unwrap();
        let args = <Args as clap::FromArgMatches>::from_arg_matches(&m).unwrap();
        run(args, Some(&m)).unwrap_err().to_string()
    }

    /// A run config describes the whole job: the flags that describe one
    /// are refused beside it, naming them, before the file is read; beside
    /// a config.json they apply.
    #[test]
    fn a_run_config_refuses_job_flags() {
        let e = plan(&[
            "plan",
            "--config",
            "/nonexistent/run.toml",
            "--devices",
            "4",
            "--reference",
        ]);
        assert!(
            e.contains("run config") && e.contains("--devices, --reference would be ignored"),
            "{e}"
        );
        let e = plan(&["plan", "--config", "/nonexistent/run.toml", "--json"]);
        assert!(e.contains("no such run config file"), "{e}");
        let e = plan(&[
            "plan",
            "--config",
            "/nonexistent/config.json",
            "--devices",
            "4",
        ]);
        assert!(!e.contains("would be ignored"), "{e}");
    }

    /// The distributed optimizer is Megatron's: turning it off without the
    /// Megatron layout is refused, not ignored.
    #[test]
    fn no_distributed_optimizer_needs_megatron() {
        let e = matches(&["plan", "--no-distributed-optimizer"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert!(e.to_string().contains("--tp"), "{e}");
        assert!(matches(&["plan", "--no-distributed-optimizer", "--pp", "2"]).is_ok());
    }

    /// Every column of `colo plan map` names its unit.
    #[test]
    fn map_columns_carry_units() {
        let pb = MappingProblem {
            models: vec![
                (Role::Actor, preset("qwen2.5-7b").unwrap()),
                (Role::Reference, preset("qwen2.5-7b").unwrap()),
            ],
            devices: 8,
            hardware: Hardware::h100(),
            workload: Workload::default(),
            top: 2,
        };
        let t = map_table(&auto_map(&pb).unwrap());
        let header = t.lines().next().unwrap();
        for column in [
            "iter s",
            "gen s",
            "trans s",
            "prep s",
            "train s",
            "(peak per device)",
        ] {
            assert!(header.contains(column), "{column}: {t}");
        }
        let row = t.lines().nth(1).unwrap();
        assert!(
            row.trim_start().starts_with("1 ") && row.contains(" GiB)"),
            "{t}"
        );
    }

    /// `--sharding full` is colo's FSDP layout, 1-1-N with a 1-tg
    /// rollout: a model-parallel training layout is refused, naming the
    /// one expected; a run config describes the whole layout, so the
    /// layout flags are refused beside it.
    #[test]
    fn a_sharded_reshard_takes_colos_layout() {
        for (train, gen) in [("1-2-1", "1-1"), ("1-1-2", "2-1")] {
            let e = plan(&[
                "plan",
                "reshard",
                "--sharding",
                "full",
                "--train",
                train,
                "--gen",
                gen,
            ]);
            assert!(e.contains("expected --train 1-1-N"), "{train} {gen}: {e}");
        }
        let e = plan(&[
            "plan",
            "reshard",
            "--sharding",
            "full",
            "--train",
            "1-1-4",
            "--gen",
            "1-2",
            "--devices",
            "8",
        ]);
        assert!(e.contains("on 8 devices"), "{e}");
        let e = matches(&[
            "plan", "reshard", "--config", "run.toml", "--train", "1-1-2",
        ]);
        assert_eq!(
            e.unwrap_err().kind(),
            clap::error::ErrorKind::ArgumentConflict
        );
        let e = plan(&["plan", "reshard", "--config", "/nonexistent/run.toml"]);
        assert!(e.contains("no such run config file"), "{e}");
        assert!(matches(&["plan", "reshard", "--train", "1-1-2"]).is_err());
        // HybridFlow's plan refuses tg > t; the message points at colo's.
        let e = plan(&["plan", "reshard", "--train", "1-1-2", "--gen", "1-2"]);
        assert!(
            e.contains("tg must divide t = 1") && e.ends_with("add --sharding full"),
            "{e}"
        );
    }

    #[test]
    fn offload_lists_are_items_or_none_alone() {
        let o = parse_offload("param, optimizer").unwrap();
        assert!(o.train_param && o.optimizer && !o.train_grad && !o.ref_param);
        let none = parse_offload("none").unwrap();
        assert!(!(none.train_param || none.train_grad || none.optimizer || none.ref_param));
        for bad in ["", "param,", "param,none", "params"] {
            let e = parse_offload(bad).unwrap_err().to_string();
            assert!(
                e.starts_with("--offload") || e.starts_with("unknown --offload item"),
                "{bad:?}: {e}"
            );
        }
    }
}
