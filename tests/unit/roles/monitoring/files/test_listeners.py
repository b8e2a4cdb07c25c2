"""roles/monitoring/files/listeners.py: the TCP listeners of a host and who holds them, from a /proc tree (a fake
one here, and this machine's own: a socket this test opens is found with its pid)."""
import json
import os
import socket
import subprocess
import sys

import paths
from paths import ROOT

SCRIPT = ROOT / "roles" / "monitoring" / "files" / "listeners.py"
listeners = paths.load_script(SCRIPT, "listeners")

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:238C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2222 1 0 100 0 0 10 0
   2: 0100007F:9C40 0100007F:8E3A 01 00000000:00000000 00:00000000 00000000     0        0 3333 1 0 100 0 0 10 0
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue
   0: 00000000000000000000000000000000:2328 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1
   1: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5555 1
"""


def fake_proc(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(TCP)
    (tmp_path / "net" / "tcp6").write_text(TCP6)
    for pid, comm, cgroup, inode in (("12", "sshd", "0::/system.slice/ssh.service\n", "2222"),
                                     ("40", "prometheus-node", "0::/system.slice/prometheus-node-exporter.service\n",
                                      "1111"),
                                     ("41", "bash", "0::/user.slice/user-0.slice/session-3.scope\n", "5555")):
        (tmp_path / pid / "fd").mkdir(parents=True)
        (tmp_path / pid / "comm").write_text(comm + "\n")
        (tmp_path / pid / "cgroup").write_text(cgroup)
        os.symlink("socket:[%s]" % inode, tmp_path / pid / "fd" / "3")
        os.symlink("/dev/null", tmp_path / pid / "fd" / "0")
    return tmp_path


def test_listening_sockets_and_their_units(tmp_path):
    got = listeners.listeners(str(fake_proc(tmp_path)))
    assert got == [
        {"address": "0.0.0.0", "port": 22, "pid": 12, "comm": "sshd", "unit": "ssh.service"},
        {"address": "::1", "port": 8080, "pid": 41, "comm": "bash", "unit": "session-3.scope"},
        {"address": "::", "port": 9000, "pid": None, "comm": "", "unit": ""},
        {"address": "127.0.0.1", "port": 9100, "pid": 40, "comm": "prometheus-node",
         "unit": "prometheus-node-exporter.service"},
    ]


def test_unit_of_a_cgroup_line():
    assert listeners.unit_of("0::/system.slice/prometheus.service\n") == "prometheus.service"
    assert listeners.unit_of("0::/\n") == ""
    assert listeners.unit_of("1:name=systemd:/system.slice/a.service/sub\n") == "a.service"


def test_this_machines_socket_is_found_with_its_pid():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True).stdout
        mine = [x for x in json.loads(out) if x["port"] == port]
    assert mine and mine[0]["address"] == "127.0.0.1" and mine[0]["pid"] == os.getpid()
