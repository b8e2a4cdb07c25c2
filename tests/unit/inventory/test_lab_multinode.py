"""The project's lab inventories: inventory/lab-multinode takes every lab setting of inventory/lab, linked, or its
own file of the same name (its ports, its lifecycle settings). A file added to inventory/lab and forgotten here left
the two-node lab without it (the preflight's stand-in worker: the real worker, which needs torch, ran there)."""
import paths

ROOT = paths.ROOT
LAB = ROOT / "inventory" / "lab" / "group_vars" / "all"
MULTINODE = ROOT / "inventory" / "lab-multinode" / "group_vars" / "all"


def test_the_multinode_lab_has_every_lab_setting():
    missing = sorted(f.name for f in LAB.glob("*.yml") if not (MULTINODE / f.name).exists())
    assert not missing, "inventory/lab-multinode/group_vars/all lacks %s (link ../../../lab/group_vars/all/<file>)" % missing
    for f in MULTINODE.glob("*.yml"):
        if f.is_symlink():
            assert f.resolve() == (LAB / f.name).resolve(), "%s links %s" % (f, f.resolve())
