"""Check, write and start the systemd unit that runs the planned SGLang server, in one call.

`service(opts, check_mode, run)` is the logic of the `sglang_service` module. Two states:

- `checked` reads only (the launch role runs it before cleanup stops anything):
  1. preconditions, each failing with the bad value, what to do and "nothing was stopped": the SGLang python
     exists and is executable, an absolute `plan.model_path` has a config.json, the service user exists, the
     plan the unit runs now (`<state_dir>/current_plan.json`) is readable;
  2. the decision whether the server must be replaced, with its reasons: forced; the unit is not active; the plan
     changed (only `server_keys` are compared, key order does not matter); the unit file changed; the env file
     changed. A file "changed" when its content, mode or owner differ from what would be written.
- `started` does the same, then: creates the env file's directory and `state_dir` (root 0755); writes the env
  file (root 0600, created 0600: the secrets are never readable by anyone else), the unit file (0644) and
  `current_plan.json` (0644), each only when it differs, each atomically (temp file in the same directory, then
  rename); `systemctl daemon-reload` when the unit file was written (or systemd asks for it); when the unit is
  loaded and (replace or not active) `systemctl reset-failed` (a server that crashed repeatedly leaves systemd's
  start-limit counter spent, and our deliberate start would be refused); enable/disable per `enabled`; then
  `systemctl restart` when replacing, `systemctl start` when not active. A failed start raises with systemctl's
  message and the unit's last journal lines.

Check mode: everything is read and decided; `written` and `actions` say what would be done; nothing changes.

Plain Python 3.9+ stdlib; systemctl/journalctl through `run(argv) -> (rc, out, err)`; file owner through `owner`
(uid, gid), root in production.
"""
import json
import os
import pwd

from .system import file_differs, journal, run as _run, show, write_atomic

__all__ = ["ServiceError", "service", "decide", "server_view", "file_differs", "write_atomic", "env_values",
           "plan_text", "DEFAULTS", "SHOW_PROPS"]

DEFAULTS = {
    "name": "topolaunch-sglang.service",
    "plan": {},
    "unit_content": "",
    "env_content": "",
    "env_file": "/etc/topolaunch/sglang.env",
    "state_dir": "/var/lib/topolaunch",
    "unit_dir": "/etc/systemd/system",
    "python": "",
    "service_user": "sglang",
    "server_keys": ["layout", "gpu_indices", "cuda_visible_devices", "env", "argv", "host", "port", "model_path",
                    "served_model_name", "sglang_version"],
    "force": False,
    "enabled": None,
    "state": "checked",
    "journal_lines": 20,
}
SHOW_PROPS = ["LoadState", "ActiveState", "SubState", "UnitFileState", "NeedDaemonReload"]
FORCED = "forced (--tags given or launch_force)"
NOT_ACTIVE = "the unit is not active"
UNIT_CHANGED = "the unit file changed"
ENV_CHANGED = "the env file changed"
SAME = "the same plan already runs"
NOTHING_STOPPED = "nothing was stopped"


class ServiceError(Exception):
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


# --------------------------------------------------------------------------------------------- decision

def server_view(plan, keys):
    """The parts of a plan that make the server what it is, as key-sorted JSON (key order does not matter)."""
    return json.dumps({k: v for k, v in plan.items() if k in keys}, sort_keys=True)


def _layout_name(plan, default):
    layout = plan.get("layout")
    return layout.get("name", default) if isinstance(layout, dict) else default


def decide(plan, running, server_keys, active_state, unit_changed, env_changed, force):
    """Reasons to replace the server (empty: the same plan already runs), in the launch role's words."""
    reasons = []
    if force:
        reasons.append(FORCED)
    if active_state != "active":
        reasons.append(NOT_ACTIVE)
    if server_view(running, server_keys) != server_view(plan, server_keys):
        reasons.append("the plan changed (%s -> %s)" % (_layout_name(running, "none"), _layout_name(plan, "?")))
    if unit_changed:
        reasons.append(UNIT_CHANGED)
    if env_changed:
        reasons.append(ENV_CHANGED)
    return reasons


def _running_plan(path):
    """The plan the unit runs now ({} when none was recorded)."""
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ServiceError("Cannot read the plan the unit runs now, %s: %s. Remove that file (the next run then "
                           "replaces the server); %s." % (path, exc, NOTHING_STOPPED))
    if not isinstance(plan, dict):
        raise ServiceError("The plan the unit runs now, %s, is not a JSON object. Remove that file (the next run "
                           "then replaces the server); %s." % (path, NOTHING_STOPPED))
    return plan


def _preconditions(o):
    """Fail before anything changes when the venv, the model or the service user is not there."""
    plan = o["plan"]
    python = o["python"]
    if not python or not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise ServiceError(
            "Cannot launch: the SGLang python %r (sglang_version %s) %s. Run the provision stage (--tags provision) "
            "or fix topolaunch_sglang_version; %s." % (
                python, plan.get("sglang_version", "?"),
                "is not executable" if os.path.isfile(python) else "does not exist", NOTHING_STOPPED))
    model = plan.get("model_path")
    if isinstance(model, str) and model.startswith("/") and not os.path.isfile(os.path.join(model, "config.json")):
        raise ServiceError(
            "Cannot launch: the model directory %r (plan model_path) has no config.json. Run the provision stage "
            "(--tags provision) or fix topolaunch_model_path; %s." % (model, NOTHING_STOPPED))
    try:
        pwd.getpwnam(o["service_user"])
    except KeyError:
        raise ServiceError(
            "Cannot launch: the service user %r does not exist: the sglang role creates it (--tags provision); %s."
            % (o["service_user"], NOTHING_STOPPED)) from None


# ------------------------------------------------------------------------------------------------ service

def service(opts, check_mode=False, run=_run, owner=(0, 0)):
    """Check (and with state `started` write and start) the unit; returns the module's result.

    Raises ServiceError with a message for the user and `result` (what was decided and done so far)."""
    o = dict(DEFAULTS)
    o.update({k: v for k, v in opts.items() if v is not None})
    if o["state"] not in ("checked", "started"):
        raise ServiceError("state %r: must be checked or started" % o["state"])
    if not isinstance(o["plan"], dict) or not o["plan"]:
        raise ServiceError("plan: the plan (a non-empty mapping) is required; %s" % NOTHING_STOPPED)
    name = o["name"]
    unit_path = os.path.join(o["unit_dir"], name)
    plan_path = os.path.join(o["state_dir"], "current_plan.json")
    files = [  # (path, content, mode): written in this order, the env file before the unit that reads it
        (o["env_file"], o["env_content"], 0o600),
        (unit_path, o["unit_content"], 0o644),
        (plan_path, plan_text(o["plan"]), 0o644),
    ]

    _preconditions(o)
    running = _running_plan(plan_path)
    props = show(name, SHOW_PROPS, run, ServiceError)
    differs = {path: file_differs(path, content, mode, owner) for path, content, mode in files}
    reasons = decide(o["plan"], running, o["server_keys"], props.get("ActiveState", ""),
                     differs[unit_path], differs[o["env_file"]], o["force"])
    result = {
        "changed": False, "replace": bool(reasons), "reasons": reasons, "reason": ", ".join(reasons) or SAME,
        "unit_state": {k: props.get(k, "") for k in ("LoadState", "ActiveState", "SubState", "UnitFileState")},
        "unit_path": unit_path, "plan_path": plan_path, "written": [], "actions": [],
    }
    if o["state"] == "checked":
        return result

    # ---- started: directories, files
    for directory in sorted({os.path.dirname(o["env_file"]), o["state_dir"]}):
        if _dir_differs(directory, owner):
            result["written"].append(directory)
            if not check_mode:
                _ensure_dir(directory, owner)
    for path, content, mode in files:
        if differs[path]:
            result["written"].append(path)
            if not check_mode:
                write_atomic(path, content, mode, owner)

    # ---- started: systemd
    result["changed"] = bool(result["written"])

    def act(argv, action, allowed=None):
        """Run one systemctl action (only note it in check mode); a failure raises unless `allowed` says so."""
        result["actions"].append(action)
        result["changed"] = True
        if check_mode:
            return
        rc, out, err = run(argv)
        if rc != 0 and not (allowed and allowed(err)):
            result["actions"][-1] += " (failed)"
            raise ServiceError("%s failed (rc %s): %s" % (" ".join(argv), rc, (err or out).strip()), result)

    if differs[unit_path] or props.get("NeedDaemonReload") == "yes":
        act(["systemctl", "daemon-reload"], "daemon-reload")
        if not check_mode:
            props = show(name, SHOW_PROPS, run, ServiceError)
    active = props.get("ActiveState") == "active"
    if props.get("LoadState") == "loaded" and (result["replace"] or not active):
        # "not loaded": systemd holds no state for the unit (never started, or collected), nothing to reset.
        # Always followed by the start below.
        act(["systemctl", "reset-failed", name], "reset-failed", allowed=lambda err: "not loaded" in err)
    if o["enabled"] is not None and o["enabled"] != (props.get("UnitFileState") == "enabled"):
        verb = "enable" if o["enabled"] else "disable"
        act(["systemctl", verb, name], verb)
    start = "restart" if result["replace"] else ("start" if not active else None)
    if start:
        try:
            act(["systemctl", start, name], start)
        except ServiceError as exc:
            raise ServiceError("%s. Last log lines of %s (journalctl -u %s):\n%s" % (
                exc, name, name, _journal_tail(name, o["journal_lines"], run)), result) from None
    return result


def _journal_tail(name, lines, run):
    try:
        return "\n".join(journal(name, lines, run, ServiceError)) or "(no log lines)"
    except ServiceError as exc:
        return "(%s)" % exc
