//! A collective between threads of this process: a stand-in for
//! torch.distributed (which colo-py's workers use and test across
//! processes), exact for float32 and bf16 values.

use std::sync::{Arc, Barrier, Mutex};

use colo_train::{Collective, ReduceOp};
use tch::{Kind, Tensor};

/// Two threads' values, exchanged through shared slots.
struct Shared {
    slots: Mutex<Vec<Vec<f64>>>,
    barrier: Barrier,
}

pub struct InProcess {
    rank: usize,
    world: usize,
    shared: Arc<Shared>,
}

impl InProcess {
    pub fn group(world: usize) -> Vec<InProcess> {
        let shared = Arc::new(Shared {
            slots: Mutex::new(vec![Vec::new(); world]),
            barrier: Barrier::new(world),
        });
        (0..world)
            .map(|rank| InProcess {
                rank,
                world,
                shared: Arc::clone(&shared),
            })
            .collect()
    }

    /// Every peer's values, in rank order.
    fn exchange(&self, mine: Vec<f64>) -> Vec<Vec<f64>> {
        self.shared.slots.lock().unwrap()[self.rank] = mine;
        self.shared.barrier.wait();
        let all = self.shared.slots.lock().unwrap().clone();
        self.shared.barrier.wait();
        all
    }
}

impl Collective for InProcess {
    fn world_size(&self) -> usize {
        self.world
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn all_reduce_tensors(&mut self, tensors: &[Tensor]) -> colo_train::Result<()> {
        let flat: Vec<f64> = tensors
            .iter()
            .flat_map(|t| Vec::<f64>::try_from(&t.flatten(0, -1).to_kind(Kind::Double)).unwrap())
            .collect();
        let all = self.exchange(flat);
        let mut at = 0;
        for t in tensors {
            let n = t.numel();
            let sum: Vec<f64> = (at..at + n)
                .map(|i| all.iter().map(|v| v[i]).sum())
                .collect();
            let mut dst = t.shallow_clone();
            tch::no_grad(|| dst.copy_(&Tensor::from_slice(&sum).view_as(t).to_kind(t.kind())));
            at += n;
        }
        Ok(())
    }

    fn all_reduce_values(&mut self, values: &mut [f64], op: ReduceOp) -> colo_train::Result<()> {
        let all = self.exchange(values.to_vec());
        for (i, v) in values.iter_mut().enumerate() {
            let column = all.iter().map(|p| p[i]);
            *v = match op {
                ReduceOp::Sum => column.sum(),
                ReduceOp::Max => column.fold(f64::MIN, f64::max),
            };
        }
        Ok(())
    }

    fn all_gather(&mut self, shard: &Tensor, full: &Tensor) -> colo_train::Result<()> {
        let all = self.exchange(values_of(shard));
        let flat: Vec<f64> = all.concat();
        let mut dst = full.shallow_clone();
        tch::no_grad(|| dst.copy_(&Tensor::from_slice(&flat).to_kind(full.kind())));
        Ok(())
    }

    fn reduce_scatter(&mut self, full: &Tensor, shard: &Tensor) -> colo_train::Result<()> {
        let all = self.exchange(values_of(full));
        let n = shard.numel();
        let mine: Vec<f64> = (self.rank * n..(self.rank + 1) * n)
            .map(|i| all.iter().map(|v| v[i]).sum())
            .collect();
        let mut dst = shard.shallow_clone();
        tch::no_grad(|| dst.copy_(&Tensor::from_slice(&mine).to_kind(shard.kind())));
        Ok(())
    }
}

/// A tensor's values, flat, in float64 (exact for float32 and bf16).
fn values_of(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.flatten(0, -1).to_kind(Kind::Double)).unwrap()
}
