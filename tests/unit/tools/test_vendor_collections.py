"""tools/vendor_collections.py: the pinned collections come out of the pinned ansible wheel (sha256 checked), each
at its pinned version; a wrong hash, a wrong version or an unsafe path stops it."""
import hashlib
import json
import zipfile

import pytest

import paths

tool = paths.load_script(paths.ROOT / "tools" / "vendor_collections.py", "vendor_collections_tool")


def fake_wheel(tmp_path, version="1.4.0", extra=None):
    path = tmp_path / "cache" / "ansible-12.3.0-py3-none-any.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("ansible_collections/community/proxmox/MANIFEST.json",
                   json.dumps({"collection_info": {"version": version}}))
        z.writestr("ansible_collections/community/proxmox/plugins/modules/proxmox_kvm.py", "# kvm\n")
        z.writestr("ansible_collections/community/general/MANIFEST.json", "{}")
        for name in extra or []:
            z.writestr(name, "x")
    return path


@pytest.fixture
def paths_in(tmp_path, monkeypatch):
    monkeypatch.setattr(tool, "CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tool, "DEST", str(tmp_path / "dest"))
    return tmp_path


def pin(monkeypatch, path):
    monkeypatch.setitem(tool.WHEEL, "sha256", hashlib.sha256(path.read_bytes()).hexdigest())


def test_installs_the_pinned_collection_only(paths_in, monkeypatch):
    pin(monkeypatch, fake_wheel(paths_in))
    assert tool.main(["--check"]) == 1
    assert tool.main([]) == 0
    assert (paths_in / "dest" / "community" / "proxmox" / "plugins" / "modules" / "proxmox_kvm.py").exists()
    assert not (paths_in / "dest" / "community" / "general").exists()
    assert tool.main(["--check"]) == 0


def test_wrong_hash_or_version_or_path_stops(paths_in, monkeypatch):
    fake_wheel(paths_in)
    with pytest.raises(SystemExit, match="has sha256"):
        tool.main([])
    pin(monkeypatch, fake_wheel(paths_in, version="1.3.0"))
    with pytest.raises(SystemExit, match="is 1.3.0, pinned 1.4.0"):
        tool.main([])
    pin(monkeypatch, fake_wheel(paths_in, extra=["ansible_collections/community/proxmox/../../../evil"]))
    with pytest.raises(SystemExit, match="unsafe path"):
        tool.main([])
