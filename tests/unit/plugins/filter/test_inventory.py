"""filter_plugins/inventory.py: topolaunch_* variables an inventory sets that no role knows (issue 25 item 17)."""
import pathlib

from ansible_collections.topolaunch.sglang.plugins.filter.inventory import (FilterModule, known_vars,
                                                                           unknown_topolaunch_vars)

ROOT = pathlib.Path(__file__).resolve().parents[4]


def test_a_typo_is_named_with_the_name_it_likely_meant(tmp_path):
    (tmp_path / "hosts.yml").write_text("sglang_servers:\n  hosts:\n    box:\n      topolaunch_layot: tp8\n"
                                        "      topolaunch_layout: tp8\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("topolaunch_port: 30000\ntopolaunch_zzz: 1\n")
    assert unknown_topolaunch_vars([str(tmp_path)]) == [
        "%s: topolaunch_layot (did you mean topolaunch_layout?)" % (tmp_path / "hosts.yml"),
        "%s: topolaunch_zzz" % (tmp_path / "group_vars" / "all.yml")]


def test_the_known_names_are_the_roles_own_not_a_copy():
    known = known_vars()
    # a default of role topolaunch, an argument spec option of role gateway, a default read only by deploy.yml
    assert {"topolaunch_layout", "topolaunch_gateway_version", "topolaunch_proxmox_manage"} <= known
    assert "topolaunch_layot" not in known


def test_this_repositorys_inventories_set_no_unknown_variable():
    assert unknown_topolaunch_vars([str(p) for p in (ROOT / "inventory").iterdir() if p.is_dir()]) == []
    assert FilterModule().filters() == {"unknown_topolaunch_vars": unknown_topolaunch_vars}
