"""Validate, write and start the systemd unit that runs the planned SGLang server, in one call.

`launch(opts, check_mode, run)` is the logic of the `sglang_launch` module (stages validate and launch). Two states:

- `checked` is the validate step: it reads only, and runs on every server before anything is stopped anywhere:
  1. `validate()`: the plan itself (complete and consistent: argv, GPUs, CUDA_VISIBLE_DEVICES, env, port,
     fingerprint, version, layout), the plan made for this host's GPUs (`topology_fingerprint`, `gpu_count` when
     the caller knows them), no control character in any string of the server's part of the plan nor in any line
     of the rendered env file, unit and server config (secrets never quoted), the plan's SGLang version against the
     one installed and current (the sglang role's record), the SGLang python, an absolute `plan.model_path` with a
     config.json, the service user (root or a login user only with `force_service_user`), each key of the server
     config a flag of the plan's release, the rendered unit as `systemd-analyze verify` loads it (a temporary copy), the
     plan the unit runs now (`<state_dir>/current_plan.json`) readable, the plan's port (and the running server's)
     free or held by a process this host shows (cleanup.port_problem: never a socket no process here holds, nor a
     port that answers while nothing here listens, nor one that refuses to bind). Every plan
     problem is reported at once, with "nothing was stopped";
  2. the decision whether the server must be replaced, with its reasons: forced; the unit is not active; the plan
     changed (only SERVER_KEYS are compared, key order does not matter; what changed is named); the unit file,
     the env file or the server's config file changed. A file "changed" when its content, mode or owner differ
     from what would be written.
- `started` is the launch step: the same (`validate()` only when not `validated`: the caller checked these very
  inputs with `checked` in this relaunch, as the relaunch role does), then, when the server is replaced and the
  caller gave `clean` (the module's `cleanup` option), stops it and cleans our GPUs (cleanup.py) in this same call;
  then: creates the env file's directory and `state_dir` (root 0755);
  writes the env file (root 0600, created 0600: the secrets are never readable by anyone else), the server's
  config file (`--config`, the API key: 0600 owned by the service user; removed when empty) and the unit file
  (0644) when they differ, and `current_plan.json` (0644) only when the server is (re)started (it records what
  the unit runs: a kept server keeps its record), each atomically (temp file in the same directory, then rename);
  `systemctl daemon-reload` when the unit file was written (or systemd asks for it); when the unit is loaded and
  (replace or not active) `systemctl reset-failed` (a server that crashed repeatedly leaves systemd's start-limit
  counter spent, and our deliberate start would be refused); enable/disable per `enabled`; then `systemctl
  restart` when replacing. A failed start raises with systemctl's message and the unit's last journal lines.

Both states return the plan they act on (`plan`). Check mode: everything is read and decided; `written` and
`actions` say what would be done; nothing changes.

Plain Python 3.9+ stdlib; systemctl/journalctl through `run(argv) -> (rc, out, err)`; file owner through `owner`
(uid, gid), root in production.
"""
import fnmatch
import json
import os
import pwd
import re
import shutil
import tempfile

from .constants import ENV_FILE, SERVER_KEYS, SERVICE_USER, STATE_DIR, UNIT_DIR, UNIT_NAME, CURRENT_PLAN, VENV_ROOT
from .constants import LAST_GOOD_PLAN, SERVER_CONFIG
from .constants import SGLANG_VERSION_FILE, base_version, server_view, sglang_python, state_file
from .system import file_differs, journal, run as _run, service_user_problem, show, write_atomic
from .cleanup import port_problem
from .plan_args import FlagIndex, SECRET_SOURCES
from .health import last_good_facts
from .text import control_character

__all__ = ["LaunchError", "launch", "validate", "plan_problems", "decide", "server_view", "env_values",
           "config_values", "plan_changes", "verify_unit", "plan_text", "installed_record", "installed_version", "DEFAULTS", "SHOW_PROPS",
           "SERVER_CONFIG"]

DEFAULTS = {
    "unit_name": UNIT_NAME,
    "plan": {},
    "unit_content": "",
    "env_content": "",
    "env_file": ENV_FILE,
    "config_content": "",
    "config_file": None,                     # default <state_dir>/SERVER_CONFIG
    "state_dir": STATE_DIR,
    "unit_dir": UNIT_DIR,
    "venv_root": VENV_ROOT,
    "sglang_version_file": SGLANG_VERSION_FILE,
    "python": None,
    "service_user": SERVICE_USER,
    "force_service_user": False,             # root or a login user as the service user (system.service_user_problem)
    "server_keys": SERVER_KEYS,
    "topology_fingerprint": None,
    "gpu_count": None,
    "force": False,
    "validated": False,
    "enabled": None,
    "state": "checked",
    "journal_lines": 20,
    "proc_root": "/proc",                    # where validate looks for what holds the server's port(s)
    "port_probe": True,                      # and connects to / binds them when nothing here listens
}
SHOW_PROPS = ["LoadState", "ActiveState", "SubState", "UnitFileState", "NeedDaemonReload"]
FORCED = "forced (--tags given or launch_force)"
NOT_ACTIVE = "the unit is not active"
UNIT_CHANGED = "the unit file changed"
ENV_CHANGED = "the env file changed"
CONFIG_CHANGED = "the server's config file changed"
SAME = "the same plan already runs"
NOTHING_STOPPED = "nothing was stopped"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ENV_LINE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*=".*"$')
FINGERPRINT = re.compile(r"^[0-9a-f]{12}$")
# The server's own config file (constants.SERVER_CONFIG, `--config FILE.yaml`, read by SGLang inside its process):
# the secrets that must not be on its command line (api-key, watermark-config). Owned by the service user, 0600,
# under state_dir.
CONFIG_LINE = re.compile(r'^[a-z][a-z0-9-]*: ".*"$')


class LaunchError(Exception):
    """A failure the user must act on; `result` carries what was decided and done before it happened."""

    def __init__(self, msg, result=None):
        super().__init__(msg)
        self.result = result or {}


# ------------------------------------------------------------------------------------------------ files

def plan_text(plan):
    """current_plan.json's content: the plan as Ansible's to_nice_json writes it, and a newline."""
    return json.dumps(plan, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


def _dir_differs(path, owner):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return True
    return (st.st_mode & 0o7777) != 0o755 or (st.st_uid, st.st_gid) != tuple(owner)


def _ensure_dir(path, owner):
    os.makedirs(path, mode=0o755, exist_ok=True)
    os.chown(path, owner[0], owner[1])
    os.chmod(path, 0o755)


def env_values(content, keys):
    """The values of `keys` in an env file written by the launch role (KEY="value", \\ and \" escaped)."""
    out = []
    for line in content.splitlines():
        key, sep, value = line.partition("=")
        if not sep or key.strip() not in keys:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        if value:
            out.append(value)
    return out


def config_values(content):
    """The values of a server config file written by the launch role (`key: "JSON string"` lines): all secrets."""
    out = []
    for line in content.split("\n"):
        key, sep, value = line.partition(": ")
        if sep and CONFIG_LINE.match(line):
            try:
                value = json.loads(value)
            except ValueError:
                continue
            if value:
                out.append(value)
    return out


# --------------------------------------------------------------------------------------------- decision

def _layout_name(plan, default):
    layout = plan.get("layout")
    return layout.get("name", default) if isinstance(layout, dict) else default


def _flags(argv):
    """argv as {flag: its values joined by spaces}, in order (a value before any flag is kept under '')."""
    out, flag = {}, ""
    for a in argv if isinstance(argv, list) else []:
        if isinstance(a, str) and a.startswith("--"):
            flag = a
            out.setdefault(flag, [])
        else:
            out.setdefault(flag, []).append(str(a))
    return {k: " ".join(v) for k, v in out.items()}


def _mapping_changes(old, new, label, sep):
    old = old if isinstance(old, dict) else {}
    new = new if isinstance(new, dict) else {}
    changes = []
    for k in sorted(set(old) | set(new), key=str):
        if k not in new:
            changes.append("%s%s removed" % (label, k))
        elif k not in old:
            changes.append("%s%s added" % (label, k + sep + str(new[k]) if new[k] != "" else k))
        elif old[k] != new[k]:
            changes.append("%s%s %s -> %s" % (label, k, old[k] or "(set)", new[k] or "(set)"))
    return changes


def plan_changes(running, plan, server_keys, limit=4):
    """What differs between the running plan and the new one, in words: flags and env variables by name, other
    server keys with their old and new value (at most `limit` items, then how many more)."""
    changes = []
    for key in server_keys:
        old, new = running.get(key), plan.get(key)
        if json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True):
            continue
        if key == "argv":
            changes += _mapping_changes(_flags(old), _flags(new), "", " ")
        elif key == "env":
            changes += _mapping_changes(old, new, "env ", "=")
        elif key == "layout":
            if _layout_name(running, "") == _layout_name(plan, ""):   # a new name is said before these words
                changes.append("layout %s -> %s" % (json.dumps(old, sort_keys=True), json.dumps(new, sort_keys=True)))
        else:
            changes.append("%s %s -> %s" % (key, json.dumps(old), json.dumps(new)))
    if len(changes) > limit:
        changes = changes[:limit] + ["%d more" % (len(changes) - limit)]
    return changes


def decide(plan, running, server_keys, active_state, unit_changed, env_changed, force, config_changed=False):
    """Reasons to replace the server (empty: the same plan already runs), in the launch role's words."""
    reasons = []
    if force:
        reasons.append(FORCED)
    if active_state != "active":
        reasons.append(NOT_ACTIVE)
    if server_view(running, server_keys) != server_view(plan, server_keys):
        what = "; ".join(plan_changes(running, plan, server_keys)) if running else ""
        reasons.append("the plan changed (%s -> %s%s)" % (
            _layout_name(running, "none"), _layout_name(plan, "?"), ": " + what if what else ""))
    if unit_changed:
        reasons.append(UNIT_CHANGED)
    if env_changed:
        reasons.append(ENV_CHANGED)
    if config_changed:
        reasons.append(CONFIG_CHANGED)
    return reasons


def _running_plan(path):
    """The plan the unit runs now ({} when none was recorded)."""
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise LaunchError("Cannot read the plan the unit runs now, %s: %s. Remove that file (the next run then "
                          "replaces the server); %s." % (path, exc, NOTHING_STOPPED))
    if not isinstance(plan, dict):
        raise LaunchError("The plan the unit runs now, %s, is not a JSON object. Remove that file (the next run "
                          "then replaces the server); %s." % (path, NOTHING_STOPPED))
    return plan


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(value, where):
    """(where, text) of every string in a plan value, its mapping keys included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k, "%s key" % where)
            yield from _strings(v, "%s.%s" % (where, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, "%s[%d]" % (where, i))


def _control_problems(plan):
    """Every string of the server's part of the plan (what reaches the unit, the env file and argv) that holds a
    control character: systemd ends a line at CR as at LF, and a unit that cannot load costs the running server."""
    for key in SERVER_KEYS:
        for where, text in _strings(plan.get(key), key):
            bad = control_character(text)
            if bad:
                yield "%s %r contains a control character (%r)" % (where, text, bad)


def plan_problems(plan, fingerprint=None, gpu_count=None):
    """Every reason the plan cannot be launched as it is (empty: usable). `fingerprint`, `gpu_count`: this host's
    topology when the caller knows it (the plan must have been made for these GPUs)."""
    problems = list(_control_problems(plan))
    argv = plan.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        problems.append("argv %r is not a non-empty list of strings" % (argv,))
    gpus = plan.get("gpu_indices")
    if not isinstance(gpus, list) or not gpus or not all(_is_int(g) and g >= 0 for g in gpus) \
            or len(set(gpus)) != len(gpus):
        problems.append("gpu_indices %r are not distinct GPU indices" % (gpus,))
        gpus = None
    cvd = plan.get("cuda_visible_devices")
    if gpus is not None and cvd != ",".join(str(g) for g in gpus):
        problems.append("cuda_visible_devices %r is not gpu_indices %s" % (cvd, gpus))
    env = plan.get("env")
    if not isinstance(env, dict):
        problems.append("env %r is not a mapping" % (env,))
    else:
        problems.extend("env name %r is not a variable name" % k for k in env if not ENV_NAME.match(str(k)))
        if env.get("CUDA_VISIBLE_DEVICES", cvd) != cvd:
            problems.append("env CUDA_VISIBLE_DEVICES %r is not cuda_visible_devices %r" % (env["CUDA_VISIBLE_DEVICES"], cvd))
    port = plan.get("port")
    if not _is_int(port) or not 0 < port < 65536:
        problems.append("port %r is not a port number (1-65535)" % (port,))
    plan_fp = plan.get("topology_fingerprint")
    if not isinstance(plan_fp, str) or not FINGERPRINT.match(plan_fp):
        problems.append("topology_fingerprint %r is not 12 hex digits" % (plan_fp,))
    elif fingerprint and plan_fp != fingerprint:
        problems.append("the plan was made for topology %s but this host reads %s" % (plan_fp, fingerprint))
    if gpus is not None and gpu_count is not None and max(gpus) >= gpu_count:
        problems.append("the plan uses GPUs %s but this host has %d" % (gpus, gpu_count))
    version = plan.get("sglang_version")
    if not isinstance(version, str) or not version:
        problems.append("sglang_version %r is not a version" % (version,))
    layout = plan.get("layout")
    if not isinstance(layout, dict) or not isinstance(layout.get("name"), str):
        problems.append("layout %r has no name" % (layout,))
    return problems


def installed_record(path):
    """The sglang role's record of the SGLang release installed and current on this host, `path`
    ({"sglang_version", "package_version", "venv"}), with sglang_version as its base release; None when nothing was
    recorded (a host provisioned before the record existed). Raises LaunchError when the record cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LaunchError("Cannot read the installed SGLang version, %s: %s. Run the provision stage (--tags "
                          "provision), which writes it again; %s." % (path, exc, NOTHING_STOPPED)) from None
    version = record.get("sglang_version") if isinstance(record, dict) else None
    if not isinstance(version, str) or not version.strip():
        raise LaunchError("The installed SGLang version record %s has no sglang_version. Run the provision stage "
                          "(--tags provision), which writes it again; %s." % (path, NOTHING_STOPPED))
    return dict(record, sglang_version=base_version(version))


def installed_version(path):
    """The SGLang release installed and current on this host (installed_record), or None."""
    return (installed_record(path) or {}).get("sglang_version")


def validate(o, run=_run):
    """Everything checked before anything is stopped; raises LaunchError naming every problem.

    The plan, the rendered files, the SGLang version the plan is for against the one installed and current (the
    sglang role's record, `sglang_version_file`), the SGLang python, the model directory, the service user, and
    last the rendered unit checked with `systemd-analyze verify` on a temporary copy. One remote call carries all
    of it, so that a plan that cannot start never costs the running server."""
    plan = o["plan"]
    problems = ["the plan: " + p for p in plan_problems(plan, o["topology_fingerprint"], o["gpu_count"])]
    problems += _file_problems(o)
    if problems:
        raise LaunchError("Cannot launch: %s. Re-run the plan stage; %s." % ("; ".join(problems), NOTHING_STOPPED))
    installed = installed_version(o["sglang_version_file"])
    wanted = base_version(plan["sglang_version"])
    if installed is not None and installed != wanted:
        raise LaunchError(
            "Cannot launch: the plan is for SGLang %s but this host has SGLang %s installed and current (%s). "
            "Install %s first (topolaunch_sglang_version: %s, then --tags provision,relaunch), or plan again for %s "
            "(--tags relaunch); %s." % (wanted, installed, o["sglang_version_file"], wanted, wanted, installed,
                                        NOTHING_STOPPED))
    python = o["python"]
    if not python or not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise LaunchError(
            "Cannot launch: the SGLang python %r (sglang_version %s) %s. Run the provision stage (--tags provision) "
            "or fix topolaunch_sglang_version; %s." % (
                python, plan.get("sglang_version", "?"),
                "is not executable" if os.path.isfile(python) else "does not exist", NOTHING_STOPPED))
    bind = _bind_tool_problem(plan)
    if bind:
        raise LaunchError("Cannot launch: %s; %s." % (bind, NOTHING_STOPPED))
    model = plan.get("model_path")
    if isinstance(model, str) and model.startswith("/") and not os.path.isfile(os.path.join(model, "config.json")):
        raise LaunchError(
            "Cannot launch: the model directory %r (plan model_path) has no config.json. Run the provision stage "
            "(--tags provision) or fix topolaunch_model_path; %s." % (model, NOTHING_STOPPED))
    try:
        pwd.getpwnam(o["service_user"])
    except KeyError:
        raise LaunchError(
            "Cannot launch: the service user %r does not exist: the sglang role creates it (--tags provision); %s."
            % (o["service_user"], NOTHING_STOPPED)) from None
    problem = service_user_problem(o["service_user"], o["force_service_user"])
    if problem:
        raise LaunchError("Cannot launch: %s; %s." % (problem, NOTHING_STOPPED))
    # The port(s) the cleanup frees and the server takes: the plan's, and the running server's (issue 29: a port
    # held from outside this host's view stopped our server, then timed out waiting for the port).
    running = _running_plan(state_file(o["state_dir"], CURRENT_PLAN)) or {}
    ports = [(plan["port"], plan.get("host") or "127.0.0.1", True)]
    if _is_int(running.get("port")) and running["port"] != plan["port"]:
        ports.append((running["port"], running.get("host") or "127.0.0.1", False))
    held = [p for p in (port_problem(port, host, o["proc_root"], probe and o["port_probe"])
                        for port, host, probe in ports) if p]
    if held:
        raise LaunchError("Cannot launch: %s. Free it, or plan another port (topolaunch_port); %s."
                          % ("; ".join(held), NOTHING_STOPPED))
    # Room for what the launch writes (issue 25: ENOSPC after cleanup had stopped the working server).
    short = space_problems(o)
    if short:
        raise LaunchError("Cannot launch: %s. Free space there; %s." % ("; ".join(short), NOTHING_STOPPED))
    # The rendered unit as systemd would load it (issue 14).
    refused = verify_unit(o["unit_name"], o["unit_content"], run)
    if refused:
        raise LaunchError("Cannot launch: systemd-analyze verify refuses the rendered unit: %s. Fix the setting it "
                          "names; %s." % ("; ".join(refused), NOTHING_STOPPED))


# The PATH systemd gives a service without Environment=PATH (systemd's DEFAULT_PATH; the unit sets none): where
# SGLang's `exec numactl` finds it.
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _bind_tool_problem(plan, path=None):
    """Issue 25 item 8: a plan that binds its schedulers (numa_bind: --numa-node) needs the tool SGLang binds them
    with (numactl) on the service's PATH; without it the new server would fail (0.5.9, or 0.5.23 with
    SGLANG_CRASH_ON_NUMA_BIND_FAILURE) after cleanup had stopped the running one. The reason, or None."""
    record = plan.get("numa_bind") if isinstance(plan, dict) else None
    if not isinstance(record, dict) or not record.get("nodes"):
        return None
    tool, path = str(record.get("bind") or "numactl"), path or SERVICE_PATH
    if shutil.which(tool, path=path):
        return None
    return ("the plan binds its schedulers to NUMA nodes %s (--numa-node), which SGLang does through %s, and %s is "
            "not on the service's PATH (%s): the sglang role installs it (sglang_numactl_package, --tags provision)"
            % (",".join(str(n) for n in sorted(set(record["nodes"]))), tool, tool, path))


SPACE_MARGIN = 1 << 20      # bytes left free beyond what the launch writes: its temp files, the journal's own use


def _existing(path):
    while path and not os.path.exists(path):
        path = os.path.dirname(path.rstrip("/")) or "/"
    return path or "/"


def space_problems(o, statvfs=None):
    """Each file system the launch writes to (the env file, the server's config, the unit, the plan record) with
    less free space than those files need, twice (each is written beside itself, then renamed), plus SPACE_MARGIN."""
    files = [(o["env_file"], o["env_content"]), (o["config_file"] or state_file(o["state_dir"], SERVER_CONFIG),
                                                 o["config_content"]),
             (os.path.join(o["unit_dir"], o["unit_name"]), o["unit_content"]),
             (state_file(o["state_dir"], CURRENT_PLAN), plan_text(o["plan"]))]
    statvfs = statvfs or os.statvfs
    need = {}
    for path, content in files:
        where = _existing(os.path.dirname(path))
        try:
            st = statvfs(where)
        except OSError:
            continue
        key = st.f_fsid or where
        free, dirs, size = need.get(key, (st.f_bavail * st.f_frsize, set(), 0))
        need[key] = (free, dirs | {os.path.dirname(path)}, size + 2 * len((content or "").encode()))
    return ["%s: %d bytes free, the launch needs %d" % (", ".join(sorted(dirs)), free, size + SPACE_MARGIN)
            for free, dirs, size in need.values() if free < size + SPACE_MARGIN]


def _file_problems(o):
    """The rendered env file, unit and server config, line by line: a control character anywhere (a value of
    launch_extra_env, a path, a secret) or a line that is not what the templates write. Secrets are never quoted:
    a line is named by its number and its key only."""
    problems = []
    files = (("env file", o["env_content"], ENV_LINE, 'NAME="value"'),
             ("unit file", o["unit_content"], None, None),
             ("server config file", o["config_content"], CONFIG_LINE, 'key: "value"'))
    for what, content, shape, words in files:
        for number, line in enumerate(content.split("\n"), 1):
            key = line.partition("=" if what != "server config file" else ":")[0].strip()[:40]
            bad = control_character(line)
            if bad:
                problems.append("%s line %d (%s) contains a control character (%r) (in the plan's env, "
                                "launch_extra_env, a path or a secret?)" % (what, number, key, bad))
            elif shape and line.strip() and not line.startswith("#") and not shape.match(line):
                problems.append("%s line %d (%s) is not %s" % (what, number, key, words))
            elif what == "server config file" and shape.match(line):
                problem = config_value_problem(line) or _config_flag_problem(key, o["plan"].get("sglang_version"))
                if problem:
                    problems.append("%s line %d (%s, from %s): %s" % (
                        what, number, key, CONFIG_SOURCES.get(key, "the launch role"), problem))
    return problems


# Where each key of the server config file comes from (the templates write only these).
# (plan_args.SECRET_SOURCES: the secrets the planner keeps out of the plan, keys spelled as their flags).
CONFIG_SOURCES = {name.replace("_", "-"): source for name, source in SECRET_SOURCES.items()}


def _config_flag_problem(key, version):
    """Why the plan's SGLang release cannot take `key` of the server config file (it has no --key: argparse exits
    2 at start), or None (an unknown release is plan_problems' to name)."""
    try:
        index = FlagIndex(str(version))
    except KeyError:
        return None
    return None if index.has("--" + key) else "SGLang %s has no --%s" % (index.version, key)


def config_value_problem(line):
    """Why SGLang cannot take a `key: "JSON string"` line of its --config file, or None. SGLang 0.5.9 and 0.5.23
    read the file with yaml.safe_load and put each value into argv after `--key` (utils/server_args_config_parser.py,
    _convert_config_to_args): a value beginning with '-' then reads as a flag (argparse: "expected one argument",
    exit 2); and the file is opened in the locale's encoding, so only printable ASCII is certain to load. The value
    itself is never quoted (it is a secret)."""
    try:
        value = json.loads(line.partition(": ")[2])
    except ValueError:
        return "the value is not a JSON string"
    if not isinstance(value, str) or not value:
        return "the value is empty"
    if value.startswith("-"):
        return "the value begins with '-', which SGLang's argument parser takes for a flag (the server would exit " \
               "at start): choose one that does not"
    odd = sum(1 for c in value if not 0x20 <= ord(c) <= 0x7e)
    if odd:
        return "the value has %d character(s) outside printable ASCII, which SGLang's config file reader may not " \
               "load: use letters, digits and punctuation" % odd
    return None


def verify_unit(name, content, run=_run):
    """`systemd-analyze verify` of the rendered unit, on a temporary copy under its own name: the problems it names
    in our unit (a fatal one, or a setting systemd would ignore), or [] (also when systemd-analyze is missing).
    A unit that systemd cannot load must fail here, before cleanup stops the running server."""
    if not shutil.which("systemd-analyze") and run is _run:
        return []
    directory = tempfile.mkdtemp(prefix="topolaunch-verify-")
    try:
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
        rc, out, err = run(["systemd-analyze", "verify", path])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    lines = [line.strip() for line in (err + "\n" + out).splitlines() if line.strip()]
    ours = [line.replace(path, name) for line in lines if line.startswith(path) or line.startswith(name + ":")]
    if rc != 0 and not ours:
        ours = lines[-5:] or ["exit status %s" % rc]
    return ours


# ------------------------------------------------------------------------------------------------- launch

def units_present(unit_dir, patterns):
    """The names in `unit_dir` that match one of the shell `patterns` (as ansible.builtin.find's patterns match a
    file's name), sorted; [] when the directory does not exist. The validate call reads them for the relaunch, which
    stops the units of the other shape (replicas after one server, one server after replicas) without a call of its
    own."""
    try:
        names = os.listdir(unit_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns))


def launch(opts, check_mode=False, run=_run, owner=(0, 0), clean=None):
    """Validate (and with state `started` write and start) the unit; returns the module's result.

    clean: with state `started`, a callable(check_mode) -> result that stops the running server and cleans our GPUs
    (cleanup.py), called when the server is replaced, before anything is written (its result is `cleanup`): one call
    on the host stops the old server and starts the new one.
    Raises LaunchError with a message for the user and `result` (what was decided and done so far)."""
    o = dict(DEFAULTS)
    o.update({k: v for k, v in opts.items() if v is not None})
    if o["state"] not in ("checked", "started"):
        raise LaunchError("state %r: must be checked or started" % o["state"])
    if not isinstance(o["plan"], dict) or not o["plan"]:
        raise LaunchError("No plan to launch: the plan stage did not run in this play and saved no plan on the "
                          "controller. Run it first (deploy.yml --tags relaunch runs plan, validate, cleanup, launch "
                          "and health); %s." % NOTHING_STOPPED)
    if not o["python"]:
        o["python"] = sglang_python(o["plan"].get("sglang_version", ""), o["venv_root"])
    name = o["unit_name"]
    unit_path = os.path.join(o["unit_dir"], name)
    plan_path = state_file(o["state_dir"], CURRENT_PLAN)
    config_path = o["config_file"] or state_file(o["state_dir"], SERVER_CONFIG)

    if o["state"] == "checked" or not o["validated"]:
        validate(o, run)
    try:
        user = pwd.getpwnam(o["service_user"])
    except KeyError:
        raise LaunchError("Cannot launch: the service user %r does not exist: the sglang role creates it "
                          "(--tags provision); %s." % (o["service_user"], NOTHING_STOPPED)) from None
    # (path, content, mode, owner): written in this order, the env file and the server's config before the unit
    # that reads them. The config is the service user's own (SGLang reads it inside its process); without content
    # it must not exist.
    files = [
        (o["env_file"], o["env_content"], 0o600, owner),
        (config_path, o["config_content"], 0o600, (user.pw_uid, user.pw_gid)),
        (unit_path, o["unit_content"], 0o644, owner),
        (plan_path, plan_text(o["plan"]), 0o644, owner),
    ]
    running = _running_plan(plan_path)
    props = show(name, SHOW_PROPS, run, LaunchError)
    differs = {path: file_differs(path, content, mode, who) if content else os.path.lexists(path)
               for path, content, mode, who in files}
    reasons = decide(o["plan"], running, o["server_keys"], props.get("ActiveState", ""),
                     differs[unit_path], differs[o["env_file"]], o["force"], differs[config_path])
    result = {
        "changed": False, "replace": bool(reasons), "reasons": reasons, "reason": ", ".join(reasons) or SAME,
        "unit_state": {k: props.get(k, "") for k in ("LoadState", "ActiveState", "SubState", "UnitFileState")},
        "unit_path": unit_path, "plan_path": plan_path, "written": [], "actions": [], "plan": o["plan"],
        "stage": "validate" if o["state"] == "checked" else "launch",
        # the unit's boot start already as asked (enabled): a kept server then needs no launch call at all
        "enabled_as_wanted": o["enabled"] is None or o["enabled"] == (props.get("UnitFileState") == "enabled"),
    }
    if o.get("list_units"):
        result["units_present"] = units_present(o["unit_dir"], o["list_units"])
    if o["state"] == "checked":
        return result
    # A kept server keeps its record: current_plan.json says what the unit was started with.
    differs[plan_path] = differs[plan_path] and result["replace"]

    # ---- started: the old server stopped and our GPUs clean (in the same call), then directories, files
    if clean is not None and result["replace"]:
        result["cleanup"] = clean(check_mode)
        result["changed"] = bool(result["cleanup"].get("changed"))
    for directory in sorted({os.path.dirname(o["env_file"]), o["state_dir"]}):
        if _dir_differs(directory, owner):
            result["written"].append(directory)
            if not check_mode:
                _ensure_dir(directory, owner)
    for path, content, mode, who in files:
        if differs[path]:
            result["written"].append(path)
            if not check_mode:
                try:
                    if content:
                        write_atomic(path, content, mode, who)
                    else:
                        os.unlink(path)
                except OSError as err:
                    result["written"].pop()
                    raise LaunchError("Writing %s failed: %s" % (path, err.strerror or err), result) from None

    # ---- started: systemd
    result["changed"] = result["changed"] or bool(result["written"])

    def act(argv, action, allowed=None):
        """Run one systemctl action (only note it in check mode); a failure raises unless `allowed` says so."""
        result["actions"].append(action)
        result["changed"] = True
        if check_mode:
            return
        rc, out, err = run(argv)
        if rc != 0 and not (allowed and allowed(err)):
            result["actions"][-1] += " (failed)"
            raise LaunchError("%s failed (rc %s): %s" % (" ".join(argv), rc, (err or out).strip()), result)

    if differs[unit_path] or props.get("NeedDaemonReload") == "yes":
        act(["systemctl", "daemon-reload"], "daemon-reload")
        if not check_mode:
            props = show(name, SHOW_PROPS, run, LaunchError)
    active = props.get("ActiveState") == "active"
    if props.get("LoadState") == "loaded" and (result["replace"] or not active):
        # "not loaded": systemd holds no state for the unit (never started, or collected), nothing to reset.
        # Always followed by the start below.
        act(["systemctl", "reset-failed", name], "reset-failed", allowed=lambda err: "not loaded" in err)
    if o["enabled"] is not None and o["enabled"] != (props.get("UnitFileState") == "enabled"):
        verb = "enable" if o["enabled"] else "disable"
        act(["systemctl", verb, name], verb)
    if result["replace"]:                                  # "not active" is one of the reasons
        try:
            act(["systemctl", "restart", name], "restart")
        except LaunchError as exc:
            raise LaunchError("%s. Last log lines of %s (journalctl -u %s):\n%s" % (
                exc, name, name, _journal_tail(name, o["journal_lines"], run)), result) from None
    return result


def rollback_facts(state_dir, plan, done):
    """What a failed launch call (its cleanup or its start) leaves for the relaunch's rollback, as sglang_health's
    failures carry it: the plan that failed, the last known good plan and whether it runs another server
    (`last_good_plan`, `last_good_differs`), and whether the old server was stopped (`server_stopped`: the unit
    stopped, processes of ours stopped, or a restart tried). `done`: the launch's or the cleanup's result so far."""
    clean = done.get("cleanup") or done
    stopped = bool((clean.get("unit") or {}).get("stopped") or clean.get("stopped")
                   or "restart" in (done.get("actions") or []) or "restart (failed)" in (done.get("actions") or []))
    return dict(last_good_facts(state_file(state_dir, LAST_GOOD_PLAN), plan), plan=plan, server_stopped=stopped)


def _journal_tail(name, lines, run):
    try:
        return "\n".join(journal(name, lines, run, LaunchError)) or "(no log lines)"
    except LaunchError as exc:
        return "(%s)" % exc
