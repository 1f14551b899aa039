"""The single controller of a data-parallel colo run, on Ray.

This file is to N devices what `crates/rl/src/step.rs` is to one: read it
top to bottom. The design is verl's (HybridFlow): placement groups of one
bundle per device, one `STRICT_PACK` group per node (the colocated roles
of a device are fused into one worker process), one worker actor per
bundle holding actor, rollout engine and reference (`colo._colo.Worker`),
torch.distributed for the data plane (gloo on CPUs, NCCL on GPUs — run
with one GPU so far; the ranks meet through a file on this machine alone,
through rank 0's address, published through Ray, on a cluster), and
this process driving the dataflow:

    for each step:
        every worker: generate its share of the prompts (whole GRPO
        groups), score, compute advantages, update the actor with
        gradients summed over the workers (inside the step, through
        torch.distributed)
        controller: aggregate the metrics (verl's names), check that the
        weights agree (a digest every `digest_every` steps, default 10, and at
        the end: each digest copies every weight to the host), evaluate and
        checkpoint (every worker is asked; rank 0 writes)

Ctrl-C stops the run after the step under way, with a checkpoint of it,
as on one device; a second stops it at once (`Interrupts`: the request
is a file, which `colo train` writes on the terminal's Ctrl-C, keeping the
signal from this process and Ray's).

A worker that dies or raises stops the run within `step_timeout` seconds
with an error naming the worker and the step; a checkpoint is only ever
written complete (atomically, by colo-rl), so `--resume` continues from
the last one.

Metric aggregation over workers (each worker's step records its own
prompts): `timing_s/*` the slowest worker (the step waits for it);
`*/max`, `*/min` the extreme; `actor/*` rank 0's (the trainer already
reduced them over the global batch); `reward/failures`, `perf/throughput`
the sum; `memory/peak_device_bytes`, `memory/peak_allocated_bytes` and a
sharded run's `perf/reshard_sent_bytes`, `perf/reshard_recv_bytes` (the
bytes a worker's all-gathers moved in the step's switch to rollout, every
worker's alike) the largest; everything else the mean
(shards are of equal size). Added: `timing_s/controller` (the step's wall
time beyond the slowest worker), `timing_s/all_reduce` (the time inside
gradient all-reduces: the transfer, as the worker that
arrived last saw it), `timing_s/all_reduce_wait` (how long the first
waited for the slowest), `perf/all_reduce_bytes`; for a sharded run the
same of its weight all-gathers and gradient reduce-scatters
(`timing_s/all_gather`, `timing_s/all_gather_wait`,
`perf/all_gather_bytes`, `perf/all_gather_calls`, and `reduce_scatter`'s),
absent where there were none (`comm_record`).

Without `cluster.address` the run starts Ray on this machine alone
(`start_local_ray`): every socket of the run, Ray's and the workers',
is on 127.0.0.1, and nothing is sent anywhere. With an address, the
cluster decides (see the README).
"""

import argparse
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from datetime import timedelta

import ray
from ray._private import ray_constants
from ray._private.node import Node
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from colo._colo import (
    StepInterrupted,
    check_fresh_start,
    check_layout,
    draw_workers,
    eval_record,
    fmt_bytes,
    latest_checkpoint,
    resume_notes,
    truncate_metrics,
)


class RunError(RuntimeError):
    """A run that cannot start or could not finish; the message says why."""


class StepCutShort(RunError):
    """Every worker ended the step unfinished at the run's stop request
    (`colo._colo.StepInterrupted`): nothing of the step trained."""


class Interrupts:
    """How a run is asked to stop, as `colo train` on one device takes it.

    The request is a file, `path`: written by the first SIGINT here, or by
    `colo train`, which keeps the terminal's Ctrl-C to itself and writes
    it (also while this process is still starting). The controller reads
    it between steps, and the workers between generation batches (a worker
    busy with a step can read a file, not answer a call): the run stops
    after the step under way, with a checkpoint. The second SIGINT (the
    first, once the file exists: `colo train` sends its second Ctrl-C so)
    raises KeyboardInterrupt, so the run stops at once: the actors are
    killed and the Ray this process started is shut down, further SIGINTs
    ignored meanwhile. (Not SIGTERM: Ray's core sets its own handler for
    it in the driver, which ends the process without that clean-up.) The
    handler is installed only from the main thread, where Python runs it,
    and restored on exit; `checkpoint` is the newest complete checkpoint's
    step and `under_way` the step running (None between steps), for the
    closing message."""

    def __init__(self, path):
        self.path = path
        self.checkpoint = None
        self.under_way = None
        self._previous = {}

    @property
    def requested(self):
        return os.path.exists(self.path)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        if not self.requested:
            open(self.path, "w").close()
            # os.write: print() may be the call the signal interrupted.
            os.write(2, b"\ncolo train: stopping after the step under way, with a checkpoint (interrupt again to stop at once)\n")
            return
        for sig in self._previous:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt


class StoppedNow(KeyboardInterrupt):
    """The run stopped at once (a second Ctrl-C); `checkpoint`
    is the newest complete checkpoint's step, or None; `under_way` the step
    it cut short, or None (between steps: nothing is lost)."""

    def __init__(self, checkpoint, under_way=None):
        super().__init__(checkpoint)
        self.checkpoint = checkpoint
        self.under_way = under_way


@ray.remote
class WorkerActor:
    """One device: a `colo._colo.Worker` and its torch.distributed rank."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.worker = None
        self.comm = None
        self.fault = None

    def host(self):
        """This node's address: 127.0.0.1 on a Ray started here."""
        return ray.util.get_node_ip_address()

    def free_port(self):
        """A free port on this node, for rank 0's rendezvous on a cluster."""
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def node(self):
        """The Ray node this worker runs on."""
        return ray.get_runtime_context().get_node_id()

    def setup(self, config, out, master, backend, timeout_s, resume_from=None, fault=None, stop_file=None):
        import torch.distributed as dist

        from colo import Worker
        from colo._colo import rollout_tensor_parallel
        from colo.comm import GroupComm, TorchComm

        timeout = timedelta(seconds=timeout_s)
        if master[0] == "file":
            # Every rank is on this machine: gloo's and NCCL's own sockets
            # go on the loopback interface too (by default gloo binds the
            # address the host name resolves to, NCCL its first interface
            # other than loopback), unless the environment names another.
            for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                os.environ.setdefault(var, "lo")
            store = dist.FileStore(master[1], self.world)
            store.set_timeout(timeout)
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world, timeout=timeout)
        else:
            _, addr, port = master
            dist.init_process_group(
                backend, init_method=f"tcp://{addr}:{port}", rank=self.rank, world_size=self.world, timeout=timeout
            )
        self.comm = TorchComm()
        # Tensor-parallel rollout groups of `tg` consecutive ranks: every
        # rank makes every group, in the same order (torch.distributed's
        # rule), and talks in its own.
        tg = rollout_tensor_parallel(config)
        self.tp_comm = None
        if tg > 1:
            groups = [dist.new_group(list(range(g, g + tg))) for g in range(0, self.world, tg)]
            self.tp_comm = GroupComm(groups[self.rank // tg])
        self.worker = Worker(config, out, self.rank, self.world, self.comm, resume_from, self.tp_comm)
        if stop_file is not None:
            self.worker.set_stop_file(stop_file)
        self.fault = fault if fault and fault.get("rank") == self.rank else None
        return self.worker.schedule()

    def step(self, step):
        faulty = self.fault and self.fault["step"] == step
        if faulty:
            if self.fault["how"] == "exit":
                os._exit(1)  # a worker process that dies mid-run
            if self.fault["how"] == "exit_in_gather":
                # Dies inside the step's `gather`-th weight all-gather
                # (1-based), its peers waiting in the same collective.
                self.comm.exit_in_gather(self.fault.get("gather", 1))
            elif self.fault["how"] == "drift":
                # One weight nudged on this worker only: the ranks disagree.
                name, _, values = self.worker.weights()[0]
                self.worker.load_weights([(name, [v + 1e-3 for v in values])])
            else:
                raise RuntimeError(f"injected failure at step {step}")
        t = time.perf_counter()
        metrics = json.loads(self.worker.step(step))
        wall = time.perf_counter() - t
        if faulty and self.comm.exit_pending() is not None:
            left = self.comm.exit_pending()
            raise RuntimeError(
                f"fault exit_in_gather: gather {self.fault.get('gather', 1)} of step {step + 1} asked for, "
                f"but the step made {self.fault.get('gather', 1) - left} (a sharded run gathers; a replicated one does not)"
            )
        stats = self.comm.take_stats()
        if self.tp_comm is not None:
            stats["tp_all_reduce"] = self.tp_comm.take_stats()
        return metrics, wall, stats

    def evaluate(self):
        return self.worker.evaluate()

    def save(self, step):
        # Called on every rank: rank 0 writes, a sharded rank takes part in
        # gathering the weights.
        self.worker.save(step)

    def load(self, step):
        self.worker.load(step)

    def digest(self):
        return self.worker.weights_digest()

    def parameters(self):
        return self.worker.parameters()

    def memory(self):
        return json.loads(self.worker.memory())

    def finish(self):
        return self.worker.finish()


# ---- aggregation -------------------------------------------------------------


# Figures of each worker whose record is the largest worker's.
PER_WORKER_MAX = (
    "memory/peak_device_bytes",
    "memory/peak_allocated_bytes",
    "perf/reshard_sent_bytes",
    "perf/reshard_recv_bytes",
)


def step_line(done, total, record, wall):
    """The console line of a finished step: score, loss, wall time, and a
    sharded run's reshard (the bytes a worker sent and received in the
    step's switch to rollout)."""
    line = f"step {done}/{total}: score {record['critic/score/mean']:.3f}, loss {record['actor/pg_loss']:.4f}, {wall:.2f} s"
    sent, received = record.get("perf/reshard_sent_bytes"), record.get("perf/reshard_recv_bytes")
    if sent is not None and received is not None:
        line += f", reshard {fmt_bytes(sent)} sent / {fmt_bytes(received)} received per worker"
    return line


def aggregate(per_worker):
    """One record from the workers' step records (rules in the module doc)."""
    out = {}
    for key in per_worker[0]:
        values = [m[key] for m in per_worker if m.get(key) is not None]
        if not values or not all(isinstance(v, (int, float)) for v in values):
            out[key] = per_worker[0][key]
        elif key.startswith("timing_s/") or key.endswith("/max"):
            out[key] = max(values)
        elif key.endswith("/min"):
            out[key] = min(values)
        elif key.startswith("actor/") or key.startswith("training/"):
            out[key] = per_worker[0][key]
        elif key in ("reward/failures", "perf/throughput"):
            out[key] = sum(values)
        elif key in PER_WORKER_MAX:
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    return out


# ---- Ray on this machine alone -----------------------------------------------

# The environment of a Ray started here; its processes and the workers they
# start inherit it. The first is Ray's switch for a machine outside any
# cluster (on by default on macOS and Windows): Ray then binds and
# publishes 127.0.0.1, and does not look for the machine's outward address
# (`ray._private.services.get_node_ip_address`).
LOCAL_RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def _loopback(host):
    """Whether `host` (an address as Ray gives it) is this machine's
    loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@contextlib.contextmanager
def on_this_machine():
    """Ray started inside this block (`ray.init` without an address, or
    `ray.cluster_utils.Cluster`) is on this machine alone: every socket of
    its processes, and of the workers they start, is on 127.0.0.1, and it
    sends nothing anywhere. For its processes, `LOCAL_RAY_ENV`; for this
    one, the same switch (Ray read the variable when it was imported).

    And no dashboard head. Ray 2.60 starts that process even with
    `include_dashboard=False`, for its usage statistics module alone,
    which asks the cloud metadata address (169.254.169.254, and
    metadata.google.internal) which cloud it runs on whether the
    statistics are on or off (`UsageStatsHead.run`). Ray carries on
    without it, as it does when the dashboard fails to start; colo uses
    none of what it serves (the dashboard, jobs, the state API).

    All three are undone on leaving: a Ray started later joins a cluster
    as usual, and the processes started here keep their environment."""
    saved_env = {k: os.environ.get(k) for k in LOCAL_RAY_ENV}
    saved_cluster, saved_api = ray_constants.ENABLE_RAY_CLUSTER, Node.start_api_server
    os.environ.update(LOCAL_RAY_ENV)
    ray_constants.ENABLE_RAY_CLUSTER = False
    Node.start_api_server = lambda self, **_: None
    try:
        yield
    finally:
        Node.start_api_server = saved_api
        ray_constants.ENABLE_RAY_CLUSTER = saved_cluster
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_local_ray(num_cpus):
    """Ray on this machine alone (`on_this_machine`) with `num_cpus` CPU
    slots, as a run without `cluster.address` starts it; `ray.shutdown()`
    stops it."""
    with on_this_machine():
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")


# ---- the run -----------------------------------------------------------------


def _gather(refs, actors, what, timeout_s, grace_s=5.0):
    """`ray.get` of one call per worker. A worker that dies or raises, or
    that takes longer than `timeout_s`, stops the run with an error naming
    it. After a first failure the others get `grace_s` to report, so the
    cause is named rather than its echo: a dead peer makes the survivors'
    all-reduce fail too ("connection reset"), which is listed after it."""
    pending = {ref: rank for rank, ref in enumerate(refs)}
    results = [None] * len(refs)
    failures = []  # (priority, rank, text): 0 died, 1 raised, 2 collective echo, 3 stop request
    deadline = time.monotonic() + timeout_s
    while pending:
        left = deadline - time.monotonic()
        # At most a second in Ray's wait, so a signal's handler runs soon.
        done, _ = ray.wait(list(pending), num_returns=1, timeout=min(max(left, 0), 1.0))
        if not done:
            if left > 1.0:
                continue
            if failures:
                break
            ranks = sorted(pending.values())
            raise RunError(f"{what}: worker(s) {ranks} did not answer within {timeout_s:.0f} s")
        ref = done[0]
        rank = pending.pop(ref)
        try:
            results[rank] = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            failures.append((0, rank, f"died ({type(e).__name__})"))
        except ray.exceptions.RayTaskError as e:
            cause = (str(e.cause) if e.cause is not None else str(e)).strip()
            echo = "collective" in cause or "gloo" in cause
            priority = 3 if isinstance(e.cause, StepInterrupted) else 2 if echo else 1
            failures.append((priority, rank, f"failed: {cause}"))
        if failures:
            deadline = min(deadline, time.monotonic() + grace_s)
    if failures:
        # Workers that failed alike are named together, once.
        failures.sort()
        said = {}
        for priority, rank, text in failures:
            said.setdefault((priority, text), []).append(rank)
        parts = [
            (f"worker {ranks[0]}" if len(ranks) == 1 else "workers " + ", ".join(map(str, ranks))) + f" {text}"
            for (_, text), ranks in sorted(said.items(), key=lambda kv: (kv[0][0], kv[1][0]))
        ]
        cut_short = all(priority == 3 for priority, _, _ in failures)
        raise (StepCutShort if cut_short else RunError)(f"{what}: " + "; then ".join(parts))
    return results


def _reachable(address, timeout_s=5.0):
    """Whether a `host:port` (or `ray://host:port`) address accepts a TCP
    connection: `ray.init` itself retries an unreachable address for
    minutes."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise RunError(f"cluster.address = {address!r}: expected \"auto\" or host:port")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def _placement_groups(workers, bundle, timeout_s=60):
    """verl's resource pool: one `STRICT_PACK` placement group per node,
    each with as many bundles as the node holds (fullest nodes first), so
    that a worker's colocated roles share its node and ranks run node by
    node. Returns [(group, bundles)]; ranks follow that order."""
    per_node = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        r = node["Resources"]
        fits = min(int(r.get(k, 0) // v) for k, v in bundle.items())
        if fits > 0:
            per_node.append((fits, node["NodeID"]))
    total = sum(f for f, _ in per_node)
    if total < workers:
        have = ray.cluster_resources()
        kind = next((k for k, v in bundle.items() if have.get(k, 0) < workers * v), "CPU")
        raise RunError(
            f"cluster.workers = {workers} needs {workers * bundle[kind]} {kind} slots; "
            f"the Ray cluster has {have.get(kind, 0):g}"
        )
    per_node.sort(key=lambda x: -x[0])
    groups, left = [], workers
    for fits, node_id in per_node:
        if left == 0:
            break
        n = min(fits, left)
        pg = placement_group([bundle] * n, strategy="STRICT_PACK", _soft_target_node_id=node_id)
        groups.append((pg, n))
        left -= n
    for pg, n in groups:
        if not pg.wait(timeout_seconds=timeout_s):
            for g, _ in groups:
                remove_placement_group(g)
            raise RunError(f"a placement group of {n} bundles could not be placed in {timeout_s} s")
    return groups


def _rendezvous(rank0):
    """Where the workers' torch.distributed meets: ("file", path) when
    rank 0's node is 127.0.0.1 (Ray on this machine alone: every worker is
    here), else ("tcp", rank 0's node address, a free port there).

    A file, torch's FileStore, and not a TCP store on 127.0.0.1: the TCP
    store's clients connect through the IPv4-mapped IPv6 address
    (::ffff:127.0.0.1) and name it with `getnameinfo` first (c10d's
    socket.cpp, even with its logs off), which /etc/hosts rarely answers:
    each worker would ask the machine's name server who 127.0.0.1 is."""
    host = ray.get(rank0.host.remote())
    if _loopback(host):
        return ("file", os.path.join(tempfile.mkdtemp(prefix="colo-rendezvous-"), "store"))
    return ("tcp", host, ray.get(rank0.free_port.remote()))


def _connect(address, workers):
    """Ray: the given cluster, or a local one started here (stopped at the
    end). Returns whether this call started it."""
    if ray.is_initialized():
        return False
    if address not in (None, "auto") and not _reachable(address):
        raise RunError(f"cluster.address = {address!r}: no Ray cluster reachable (connection refused or timed out)")
    if address is None:
        start_local_ray(workers)
        return True
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RunError(f"cluster.address = {address!r}: no Ray cluster reachable ({e})") from None
    return False


def train(
    config,
    out,
    workers,
    address=None,
    resume=False,
    digest_every=10,
    step_timeout=600.0,
    fault=None,
    keep_parameters=False,
    log=print,
    stop_file=None,
):
    """Runs `config` (a TOML path, or None for the built-in job) on
    `workers` devices into `out`. Returns a summary dict. `fault`
    ({"rank", "step", "how": "exit"|"exit_in_gather"|"raise"|"drift"},
    `step` 0-based) injects a failure (exit_in_gather: the worker's
    process ends inside its `fault["gather"]`-th all-gather of the step,
    default 1, of a sharded run; drift: that worker's weights are nudged,
    so the ranks disagree), and
    `keep_parameters` returns rank 0's final weights, for tests.
    `stop_file`: the file whose existence asks the run to stop (see
    `Interrupts`; `colo train` names one and writes it on Ctrl-C); without
    it, one in `out` named for this process. A run asked to stop returns
    with `stopped` set to the steps done and `checkpoint` to its newest
    checkpoint's step; one stopped at once raises `StoppedNow`."""
    if workers < 1:
        raise RunError(f"cluster.workers = {workers}: at least 1")
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    config = os.path.abspath(config) if config else None
    try:
        device = check_layout(config, workers)
    except (ValueError, RuntimeError) as e:  # a layout that does not divide; a bad config
        raise RunError(str(e)) from None
    latest = None
    if resume:
        latest, skipped = latest_checkpoint(config, out)
        for note in skipped:
            log(f"--resume: {note} is not a complete checkpoint; skipped")
    if latest is None:
        try:
            check_fresh_start(out, resume)  # nothing of an earlier run is overwritten
        except RuntimeError as e:
            raise RunError(str(e)) from None
        if resume:
            log(f"--resume: no complete checkpoint in {out}/checkpoints; starting from scratch")
    else:
        for note in resume_notes(config, out, latest):
            log(note)
    own = stop_file is None
    if own:
        stop_file = os.path.join(out, f".colo-stop-{os.getpid()}")
        if os.path.exists(stop_file):
            os.remove(stop_file)  # an earlier process's, with this one's id
    with Interrupts(stop_file) as stop:
        stop.checkpoint = latest
        try:
            return _run(config, out, workers, address, latest, device, digest_every, step_timeout, fault, keep_parameters, log, stop)
        except KeyboardInterrupt:
            raise StoppedNow(stop.checkpoint, stop.under_way) from None
        finally:
            if own and os.path.exists(stop_file):
                os.remove(stop_file)


def _run(config, out, workers, address, latest, device, digest_every, step_timeout, fault, keep_parameters, log, stop):
    """`train` once the run directory is checked: Ray, the workers, the steps."""
    started = _connect(address, workers)
    groups = []
    actors = []
    master = None
    try:
        # One bundle per device: a CPU slot, and a GPU for a CUDA run (Ray
        # then shows each worker its own GPU as cuda:0). gloo on CPUs,
        # NCCL on GPUs.
        bundle = {"CPU": 1, "GPU": 1} if device == "cuda" else {"CPU": 1}
        backend = "nccl" if device == "cuda" else "gloo"
        groups = _placement_groups(workers, bundle)
        slots = [(pg, i) for pg, n in groups for i in range(n)]
        actors = [
            WorkerActor.options(
                num_cpus=1,
                num_gpus=bundle.get("GPU", 0),
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=i
                ),
            ).remote(rank, workers)
            for rank, (pg, i) in enumerate(slots)
        ]
        master = _rendezvous(actors[0])
        schedules = _gather(
            [a.setup.remote(config, out, master, backend, step_timeout, latest, fault, stop.path) for a in actors],
            actors,
            "setup",
            step_timeout,
        )
        summary = _steps(actors, out, schedules[0], latest, digest_every, step_timeout, log, stop)
        summary["nodes"] = ray.get([a.node.remote() for a in actors])
        if keep_parameters:
            # Every worker is asked (a sharded run's weights are gathered
            # from all of them); rank 0's answer is kept.
            summary["parameters"] = ray.get([a.parameters.remote() for a in actors])[0]
        return summary
    finally:
        for a in actors:
            ray.kill(a)
        for pg, _ in groups:
            remove_placement_group(pg)
        if started:
            ray.shutdown()
        if master is not None and master[0] == "file":
            shutil.rmtree(os.path.dirname(master[1]), ignore_errors=True)


def comm_record(record, stats):
    """Adds the communicator's figures to a step's `record` from each
    worker's `TorchComm.take_stats()`: per kind of collective the least of
    the workers' seconds (the worker that arrived last waited least: its
    time is the transfer), the most minus the least (waiting for the
    slowest), and rank 0's bytes. The all-gathers and reduce-scatters of a
    sharded run, and a tensor-parallel rollout's all-reduces
    (`tp_all_reduce`, from `GroupComm`), with their count, only where there
    were some."""
    for op in ("all_reduce", "all_gather", "reduce_scatter", "tp_all_reduce"):
        if op != "all_reduce" and not (op in stats[0] and stats[0][op][2]):
            continue
        seconds = [s[op][0] for s in stats]
        record[f"timing_s/{op}"] = min(seconds)
        record[f"timing_s/{op}_wait"] = max(seconds) - min(seconds)
        record[f"perf/{op}_bytes"] = stats[0][op][1]
        if op != "all_reduce":
            record[f"perf/{op}_calls"] = stats[0][op][2]


def _steps(actors, out, schedule, latest, digest_every, timeout, log, stop):
    """The run from `latest` (the checkpoint to resume from, or None), until
    its last step or, when `stop.requested`, the step under way."""
    total, save_freq, test_freq, val_before_train = schedule
    metrics_path = os.path.join(out, "metrics.jsonl")
    first = 0
    if latest is not None:
        if latest > total:
            raise RunError(
                f"--resume: the newest checkpoint is at step {latest}, beyond trainer.total_steps = {total}; "
                f"continuing would overwrite newer checkpoints with older steps. Set trainer.total_steps "
                f"to at least {latest}, or use another run directory"
            )
        first = latest
        _gather([a.load.remote(first) for a in actors], actors, "load", timeout)
        truncate_metrics(metrics_path, first)
        log(f"--resume: continuing from step {first} of {total}")
    records = open(metrics_path, "a" if first else "w")

    def write(record):
        records.write(json.dumps(record) + "\n")
        records.flush()

    def save(step):
        # Every worker: rank 0 writes the checkpoint; a sharded run's ranks
        # gather the weights it writes.
        _gather([a.save.remote(step) for a in actors], actors, f"checkpoint at step {step}", timeout)
        stop.checkpoint = step

    def evaluate(step):
        t = time.perf_counter()
        parts = _gather([a.evaluate.remote() for a in actors], actors, f"evaluate at step {step}", timeout)
        record = eval_record(step, parts, time.perf_counter() - t)
        if record is None:
            return None  # no held-out set: the run does not evaluate
        records.write(record + "\n")
        records.flush()
        return json.loads(record)["eval/accuracy"]

    history = []
    # (Asked to stop during the start-up: nothing is written, so the
    # directory can hold a new run.)
    first_accuracy = evaluate(0) if first == 0 and val_before_train and not stop.requested else None
    last_accuracy = first_accuracy
    stopped, unfinished = None, False
    for step in range(first, total):
        if stop.requested:  # during the start-up: nothing new to save
            stopped = step
            break
        t = time.perf_counter()
        stop.under_way = step + 1
        try:
            results = _gather([a.step.remote(step) for a in actors], actors, f"step {step + 1}", timeout)
        except StepCutShort:
            # Dynamic sampling still drawing batches when asked: every
            # worker ended the step together, nothing of it trained, and
            # went back to where it began (the training phase, the step's
            # first generation batch). The steps finished since the last
            # checkpoint are kept, as `colo train` on one device keeps them.
            stopped, unfinished = step, True
            if step > first and stop.checkpoint != step:
                save(step)
            stop.under_way = None
            break
        wall = time.perf_counter() - t
        record = aggregate([r[0] for r in results])
        record["timing_s/controller"] = max(wall - max(r[1] for r in results), 0.0)
        comm_record(record, [r[2] for r in results])
        record["timing_s/step_wall"] = wall
        done = step + 1
        if digest_every and (done % digest_every == 0 or done == total or stop.requested):
            digests = _gather([a.digest.remote() for a in actors], actors, f"digest at step {done}", timeout)
            if len(set(digests)) != 1:
                raise RunError(f"step {done}: the workers' weights differ (digests {digests})")
        write(record)
        history.append(record)
        saved = bool(save_freq) and done % save_freq == 0 and done < total
        if saved:
            save(done)
        stop.under_way = None
        if test_freq and done % test_freq == 0 and done < total:
            last_accuracy = evaluate(done)
        log(step_line(done, total, record, wall))
        if stop.requested and done < total:
            if not saved:  # (the end of the run saves anyway)
                save(done)
            stopped = done  # no end-of-run evaluation
            break
    if first < total and stopped is None:
        last_accuracy = evaluate(total)
        save(total)
    finished = _gather([a.finish.remote() for a in actors], actors, "timelines", timeout)
    dirs = [d for d, _ in finished]
    capacity = finished[0][1]
    draw_workers(out, dirs, capacity if capacity < 2**63 else None)
    records.close()
    return {
        "out": out,
        "steps": total if stopped is None else stopped,
        "total_steps": total,
        "stopped": stopped,
        "unfinished_step": unfinished,
        "checkpoint": stop.checkpoint,
        "resumed_from": first or None,
        "first_accuracy": first_accuracy,
        "last_accuracy": last_accuracy,
        "history": history,
        "worker_dirs": dirs,
        "workers": len(actors),
    }


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m colo.controller", description=__doc__.split("\n")[0])
    p.add_argument("--config", help="run config (TOML); the built-in job without it")
    p.add_argument("--out", default="runs/colo", help="run directory")
    p.add_argument("--workers", type=int, required=True, help="devices (one worker each)")
    p.add_argument("--address", help='a Ray cluster ("auto" or host:port); a local one without it')
    p.add_argument("--resume", action="store_true")
    p.add_argument("--digest-every", type=int, default=10, help="compare the workers' weights every this many steps (and at the end)")
    p.add_argument("--stop-file", help="a file whose existence asks the run to stop after the step under way (colo train writes it on Ctrl-C)")
    args = p.parse_args(argv)
    config = f"--config {args.config} " if args.config else ""
    resume = f"`colo train {config}--out {os.path.abspath(args.out)} --resume` continues from it"
    try:
        s = train(args.config, args.out, args.workers, args.address, args.resume, args.digest_every, stop_file=args.stop_file)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except StoppedNow as e:
        print(stopped_now_line(e, resume), file=sys.stderr)
        return 130
    if s["stopped"] is not None:
        # Status 130, as a shell reports an interrupted command.
        done, ckpt = s["stopped"], s["checkpoint"]
        if s["unfinished_step"]:
            said = (
                f"during step {done + 1}, which could not finish (dynamic sampling was still "
                "drawing generation batches)"
            )
        elif done == 0:
            said = "before its first step"
        else:
            said = f"after step {done} of {s['total_steps']}"
        if ckpt is not None:
            said += f"; the run directory {s['out']} has a checkpoint of step {ckpt}, and {resume}"
        elif done == 0:
            said += "; nothing was trained"
        else:
            said += f"; the {done} steps done have no checkpoint"
        print(f"colo train: stopped at your request {said}", file=sys.stderr)
        return 130
    print("\n".join(summary_lines(s)))
    return 0


def stopped_now_line(e, resume):
    """What a run stopped at once (`StoppedNow` `e`) says: the step it cut
    short, if one was under way, and the checkpoint that is complete."""
    lost = [] if e.under_way is None else [f"step {e.under_way}, under way, is lost"]
    kept = (
        "no checkpoint was written"
        if e.checkpoint is None
        else f"the checkpoint of step {e.checkpoint} is complete, and {resume}"
    )
    return "colo train: stopped now; " + "; ".join(lost + [kept])


def summary_lines(s):
    """What a finished run on Ray prints, as `colo train` on one device
    says it: `done: 3 steps on 2 workers; held-out accuracy 22.8% -> 34.0%`
    and the files written (those that are there)."""
    out, total = s["out"], s["total_steps"]
    if s["resumed_from"] == total:
        return [f"done: nothing to do, the run in {out} is complete ({total} of {total} steps)"]

    def pct(a):
        return "-" if a is None else f"{100 * a:.1f}%"

    last = s["last_accuracy"]
    first = s["first_accuracy"]
    if first is None and s["resumed_from"]:
        first = _recorded_accuracy(out, 0)
    acc = "no held-out set" if last is None else f"held-out accuracy {pct(first)} -> {pct(last)}"
    steps = s["steps"]
    done = f"done: {steps} step{'' if steps == 1 else 's'} on {s['workers']} workers; {acc}"
    wrote = [
        f"{out}/{name}"
        for name, there in [
            ("metrics.jsonl", "metrics.jsonl"),
            ("memory_workers.{svg,png}", "memory_workers.svg"),
            (f"workers/rank-{{0..{s['workers'] - 1}}}/ (each worker's timeline and pictures)", "workers"),
            ("checkpoints/", "checkpoints"),
            ("config.toml", "config.toml"),
        ]
        if os.path.exists(os.path.join(out, there))
    ]
    return [done, "wrote " + ", ".join(wrote)]


def _recorded_accuracy(out, step):
    """The held-out accuracy `metrics.jsonl` records at `step`, if any."""
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            for line in f:
                r = json.loads(line)
                if "eval/accuracy" in r and r.get("training/global_step") == step:
                    return r["eval/accuracy"]
    except (OSError, ValueError):
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
