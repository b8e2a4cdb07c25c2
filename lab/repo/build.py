#!/usr/bin/env python3
"""Build the lab's stand-in package repository (served to lab hosts over HTTP by lab/lab.py).

    lab/repo/build.py --out build/repo

Layout of OUT (the URL root, inventory var `lab_repo_url`):

    apt/debian12/x86_64/     flat apt repository like NVIDIA's CUDA repository for Debian 12: stand-in .debs with
                             the real package names (open driver branches 570/580/590, nvidia-persistenced,
                             cuda-toolkit-12-8/12-9/13-0, cuda-toolkit-13), Packages(.gz), Release signed as
                             InRelease and Release.gpg
    keyring/<port>/          cuda-keyring_1.1-1_all.deb whose sources list points at http://127.0.0.1:<port>/apt/...
                             (the real cuda-keyring hard-codes NVIDIA's URL; each lab serves on its own port)
    pip/                     the SGLang simulator wheels (sglang-0.5.9+sim, sglang-0.5.23+sim) + the PyPI wheels the
                             lab venvs need, index.html for --find-links
    pip-client/              the REAL SGLang 0.5.9 wheel and the wheels its benchmark client imports (Python 3.11,
                             manylinux x86_64), sglang-0.5.9-client.txt (the pinned list), index.html: what a lab
                             host needs to run SGLang's own client offline in a venv of its own (README.md, "The
                             real benchmark client")
    apt/debian12/x86_64/ also carries the REAL Debian 12 packages of the monitoring stage (DEBIAN_DEBS: prometheus,
                             prometheus-node-exporter and what they need beyond the lab's rootfs) and numactl
                             (with libnuma1, for SGLang's --numa-node), downloaded from
                             Debian once into build/debian-debs/ and checked against their pinned sha256: lab hosts
                             install them offline, as a real box installs them from its mirror
    models/<name>.tar        stand-in model directory (config.json + model.safetensors.index.json, no weights) and
                             a generated word-level tokenizer (tokenizer.json, tokenizer_config.json)
    hf/                      static stand-in of the Hugging Face endpoints the model_weights pre-checks read

The signing key is generated once into OUT-signing/ (next to OUT, not served) and reused, so keyring packages
built earlier stay valid. The driver library package carries the fake NVML (build/fakenvml, `make fakenvml`).
Re-running is cheap: pip wheels are downloaded only when the wanted set changed (pip/.download-stamp,
pip-client/.download-stamp); the real SGLang wheel comes from build/wheels (tools/sglang_flags.py's cache).
"""
import argparse
import gzip
import hashlib
import html
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DISTRO = "debian12"
ARCH = "x86_64"
MAINTAINER = "topolaunch lab <lab@topolaunch.invalid>"
KEY_UID = "topolaunch lab repository (stand-in for NVIDIA CUDA) <lab@topolaunch.invalid>"
KEYRING_VERSION = "1.1-1"
KEYRING_PATH = "/usr/share/keyrings/cuda-archive-keyring.gpg"

# Driver branches as NVIDIA's Debian 12 repository versions them. 590 exists so that pinning 580 means something.
DRIVER_VERSIONS = {"570": "570.195.03-1", "580": "580.95.05-1", "590": "590.44.01-1"}

# CUDA toolkits: package version and what the real nvcc --version prints for that release.
CUDA_TOOLKITS = {
    "12.8": {"version": "12.8.1-1", "nvcc": "V12.8.93", "built": "Fri_Feb_21_20:23:50_PST_2025",
             "build": "cuda_12.8.r12.8/compiler.35583870_0"},
    "12.9": {"version": "12.9.1-1", "nvcc": "V12.9.86", "built": "Tue_May_27_02:21:03_PDT_2025",
             "build": "cuda_12.9.r12.9/compiler.36037853_0"},
    # 13.0 Update 2, the toolkit SGLang 0.5.23's torch 2.14.1 is built against (cuda-toolkit==13.0.3 on PyPI);
    # needs driver >= 580.65.06
    "13.0": {"version": "13.0.2-1", "nvcc": "V13.0.88", "built": "Wed_Aug_20_01:57:39_PM_PDT_2025",
             "build": "cuda_13.0.r13.0/compiler.36424714_0"},
}
# NVIDIA's per-major metapackage (cuda-toolkit-13 -> the newest cuda-toolkit-13-<minor>), for the majors it exists
# for in the lab: CUDA 13 (SGLang 0.5.23's)
CUDA_MAJOR_METAPACKAGES = {"13": "13.0"}

# Hugging Face stand-in: repo id -> (pinned revision, gated). The lab inventory pins the same revision.
HF_REPOS = {
    "nvidia/GLM-5-NVFP4": ("3c5a8b2e9d41f07a6b1c2d3e4f5a6b7c8d9e0f1a", False),
    "topolaunch-lab/gated-model": ("0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e", "manual"),
}

# More stand-in models as archives beside the main one (models/<name>.tar): a 70B-class dense model that fits on
# four of the field spec's GPUs, for DP layouts of one replica per socket (tp4dp2).
STANDIN_MODELS = {"llama-3.1-70b": ROOT / "tests/fixtures/models/llama-3.1-70b"}

TMPFILES_CONF = "d /run/fake-nvml 1777 root root -\n"
PERSISTENCED = """#!/bin/sh
# topolaunch lab stand-in for nvidia-persistenced: there is no kernel driver to keep initialised in the lab.
# It checks that NVML (the fake) answers, then idles so that systemd sees a running persistence daemon.
if ! /usr/bin/nvidia-smi -L; then
    echo "nvidia-persistenced (lab stand-in): NVML does not answer" >&2
    exit 1
fi
exec sleep infinity
"""
PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (topolaunch lab stand-in)

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""


# Real Debian 12 packages carried by the lab repository: (package, version, sha256, path under the Debian archive).
# prometheus and prometheus-node-exporter as the monitoring role installs them (roles/monitoring/defaults/main.yml
# pins the same versions), and their dependencies missing from the lab rootfs (lab/lab.py PACKAGES), as `apt-get
# install -s --no-install-recommends prometheus prometheus-node-exporter` lists them there. promtool (make rules)
# comes from the same prometheus .deb. pool/updates/ paths are Debian's security archive.
DEBIAN_DEBS = [
    ("libjs-jquery", "3.6.1+dfsg+~3.5.14-1", "a58c9ff6afe96c769cb6535754c909410760e4efa1e1540236194e489adcfb25",
     "pool/main/n/node-jquery/libjs-jquery_3.6.1+dfsg+~3.5.14-1_all.deb"),
    ("libjs-jquery-hotkeys", "0~20130707+git2d51e3a9+dfsg-2.1",
     "4a1eccaad84f0208932d5574864d9975022d5edc192799104f06082adadb9d91",
     "pool/main/libj/libjs-jquery-hotkeys/libjs-jquery-hotkeys_0~20130707+git2d51e3a9+dfsg-2.1_all.deb"),
    ("fonts-glyphicons-halflings", "1.009~3.4.1+dfsg-3+deb12u2",
     "5a570d64fab14243a277771c9d5493f2b0e0e15e77a04c57caf3f28274d194bf",
     "pool/updates/main/t/twitter-bootstrap3/fonts-glyphicons-halflings_1.009~3.4.1+dfsg-3+deb12u2_all.deb"),
    ("javascript-common", "11+nmu1", "e144ab36fedb6f9ae02b1030b49258f99126f5ebbecd49957f84a42436bbcbfd",
     "pool/main/j/javascript-common/javascript-common_11+nmu1_all.deb"),
    ("libjs-popper.js", "1.16.1+ds-6", "4eac75024544eb50b93141586317671d20feb7c405adbe5ab426dfb8bccb1dbc",
     "pool/main/p/popper.js/libjs-popper.js_1.16.1+ds-6_all.deb"),
    ("libjs-bootstrap4", "4.6.1+dfsg1-4+deb12u1", "975b5761281c694676757aa48c5f9a5e4d093c8d661b885221eaccce811bc58b",
     "pool/main/t/twitter-bootstrap4/libjs-bootstrap4_4.6.1+dfsg1-4+deb12u1_all.deb"),
    ("libjs-bootstrap", "3.4.1+dfsg-3+deb12u2", "c2b732105ac8f99948ae242fa1c1a95f0daebd569f4233c997e011ee71bf1229",
     "pool/updates/main/t/twitter-bootstrap3/libjs-bootstrap_3.4.1+dfsg-3+deb12u2_all.deb"),
    ("libjs-moment", "2.29.4+ds-1", "1d77475a3db570ac3b8ab56cf612bd64271f4da367e8819ee59ecf43eb25c180",
     "pool/main/n/node-moment/libjs-moment_2.29.4+ds-1_all.deb"),
    ("libjs-eonasdan-bootstrap-datetimepicker", "4.17.47-6",
     "335cc1896e77b7664e611d50a78c373d03a064c31f379ccfdf7e660b6bc43dd2",
     "pool/main/e/eonasdan-bootstrap-datetimepicker/libjs-eonasdan-bootstrap-datetimepicker_4.17.47-6_all.deb"),
    ("libjs-moment-timezone", "0.5.40+dfsg-1+2023c", "6b4673458531f2ea331f130dd9e88dfaf684175dd2973d3911b6a2ff55a664f0",
     "pool/main/m/moment-timezone.js/libjs-moment-timezone_0.5.40+dfsg-1+2023c_all.deb"),
    ("libjs-mustache", "3.0.1-1", "ab00ed3fa806a37de9399975ab1780786a160619eeb96abd8f9d09bfd864b22f",
     "pool/main/m/mustache.js/libjs-mustache_3.0.1-1_all.deb"),
    ("libjs-d3", "3.5.17-4", "08b73c423d0a3bb7b657eebf5f7ebac501931cbdcf6422da3a634f7baa263749",
     "pool/main/d/d3/libjs-d3_3.5.17-4_all.deb"),
    ("libjs-rickshaw", "1.5.1.dfsg-5", "6e9328a86c2d4d8f84f8404467484dfe94f72d932d5a546771a7b10cd725ccc1",
     "pool/main/r/rickshaw/libjs-rickshaw_1.5.1.dfsg-5_all.deb"),
    ("prometheus", "2.42.0+ds-5+deb12u1", "81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55",
     "pool/main/p/prometheus/prometheus_2.42.0+ds-5+deb12u1_amd64.deb"),
    ("prometheus-node-exporter", "1.5.0-1+b6", "8cb5b39627595ea2cf3cd27be593e0e9af87023d29e1c5b8487e2f9510097e09",
     "pool/main/p/prometheus-node-exporter/prometheus-node-exporter_1.5.0-1+b6_amd64.deb"),
    # numactl, through which SGLang starts each scheduler bound to its --numa-node (the sglang role installs it,
    # pinned in roles/sglang/defaults/main.yml), and the libnuma it needs
    ("libnuma1", "2.0.16-1", "639e1ab6bd66ead40db8a22c332d7199679fa22db261cac34444eb8eb4c17dda",
     "pool/main/n/numactl/libnuma1_2.0.16-1_amd64.deb"),
    ("numactl", "2.0.16-1", "a46c5dfc06fbf1bb44c4c00b58cfc3a202479f3dd99df99bda069e416abd592a",
     "pool/main/n/numactl/numactl_2.0.16-1_amd64.deb"),
]
DEBIAN_ARCHIVE = "http://deb.debian.org/debian/"
DEBIAN_SECURITY_ARCHIVE = "http://deb.debian.org/debian-security/"
DEBIAN_CACHE = ROOT / "build" / "debian-debs"


def debian_deb(name, cache=DEBIAN_CACHE):
    """The pinned Debian package NAME (DEBIAN_DEBS) in `cache`, downloaded once and checked against its sha256."""
    for package, version, digest, path in DEBIAN_DEBS:
        if package == name:
            break
    else:
        raise KeyError(f"{name} is not in DEBIAN_DEBS")
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / path.rsplit("/", 1)[1]
    if dest.is_file() and sha(dest, "sha256") == digest:
        return dest
    base = DEBIAN_SECURITY_ARCHIVE if path.startswith("pool/updates/") else DEBIAN_ARCHIVE
    tmp = dest.with_suffix(".part")
    with urllib.request.urlopen(base + path, timeout=120) as resp, open(tmp, "wb") as f:
        shutil.copyfileobj(resp, f)
    got = sha(tmp, "sha256")
    if got != digest:
        tmp.unlink()
        sys.exit(f"{base + path}: sha256 {got}, pinned {digest} ({package} {version}): refusing it")
    os.replace(tmp, dest)
    return dest


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def sha(path, algo):
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_deb(outdir, name, version, description, files=None, depends=None, arch="amd64", scripts=None,
              conffiles=(), extra=None):
    """Build NAME_VERSION_ARCH.deb with dpkg-deb. files: {abs path: (bytes, mode)}."""
    files = files or {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        (root / "DEBIAN").mkdir(parents=True)
        size = 0
        for path, (data, mode) in files.items():
            dest = root / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if data is None:
                dest.mkdir(exist_ok=True)
                continue
            dest.write_bytes(data)
            dest.chmod(mode)
            size += len(data)
        control = {
            "Package": name, "Version": version, "Architecture": arch, "Maintainer": MAINTAINER,
            "Installed-Size": str(max(1, (size + 1023) // 1024)), "Section": "multiverse/devel",
            "Priority": "optional",
        }
        if depends:
            control["Depends"] = ", ".join(depends)
        control.update(extra or {})
        lines = [f"{k}: {v}" for k, v in control.items()]
        summary, _, body = description.partition("\n")
        lines.append(f"Description: {summary}")
        for line in (body or "topolaunch lab stand-in: no real NVIDIA software inside.").splitlines():
            lines.append(" " + (line or "."))
        (root / "DEBIAN" / "control").write_text("\n".join(lines) + "\n")
        if conffiles:
            (root / "DEBIAN" / "conffiles").write_text("".join(c + "\n" for c in conffiles))
        for script, text in (scripts or {}).items():
            p = root / "DEBIAN" / script
            p.write_text(text)
            p.chmod(0o644 if script == "triggers" else 0o755)
        deb = Path(outdir) / f"{name}_{version}_{arch}.deb"
        run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)], stdout=subprocess.DEVNULL)
    return deb


def doc(name, text):
    return {f"/usr/share/doc/{name}/README.lab": (text.encode(), 0o644)}


def driver_packages(outdir, fakenvml):
    lib = (fakenvml / "libnvidia-ml.so.1").read_bytes()
    smi = (fakenvml / "nvidia-smi").read_bytes()
    for branch, version in DRIVER_VERSIONS.items():
        upstream = version.split("-")[0]
        exact = f"(= {version})"
        build_deb(
            outdir, "libnvidia-ml1", version,
            "NVIDIA Management Library (NVML) runtime library (lab stand-in)\n"
            "Installs the lab's fake libnvidia-ml.so.1, which serves /etc/fake-nvml/spec.json as GPUs.",
            files={"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": (lib, 0o644),
                   "/usr/lib/tmpfiles.d/fake-nvml.conf": (TMPFILES_CONF.encode(), 0o644),
                   **doc("libnvidia-ml1", f"Fake NVML standing in for driver {upstream}.\n")},
            scripts={
                "postinst": "#!/bin/sh\nset -e\n"
                            "if [ \"$1\" = configure ] && command -v systemd-tmpfiles >/dev/null; then\n"
                            "    systemd-tmpfiles --create /usr/lib/tmpfiles.d/fake-nvml.conf\nfi\n",
                "triggers": "activate-noawait ldconfig\n"},
        )
        build_deb(outdir, "nvidia-smi", version,
                  "NVIDIA System Management Interface (lab stand-in)\nAnswers from the fake NVML.",
                  files={"/usr/bin/nvidia-smi": (smi, 0o755)}, depends=[f"libnvidia-ml1 {exact}"])
        build_deb(outdir, "nvidia-persistenced", version, "daemon to maintain persistent software state in the NVIDIA driver",
                  files={"/usr/bin/nvidia-persistenced": (PERSISTENCED.encode(), 0o755),
                         "/lib/systemd/system/nvidia-persistenced.service": (PERSISTENCED_UNIT.encode(), 0o644)},
                  depends=[f"nvidia-smi {exact}"])
        build_deb(outdir, "nvidia-kernel-open-dkms", version,
                  "NVIDIA binary kernel module DKMS source (open GPU kernel modules edition, lab stand-in)\n"
                  "No module: a kernel module cannot load in a systemd-nspawn lab host.",
                  files={f"/usr/src/nvidia-{upstream}/README.lab":
                         (b"No kernel module source: the topolaunch lab cannot load kernel modules.\n", 0o644)},
                  extra={"Provides": "nvidia-kernel-dkms-any", "Conflicts": "nvidia-kernel-dkms"})
        build_deb(outdir, "nvidia-driver-cuda", version, "NVIDIA driver CUDA integration components (lab stand-in)",
                  depends=[f"libnvidia-ml1 {exact}", f"nvidia-smi {exact}"],
                  extra={"Recommends": f"nvidia-persistenced {exact}"})
        build_deb(outdir, "nvidia-open", version, "NVIDIA driver with open kernel modules, metapackage (lab stand-in)",
                  depends=[f"nvidia-driver-cuda {exact}", f"nvidia-kernel-open-dkms {exact}"], arch="amd64")
        print(f"  driver branch {branch}: {version}")


def cuda_packages(outdir):
    for release, info in CUDA_TOOLKITS.items():
        dash = release.replace(".", "-")
        prefix = f"/usr/local/cuda-{release}"
        nvcc = (
            "#!/bin/sh\n# topolaunch lab stand-in for nvcc: only --version is implemented.\n"
            "case \"$1\" in\n  --version|-V)\n    cat <<'EOF'\n"
            "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
            f"Built on {info['built']}\nCuda compilation tools, release {release}, {info['nvcc']}\n"
            f"Build {info['build']}\nEOF\n    ;;\n"
            "  *)\n    echo \"nvcc (topolaunch lab stand-in): only --version is implemented\" >&2\n    exit 1\n    ;;\nesac\n"
        )
        full = info["version"].split("-")[0]
        version_json = json.dumps({"cuda": {"name": "CUDA SDK", "version": full}}, indent=3) + "\n"
        prio = release.replace(".", "")
        build_deb(
            outdir, f"cuda-toolkit-{dash}", info["version"], f"CUDA Toolkit {release} (lab stand-in)",
            files={f"{prefix}/bin/nvcc": (nvcc.encode(), 0o755),
                   f"{prefix}/lib64": (None, 0o755),
                   f"{prefix}/version.json": (version_json.encode(), 0o644)},
            scripts={
                "postinst": "#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n"
                            f"    update-alternatives --install /usr/local/cuda cuda {prefix} {prio}\n"
                            f"    update-alternatives --install /usr/local/cuda-{release.split('.')[0]} "
                            f"cuda-{release.split('.')[0]} {prefix} {prio}\nfi\n",
                "prerm": "#!/bin/sh\nset -e\nif [ \"$1\" = remove ]; then\n"
                         f"    update-alternatives --remove cuda {prefix}\n"
                         f"    update-alternatives --remove cuda-{release.split('.')[0]} {prefix}\nfi\n",
            },
        )
        print(f"  cuda-toolkit-{dash} {info['version']}")
    for major, release in CUDA_MAJOR_METAPACKAGES.items():
        info = CUDA_TOOLKITS[release]
        build_deb(outdir, f"cuda-toolkit-{major}", info["version"],
                  f"CUDA Toolkit {major} meta-package (lab stand-in): the newest {major}.x toolkit",
                  depends=[f"cuda-toolkit-{release.replace('.', '-')} (>= {info['version']})"])
        print(f"  cuda-toolkit-{major} {info['version']} -> cuda-toolkit-{release.replace('.', '-')}")


def signing_key(gnupg):
    """Generate the repository signing key once; return (gpg env, binary public keyring bytes)."""
    gnupg.mkdir(parents=True, exist_ok=True)
    gnupg.chmod(0o700)
    env = dict(os.environ, GNUPGHOME=str(gnupg))
    listed = subprocess.run(["gpg", "--batch", "--list-secret-keys", "--with-colons"], env=env,
                            capture_output=True, text=True, check=True).stdout
    if "sec:" not in listed:
        print("  generating the repository signing key")
        run(["gpg", "--batch", "--quiet", "--passphrase", "", "--quick-gen-key", KEY_UID, "rsa3072", "sign", "never"],
            env=env)
    keyring = subprocess.run(["gpg", "--batch", "--export", KEY_UID], env=env, capture_output=True, check=True).stdout
    if not keyring:
        sys.exit(f"gpg exported no public key for {KEY_UID!r} from {gnupg}")
    return env, keyring


def index_and_sign(repo, env):
    """Write Packages, Packages.gz, Release, InRelease, Release.gpg for the flat repository REPO."""
    paragraphs = []
    for deb in sorted(repo.glob("*.deb")):
        control = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True,
                                 check=True).stdout.rstrip("\n")
        paragraphs.append(
            f"{control}\nFilename: ./{deb.name}\nSize: {deb.stat().st_size}\nMD5sum: {sha(deb, 'md5')}\n"
            f"SHA1: {sha(deb, 'sha1')}\nSHA256: {sha(deb, 'sha256')}\n")
    packages = "\n".join(paragraphs).encode()
    (repo / "Packages").write_bytes(packages)
    with gzip.GzipFile(repo / "Packages.gz", "wb", mtime=0) as f:
        f.write(packages)
    release = [
        "Origin: topolaunch lab", "Label: NVIDIA CUDA", f"Architecture: {ARCH}",
        "Date: " + time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime()),
        "Description: topolaunch lab stand-in for NVIDIA's CUDA repository",
    ]
    for field, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256"), ("SHA512", "sha512")):
        release.append(f"{field}:")
        for name in ("Packages", "Packages.gz"):
            p = repo / name
            release.append(f" {sha(p, algo)} {p.stat().st_size:>16} {name}")
    (repo / "Release").write_text("\n".join(release) + "\n")
    for name in ("InRelease", "Release.gpg"):
        (repo / name).unlink(missing_ok=True)
    gpg = ["gpg", "--batch", "--quiet", "--yes", "--digest-algo", "SHA512", "--local-user", KEY_UID]
    run(gpg + ["--clearsign", "--output", str(repo / "InRelease"), str(repo / "Release")], env=env)
    run(gpg + ["--armor", "--detach-sign", "--output", str(repo / "Release.gpg"), str(repo / "Release")], env=env)


def keyring_packages(out, keyring, ports):
    """One cuda-keyring per lab port: the sources list names the URL as the real one names NVIDIA's."""
    base = out / "keyring"
    for port in ports:
        url = f"http://127.0.0.1:{port}/apt/{DISTRO}/{ARCH}/"
        pdir = base / str(port)
        pdir.mkdir(parents=True, exist_ok=True)
        build_deb(
            pdir, "cuda-keyring", KEYRING_VERSION, "GPG keyring for the CUDA repository (lab stand-in)\n"
            f"Points apt at the topolaunch lab repository {url} and trusts its signing key.",
            arch="all",
            files={KEYRING_PATH: (keyring, 0o644),
                   f"/etc/apt/sources.list.d/cuda-{DISTRO}-{ARCH}.list":
                       (f"deb [signed-by={KEYRING_PATH}] {url} /\n".encode(), 0o644),
                   "/etc/apt/preferences.d/cuda-repository-pin-600":
                       (b"Package: *\nPin: release l=NVIDIA CUDA\nPin-Priority: 600\n", 0o644)},
            conffiles=[f"/etc/apt/sources.list.d/cuda-{DISTRO}-{ARCH}.list",
                       "/etc/apt/preferences.d/cuda-repository-pin-600"],
        )
    print(f"  cuda-keyring for ports {ports[0]}-{ports[-1]}")


# Build backend for source installs (the sglang role's git method), so that they too build offline in the lab.
BUILD_WHEELS = ["setuptools==80.9.0"]

# The REAL SGLang benchmark client per release that runs it from a venv of its own: the packages its client imports,
# pinned, as the sglang role installs them (roles/topolaunch/defaults/main.yml, topolaunch_sglang_clients; 0.5.9's
# sglang.bench_serving imports no torch). 0.5.23's client imports torch and triton at load: it runs from the
# server's venv (the simulator's client in the lab), not listed there.
def client_packages():
    defaults = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())
    return {version: list(client["packages"]) for version, client in defaults["topolaunch_sglang_clients"].items()
            if client.get("packages")}


CLIENT_PACKAGES = client_packages()

# pip download for the lab hosts' interpreter (Debian 12: CPython 3.11, glibc 2.36)
PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                 "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                 "--platform", "manylinux_2_28_x86_64", "--platform", "linux_x86_64"]


def wanted_wheels():
    """The PyPI packages the lab venvs install: the tools venv's and the GPU exporter's lists from their roles' own
    defaults, the build backend."""
    defaults = yaml.safe_load((ROOT / "roles/topolaunch_tools/defaults/main.yml").read_text())
    monitoring = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
    return (list(defaults["topolaunch_tools_packages"]) + list(monitoring["monitoring_gpu_exporter_packages"])
            + BUILD_WHEELS)


def gateway_requirements():
    """{gateway release: its requirement lines with hashes} from the role topolaunch's release table: the lab hosts
    install the gateway from the lab repository's pip/ with pip --require-hashes, as provisioning does anywhere."""
    defaults = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())
    return {version: list(row["requirements"]) for version, row in defaults["topolaunch_gateway_releases"].items()}


def write_index(directory):
    links = "".join(f'<a href="{html.escape(w.name)}">{html.escape(w.name)}</a><br>\n'
                    for w in sorted(directory.glob("*.whl")))
    (directory / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")


def place(src, dest):
    """Put src at dest unless an identical file is there: a lab may be installing the old one right now."""
    if not dest.exists() or sha(dest, "sha256") != sha(src, "sha256"):
        shutil.copyfile(src, dest.with_suffix(".tmp"))
        os.replace(dest.with_suffix(".tmp"), dest)


def sim_wheels(pipdir, python, sim_builder):
    """Every simulator wheel (one per SGLang release) in pipdir; a wheel no longer built is removed."""
    with tempfile.TemporaryDirectory(dir=pipdir) as tmp:
        run([python, str(sim_builder), "--out", tmp])
        built = sorted(Path(tmp).glob("sglang-*+sim-*.whl"))
        if not built:
            sys.exit(f"{sim_builder} left no sglang-*+sim-*.whl in {tmp}")
        names = {b.name for b in built}
        for old in pipdir.glob("sglang-*.whl"):
            if old.name not in names:
                old.unlink()
        for wheel in built:
            place(wheel, pipdir / wheel.name)
    return [pipdir / name for name in sorted(names)]


def pip_download(python, dest, requirements):
    run([python, "-m", "pip", "download", "--quiet", "--dest", str(dest), *PLATFORM_ARGS, *requirements])


def pip_repo(out, python, sim_builder):
    pipdir = out / "pip"
    pipdir.mkdir(parents=True, exist_ok=True)
    sims = sim_wheels(pipdir, python, sim_builder)
    gateways = gateway_requirements()
    stamp_text = json.dumps([wanted_wheels(), [sha(w, "sha256") for w in sims], gateways])
    stamp = pipdir / ".download-stamp"
    if stamp.exists() and stamp.read_text() == stamp_text:
        print("  pip wheels up to date")
    else:
        print(f"  pip download (Python 3.11, manylinux x86_64): {' '.join(wanted_wheels())} + simulator deps")
        pip_download(python, pipdir, wanted_wheels())
        for wheel in sims:  # one resolve per simulator wheel: two sglang versions cannot be in one
            pip_download(python, pipdir, [f"{wheel}[all]"])  # [all]: the extra the sglang role installs
        for version, lines in gateways.items():  # the model gateway (smg), each wheel checked against its hash
            print(f"  pip download the model gateway {version}: {' '.join(l.split()[0] for l in lines)}")
            with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=pipdir) as req:
                req.write("".join(line + "\n" for line in lines))
                req.flush()
                pip_download(python, pipdir, ["--require-hashes", "--no-deps", "-r", req.name])
        stamp.write_text(stamp_text)
    write_index(pipdir)
    print(f"  pip: {len(list(pipdir.glob('*.whl')))} wheels ({', '.join(w.name for w in sims)})")


def client_repo(out, python, sglang_wheels):
    """pip-client/: the real SGLang wheel of each release in CLIENT_PACKAGES (from the wheel cache, downloaded
    there once with --no-deps) and the wheels of what its client imports, for a venv of its own on a lab host."""
    sys.path.insert(0, str(ROOT / "tools"))
    from sglang_flags import download_wheel  # the one place that knows each release's wheel file

    cdir = out / "pip-client"
    cdir.mkdir(parents=True, exist_ok=True)
    for version, packages in CLIENT_PACKAGES.items():
        real = Path(download_wheel(version, sglang_wheels))
        place(real, cdir / real.name)
        (cdir / f"sglang-{version}-client.txt").write_text(
            f"# What SGLang {version}'s benchmark client imports (install the real sglang=={version} wheel with "
            "--no-deps beside it)\n" + "".join(p + "\n" for p in packages))
    stamp_text = json.dumps(CLIENT_PACKAGES)
    stamp = cdir / ".download-stamp"
    if stamp.exists() and stamp.read_text() == stamp_text:
        print("  pip-client wheels up to date")
    else:
        wanted = sorted({p for packages in CLIENT_PACKAGES.values() for p in packages})
        print(f"  pip download for the real benchmark client (Python 3.11, manylinux x86_64): {' '.join(wanted)}")
        pip_download(python, cdir, wanted)
        stamp.write_text(stamp_text)
    write_index(cdir)
    print(f"  pip-client: {len(list(cdir.glob('*.whl')))} wheels")


# The stand-in model's tokenizer: word-level, one token per whitespace-separated word, which is what the simulator
# counts. Words t0..t{N-1} (the lab client's random-ids words), then [UNK] (id N, special; WordLevel needs it in its
# vocabulary, so tokenizer.vocab_size is N + 1). SGLang's random-ids client draws ids below vocab_size, decodes them
# ("t17 t18 ... [UNK]": no decoder, tokens joined by spaces) and sends the text; the simulator counts one token per
# word, so prompt lengths agree exactly. The simulator's output words are not in the vocabulary: each retokenizes
# to one [UNK], so the client's retokenized output count agrees too.
TOKENIZER_VOCAB = 32000
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def tokenizer_files(vocab_size=TOKENIZER_VOCAB):
    """{file name: bytes} of a Hugging Face tokenizer directory (tokenizers' tokenizer.json format 1.0)."""
    vocab = {f"t{i}": i for i in range(vocab_size)}
    vocab["[UNK]"] = vocab_size
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab_size, "content": "[UNK]", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 202752,
              "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}
    return {"tokenizer.json": json.dumps(tokenizer, separators=(",", ":")).encode() + b"\n",
            "tokenizer_config.json": json.dumps(config, indent=1).encode() + b"\n"}


def model_archive(out, model_dir, name):
    """models/<name>.tar: the fixture's config and weights index, and the generated tokenizer."""
    members = {}
    for f in ("config.json", "model.safetensors.index.json"):
        if not (model_dir / f).is_file():
            sys.exit(f"model fixture {model_dir} lacks {f}")
        members[f] = (model_dir / f).read_bytes()
    members.update(tokenizer_files())
    mdir = out / "models"
    mdir.mkdir(parents=True, exist_ok=True)
    dest = mdir / f"{name}.tar"
    with tarfile.open(dest, "w", format=tarfile.GNU_FORMAT) as tar:
        for arcname, data in members.items():
            info = tarfile.TarInfo(arcname)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid, info.gid, info.uname, info.gname = 0, 0, "root", "root"
            tar.addfile(info, io.BytesIO(data))
    print(f"  models/{dest.name} from {model_dir} (+ tokenizer)")
    return json.loads(members["model.safetensors.index.json"])


def hf_standin(out, index):
    """Files at the paths the model_weights pre-checks request from a Hugging Face endpoint."""
    hf = out / "hf"
    for repo_id, (revision, gated) in HF_REPOS.items():
        api = hf / "api/models" / repo_id / "revision"
        api.mkdir(parents=True, exist_ok=True)
        info = {"id": repo_id, "sha": revision, "gated": gated, "private": False,
                "siblings": [{"rfilename": "config.json"}, {"rfilename": "model.safetensors.index.json"}]}
        (api / revision).write_text(json.dumps(info, indent=1) + "\n")
        resolve = hf / repo_id / "resolve" / revision
        resolve.mkdir(parents=True, exist_ok=True)
        (resolve / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    print(f"  hf stand-in: {', '.join(HF_REPOS)}")


def port_range(text):
    lo, _, hi = text.partition("-")
    ports = list(range(int(lo), int(hi or lo) + 1))
    if not ports or ports[0] < 1 or ports[-1] > 65535:
        raise argparse.ArgumentTypeError(f"bad port range {text!r}")
    return ports


def apt_repo(out, args):
    """The signed apt repository, the cuda-keyring packages, the model archive and the Hugging Face stand-in."""
    apt = out / "apt" / DISTRO / ARCH
    if apt.exists():
        shutil.rmtree(apt)
    apt.mkdir(parents=True)
    gpg_env, keyring = signing_key(out.parent / (out.name + "-signing"))
    try:
        driver_packages(apt, args.fakenvml)
        cuda_packages(apt)
        for package, version, _digest, _path in DEBIAN_DEBS:
            shutil.copyfile(debian_deb(package), apt / debian_deb(package).name)
        print(f"  Debian 12 packages: {', '.join(f'{p} {v}' for p, v, _d, _f in DEBIAN_DEBS)}")
        index_and_sign(apt, gpg_env)
    finally:
        # gpg started an agent for the key's home: leave no daemon behind.
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=gpg_env, check=False, capture_output=True)
    keyring_packages(out, keyring, args.keyring_ports)
    (out / "keyring" / "cuda-archive-keyring.gpg").write_bytes(keyring)
    index = model_archive(out, args.model_dir, args.model_name)
    for name, model_dir in STANDIN_MODELS.items():
        if name != args.model_name:
            model_archive(out, model_dir, name)
    hf_standin(out, index)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fakenvml", type=Path, default=ROOT / "build/fakenvml",
                    help="dir with libnvidia-ml.so.1 and nvidia-smi (make fakenvml)")
    ap.add_argument("--model-dir", type=Path, default=ROOT / "tests/fixtures/models/glm-5-nvfp4")
    ap.add_argument("--model-name", default="glm-5-nvfp4")
    ap.add_argument("--sim-builder", type=Path, default=ROOT / "lab/sglang_sim/build_wheel.py")
    ap.add_argument("--keyring-ports", type=port_range, default=port_range("18080-18249"),
                    help="lab repository ports to build a cuda-keyring for (default 18080-18249: every lab test's port)")
    ap.add_argument("--python", default=sys.executable, help="python whose pip downloads the wheels")
    ap.add_argument("--skip-pip", action="store_true",
                    help="leave pip/ and pip-client/ alone (no simulator, no download)")
    ap.add_argument("--sglang-wheels", type=Path, default=ROOT / "build/wheels",
                    help="cache of the real SGLang wheels (tools/sglang_flags.py --download fills it)")
    args = ap.parse_args(argv)

    for f in ("libnvidia-ml.so.1", "nvidia-smi"):
        if not (args.fakenvml / f).is_file():
            sys.exit(f"{args.fakenvml / f} is missing: run `make fakenvml` first")
    for tool in ("dpkg-deb", "gpg"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found: apt-get install dpkg gnupg")
    out = args.out.resolve()
    print(f"building the lab repository in {out}")
    # The packages are rebuilt only when what they are made of changed: a rebuild gives new bytes (and a new
    # signature) under the same names, which breaks an apt run of a lab that is installing from this repository.
    stamp = out / ".apt-stamp"
    stamp_text = json.dumps([sha(Path(__file__), "sha256"), [sha(args.fakenvml / f, "sha256") for f in
                             ("libnvidia-ml.so.1", "nvidia-smi")],
                             [[f.name, sha(f, "sha256")] for d in [args.model_dir, *STANDIN_MODELS.values()]
                              for f in sorted(d.iterdir()) if f.is_file()],
                             args.model_name, args.keyring_ports])
    if stamp.exists() and stamp.read_text() == stamp_text and (out / "apt" / DISTRO / ARCH / "InRelease").exists():
        print("  apt packages, keyrings, model archive up to date")
    else:
        stamp.unlink(missing_ok=True)
        apt_repo(out, args)
        stamp.write_text(stamp_text)
    if not args.skip_pip:
        pip_repo(out, args.python, args.sim_builder)
        client_repo(out, args.python, args.sglang_wheels)
    print("done")


if __name__ == "__main__":
    main()
