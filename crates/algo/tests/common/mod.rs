//! Shared helpers for the integration tests: deterministic data and gradients.
#![allow(dead_code)]

use tch::{Kind, Tensor};

/// A deterministic stream of numbers uniform in [lo, hi) (a 64-bit LCG; the
/// tests need reproducible, not good, randomness).
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Self {
        Lcg(seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407))
    }

    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = (self.0 >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * u
    }

    /// A (rows, cols) f64 matrix of uniform numbers.
    pub fn matrix(&mut self, rows: usize, cols: usize, lo: f64, hi: f64) -> Vec<Vec<f64>> {
        (0..rows)
            .map(|_| (0..cols).map(|_| self.uniform(lo, hi)).collect())
            .collect()
    }
}

/// An f64 tensor from rows (on the CPU).
pub fn t(rows: &[Vec<f64>]) -> Tensor {
    Tensor::from_slice2(rows)
}

/// Rows back from a tensor, as f64.
pub fn rows(t: &Tensor) -> Vec<Vec<f64>> {
    Vec::<Vec<f64>>::try_from(t.to_kind(Kind::Double)).unwrap()
}

/// A scalar tensor as f64.
pub fn scalar(t: &Tensor) -> f64 {
    f64::try_from(t).unwrap()
}

/// A response mask: row i has lens[i] ones then zeros, `cols` wide.
pub fn mask(lens: &[usize], cols: usize) -> Vec<Vec<f64>> {
    lens.iter()
        .map(|&n| (0..cols).map(|j| if j < n { 1.0 } else { 0.0 }).collect())
        .collect()
}

/// d f / d x by libtorch's autograd: `x` becomes a leaf that records
/// gradients, `f(x).backward()` fills its `.grad()` (undefined, i.e. zero,
/// when `f` does not depend on `x`).
pub fn autograd(f: impl FnOnce(&Tensor) -> Tensor, x: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let v = t(x).set_requires_grad(true);
    let loss = f(&v);
    assert_eq!(loss.numel(), 1, "the differentiated value must be a scalar");
    if loss.requires_grad() {
        loss.backward();
    }
    let g = v.grad();
    if g.defined() {
        rows(&g)
    } else {
        x.iter().map(|r| vec![0.0; r.len()]).collect()
    }
}

/// d f / d x by central differences (step h) in f64.
pub fn numeric_grad(f: impl Fn(&Tensor) -> Tensor, x: &[Vec<f64>], h: f64) -> Vec<Vec<f64>> {
    let mut out = x.to_vec();
    for i in 0..x.len() {
        for j in 0..x[i].len() {
            let mut plus = x.to_vec();
            plus[i][j] += h;
            let mut minus = x.to_vec();
            minus[i][j] -= h;
            out[i][j] = (scalar(&f(&t(&plus))) - scalar(&f(&t(&minus)))) / (2.0 * h);
        }
    }
    out
}

/// Asserts two matrices agree within `tol`, and that `a` is not all zero
/// (a gradient check on a zero gradient would pass vacuously).
pub fn assert_close_nonzero(a: &[Vec<f64>], b: &[Vec<f64>], tol: f64, what: &str) {
    assert!(
        a.iter().flatten().any(|x| x.abs() > 1e-6),
        "{what}: gradient is all zero: {a:?}"
    );
    assert_close(a, b, tol, what);
}

/// Asserts two matrices agree within `tol`.
pub fn assert_close(a: &[Vec<f64>], b: &[Vec<f64>], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: row count");
    for (ra, rb) in a.iter().zip(b) {
        assert_eq!(ra.len(), rb.len(), "{what}: row length");
        for (x, y) in ra.iter().zip(rb) {
            assert!((x - y).abs() <= tol, "{what}: {a:?}\n vs {b:?}");
        }
    }
}
