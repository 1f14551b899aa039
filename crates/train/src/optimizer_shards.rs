//! A sharded trainer's optimizer state in a checkpoint: one file per
//! peer, `optimizer-rank-R-of-N.safetensors`, holding its flat shards of
//! every unit's moments and float32 masters (`unit.U.exp_avg`,
//! `unit.U.exp_avg_sq`, `unit.U.master`), and `optimizer_shards.json`, the
//! units' layout (each unit's parameters, shapes and padded length, and
//! the number of peers). No peer ever holds more than its own shard while
//! saving.
//!
//! An unsharded trainer reads the per-parameter tensors an unsharded
//! checkpoint's `optimizer.safetensors` holds (`<name>.exp_avg`,
//! `<name>.exp_avg_sq`, `<name>.master`, [`read_optimizer`]): every unit's
//! shards concatenated in rank order, the padding cut, each parameter's
//! slice reshaped. A sharded trainer of any number of peers reads only the
//! byte ranges of its own elements ([`crate::shard_read`]). So a
//! checkpoint written by N sharded peers loads into one trainer or into
//! any number of peers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::checkpoint::{read_named, OPTIMIZER_FILE};
use crate::sharding::Unit;
use crate::{Error, Result};

/// The layout file of a sharded optimizer state.
pub const OPTIMIZER_SHARDS_FILE: &str = "optimizer_shards.json";

/// Peer `rank`'s file of `world`.
pub fn shard_file(rank: usize, world: usize) -> String {
    format!("optimizer-rank-{rank}-of-{world}.safetensors")
}

/// `optimizer_shards.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardLayout {
    /// Peers that wrote the shards (files `optimizer-rank-R-of-N`).
    pub world: usize,
    pub units: Vec<UnitLayout>,
}

/// One unit: its parameters in flattening order, their shapes, and the
/// flat length padded to a multiple of `world`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnitLayout {
    pub params: Vec<String>,
    pub shapes: Vec<Vec<i64>>,
    pub padded: i64,
}

impl ShardLayout {
    pub(crate) fn of(units: &[Unit], names: &[String], world: usize) -> Self {
        ShardLayout {
            world,
            units: (units.iter())
                .map(|u| UnitLayout {
                    params: u.params.iter().map(|&i| names[i].clone()).collect(),
                    shapes: u.shapes.clone(),
                    padded: u.padded,
                })
                .collect(),
        }
    }

    /// Reads and checks `dir/optimizer_shards.json`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(OPTIMIZER_SHARDS_FILE);
        let bad = |reason: String| Error::CheckpointState {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let layout: ShardLayout = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let w = layout.world as i64;
        for (u, unit) in layout.units.iter().enumerate() {
            // (A negative dimension or length is refused here: every
            // offset computed from the layout is then a valid usize.)
            let numel: Option<i64> = (unit.shapes.iter())
                .map(|s| {
                    (s.iter()).try_fold(1i64, |a, &d| (d >= 0).then(|| a.checked_mul(d)).flatten())
                })
                .try_fold(0i64, |a, n| a.checked_add(n?));
            let fits = numel.is_some_and(|n| n <= unit.padded);
            if w < 1
                || unit.padded < 0
                || unit.padded % w != 0
                || !fits
                || unit.params.len() != unit.shapes.len()
            {
                return Err(bad(format!(
                    "unit {u}: {} parameters, {} shapes, padded length {} over {} peers: \
                     expected one shape a parameter (no negative dimension), their elements \
                     within the padded length, a non-negative multiple of the peers",
                    unit.params.len(),
                    unit.shapes.len(),
                    unit.padded,
                    layout.world
                )));
            }
        }
        Ok(layout)
    }

    /// The shard files the layout names, in rank order.
    pub fn files(&self, dir: &Path) -> Vec<PathBuf> {
        (0..self.world)
            .map(|r| dir.join(shard_file(r, self.world)))
            .collect()
    }
}

/// The optimizer files of the checkpoint in `dir`: `optimizer.safetensors`
/// when there is one, else the layout and every shard it names.
pub fn optimizer_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let whole = dir.join(OPTIMIZER_FILE);
    if whole.exists() || !dir.join(OPTIMIZER_SHARDS_FILE).exists() {
        return Ok(vec![whole]);
    }
    let layout = ShardLayout::read(dir)?;
    Ok(layout.files(dir))
}

/// The optimizer state of the checkpoint in `dir` under the unsharded
/// names (see the module doc), and the path errors name.
pub(crate) fn read_optimizer(dir: &Path) -> Result<(HashMap<String, Tensor>, PathBuf)> {
    let whole = dir.join(OPTIMIZER_FILE);
    if whole.exists() || !dir.join(OPTIMIZER_SHARDS_FILE).exists() {
        return Ok((read_named(&whole)?, whole));
    }
    let layout = ShardLayout::read(dir)?;
    let files = layout.files(dir);
    let shards = files
        .iter()
        .map(|f| read_named(f))
        .collect::<Result<Vec<_>>>()?;
    let mut out = HashMap::new();
    for (u, unit) in layout.units.iter().enumerate() {
        for what in ["exp_avg", "exp_avg_sq", "master"] {
            let key = format!("unit.{u}.{what}");
            let parts: Vec<&Tensor> = shards.iter().filter_map(|s| s.get(&key)).collect();
            if parts.is_empty() && what == "master" {
                continue; // a float32 trainer keeps no masters
            }
            let n = unit.padded / layout.world as i64;
            if parts.len() != layout.world || parts.iter().any(|t| t.size() != [n]) {
                return Err(Error::CheckpointState {
                    path: files[0].clone(),
                    reason: format!(
                        "`{key}`: expected a flat tensor of {n} elements in each of the {} \
                         shard files",
                        layout.world
                    ),
                });
            }
            let full = Tensor::f_cat(&parts, 0)?;
            let mut at = 0i64;
            for (name, shape) in unit.params.iter().zip(&unit.shapes) {
                let len: i64 = shape.iter().product();
                let t = full.f_narrow(0, at, len)?.f_reshape(shape.as_slice())?;
                out.insert(format!("{name}.{what}"), t);
                at += len;
            }
        }
    }
    Ok((out, dir.join(OPTIMIZER_SHARDS_FILE)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_that_cannot_hold_its_shapes_is_refused_naming_the_unit() {
        let dir = tempfile::tempdir().unwrap();
        let write = |layout: &ShardLayout| {
            let json = serde_json::to_string(layout).unwrap();
            std::fs::write(dir.path().join(OPTIMIZER_SHARDS_FILE), json).unwrap();
        };
        let unit = |padded| UnitLayout {
            params: vec!["a".into(), "b".into()],
            shapes: vec![vec![2, 3], vec![3]],
            padded,
        };
        let good = ShardLayout {
            world: 3,
            units: vec![unit(9)],
        };
        write(&good);
        assert_eq!(ShardLayout::read(dir.path()).unwrap(), good);
        let names: Vec<String> = (optimizer_files(dir.path()).unwrap().iter())
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names[2], "optimizer-rank-2-of-3.safetensors");
        // Too short, not a multiple of the peers, negative; a negative
        // dimension whose product would fit.
        let negative = UnitLayout {
            shapes: vec![vec![-2, -3], vec![3]],
            ..unit(9)
        };
        for bad in [unit(8), unit(10), unit(-3), negative] {
            write(&ShardLayout {
                world: 3,
                units: vec![unit(9), bad],
            });
            let err = ShardLayout::read(dir.path()).unwrap_err().to_string();
            assert!(err.contains("unit 1"), "{err}");
        }
    }
}
