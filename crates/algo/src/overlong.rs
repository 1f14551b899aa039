//! DAPO's soft overlong punishment (Yu et al. 2025, "DAPO: An Open-Source
//! LLM Reinforcement Learning System at Scale", §3.4; verl's
//! `DAPORewardManager` with `overlong_buffer`): a response that runs into
//! the last `len` tokens before the length limit loses reward in
//! proportion, so the policy learns to finish before it is cut, where a
//! truncated answer is otherwise scored like any wrong one.
//!
//! With responses of at most `max` tokens, a response of `L` tokens gets
//! `min(-(L - (max - len)) / len · penalty_factor, 0)` added to its reward:
//! nothing up to `max - len` tokens, falling linearly to `-penalty_factor`
//! at `max`.

/// The punishment's settings (verl's `overlong_buffer.len` and
/// `.penalty_factor`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverlongBuffer {
    /// Tokens before the limit over which the punishment grows.
    pub len: usize,
    /// The punishment at the limit.
    pub penalty_factor: f64,
}

impl OverlongBuffer {
    /// What a response of `response_len` tokens adds to its reward when
    /// responses may be `max_response_len` long (≤ 0).
    pub fn penalty(&self, response_len: usize, max_response_len: usize) -> f64 {
        let expected = max_response_len.saturating_sub(self.len) as f64;
        let exceed = response_len as f64 - expected;
        (-exceed / self.len.max(1) as f64 * self.penalty_factor).min(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// verl's formula at the edges of the buffer and inside it.
    #[test]
    fn grows_linearly_over_the_buffer() {
        let b = OverlongBuffer {
            len: 4,
            penalty_factor: 1.0,
        };
        let at = |l| b.penalty(l, 20);
        assert_eq!((at(0), at(16)), (0.0, 0.0));
        assert_eq!((at(17), at(18), at(20)), (-0.25, -0.5, -1.0));
        let half = OverlongBuffer {
            penalty_factor: 0.5,
            ..b
        };
        assert_eq!(half.penalty(20, 20), -0.5);
        // A buffer as long as the limit punishes from the first token.
        assert_eq!(b.penalty(2, 4), -0.5);
    }
}
