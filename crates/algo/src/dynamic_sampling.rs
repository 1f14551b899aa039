//! DAPO's dynamic sampling (Yu et al. 2025, "DAPO: An Open-Source LLM
//! Reinforcement Learning System at Scale", arXiv:2503.14476, §3.2; verl's
//! `algorithm.filter_groups`): a group whose samples all scored the same
//! has zero group-normalised advantage and teaches nothing, so the step
//! trains only on groups with some variance in their metric, generating
//! more until it has enough.
//!
//! verl keeps a group when `np.std(values) > 0`, or when it has a single
//! sample. [`groups_with_variance`] keeps it when its values are not all
//! equal, which is what that test means: `np.std` of equal floats can come
//! out a rounding error above zero (three samples of 0.1 give 1.4e-17), and
//! then verl keeps a group with nothing to learn. A group with a NaN value
//! is dropped, as in verl (`np.std` is then NaN, which is not > 0), unless
//! it is a single sample.

/// The groups worth training on, in the order they first appear: those
/// whose samples' `values` are not all equal, and those of one sample.
/// `groups[i]` is sample `i`'s group.
///
/// # Panics
///
/// When `groups` and `values` differ in length (the caller's bug).
pub fn groups_with_variance(groups: &[usize], values: &[f64]) -> Vec<usize> {
    assert_eq!(
        groups.len(),
        values.len(),
        "groups_with_variance: one group per value"
    );
    // (group, first value, samples, whether they differ, whether one is NaN)
    let mut seen: Vec<(usize, f64, usize, bool, bool)> = Vec::new();
    for (&g, &v) in groups.iter().zip(values) {
        match seen.iter_mut().find(|s| s.0 == g) {
            Some(s) => {
                s.2 += 1;
                s.3 |= v != s.1;
                s.4 |= v.is_nan();
            }
            None => seen.push((g, v, 1, false, v.is_nan())),
        }
    }
    seen.into_iter()
        .filter(|&(_, _, n, differ, nan)| n == 1 || (differ && !nan))
        .map(|(g, ..)| g)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_groups_that_disagree_and_singletons_in_order() {
        let groups = [3, 3, 1, 1, 0, 0, 0, 7];
        let values = [1.0, 0.0, 1.0, 1.0, -1.0, -1.0, 1.0, 0.0];
        assert_eq!(groups_with_variance(&groups, &values), vec![3, 0, 7]);
    }

    #[test]
    fn samples_of_a_group_need_not_be_adjacent() {
        let groups = [0, 1, 0, 1];
        assert_eq!(groups_with_variance(&groups, &[0.5, 2.0, 0.5, 2.5]), [1]);
    }

    /// Where verl's `np.std(values) > 0` says "variance" for equal values.
    #[test]
    fn equal_values_have_none_whatever_their_float_mean() {
        let tenth = [0.1, 0.1, 0.1];
        let mean = tenth.iter().sum::<f64>() / 3.0;
        assert_ne!(mean, 0.1, "the mean is a rounding error off");
        assert!(groups_with_variance(&[4, 4, 4], &tenth).is_empty());
    }

    #[test]
    fn nan_drops_a_group_but_not_a_single_sample() {
        assert!(groups_with_variance(&[0, 0], &[f64::NAN, f64::NAN]).is_empty());
        assert!(groups_with_variance(&[0, 0], &[f64::NAN, 1.0]).is_empty());
        assert!(groups_with_variance(&[0, 0], &[1.0, f64::NAN]).is_empty());
        assert_eq!(groups_with_variance(&[5], &[f64::NAN]), [5]);
        assert!(groups_with_variance(&[], &[]).is_empty());
    }
}
