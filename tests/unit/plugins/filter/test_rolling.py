"""filter_plugins/rolling.py: the drain timeout as seconds, or a one-line error naming topolaunch_drain_timeout;
the role default passes it."""
import pathlib

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.topolaunch.sglang.plugins.filter.rolling import FilterModule, rolling_drain_timeout

ROOT = pathlib.Path(__file__).resolve().parents[4]


def test_the_filter_is_registered_and_the_default_passes():
    assert FilterModule().filters()["rolling_drain_timeout"] is rolling_drain_timeout
    default = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())["topolaunch_drain_timeout"]
    assert rolling_drain_timeout(default) > 0
    assert rolling_drain_timeout("45") == 45.0                      # -e topolaunch_drain_timeout=45


@pytest.mark.parametrize("value", ["0", -5, "never"])
def test_a_bad_drain_timeout_fails_naming_the_field(value):
    with pytest.raises(AnsibleFilterError) as e:
        rolling_drain_timeout(value)
    assert str(e.value).startswith("topolaunch_drain_timeout: %r" % (value,)) and "\n" not in str(e.value)
