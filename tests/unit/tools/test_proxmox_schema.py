"""tools/proxmox_schema.py: the excerpt is built from Proxmox's sources (apidata.js, PCI.pm, Memory.pm, QemuServer.pm,
CpuSet.pm) and the committed module_utils/topolaunch/proxmox_api_schema.py is what the tool renders; a refresh from
git repositories of the same layout reproduces it."""
import json
import subprocess

import pytest

import paths
from ansible_collections.topolaunch.sglang.plugins.module_utils.proxmox_api_schema import SCHEMA

ROOT = paths.ROOT
tool = paths.load_script(ROOT / "tools" / "proxmox_schema.py", "proxmox_schema_tool")

PCI_PM = r"""
our $MAX_HOSTPCI_DEVICES = 16;

my $PCIRE = qr/(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?/;
my $hostpci_fmt = {
    host => {
        default_key => 1,
        optional => 1,
        type => 'string',
        pattern => qr/$PCIRE(;$PCIRE)*/,
        format_description => 'HOSTPCIID[;HOSTPCIID2...]',
    },
    pcie => {
        type => 'boolean',
        optional => 1,
        default => 0,
    },
    'driver' => {
        type => 'string',
        optional => 1,
        enum => [qw(vfio keep)],
    },
};
"""
QEMU_SERVER_PM = 'sub pve_verify_cpuset {\n    if ($@) {\n        die "unable to parse cpuset option\\n";\n    }\n}\n'
CPUSET_PM = "        if ($part =~ /^\\s*(\\d+)(?:-(\\d+))?\\s*$/) {\n"
MEMORY_PM = "our $MAX_NUMA = 8;\n"
QEMU_PM = r"""
my $cpuoptions = {
    'cores' => 1,
    'cpu' => 1,
    'numa' => 1,
    'sockets' => 1,
};

my $memoryoptions = {
    'memory' => 1,
};

my $hwtypeoptions = {
    'machine' => 1,
};

my $check_vm_modify_config_perm = sub {
    my ($rpcenv, $authuser, $vmid, $pool, $key_list) = @_;
    foreach my $opt (@$key_list) {
        if ($cpuoptions->{$opt} || $opt =~ m/^numa\d+$/) {
            $rpcenv->check_vm_perm($authuser, $vmid, $pool, ['VM.Config.CPU']);
        } elsif ($memoryoptions->{$opt}) {
            $rpcenv->check_vm_perm($authuser, $vmid, $pool, ['VM.Config.Memory']);
        } elsif ($hwtypeoptions->{$opt}) {
            $rpcenv->check_vm_perm($authuser, $vmid, $pool, ['VM.Config.HWType']);
        } else {
            die "only root can set '$opt' config\n";
        }
    }
    return 1;
};
"""


def apidata(props):
    tree = [{"path": "/nodes", "children": [{"path": "/nodes/{node}/qemu/{vmid}/config",
                                               "info": {"PUT": {"parameters": {"properties": props}}}}]}]
    return "const apiSchema = " + json.dumps(tree) + "\n;\n"


def full_props():
    props = {k: {"type": "string", "optional": 1, "description": "dropped"} for k in tool.KEYS}
    props["numa[n]"]["format"] = {"cpus": {"type": "string", "pattern": "(?^:\\d+(?:-\\d+)?(?:;\\d+(?:-\\d+)?)*)"}}
    return props


def test_parameters_come_from_apidata_with_perl_patterns_made_python():
    params = tool.api_parameters(apidata(full_props()))
    assert set(params) == set(tool.KEYS)
    assert "description" not in params["args"]
    assert params["numa[n]"]["format"]["cpus"]["pattern"] == "\\d+(?:-\\d+)?(?:;\\d+(?:-\\d+)?)*"


def test_a_missing_parameter_is_named():
    props = full_props()
    del props["affinity"]
    with pytest.raises(tool.SchemaError, match="lacks affinity"):
        tool.api_parameters(apidata(props))


def test_hostpci_format_from_pci_pm():
    fmt = tool.hostpci_format(PCI_PM)
    assert fmt["host"]["pattern"].startswith("(?:[a-f0-9]{4,}:)?") and "$PCIRE" not in fmt["host"]["pattern"]
    assert fmt["host"]["default_key"] == 1 and fmt["pcie"] == {"type": "boolean", "optional": 1}
    assert fmt["driver"]["enum"] == ["vfio", "keep"]
    assert tool.perl_int(PCI_PM, "MAX_HOSTPCI_DEVICES", "PCI.pm") == 16


def test_cpuset_format_and_missing_source_text():
    assert tool.cpuset_format(QEMU_SERVER_PM, CPUSET_PM) == {
        "type": "cpuset", "part_pattern": "\\s*(\\d+)(?:-(\\d+))?\\s*", "error": "unable to parse cpuset option"}
    with pytest.raises(tool.SchemaError):
        tool.cpuset_format("", CPUSET_PM)


def test_privileges_from_qemu_pm():
    got = tool.privileges(QEMU_PM)
    assert got["numa[n]"] == got["cores"] == got["numa"] == "VM.Config.CPU" and got["memory"] == "VM.Config.Memory"
    assert got["machine"] == "VM.Config.HWType"
    assert got["args"] == got["affinity"] == got["hugepages"] == got["hostpci[n]"] == "root@pam"
    with pytest.raises(tool.SchemaError, match="check_vm_modify_config_perm"):
        tool.privileges("")


def test_committed_excerpt_is_what_render_writes():
    text = (ROOT / "module_utils" / "topolaunch" / "proxmox_api_schema.py").read_text()
    assert text == tool.render(SCHEMA)
    for name in ("pve-docs", "qemu-server", "pve-common"):
        src = SCHEMA["sources"][name]
        assert len(src["commit"]) == 40 and src["version"] in text


def _repo(path, files):
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True)


def test_refresh_from_git_repositories(tmp_path):
    _repo(tmp_path / "docs", {"api-viewer/apidata.js": apidata(full_props()),
                              "debian/changelog": "pve-docs (9.9.1) trixie; urgency=medium\n"})
    _repo(tmp_path / "qs", {"src/PVE/QemuServer/PCI.pm": PCI_PM, "src/PVE/QemuServer/Memory.pm": MEMORY_PM,
                            "src/PVE/QemuServer.pm": QEMU_SERVER_PM, "src/PVE/API2/Qemu.pm": QEMU_PM,
                            "debian/changelog": "qemu-server (9.9.2) trixie; urgency=medium\n"})
    _repo(tmp_path / "common", {"src/PVE/CpuSet.pm": CPUSET_PM,
                                "debian/changelog": "libpve-common-perl (9.9.3) trixie; urgency=medium\n"})
    out = tmp_path / "schema.py"
    argv = ["--pve-docs", str(tmp_path / "docs"), "--qemu-server", str(tmp_path / "qs"),
            "--pve-common", str(tmp_path / "common"), "--out", str(out)]
    assert tool.main(argv) == 0
    text = out.read_text()
    assert "qemu-server 9.9.2" in text and "Do not edit" in text
    assert tool.main(argv + ["--check"]) == 0
    out.write_text(text + "# edited\n")
    assert tool.main(argv + ["--check"]) == 1
    assert tool.main(["--pve-docs", str(tmp_path / "docs"), "--out", str(out)]) == 2
