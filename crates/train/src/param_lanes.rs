//! The optimizer step's work on the CPU, split over the lanes by
//! parameter: adding the lanes' gradients into the accumulators, the
//! gradients' norms, and AdamW. Each of these passes over every
//! parameter's bytes once or more and does nothing else; on one thread
//! they took a third of a bf16 training step (BENCHMARKS.md,
//! 2026-11-27), while the lanes that ran the forward and backward sat idle.
//!
//! Each tensor is handled whole by one lane with one intra-op thread, so
//! every result is the same whatever the number of lanes: a partition
//! changes which thread does the work, not the order of any float sum.

use tch::Tensor;

use crate::Result;

/// The indices `0..sizes.len()` in up to `lanes` groups of about equal
/// total size (the largest first, each to the least loaded group), each
/// group in increasing order; no empty group.
pub(crate) fn groups(sizes: &[usize], lanes: usize) -> Vec<Vec<usize>> {
    let n = lanes.clamp(1, sizes.len().max(1));
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), i));
    let mut out = vec![(0usize, Vec::new()); n];
    for i in order {
        let g = (0..n).min_by_key(|&g| (out[g].0, g)).expect("n ≥ 1");
        out[g].0 += sizes[i];
        out[g].1.push(i);
    }
    out.into_iter()
        .map(|(_, mut g)| {
            g.sort_unstable();
            g
        })
        .filter(|g| !g.is_empty())
        .collect()
}

/// Runs `work(indices)` for each group of `tensors`' indices (by their
/// element counts) on its own lane, with grad mode off; the results in
/// group order.
pub(crate) fn run<T: Send>(
    tensors: &[Tensor],
    lanes: usize,
    work: impl Fn(&[usize]) -> Box<dyn FnOnce() -> Result<T> + Send>,
) -> Result<Vec<T>> {
    let sizes: Vec<usize> = tensors.iter().map(|t| t.numel()).collect();
    let jobs: Vec<_> = groups(&sizes, lanes)
        .iter()
        .map(|g| {
            let job = work(g);
            move || {
                let _no_grad = tch::no_grad_guard();
                job()
            }
        })
        .collect();
    colo_model::lanes::run(jobs).into_iter().collect()
}

/// Adds each lane's gradients into the accumulators: for parameter i,
/// `parts[k][i]` (undefined where lane k's loss did not reach it) in lane
/// order; an accumulator not yet written this step (`fresh[i]`) takes
/// the first by copy.
pub(crate) fn accumulate(
    accs: &[Tensor],
    parts: &[Vec<Tensor>],
    fresh: &mut [bool],
    lanes: usize,
) -> Result<()> {
    let per_param: Vec<Vec<Tensor>> = (0..accs.len())
        .map(|i| {
            (parts.iter())
                .filter_map(|p| p.get(i).filter(|g| g.defined()))
                .map(Tensor::shallow_clone)
                .collect()
        })
        .collect();
    let written = run(accs, lanes, |idx| {
        let jobs: Vec<(Tensor, Vec<Tensor>, bool)> = (idx.iter())
            .map(|&i| {
                let gs = per_param[i].iter().map(Tensor::shallow_clone).collect();
                (accs[i].shallow_clone(), gs, fresh[i])
            })
            .collect();
        Box::new(move || {
            for (mut acc, gs, fresh) in jobs {
                // One pass over the accumulator for all the lanes' parts
                // where colo-kernels takes them (bit for bit the same sums).
                if colo_kernels::grad_sum_fits(&acc, &gs) {
                    colo_kernels::grad_sum(&acc, &gs, fresh)?;
                    continue;
                }
                for (k, g) in gs.iter().enumerate() {
                    match fresh && k == 0 {
                        true => acc.f_copy_(g)?,
                        false => drop(acc.f_add_(g)?),
                    }
                }
            }
            Ok(())
        })
    });
    written?;
    for (f, gs) in fresh.iter_mut().zip(&per_param) {
        *f &= gs.is_empty();
    }
    Ok(())
}

/// The global L2 norm of `grads` (as `torch.nn.utils.clip_grad_norm_`):
/// each tensor's norm in its own kind, then the norm of those in f64.
pub(crate) fn global_norm(grads: &[Tensor], lanes: usize) -> Result<f64> {
    let norms = run(grads, lanes, |idx| {
        let gs: Vec<(usize, Tensor)> = idx.iter().map(|&i| (i, grads[i].shallow_clone())).collect();
        Box::new(move || {
            gs.into_iter()
                .map(|(i, g)| Ok((i, g.f_norm()?.f_double_value(&[])?)))
                .collect::<Result<Vec<_>>>()
        })
    })?;
    let mut all: Vec<(usize, f64)> = norms.into_iter().flatten().collect();
    all.sort_by_key(|&(i, _)| i);
    Ok(all.iter().map(|(_, n)| n * n).sum::<f64>().sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_balanced_cover_every_index_once_and_are_sorted() {
        assert_eq!(groups(&[10, 1, 1, 8, 2], 2), [vec![0, 1], vec![2, 3, 4]]);
        assert_eq!(groups(&[5, 5, 5, 5], 2), [vec![0, 2], vec![1, 3]]);
        assert_eq!(groups(&[3], 4), [vec![0]]);
        assert_eq!(groups(&[], 2), Vec::<Vec<usize>>::new());
        assert_eq!(groups(&[1, 2, 3], 1), [vec![0, 1, 2]]);
    }

    #[test]
    fn accumulation_and_norm_are_the_same_on_any_number_of_lanes() {
        let parts: Vec<Vec<Tensor>> = (0..3)
            .map(|k| {
                (0..5)
                    .map(|i| match (k, i) {
                        (1, 2) => Tensor::new(), // lane 1's loss did not reach parameter 2
                        _ => Tensor::randn([100 * (i + 1) as i64], tch::kind::FLOAT_CPU),
                    })
                    .collect()
            })
            .collect();
        let mut results = vec![];
        for lanes in [1, 2, 3] {
            let accs: Vec<Tensor> = (0..5)
                .map(|i| Tensor::full([100 * (i + 1) as i64], 7.0, tch::kind::FLOAT_CPU))
                .collect();
            let mut fresh = vec![true, true, true, true, false];
            accumulate(&accs, &parts, &mut fresh, lanes).unwrap();
            assert_eq!(fresh, [false; 5]);
            let norm = global_norm(&accs, lanes).unwrap();
            results.push((accs, norm));
        }
        let (want, norm) = &results[0];
        for i in 0..5 {
            let mut sum = match i {
                4 => Tensor::full([500], 7.0, tch::kind::FLOAT_CPU), // not fresh: added to
                _ => Tensor::zeros([100 * (i + 1) as i64], tch::kind::FLOAT_CPU),
            };
            for p in &parts {
                if p[i].defined() {
                    sum += &p[i];
                }
            }
            assert!(want[i].allclose(&sum, 1e-6, 1e-6, false), "parameter {i}");
        }
        let by_hand = want
            .iter()
            .map(|t| t.square().sum(tch::Kind::Double).double_value(&[]))
            .sum::<f64>()
            .sqrt();
        assert!(
            (norm - by_hand).abs() < 1e-4 * by_hand,
            "{norm} vs {by_hand}"
        );
        for (accs, n) in &results[1..] {
            assert_eq!(n, norm, "the norm does not depend on the lanes");
            for (a, b) in accs.iter().zip(want) {
                assert!(a.equal(b));
            }
        }
    }
}
