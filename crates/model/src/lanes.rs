//! Lanes: on the CPU, a pass's rows split over threads, each running
//! libtorch with one intra-op thread — the trainer's micro-batches and the
//! rollout engine's prefill and decode steps.
//!
//! Why not libtorch's own intra-op parallelism: colo's passes are
//! thousands of small ops, and OpenMP parallelises each of them on its
//! own, with a wake-up and a barrier per op. A sleeping OpenMP worker is
//! woken by a futex call and, on a virtual machine, a cross-CPU interrupt;
//! a spinning one steals the core from anything else running. Measured on
//! the built-in job (BENCHMARKS.md): two intra-op threads under the
//! passive policy made the actor update *slower* than one (0.31 against
//! 0.24 s per step), and spinning was 2–6× slower than sleeping as soon as
//! another process was busy. Splitting rows instead costs one thread
//! start and one join per pass, and each lane runs its ops back to back
//! (the update 0.15 s per step on two lanes). With every pass in lanes no
//! OpenMP team is ever formed, so libgomp's wait policy no longer matters
//! to colo's own work, and colo leaves it at its default.
//!
//! A lane owns shallow clones of the weights (`tch::Tensor` is `Send`,
//! not `Sync`): the same storage — and for training the same autograd
//! leaves. Thread-local state does not cross: grad mode, and colo-mem's
//! `region(tag)`, which routes the allocations of the thread that holds
//! the guard; each lane's work sets its own.

/// Lanes for `threads` on `device`; 1 off the CPU. `threads` 0 means the
/// process's share of the machine, as libtorch counts it for its own
/// default: `OMP_NUM_THREADS` when set (Ray sets it to an actor's CPUs),
/// otherwise the cores this process may run on.
pub fn count(device: tch::Device, threads: usize) -> usize {
    match (device, threads) {
        (tch::Device::Cpu, 0) => std::env::var("OMP_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        (tch::Device::Cpu, n) => n,
        _ => 1,
    }
}

/// `(start, len)` of up to `lanes` parts of rows `start..start + len`,
/// as even as whole rows allow (no empty part).
pub fn split(start: usize, len: usize, lanes: usize) -> Vec<(usize, usize)> {
    let n = lanes.clamp(1, len.max(1));
    let (base, extra) = (len / n, len % n);
    let mut at = start;
    (0..n)
        .map(|i| {
            let l = base + usize::from(i < extra);
            let part = (at, l);
            at += l;
            part
        })
        .filter(|&(_, l)| l > 0)
        .collect()
}

/// Runs every piece of work, the first on the calling thread and each
/// other one on a thread of its own, all with one libtorch intra-op
/// thread; returns the results in order. A panic in a lane is resumed
/// here.
///
/// libtorch's intra-op count is process-wide: it is set to 1 here and
/// left so, never flipped back and forth — a pass on another thread that
/// read a count changing under it would split its reductions differently
/// and lose bit-for-bit repeatability. (OpenMP's and MKL's own counts are
/// per thread, so every lane thread sets its own.)
pub fn run<T: Send, W: FnOnce() -> T + Send>(work: Vec<W>) -> Vec<T> {
    one_intra_op_thread();
    if work.len() <= 1 {
        return work.into_iter().map(|w| w()).collect();
    }
    std::thread::scope(|s| {
        let mut work = work.into_iter();
        let first = work.next();
        let others: Vec<_> = work
            .map(|w| {
                s.spawn(move || {
                    // OpenMP's and MKL's thread counts are per thread: a
                    // new thread would start at all cores.
                    one_intra_op_thread();
                    w()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(others.len() + 1);
        out.extend(first.map(|w| w()));
        for h in others {
            out.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        out
    })
}

/// One libtorch intra-op thread for the calling thread (and as libtorch's
/// process-wide count).
fn one_intra_op_thread() {
    thread_local!(static SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if tch::get_num_threads() != 1 || !SET.get() {
        tch::set_num_threads(1);
        SET.set(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_rows_once_and_evenly() {
        assert_eq!(split(10, 7, 2), [(10, 4), (14, 3)]);
        assert_eq!(split(0, 64, 2), [(0, 32), (32, 32)]);
        assert_eq!(split(5, 1, 4), [(5, 1)]);
        assert_eq!(split(0, 3, 1), [(0, 3)]);
        assert_eq!(split(0, 0, 2), Vec::<(usize, usize)>::new());
    }

    #[test]
    fn results_come_back_in_order_each_on_one_intra_op_thread() {
        let work: Vec<_> = (0..3)
            .map(|i| move || (i, tch::get_num_threads()))
            .collect();
        assert_eq!(run(work), [(0, 1), (1, 1), (2, 1)]);
        assert_eq!(tch::get_num_threads(), 1);
    }
}
