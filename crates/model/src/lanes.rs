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
//! another process was busy. Splitting rows instead costs one hand-off
//! and one join per pass, and each lane runs its ops back to back (the
//! update 0.15 s per step on two lanes). With every pass in lanes no
//! OpenMP team is ever formed, so libgomp's wait policy no longer matters
//! to colo's own work, and colo leaves it at its default.
//!
//! The other lanes run on threads that live as long as the process (a
//! rayon pool of their own), not on threads started per pass: libtorch's
//! CPU matrix products keep their oneDNN primitive descriptors in a
//! per-thread cache (ideep's), which a thread started per pass built
//! anew for every product of every pass and dropped at its exit — with
//! its malloc arena's caches. The first lane runs on the calling thread.
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
/// other one on a lane thread of its own (see the module's note), all
/// with one libtorch intra-op thread; returns the results in order. A
/// panic in a lane is resumed here, after every lane has finished.
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
    let mut out: Vec<Option<T>> = std::iter::repeat_with(|| None).take(work.len()).collect();
    let mut work = work.into_iter();
    let first = work.next();
    let (head, rest) = out.split_at_mut(1);
    lane_threads(rest.len()).in_place_scope(|s| {
        for (slot, w) in rest.iter_mut().zip(work) {
            s.spawn(move |_| {
                // OpenMP's and MKL's thread counts are per thread: a new
                // thread would start at all cores.
                one_intra_op_thread();
                *slot = Some(w());
            });
        }
        head[0] = first.map(|w| w());
    });
    out.into_iter()
        .map(|r| r.expect("every lane ran (a panic would have been resumed)"))
        .collect()
}

/// Starts the lane threads for passes of up to `lanes` lanes (the first
/// runs on the caller's thread), so the first pass does not start them.
/// The program calls it once at its start, with the process's share
/// ([`count`]); a later pass with more lanes still gets a larger pool.
/// Runs `f` on the calling thread as one pass whose large matrix
/// products split their *columns* over `threads` lanes ([`wide`]):
/// for a pass bound by reading large weights once (a decode step of a
/// model far larger than the CPU's caches), where lanes of rows would
/// each read every weight and share the memory bandwidth reading them
/// twice. The pass's other ops stay on the calling thread, and no OpenMP
/// team is formed (see the module doc).
pub fn run_wide<T>(threads: usize, f: impl FnOnce() -> T) -> T {
    one_intra_op_thread();
    let before = WIDE.replace(threads.max(1));
    let out = f();
    WIDE.set(before);
    out
}

thread_local!(static WIDE: std::cell::Cell<usize> = const { std::cell::Cell::new(1) });

/// The lanes a matrix product of the current pass may split its columns
/// over: `threads` inside [`run_wide`], else 1.
pub fn wide() -> usize {
    WIDE.get()
}

pub fn start(lanes: usize) {
    if lanes > 1 {
        lane_threads(lanes - 1);
    }
}

/// The process's lane threads, at least `n` of them: one pool, replaced by
/// a larger one (the old one left to its threads, idle) only when a run
/// asks for more lanes than any before it.
fn lane_threads(n: usize) -> &'static rayon::ThreadPool {
    static POOL: std::sync::Mutex<Option<(usize, &'static rayon::ThreadPool)>> =
        std::sync::Mutex::new(None);
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    match *pool {
        Some((size, p)) if size >= n => p,
        _ => {
            let built = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("colo-lane-{}", i + 1))
                .build()
                .unwrap_or_else(|e| panic!("starting {n} lane threads: {e}"));
            let p: &'static rayon::ThreadPool = Box::leak(Box::new(built));
            *pool = Some((n, p));
            p
        }
    }
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

    /// The other lanes run on threads that outlive the pass (what keeps
    /// libtorch's per-thread caches), and the first on the caller's.
    #[test]
    fn lanes_after_the_first_reuse_their_threads() {
        let ids = || {
            let work: Vec<_> = (0..2).map(|_| || std::thread::current().id()).collect();
            run(work)
        };
        let (a, b) = (ids(), ids());
        assert_eq!(a[0], std::thread::current().id());
        assert_ne!(a[1], a[0]);
        assert_eq!(a[1], b[1]);
    }

    /// `start` makes the threads of the lanes it is given before any pass
    /// asks for them (no other test here asks for five lanes).
    #[test]
    fn start_makes_the_lane_threads_up_front() {
        start(5);
        assert!(lane_threads(1).current_num_threads() >= 4);
    }

    #[test]
    fn a_panic_in_a_lane_reaches_the_caller() {
        let work: Vec<Box<dyn FnOnce() -> u8 + Send>> =
            vec![Box::new(|| 1), Box::new(|| panic!("lane two failed"))];
        let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(work))).unwrap_err();
        assert_eq!(e.downcast_ref::<&str>(), Some(&"lane two failed"));
    }
}
