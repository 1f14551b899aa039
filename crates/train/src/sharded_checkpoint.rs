//! A sharded trainer's checkpoints (see [`crate::sharding`]): written as
//! an unsharded trainer writes them — the whole model and the whole
//! optimizer state, gathered a unit at a time onto the first peer's host —
//! and read back by slicing each peer's elements out, so a checkpoint
//! resumes on any number of peers, sharded or not.

use tch::{Kind, Tensor};

use crate::sharding::flatten;
use crate::trainer::ColoTrainer;
use crate::{Error, Result};

impl ColoTrainer {
    /// The model's weights gathered a unit at a time and copied to the
    /// first peer's host (the others get none): what a checkpoint writes.
    /// Every peer must call it.
    pub(crate) fn gathered_host_weights(&self) -> Result<Vec<(String, Tensor)>> {
        let keep = self.writes_checkpoints();
        let mut out = Vec::new();
        self.visit_units(&mut |named| {
            if keep {
                for (name, t) in named {
                    // Its own memory: the gathered buffer goes after the call.
                    let host = match t.device() {
                        tch::Device::Cpu => t.f_contiguous()?.f_detach_copy()?,
                        _ => t.f_to_device(tch::Device::Cpu)?,
                    };
                    out.push((name.clone(), host));
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The optimizer's float32 tensors under their checkpoint names
    /// (moments, then masters), gathered from the peers a unit at a time:
    /// what an unsharded trainer's checkpoint holds (FSDP's full state
    /// dict, on the first peer only, on the host). Every peer must call
    /// it; the others get nothing.
    pub(crate) fn gathered_optimizer_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let sh = self.shards.as_ref().expect("sharded");
        let mut out = Vec::new();
        let mut masters = Vec::new();
        for (u, unit) in sh.units.iter().enumerate() {
            let m = &self.opt.moments[u];
            let mut kinds = vec![("exp_avg", &m.exp_avg), ("exp_avg_sq", &m.exp_avg_sq)];
            kinds.extend(m.master.as_ref().map(|t| ("master", t)));
            for (what, shard) in kinds {
                let full = Tensor::f_empty([unit.padded], (Kind::Float, self.device))?;
                crate::sharding::lock(&sh.peers)?.all_gather(shard, &full)?;
                // Only the writer keeps the unit's state, on the host: the
                // device holds one unit's at a time.
                if !self.writes_checkpoints() {
                    continue;
                }
                let full = full.f_to_device(tch::Device::Cpu)?;
                for ((&i, &at), shape) in unit.params.iter().zip(&unit.offsets).zip(&unit.shapes) {
                    let n = shape.iter().product::<i64>();
                    let t = full.f_narrow(0, at, n)?.f_reshape(shape.as_slice())?;
                    let name = &self.names[i];
                    match what {
                        "master" => masters.push((format!("{name}.master"), t)),
                        _ => out.push((format!("{name}.{what}"), t)),
                    }
                }
            }
        }
        out.extend(masters);
        Ok(out)
    }
}

impl ColoTrainer {
    /// A sharded trainer's [`ColoTrainer::load`]: the checkpoint is an
    /// unsharded one (what every trainer writes), each peer keeps its
    /// elements of every unit, so it loads into any number of peers.
    pub(crate) fn sharded_load(&mut self, dir: &std::path::Path) -> Result<()> {
        use crate::checkpoint::{read_named, read_state, take_matching, MASTER_SUFFIX};
        use crate::checkpoint::{OPTIMIZER_FILE, VALUE_HEAD_FILE};
        let sh = self.shards.clone().expect("sharded");
        let state = read_state(dir)?;
        let mut tensors = read_named(&dir.join(colo_model::weights::WEIGHTS_FILE))?;
        if self.value_head.is_some() {
            tensors.extend(read_named(&dir.join(VALUE_HEAD_FILE))?);
        }
        // Shapes to match, without memory: a zero broadcast to each shape.
        let zero = Tensor::f_zeros([1], (Kind::Float, tch::Device::Cpu))?;
        let like = |suffix: &str| -> Result<Vec<(String, Tensor)>> {
            let mut out: Vec<(String, Tensor)> = Vec::with_capacity(self.names.len());
            let mut shapes = vec![Vec::new(); self.names.len()];
            for u in sh.units.iter() {
                for (&i, shape) in u.params.iter().zip(&u.shapes) {
                    shapes[i] = shape.clone();
                }
            }
            for (name, shape) in self.names.iter().zip(&shapes) {
                out.push((
                    format!("{name}{suffix}"),
                    zero.f_expand(shape.as_slice(), false)?,
                ));
            }
            Ok(out)
        };
        let params = take_matching(&mut tensors, &like("")?, dir, false)?;
        let opt_path = dir.join(OPTIMIZER_FILE);
        let mut moments = read_named(&opt_path)?;
        let masters = match self.kind == Kind::Float {
            true => self.names.iter().map(|_| None).collect(),
            false => take_matching(&mut moments, &like(MASTER_SUFFIX)?, &opt_path, true)?,
        };
        let avg = take_matching(&mut moments, &like(".exp_avg")?, &opt_path, true)?;
        let avg_sq = take_matching(&mut moments, &like(".exp_avg_sq")?, &opt_path, false)?;
        let get = |v: &[Option<Tensor>], i: usize| v[i].as_ref().map(Tensor::shallow_clone);
        let _no_grad = tch::no_grad_guard();
        for (u, unit) in sh.units.iter().enumerate() {
            let n = unit.shard_len(sh.world);
            let mine = |src: &dyn Fn(usize) -> Option<Tensor>, kind: Kind| -> Result<Tensor> {
                let parts: Vec<Tensor> = unit
                    .params
                    .iter()
                    .map(|&i| src(i).ok_or_else(|| missing(&opt_path, &self.names[i])))
                    .collect::<Result<_>>()?;
                Ok(flatten(&parts, unit.padded, kind)?.f_narrow(0, sh.rank as i64 * n, n)?)
            };
            let p = |i: usize| get(&params, i);
            sh.params[u]
                .shallow_clone()
                .f_copy_(&mine(&p, self.kind)?)?;
            let m = &self.opt.moments[u];
            m.exp_avg
                .shallow_clone()
                .f_copy_(&mine(&|i| get(&avg, i), Kind::Float)?)?;
            m.exp_avg_sq
                .shallow_clone()
                .f_copy_(&mine(&|i| get(&avg_sq, i), Kind::Float)?)?;
            if let Some(master) = &m.master {
                // A checkpoint without masters gives them from the weights.
                let src = |i: usize| get(&masters, i).or_else(|| get(&params, i));
                master.shallow_clone().f_copy_(&mine(&src, Kind::Float)?)?;
            }
        }
        self.opt.t = state.optimizer_steps;
        Ok(())
    }
}

/// The error for a tensor a checkpoint lacks.
fn missing(path: &std::path::Path, name: &str) -> Error {
    Error::CheckpointMissing {
        path: path.to_owned(),
        name: name.to_owned(),
    }
}
