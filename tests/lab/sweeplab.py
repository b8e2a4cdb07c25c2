"""Private labs of one host each: `PrivateLab` boots a host from the provisioned layer (tests/lab/labhosts.py) with
its own inventory (.lab/inventories/<name>/: every lab setting of inventory/lab/group_vars/all/ linked, with its own
connection and repository port, and host variables such as the simulator's knobs), reads its topology, and runs
playbooks and ssh commands on it.

The sweep's lab (this module's names): host `bfield` with the field spec (8 RTX PRO 6000, two NUMA nodes), ssh 2231,
server port 32000, repository server 18083, state in .lab/bench-sweep/. Shared by tests/lab/test_sweep.py and
perf/sweep_overhead.py.
"""
import pathlib

from labhosts import FIELD_SPEC, ROOT, SSH_KEY, Lab, write_group_vars

__all__ = ["FIELD_SPEC", "ROOT", "SSH_KEY", "PrivateLab", "copied_inventory"]


def copied_inventory(inv, name, repo_port, **settings):
    """A test's own inventory at `inv`: group_vars/all holds inventory/lab's settings, the lab repository's port,
    the lab's ssh key, then zz-settings.yml (read last: it wins) with the controller's artifacts and results folders
    beside the inventory (Ansible would read files inside it as inventory) and `settings`. Returns `inv`. The test
    writes hosts.yml (labhosts.provisioned() gives a host's lab_layer)."""
    del name  # the inventory's directory names the lab
    write_group_vars(inv, repo_port, settings=dict({
        "topolaunch_artifacts_dir": str(inv.parent / "artifacts"),
        "topolaunch_results_dir": str(inv.parent / "results")}, **settings))
    return inv


class PrivateLab(Lab):
    """One lab host: name (the inventory's, .lab/inventories/<name>), host, its ssh, server and repository ports;
    booted from the provisioned layer of the project's SGLang release."""

    def __init__(self, name, host, ssh_port, server_port, repo_port, spec=FIELD_SPEC, host_vars=None):
        self.host, self.spec, self.ssh_port, self.server_port = host, spec, ssh_port, server_port
        super().__init__(name, {host: {}}, repo_port)
        self.set_host_vars(**(host_vars or {}))

    def set_host_vars(self, **host_vars):
        self.hosts[self.host] = dict({"ansible_port": self.ssh_port, "lab_gpu_spec": self.spec,
                                      "topolaunch_port": self.server_port}, **host_vars)

    def write_inventory(self, **host_vars):
        """(Re)write the inventory, with these host variables (else the ones given before); returns its directory."""
        if host_vars:
            self.set_host_vars(**host_vars)
        return super().write_inventory()

    def main_pid(self):
        """The server unit's main pid (0: not running)."""
        rc, out = self.ssh("systemctl show --property=MainPID --value topolaunch-sglang.service")
        assert rc == 0
        return int(out.strip())

    def up_and_provisioned(self):
        """Boot the host from the provisioned layer (reused when running) and read its topology; returns the
        inventory directory."""
        self.up()
        return self.inventory


NAME, HOST, SSH_PORT, SERVER_PORT, REPO_PORT, SPEC = "bench-sweep", "bfield", 2231, 32000, 18083, FIELD_SPEC
SWEEP = PrivateLab(NAME, HOST, SSH_PORT, SERVER_PORT, REPO_PORT, SPEC)
INVENTORY = SWEEP.inventory
write_inventory, lab, playbook, ssh, up_and_provisioned, host_json, main_pid = (
    SWEEP.write_inventory, SWEEP.lab, SWEEP.playbook, SWEEP.ssh, SWEEP.up_and_provisioned, SWEEP.host_json,
    SWEEP.main_pid)
