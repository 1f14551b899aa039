//! Offloading the trainer's state to host memory between uses, like
//! MindSpeed-RL's `offload_train_param / offload_train_grad /
//! offload_train_optimizer`.
//!
//! Each part lives in its own `colo-mem` tag with the `Backup` policy, so
//! offloading is `pool.pause(tags)`: the contents are copied to host
//! buffers that the pool keeps for the next cycle, and the device memory is
//! released while the addresses stay reserved. Reloading maps fresh memory
//! at the same addresses and restores the contents bit-exactly, so the
//! tensors that point there (the model's parameters) need no rebuilding.

use colo_mem::{tags, Pool, TagState};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Which parts of the trainer's state an offload or reload covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Offload {
    /// Parameters (tag `train_params`).
    pub params: bool,
    /// Gradient accumulators (tag `train_grads`).
    pub grads: bool,
    /// AdamW moments (tag `optimizer`).
    pub optimizer: bool,
}

/// One part: its name in messages and its tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) what: &'static str,
    pub(crate) tag: &'static str,
}

pub(crate) const PARAMS: Part = Part {
    what: "the parameters",
    tag: tags::TRAIN_PARAMS,
};
pub(crate) const GRADS: Part = Part {
    what: "the gradients",
    tag: tags::TRAIN_GRADS,
};
pub(crate) const OPTIMIZER: Part = Part {
    what: "the optimizer state",
    tag: tags::OPTIMIZER,
};

impl Offload {
    pub const NONE: Offload = Offload {
        params: false,
        grads: false,
        optimizer: false,
    };
    pub const PARAMS: Offload = Offload {
        params: true,
        ..Offload::NONE
    };
    pub const GRADS: Offload = Offload {
        grads: true,
        ..Offload::NONE
    };
    pub const OPTIMIZER: Offload = Offload {
        optimizer: true,
        ..Offload::NONE
    };
    pub const ALL: Offload = Offload {
        params: true,
        grads: true,
        optimizer: true,
    };

    /// MindSpeed-RL's switch names.
    pub fn from_mindspeed(
        offload_train_param: bool,
        offload_train_grad: bool,
        offload_train_optimizer: bool,
    ) -> Self {
        Offload {
            params: offload_train_param,
            grads: offload_train_grad,
            optimizer: offload_train_optimizer,
        }
    }

    pub(crate) fn parts(self) -> Vec<Part> {
        [
            (self.params, PARAMS),
            (self.grads, GRADS),
            (self.optimizer, OPTIMIZER),
        ]
        .into_iter()
        .filter_map(|(on, p)| on.then_some(p))
        .collect()
    }

    /// The tags covered.
    pub fn tags(self) -> Vec<&'static str> {
        self.parts().into_iter().map(|p| p.tag).collect()
    }
}

/// Pauses the tags of `what`; each must be resident.
pub(crate) fn offload(pool: &Pool, what: Offload) -> Result<()> {
    transition(pool, what, "offload", TagState::Active, "offloaded")?;
    pool.pause(&what.tags())?;
    Ok(())
}

/// Resumes the tags of `what`; each must be offloaded.
pub(crate) fn reload(pool: &Pool, what: Offload) -> Result<()> {
    transition(pool, what, "reload", TagState::Paused, "resident")?;
    pool.resume(&what.tags())?;
    Ok(())
}

fn transition(
    pool: &Pool,
    what: Offload,
    op: &'static str,
    from: TagState,
    otherwise: &'static str,
) -> Result<()> {
    for p in what.parts() {
        if pool.tag_state(p.tag) != Some(from) {
            return Err(Error::OffloadState {
                op,
                what: p.what,
                tag: p.tag,
                state: otherwise,
            });
        }
    }
    Ok(())
}

/// Errors unless every part in `need` is resident.
pub(crate) fn require_resident(pool: &Pool, op: &'static str, need: &[Part]) -> Result<()> {
    for p in need {
        if pool.tag_state(p.tag) != Some(TagState::Active) {
            return Err(Error::Offloaded {
                op,
                what: p.what,
                tag: p.tag,
            });
        }
    }
    Ok(())
}
