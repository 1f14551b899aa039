"""colo: colocated RL post-training.

`colo._colo.Worker` is one data-parallel rank (the hybrid worker: actor,
rollout engine and reference on one device); `colo.controller` drives N of
them on Ray, with gradients all-reduced through torch.distributed.
"""

# libtorch must be loaded (and its CPU allocator registered) by torch's own
# import before colo's extension module, which links the same libtorch.
import torch  # noqa: F401

from colo._colo import Worker  # noqa: E402
from colo.views import views  # noqa: E402

__all__ = ["Worker", "views"]
