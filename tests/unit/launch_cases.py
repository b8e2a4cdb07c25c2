"""A target host in a tmp dir, a plan, a scripted systemd and sglang_launch's options: as the tests of launch.py and
the module sglang_launch use them. Files are owned by the user running the tests."""
import os
import pwd

import pytest


ME = pwd.getpwuid(os.getuid()).pw_name
OWNER = (os.getuid(), os.getgid())
UNIT = "topolaunch-sglang.service"
HF_TOKEN = "hf_s3cr3t\"tok"
API_KEY = "sk-v3ry-s3cr3t"


def plan(name="tp8", **kw):
    p = {"layout": {"name": name, "tp": 8, "pp": 1, "dp": 1, "ep": 1, "nnodes": 1},
         "gpu_indices": list(range(8)), "cuda_visible_devices": "0,1,2,3,4,5,6,7",
         "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
         "argv": ["--model-path", "/m", "--tp-size", "8"], "host": "127.0.0.1", "port": 30000,
         "model_path": "/m", "served_model_name": "glm", "sglang_version": "0.5.9",
         "reason": "best", "topology_fingerprint": "a1b2c3d4e5f6"}
    p.update(kw)
    return p


ENV = 'CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"\nHF_TOKEN="hf_s3cr3t\\"tok"\nTOPOLAUNCH_API_KEY="sk-v3ry-s3cr3t"\n'


class Systemd:
    """Scripted systemctl/journalctl: the unit's properties change as systemd's would; `fail` maps a verb to
    (rc, stderr) for the next call of it."""

    def __init__(self, tmp_path, load="not-found", active="inactive", unit_file="", **fail):
        self.unit_path = tmp_path / "systemd" / UNIT
        self.props = {"LoadState": load, "ActiveState": active, "SubState": "dead", "UnitFileState": unit_file,
                      "NeedDaemonReload": "no"}
        self.fail = fail
        self.calls = []
        self.journal = "Load weight begin\nserver_args=ServerArgs(api_key='%s')\nboom\n" % API_KEY

    def verbs(self):
        return [c[1] for c in self.calls if c[0] == "systemctl" and c[1] != "show"]

    def run(self, argv):
        self.calls.append(argv)
        if argv[0] == "journalctl":
            return 0, self.journal, ""
        verb = argv[1]
        if verb in self.fail:
            rc, err = self.fail.pop(verb)
            return rc, "", err
        if verb == "show":
            return 0, "".join("%s=%s\n" % kv for kv in self.props.items()), ""
        if verb == "daemon-reload" and self.unit_path.exists():
            self.props.update(LoadState="loaded", UnitFileState=self.props["UnitFileState"] or "disabled")
        elif verb == "reset-failed":
            if self.props["LoadState"] != "loaded":
                return 1, "", "Failed to reset failed state of unit %s: Unit %s not loaded." % (UNIT, UNIT)
            if self.props["ActiveState"] == "failed":
                self.props["ActiveState"] = "inactive"
        elif verb == "enable":
            self.props["UnitFileState"] = "enabled"
        elif verb == "disable":
            self.props["UnitFileState"] = "disabled"
        elif verb in ("start", "restart"):
            self.props.update(ActiveState="active", SubState="running")
        return 0, "", ""


@pytest.fixture
def host(tmp_path):
    """A target in a tmp dir: the venv python, the model, the directories the module writes to."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "systemd").mkdir()
    return tmp_path


def opts(tmp, state="started", **kw):
    o = {"unit_name": UNIT, "plan": plan(model_path=str(tmp / "m")), "unit_content": "[Service]\nExecStart=/x\n",
         "env_content": ENV, "env_file": str(tmp / "etc" / "sglang.env"), "state_dir": str(tmp / "state"),
         "unit_dir": str(tmp / "systemd"), "python": str(tmp / "venv" / "bin" / "python"), "service_user": ME,
         "sglang_version_file": str(tmp / "etc" / "sglang_version.json"), "force": False, "enabled": True,
         "state": state, "proc_root": str(tmp / "proc"), "port_probe": False,   # no real port looked at
         "force_service_user": True}   # the tests run as whoever runs them: root or a login user
    o.update(kw)
    return o
