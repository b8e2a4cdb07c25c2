"""The Proxmox VM config the topology findings call for, from the host's own topology; the change against the VM's
current config, key by key.

What the VM config gets, per finding (topology_findings.py):

- `vm-no-numa`: `numa: 1`; `sockets` = host sockets (NUMA nodes) holding the VM's GPUs, `cores` = vCPUs / sockets;
  one `numaN: cpus=..,hostnodes=H,memory=..,policy=bind` per such socket; `affinity` = those sockets' host CPUs;
  each GPU leaves its `hostpciN` and is attached in `args` as `vfio-pci` behind a `pcie-root-port` on a `pxb-pcie`
  expander bridge whose `numa_node` is its socket's guest node.
- `p2p-chipset-not-supported`: the GPU clique in `args`: `x-nv-gpudirect-clique=0` on every GPU
  (`-set device.hostpciN...` for a GPU left as `hostpciN`, with an explicit `.0` function).
- asked (`hugepages`): `hugepages`.

A remedy stays once applied: after the restart the guest no longer shows the finding, and the config topolaunch wrote
(its `tl*` device ids, the clique property) keeps it computed, so a second run changes nothing. Every computed value
is checked against the API schema (proxmox_config.validate) before anyone writes it.
"""
import glob
import os
import re
import shlex

from .proxmox_config import (ProxmoxConfigError, hostpci_format, numa_format, parse_boolean, parse_property_string,
                             print_property_string, root_only, schema_key, validate)
from .topology_render import cpulist, parse_cpulist

FINDING_NUMA = "vm-no-numa"
FINDING_CLIQUE = "p2p-chipset-not-supported"
CLIQUE_PROPERTY = "x-nv-gpudirect-clique"   # QEMU vfio-pci property (hw/vfio/pci-quirks.c)
CLIQUE = 0                      # one clique: every GPU of the VM may talk P2P (the host's sockets do)
PXB_BUS_NR = 128                # first expander bridge bus number; each next one 32 buses higher (bus_nr < 256)
PXB_BUS_STEP = 32
CHASSIS = 200                   # pcie-root-port chassis numbers, above the ones Proxmox gives its own ports
ID_PREFIX = "tl"                # ids of the devices topolaunch adds in args: tlpxbN, tlrpN, tlgpuN
# proxmox_kvm has these (numa as numa_enabled); the rest (affinity) goes to the API itself
MODULE_KEYS = ("args", "cores", "hostpci", "hugepages", "numa", "sockets")


def clique_property(clique=CLIQUE):
    """The vfio-pci property that puts a GPU in a P2P clique (clique: a number; a placeholder in a remedy text)."""
    return "%s=%s" % (CLIQUE_PROPERTY, clique)


def clique_set_arg(device_id, clique=CLIQUE):
    """args item for a GPU Proxmox attaches itself (device id hostpciN): `-set device.hostpciN.<clique>`."""
    return ["-set", "device.%s.%s" % (device_id, clique_property(clique))]


def pxb_args(guest_node, index):
    """args items for one expander bridge on guest NUMA node `guest_node` (its `index`-th bridge)."""
    return ["-device", "pxb-pcie,id=%spxb%d,bus_nr=%d,numa_node=%d,bus=pcie.0"
            % (ID_PREFIX, index, PXB_BUS_NR + PXB_BUS_STEP * index, guest_node)]


def gpu_args(address, index, bridge, clique=None):
    """args items for GPU `address` on its own root port behind expander bridge `bridge` (index)."""
    device = "vfio-pci,host=%s,id=%sgpu%d,bus=%srp%d" % (address, ID_PREFIX, index, ID_PREFIX, index)
    if clique is not None:
        device += "," + clique_property(clique)
    port = "pcie-root-port,id=%srp%d,bus=%spxb%d,chassis=%d" % (ID_PREFIX, index, ID_PREFIX, bridge, CHASSIS + index)
    return ["-device", port,
            "-device", device]


def pci_address(text):
    """A HOSTPCIID as sysfs names the device: '10:00' -> '0000:10:00.0' (function 0 when none is given)."""
    m = re.fullmatch(r"(?:([0-9a-f]{4,}):)?([0-9a-f]{2}:[0-9a-f]{2})(?:\.([0-9a-f]))?", text.lower())
    if not m:
        raise ProxmoxConfigError("not a PCI address: %r" % text)
    return "%s:%s.%s" % (m.group(1) or "0000", m.group(2), m.group(3) or "0")


# -- the host: sysfs --------------------------------------------------------------------------------------------------

def read_host_topology(sysfs_root="/sys"):
    """{nodes: [{node, cpus, memory_mib}], gpus: [{address, numa_node, vendor, class}]}: NUMA nodes from
    devices/system/node, display-class PCI devices (class 0x03xxxx) with their NUMA node from bus/pci/devices."""
    nodes = []
    for path in sorted(glob.glob(os.path.join(sysfs_root, "devices", "system", "node", "node[0-9]*")),
                       key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)))):
        node = int(os.path.basename(path)[4:])
        with open(os.path.join(path, "cpulist")) as f:
            cpus = parse_cpulist(f.read().strip())
        memory_kib = 0
        if os.path.exists(os.path.join(path, "meminfo")):
            with open(os.path.join(path, "meminfo")) as f:
                m = re.search(r"MemTotal:\s+(\d+) kB", f.read())
                memory_kib = int(m.group(1)) if m else 0
        nodes.append({"node": node, "cpus": cpus, "memory_mib": memory_kib // 1024})
    gpus = []
    for path in sorted(glob.glob(os.path.join(sysfs_root, "bus", "pci", "devices", "*"))):
        def attr(name):
            try:
                with open(os.path.join(path, name)) as f:
                    return f.read().strip()
            except OSError:
                return None
        cls = attr("class") or ""
        if not cls.startswith("0x03"):
            continue
        numa = attr("numa_node")
        gpus.append({"address": os.path.basename(path), "numa_node": int(numa) if numa and int(numa) >= 0 else None,
                     "vendor": attr("vendor"), "class": cls})
    return {"nodes": nodes, "gpus": gpus}


# -- the config -------------------------------------------------------------------------------------------------------

def _int(current, key, default):
    value = current.get(key, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ProxmoxConfigError("current config: %s %r is not an integer" % (key, value))


def _memory_mib(current):
    value = str(current.get("memory", 512))
    fmt = {"current": {"default_key": 1}}
    try:
        return int(parse_property_string(fmt, value)["current"])
    except (ValueError, KeyError):
        raise ProxmoxConfigError("current config: memory %r is not a size in MiB" % value)


def split_args(args):
    """args -> [[item, value], ...] pairs of option and value, and the topolaunch-managed ones told apart."""
    try:
        tokens = shlex.split(args or "")
    except ValueError as exc:
        raise ProxmoxConfigError("current config: args %r: %s" % (args, exc))
    items, i = [], 0
    while i < len(tokens):
        if tokens[i].startswith("-") and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            items.append(tokens[i:i + 2])
            i += 2
        else:
            items.append(tokens[i:i + 1])
            i += 1
    return items


def _managed(item):
    if len(item) != 2:
        return False
    option, value = item
    if option == "-device":
        return bool(re.search(r"(^|,)id=%s(pxb|rp|gpu)\d+(,|$)" % ID_PREFIX, value))
    return option == "-set" and CLIQUE_PROPERTY + "=" in value


MANAGED_TEXT = re.compile(r"(^|\s+)(-device\s+\S*(?<![^,\s])id=%s(pxb|rp|gpu)\d+(?![^,\s])\S*|"
                          r"-set\s+device\.[\w-]+\.%s=\d+)(?=\s|$)" % (ID_PREFIX, CLIQUE_PROPERTY))


def _without_managed(args):
    """The operator's own args, as written (quoting kept): the items topolaunch adds taken out (they never quote)."""
    return MANAGED_TEXT.sub("", args).strip()


def _vm_gpus(current, host):
    """[(address, hostpci key or None)] of the VM's GPUs: hostpciN whose device is a display-class device of the host,
    and GPUs topolaunch already attached in args (tlgpuN)."""
    display = {g["address"]: g for g in host["gpus"]}
    out = []
    for key in sorted((k for k in current if schema_key(k) == "hostpci[n]"), key=lambda k: int(k[7:])):
        try:
            values = parse_property_string(hostpci_format(), str(current[key]))
        except ValueError as exc:
            raise ProxmoxConfigError("current config: %s: %s" % (key, exc))
        hosts = (values.get("host") or "").split(";")
        addresses = [pci_address(h) for h in hosts if h]
        if len(addresses) == 1 and addresses[0] in display:
            out.append((addresses[0], key))
    for item in split_args(current.get("args")):
        m = re.search(r"^vfio-pci,host=([^,]+),id=%sgpu\d+" % ID_PREFIX, item[-1]) if _managed(item) else None
        if m:
            out.append((pci_address(m.group(1)), None))
    return sorted(out)


def _node_of(host, address):
    for g in host["gpus"]:
        if g["address"] == address:
            if g["numa_node"] is None:
                raise ProxmoxConfigError("host topology: sysfs gives no NUMA node for GPU %s (numa_node -1)" % address)
            return g["numa_node"]
    raise ProxmoxConfigError("host topology: GPU %s of the VM is not a display device of this host" % address)


def desired_config(current, host, findings, hugepages=None, vmid="?"):
    """(set, delete): the keys the findings call for and their values; the keys to remove. Raises ProxmoxConfigError
    (one line naming the key or the value) for what cannot be done; every value passes the schema."""
    where = "VM %s" % vmid
    ids = {f["id"] if isinstance(f, dict) else f for f in findings or []}
    items = split_args(current.get("args"))
    gpus = _vm_gpus(current, host)
    want_numa = FINDING_NUMA in ids or any(_managed(i) and i[0] == "-device" for i in items)
    want_clique = FINDING_CLIQUE in ids or any(_managed(i) and CLIQUE_PROPERTY + "=" in i[1] for i in items)
    out, delete = {}, []
    ours = []
    clique = CLIQUE if want_clique else None
    if want_clique:
        cpu = str(current.get("cpu", ""))
        if re.search(r"(^|,)hidden=(1|on|yes|true)(,|$)", cpu):
            raise ProxmoxConfigError("%s: cpu %r: the GPU clique needs no hidden=1 CPU flag (the driver refuses P2P "
                                     "in a hidden VM)" % (where, cpu))
    if want_numa and gpus:
        machine = str(current.get("machine", ""))
        if not re.match(r"(type=)?(q35|pc-q35-)", machine):
            raise ProxmoxConfigError("%s: machine %r: expander bridges (pxb-pcie) need the q35 machine type"
                                     % (where, machine or "default (i440fx)"))
        nodes = sorted({_node_of(host, a) for a, _k in gpus})
        if PXB_BUS_NR + PXB_BUS_STEP * (len(nodes) - 1) > 255:
            raise ProxmoxConfigError("%s: GPUs on %d host sockets: at most %d expander bridges fit below bus 256"
                                     % (where, len(nodes), (255 - PXB_BUS_NR) // PXB_BUS_STEP + 1))
        vcpus = _int(current, "cores", 1) * _int(current, "sockets", 1)
        memory = _memory_mib(current)
        if vcpus % len(nodes) or memory % len(nodes):
            raise ProxmoxConfigError("%s: cores x sockets = %d vCPUs and memory %d MiB must split evenly over the %d "
                                     "host sockets holding its GPUs (%s)" % (where, vcpus, memory, len(nodes),
                                                                             cpulist(nodes)))
        per = vcpus // len(nodes)
        host_nodes = {n["node"]: n for n in host["nodes"]}
        affinity = []
        out.update({"numa": 1, "sockets": len(nodes), "cores": per})
        for i, node in enumerate(nodes):
            if node not in host_nodes:
                raise ProxmoxConfigError("host topology: NUMA node %d (of a GPU) has no CPUs in sysfs" % node)
            if len(host_nodes[node]["cpus"]) < per:
                raise ProxmoxConfigError("%s: %d vCPUs per socket, host NUMA node %d has %d CPUs"
                                         % (where, per, node, len(host_nodes[node]["cpus"])))
            affinity += host_nodes[node]["cpus"]
            out["numa%d" % i] = print_property_string(numa_format(), {
                "cpus": cpulist(range(i * per, (i + 1) * per)).replace(",", ";"), "hostnodes": str(node),
                "memory": str(memory // len(nodes)), "policy": "bind"})
            ours += pxb_args(i, i)
            for j, (address, _key) in enumerate(gpus):
                if _node_of(host, address) == node:
                    ours += gpu_args(address, j, i, clique)
        out["affinity"] = cpulist(affinity)
        delete += [k for _a, k in gpus if k]
        delete += [k for k in current if schema_key(k) == "numa[n]" and int(k[4:]) >= len(nodes)]
    elif want_clique:
        for address, key in gpus:
            if key is None:
                continue
            values = parse_property_string(hostpci_format(), str(current[key]))
            if values.get("host") != address:       # the clique needs an explicit function: host=...:.0
                values["host"] = address
                out[key] = print_property_string(hostpci_format(), values)
            ours += clique_set_arg(key)
    args = " ".join(filter(None, [_without_managed(current.get("args") or ""), " ".join(ours)]))
    if args != (current.get("args") or ""):
        out["args"] = args
    if hugepages is not None:
        out["hugepages"] = str(hugepages)
    validate(out, source=where)
    return out, sorted(set(delete), key=lambda k: (re.sub(r"\d+$", "", k), int(re.sub(r"^\D+", "", k) or 0)))


def same(key, a, b):
    """Whether two values of config key mean the same to Proxmox (booleans, numbers, property strings in any order)."""
    if a is None or b is None:
        return a is None and b is None
    name = schema_key(key)
    if name in ("numa", "keephugepages"):
        return parse_boolean(a) == parse_boolean(b)
    if name == "numa[n]" or name == "hostpci[n]":
        fmt = numa_format() if name == "numa[n]" else hostpci_format()
        try:
            return parse_property_string(fmt, str(a)) == parse_property_string(fmt, str(b))
        except ValueError:
            return False
    return str(a) == str(b)


def changes(current, host, findings, hugepages=None, vmid="?"):
    """The change, key by key: {set: {key: value}, delete: [key], before: {key: value}, after: {key: value},
    root_only: [key], changed}. `before`/`after` hold only the keys that change."""
    wanted, delete = desired_config(current, host, findings, hugepages, vmid)
    to_set = {k: v for k, v in wanted.items() if not same(k, current.get(k), v)}
    to_delete = [k for k in delete if k in current]
    keys = sorted(set(to_set) | set(to_delete))
    before = {k: current[k] for k in keys if k in current}
    after = {k: to_set[k] for k in keys if k in to_set}
    root = sorted(k for k in keys if root_only(k))
    return {"set": to_set, "delete": to_delete, "before": before, "after": after, "root_only": root,
            "changed": bool(keys)}


def module_params(change):
    """proxmox_kvm parameters for the keys it has (hostpci and numa as dicts, numa -> numa_enabled), and the rest
    (affinity) for the API itself."""
    params, api = {}, {}
    for key, value in change["set"].items():
        name = schema_key(key)
        if name == "hostpci[n]":
            params.setdefault("hostpci", {})[key] = value
        elif name == "numa[n]":
            params.setdefault("numa", {})[key] = value
        elif key == "numa":
            params["numa_enabled"] = bool(parse_boolean(value))
        elif key in ("cores", "sockets"):
            params[key] = int(value)
        elif key in MODULE_KEYS:
            params[key] = value
        else:
            api[key] = value
    return params, api


# -- the inventory and the API's answers ------------------------------------------------------------------------------

def guests(hostvars, hosts, node):
    """[{host, vmid}] of the inventory hosts that are VMs on Proxmox node `node` (proxmox_vmid set, proxmox_node ==
    node), by vmid. A vmid that is not a positive integer is refused naming the host."""
    out = []
    for host in hosts or []:
        vars_ = hostvars[host]
        vmid = vars_.get("proxmox_vmid")
        if vmid is None or vars_.get("proxmox_node") != node:
            continue
        if not re.fullmatch(r"[1-9]\d{2,8}", str(vmid)):
            raise ProxmoxConfigError("inventory host %s: proxmox_vmid %r is not a Proxmox VM id (100-999999999)"
                                     % (host, vmid))
        out.append({"host": host, "vmid": int(vmid)})
    return sorted(out, key=lambda g: g["vmid"])


def restart_guests(results):
    """[{host, vmid, keys}] for each running VM with changes that wait for its restart, by vmid. `results`: the API's
    answers per guest, as a uri loop over [guest, "pending" | "status/current"] registers them (item, json.data)."""
    vms = {}
    for r in results or []:
        guest, what = r["item"]
        vm = vms.setdefault(guest["vmid"], {"host": guest["host"], "pending": [], "status": None})
        data = (r.get("json") or {}).get("data")
        if what == "pending":
            vm["pending"] = data or []
        else:
            vm["status"] = (data or {}).get("status")
    out = []
    for vmid in sorted(vms):
        vm = vms[vmid]
        keys = [e["key"] for e in vm["pending"] if "pending" in e or e.get("delete")]
        if keys and vm["status"] == "running":
            out.append({"host": vm["host"], "vmid": vmid, "keys": keys})
    return out


def restart_pending(results):
    """"VM 101 (gpu1): key, key" for each running VM with changes that wait for its restart (restart_guests)."""
    return ["VM %s (%s): %s" % (g["vmid"], g["host"], ", ".join(g["keys"])) for g in restart_guests(results)]


def diff_text(config):
    """{key: value} -> "key: value" lines, as /etc/pve/qemu-server/<vmid>.conf writes them, sorted."""
    return "".join("%s: %s\n" % (k, config[k]) for k in sorted(config))
