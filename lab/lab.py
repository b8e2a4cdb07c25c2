#!/usr/bin/env python3
"""The lab: Debian bookworm hosts booted with systemd-nspawn, one per inventory host.

Each host is a real systemd system (PID 1 in its own PID namespace) with sshd on its own port on 127.0.0.1,
sharing this machine's network. Its "hardware" is a GPU spec (lab/specs/<lab_gpu_spec>.json) copied to
/etc/fake-nvml/spec.json plus a fake sysfs tree with each GPU's numa_node. The fake driver library is not put
there: the provision stage installs it from the lab's apt repository (build/repo/, served over HTTP by `up`).

    lab.py [-i INVENTORY_DIR] up|down [--purge]|status|ssh-config
    lab.py [-i INVENTORY_DIR] stop HOST|start HOST   (one host: "unreachable" in the lab, and back)
    lab.py down-all [--purge]          (every lab of this checkout: the CI safety net)
    lab.py [-i INVENTORY_DIR] save-layer HOST DIR   (a stopped host's disk becomes a layer other hosts boot from)

State lives in .lab/<inventory basename>/ (pid files, each host's disk as an overlayfs upper dir over the
cached rootfs); the ssh key in .lab/ssh/. The rootfs is built once with debootstrap and cached under
/var/cache/topolaunch/. Needs root (mount, systemd-nspawn). Python stdlib + PyYAML only.

Layers: `save-layer` turns a stopped host's disk (its overlay upper dir) into a layer, DIR/root/ with DIR/layer.json,
less what is each host's own (LAYER_STRIP: host name, machine id, ssh host keys, GPU spec and sysfs, journal...).
A host whose inventory sets `lab_layer: DIR` (absolute, or relative to the inventory directory) boots with that
layer between its own disk and the rootfs (overlayfs lowerdir=DIR/root:ROOTFS): it starts as the host the layer
was saved from was, with its own identity written by `up` as for any host. The lab repository's URL is the one
thing of a provisioned host that names its lab (the cuda-keyring package's sources list, apt's lists): a host on
a layer saved in a lab of another repository port gets the keyring package of its own port (dpkg -i in its root)
and apt's lists under its own URL (same repository, same content). tests/lab/labhosts.py builds the provisioned
layers the lab tests share.

TOPOLAUNCH_LAB_APT_PROXY=URL gives every host an apt proxy (Acquire::http::Proxy; the lab repository on
127.0.0.1 stays direct): for a machine that reaches Debian's mirror only through a proxy or a cache.
"""
import argparse
import concurrent.futures
import contextlib
import errno
import datetime
import fcntl
import fnmatch
import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS_DIR = os.path.join(ROOT, "lab", "specs")
STATE_ROOT = os.path.join(ROOT, ".lab")
SSH_KEY = os.path.join(STATE_ROOT, "ssh", "id_ed25519")
REPO_DIR = os.path.join(ROOT, "build", "repo")
CACHE_DIR = os.environ.get("TOPOLAUNCH_CACHE", "/var/cache/topolaunch")
DEFAULT_INVENTORY = os.path.join(ROOT, "inventory", "lab")
DEFAULT_REPO_PORT = 18080
# The lab's non-root ssh user (passwordless sudo, the lab's key): how a production box is reached, where topolaunch
# becomes root only for what needs it.
LAB_USER = "ops"

SUITE = "bookworm"
# What a fresh Debian cloud VM has that Ansible and our roles need; nothing GPU-related (the provision stage
# installs the driver stand-in from the lab repository, as it installs the real driver in the field).
PACKAGES = sorted([
    "ca-certificates", "curl", "dbus", "gnupg", "iproute2", "kmod", "less", "openssh-server", "procps",
    "python3", "python3-apt", "sudo", "systemd", "systemd-sysv",
])
# Bump when the configuration applied to the rootfs after debootstrap changes (it is part of the cache key).
ROOTFS_REVISION = 1
# What `save-layer` leaves out of a layer: each host's own (configure() writes them for every host, systemd and
# nspawn at every boot) and what only one boot used. Globs, relative to the root.
LAYER_STRIP = [
    "etc/hostname", "etc/hosts", "etc/machine-id", "etc/resolv.conf", "etc/ssh/ssh_host_*",
    "etc/ssh/sshd_config.d/10-lab-listen.conf", "etc/apt/apt.conf.d/00lab-proxy", "etc/fake-nvml",
    "root/.ssh", f"home/{LAB_USER}/.ssh", "root/.ansible", f"home/{LAB_USER}/.ansible", "var/lib/dbus/machine-id",
    "var/lib/systemd/random-seed", "var/lib/systemd/credential.secret", "var/log/journal/*", "tmp/*", "var/tmp/*",
]
# Where a provisioned host may name its lab repository's URL: what the keyring package and apt's lists carry
# (moved to another port by retarget_repo()) and caches apt rebuilds. The URL anywhere else in a layer is refused:
# a host on that layer in another lab would reach the wrong repository.
LAYER_URL_PLACES = ["etc/apt/sources.list.d/*", "var/lib/dpkg/status*", "var/lib/dpkg/info/*", "var/lib/apt/lists/*",
                    "var/cache/apt/*.bin"]
LAYER_MANIFEST = "layer.json"
APT_PROXY_ENV = "TOPOLAUNCH_LAB_APT_PROXY"
APT_PROXY_FILE = "etc/apt/apt.conf.d/00lab-proxy"

BOOT_TIMEOUT = 90.0
POWEROFF_TIMEOUT = 30.0
SIGNAL_TIMEOUT = 10.0
POLL = 0.2
HOSTNAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
BUS_ID_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


class LabError(Exception):
    """A failure with a message for the operator (no traceback)."""


_LOG_LOCK = threading.Lock()


def log(msg):
    """One line of progress; hosts boot and stop in threads, so lines are written whole."""
    with _LOG_LOCK:
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()


def wait_for(condition, timeout, what):
    """Poll condition() until it returns a truthy value; LabError naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL)


# --------------------------------------------------------------------------------------------------------------
# Inventory


class _InventoryLoader(yaml.SafeLoader):
    """YAML as the lab reads an inventory file: a `!vault` value (an encrypted secret) is kept as its ciphertext, a
    string; the lab never needs a secret."""


_InventoryLoader.add_constructor("!vault", lambda loader, node: loader.construct_scalar(node))
VAULT_HEADER = "$ANSIBLE_VAULT;"


def _read_yaml(path):
    """An inventory file's variables. A whole file encrypted with ansible-vault (a vault.yml) holds secrets only,
    none of the lab's settings: it reads as empty, without its password."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith(VAULT_HEADER):
        return {}
    try:
        data = yaml.load(text, Loader=_InventoryLoader)  # noqa: S506 - a SafeLoader with one string constructor
    except yaml.YAMLError as e:
        raise LabError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if data is not None and not isinstance(data, dict):
        raise LabError(f"{path}: expected a mapping of variables, found {type(data).__name__}")
    return data or {}


def _vars_from(path_base):
    """Variables of group_vars/<g> or host_vars/<h>: a file (.yml/.yaml) or a directory of them."""
    merged = {}
    for candidate in (path_base + ".yml", path_base + ".yaml"):
        if os.path.isfile(candidate):
            merged.update(_read_yaml(candidate))
    if os.path.isdir(path_base):
        for f in sorted(glob.glob(os.path.join(path_base, "*.yml")) + glob.glob(os.path.join(path_base, "*.yaml"))):
            merged.update(_read_yaml(f))
    return merged


class Host:
    def __init__(self, name, port, spec_name, spec_path, layer=None):
        self.name = name
        self.port = port
        self.spec_name = spec_name
        self.spec_path = spec_path
        self.layer = layer  # a layer directory (lab_layer), or None: the bare rootfs
        self.spec_bytes = b""
        self.sysfs = {}

    def __repr__(self):
        return f"Host({self.name}:{self.port} {self.spec_name})"


class Lab:
    """One inventory's lab: its hosts, state dir and repository server."""

    def __init__(self, inventory_dir):
        self.inventory_dir = os.path.abspath(inventory_dir)
        if not os.path.isdir(self.inventory_dir):
            raise LabError(f"inventory directory {inventory_dir!r} does not exist")
        self.name = os.path.basename(self.inventory_dir.rstrip("/"))
        if not HOSTNAME_RE.match(self.name):
            raise LabError(f"inventory directory name {self.name!r} must be a valid host name part "
                           "(lower-case letters, digits, '-'): it names the lab's machines")
        self.state_dir = os.path.join(STATE_ROOT, self.name)
        self.hosts, group_all = self._parse_inventory()
        port = group_all.get("lab_repo_port", DEFAULT_REPO_PORT)
        if not isinstance(port, int) or not 1 <= port <= 65535:
            raise LabError(f"lab_repo_port {port!r} in inventory {inventory_dir} is not a port number")
        self.repo_port = port

    @classmethod
    def from_state(cls, name):
        """A lab known only by its state dir .lab/<name>/ (its inventory may be gone): enough to take it down."""
        lab = cls.__new__(cls)
        lab.inventory_dir, lab.name, lab.hosts = None, name, []
        lab.state_dir = os.path.join(STATE_ROOT, name)
        lab.repo_port = (read_json(os.path.join(lab.state_dir, "http.json")) or {}).get("port")
        return lab

    def machine(self, host):
        return f"tl-{self.name}-{host}"

    def host_dir(self, host):
        return os.path.join(self.state_dir, "hosts", host)

    def _parse_inventory(self):
        files = sorted(glob.glob(os.path.join(self.inventory_dir, "*.yml"))
                       + glob.glob(os.path.join(self.inventory_dir, "*.yaml")))
        if not files:
            raise LabError(f"inventory {self.inventory_dir} has no hosts.yml")
        # host -> (list of group names from the outside in, inline host vars); group -> inline vars
        host_groups, host_inline, group_inline = {}, {}, {}

        def walk(group, body, parents):
            body = body or {}
            if not isinstance(body, dict):
                raise LabError(f"inventory group {group!r} is not a mapping")
            group_inline.setdefault(group, {}).update(body.get("vars") or {})
            chain = parents + [group]
            for h, hv in (body.get("hosts") or {}).items():
                host_groups.setdefault(h, [])
                for g in chain:
                    if g not in host_groups[h]:
                        host_groups[h].append(g)
                host_inline.setdefault(h, {}).update(hv or {})
            for child, cbody in (body.get("children") or {}).items():
                walk(child, cbody, chain)

        for f in files:
            data = _read_yaml(f)
            if not isinstance(data, dict):
                raise LabError(f"{f} is not a YAML inventory (a mapping of groups)")
            for group, body in data.items():
                walk(group, body, [] if group == "all" else ["all"])

        group_all = dict(_vars_from(os.path.join(self.inventory_dir, "group_vars", "all")))
        group_all.update(group_inline.get("all", {}))
        hosts, ports = [], {}
        for h in sorted(host_groups):
            if not HOSTNAME_RE.match(h):
                raise LabError(f"lab host name {h!r} is not a valid host name (lower-case letters, digits, '-')")
            hvars = {}
            for g in host_groups[h]:
                hvars.update(_vars_from(os.path.join(self.inventory_dir, "group_vars", g)))
                hvars.update(group_inline.get(g, {}))
            hvars.update(host_inline.get(h, {}))
            hvars.update(_vars_from(os.path.join(self.inventory_dir, "host_vars", h)))
            port = hvars.get("ansible_port")
            if not isinstance(port, int) or not 1024 <= port <= 65535:
                raise LabError(f"lab host {h}: ansible_port {port!r} must be a port number 1024-65535")
            if port in ports:
                raise LabError(f"lab hosts {ports[port]} and {h} both use ansible_port {port}")
            ports[port] = h
            spec = hvars.get("lab_gpu_spec")
            if not isinstance(spec, str) or not spec:
                raise LabError(f"lab host {h}: lab_gpu_spec {spec!r} must name a spec in lab/specs (without .json)")
            if "/" in spec:  # a path to a spec file, relative to the inventory directory
                spec_path = os.path.join(self.inventory_dir, spec)
            else:
                spec_path = os.path.join(SPECS_DIR, spec + ".json")
            layer = hvars.get("lab_layer")
            if layer is not None and (not isinstance(layer, str) or not layer):
                raise LabError(f"lab host {h}: lab_layer {layer!r} must be a layer directory (lab.py save-layer)")
            if layer:
                layer = os.path.normpath(os.path.join(self.inventory_dir, layer))
            hosts.append(Host(h, port, spec, spec_path, layer))
        if not hosts:
            raise LabError(f"inventory {self.inventory_dir} defines no hosts")
        for h in hosts:
            if len(self.machine(h.name)) > 64:
                raise LabError(f"machine name {self.machine(h.name)!r} is longer than 64 characters: "
                               "shorten the inventory directory or host name")
        return hosts, group_all


# --------------------------------------------------------------------------------------------------------------
# GPU spec -> files in the host


def sysfs_bus_id(bus_id):
    """NVML bus id ("00000000:01:00.0") -> sysfs directory name ("0000:01:00.0")."""
    m = BUS_ID_RE.match(bus_id) if isinstance(bus_id, str) else None
    if not m:
        raise ValueError(f"pci_bus_id {bus_id!r} is not DOMAIN:BUS:DEVICE.FUNCTION")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def spec_files(spec_path):
    """Read and check a spec; return (spec bytes, {sysfs relative path: content})."""
    if not os.path.isfile(spec_path):
        raise LabError(f"GPU spec {spec_path} does not exist")
    with open(spec_path, "rb") as f:
        raw = f.read()
    try:
        spec = json.loads(raw)
    except ValueError as e:
        raise LabError(f"GPU spec {spec_path} is not valid JSON: {e}") from e
    gpus = spec.get("gpus") if isinstance(spec, dict) else None
    if not isinstance(gpus, list) or not gpus:
        raise LabError(f"GPU spec {spec_path}: 'gpus' must be a non-empty list")
    files = {}
    for i, gpu in enumerate(gpus):
        where = f"GPU spec {spec_path}: gpus[{i}]"
        if not isinstance(gpu, dict):
            raise LabError(f"{where} is not a mapping")
        try:
            bus = sysfs_bus_id(gpu.get("pci_bus_id"))
        except ValueError as e:
            raise LabError(f"{where}.{e}") from e
        numa = gpu.get("sysfs_numa_node", gpu.get("numa_node"))
        if isinstance(numa, bool) or not isinstance(numa, int) or numa < -1:
            raise LabError(f"{where}: sysfs_numa_node/numa_node {numa!r} must be an integer >= -1")
        rel = f"bus/pci/devices/{bus}/numa_node"
        if rel in files:
            raise LabError(f"{where}: pci_bus_id {gpu['pci_bus_id']} appears twice")
        files[rel] = f"{numa}\n"
    if fold_cpus(spec):
        raw = (json.dumps(spec, indent=2) + "\n").encode()
    return raw, files


def fold_cpus(spec, host_cpus=None):
    """Fold the spec's CPUs onto the host's when it names CPUs the host lacks (a lab host has this machine's CPUs):
    spec CPU c becomes host CPU H[c * len(H) // S] (H the host's CPUs in order, S the spec's highest CPU + 1), so
    each NUMA node keeps CPUs of its own while the host has as many CPUs as the spec has nodes (a 2-node spec on 2
    CPUs: node 0 on CPU 0, node 1 on CPU 1). The fake NVML then reports CPU affinities that exist, the topology
    facts carry them, SGLang's simulator binds a scheduler to them through the real numactl and health finds them
    in /proc (lab/sglang_sim/sglang/_sim/numa.py). True when it changed the spec."""
    host = sorted(os.sched_getaffinity(0) if host_cpus is None else host_cpus)
    lists = {i: _cpus(g.get("cpu_affinity")) for i, g in enumerate(spec["gpus"]) if isinstance(g, dict)}
    named = set().union(*lists.values()) if lists else set()
    if not named or named <= set(host):
        return False
    span = max(named) + 1
    for i, cpus in lists.items():
        if cpus:
            spec["gpus"][i]["cpu_affinity"] = _cpulist({host[c * len(host) // span] for c in cpus})
    return True


def _cpus(text):
    cpus = set()
    for part in filter(None, str(text or "").split(",")):
        a, _sep, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def _cpulist(cpus):
    parts, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [c]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


# --------------------------------------------------------------------------------------------------------------
# Processes, mounts


def proc_starttime(pid):
    """Field 22 of /proc/<pid>/stat, or None when the pid is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def own_cgroup_dirs():
    """The directories of the cgroups this process is in, in the hierarchies systemd tracks processes with (the
    cgroup v2 tree, and on a v1 or hybrid host the name=systemd one): where nspawn --keep-unit roots a container."""
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        paths = {c: p for _, c, p in (line.rstrip("\n").split(":", 2) for line in f) if c in ("", "name=systemd")}
    dirs = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            fstype, options = fields[fields.index("-") + 1], fields[-1].split(",")
            key = "" if fstype == "cgroup2" else "name=systemd" if fstype == "cgroup" and "name=systemd" in options \
                else None
            path = paths.pop(key, None)
            if path is not None and (path + "/").startswith(fields[3].rstrip("/") + "/"):
                dirs.append(os.path.normpath(os.path.join(fields[4], os.path.relpath(path, fields[3]))))
    return dirs


def host_cgroups(machine, host_dir):
    """A cgroup of this lab host's own in each tracking hierarchy, made now. Without one, every host would root its
    cgroup tree in the same directory, so a unit one host stops would remove (or kill in) the same-named unit's cgroup
    of another host (systemd: "Failed to attach to cgroup ...: No such file or directory", status 219/CGROUP)."""
    name = f"{machine}-{hashlib.sha256(host_dir.encode()).hexdigest()[:8]}"
    made = []
    for base in own_cgroup_dirs():
        path = os.path.join(base, "topolaunch-lab", name)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise LabError(f"cannot make the lab host's cgroup {path}: {e.strerror}") from e
        made.append(path)
    return made


def enter_cgroups(dirs):
    """In the child before exec: move this process into each cgroup."""
    for path in dirs:
        with open(os.path.join(path, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write("0\n")


def remove_cgroup(path):
    """Remove a stopped host's cgroup tree, deepest first; False if a process is still in it."""
    for top, _, _ in os.walk(path, topdown=False):
        try:
            os.rmdir(top)
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise LabError(f"cannot remove the lab host's cgroup {top}: {e.strerror}") from e
            return False
    return True


def alive(rec):
    """Is the process recorded as {pid, starttime} still the one we started?"""
    return bool(rec) and proc_starttime(rec["pid"]) == rec["starttime"]


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def write_file(path, data, mode=0o644):
    """Write atomically (temp name, rename); data is str or bytes."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_json(path, data):
    write_file(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def mounts_under(path):
    """Mount points at or below path (deepest first), from /proc/self/mountinfo."""
    path = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == path or mp.startswith(path + "/"):
                found.append(mp)
    return sorted(found, key=len, reverse=True)


def processes_rooted_in(root_ids):
    """pids whose root directory is one of root_ids ([st_dev, st_ino] of our hosts' roots): the processes
    of our containers. (readlink of /proc/<pid>/root shows "/" for them: their mount namespace is their own.)"""
    wanted = {tuple(r) for r in root_ids}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/root")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in wanted:
            pids.append(int(entry))
    return pids


def run(cmd, **kw):
    return subprocess.run(cmd, check=False, text=True, capture_output=True, **kw)


def stop_process(rec, what, timeout=SIGNAL_TIMEOUT):
    """SIGTERM the process we recorded (by pid, checked against its start time), then SIGKILL after timeout."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not alive(rec):
            return
        log(f"  {what}: sending {sig.name} to pid {rec['pid']}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec["pid"], sig)
        try:
            wait_for(lambda: not alive(rec), timeout, f"{what} (pid {rec['pid']}) to exit after {sig.name}")
        except LabError as e:
            if sig == signal.SIGKILL:
                raise
            log(f"  {what}: {e}")


def port_in_use(port):
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _listening_inodes(port):
    """The inodes of the sockets listening on TCP `port` in this network namespace (/proc/net/tcp, tcp6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def port_holder(port):
    """Who listens on 127.0.0.1:`port`, in words: another checkout's lab (its repository server or one of its
    hosts, with the checkout's path), this checkout's, or any other process (pid and command)."""
    wanted = {f"socket:[{i}]" for i in _listening_inodes(port)}
    for pid in sorted((int(p) for p in os.listdir("/proc") if p.isdigit()), reverse=True) if wanted else []:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if not wanted & {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            root = os.path.realpath(f"/proc/{pid}/root")
        except OSError:
            continue
        return _describe_holder(pid, argv, root)
    return ("a process whose socket this machine's /proc does not show (another container or network namespace "
            "forwarding it)")


def _describe_holder(pid, argv, root):
    """A listening process in words: a lab's repository server (http.server --directory CHECKOUT/build/repo) or a
    process inside a lab host (its root CHECKOUT/.lab/LAB/hosts/HOST/root), else its pid and command."""
    def whose(checkout):
        return "this checkout's" if os.path.realpath(checkout) == os.path.realpath(ROOT) \
            else f"another checkout's ({checkout})"
    if "http.server" in argv and "--directory" in argv[:-1]:
        served = argv[argv.index("--directory") + 1].rstrip("/")
        if served.endswith("/build/repo"):
            return f"{whose(served[:-len('/build/repo')])} lab repository server (pid {pid})"
    m = re.match(r"^(.*)/\.lab/([^/]+)/hosts/([^/]+)/root$", root)
    if m:
        return f"host {m.group(3)} of {whose(m.group(1))} lab {m.group(2)} (pid {pid}: {' '.join(argv)[:60]})"
    return f"pid {pid} ({' '.join(argv)[:80] or '?'})"


def port_taken(lab, what, port):
    """The error for a port of `lab` that another process holds: who holds it and how to pick others."""
    return LabError(f"{what} {port}: something else already listens on 127.0.0.1:{port}: {port_holder(port)}. "
                    f"Give this lab free ports (lab_repo_port, each host's ansible_port and topolaunch_port) in "
                    f"{lab.inventory_dir}/hosts.yml, or take the other lab down (in its checkout: make lab-down, "
                    "or .venv/bin/python lab/lab.py down-all)")


# --------------------------------------------------------------------------------------------------------------
# Rootfs (debootstrap, cached)


def apt_mirrors():
    """(debian mirror, security mirror) from this machine's apt sources; deb.debian.org when none is found."""
    main, security = None, None
    entries = []  # (uri, suites)
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*")):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        if path.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    if ":" in line and not line.lstrip().startswith("#"):
                        k, v = line.split(":", 1)
                        fields[k.strip().lower()] = v.split()
                if "deb" in fields.get("types", []):
                    entries += [(u, fields.get("suites", [])) for u in fields.get("uris", [])]
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^]]*\]", "", line).split()
                if len(parts) >= 3 and parts[0] == "deb":
                    entries.append((parts[1], [parts[2]]))
    for uri, suites in entries:
        if main is None and SUITE in suites:
            main = uri
        if security is None and f"{SUITE}-security" in suites:
            security = uri
    return main or "http://deb.debian.org/debian", security or "http://deb.debian.org/debian-security"


def rootfs_path():
    key = json.dumps({"suite": SUITE, "packages": PACKAGES, "revision": ROOTFS_REVISION}, sort_keys=True)
    return os.path.join(CACHE_DIR, f"rootfs-{SUITE}-{hashlib.sha256(key.encode()).hexdigest()[:12]}")


def ensure_rootfs():
    """The cached rootfs, built with debootstrap into a temp dir and renamed when complete."""
    final = rootfs_path()
    if os.path.isdir(final):
        return final
    os.makedirs(CACHE_DIR, exist_ok=True)
    with open(os.path.join(CACHE_DIR, ".build.lock"), "w", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("rootfs: another lab.py is building it; waiting for its lock")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isdir(final):
            return final
        for stale in glob.glob(final + ".tmp-*"):
            log(f"rootfs: removing half-built {stale}")
            shutil.rmtree(stale)
        tmp = f"{final}.tmp-{os.getpid()}"
        mirror, security = apt_mirrors()
        log(f"rootfs: debootstrap {SUITE} from {mirror} into {tmp} (about a minute)")
        t0 = time.monotonic()
        cmd = ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, tmp, mirror]
        proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.splitlines()[-20:])
            raise LabError(f"debootstrap failed (exit {proc.returncode}); the half-built {tmp} is left for "
                           f"inspection and removed by the next build:\n{tail}")
        configure_rootfs(tmp, mirror, security)
        os.rename(tmp, final)
        log(f"rootfs: ready at {final} ({time.monotonic() - t0:.0f} s)")
    return final


def configure_rootfs(root, mirror, security):
    """Make the debootstrapped tree look like a fresh Debian cloud VM (per-host bits are added per host)."""
    for f in ("etc/apt/sources.list",):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, f))
    write_file(os.path.join(root, "etc/apt/sources.list.d/debian.sources"),
               f"Types: deb\nURIs: {mirror}\nSuites: {SUITE} {SUITE}-updates\nComponents: main\n"
               "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
               f"Types: deb\nURIs: {security}\nSuites: {SUITE}-security\nComponents: main\n"
               "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    # Root logs in with the lab key only; the listen address and port are per host (10-lab-listen.conf).
    write_file(os.path.join(root, "etc/ssh/sshd_config.d/50-lab-auth.conf"),
               "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n")
    # Host keys and machine id are per host: each host gets its own.
    for key in glob.glob(os.path.join(root, "etc/ssh/ssh_host_*")):
        os.unlink(key)
    write_file(os.path.join(root, "etc/machine-id"), "")
    write_file(os.path.join(root, "etc/fstab"), "# lab host: the root is an overlay set up by lab.py\n")
    proc = run(["chroot", root, "apt-get", "clean"])
    if proc.returncode != 0:
        raise LabError(f"apt-get clean in the new rootfs failed: {proc.stderr.strip()}")
    for need in ("sbin/init", "usr/bin/python3", "usr/sbin/sshd", "usr/bin/systemctl"):
        if not os.path.exists(os.path.join(root, need)):
            raise LabError(f"the new rootfs {root} lacks /{need}: debootstrap did not install what we asked for")


# --------------------------------------------------------------------------------------------------------------
# ssh


def ensure_ssh_key():
    if not os.path.isfile(SSH_KEY):
        os.makedirs(os.path.dirname(SSH_KEY), mode=0o700, exist_ok=True)
        proc = run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "topolaunch-lab", "-f", SSH_KEY])
        if proc.returncode != 0:
            raise LabError(f"ssh-keygen failed: {proc.stderr.strip()}")
        log(f"ssh: generated the lab key {SSH_KEY}")
    with open(SSH_KEY + ".pub", encoding="utf-8") as f:
        return f.read()


def ssh_cmd(port, *command, timeout=3):
    return ["ssh", "-F", "/dev/null", "-i", SSH_KEY, "-p", str(port), "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", f"ConnectTimeout={timeout}", "root@127.0.0.1", *command]


def system_state(port):
    """What `systemctl is-system-running` answers over ssh, or None when ssh does not answer."""
    try:
        proc = run(ssh_cmd(port, "systemctl", "is-system-running"), timeout=15)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode == 255:  # ssh itself failed
        return None
    return proc.stdout.strip() or None


# --------------------------------------------------------------------------------------------------------------
# Host lifecycle


class HostRuntime:
    """A host's state files: .lab/<inventory>/hosts/<host>/{upper,work,root,host.json,console.log}."""

    def __init__(self, lab, name):
        self.lab = lab
        self.name = name
        self.dir = lab.host_dir(name)
        self.upper = os.path.join(self.dir, "upper")
        self.work = os.path.join(self.dir, "work")
        self.root = os.path.join(self.dir, "root")
        self.state_file = os.path.join(self.dir, "host.json")
        self.console = os.path.join(self.dir, "console.log")
        self.machine = lab.machine(name)

    def state(self):
        return read_json(self.state_file) or {}

    def process(self):
        return self.state().get("nspawn")

    def running(self):
        return alive(self.process())

    def mounted(self):
        return os.path.realpath(self.root) in mounts_under(self.root)

    def mount(self, rootfs, layer=None):
        """Mount the host's disk (overlay upper over the layer, if any, and the cached rootfs) unless it is mounted;
        record the root's identity, by which `down` finds any process still running inside. A disk made over
        another rootfs or layer is reset first."""
        st = self.state()
        base = f"{os.path.basename(layer)} over {os.path.basename(rootfs)}" if layer else os.path.basename(rootfs)
        if not self.mounted():
            if st.get("rootfs") is not None and (st.get("rootfs"), st.get("layer")) != (rootfs, layer):
                old = st.get("layer") and f"{os.path.basename(st['layer'])} over {os.path.basename(st['rootfs'])}"
                log(f"{self.name}: the host's base changed ({old or os.path.basename(st['rootfs'])} -> {base}): "
                    "resetting the host's disk")
                for d in (self.upper, self.work):
                    if os.path.exists(d):
                        shutil.rmtree(d)
                st.pop("apt_repo_port", None)
            fresh = not os.path.isdir(self.upper) or not os.listdir(self.upper)
            for d in (self.upper, self.work, self.root):
                os.makedirs(d, exist_ok=True)
            lower = f"{os.path.join(layer, 'root')}:{rootfs}" if layer else rootfs
            proc = run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={self.upper},workdir={self.work}", self.root])
            if proc.returncode != 0:
                raise LabError(f"{self.name}: mounting the overlay root at {self.root} failed: {proc.stderr.strip()}")
            st["rootfs"], st["layer"] = rootfs, layer
            if layer and fresh:  # the disk starts as the layer's: apt reaches the repository the layer was saved with
                st["apt_repo_port"] = layer_manifest(layer).get("repo_port")
        elif (st.get("rootfs"), st.get("layer")) != (rootfs, layer):
            log(f"{self.name}: runs on an older base ({st.get('layer') or st.get('rootfs')}); `down` and `up` move it "
                f"to {base}")
        root = os.stat(self.root)
        st["root_id"] = [root.st_dev, root.st_ino]
        write_json(self.state_file, st)

    def retarget_repo(self, port):
        """A disk that came from a layer saved in a lab of another repository port: install the keyring package of
        this lab's port (as provisioning would have, dpkg -i in the root) and move apt's lists of the repository to
        its URL (the same build/repo, served on another port: the same content). Returns what changed."""
        st = self.state()
        old = st.get("apt_repo_port")
        if old in (None, port):
            return []
        debs = sorted(glob.glob(os.path.join(REPO_DIR, "keyring", str(port), "*.deb")))
        if not debs:
            raise LabError(f"{self.name}: {REPO_DIR} has no keyring package for the lab repository port {port} "
                           "(lab/repo/build.py --keyring-ports)")
        name = "lab-" + os.path.basename(debs[-1])
        shutil.copy(debs[-1], os.path.join(self.root, "tmp", name))
        try:
            proc = run(["chroot", self.root, "dpkg", "-i", "--force-confnew", "/tmp/" + name])
        finally:
            os.unlink(os.path.join(self.root, "tmp", name))
        if proc.returncode != 0:
            raise LabError(f"{self.name}: installing {debs[-1]} in the host's root failed: {proc.stderr.strip()}")
        lists = os.path.join(self.root, "var/lib/apt/lists")
        before, after = f"127.0.0.1:{old}_", f"127.0.0.1:{port}_"
        for f in os.listdir(lists) if os.path.isdir(lists) else []:
            if f.startswith(before):
                os.replace(os.path.join(lists, f), os.path.join(lists, after + f[len(before):]))
        st["apt_repo_port"] = port
        write_json(self.state_file, st)
        return [f"/etc/apt/sources.list.d (lab repository port {old} -> {port})"]

    def configure(self, host, pubkey):
        """Per-host files in the (mounted) root. Returns the list of what changed."""
        changed = []

        def put(rel, data, mode=0o644):
            path = os.path.join(self.root, rel)
            data = data.encode() if isinstance(data, str) else data
            try:
                with open(path, "rb") as f:
                    if f.read() == data and (os.stat(path).st_mode & 0o7777) == mode:
                        return
            except FileNotFoundError:
                pass
            write_file(path, data, mode)
            changed.append("/" + rel)

        put("etc/hostname", host.name + "\n")
        put("etc/hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{host.name}\n::1\tlocalhost ip6-localhost ip6-loopback\n")
        put("etc/ssh/sshd_config.d/10-lab-listen.conf", f"Port {host.port}\nListenAddress 127.0.0.1\n")
        os.makedirs(os.path.join(self.root, "root/.ssh"), mode=0o700, exist_ok=True)
        put("root/.ssh/authorized_keys", pubkey, 0o600)
        changed += self.ensure_user(pubkey)
        mid = os.path.join(self.root, "etc/machine-id")
        if os.path.getsize(mid) == 0:
            put("etc/machine-id", secrets.token_hex(16) + "\n", 0o444)
        if not glob.glob(os.path.join(self.root, "etc/ssh/ssh_host_*_key")):
            proc = run(["ssh-keygen", "-A", "-f", self.root])
            if proc.returncode != 0:
                raise LabError(f"{self.name}: generating ssh host keys failed: {proc.stderr.strip()}")
            changed.append("/etc/ssh/ssh_host_*")
        # The "hardware": spec and fake sysfs. The sysfs tree is replaced whole when it differs (a changed
        # spec must not leave GPUs of the old one behind).
        proxy = os.environ.get(APT_PROXY_ENV, "")
        if proxy:
            put(APT_PROXY_FILE, f'Acquire::http::Proxy "{proxy}";\nAcquire::http::Proxy::127.0.0.1 "DIRECT";\n')
        elif os.path.lexists(os.path.join(self.root, APT_PROXY_FILE)):
            os.unlink(os.path.join(self.root, APT_PROXY_FILE))
            changed.append("/" + APT_PROXY_FILE)
        put("etc/fake-nvml/spec.json", host.spec_bytes)
        sysfs = os.path.join(self.root, "etc/fake-nvml/sysfs")
        have = {}
        for dirpath, _dirs, files in os.walk(sysfs):
            for fn in files:
                p = os.path.join(dirpath, fn)
                with open(p, encoding="utf-8") as f:
                    have[os.path.relpath(p, sysfs)] = f.read()
        if have != host.sysfs:
            new = sysfs + ".new"
            shutil.rmtree(new, ignore_errors=True)
            for rel, content in host.sysfs.items():
                write_file(os.path.join(new, rel), content)
            if os.path.exists(sysfs):
                shutil.rmtree(sysfs)
            os.rename(new, sysfs)
            changed.append("/etc/fake-nvml/sysfs")
        return changed

    def ensure_user(self, pubkey):
        """The non-root ssh user LAB_USER: an account, passwordless sudo, the lab's key. Returns what changed."""
        changed = []
        with open(os.path.join(self.root, "etc/passwd"), encoding="utf-8") as f:
            known = [line.split(":") for line in f if line.startswith(LAB_USER + ":")]
        if not known:
            proc = run(["chroot", self.root, "useradd", "--create-home", "--shell", "/bin/bash",
                        "--comment", "topolaunch lab operator", LAB_USER])
            if proc.returncode != 0:
                raise LabError(f"{self.name}: creating the lab user {LAB_USER} failed: {proc.stderr.strip()}")
            changed.append(f"/etc/passwd ({LAB_USER})")
            with open(os.path.join(self.root, "etc/passwd"), encoding="utf-8") as f:
                known = [line.split(":") for line in f if line.startswith(LAB_USER + ":")]
        uid, gid, home = int(known[0][2]), int(known[0][3]), known[0][5].lstrip("/")
        sudoers = os.path.join(self.root, "etc/sudoers.d", "lab-" + LAB_USER)
        rule = f"{LAB_USER} ALL=(ALL) NOPASSWD:ALL\n"
        if not os.path.isfile(sudoers) or open(sudoers, encoding="utf-8").read() != rule:
            write_file(sudoers, rule, 0o440)
            changed.append("/etc/sudoers.d/lab-" + LAB_USER)
        keys = os.path.join(self.root, home, ".ssh", "authorized_keys")
        try:
            with open(keys, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != pubkey:
            os.makedirs(os.path.dirname(keys), mode=0o700, exist_ok=True)
            write_file(keys, pubkey, 0o600)
            for path in (os.path.dirname(keys), keys):
                os.chown(path, uid, gid)
            changed.append(f"/{home}/.ssh/authorized_keys")
        return changed

    def apply_live(self, host, changed):
        """Files changed under a running host that a running system only reads at start: apply them."""
        cmds = []
        if "/etc/hostname" in changed:
            cmds.append(f"hostname {host.name}")
        if any(c.startswith("/etc/ssh/") for c in changed):
            cmds.append("systemctl reload-or-restart ssh")
        if cmds:
            proc = run(ssh_cmd(host.port, " && ".join(cmds)), timeout=30)
            if proc.returncode != 0:
                raise LabError(f"{self.name}: applying {', '.join(changed)} failed: {proc.stderr.strip()}")

    def start(self):
        # Under a systemd PID 1, nspawn puts the container in a transient scope of its own (delegated cgroup).
        # Elsewhere (containers, sandboxes) there is no one to ask: nspawn stays in the cgroup it starts in
        # (--keep-unit) and roots the container's cgroup tree there, so it starts in a cgroup of this host's own.
        cgroups = []
        if os.path.isdir("/run/systemd/system"):
            scope = []
        else:
            scope = ["--keep-unit"]
            cgroups = host_cgroups(self.machine, self.dir)
        with open(self.console, "ab") as out:
            proc = subprocess.Popen(
                ["systemd-nspawn", "-D", self.root, "-M", self.machine, f"--hostname={self.name}",
                 "--register=no", *scope, "--settings=no", "--console=passive", "--boot"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=(lambda: enter_cgroups(cgroups)) if cgroups else None)
        starttime = wait_for(lambda: proc_starttime(proc.pid), 5, f"systemd-nspawn for {self.name} to start")
        st = self.state()
        st["nspawn"] = {"pid": proc.pid, "starttime": starttime}
        st["cgroups"] = cgroups
        write_json(self.state_file, st)
        return proc

    def console_tail(self, n=15):
        try:
            with open(self.console, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except FileNotFoundError:
            return ""

    def wait_ready(self, port, timeout):
        """Wait until ssh answers and systemd says running/degraded; fail early when nspawn exits."""
        def ready():
            if not self.running():
                raise LabError(f"{self.name}: systemd-nspawn exited during boot; console log {self.console}:\n"
                               + self.console_tail())
            state = system_state(port)
            return state if state in ("running", "degraded") else None
        try:
            return wait_for(ready, timeout, f"{self.name} to answer ssh on 127.0.0.1:{port} with "
                                            "`systemctl is-system-running` = running or degraded")
        except LabError as e:
            if "timed out" in str(e):
                raise LabError(f"{e}\nlast console lines ({self.console}):\n{self.console_tail()}") from e
            raise

    def poweroff(self, port):
        """Ask systemd to power off over ssh; False when ssh could not deliver it (the connection dropping
        while the host goes down is the expected answer, not a failure)."""
        try:
            proc = run(ssh_cmd(port, "systemctl", "poweroff"), timeout=15)
        except subprocess.TimeoutExpired:
            log(f"{self.name}: `systemctl poweroff` over ssh did not return within 15 s")
            return True
        if proc.returncode == 255 and re.search(r"Connection (refused|timed out)|Permission denied", proc.stderr):
            log(f"{self.name}: ssh could not deliver the poweroff: {proc.stderr.strip()}")
            return False
        return True

    def stop(self, port):
        rec = self.process()
        if alive(rec):
            log(f"{self.name}: powering off (systemctl poweroff over ssh, port {port})")
            try:
                if not self.poweroff(port):
                    raise LabError("no poweroff delivered")
                wait_for(lambda: not alive(rec), POWEROFF_TIMEOUT,
                         f"{self.name}'s systemd-nspawn (pid {rec['pid']}) to exit after poweroff")
            except LabError as e:
                log(f"{self.name}: {e}; systemd-nspawn shuts the container down on SIGTERM")
                stop_process(rec, f"{self.name} systemd-nspawn")
            log(f"{self.name}: stopped")
        for mp in mounts_under(self.dir):
            proc = run(["umount", mp])
            if proc.returncode != 0:
                raise LabError(f"{self.name}: umount {mp} failed: {proc.stderr.strip()}")
        st = self.state()
        left = [d for d in st.get("cgroups", []) if not remove_cgroup(d)]
        if left:
            raise LabError(f"{self.name}: processes are still in its cgroup {left[0]} (cgroup.procs) after it stopped")
        if st.pop("nspawn", None) is not None or st.pop("cgroups", None) is not None:
            write_json(self.state_file, st)


# --------------------------------------------------------------------------------------------------------------
# Layers (a saved host disk other hosts boot from)


def layer_manifest(path):
    """The manifest of the layer at path; LabError when path is not a layer."""
    try:
        manifest = read_json(os.path.join(path, LAYER_MANIFEST))
    except (OSError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or not os.path.isdir(os.path.join(path, "root")):
        raise LabError(f"lab_layer {path} is not a layer (no {LAYER_MANIFEST} and root/ there: "
                       "`lab.py save-layer` makes one)")
    return manifest


def check_layer(host, rootfs):
    """A host's layer exists and was saved over this rootfs (a layer is a diff against it)."""
    manifest = layer_manifest(host.layer)
    if manifest.get("rootfs") != rootfs:
        raise LabError(f"{host.name}: lab_layer {host.layer} was saved over the rootfs {manifest.get('rootfs')}, "
                       f"the rootfs is now {rootfs}: save the layer again")


def strip_layer(root):
    """Remove what is each host's own (LAYER_STRIP) from a saved disk; returns the paths removed."""
    removed = []
    for pattern in LAYER_STRIP:
        for path in sorted(glob.glob(os.path.join(root, pattern), include_hidden=True)):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append("/" + os.path.relpath(path, root))
    return removed


def repo_url_outside_known_places(root, port):
    """Files of a saved disk that name the lab repository's URL outside LAYER_URL_PLACES (regular files only:
    overlayfs whiteouts are character devices)."""
    needle = f"127.0.0.1:{port}".encode()
    found = []
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, root)
            if any(fnmatch.fnmatch(rel, p) for p in LAYER_URL_PLACES) or not os.path.isfile(path) \
                    or os.path.islink(path):
                continue
            with open(path, "rb") as f:
                if needle in f.read():
                    found.append("/" + rel)
    return found


# --------------------------------------------------------------------------------------------------------------
# Repository HTTP server


class RepoServer:
    def __init__(self, lab):
        self.lab = lab
        self.state_file = os.path.join(lab.state_dir, "http.json")
        self.log_file = os.path.join(lab.state_dir, "http.log")

    def state(self):
        return read_json(self.state_file) or {}

    def running(self):
        return alive(self.state().get("process"))

    def ensure(self):
        port = self.lab.repo_port
        st = self.state()
        if alive(st.get("process")):
            if st.get("port") == port and port_in_use(port):
                log(f"repo: serving {REPO_DIR} on http://127.0.0.1:{port}/ (pid {st['process']['pid']}, reused)")
                return
            self.stop()
        if port_in_use(port):
            raise port_taken(self.lab, "lab_repo_port", port)
        os.makedirs(REPO_DIR, exist_ok=True)
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", REPO_DIR, str(port)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        starttime = wait_for(lambda: proc_starttime(proc.pid), 5, "the repo HTTP server process to start")
        write_json(self.state_file, {"port": port, "process": {"pid": proc.pid, "starttime": starttime}})

        def listening():
            if proc.poll() is not None:
                raise LabError(f"the repo HTTP server exited with {proc.returncode}; see {self.log_file}")
            return port_in_use(port)
        wait_for(listening, 10, f"the repo HTTP server to listen on 127.0.0.1:{port}")
        log(f"repo: serving {REPO_DIR} on http://127.0.0.1:{port}/ (pid {proc.pid})")

    def stop(self):
        rec = self.state().get("process")
        if alive(rec):
            stop_process(rec, "repo HTTP server")
            log("repo: HTTP server stopped")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.state_file)


# --------------------------------------------------------------------------------------------------------------
# Commands


def need_root():
    if os.geteuid() != 0:
        raise LabError("lab.py needs root (it mounts overlays and runs systemd-nspawn)")
    for tool in ("systemd-nspawn", "debootstrap", "mount", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise LabError(f"{tool} not found: install debootstrap, systemd-container and openssh-client")


@contextlib.contextmanager
def state_lock(lab):
    os.makedirs(lab.state_dir, exist_ok=True)
    with open(os.path.join(lab.state_dir, ".lock"), "w", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another lab.py working on {lab.state_dir}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def inventory_host(lab, name):
    """The inventory's host `name`; LabError listing the hosts when there is none."""
    for host in lab.hosts:
        if host.name == name:
            return host
    raise LabError(f"host {name!r} is not in inventory {lab.inventory_dir} "
                   f"(its hosts: {', '.join(h.name for h in lab.hosts)})")


def check_ports(lab, hosts):
    """Before anything changes: the repository port and each host's ssh port are this lab's or free."""
    repo = RepoServer(lab).state()
    if not (alive(repo.get("process")) and repo.get("port") == lab.repo_port) and port_in_use(lab.repo_port):
        raise port_taken(lab, "lab_repo_port", lab.repo_port)
    for host in hosts:
        st = HostRuntime(lab, host.name).state()
        if not (alive(st.get("nspawn")) and st.get("port") == host.port) and port_in_use(host.port):
            raise port_taken(lab, f"{host.name}: ansible_port", host.port)


def cmd_up(lab, args, only=None):
    """Boot the inventory's hosts (only those named in `only`, when given); reuse running ones."""
    t0 = time.monotonic()
    for host in lab.hosts:  # every input is checked before anything changes
        host.spec_bytes, host.sysfs = spec_files(host.spec_path)
    hosts = [h for h in lab.hosts if only is None or h.name in only]
    for host in hosts:
        if host.layer:
            check_layer(host, rootfs_path())
    proxy = os.environ.get(APT_PROXY_ENV, "")
    if proxy and not re.match(r"^https?://[^\s\"\\;]+$", proxy):
        raise LabError(f"{APT_PROXY_ENV}={proxy!r} is not an http:// or https:// URL")
    need_root()
    check_ports(lab, hosts)
    with state_lock(lab):
        pubkey = ensure_ssh_key()
        rootfs = ensure_rootfs()
        RepoServer(lab).ensure()
        booting = {}
        for host in hosts:
            rt = HostRuntime(lab, host.name)
            st = rt.state()
            if rt.running() and st.get("port") != host.port:
                log(f"{host.name}: ansible_port changed {st.get('port')} -> {host.port}: restarting")
                rt.stop(st.get("port"))
            if rt.running():
                rt.mount(rootfs, host.layer)
                changed = rt.retarget_repo(lab.repo_port) + rt.configure(host, pubkey)
                rt.apply_live(host, changed)
                note = f"; updated {', '.join(changed)}" if changed else ""
                log(f"{host.name}: running (pid {st['nspawn']['pid']}), reusing{note}")
                booting[host.name] = (rt, host, time.monotonic())
                continue
            if port_in_use(host.port):
                raise port_taken(lab, f"{host.name}: ansible_port", host.port)
            rt.mount(rootfs, host.layer)
            rt.retarget_repo(lab.repo_port)
            rt.configure(host, pubkey)
            st = rt.state()
            st.update({"port": host.port, "spec": host.spec_name, "machine": rt.machine})
            write_json(rt.state_file, st)
            started = time.monotonic()
            proc = rt.start()
            layer = f", layer {os.path.basename(host.layer)}" if host.layer else ""
            log(f"{host.name}: booting {rt.machine} (pid {proc.pid}, ssh 127.0.0.1:{host.port}, spec {host.spec_name}"
                f"{layer})")
            booting[host.name] = (rt, host, started)

        def wait(item):
            rt, host, started = item
            state = rt.wait_ready(host.port, args.timeout)
            log(f"{host.name}: ready ({state}) {time.monotonic() - started:.1f} s after start")
            if state == "degraded":
                failed = run(ssh_cmd(host.port, "systemctl", "--failed", "--no-legend", "--plain"), timeout=15)
                log(f"{host.name}: warning: failed units: {failed.stdout.strip()}")
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(booting))) as pool:
            futures = [pool.submit(wait, item) for item in booting.values()]
            errors = [f.exception() for f in futures if f.exception()]
        if errors:
            raise LabError("\n".join(str(e) for e in errors))
    log(f"lab {lab.name}: {len(hosts)} host(s) up in {time.monotonic() - t0:.1f} s")


def cmd_start(lab, args):
    """Boot one host of the inventory (after `stop`); the others are left as they are."""
    cmd_up(lab, args, only=[inventory_host(lab, args.host).name])


def cmd_stop(lab, args):
    """Power one host off (its container stops: the lab's "unreachable"); the others and the repo server stay."""
    host = inventory_host(lab, args.host)
    need_root()
    with state_lock(lab):
        rt = HostRuntime(lab, host.name)
        if not rt.running():
            log(f"{host.name}: not running")
        rt.stop(rt.state().get("port") or host.port)
    log(f"lab {lab.name}: {host.name} stopped (`lab.py start {host.name}` boots it again)")


def cmd_save_layer(lab, args):
    """Turn a stopped host's disk into a layer at args.dir (its overlay upper dir, moved: the host's disk is gone
    and a later `up` gives it a fresh one)."""
    host = inventory_host(lab, args.host)
    dest = os.path.abspath(args.dir)
    need_root()
    with state_lock(lab):
        rt = HostRuntime(lab, host.name)
        if rt.running():
            raise LabError(f"{host.name} is running: a layer is saved from a powered-off host "
                           f"(`lab.py stop {host.name}` or `down` first)")
        rt.stop(host.port)  # unmounts what is left mounted
        st = rt.state()
        if not os.path.isdir(rt.upper) or not os.listdir(rt.upper):
            raise LabError(f"{host.name} has no disk to save ({rt.upper} is missing or empty)")
        if st.get("layer"):
            raise LabError(f"{host.name} runs over the layer {st['layer']}: layers do not stack, save a host of the "
                           "bare rootfs")
        if os.path.lexists(dest):
            raise LabError(f"{dest} already exists")
        removed = strip_layer(rt.upper)
        named = repo_url_outside_known_places(rt.upper, lab.repo_port)
        if named:
            raise LabError(f"{host.name}'s disk names the lab repository http://127.0.0.1:{lab.repo_port} in "
                           f"{', '.join(named)}: a host on this layer in another lab would reach the wrong "
                           "repository (lab.py moves only LAYER_URL_PLACES)")
        tmp = f"{dest}.tmp-{os.getpid()}"
        os.makedirs(tmp)
        try:
            os.rename(rt.upper, os.path.join(tmp, "root"))
        except OSError as e:
            shutil.rmtree(tmp)
            raise LabError(f"moving {rt.upper} to {tmp}: {e} (the layer must be on the filesystem of {STATE_ROOT})") \
                from e
        write_json(os.path.join(tmp, LAYER_MANIFEST), {
            "rootfs": st.get("rootfs"), "repo_port": lab.repo_port, "saved_from": f"{lab.name}/{host.name}",
            "spec": host.spec_name, "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "note": args.note or ""})
        os.rename(tmp, dest)
        shutil.rmtree(rt.dir)
    log(f"{host.name}: disk saved as the layer {dest} (left out: {len(removed)} host-own paths)")


def known_hosts(lab):
    """Hosts of the inventory plus any host with state left from an earlier inventory."""
    names = {h.name: h.port for h in lab.hosts}
    for f in glob.glob(os.path.join(lab.state_dir, "hosts", "*", "host.json")):
        port = (read_json(f) or {}).get("port")  # the port a running host was booted with wins
        if port is not None or os.path.basename(os.path.dirname(f)) not in names:
            names[os.path.basename(os.path.dirname(f))] = port
    return names


def leftovers(lab):
    """Everything of this lab that should not exist once it is down."""
    left = []
    for name in known_hosts(lab):
        rt = HostRuntime(lab, name)
        if alive(rt.process()):
            left.append(f"process: {name}'s systemd-nspawn pid {rt.process()['pid']}")
    root_ids = [HostRuntime(lab, n).state().get("root_id") for n in known_hosts(lab)]
    for pid in processes_rooted_in([r for r in root_ids if r]):
        left.append(f"process: pid {pid} runs inside one of this lab's hosts")
    left += [f"mount: {mp}" for mp in mounts_under(lab.state_dir)]
    veth_prefixes = tuple(("ve-" + lab.machine(n))[:12] for n in known_hosts(lab))
    left += [f"veth: {i}" for i in os.listdir("/sys/class/net") if i.startswith(veth_prefixes)]
    if RepoServer(lab).running():
        left.append(f"process: repo HTTP server pid {RepoServer(lab).state()['process']['pid']}")
    return left


def cmd_down(lab, args):
    need_root()
    if not os.path.isdir(lab.state_dir):
        log(f"lab {lab.name}: nothing to stop")
        return
    with state_lock(lab):
        hosts = known_hosts(lab)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            futures = [pool.submit(HostRuntime(lab, n).stop, p) for n, p in hosts.items()]
            errors = [f.exception() for f in futures if f.exception()]
        RepoServer(lab).stop()
        left = leftovers(lab)
        if errors or left:
            raise LabError("lab-down left things behind:\n  " + "\n  ".join([str(e) for e in errors] + left))
        if args.purge:
            disks = [HostRuntime(lab, name).dir for name in hosts if os.path.isdir(HostRuntime(lab, name).dir)]
            for d in disks:
                shutil.rmtree(d)
            if disks:
                log(f"lab {lab.name}: host disks removed ({len(disks)})")
    log(f"lab {lab.name}: down; no process, mount or veth left")


def cmd_down_all(_lab, args):
    """Take down every lab of this checkout (each state dir under .lab/): the CI safety net."""
    need_root()
    # A lab's state dir has its hosts' dirs or its repository server's record (.lab/ also holds ssh/, inventories/,
    # layers/: no lab).
    names = sorted(d for d in os.listdir(STATE_ROOT) if any(
        os.path.exists(os.path.join(STATE_ROOT, d, f)) for f in ("hosts", "http.json"))) \
        if os.path.isdir(STATE_ROOT) else []
    errors = []
    for name in names:
        try:
            cmd_down(Lab.from_state(name), args)
        except LabError as e:
            errors.append(f"lab {name}: {e}")
    if errors:
        raise LabError("\n".join(errors))


def cmd_status(lab, _args):
    repo = RepoServer(lab)
    print(f"lab {lab.name} (state {lab.state_dir})")
    print(f"  repo http://127.0.0.1:{lab.repo_port}/ {'serving' if repo.running() else 'stopped'}")
    print(f"  {'host':12} {'machine':28} {'state':8} {'port':6} spec")
    inventory = {h.name: h for h in lab.hosts}
    for name in sorted(known_hosts(lab)):
        rt = HostRuntime(lab, name)
        h = inventory.get(name)
        st = rt.state()
        port = h.port if h else st.get("port")
        spec = h.spec_name if h else f"{st.get('spec')} (not in inventory)"
        state = "running" if rt.running() else "stopped"
        layer = f" (layer {os.path.basename(st['layer'])})" if st.get("layer") else ""
        print(f"  {name:12} {rt.machine:28} {state:8} {port!s:6} {spec}{layer}")


def cmd_ssh_config(lab, _args):
    for h in lab.hosts:
        print(f"Host {h.name} {HostRuntime(lab, h.name).machine}\n  HostName 127.0.0.1\n  Port {h.port}\n  User root\n"
              f"  IdentityFile {SSH_KEY}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
              "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", default=DEFAULT_INVENTORY,
                        help="lab inventory directory (default inventory/lab); state in .lab/<its basename>/")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="boot the inventory's hosts (reuses running ones), serve build/repo")
    up.add_argument("--timeout", type=float, default=BOOT_TIMEOUT, help="seconds to wait for each host")
    down = sub.add_parser("down", help="stop every host and the repo server; verify nothing is left")
    down.add_argument("--purge", action="store_true", help="also delete the hosts' disks (overlay upper dirs)")
    down_all = sub.add_parser("down-all", help="down every lab of this checkout (.lab/*), whatever its inventory")
    down_all.add_argument("--purge", action="store_true", help="also delete the hosts' disks")
    stop = sub.add_parser("stop", help="power one host off (its container stops); the others keep running")
    stop.add_argument("host", help="a host of the inventory")
    start = sub.add_parser("start", help="boot one host of the inventory (after stop)")
    start.add_argument("host", help="a host of the inventory")
    start.add_argument("--timeout", type=float, default=BOOT_TIMEOUT, help="seconds to wait for the host")
    save = sub.add_parser("save-layer", help="a stopped host's disk becomes a layer (lab_layer) other hosts boot from")
    save.add_argument("host", help="a host of the inventory, stopped")
    save.add_argument("dir", help="the new layer's directory (must not exist; on the filesystem of .lab/)")
    save.add_argument("--note", help="a line kept in the layer's manifest (what it holds)")
    sub.add_parser("status", help="each host: running or not, port, spec")
    sub.add_parser("ssh-config", help="print an ssh_config for the hosts")
    args = parser.parse_args(argv)
    commands = {"up": cmd_up, "down": cmd_down, "down-all": cmd_down_all, "status": cmd_status,
                "ssh-config": cmd_ssh_config, "stop": cmd_stop, "start": cmd_start, "save-layer": cmd_save_layer}
    try:
        commands[args.command](None if args.command == "down-all" else Lab(args.inventory), args)
    except LabError as e:
        print(f"lab.py {args.command}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
