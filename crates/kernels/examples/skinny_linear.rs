//! Decode-shaped products on one thread: colo-kernels' `skinny_linear`
//! against libtorch's `linear`, over the weights of a Qwen2.5-0.5B decode
//! step (24 layers of q/k/v, o, gate/up and down projections and the
//! 151,936-row LM head: 988 MB of bfloat16, far more than the caches),
//! against a one-thread copy of as many bytes.
//!
//! Then a decode step of 16 rows on two cores two ways: as colo's engine
//! runs it on the CPU, two lanes of 8 rows each on one thread (each lane
//! reads every weight), and as 16 rows on each of two threads, each with
//! half of every weight's rows (each weight read once).
//!
//! `./x cargo run --release -p colo-kernels --example skinny_linear [ROWS...]`

use std::time::Instant;

use tch::{Device, Kind, Tensor};

fn best_of<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    tch::set_num_threads(1);
    let bf16 = |s: &[i64]| Tensor::randn(s, (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
    let mut weights: Vec<Tensor> = (0..24)
        .flat_map(|_| [[1152, 896], [896, 896], [9728, 896], [896, 4864]])
        .map(|s| bf16(&s))
        .collect();
    weights.push(bf16(&[151_936, 896]));
    let bytes: i64 = weights.iter().map(|w| w.numel() as i64 * 2).sum();
    let gbs = |s: f64| bytes as f64 / s / 1e9;
    let src = Tensor::zeros([bytes / 4], (Kind::Float, Device::Cpu));
    let mut dst = src.zeros_like();
    let copy = best_of(3, || {
        dst.copy_(&src);
    });
    println!(
        "weights {:.0} MB; one-thread copy {:.1} ms ({:.1} GB/s read)",
        bytes as f64 / 1e6,
        copy * 1e3,
        gbs(copy)
    );
    let rows: Vec<i64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    for m in if rows.is_empty() {
        vec![1, 4, 8, 16, 32]
    } else {
        rows
    } {
        let xs = [bf16(&[m, 896]), bf16(&[m, 4864])];
        let x_for = |w: &Tensor| &xs[usize::from(w.size()[1] != 896)];
        let torch = best_of(3, || {
            for w in &weights {
                let _ = x_for(w).linear(w, None::<&Tensor>);
            }
        });
        let kernel = best_of(3, || {
            for w in &weights {
                let _ = colo_kernels::skinny_linear(x_for(w), w, None).unwrap();
            }
        });
        println!(
            "rows {m:2}: linear {:6.1} ms ({:4.1} GB/s)  skinny_linear {:6.1} ms ({:4.1} GB/s)  {:.2}x",
            torch * 1e3,
            gbs(torch),
            kernel * 1e3,
            gbs(kernel),
            torch / kernel
        );
    }
    let step = |x: &[Tensor; 2], weights: &[Tensor]| {
        for w in weights {
            let x = &x[usize::from(w.size()[1] != 896)];
            let _ = colo_kernels::skinny_linear(x, w, None).unwrap();
        }
    };
    let x8 = [bf16(&[8, 896]), bf16(&[8, 4864])];
    let lanes = best_of(3, || {
        // Tensors are Send but not Sync: the other lane gets its own handles.
        let other: Vec<Tensor> = weights.iter().map(Tensor::shallow_clone).collect();
        let x = [x8[0].shallow_clone(), x8[1].shallow_clone()];
        std::thread::scope(|s| {
            s.spawn(move || {
                tch::set_num_threads(1);
                step(&x, &other)
            });
            tch::set_num_threads(1);
            step(&x8, &weights);
        })
    });
    let x16 = [bf16(&[16, 896]), bf16(&[16, 4864])];
    let halves = |w: &Tensor| {
        let n = w.size()[0];
        [w.narrow(0, 0, n / 2), w.narrow(0, n / 2, n - n / 2)]
    };
    let (first, second): (Vec<Tensor>, Vec<Tensor>) = weights
        .iter()
        .map(|w| {
            let [a, b] = halves(w);
            (a, b)
        })
        .unzip();
    tch::set_num_threads(1);
    let split = best_of(3, || {
        let x = [x16[0].shallow_clone(), x16[1].shallow_clone()];
        let other: Vec<Tensor> = second.iter().map(Tensor::shallow_clone).collect();
        std::thread::scope(|s| {
            s.spawn(move || {
                tch::set_num_threads(1);
                step(&x, &other)
            });
            step(&x16, &first);
        })
    });
    println!(
        "16 rows on 2 cores: 2 lanes of 8 {:.1} ms, columns split over 2 threads {:.1} ms",
        lanes * 1e3,
        split * 1e3
    );
}
