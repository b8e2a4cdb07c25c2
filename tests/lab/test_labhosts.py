"""tests/lab/labhosts.py and lanes.py without lab hosts: a layer's name follows what provisioning depends on and
nothing else, each host of a Lab gets the layer of its release, the lanes take the longest file first.

    .venv/bin/pytest tests/lab/test_labhosts.py
"""
import json
import pathlib

import pytest
import yaml

import labhosts
import lanes

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A repository of the INPUTS' shape under tmp_path, which labhosts hashes instead of this one."""
    for rel, text in {"deploy.yml": "- import_playbook: playbooks/provision.yml\n",
                      "ansible.cfg": "[defaults]\n", "playbooks/provision.yml": "- hosts: all\n",
                      "roles/sglang/tasks/main.yml": "- name: Install\n",
                      "collections/ansible_collections/topolaunch/sglang/galaxy.yml": "name: sglang\n",
                      "inventory/lab/group_vars/all/provision.yml": "sglang_pip_env: {}\n",
                      "lab/sglang_sim/server.py": "SPEED = 1\n", "build/repo/pip/sglang.whl": "wheel",
                      "tests/unit/test_x.py": "def test(): pass\n", "README.md": "# x\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "collections/ansible_collections/topolaunch/sglang/roles").symlink_to(tmp_path / "roles")
    monkeypatch.setattr(labhosts, "ROOT", tmp_path)
    monkeypatch.setattr(labhosts, "LAYERS", tmp_path / ".lab" / "layers")
    monkeypatch.setattr(labhosts, "_INPUTS_HASH", [])
    return tmp_path


def name_after(tree, rel, text, version="0.5.23"):
    """The layer's name once `rel` holds `text` (hashed again)."""
    (tree / rel).parent.mkdir(parents=True, exist_ok=True)
    (tree / rel).write_text(text)
    labhosts._INPUTS_HASH.clear()
    return labhosts.layer_path(version).name


@pytest.mark.parametrize("rel", ["roles/sglang/tasks/main.yml", "build/repo/pip/sglang.whl", "lab/sglang_sim/server.py",
                                 "playbooks/provision.yml", "inventory/lab/group_vars/all/provision.yml",
                                 "ansible.cfg", "roles/sglang/defaults/main.yml"])
def test_a_change_of_what_provisioning_depends_on_names_another_layer(tree, rel):
    before = labhosts.layer_path("0.5.23").name
    assert before.startswith("sglang-0.5.23-")
    assert name_after(tree, rel, "changed\n") != before


@pytest.mark.parametrize("rel", ["tests/unit/test_x.py", "README.md", "roles/sglang/tasks/__pycache__/main.cpython-311.pyc"])
def test_other_changes_keep_the_layer(tree, rel):
    before = labhosts.layer_path("0.5.23").name
    assert name_after(tree, rel, "changed\n") == before


def test_each_release_has_its_own_layer(tree):
    assert labhosts.layer_path("0.5.9") != labhosts.layer_path("0.5.23")


def test_the_collection_view_is_hashed_through_its_links(tree, monkeypatch):
    """roles/ reaches the hash through the collection's symlink too: what Ansible loads."""
    monkeypatch.setattr(labhosts, "INPUTS", ["collections/ansible_collections/topolaunch/sglang"])
    before = labhosts.layer_path("0.5.23").name
    assert name_after(tree, "roles/sglang/tasks/main.yml", "other\n") != before


def test_each_host_boots_from_the_layer_of_its_release(monkeypatch, tmp_path):
    built = []

    def ensure(versions):
        built.append(sorted(set(versions)))
        return {v: tmp_path / ("layer-" + v) for v in versions}
    monkeypatch.setattr(labhosts, "ensure_layers", ensure)
    lab = labhosts.Lab("t-hosts", {"new": {"ansible_port": 2990},
                                   "old": {"ansible_port": 2991, "topolaunch_sglang_version": "0.5.9"},
                                   "bare": {"ansible_port": 2992, "lab_layer": None, "lab_gpu_spec": "h200x2-vm-real"}},
                       repo_port=18118)
    hosts = lab.host_vars()
    assert built == [sorted({labhosts.default_release(), "0.5.9"})]
    assert hosts["new"]["lab_layer"] == str(tmp_path / ("layer-" + labhosts.default_release()))
    assert hosts["old"]["lab_layer"] == str(tmp_path / "layer-0.5.9")
    assert "lab_layer" not in hosts["bare"] and hosts["bare"]["lab_gpu_spec"] == "h200x2-vm-real"
    assert hosts["new"]["lab_gpu_spec"] == labhosts.FIELD_SPEC


def test_a_lab_inventory_has_the_lab_settings_its_own_connection_and_the_tests_settings(monkeypatch, tmp_path):
    monkeypatch.setattr(labhosts, "ensure_layers", lambda versions: {v: tmp_path / v for v in versions})
    lab = labhosts.Lab("t-inventory", {"gw": {"ansible_port": 2993}}, repo_port=18117,
                       settings={"launch_drain_timeout": 2}, user="ops")
    monkeypatch.setattr(lab, "inventory", tmp_path / "t-inventory")
    inv = lab.write_inventory()
    group_all = inv / "group_vars" / "all"
    linked = sorted(p.name for p in group_all.iterdir() if p.is_symlink())
    assert linked == sorted(p.name for p in labhosts.LAB_GROUP_VARS.glob("*.yml") if p.name not in labhosts.OWN)
    assert yaml.safe_load((group_all / "connection.yml").read_text())["ansible_user"] == "ops"
    assert yaml.safe_load((group_all / "lab.yml").read_text())["lab_repo_port"] == 18117
    assert yaml.safe_load((group_all / "zz-settings.yml").read_text()) == {"launch_drain_timeout": 2}
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    assert list(hosts["all"]["children"]["gpu_hosts"]["children"]["sglang_servers"]["hosts"]) == ["gw"]


def test_hosts_of_other_groups_are_not_gpu_hosts(monkeypatch, tmp_path):
    monkeypatch.setattr(labhosts, "ensure_layers", lambda versions: {v: tmp_path / v for v in versions})
    lab = labhosts.Lab("t-groups", {"srv": {"ansible_port": 2994}, "mon": {"ansible_port": 2995}}, repo_port=18116,
                       groups={"monitoring": ["mon"]})
    monkeypatch.setattr(lab, "inventory", tmp_path / "t-groups")
    children = yaml.safe_load((lab.write_inventory() / "hosts.yml").read_text())["all"]["children"]
    assert list(children["gpu_hosts"]["children"]["sglang_servers"]["hosts"]) == ["srv"]
    assert list(children["monitoring"]["hosts"]) == ["mon"]
    assert children["monitoring"]["hosts"]["mon"]["lab_layer"]   # booted from the layer too


def test_a_layered_copy_keeps_the_inventory_and_adds_layers_and_the_key(monkeypatch, tmp_path):
    monkeypatch.setattr(labhosts, "ROOT", tmp_path)
    monkeypatch.setattr(labhosts, "provisioned", lambda version=None: {"lab_layer": "/layers/" + (version or "d")})
    copy = labhosts.layered_copy(ROOT / "inventory" / "lab-multinode", "copy")
    assert copy == tmp_path / ".lab" / "inventories" / "copy"
    src = yaml.safe_load((ROOT / "inventory" / "lab-multinode" / "hosts.yml").read_text())
    got = yaml.safe_load((copy / "hosts.yml").read_text())
    hosts = got["all"]["children"]["gpu_hosts"]["children"]["sglang_servers"]["hosts"]
    want = src["all"]["children"]["gpu_hosts"]["children"]["sglang_servers"]["hosts"]
    assert {h: {k: v for k, v in hv.items() if k != "lab_layer"} for h, hv in hosts.items()} == want
    assert {hv["lab_layer"] for hv in hosts.values()} == {"/layers/d"}
    for f in (ROOT / "inventory" / "lab-multinode" / "group_vars" / "all").iterdir():
        assert (copy / "group_vars" / "all" / f.name).resolve() == f.resolve()
    key = yaml.safe_load((copy / "group_vars" / "all" / "zz-layered-copy.yml").read_text())
    assert key == {"ansible_ssh_private_key_file": str(labhosts.SSH_KEY)}


def test_lanes_take_the_longest_file_first_and_an_untimed_one_before_all(monkeypatch, tmp_path):
    files = []
    for name, size in (("test_a.py", 10), ("test_b.py", 30), ("test_c.py", 20), ("test_new.py", 5)):
        (tmp_path / name).write_text("x" * size)
        files.append(tmp_path / name)
    (tmp_path / "durations.json").write_text(json.dumps({"test_a.py": 900, "test_b.py": 100, "test_c.py": 400}))
    monkeypatch.setattr(lanes, "DURATIONS", tmp_path / "durations.json")
    assert [f.name for f in lanes.order(files)] == ["test_new.py", "test_a.py", "test_c.py", "test_b.py"]
    (tmp_path / "durations.json").unlink()           # a fresh clone: larger files first
    assert [f.name for f in lanes.order(files)] == ["test_b.py", "test_c.py", "test_a.py", "test_new.py"]
