"""The SGLang simulator's fixtures (simlab.py): sim_wheels, sim_site, sim_site_0523, lab."""
from simlab import lab, sim_site, sim_site_0523, sim_wheels  # noqa: F401  pylint: disable=unused-import
