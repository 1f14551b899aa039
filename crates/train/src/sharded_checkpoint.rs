//! A sharded trainer's checkpoints (see [`crate::sharding`]): the whole
//! model, gathered a unit at a time onto the first peer's host, as an
//! unsharded trainer writes it, and the optimizer state as each peer's
//! flat shards ([`crate::optimizer_shards`]). Read back by each peer
//! reading only its elements of every unit out of the files
//! ([`crate::shard_read`]), so a checkpoint resumes on any number of
//! peers, sharded or not. A new sharded trainer's weight shards are read
//! from a Hugging Face directory the same way ([`read_weight_shards`]).

use std::path::Path;

use tch::Tensor;

use crate::buffers::done;
use crate::checkpoint::{read_state, staged_shard};
use crate::offload::{require_resident, OPTIMIZER, PARAMS};
use crate::optimizer_shards::ShardLayout;
use crate::shard_read::{ShardRead, SliceReader, Span};
use crate::sharding::Unit;
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

/// One parameter's elements in a peer's shard of unit `unit`: the
/// parameter's elements `start..start + len`, at `to` in the shard.
struct Piece {
    unit: usize,
    start: usize,
    len: usize,
    to: i64,
}

/// Peer `rank` of `world`'s pieces of every unit: each with the index and
/// shape of the parameter it is of, for the parameters with elements in
/// the peer's shard (the padding after a unit's last one is nobody's).
fn pieces(units: &[Unit], rank: usize, world: usize) -> Vec<(usize, &[i64], Piece)> {
    let mut out = Vec::new();
    for (u, unit) in units.iter().enumerate() {
        let n = unit.shard_len(world);
        let lo = rank as i64 * n;
        for ((&i, &at), shape) in unit.params.iter().zip(&unit.offsets).zip(&unit.shapes) {
            let (a, b) = (at.max(lo), (at + shape.iter().product::<i64>()).min(lo + n));
            if a < b {
                let piece = Piece {
                    unit: u,
                    start: (a - at) as usize,
                    len: (b - a) as usize,
                    to: a - lo,
                };
                out.push((i, shape.as_slice(), piece));
            }
        }
    }
    out
}

/// Fills a new sharded trainer's weight shards (`shards`, one a unit of
/// `units`, zero) with peer `rank` of `world`'s elements of the weights of
/// the checkpoint in `dir`, reading only their byte ranges (see
/// [`crate::shard_read`]) and converting them to the shards' kind; what it
/// read. Every parameter (named `names`) is looked up and its shape
/// checked in the files' headers before anything is read, on every peer,
/// so a bad checkpoint fails all of them alike.
pub(crate) fn read_weight_shards(
    dir: &Path,
    names: &[String],
    units: &[Unit],
    rank: usize,
    world: usize,
    shards: &[Tensor],
) -> Result<ShardRead> {
    let mut weights = SliceReader::weights(dir)?;
    for unit in units {
        for (&i, shape) in unit.params.iter().zip(&unit.shapes) {
            weights.locate(&names[i], "", shape, 0, 0)?;
        }
    }
    let located = (pieces(units, rank, world).into_iter())
        .map(|(i, shape, p)| {
            let spans = weights.locate(&names[i], "", shape, p.start, p.len)?;
            Ok((p, spans))
        })
        .collect::<Result<Vec<_>>>()?;
    let _no_grad = tch::no_grad_guard();
    for (p, spans) in &located {
        weights.copy(spans, &shards[p.unit].f_narrow(0, p.to, p.len as i64)?)?;
    }
    Ok(weights.read)
}

/// Where a piece's weight, moments and master lie in the checkpoint
/// (`master`: `None` when the checkpoint has none, or the trainer keeps
/// none).
struct Located {
    weight: Vec<Span>,
    exp_avg: Vec<Span>,
    exp_avg_sq: Vec<Span>,
    master: Option<Vec<Span>>,
}

impl ColoTrainer {
    /// A sharded trainer's [`ColoTrainer::load`]: the checkpoint may be
    /// one an unsharded trainer wrote or one a sharded trainer of any
    /// number of peers wrote; each peer reads only its elements of every
    /// unit (see [`crate::shard_read`]).
    pub(crate) fn sharded_load(&mut self, dir: &Path) -> Result<()> {
        self.read_shards(dir).map(drop)
    }

    /// [`crate::TrainEngine::load_checkpoint`] of a sharded trainer, and
    /// what it read: this peer's byte ranges of the checkpoint's files, a
    /// chunk at a time. An error for an unsharded trainer.
    pub fn load_sharded_checkpoint(&mut self, dir: &Path) -> Result<ShardRead> {
        if !self.is_sharded() {
            return Err(Error::Unsupported {
                what: "a sharded load",
                found: "an unsharded trainer: use load_checkpoint".into(),
            });
        }
        require_resident(&self.pool, "load a checkpoint", &[PARAMS, OPTIMIZER])?;
        self.read_shards(dir)
    }

    fn read_shards(&mut self, dir: &Path) -> Result<ShardRead> {
        let sh = self.shards.clone().expect("sharded");
        let state = read_state(dir)?;
        let mut weights = SliceReader::weights(dir)?;
        let mut opt = SliceReader::optimizer(dir)?;
        // Every parameter looked up and its shape checked in the headers
        // on every peer (as a build does), so a bad checkpoint fails all
        // peers alike; then this peer's pieces located, before anything
        // changes.
        for unit in sh.units.iter() {
            for (&i, shape) in unit.params.iter().zip(&unit.shapes) {
                let name = &self.names[i];
                weights.locate(name, "", shape, 0, 0)?;
                opt.locate(name, "exp_avg", shape, 0, 0)?;
                opt.locate(name, "exp_avg_sq", shape, 0, 0)?;
            }
        }
        let mut located = Vec::new();
        for (i, shape, piece) in pieces(&sh.units, sh.rank, sh.world) {
            let name = &self.names[i];
            let at = |r: &SliceReader, what| r.locate(name, what, shape, piece.start, piece.len);
            let master = self.opt.moments[piece.unit].master.is_some() && opt.has(name, "master");
            let spans = Located {
                weight: at(&weights, "")?,
                exp_avg: at(&opt, "exp_avg")?,
                exp_avg_sq: at(&opt, "exp_avg_sq")?,
                master: master.then(|| at(&opt, "master")).transpose()?,
            };
            located.push((piece, spans));
        }
        let _no_grad = tch::no_grad_guard();
        // A value found non-finite, or a read failing, part-way leaves
        // this peer's shards partly loaded: the error says so (the files
        // are not changed; colo-rl ends the run on a failed load).
        let mut fill = || -> Result<()> {
            for (u, m) in self.opt.moments.iter().enumerate() {
                // The padding after a unit's last parameter is zero.
                let shards = [Some(&sh.params[u]), Some(&m.exp_avg), Some(&m.exp_avg_sq)];
                for t in shards.into_iter().chain([m.master.as_ref()]).flatten() {
                    done(t.shallow_clone().f_zero_())?;
                }
            }
            for (p, at) in &located {
                let dst = |t: &Tensor| t.f_narrow(0, p.to, p.len as i64);
                let param = dst(&sh.params[p.unit])?;
                weights.copy(&at.weight, &param)?;
                let m = &self.opt.moments[p.unit];
                opt.copy(&at.exp_avg, &dst(&m.exp_avg)?)?;
                opt.copy(&at.exp_avg_sq, &dst(&m.exp_avg_sq)?)?;
                if let Some(master) = &m.master {
                    match &at.master {
                        Some(spans) => opt.copy(spans, &dst(master)?)?,
                        // A checkpoint without masters (a float32 trainer's)
                        // gives them from its weights, unrounded.
                        None => weights.copy(&at.weight, &dst(master)?)?,
                    }
                }
            }
            Ok(())
        };
        fill().map_err(|e| Error::CheckpointState {
            path: dir.to_owned(),
            reason: format!(
                "{e}; this trainer's shards are now partly loaded from it: build the trainer \
                 again before using it"
            ),
        })?;
        self.opt.t = state.optimizer_steps;
        Ok(ShardRead {
            bytes_read: weights.read.bytes_read + opt.read.bytes_read,
            file_bytes: weights.read.file_bytes + opt.read.file_bytes,
            peak_bytes: weights.read.peak_bytes.max(opt.read.peak_bytes),
        })
    }
}
