//! `colo gpu-check`'s check of the rollout engine's CUDA graphs
//! (colo-rollout's `graphs`): a real checkpoint generates the same greedy
//! tokens replaying captured decode steps as running them eagerly, with
//! padded rows and a key bucket crossed mid-generation; and after the KV
//! cache is released (the graphs' memory with it, as the driver and the
//! pool report) and resumed, the same graphs replay to the same tokens.

#[cfg(feature = "cuda")]
pub use imp::check;

#[cfg(not(feature = "cuda"))]
pub fn check(_fixture: &std::path::Path) -> anyhow::Result<String> {
    anyhow::bail!("this colo was built without the `cuda` feature (cargo build --features cuda)")
}

#[cfg(feature = "cuda")]
mod imp {
    use std::path::Path;
    use std::sync::Arc;

    use anyhow::{ensure, Result};
    use colo_mem::tags::{CUDA_GRAPH, KV_CACHE};
    use colo_mem::Pool;
    use colo_rollout::{Engine, EngineConfig, Request, SamplingParams};
    use tch::Kind;

    /// Greedy completions of `engine` for the check's prompts: tokens and
    /// log-probabilities per prompt.
    fn generate(engine: &mut Engine) -> Result<Vec<(Vec<u32>, Vec<f32>)>> {
        // Five prompts (the graph pads them to eight rows) of 9 to 41 tokens,
        // 40 new tokens each: the longest crosses from the 64-key bucket to
        // the 128-key one.
        let params = SamplingParams {
            max_new_tokens: 40,
            temperature: 0.0,
            ..SamplingParams::default()
        };
        let reqs = (0..5u32)
            .map(|i| {
                let prompt = (0..9 + 8 * i).map(|j| 1 + (i * 31 + j * 7) % 90).collect();
                Request::new(prompt, params.clone())
            })
            .collect();
        let mut out = Vec::new();
        for r in engine.generate(reqs)? {
            let c = r?.completions.remove(0);
            out.push((c.tokens, c.logprobs));
        }
        Ok(out)
    }

    pub fn check(fixture: &Path) -> Result<String> {
        let (pool, device) = crate::cmd::bench::pool_on(colo_rl::config::Device::Cuda)?;
        let engine = |pool: &Arc<Pool>, eager: bool| -> Result<Engine> {
            let cfg = EngineConfig {
                enforce_eager: eager,
                ..EngineConfig::with_kv_tokens(8 * 128)
            };
            Ok(Engine::from_dir_on(
                fixture,
                Kind::Float,
                device,
                pool.clone(),
                &cfg,
            )?)
        };
        let eager = generate(&mut engine(&pool, true)?)?;
        let mut graphed = engine(&pool, false)?;
        let replayed = generate(&mut graphed)?;
        let graphs = graphed.cuda_graphs();
        ensure!(
            graphs >= 2,
            "expected two or more graphs, {graphs} captured"
        );
        let max_diff = |a: &[(Vec<u32>, Vec<f32>)], b: &[(Vec<u32>, Vec<f32>)]| {
            a.iter()
                .zip(b)
                .flat_map(|(x, y)| x.1.iter().zip(&y.1).map(|(p, q)| (p - q).abs()))
                .fold(0f32, f32::max)
        };
        let same = |a: &[(Vec<u32>, Vec<f32>)], b: &[(Vec<u32>, Vec<f32>)]| {
            a.iter().zip(b).all(|(x, y)| x.0 == y.0)
        };
        let diff = max_diff(&eager, &replayed);
        ensure!(
            same(&eager, &replayed) && diff < 1e-4,
            "graph replay differs from eager decode (max log-prob difference {diff:e})"
        );

        tch::Cuda::synchronize(0);
        let held = pool.stats().tag(CUDA_GRAPH).map_or(0, |t| t.resident_bytes);
        let free0 = colo_mem::cuda::mem_get_info()?.0;
        graphed.release(&[KV_CACHE])?;
        let free1 = colo_mem::cuda::mem_get_info()?.0;
        let paused = pool.stats().tag(CUDA_GRAPH).map_or(0, |t| t.resident_bytes);
        ensure!(
            held > 0 && paused == 0,
            "tag {CUDA_GRAPH}: {held} bytes resident before the release, {paused} after"
        );
        graphed.resume(&[KV_CACHE])?;
        let again = generate(&mut graphed)?;
        ensure!(
            graphed.cuda_graphs() == graphs,
            "graphs were captured again after the resume"
        );
        ensure!(
            same(&replayed, &again),
            "after release and resume the graphs replay to other tokens (max log-prob difference {:e})",
            max_diff(&replayed, &again)
        );
        Ok(format!(
            "{graphs} graphs: greedy tokens equal to eager (log-probs within {diff:.1e}); \
             release(kv_cache) paused their {} (driver free +{}), resume replayed the same tokens",
            colo_mem::fmt_bytes(held),
            colo_mem::fmt_bytes(free1.saturating_sub(free0)),
        ))
    }
}
