"""What this host listens on (TCP), and who: prints a JSON list [{address, port, pid, comm, unit}].

Run by the monitoring role (tasks/validate.yml, as root) before it installs anything, so that a port the stage
needs and another program holds fails naming both. Reads /proc only (no ss): /proc/net/tcp and tcp6 for the
listening sockets (state 0A), /proc/<pid>/fd for their owner, /proc/<pid>/cgroup for its systemd unit.
"""
import ipaddress
import json
import os
import socket
import struct
import sys

LISTEN = "0A"


def parse_address(hex_addr, family):
    """/proc/net/tcp's address (host byte order per 32-bit word) -> text."""
    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(struct.pack("<I", int(hex_addr, 16))))
    words = [int(hex_addr[i:i + 8], 16) for i in range(0, 32, 8)]
    return str(ipaddress.IPv6Address(b"".join(struct.pack("<I", w) for w in words)))


def listening_sockets(proc="/proc"):
    """{inode: (address, port)} of the TCP sockets in state LISTEN."""
    out = {}
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(os.path.join(proc, "net", name), encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            addr, _colon, port = fields[1].partition(":")
            out[fields[9]] = (parse_address(addr, family), int(port, 16))
    return out


def unit_of(cgroup_text):
    """The systemd unit (a .service or .scope) of a /proc/<pid>/cgroup text, or ''."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return ""


def owners(inodes, proc="/proc"):
    """{inode: (pid, comm, unit)} for the sockets in `inodes` that a process holds."""
    found = {}
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes and target[8:-1] not in found:
                try:
                    with open(os.path.join(proc, pid, "comm"), encoding="utf-8", errors="replace") as f:
                        comm = f.read().strip()
                    with open(os.path.join(proc, pid, "cgroup"), encoding="utf-8", errors="replace") as f:
                        unit = unit_of(f.read())
                except OSError:
                    comm, unit = "", ""
                found[target[8:-1]] = (int(pid), comm, unit)
    return found


def listeners(proc="/proc"):
    sockets = listening_sockets(proc)
    who = owners(set(sockets), proc)
    out = []
    for inode, (address, port) in sorted(sockets.items(), key=lambda kv: (kv[1][1], kv[1][0])):
        pid, comm, unit = who.get(inode, (None, "", ""))
        out.append({"address": address, "port": port, "pid": pid, "comm": comm, "unit": unit})
    return out


def main():
    json.dump(listeners(), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
