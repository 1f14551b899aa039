//! Floats as a person reads them in messages and in `--print-config`:
//! Rust's `{}` writes every digit of a float's decimal expansion, so
//! `1e300` came out as a 1 and 300 zeros and `1e-300` as 300 zeros.

use std::fmt;

/// `v` in decimal when that is short (1e-5 ≤ |v| < 1e16, or 0), otherwise
/// in exponent form (`1e300`, `2.5e-7`), the shortest digits that read
/// back as `v` either way; both forms are valid TOML floats.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Num(pub f64);

impl Num {
    /// Whether `v` is written in exponent form.
    pub(crate) fn far_from_one(v: f64) -> bool {
        let a = v.abs();
        a != 0.0 && a.is_finite() && !(1e-5..1e16).contains(&a)
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Num::far_from_one(self.0) {
            true => write!(f, "{:e}", self.0),
            false => write!(f, "{}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Num;

    #[test]
    fn extreme_floats_are_short_and_read_back() {
        for (v, text) in [
            (1e300, "1e300"),
            (1e-300, "1e-300"),
            (-2.5e-7, "-2.5e-7"),
            (0.001, "0.001"),
            (1e-4, "0.0001"),
            (123456.5, "123456.5"),
            (0.0, "0"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(Num(v).to_string(), text);
            if v.is_finite() {
                assert_eq!(text.parse::<f64>().unwrap(), v);
            }
        }
    }
}
