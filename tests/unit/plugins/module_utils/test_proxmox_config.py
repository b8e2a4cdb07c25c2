"""proxmox_config.py: values checked against the committed Proxmox API schema excerpt, refused with Proxmox's own
error text naming the key; property strings parsed and printed."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import proxmox_config as pc
from ansible_collections.topolaunch.sglang.plugins.module_utils.proxmox_api_schema import SCHEMA


@pytest.mark.parametrize("key,value", [
    ("affinity", "0-3,8-11"), ("affinity", "5"), ("numa", 1), ("numa", True), ("cores", 16), ("sockets", "2"),
    ("numa0", "cpus=0-15,hostnodes=0,memory=131072,policy=bind"), ("numa7", "cpus=0;2-3"),
    ("hostpci0", "0000:17:00.0,pcie=1"), ("hostpci15", "host=17:00;18:00.1,x-vga=1"), ("hugepages", "1024"),
    ("args", "-device pxb-pcie,id=tlpxb0,bus_nr=128,numa_node=0,bus=pcie.0"), ("machine", "pc-q35-9.2+pve1"),
])
def test_values_the_api_takes_pass(key, value):
    assert pc.check(key, value) is None
    pc.validate({key: value})


@pytest.mark.parametrize("key,value,text", [
    ("affinity", "0-", "invalid format - unable to parse cpuset option\n"),
    ("affinity", "7-3", "invalid format - unable to parse cpuset option\n"),
    ("affinity", "0,,1", "invalid format - unable to parse cpuset option\n"),
    ("numa0", "cpus=0-3,policy=strict",
     "invalid format - format error\nnuma0.policy: value 'strict' does not have a value in the enumeration "
     "'preferred, bind, interleave'\n"),
    ("numa1", "cpus=0-,policy=bind",
     "invalid format - format error\nnuma1.cpus: value does not match the regex pattern\n"),
    ("numa0", "hostnodes=0", "invalid format - format error\nnuma0.cpus: property is missing and it is not optional\n"),
    ("numa0", "cpus=0,speed=3", "invalid format - invalid key in comma-separated list property: speed\n"),
    ("numa0", "cpus=0,memory=lots",
     "invalid format - format error\nnuma0.memory: type check ('number') failed - got 'lots'\n"),
    ("hostpci0", "host=gpu0,pcie=1",
     "invalid format - format error\nhostpci0.host: value does not match the regex pattern\n"),
    ("hostpci2", "0000:17:00.0,pcie=2",
     "invalid format - format error\nhostpci2.pcie: type check ('boolean') failed - got '2'\n"),
    ("hostpci0", "0000:17:00.0,0000:18:00.0",
     "invalid format - duplicate key in comma-separated list property: host\n"),
    ("hugepages", "3", "value '3' does not have a value in the enumeration 'any, 2, 1024'"),
    ("cores", "0", "value must have a minimum value of 1"),
    ("sockets", "two", "type check ('integer') failed - got 'two'"),
    ("numa", "maybe", "type check ('boolean') failed - got 'maybe'"),
    ("hostpci16", "0000:17:00.0", pc.NOT_DEFINED),
    ("numa8", "cpus=0", pc.NOT_DEFINED),
    ("bogus", "1", pc.NOT_DEFINED),
    ("args", "-device x\n-daemonize", "value contains a control character"),
])
def test_hostile_values_are_refused_with_proxmox_text(key, value, text):
    assert pc.check(key, value) == text
    with pytest.raises(pc.ProxmoxConfigError) as err:
        pc.validate({"cores": 4, key: value}, source="inventory host gpu1")
    msg = str(err.value)
    assert msg.startswith("inventory host gpu1: %s %r refused" % (key, value)) and "\n" not in msg


def test_a_format_the_excerpt_lacks_is_refused_not_passed():
    assert "undefined format 'pve-vm-cpu-conf'" in pc.check("cpu", "host")


def test_rules_come_from_the_schema_excerpt(monkeypatch):
    """The check reads the excerpt: a changed enum there changes what passes (no rule written twice)."""
    assert pc.check("hugepages", "4") is not None
    monkeypatch.setitem(SCHEMA["parameters"]["hugepages"], "enum", ["any", "2", "4", "1024"])
    assert pc.check("hugepages", "4") is None


def test_property_strings_round_trip():
    fmt = pc.hostpci_format()
    assert pc.parse_property_string(fmt, "17:00.0,pcie=1") == {"host": "17:00.0", "pcie": "1"}
    assert pc.print_property_string(fmt, {"pcie": "1", "host": "0000:17:00.0"}) == "0000:17:00.0,pcie=1"
    with pytest.raises(ValueError, match="missing key"):
        pc.parse_property_string(pc.numa_format(), "cpus=0,=3")


def test_root_only_keys_come_from_qemu_servers_privileges():
    assert [k for k in ("args", "affinity", "hugepages", "hostpci3", "numa", "numa0", "cores", "sockets", "bogus")
            if pc.root_only(k)] == ["args", "affinity", "hugepages", "hostpci3", "bogus"]


def test_schema_key_respects_index_limits():
    assert pc.schema_key("hostpci15") == "hostpci[n]" and pc.schema_key("hostpci16") is None
    assert pc.schema_key("numa") == "numa" and pc.schema_key("numa7") == "numa[n]" and pc.schema_key("numa8") is None
