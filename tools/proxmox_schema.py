#!/usr/bin/env python3
"""Refresh module_utils/topolaunch/proxmox_api_schema.py: the excerpt of the Proxmox VE API schema topolaunch validates
VM config values against, before any write.

Sources (Proxmox's own git repositories, https://git.proxmox.com):
- pve-docs `api-viewer/apidata.js`: the API schema; the parameters of `PUT /nodes/{node}/qemu/{vmid}/config` kept in
  PARAMETERS are those topolaunch writes or reads to decide (KEYS below).
- qemu-server `src/PVE/QemuServer/PCI.pm`: the named format `pve-qm-hostpci` (apidata.js names it, does not expand it)
  and `$MAX_HOSTPCI_DEVICES`; `src/PVE/QemuServer/Memory.pm`: `$MAX_NUMA`; `src/PVE/QemuServer.pm`: the `pve-cpuset`
  verifier's error text.
- pve-common `src/PVE/CpuSet.pm`: `parse_cpuset` (what a `pve-cpuset` part must look like).
- qemu-server `src/PVE/API2/Qemu.pm`: who may set each key (`$check_vm_modify_config_perm`: the option sets and the
  privilege each needs; a key in none of them, and `hostpciN` with a host address, only root@pam).

    tools/proxmox_schema.py --pve-docs DIR --qemu-server DIR --pve-common DIR   # git checkouts or bare repositories
    tools/proxmox_schema.py --clone                                           # shallow clones from git.proxmox.com

`--check` exits 1 when the committed excerpt differs from what the sources give (nothing written).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import pyliteral  # tools/ is the script's directory (and on pytest's path)

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils", "topolaunch",
                   "proxmox_api_schema.py")
ENDPOINT = "/nodes/{node}/qemu/{vmid}/config"
KEYS = ("affinity", "args", "cores", "cpu", "hostpci[n]", "hugepages", "keephugepages", "machine", "memory", "numa",
        "numa[n]", "sockets")
ORIGIN = "https://git.proxmox.com/git/%s.git"


class SchemaError(Exception):
    """A source does not have what the excerpt needs; the message names the file."""


def git_file(repo, path):
    """A file at HEAD of a git checkout or bare repository."""
    try:
        return subprocess.run(["git", "-C", repo, "show", "HEAD:" + path], check=True, capture_output=True,
                              text=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SchemaError("%s: cannot read %s: %s" % (repo, path, getattr(exc, "stderr", exc)))


def git_source(repo, name):
    """{repository, commit, version}: the version from debian/changelog's first line."""
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    m = re.match(r"\S+ \(([^)]+)\)", git_file(repo, "debian/changelog"))
    if not m:
        raise SchemaError("%s: debian/changelog has no version line" % repo)
    return {"repository": ORIGIN % name, "commit": commit, "version": m.group(1)}


def api_parameters(apidata):
    """The PUT parameters of ENDPOINT, KEYS only, from apidata.js (`const apiSchema = [...];`)."""
    start = apidata.index("[")
    tree, _ = json.JSONDecoder().raw_decode(apidata[start:])

    def find(nodes):
        for node in nodes:
            if node.get("path") == ENDPOINT:
                return node
            hit = find(node.get("children", []))
            if hit:
                return hit
        return None

    node = find(tree)
    if not node or "PUT" not in node.get("info", {}):
        raise SchemaError("apidata.js: no PUT %s" % ENDPOINT)
    props = node["info"]["PUT"]["parameters"]["properties"]
    missing = [k for k in KEYS if k not in props]
    if missing:
        raise SchemaError("apidata.js: PUT %s lacks %s" % (ENDPOINT, ", ".join(missing)))
    keep = ("type", "format", "enum", "pattern", "minimum", "maximum", "maxLength", "optional", "default",
            "default_key", "typetext")
    out = {}
    for key in KEYS:
        schema = {k: v for k, v in props[key].items() if k in keep}
        if isinstance(schema.get("format"), dict):
            schema["format"] = {sub: {k: v for k, v in s.items() if k in keep}
                                for sub, s in schema["format"].items()}
        out[key] = _python_patterns(schema)
    return out


def _perl_re(pattern):
    """A Perl pattern as apidata.js serialises it (`(?^:...)`) or as qr// source, in Python syntax."""
    m = re.fullmatch(r"\(\?\^\w*:(.*)\)", pattern, re.S)
    return m.group(1) if m else pattern


def _python_patterns(schema):
    if "pattern" in schema:
        schema["pattern"] = _perl_re(schema["pattern"])
    if isinstance(schema.get("format"), dict):
        for sub in schema["format"].values():
            _python_patterns(sub)
    return schema


def hostpci_format(pci_pm):
    """pve-qm-hostpci from PCI.pm: `my $hostpci_fmt = { key => { ... }, ... };`, $PCIRE expanded."""
    m = re.search(r"^my \$PCIRE = qr/(.*?)/;$", pci_pm, re.M)
    block = re.search(r"^my \$hostpci_fmt = \{\n(.*?)^\};$", pci_pm, re.M | re.S)
    if not m or not block:
        raise SchemaError("PCI.pm: no $PCIRE or $hostpci_fmt")
    pcire = m.group(1)
    fmt = {}
    for entry in re.finditer(r"^    '?([\w-]+)'? => \{\n(.*?)^    \},$", block.group(1), re.M | re.S):
        name, body = entry.groups()
        sub = {}
        t = re.search(r"^\s+type => '(\w+)',", body, re.M)
        if t:
            sub["type"] = t.group(1)
        p = re.search(r"^\s+pattern => (?:qr/(.*?)/|'(.*?)'),$", body, re.M)
        if p:
            sub["pattern"] = (p.group(1) if p.group(1) is not None else p.group(2)).replace("$PCIRE", pcire)
        e = re.search(r"^\s+enum => \[qw\((.*?)\)\],", body, re.M)
        if e:
            sub["enum"] = e.group(1).split()
        f = re.search(r"^\s+format => '([\w-]+)',", body, re.M)
        if f:
            sub["format"] = f.group(1)
        for flag in ("optional", "default_key"):
            if re.search(r"^\s+%s => 1," % flag, body, re.M):
                sub[flag] = 1
        if "type" not in sub:
            raise SchemaError("PCI.pm: $hostpci_fmt entry %s has no type" % name)
        fmt[name] = sub
    if "host" not in fmt or "pcie" not in fmt:
        raise SchemaError("PCI.pm: $hostpci_fmt without host/pcie")
    return fmt


def perl_int(text, name, where):
    m = re.search(r"^our \$%s = (\d+);$" % name, text, re.M)
    if not m:
        raise SchemaError("%s: no $%s" % (where, name))
    return int(m.group(1))


def cpuset_format(qemu_server_pm, cpuset_pm):
    """pve-cpuset: comma-separated parts, each as parse_cpuset accepts; the verifier's error text."""
    part = re.search(r"if \(\$part =~ /\^(.*?)\$/\)", cpuset_pm)
    err = re.search(r"sub pve_verify_cpuset \{.*?die \"(.*?)\\n\";", qemu_server_pm, re.S)
    if not part or not err:
        raise SchemaError("CpuSet.pm/QemuServer.pm: no parse_cpuset part pattern or pve_verify_cpuset message")
    return {"type": "cpuset", "part_pattern": part.group(1), "error": err.group(1)}


def privileges(qemu_pm):
    """{key: privilege} for KEYS from Qemu.pm: the option sets (`my $cpuoptions = { 'cores' => 1, ... };`) and the
    privilege check_vm_modify_config_perm asks for each set; numaN as it says (VM.Config.CPU); any other key, and
    hostpciN with a host address (check_hostpci_perm), root@pam only."""
    body = re.search(r"^my \$check_vm_modify_config_perm = sub \{\n(.*?)^\};$", qemu_pm, re.M | re.S)
    if not body:
        raise SchemaError("Qemu.pm: no $check_vm_modify_config_perm")
    sets = {}
    for m in re.finditer(r"^my \$(\w+options) = \{\n(.*?)^\};$", qemu_pm, re.M | re.S):
        sets[m.group(1)] = set(re.findall(r"'([\w-]+)' => 1", m.group(2)))
    need = {}
    for m in re.finditer(r"\$(\w+options)->\{\$opt\}.*?check_vm_perm\([^\[]*\['([\w.]+)'", body.group(1), re.S):
        need.setdefault(m.group(1), m.group(2))
    if "cpuoptions" not in need or not re.search(r"numa\\d\+\$/\)", body.group(1)):
        raise SchemaError("Qemu.pm: check_vm_modify_config_perm without the cpu options' privilege")
    out = {}
    for key in KEYS:
        if key == "numa[n]":
            out[key] = need["cpuoptions"]
            continue
        out[key] = next((need[s] for s in need if key in sets.get(s, ())), "root@pam")
    return out


def build(pve_docs, qemu_server, pve_common):
    pci = git_file(qemu_server, "src/PVE/QemuServer/PCI.pm")
    return {
        "sources": {
            "pve-docs": dict(git_source(pve_docs, "pve-docs"), files=["api-viewer/apidata.js"]),
            "qemu-server": dict(git_source(qemu_server, "qemu-server"),
                                files=["src/PVE/QemuServer/PCI.pm", "src/PVE/QemuServer/Memory.pm",
                                       "src/PVE/QemuServer.pm", "src/PVE/API2/Qemu.pm"]),
            "pve-common": dict(git_source(pve_common, "pve-common"), files=["src/PVE/CpuSet.pm"]),
        },
        "endpoint": "PUT " + ENDPOINT,
        "parameters": api_parameters(git_file(pve_docs, "api-viewer/apidata.js")),
        "formats": {
            "pve-qm-hostpci": hostpci_format(pci),
            "pve-cpuset": cpuset_format(git_file(qemu_server, "src/PVE/QemuServer.pm"),
                                        git_file(pve_common, "src/PVE/CpuSet.pm")),
        },
        "privileges": privileges(git_file(qemu_server, "src/PVE/API2/Qemu.pm")),
        "max_index": {"hostpci[n]": perl_int(pci, "MAX_HOSTPCI_DEVICES", "PCI.pm"),
                      "numa[n]": perl_int(git_file(qemu_server, "src/PVE/QemuServer/Memory.pm"), "MAX_NUMA",
                                          "Memory.pm")},
    }


def render(schema):
    src = schema["sources"]
    return ('"""The Proxmox VE API schema excerpt topolaunch validates VM config values against (PUT %s\n'
            'parameters, named formats, index limits, who may set each key), extracted by tools/proxmox_schema.py. Do not edit.\n\n'
            'Sources: pve-docs %s (%s), qemu-server %s (%s), pve-common %s (%s).\n"""\n\n%s\n'
            % (ENDPOINT, src["pve-docs"]["version"], src["pve-docs"]["commit"][:12],
               src["qemu-server"]["version"], src["qemu-server"]["commit"][:12],
               src["pve-common"]["version"], src["pve-common"]["commit"][:12],
               pyliteral.literal("SCHEMA", schema, sort_dicts=True, width=116)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pve-docs")
    ap.add_argument("--qemu-server")
    ap.add_argument("--pve-common")
    ap.add_argument("--clone", action="store_true", help="shallow-clone the three repositories from git.proxmox.com")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            repos = {}
            for name in ("pve-docs", "qemu-server", "pve-common"):
                repo = getattr(args, name.replace("-", "_"))
                if not repo and args.clone:
                    repo = os.path.join(tmp, name)
                    subprocess.run(["git", "clone", "-q", "--depth", "1", ORIGIN % name, repo], check=True)
                if not repo:
                    raise SchemaError("--%s DIR (or --clone) is needed" % name)
                repos[name] = repo
            text = render(build(repos["pve-docs"], repos["qemu-server"], repos["pve-common"]))
    except (SchemaError, subprocess.CalledProcessError) as exc:
        print("proxmox_schema: %s" % exc, file=sys.stderr)
        return 2
    if args.check:
        with open(args.out) as f:
            same = f.read() == text
        print("proxmox_schema: %s" % ("up to date" if same else "differs from the sources: run without --check"))
        return 0 if same else 1
    with open(args.out, "w") as f:
        f.write(text)
    print("proxmox_schema: wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
