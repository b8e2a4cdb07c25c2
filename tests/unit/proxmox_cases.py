"""Shared cases of the Proxmox tests: a host's sysfs (the field's two-socket box: GPUs 0-3 on NUMA node 0, 4-7 on
node 1, as reference/topology.md tells it) and the VM config a naive Proxmox setup gives it (q35, one socket, every
GPU a hostpciN,pcie=1)."""
import os

FIELD_GPUS = ["0000:17:00.0", "0000:2a:00.0", "0000:3d:00.0", "0000:63:00.0",
              "0000:9b:00.0", "0000:ad:00.0", "0000:c1:00.0", "0000:d5:00.0"]
FIELD_NODES = {0: "0-31,64-95", 1: "32-63,96-127"}


def write_host_sysfs(root, nodes=None, gpus=None, numa=None, memory_kib=528000000):
    """A sysfs tree under root: devices/system/node/nodeN/{cpulist,meminfo}, bus/pci/devices/<addr>/{class,vendor,
    numa_node} for each GPU (numa: {address: node}, default: first half node 0, second half node 1), a NIC too."""
    nodes = FIELD_NODES if nodes is None else nodes
    gpus = FIELD_GPUS if gpus is None else gpus
    for node, cpus in nodes.items():
        d = os.path.join(root, "devices", "system", "node", "node%d" % node)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "cpulist"), "w") as f:
            f.write(cpus + "\n")
        with open(os.path.join(d, "meminfo"), "w") as f:
            f.write("Node %d MemTotal:       %d kB\nNode %d MemFree:        1 kB\n" % (node, memory_kib, node))
    half = len(gpus) // 2
    numa = numa or {a: (0 if i < half else 1) for i, a in enumerate(gpus)}
    devices = [(a, "0x030200", "0x10de", numa[a]) for a in gpus] + [("0000:01:00.0", "0x020000", "0x8086", 0)]
    for address, cls, vendor, node in devices:
        d = os.path.join(root, "bus", "pci", "devices", address)
        os.makedirs(d, exist_ok=True)
        for name, value in (("class", cls), ("vendor", vendor), ("numa_node", node)):
            with open(os.path.join(d, name), "w") as f:
                f.write("%s\n" % value)
    return root


def naive_config(gpus=None, cores=64, sockets=1, memory=262144, machine="q35", args=None):
    """The VM config of a GPU VM set up the plain way (what the field had)."""
    config = {"name": "gpu-vm", "machine": machine, "cores": cores, "sockets": sockets, "memory": str(memory),
              "cpu": "host", "ostype": "l26", "scsi0": "local-lvm:vm-101-disk-0,size=200G",
              "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0", "digest": "0" * 40}
    for i, address in enumerate(FIELD_GPUS if gpus is None else gpus):
        config["hostpci%d" % i] = "%s,pcie=1" % address[5:]
    if args is not None:
        config["args"] = args
    return config
