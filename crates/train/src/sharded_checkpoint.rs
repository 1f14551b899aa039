//! A sharded trainer's checkpoints (see [`crate::sharding`]): written as
//! an unsharded trainer writes them — the whole model and the whole
//! optimizer state, gathered a unit at a time onto the first peer's host —
//! and read back by slicing each peer's elements out, so a checkpoint
//! resumes on any number of peers, sharded or not.

use tch::{Kind, Tensor};

use crate::checkpoint::staged_shard;
use crate::optimizer_shards::ShardLayout;
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

    /// Writes this peer's optimizer shard (its flat shard of every unit's
    /// moments and masters, see [`crate::optimizer_shards`]) where the
    /// checkpoint `dir`'s writer moves it in from; the units' layout.
    pub(crate) fn stage_optimizer_shard(&self, dir: &std::path::Path) -> Result<ShardLayout> {
        let sh = self.shards.as_ref().expect("sharded");
        let mut tensors = Vec::new();
        for (u, m) in self.opt.moments.iter().enumerate() {
            tensors.push((format!("unit.{u}.exp_avg"), m.exp_avg.shallow_clone()));
            tensors.push((format!("unit.{u}.exp_avg_sq"), m.exp_avg_sq.shallow_clone()));
            if let Some(master) = &m.master {
                tensors.push((format!("unit.{u}.master"), master.shallow_clone()));
            }
        }
        let path = staged_shard(dir, sh.rank, sh.world)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        Tensor::write_safetensors(&tensors, &path)?;
        Ok(ShardLayout::of(&sh.units, &self.names, sh.world))
    }
}

impl ColoTrainer {
    /// A sharded trainer's [`ColoTrainer::load`]: the checkpoint is an
    /// unsharded one (what every trainer writes), each peer keeps its
    /// elements of every unit, so it loads into any number of peers.
    pub(crate) fn sharded_load(&mut self, dir: &std::path::Path) -> Result<()> {
        use crate::checkpoint::VALUE_HEAD_FILE;
        use crate::checkpoint::{read_named, read_state, take_matching, MASTER_SUFFIX};
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
        let (mut moments, opt_path) = crate::optimizer_shards::read_optimizer(dir)?;
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
