//! The forward of GRPO-style batches, where the `n` samples of a prompt
//! share it: each distinct prompt runs through the layers once, and each
//! row runs only its response tokens, attending to its prompt's keys and
//! values and to its own response so far.
//!
//! A transformer's prompt positions do not depend on what follows them
//! (causal attention), so this is exactly the full forward of every
//! `(prompt, response)` row; with `n` samples per prompt it runs about
//! `(P / n + R) / (P + R)` of the tokens (the built-in job: ~40%). It is
//! differentiable like any libtorch composition: a prompt's keys, values
//! and last hidden state are gathered once per row, so their gradients
//! are the sums over the prompt's rows, as in the full forward.
//!
//! The same idea serves prefix-sharing trainers elsewhere (e.g. the
//! "shared prefix" GRPO forwards of recent RL frameworks); here it needs
//! no kernel of its own: the rows' attention is libtorch's fused
//! attention over `[prompt keys ‖ response keys]` under an additive mask
//! that hides the prompt's padding and the response's future.

use tch::Tensor;

use crate::model::Model;
use crate::Result;

/// A batch of responses to shared prompts, on the host.
#[derive(Debug, Clone)]
pub struct SharedPrompts {
    /// The distinct prompts' tokens.
    pub prompts: Vec<Vec<u32>>,
    /// Each row's prompt (an index into `prompts`) and response tokens.
    pub rows: Vec<(usize, Vec<u32>)>,
}

impl Model {
    /// Final-normalised hidden states (rows, 1 + longest response,
    /// hidden): column `j` of row `r` is the hidden state at position
    /// `P − 1 + j`, where `P` is the length of the row's prompt — column 0
    /// the prompt's last token (it predicts the response's first), then
    /// the response's tokens. Columns past a row's response are zero.
    pub fn hidden_states_shared_prompts(&self, batch: &SharedPrompts) -> Result<Tensor> {
        self.stages_shared_prompts(batch)?.run()
    }
}
