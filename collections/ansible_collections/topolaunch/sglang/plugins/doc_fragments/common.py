"""Options the lifecycle modules share (gpu_cleanup, sglang_launch, sglang_health). The defaults are
module_utils/topolaunch/constants.py's and the role topolaunch's (a unit test keeps them equal)."""


class ModuleDocFragment:  # pylint: disable=too-few-public-methods
    DOCUMENTATION = r"""
options:
  unit_name:
    description: The systemd unit that runs the SGLang server.
    type: str
    default: topolaunch-sglang.service
  state_dir:
    description: Directory of C(current_plan.json) (the plan the unit runs) and C(last_good_plan.json) (the plan
      health last verified).
    type: path
    default: /var/lib/topolaunch
  service_user:
    description: The user the server runs as (created by the sglang role).
    type: str
    default: sglang
"""
