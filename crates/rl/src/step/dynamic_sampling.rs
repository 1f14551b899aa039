//! DAPO's dynamic sampling (`algorithm.filter_groups`): stage 1 of the
//! step draws generation batches until enough of their groups vary
//! (verl's `RayDAPOTrainer.fit`); without it, one batch is the step's.
//! The ranks of a data-parallel run agree after each batch, so that they
//! draw the same batches and stop together.

use super::*;

impl Run<'_> {
    /// The step's scored samples (rollout phase): one generation batch's
    /// from `draw`, or with dynamic sampling the first
    /// `data.train_batch_size` groups whose metric varies, from as many
    /// batches as that takes (verl's `RayDAPOTrainer.fit`).
    pub(super) fn sample<'p>(
        &mut self,
        step: usize,
        draw: &mut dyn FnMut() -> Batch<'p>,
        cost: &mut RewardCost,
    ) -> Result<(Sampled<'p>, Drawn)> {
        let cfg = self.config;
        let target = cfg.batch.prompts_per_step;
        let mut kept = Sampled::default();
        let mut drawn = Drawn::default();
        loop {
            let batch = draw();
            drawn.batches += 1;
            drawn.epoch = batch.epoch;
            let sampled = self.sample_batch(step, &batch, cost)?;
            let filter = &cfg.algorithm.filter_groups;
            if !filter.enable {
                return Ok((sampled, drawn));
            }
            let values = self.filter_values(&filter.metric, &sampled)?;
            let groups = colo_algo::groups_with_variance(&sampled.rollouts.batch_prompt, &values);
            kept.append(sampled.select(&groups));
            let (enough, stop) = self.agree(kept.prompts.len() >= target, self.stop_requested())?;
            if enough {
                let first: Vec<usize> = (0..target).collect();
                return Ok((kept.select(&first), drawn));
            }
            let have = format!(
                "step {}: {} of the {target} prompts {} had samples whose {} varied, after {} \
                 generation batches of {} prompts",
                step + 1,
                kept.prompts.len(),
                match self.peers {
                    Some(_) => "of this worker's share of data.train_batch_size",
                    None => "data.train_batch_size asks for",
                },
                filter.metric.name(),
                drawn.batches,
                cfg.batch.gen_batch_prompts,
            );
            if let Some(max) = filter.max_gen_batches().filter(|&m| drawn.batches >= m) {
                return Err(Error::DynamicSampling(format!(
                    "{have}, the most algorithm.filter_groups.max_num_gen_batches = {max} allows. \
                     The prompts are too easy or too hard for the policy (all of a prompt's \
                     samples score the same): use other data, raise max_num_gen_batches, or set \
                     it to 0 for no limit"
                )));
            }
            if stop {
                // The step cannot finish without its groups; the
                // checkpoints written so far are complete.
                return Err(Error::StoppedMidStep(format!(
                    "{have}; stopped at your request before the step could finish, so no \
                     checkpoint of it was written (--resume continues from the last one)"
                )));
            }
            if drawn.batches.is_multiple_of(10) {
                crate::progress::say(&format!("{have}; generating more"));
            }
        }
    }

    /// Whether `enough` holds on every rank of a data-parallel run, and
    /// whether any rank was asked to `stop` (this rank's own answers
    /// without peers). Every rank calls it after each generation batch, so
    /// the ranks draw the same batches and stop together.
    fn agree(&mut self, enough: bool, stop: bool) -> Result<(bool, bool)> {
        let Some(peers) = &mut self.peers else {
            return Ok((enough, stop));
        };
        let mut any = [f64::from(u8::from(!enough)), f64::from(u8::from(stop))];
        peers.all_reduce_values(&mut any, colo_train::ReduceOp::Max)?;
        Ok((any[0] == 0.0, any[1] > 0.0))
    }

    /// Whether the run was asked to stop: Ctrl-C in this process, or the
    /// stop file.
    fn stop_requested(&self) -> bool {
        self.stop_request.requested() || self.stop_file.as_ref().is_some_and(|f| f.exists())
    }

    /// Each sample's value of dynamic sampling's `metric`.
    fn filter_values(&self, metric: &FilterMetric, s: &Sampled) -> Result<Vec<f64>> {
        (s.scored.iter().enumerate())
            .map(|(i, sc)| match metric {
                FilterMetric::Acc => Ok(match sc.extra.get("acc") {
                    Some(&acc) => acc,
                    None => f64::from(u8::from(sc.score >= eval::RIGHT)),
                }),
                FilterMetric::Score => Ok(f64::from(sc.score)),
                FilterMetric::SeqReward | FilterMetric::SeqFinalReward => {
                    Ok(f64::from(training_score(&s.scored, &s.penalties, i)))
                }
                FilterMetric::Extra(name) => sc.extra.get(name).copied().ok_or_else(|| {
                    let returned: Vec<&str> = sc.extra.keys().map(String::as_str).collect();
                    Error::Reward(reward::Error::Setup {
                        reward: self.reward.name(),
                        reason: format!(
                            "algorithm.filter_groups.metric = {name:?} names a number the reward \
                             returns beside its score, and it returned none for sample {i} \
                             (prompt {}); it returned {}",
                            s.rollouts.prompt_ids[i],
                            match returned.is_empty() {
                                true => "only its score".to_owned(),
                                false => returned.join(", "),
                            }
                        ),
                    })
                }),
            })
            .collect()
    }
}

/// What the step drew from the training data.
#[derive(Default)]
pub(super) struct Drawn {
    /// Generation batches (verl's `train/num_gen_batches`).
    pub(super) batches: usize,
    /// The last one's epoch.
    pub(super) epoch: usize,
}
