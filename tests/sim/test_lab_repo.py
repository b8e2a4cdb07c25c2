"""lab/repo/build.py: a signed flat apt repository apt would accept, stand-in packages with the real names and
pinned versions (CUDA 13 included), per-port cuda-keyring, the stand-in model with its tokenizer, the Hugging Face
stand-in, and pip/ (both simulator wheels) and pip-client/ (the real SGLang client's wheels) with pip download
replaced by a recording stub. No lab host, no network needed."""
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

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


def test_a_70b_stand_in_that_fits_on_four_field_gpus(repo):
    fixture = ROOT / "tests/fixtures/models/llama-3.1-70b"
    with tarfile.open(repo / "models/llama-3.1-70b.tar") as tar:
        assert sorted(tar.getnames()) == ["config.json", "model.safetensors.index.json", "tokenizer.json",
                                          "tokenizer_config.json"]
        index = json.load(tar.extractfile("model.safetensors.index.json"))
    assert index == json.loads((fixture / "model.safetensors.index.json").read_text())
    # 70B-class: its weights need more than one 96 GB GPU of the field spec and fit in four
    assert 96e9 < index["metadata"]["total_size"] < 4 * 96e9 * 0.8


def test_stand_in_model_and_hub(repo):
    fixture = ROOT / "tests/fixtures/models/glm-5-nvfp4"
    with tarfile.open(repo / "models/glm-5-nvfp4.tar") as tar:
        assert sorted(tar.getnames()) == ["config.json", "model.safetensors.index.json", "tokenizer.json",
                                          "tokenizer_config.json"]
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


# ------------------------------------------------------------------------------------------ CUDA 13
def test_cuda_13_stand_ins_print_their_release_and_the_major_metapackage_points_at_it(repo, tmp_path):
    root = extract(repo / APT / "cuda-toolkit-13-0_13.0.2-1_amd64.deb", tmp_path)
    out = subprocess.run([str(root / "usr/local/cuda-13.0/bin/nvcc"), "--version"], capture_output=True,
                         text=True, check=True).stdout
    # what CUDA 13.0 Update 2's nvcc prints
    assert out.splitlines()[-3:] == ["Built on Wed_Aug_20_01:57:39_PM_PDT_2025",
                                     "Cuda compilation tools, release 13.0, V13.0.88",
                                     "Build cuda_13.0.r13.0/compiler.36424714_0"]
    meta = next(p for p in packages(repo) if p["Package"] == "cuda-toolkit-13")
    assert (meta["Version"], meta["Depends"]) == ("13.0.2-1", "cuda-toolkit-13-0 (>= 13.0.2-1)")


# ------------------------------------------------------------------------------------------ the model's tokenizer
def test_the_stand_in_model_tokenizer_counts_words_as_the_simulator_does(repo):
    """SGLang's random-ids client draws ids below tokenizer.vocab_size, decodes them (a tokenizer without decoder
    joins the tokens with spaces) and sends the text; the simulator counts one token per whitespace-separated word.
    Every id must decode to exactly one such word, and any word must encode to one id (WhitespaceSplit, [UNK])."""
    from sglang._sim.server import count_tokens

    with tarfile.open(repo / "models/glm-5-nvfp4.tar") as tar:
        assert "tokenizer.json" in tar.getnames() and "tokenizer_config.json" in tar.getnames()
        tokenizer = json.load(tar.extractfile("tokenizer.json"))
        config = json.load(tar.extractfile("tokenizer_config.json"))
    model = tokenizer["model"]
    assert (model["type"], model["unk_token"], tokenizer["pre_tokenizer"], tokenizer["decoder"],
            tokenizer["post_processor"], tokenizer["normalizer"]) == ("WordLevel", "[UNK]", {"type": "WhitespaceSplit"},
                                                                      None, None, None)
    vocab = model["vocab"]
    by_id = {i: word for word, i in vocab.items()}
    assert sorted(by_id) == list(range(len(vocab)))  # ids 0..n-1, no gaps
    assert all(word.strip() == word and len(word.split()) == 1 and word.isprintable() for word in vocab)
    assert [t["content"] for t in tokenizer["added_tokens"] if t["special"]] == ["[UNK]"]
    ids = [(7 + j) % len(vocab) for j in range(1024)]
    assert count_tokens(" ".join(by_id[i] for i in ids)) == 1024
    assert (config["tokenizer_class"], config["clean_up_tokenization_spaces"]) == ("PreTrainedTokenizerFast", False)
    assert "chat_template" in config  # SGLang's client warns about models without one


# ------------------------------------------------------------------------------------------ pip/ and pip-client/
STUB_PYTHON = """#!/bin/sh
# `python -m pip download ... --dest DIR ...` is recorded and answered with one placeholder wheel; anything else runs
# the real interpreter (the simulator's wheel builder).
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    echo "$*" >> "{log}"
    while [ $# -gt 0 ]; do
        if [ "$1" = "--dest" ]; then touch "$2/placeholder_$(date +%s%N)-1.0-py3-none-any.whl"; fi
        shift
    done
    exit 0
fi
exec "{python}" "$@"
"""


@pytest.fixture(scope="module")
def repo_with_pip(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pip")
    log = tmp / "pip.log"
    python = tmp / "python"
    python.write_text(STUB_PYTHON.format(log=log, python=sys.executable))
    python.chmod(0o755)
    wheels = tmp / "wheels"  # the real SGLang wheel cache (tools/sglang_flags.py); a placeholder stands in
    wheels.mkdir()
    (wheels / "sglang-0.5.9-py3-none-any.whl").write_bytes(b"the real 0.5.9 wheel")
    out = tmp / "lab" / "repo"
    argv = [sys.executable, str(ROOT / "lab/repo/build.py"), "--out", str(out), "--keyring-ports", "18090-18091",
            "--python", str(python), "--sglang-wheels", str(wheels)]
    first = subprocess.run(argv, check=True, capture_output=True, text=True)
    calls = log.read_text().splitlines()
    second = subprocess.run(argv, check=True, capture_output=True, text=True)
    return out, calls, log.read_text().splitlines(), first.stdout, second.stdout


def test_pip_carries_one_simulator_wheel_per_release_and_their_dependencies(repo_with_pip):
    out, calls, _, _, _ = repo_with_pip
    pip = out / "pip"
    assert sorted(w.name for w in pip.glob("sglang-*.whl")) == ["sglang-0.5.23+sim-py3-none-any.whl",
                                                               "sglang-0.5.9+sim-py3-none-any.whl"]
    downloads = [c for c in calls if "--dest %s " % pip in c]
    # one resolve per simulator wheel: two sglang versions cannot be downloaded in one
    for wheel in ("sglang-0.5.9+sim-py3-none-any.whl[all]", "sglang-0.5.23+sim-py3-none-any.whl[all]"):
        assert sum(c.endswith("%s/%s" % (pip, wheel)) for c in downloads) == 1, downloads
    assert all("--python-version 3.11" in c and "--only-binary=:all:" in c for c in downloads)
    index = (pip / "index.html").read_text()
    assert "sglang-0.5.23+sim-py3-none-any.whl" in index and "sglang-0.5.9+sim-py3-none-any.whl" in index


def test_pip_client_carries_the_real_wheel_and_what_its_client_imports(repo_with_pip):
    out, calls, _, _, _ = repo_with_pip
    client = out / "pip-client"
    assert (client / "sglang-0.5.9-py3-none-any.whl").read_bytes() == b"the real 0.5.9 wheel"
    assert not list((out / "pip").glob("sglang-0.5.9-py3*"))  # never where the server venv's pip looks
    pinned = [line for line in (client / "sglang-0.5.9-client.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    # what importing 0.5.9's sglang.bench_serving needs (docs/sglang-versions.md), transformers as its METADATA pins it
    assert sorted(p.split("==")[0] for p in pinned) == ["aiohttp", "datasets", "ipython", "numpy", "pillow",
                                                        "pybase64", "pydantic", "requests", "tqdm", "transformers"]
    assert "transformers==4.57.1" in pinned and all("==" in p for p in pinned)
    downloads = [c for c in calls if "--dest %s " % client in c]
    assert len(downloads) == 1 and all(p in downloads[0].split() for p in pinned)
    assert "--python-version 3.11" in downloads[0] and "--no-deps" not in downloads[0]
    assert "sglang-0.5.9-py3-none-any.whl" in (client / "index.html").read_text()


def test_a_rebuild_downloads_nothing_again(repo_with_pip):
    _, calls, calls_after, _, second = repo_with_pip
    assert calls_after == calls
    assert "pip wheels up to date" in second and "pip-client wheels up to date" in second


def test_pip_carries_the_model_gateway_checked_against_its_hashes(repo_with_pip):
    out, calls, _, _, _ = repo_with_pip
    pip = out / "pip"
    gateway = [c for c in calls if "--dest %s " % pip in c and "--require-hashes" in c]
    # one download per gateway release of the role topolaunch's table, every wheel checked (--require-hashes)
    assert len(gateway) == 1 and "--no-deps -r " in gateway[0] and "--python-version 3.11" in gateway[0]


def test_the_real_debian_packages_of_the_monitoring_stage_are_carried_as_pinned(repo):
    """prometheus and prometheus-node-exporter (and what they need beyond the rootfs) are Debian's own .debs, byte for
    byte (their pinned sha256), at the versions the monitoring role installs."""
    spec = importlib.util.spec_from_file_location("lab_repo_build", ROOT / "lab/repo/build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    index = {p["Package"]: p for p in packages(repo)}
    for name, version, digest, _path in build.DEBIAN_DEBS:
        assert index[name]["Version"] == version and index[name]["SHA256"] == digest, name
    role = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
    for var in ("monitoring_prometheus_package", "monitoring_node_exporter_package"):
        name, _, version = role[var].partition("=")
        assert index[name]["Version"] == version, var
    prom = index["prometheus"]
    missing = [d.split()[0] for d in prom["Depends"].split(", ") if d.split()[0] not in index
               and d.split()[0] not in ("adduser", "libc6")]   # adduser, libc6: in the lab rootfs
    assert missing == []


def test_a_debian_package_that_does_not_match_its_pin_is_refused(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("lab_repo_build2", ROOT / "lab/repo/build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    name, version, _digest, path = build.DEBIAN_DEBS[0]
    src = build.debian_deb(name)  # the real file (cached)
    monkeypatch.setattr(build, "DEBIAN_DEBS", [(name, version, "0" * 64, path)])
    (tmp_path / "c").mkdir()
    monkeypatch.setattr(build.urllib.request, "urlopen", lambda url, timeout: open(src, "rb"))
    with pytest.raises(SystemExit, match="sha256 .*pinned 0{64}.*refusing it"):
        build.debian_deb(name, cache=tmp_path / "c")
    assert not list((tmp_path / "c").iterdir())
