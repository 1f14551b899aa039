"""Nothing of a local run leaves this machine (issue 34): a two-worker
`colo train` with a `[cluster]` section and no address, every socket of
every process of the run watched from its start to its end, and every
address must be loopback (127.0.0.0/8, or ::1). Listening on every
interface (0.0.0.0, ::) counts as outside, as does any connection to the
cloud metadata address, 169.254.169.254.

Two watchers, because neither sees everything. The test polls the sockets
of the run's processes every 50 ms (/proc/net/{tcp,tcp6,udp,udp6}, matched
to the processes through /proc/PID/fd): it sees the sockets of every
process, Ray's C++ servers and the workers' torch.distributed included,
that live longer than a poll. And an audit hook (`sys.addaudithook`),
installed through PYTHONPATH in every Python process of the run, records
each bind, connect and send of Python code as it happens, however short:
the kind of request Ray's dashboard makes to the metadata address takes a
few milliseconds. The run's processes are those whose environment holds
this test's marker (every process the run starts inherits it), so other
programs on the machine do not count.

Run: `./x pytest nothing_leaves`.
"""

import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

from test_data_parallel import colo_binary, write_config

# The audit hook, as a `sitecustomize` module: every Python process started
# with its directory on PYTHONPATH imports it first. It writes one line per
# event, and one when the process starts (so the test knows which processes
# it watched); it never raises (an audit hook's exception would fail the
# call it audits).
SITECUSTOMIZE = r'''
import json, os, sys

_LOG = os.environ.get("COLO_NET_WATCH_LOG")


def _write(record):
    record["pid"] = os.getpid()
    record["argv"] = " ".join(sys.argv)[:300]
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _hook(event, args):
    try:
        if event in ("socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg"):
            address = args[1]
            if isinstance(address, tuple) and len(address) >= 2 and isinstance(address[0], str):
                _write({"event": event, "host": address[0], "port": address[1]})
        elif event == "socket.getaddrinfo":
            host = args[0].decode() if isinstance(args[0], bytes) else args[0]
            _write({"event": event, "host": host, "port": str(args[1])})
    except Exception:
        pass


if _LOG:
    _write({"event": "start"})
    sys.addaudithook(_hook)
'''

# TCP states in /proc/net/tcp (include/net/tcp_states.h).
TCP_STATES = {
    "01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
    "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
    "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
}


def hex_address(text):
    """An address of /proc/net/{tcp,udp}[6] ("0100007F:1F90": the host's
    byte order, 32 bits at a time) as (ipaddress, port)."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw), int(port, 16)


def outside(ip):
    """Whether an address is anything but this machine's loopback
    (the unspecified address, listening on every interface, included)."""
    if isinstance(ip, str):
        try:
            ip = ipaddress.ip_address(ip)
        except ValueError:
            return ip != "localhost"  # a name, other than this machine's
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_loopback


class SocketWatch:
    """Polls the sockets of the processes whose environment holds `marker`
    every `every` seconds, from `start()` to `stop()`. `seen` maps each
    socket (proto, local, remote, state) to the command lines of the
    processes it was seen in."""

    def __init__(self, marker, every=0.05):
        self.marker = marker.encode()
        self.every = every
        self.seen = {}
        self.polls = 0
        self._ours = {}  # pid -> whether it is one of the run's
        self._added = set()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()

    def add(self, pid):
        """Watches `pid` whatever its environment (a process whose
        environment was read before its `exec` shows its parent's)."""
        with self._lock:
            self._added.add(pid)
            self._ours.pop(pid, None)

    def stop(self):
        self._done.set()
        self._thread.join()

    def _run(self):
        while not self._done.is_set():
            self.poll()
            self._done.wait(self.every)
        self.poll()

    def _name(self, pid):
        """The process's command line if it is one of the run's, else None."""
        with self._lock:
            return self._lookup(pid)

    def _lookup(self, pid):
        try:
            if pid not in self._ours:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read()
                if not environ and pid not in self._added:
                    return None  # in its exec, or exiting: asked again next time
                self._ours[pid] = pid in self._added or self.marker in environ.split(b"\0")
            if not self._ours[pid]:
                return None
            # Read each time: a process caught between its fork and its
            # exec still shows its parent's.
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
        except OSError:
            return None  # gone (asked again if the number shows up again)

    def poll(self):
        inodes = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            name = self._name(int(entry))
            if name is None:
                continue
            try:
                fds = os.listdir(f"/proc/{entry}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    link = os.readlink(f"/proc/{entry}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = name
        for proto in ("tcp", "tcp6", "udp", "udp6"):
            try:
                with open(f"/proc/net/{proto}") as f:
                    rows = f.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                if len(cols) < 10 or cols[9] not in inodes:
                    continue
                local, remote = hex_address(cols[1]), hex_address(cols[2])
                state = TCP_STATES.get(cols[3], cols[3]) if proto.startswith("tcp") else "UDP"
                key = (proto, local, remote, state)
                self.seen.setdefault(key, set()).add(inodes[cols[9]])
        self.polls += 1

    def outside(self):
        """The sockets with an address outside the loopback, as text."""
        found = []
        for (proto, (lip, lport), (rip, rport), state), names in sorted(self.seen.items(), key=str):
            if lport == 0 and rport == 0:
                continue  # neither bound nor connected yet
            connected = rport != 0
            if outside(lip) or (connected and outside(rip)):
                found.append(f"{proto} {state} {lip}:{lport} -> {rip}:{rport} in {sorted(names)}")
        return found


def audit_outside(records):
    """The audited calls that bind, connect or send outside the loopback
    (binding the unspecified address, every interface, included), or look
    up a name that only a name server answers, as text."""
    found = []
    for r in records:
        if r["event"] == "start":
            continue
        if r["event"] == "socket.getaddrinfo":
            # (No name, or "": the local addresses to bind; nothing is asked.)
            if r["host"] and outside(r["host"]) and r["host"] not in local_names():
                found.append(f"look-up of {r['host']!r} by process {r['pid']} ({r['argv'][:100]})")
        elif outside(r["host"] or "0.0.0.0"):
            found.append(f"{r['event']} {r['host'] or '(every interface)'}:{r['port']} by process {r['pid']} ({r['argv'][:100]})")
    return found


def local_names():
    """The names this machine answers itself (/etc/hosts with loopback
    addresses, and its host name when listed there)."""
    names = set()
    with open("/etc/hosts") as f:
        for line in f:
            cols = line.split("#")[0].split()
            if len(cols) >= 2 and not outside(cols[0]):
                names.update(cols[1:])
    return names


class NothingLeaves(unittest.TestCase):
    def test_nothing_leaves_this_machine_in_a_local_two_worker_run(self):
        tmp = tempfile.mkdtemp(prefix="colo-net-")
        try:
            hook = os.path.join(tmp, "hook")
            os.makedirs(hook)
            with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
                f.write(SITECUSTOMIZE)
            log = os.path.join(tmp, "audit.jsonl")
            marker = f"COLO_NET_WATCH={os.getpid()}-{time.monotonic_ns()}"
            env = dict(os.environ)
            env["COLO_NET_WATCH"] = marker.split("=", 1)[1]
            env["COLO_NET_WATCH_LOG"] = log
            env["PYTHONPATH"] = os.pathsep.join(p for p in (hook, os.environ.get("PYTHONPATH")) if p)

            cfg = write_config(os.path.join(tmp, "run.toml"), total_steps=1, test_freq=0)
            with open(cfg) as f:
                text = re.sub(r"^val_files = .*\n", "", f.read(), flags=re.M)
            with open(cfg, "w") as f:
                f.write(text + '\n[cluster]\nlayout = "1-1-2"\n')

            watch = SocketWatch(marker)
            watch.start()
            try:
                proc = subprocess.Popen(
                    [colo_binary(), "train", "--config", cfg, "--out", os.path.join(tmp, "run")],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                )
                watch.add(proc.pid)
                try:
                    out, err = proc.communicate(timeout=300)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    raise
            finally:
                watch.stop()
            self.assertEqual(proc.returncode, 0, err[-3000:])
            run = os.path.join(tmp, "run")
            self.assertEqual(sorted(os.listdir(os.path.join(run, "workers"))), ["rank-0", "rank-1"])
            with open(os.path.join(run, "metrics.jsonl")) as f:
                self.assertEqual([json.loads(line)["training/global_step"] for line in f], [1])

            with open(log) as f:
                records = [json.loads(line) for line in f]

            # The watchers saw the run: Ray's servers and both workers.
            names = set().union(*watch.seen.values()) if watch.seen else set()
            for process in ("gcs_server", "raylet"):
                self.assertTrue(any(process in n for n in names), f"no socket of {process} seen in {watch.polls} polls: {sorted(names)}")
            workers = {r["pid"] for r in records if r["event"] == "start" and "default_worker.py" in r["argv"]}
            self.assertGreaterEqual(len(workers), 2, "the audit hook ran in both workers")

            leaks = watch.outside() + audit_outside(records)
            self.assertEqual(leaks, [], "sockets outside 127.0.0.0/8:\n" + "\n".join(leaks))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
