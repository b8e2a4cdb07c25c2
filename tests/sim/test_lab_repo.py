"""lab/repo/build.py: a signed flat apt repository apt would accept, stand-in packages with the real names and
pinned versions, per-port cuda-keyring, the stand-in model and the Hugging Face stand-in. No lab host needed."""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAKENVML = ROOT / "build" / "fakenvml"
APT = pathlib.Path("apt/debian12/x86_64")

pytestmark = pytest.mark.skipif(
    not (FAKENVML / "libnvidia-ml.so.1").is_file() or not shutil.which("gpgv") or not shutil.which("dpkg-deb"),
    reason="needs `make fakenvml`, gpgv and dpkg-deb")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab") / "repo"
    subprocess.run([sys.executable, str(ROOT / "lab/repo/build.py"), "--out", str(out), "--skip-pip",
                    "--keyring-ports", "18090-18091"], check=True, capture_output=True, text=True)
    return out


def packages(repo):
    """[{field: value}] from the Packages index."""
    paras = (repo / APT / "Packages").read_text().strip().split("\n\n")
    return [dict(line.split(": ", 1) for line in p.splitlines() if not line.startswith(" ")) for p in paras]


def gpgv(repo, *files):
    return subprocess.run(["gpgv", "--keyring", str(repo / "keyring/cuda-archive-keyring.gpg"), *map(str, files)],
                          capture_output=True, text=True, check=False)


def test_a_second_build_leaves_the_repository_alone(repo):
    """Nothing changed: nothing is rewritten (a rebuild gives new bytes under the same names, which breaks a lab
    that is installing from the repository at that moment)."""
    before = {f: (f.stat().st_ino, f.stat().st_mtime_ns) for f in (repo / APT).iterdir()}
    again = subprocess.run([sys.executable, str(ROOT / "lab/repo/build.py"), "--out", str(repo), "--skip-pip",
                            "--keyring-ports", "18090-18091"], check=True, capture_output=True, text=True)
    assert "apt packages, keyrings, model archive up to date" in again.stdout
    assert {f: (f.stat().st_ino, f.stat().st_mtime_ns) for f in (repo / APT).iterdir()} == before


def test_release_is_signed_and_a_changed_release_is_refused(repo, tmp_path):
    assert gpgv(repo, repo / APT / "InRelease").returncode == 0
    assert gpgv(repo, repo / APT / "Release.gpg", repo / APT / "Release").returncode == 0
    forged = tmp_path / "Release"
    forged.write_text((repo / APT / "Release").read_text().replace("Label: NVIDIA CUDA", "Label: NVIDIA CUDX"))
    assert gpgv(repo, repo / APT / "Release.gpg", forged).returncode != 0


def test_release_lists_the_indexes_with_their_sha256(repo):
    release = (repo / APT / "Release").read_text()
    sha256 = release.split("SHA256:\n", 1)[1].split("SHA512:", 1)[0]
    for name in ("Packages", "Packages.gz"):
        data = (repo / APT / name).read_bytes()
        assert f" {hashlib.sha256(data).hexdigest()} {len(data):>16} {name}" in sha256


def test_driver_branches_with_exact_dependencies(repo):
    pkgs = packages(repo)
    versions = {(p["Package"], p["Version"]) for p in pkgs}
    for version in ("570.195.03-1", "580.95.05-1", "590.44.01-1"):
        for name in ("nvidia-open", "nvidia-driver-cuda", "nvidia-kernel-open-dkms", "libnvidia-ml1", "nvidia-smi",
                     "nvidia-persistenced"):
            assert (name, version) in versions
    cuda = next(p for p in pkgs if p["Package"] == "nvidia-driver-cuda" and p["Version"] == "580.95.05-1")
    assert cuda["Depends"] == "libnvidia-ml1 (= 580.95.05-1), nvidia-smi (= 580.95.05-1)"
    for p in pkgs:
        deb = repo / APT / p["Filename"]
        assert hashlib.sha256(deb.read_bytes()).hexdigest() == p["SHA256"]
        assert deb.stat().st_size == int(p["Size"])


def extract(deb, dest):
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest


def test_driver_library_package_carries_the_fake_nvml_and_its_state_dir(repo, tmp_path):
    root = extract(repo / APT / "libnvidia-ml1_580.95.05-1_amd64.deb", tmp_path)
    assert (root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").read_bytes() == \
        (FAKENVML / "libnvidia-ml.so.1").read_bytes()
    assert (root / "usr/lib/tmpfiles.d/fake-nvml.conf").read_text() == "d /run/fake-nvml 1777 root root -\n"


def test_nvcc_stand_in_prints_its_release(repo, tmp_path):
    root = extract(repo / APT / "cuda-toolkit-12-8_12.8.1-1_amd64.deb", tmp_path)
    out = subprocess.run([str(root / "usr/local/cuda-12.8/bin/nvcc"), "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert "Cuda compilation tools, release 12.8, V12.8.93" in out
    assert (root / "usr/local/cuda-12.8/lib64").is_dir()
    bad = subprocess.run([str(root / "usr/local/cuda-12.8/bin/nvcc"), "x.cu"], capture_output=True, check=False)
    assert bad.returncode == 1


def test_keyring_per_port_points_apt_at_that_port(repo, tmp_path):
    root = extract(repo / "keyring/18091/cuda-keyring_1.1-1_all.deb", tmp_path)
    assert (root / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").read_text() == (
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] http://127.0.0.1:18091/apt/debian12/x86_64/ /\n")
    assert (root / "usr/share/keyrings/cuda-archive-keyring.gpg").read_bytes() == \
        (repo / "keyring/cuda-archive-keyring.gpg").read_bytes()
    assert not (repo / "keyring/18092").exists()


def test_stand_in_model_and_hub(repo):
    fixture = ROOT / "tests/fixtures/models/glm-5-nvfp4"
    with tarfile.open(repo / "models/glm-5-nvfp4.tar") as tar:
        assert sorted(tar.getnames()) == ["config.json", "model.safetensors.index.json"]
        assert json.load(tar.extractfile("config.json")) == json.loads((fixture / "config.json").read_text())
    info = json.loads((repo / "hf/api/models/topolaunch-lab/gated-model/revision"
                       / "0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e").read_text())
    assert info["gated"] == "manual"
    index = json.loads((repo / "hf/nvidia/GLM-5-NVFP4/resolve/3c5a8b2e9d41f07a6b1c2d3e4f5a6b7c8d9e0f1a"
                        / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == json.loads(
        (fixture / "model.safetensors.index.json").read_text())["metadata"]["total_size"]


def test_no_gpg_agent_is_left_running(repo):
    """Signing starts a gpg-agent for the repository key's home: the build stops it again."""
    home = str(repo.parent / (repo.name + "-signing"))
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = pathlib.Path("/proc", pid, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "gpg-agent" in cmd and home in cmd:
            left.append((pid, cmd))
    assert not left, left
