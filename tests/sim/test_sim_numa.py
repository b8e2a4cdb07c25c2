"""The simulator binds a scheduler as SGLang's numa_utils.configure_subprocess does (sglang/_sim/numa.py): the
spawn executable is a /tmp script `exec numactl ARGS python "$@"`; 0.5.23 dry-runs numactl first and, when nothing
runs (numactl missing), warns with the release's words and starts the scheduler unbound, or raises with
SGLANG_CRASH_ON_NUMA_BIND_FAILURE; 0.5.9 writes the script unchecked. Strings as the real wheels have them
(523:sglang/srt/utils/numa_utils.py:46-60, 330-374; 59:numa_utils.py:16-38).

numactl here is a script on PATH that records its arguments and succeeds, or fails for memory arguments; the lab
tests run the real one (tests/lab/test_security.py)."""
import json
import logging
import subprocess

import pytest
from simlab import SPECS

import sglang.version  # noqa: E402
from sglang._sim import hardware, numa  # noqa: E402


def as_release(monkeypatch, version):
    monkeypatch.setattr(sglang.version, "__version__", version + "+sim")


@pytest.fixture
def spec(tmp_path):
    """The vnuma spec folded onto a 2-CPU host as lab/lab.py does: node 0's GPUs on CPU 0, node 1's on CPU 1."""
    data = json.loads((SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json").read_text())
    for gpu in data["gpus"]:
        gpu["cpu_affinity"] = str(gpu["numa_node"])
    return hardware.Spec(str(tmp_path / "spec.json"), data)


def fake_numactl(tmp_path, monkeypatch, memory_ok=True):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "numactl.log"
    refuse = "" if memory_ok else ('case "$*" in *--membind*|*--preferred*) echo "libnuma: node out of range" >&2; '
                                   'exit 1;; esac\n')
    (bindir / "numactl").write_text('#!/bin/sh\necho "$*" >> %s\n%sexit 0\n' % (log, refuse))
    (bindir / "numactl").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bindir)
    return log


@pytest.fixture
def host(monkeypatch):
    """This machine's CPUs are 0-1 for the test, its memory on node 0 only, and libnuma answers."""
    monkeypatch.setattr(numa.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(numa.Binder, "host_memory_nodes", lambda self: {0})
    monkeypatch.setattr(numa, "libnuma", lambda: object())
    monkeypatch.setattr(numa, "can_set_mempolicy", lambda: True)


def script_of(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_0_5_23_binds_through_a_numactl_script_translated_to_the_host(tmp_path, monkeypatch, spec, host, caplog):
    as_release(monkeypatch, "0.5.23")
    log = fake_numactl(tmp_path, monkeypatch)
    caplog.set_level(logging.INFO)
    path = numa.Binder(spec).executable(0, 0)
    assert path.startswith("/tmp/sglang_temp_file_") and path.endswith(".sh")
    text = script_of(path)
    assert text.startswith("#!/bin/sh\nexec numactl --physcpubind=0 --membind=0 ") and text.endswith(' "$@"')
    assert log.read_text().splitlines() == ["--physcpubind=0 --membind=0 true"]        # the dry run
    node1 = script_of(numa.Binder(spec).executable(1, 4))
    assert node1.startswith("#!/bin/sh\nexec numactl --physcpubind=1 /")               # no memory on node 1 here
    assert "the lab host has no memory on node 1: numactl binds the CPUs only (--membind=1 left out)" in caplog.text
    assert "the release's `numactl --cpunodebind=1 --membind=1` runs on the lab host as `numactl " \
           "--physcpubind=1`" in caplog.text
    assert "the release's `numactl --cpunodebind=0 --membind=0` runs on the lab host as `numactl " \
           "--physcpubind=0 --membind=0`" in caplog.text


@pytest.mark.parametrize("crash", [False, True])
def test_0_5_23_without_numactl_warns_or_with_the_switch_fails(tmp_path, monkeypatch, spec, host, caplog, crash):
    as_release(monkeypatch, "0.5.23")
    monkeypatch.setenv("PATH", str(tmp_path))                              # no numactl
    if crash:
        monkeypatch.setenv("SGLANG_CRASH_ON_NUMA_BIND_FAILURE", "1")
    reason = ("numactl could not apply NUMA binding for node 0 (e.g. set_mempolicy/sched_setaffinity blocked by "
              "seccomp, or cpuset rejects the policy): [Errno 2] No such file or directory: 'numactl'; skipping "
              "NUMA binding for GPU 0.")
    if crash:
        with pytest.raises(RuntimeError) as err:
            numa.Binder(spec).executable(0, 0)
        assert str(err.value) == reason and type(err.value).__name__ == "RuntimeError"
    else:
        assert numa.Binder(spec).executable(0, 0) is None                  # started unbound
    assert reason in caplog.text


def test_0_5_23_falls_back_to_cpus_only_when_numactl_refuses_memory(tmp_path, monkeypatch, spec, host, caplog):
    as_release(monkeypatch, "0.5.23")
    log = fake_numactl(tmp_path, monkeypatch, memory_ok=False)
    text = script_of(numa.Binder(spec).executable(0, 0))
    assert text.startswith("#!/bin/sh\nexec numactl --physcpubind=0 /")
    assert log.read_text().splitlines() == ["--physcpubind=0 --membind=0 true", "--physcpubind=0 --preferred=0 true",
                                            "--physcpubind=0 true"]
    assert ("numactl rejected memory binding ('--cpunodebind=0 --membind=0'): libnuma: node out of range; falling "
            "back to CPU-only binding ('--cpunodebind=0').") in caplog.text


def test_0_5_23_a_node_outside_the_launchers_cpus_is_a_bind_failure(tmp_path, monkeypatch, spec, host, caplog):
    as_release(monkeypatch, "0.5.23")
    fake_numactl(tmp_path, monkeypatch)
    monkeypatch.setattr(numa.os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setenv("SGLANG_CRASH_ON_NUMA_BIND_FAILURE", "true")
    with pytest.raises(RuntimeError, match=r"^NUMA node 1 has no CPU cores allowed by the current affinity \[0\], "
                                           r"skipping NUMA binding for GPU 4\.$"):
        numa.Binder(spec).executable(1, 4)


def test_0_5_9_writes_the_script_unchecked_and_a_missing_numactl_kills_the_start(tmp_path, monkeypatch, spec,
                                                                                  host):
    as_release(monkeypatch, "0.5.9")
    monkeypatch.setenv("PATH", str(tmp_path))                              # no numactl, no dry run either
    path = numa.Binder(spec).executable(0, 0)
    assert script_of(path).startswith("#!/bin/sh\nexec numactl --physcpubind=0 --membind=0 ")
    res = subprocess.run([path, "-c", "print(1)"], capture_output=True, text=True, env={"PATH": str(tmp_path)},
                         check=False)
    assert res.returncode == 127 and "numactl: not found" in res.stderr


def test_the_lab_folds_a_specs_cpus_onto_the_hosts():
    """lab/lab.py fold_cpus: each NUMA node of the spec keeps CPUs of its own on the host, as far as the host has
    CPUs; a spec whose CPUs the host has is left alone."""
    import importlib.util  # pylint: disable=import-outside-toplevel
    loader = importlib.util.spec_from_file_location("lab_py", str(SPECS.parent / "lab.py"))
    lab_py = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(lab_py)
    data = json.loads((SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json").read_text())
    assert lab_py.fold_cpus(data, [0, 1])
    assert [g["cpu_affinity"] for g in data["gpus"]] == ["0"] * 4 + ["1"] * 4
    data = json.loads((SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json").read_text())
    assert lab_py.fold_cpus(data, range(8)) and data["gpus"][4]["cpu_affinity"] == "4-7"
    assert not lab_py.fold_cpus(data, range(8)) and data["gpus"][0]["cpu_affinity"] == "0-3"
