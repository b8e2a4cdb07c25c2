"""The tune's private lab (tests/lab/test_tune.py, perf/tune_overhead.py): host `tfield` with the field spec (8 RTX
PRO 6000, two NUMA nodes), ssh 2391, server port 33900, repository server 18099, state in .lab/inventories/h12-tune/.
Host variables carry the simulator's knobs (lab_sim_layout_speed, lab_sim_fault: inventory/lab simulator.yml)."""
from sweeplab import PrivateLab

TUNE = PrivateLab("h12-tune", "tfield", ssh_port=2391, server_port=33900, repo_port=18099)
