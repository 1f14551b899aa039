"""Zero-copy views of a worker's training state as torch tensors.

    with colo.views(worker, "weights") as w:
        w["model.embed_tokens.weight"].mul_(0.5)   # writes the actor's weights

The tensors share the actor's memory (no copy either way). That memory is
released when the worker switches to generation, so the worker refuses to
switch while a view is open, and the block checks on leaving that no
tensor made from it is still referenced (each tensor keeps its buffer's
holder alive: a holder referenced more than when the block began means a
tensor outlived it).
"""

import contextlib
import sys

from colo.comm import holder, tensor_of


@contextlib.contextmanager
def views(worker, what="weights"):
    """{name: tensor} over the actor's "weights", "grads" (the last
    update's, summed over the ranks and clipped as the update used them;
    a switch to generation discards them) or "optimizer" (`<name>.exp_avg`, `<name>.exp_avg_sq`); train
    phase only."""
    items = worker.open_views(what)
    names = [(name, shape, dtype) for name, shape, dtype, _ in items]
    holders = [holder(buf, dtype) for _, _, dtype, buf in items]
    del items
    before = [sys.getrefcount(h) for h in holders]
    tensors = {
        name: tensor_of(h, dtype).view(shape) for (name, shape, dtype), h in zip(names, holders)
    }
    try:
        yield tensors
    except BaseException as e:
        # The block's own exception goes up unchanged (it was replaced by
        # "still referenced": its traceback holds the block's frames, and
        # with them any tensor a local variable names). The views close if
        # nothing holds a tensor from them; otherwise they stay open, the
        # worker locked, and the exception says so in a note.
        tensors.clear()
        if [sys.getrefcount(h) for h in holders] == before:
            _release(holders)
            worker.close_views()
        elif hasattr(e, "add_note"):  # Python 3.11+
            e.add_note(
                f"colo.views(worker, {what!r}): a tensor from the block is still referenced "
                "(by a variable, or this exception's traceback); the views stay open and the "
                "worker locked until it is dropped and worker.close_views() is called"
            )
        raise
    tensors.clear()
    after = [sys.getrefcount(h) for h in holders]  # counted as `before` was
    if after != before:
        raise RuntimeError(
            f"a tensor from colo.views(worker, {what!r}) is still referenced after the block; "
            "the worker stays locked (no phase switch) until it is dropped and "
            "worker.close_views() is called"
        )
    _release(holders)
    worker.close_views()


def _release(holders):
    """Releases the CPU views and drops every holder (in a function of its
    own: a loop variable left in `views` would be a reference the worker's
    close counts)."""
    for h in holders:
        if isinstance(h, memoryview):
            h.release()
    holders.clear()
