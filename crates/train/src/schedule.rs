//! Learning-rate schedules: linear warmup, then constant or cosine decay.
//!
//! The shapes are verl's (`get_constant_schedule_with_warmup`,
//! `get_cosine_schedule_with_warmup` with `min_lr_ratio`), with one
//! departure: warmup counts from the first step, `lr · (step + 1) / warmup`,
//! so no optimizer step runs with a learning rate of exactly zero (Hugging
//! Face's lambda gives 0 at step 0, which spends the first step on
//! nothing but the moments).

use serde::{Deserialize, Serialize};

/// What happens after warmup. Config names: `"constant"`, `"cosine"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// The peak learning rate until the end.
    #[default]
    Constant,
    /// Half a cosine from the peak down to `peak · min_lr_ratio` at
    /// `total_steps`, then flat.
    Cosine,
}

/// A validated schedule (made by [`crate::OptimConfig::validate`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    pub peak_lr: f64,
    pub warmup_steps: u64,
    pub kind: ScheduleKind,
    /// Steps of the whole run (warmup included); used by cosine only.
    pub total_steps: u64,
    /// Floor of the cosine as a fraction of the peak.
    pub min_lr_ratio: f64,
}

impl LrSchedule {
    /// The learning rate of optimizer step `step` (0-based: the first
    /// update uses `lr_at(0)`).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.kind {
            ScheduleKind::Constant => self.peak_lr,
            ScheduleKind::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
                let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
                let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                self.peak_lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cos)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(kind: ScheduleKind) -> LrSchedule {
        LrSchedule {
            peak_lr: 1.0,
            warmup_steps: 4,
            kind,
            total_steps: 14,
            min_lr_ratio: 0.1,
        }
    }

    #[test]
    fn warmup_is_linear_from_the_first_step() {
        let s = sched(ScheduleKind::Constant);
        let lrs: Vec<f64> = (0..6).map(|i| s.lr_at(i)).collect();
        assert_eq!(lrs, vec![0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn cosine_falls_to_the_floor_and_stays() {
        let s = sched(ScheduleKind::Cosine);
        assert_eq!(s.lr_at(4), 1.0);
        // Half way through the decay: the mean of peak and floor.
        assert!((s.lr_at(9) - 0.55).abs() < 1e-12, "{}", s.lr_at(9));
        assert!((s.lr_at(14) - 0.1).abs() < 1e-12);
        assert!((s.lr_at(100) - 0.1).abs() < 1e-12);
        // Monotone after warmup.
        assert!((4..14).all(|i| s.lr_at(i + 1) <= s.lr_at(i)));
    }

    #[test]
    fn no_warmup_starts_at_the_peak() {
        let s = LrSchedule {
            warmup_steps: 0,
            ..sched(ScheduleKind::Cosine)
        };
        assert_eq!(s.lr_at(0), 1.0);
    }
}
