"""Provisioned lab hosts for lab tests: provision once, boot copies in seconds.

`deploy.yml --tags provision` on a fresh lab host takes minutes (driver and CUDA stand-ins, the SGLang venv, the
tools venv, the stand-in model). Here it runs once per SGLang release and set of inputs, on hosts booted for the
purpose, reached as the lab's non-root user `ops` (provisioning becomes root, as on a production box); each
host's disk is then saved as a layer (`lab/lab.py save-layer`) under .lab/layers/. A test's host with
`lab_layer: <that layer>` boots in a second or two with everything provisioning installed, on its own
copy-on-write disk, with its own host name, machine id, ssh host keys, GPU spec, sysfs and lab repository port
(lab.py writes those for every host). Tests that check provisioning itself (molecule's provision scenario, the
upgrade of test_versions.py, a deploy's own provision stage) still run it for real on hosts like these or on fresh
ones.

    import labhosts

    @pytest.fixture(scope="module")
    def lab():
        with labhosts.Lab("h30-gateway", repo_port=18100, hosts={
                "gw": {"ansible_port": 2401, "topolaunch_port": 34000},          # the field spec by default
                "old": {"ansible_port": 2402, "lab_gpu_spec": "h200x2-vm-real", "topolaunch_sglang_version": "0.5.9"},
        }, settings={"launch_drain_timeout": 2}) as lab:                           # group vars of this test
            yield lab   # booted from the layers, `--tags topology` run; at the end: down, disks removed

    rc, out = lab.play("--tags", "relaunch")               # deploy.yml on the test's inventory
    rc, out = lab.ssh("systemctl is-active topolaunch-sglang", host="gw")

Each host gets the layer of its `topolaunch_sglang_version` (the project's default release when unset);
`"lab_layer": None` in a host's variables boots it bare (a fresh VM, for a test of provisioning). Pick ports no other
lab test uses (each file's docstring lists its own; lab.py refuses a port already in use). For a hand-written
inventory, `provisioned(version)` gives the host variable ({"lab_layer": path}) and builds the layer when needed.

A layer's name carries a hash of everything provisioning depends on (INPUTS: roles, playbooks, modules and
plugins, the lab inventory's settings, lab/ with the simulator and the repository builder, build/repo's packages,
the rootfs it was saved over) and of how it is built (RECIPE): any change there builds it again, once; older layers no host runs on
are removed. Building is locked (.lab/layers/.lock): lab tests started together wait for one build. `tests/lab/
lanes.py` builds the layers before it starts its lanes.
"""
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
LAB_PY = ROOT / "lab" / "lab.py"
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"
LAYERS = ROOT / ".lab" / "layers"
FIELD_SPEC = "proxmox-8x-rtx-pro-6000-vnuma"
LAB_GROUP_VARS = ROOT / "inventory" / "lab" / "group_vars" / "all"
OWN = {"connection.yml", "lab.yml"}   # what each private inventory writes for itself
# What a provisioned host depends on: any change here builds the layers again.
INPUTS = ["deploy.yml", "ansible.cfg", "playbooks", "collections/ansible_collections/topolaunch/sglang",
          "inventory/lab/group_vars/all", "lab", "build/repo"]
SKIP = {"__pycache__", "output", ".pytest_cache"}   # collection's tests/output: ansible-test's
# The hosts that build the layers: their own ports (lab.py save-layer moves a layer to each lab's repository port).
BUILD_NAME, BUILD_SSH_PORT, BUILD_REPO_PORT = "layer-build", 2295, 18119
BUILD_TIMEOUT = 1800
# How a layer is built, part of its name with INPUTS (bump the revision when _build changes otherwise).
RECIPE = {"revision": 1, "user": "ops", "spec": FIELD_SPEC, "playbook": "deploy.yml", "tags": "provision",
          "settings": "inventory/lab/group_vars/all"}


def _load_lab_module():
    spec = importlib.util.spec_from_file_location("lab_py", LAB_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_release():
    """The SGLang release provisioning installs when the inventory names none (roles/topolaunch's default)."""
    defaults = yaml.safe_load((ROOT / "roles" / "topolaunch" / "defaults" / "main.yml").read_text())
    return str(defaults["topolaunch_sglang_version"])


_INPUTS_HASH = []


def inputs_hash():
    """sha256 of INPUTS (paths, file contents; through the collection view's symlinks, as Ansible reads it) and of
    the cached rootfs a layer is saved over. Computed once per process."""
    if not _INPUTS_HASH:
        digest = hashlib.sha256()
        digest.update(_load_lab_module().rootfs_path().encode() + b"\0")
        for top in INPUTS:
            path = ROOT / top
            files = [path] if path.is_file() else sorted(
                pathlib.Path(d) / f for d, dirs, fs in os.walk(path, followlinks=True)
                if not SKIP.intersection(pathlib.Path(d).relative_to(path).parts) for f in fs)
            for f in files:
                if f.suffix == ".pyc" or not f.is_file():
                    continue
                digest.update(str(f.relative_to(ROOT)).encode() + b"\0")
                digest.update(hashlib.sha256(f.read_bytes()).digest())
        _INPUTS_HASH.append(digest.hexdigest())
    return _INPUTS_HASH[0]


def layer_path(version):
    """Where the layer of SGLang `version` for the current inputs lives (built or not)."""
    recipe = json.dumps(dict(RECIPE, inputs=inputs_hash(), topolaunch_sglang_version=version), sort_keys=True)
    return LAYERS / ("sglang-%s-%s" % (version, hashlib.sha256(recipe.encode()).hexdigest()[:12]))


def write_group_vars(inventory, repo_port, user="root", settings=None):
    """group_vars/all of a private inventory: inventory/lab's settings (links), its own connection (user, the lab's
    key) and lab repository port, then the test's settings (zz-settings.yml, read last: they win)."""
    group_all = inventory / "group_vars" / "all"
    if group_all.exists():
        shutil.rmtree(group_all)
    group_all.mkdir(parents=True)
    for src in sorted(LAB_GROUP_VARS.glob("*.yml")):
        if src.name not in OWN:
            (group_all / src.name).symlink_to(src)
    (group_all / "connection.yml").write_text(yaml.safe_dump({
        "ansible_host": "127.0.0.1", "ansible_user": user, "ansible_connection": "ansible.builtin.ssh",
        "ansible_ssh_private_key_file": str(SSH_KEY), "ansible_python_interpreter": "/usr/bin/python3",
        # throwaway hosts with fresh host keys: not checked, not remembered (lab inventories only; ansible.cfg checks)
        "ansible_host_key_checking": False,
        "ansible_ssh_common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no"}))
    (group_all / "lab.yml").write_text(yaml.safe_dump({
        "lab_repo_port": repo_port, "lab_repo_url": "http://127.0.0.1:{{ lab_repo_port }}"}))
    if settings:
        (group_all / "zz-settings.yml").write_text(yaml.safe_dump(settings))


def _lab_py(inventory, *args, timeout=900):
    proc = subprocess.run([sys.executable, str(LAB_PY), "-i", str(inventory), *args], capture_output=True, text=True,
                          check=False, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError("lab.py -i %s %s failed:\n%s\n%s" % (inventory, " ".join(args), proc.stdout, proc.stderr))
    return proc.stdout


def _playbook_env():
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")


def log(msg):
    print("labhosts: %s" % msg, file=sys.stderr, flush=True)


def ensure_layers(versions):
    """The layers of these SGLang releases for the current inputs, built (all missing ones in one provisioning run,
    one host each) when missing. Returns {version: path}."""
    wanted = {v: layer_path(v) for v in sorted(set(versions))}
    if all(p.is_dir() for p in wanted.values()):
        return wanted
    LAYERS.mkdir(parents=True, exist_ok=True)
    with open(LAYERS / ".lock", "w", encoding="utf-8") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another process builds the provisioned layers; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        missing = {v: p for v, p in wanted.items() if not p.is_dir()}
        if missing:
            _build(missing)
        _prune()
    return wanted


def _build(missing):
    """Boot one bare host per release, `deploy.yml --tags provision` on them as `ops`, save each disk as a layer."""
    inventory = ROOT / ".lab" / "inventories" / BUILD_NAME
    write_group_vars(inventory, BUILD_REPO_PORT, user=RECIPE["user"])
    hosts = {}
    for i, version in enumerate(missing):
        hosts["sglang-" + version.replace(".", "-")] = {
            "ansible_port": BUILD_SSH_PORT + i, "lab_gpu_spec": RECIPE["spec"], "topolaunch_sglang_version": version}
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"children": {
        "sglang_servers": {"hosts": hosts}}}}}}))
    started = time.monotonic()
    log("provisioning %s for the lab tests (deploy.yml --tags provision as ops, once per change of the inputs; "
        "output in %s)" % (", ".join("SGLang " + v for v in missing), LAYERS / "build.log"))
    _lab_py(inventory, "down", "--purge")
    try:
        _lab_py(inventory, "up")
        with open(LAYERS / "build.log", "w", encoding="utf-8") as out:
            proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / RECIPE["playbook"]),
                                   "--tags", RECIPE["tags"]], cwd=ROOT, env=_playbook_env(), stdout=out,
                                  stderr=subprocess.STDOUT, check=False, timeout=BUILD_TIMEOUT)
        if proc.returncode != 0:
            tail = (LAYERS / "build.log").read_text(errors="replace")[-6000:]
            raise RuntimeError("provisioning the lab layers failed (rc %d; %s):\n%s"
                               % (proc.returncode, LAYERS / "build.log", tail))
        _lab_py(inventory, "down")
        for host, version in zip(hosts, missing):
            _lab_py(inventory, "save-layer", host, str(missing[version]), "--note",
                    "deploy.yml --tags provision, SGLang %s, inputs %s" % (version, inputs_hash()))
    finally:
        _lab_py(inventory, "down", "--purge")
    log("provisioned layers ready in %.0f s: %s" % (time.monotonic() - started,
                                                    ", ".join(p.name for p in missing.values())))


def _prune():
    """Remove the layers of other inputs (older ones) that no mounted host uses, and what a failed save left."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        mounts = f.read()
    for old in LAYERS.glob("sglang-*"):
        m = re.match(r"sglang-(.+)-[0-9a-f]{12}$", old.name)
        if (m is None or layer_path(m.group(1)) != old) and str(old) not in mounts:
            shutil.rmtree(old, ignore_errors=True)


def provisioned(version=None):
    """The host variables that boot a host from the provisioned layer of SGLang `version` (default: the project's
    release): {"lab_layer": path}. Builds the layer when it is missing."""
    version = version or default_release()
    return {"lab_layer": str(ensure_layers([version])[version])}


class Lab:
    """A test's own lab: hosts (name -> host variables: ansible_port at least; lab_gpu_spec defaults to the field
    spec, topolaunch_sglang_version picks the layer, "lab_layer": None boots a bare host) in the group
    sglang_servers of a private inventory .lab/inventories/<name>/ (inventory/lab's settings, the connection as
    `user`, the lab repository on repo_port, then `settings`); `groups` ({"monitoring": ["mon"]}) puts the hosts it
    names in those groups instead. Use it as a context manager (up, then down), or call
    up() and down()."""

    def __init__(self, name, hosts, repo_port, settings=None, user="root", groups=None):
        self.name, self.repo_port, self.user = name, repo_port, user
        # Hosts of other groups than sglang_servers ({"monitoring": ["mon"]}): not GPU hosts of the inventory.
        self.groups = {g: list(members) for g, members in (groups or {}).items()}
        self.hosts = {h: dict(v) for h, v in hosts.items()}
        self.settings = dict(settings or {})
        self.inventory = ROOT / ".lab" / "inventories" / name

    def host_vars(self):
        """Each host's variables as written to the inventory (lab_layer resolved to its layer)."""
        versions = {h: str(v.get("topolaunch_sglang_version") or default_release()) for h, v in self.hosts.items()
                    if v.get("lab_layer", "") is not None}
        layers = ensure_layers(versions.values()) if versions else {}
        out = {}
        for h, v in self.hosts.items():
            v = dict({"lab_gpu_spec": FIELD_SPEC}, **v)
            if v.get("lab_layer", "") is None:
                v.pop("lab_layer")
            elif "lab_layer" not in v:
                v["lab_layer"] = str(layers[versions[h]])
            out[h] = v
        return out

    def write_inventory(self):
        write_group_vars(self.inventory, self.repo_port, self.user, self.settings)
        host_vars = self.host_vars()
        others = {h for members in self.groups.values() for h in members}
        children = {"gpu_hosts": {"children": {"sglang_servers": {"hosts": {
            h: v for h, v in host_vars.items() if h not in others}}}}}
        for group, members in self.groups.items():
            children[group] = {"hosts": {h: host_vars[h] for h in members}}
        (self.inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": children}}))
        return self.inventory

    def lab(self, *args):
        """lab/lab.py on this inventory; raises with its output when it fails; returns its output."""
        return _lab_py(self.inventory, *args)

    def up(self, topology=True):
        """Write the inventory, boot the hosts (from their layers), read their topology (deploy.yml --tags
        topology) unless topology=False. Returns self."""
        self.write_inventory()
        self.lab("up")
        if topology:
            rc, out = self.play("--tags", "topology")
            if rc != 0:
                raise RuntimeError("deploy.yml --tags topology on the lab %s failed:\n%s" % (self.name, out[-6000:]))
        return self

    def down(self):
        """Stop every host and remove their disks (the layers stay)."""
        self.lab("down", "--purge")

    def __enter__(self):
        try:
            return self.up()
        except BaseException:
            with contextlib.suppress(Exception):
                self.down()
            raise

    def __exit__(self, *exc):
        self.down()

    def popen(self, path, *args, extra=None):
        """ansible-playbook PATH (relative to the repository) on this inventory, started (stdout and stderr
        together, text); `extra`: a dict of extra variables. The caller waits."""
        cmd = [str(BIN / "ansible-playbook"), "-i", str(self.inventory), str(ROOT / path), *args]
        if extra:
            cmd += ["-e", json.dumps(extra)]
        return subprocess.Popen(cmd, cwd=ROOT, env=_playbook_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def playbook(self, path, *args, extra=None, timeout=900):
        """ansible-playbook PATH on this inventory; returns the CompletedProcess (stdout and stderr together)."""
        proc = self.popen(path, *args, extra=extra)
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout)

    def play(self, *args, extra=None, timeout=900):
        """deploy.yml on this inventory: (rc, output)."""
        run = self.playbook("deploy.yml", *args, extra=extra, timeout=timeout)
        return run.returncode, run.stdout

    def port(self, host=None):
        return self.hosts[self._host(host)]["ansible_port"]

    def _host(self, host):
        if host is None:
            if len(self.hosts) != 1:
                raise ValueError("lab %s has hosts %s: name one" % (self.name, ", ".join(self.hosts)))
            return next(iter(self.hosts))
        return host

    def ssh(self, command, host=None, user="root", stdin=None, timeout=120):
        """Run a shell command on a host (the only one when host is None) as `user`; returns (rc, stdout)."""
        proc = subprocess.run(
            ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(self.port(host)), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             "%s@127.0.0.1" % user, command], input=stdin, capture_output=True, text=True, check=False,
            timeout=timeout)
        return proc.returncode, proc.stdout

    def host_json(self, path, host=None):
        """A JSON file of a host (state files: current_plan.json...), parsed; asserts it can be read."""
        rc, out = self.ssh("cat " + path, host)
        assert rc == 0, path
        return json.loads(out)


def layered_copy(inventory, name):
    """A copy of a checked-in lab inventory (.lab/inventories/<name>/) whose hosts boot from the provisioned layers:
    its group_vars and host_vars files linked, hosts.yml with lab_layer added to every host (by its own
    topolaunch_sglang_version), and group_vars/all/zz-layered-copy.yml with the lab's ssh key (inventory/lab's
    connection.yml finds it relative to the inventory directory). Returns the copy's directory."""
    copy = ROOT / ".lab" / "inventories" / name
    if copy.exists():
        shutil.rmtree(copy)
    copy.mkdir(parents=True)
    for sub in ("group_vars", "host_vars"):
        src = inventory / sub
        for f in sorted(src.rglob("*")) if src.is_dir() else []:
            dest = copy / f.relative_to(inventory)
            if f.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.symlink_to(f.resolve())
    (copy / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (copy / "group_vars" / "all" / "zz-layered-copy.yml").write_text(yaml.safe_dump(
        {"ansible_ssh_private_key_file": str(SSH_KEY)}))
    data = yaml.safe_load((inventory / "hosts.yml").read_text())

    def walk(group):
        for host, hv in ((group or {}).get("hosts") or {}).items():
            group["hosts"][host] = dict(hv or {}, **provisioned((hv or {}).get("topolaunch_sglang_version")))
        for child in ((group or {}).get("children") or {}).values():
            walk(child)
    for group in data.values():
        walk(group)
    (copy / "hosts.yml").write_text(yaml.safe_dump(data))
    return copy


@contextlib.contextmanager
def bounded_client(ssh, port):
    """A client on a lab host (`ssh`: the argv that runs a command there) sending requests to the API on `port`
    back to back while the block runs: at most 3000, each with its own 20 s timeout, the whole client bounded by
    timeout 400. Yields the list its HTTP codes go to (a rolling relaunch must leave only 200s)."""
    body = json.dumps({"text": "rolling", "sampling_params": {"max_new_tokens": 4}})
    subprocess.run(ssh + ["printf '%s' > /tmp/rolling.json" % body], check=True, timeout=60)
    client = subprocess.Popen(ssh + [  # pylint: disable=consider-using-with
        "rm -f /tmp/rolling.stop; timeout 400 bash -c 'for i in $(seq 3000); do [ -e /tmp/rolling.stop ] && "
        "break; curl -s -o /dev/null -w \"%%{http_code}\\n\" -m 20 -H Content-Type:application/json "
        "-d @/tmp/rolling.json http://127.0.0.1:%d/generate; done'" % port], stdout=subprocess.PIPE, text=True)
    codes = []
    try:
        yield codes
    finally:
        subprocess.run(ssh + ["touch /tmp/rolling.stop"], check=False, timeout=60)
        codes.extend(client.communicate(timeout=60)[0].split())

