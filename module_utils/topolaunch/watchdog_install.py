"""Install (or remove) the watchdog on a server host: the logic of the `sglang_watchdog` module.

What goes on the host (docs/DESIGN.md "Target paths"):

- `<package_dir>/topolaunch_watchdog/`: watchdog.py and the modules it uses (cleanup.py, constants.py,
  system.py; health.py, health_nodes.py and text.py for the answer probe), copied from the very module_utils this
  module runs with (their sources read through the import system, so the same code in the repository, the
  installed collection and an AnsiballZ payload);
- `<config_file>` (JSON, root 0644, no secret): the checked watchdog settings (watchdog.DEFAULTS' keys);
- `<unit_dir>/<name>.service`: a oneshot running `<python> -m topolaunch_watchdog.watchdog <config_file>` as root
  (it stops and starts units; the python is the tools venv's, for nvidia-ml-py), its lines in the journal
  under the identifier `<name>`;
- `<unit_dir>/<name>.timer`: OnActiveSec/OnUnitActiveSec = interval, AccuracySec=1s, enabled and started.

Bad settings fail naming the field before anything is written. Idempotent: files are written only when they
differ, systemd reloaded only then; check mode says what would change.
"""
import importlib
import importlib.util
import json
import os
import shutil

from . import cleanup as _cleanup, constants as _constants, system as _system, watchdog as _watchdog
from . import health as _health, health_nodes as _health_nodes, text as _text
from .system import file_differs, run as _run, write_atomic
from .watchdog import SettingsError, check_settings

__all__ = ["InstallError", "install", "render_service", "render_timer", "package_sources", "DEFAULTS"]

DEFAULTS = {
    "name": "topolaunch-watchdog",
    "python": _constants.TOOLS_PYTHON,
    "package_dir": "/opt/topolaunch/watchdog",
    "config_file": "/etc/topolaunch/watchdog.json",
    "unit_dir": _constants.UNIT_DIR,
    "state": "present",
}
PACKAGE = "topolaunch_watchdog"


class InstallError(Exception):
    """A failure the user must act on."""


def package_sources():
    """{file name: source} of the watchdog's package (the modules as this process imported them)."""
    out = {"__init__.py": '"""The topolaunch watchdog, installed by the sglang_watchdog module. Do not edit."""\n'}
    for module in (_watchdog, _cleanup, _constants, _system, _health, _health_nodes, _text):
        loader = getattr(module, "__loader__", None)
        source = loader.get_source(module.__name__) if loader is not None else None
        if source is None:
            source = importlib.util.find_spec(module.__name__).loader.get_source(module.__name__)
        out[module.__name__.rsplit(".", 1)[1] + ".py"] = source
    return out


def _timeout(s):
    """The longest one run may take: a probe per server, a stop and a cleanup."""
    per = s["probe_timeout"] + s["term_timeout"] + s["kill_timeout"] + s["release_timeout"] + 30
    return int(per * len(s["servers"]) + 60)


def render_service(name, python, package_dir, config_file, s):
    return """# topolaunch watchdog: probe each SGLang server's generation health, restart a hung one (sglang_watchdog).
[Unit]
Description=topolaunch watchdog: probe the SGLang server(s), restart a hung one
After=network-online.target

[Service]
Type=oneshot
Environment=PYTHONPATH=%s
ExecStart=%s -m %s.watchdog %s
TimeoutStartSec=%d
SyslogIdentifier=%s
""" % (package_dir, python, PACKAGE, config_file, _timeout(s), name)


def render_timer(name, s):
    interval = s["interval"]
    return """# topolaunch watchdog timer: one run every %(i)s s (topolaunch_watchdog_interval).
[Unit]
Description=topolaunch watchdog: every %(i)s s

[Timer]
OnActiveSec=%(i)ss
OnUnitActiveSec=%(i)ss
AccuracySec=1s
Unit=%(n)s.service

[Install]
WantedBy=timers.target
""" % {"i": ("%g" % interval), "n": name}


def _check_path(value, field):
    if not isinstance(value, str) or not value.startswith("/") or any(
            ord(c) < 33 or ord(c) == 127 for c in value):
        raise InstallError("%s must be an absolute path without spaces or control characters, got %r"
                           % (field, value))


def install(opts, settings, check_mode=False, run=_run, owner=(0, 0)):
    """Returns {changed, files (the paths written or that would be), timer, settings}."""
    o = dict(DEFAULTS)
    o.update({k: v for k, v in (opts or {}).items() if v is not None})
    for field in ("python", "package_dir", "config_file", "unit_dir"):
        _check_path(o[field], field)
    if not isinstance(o["name"], str) or not _watchdog.UNIT_RE.match(o["name"] + ".service"):
        raise InstallError("name must be a systemd unit name, got %r" % (o["name"],))
    service = os.path.join(o["unit_dir"], o["name"] + ".service")
    timer = os.path.join(o["unit_dir"], o["name"] + ".timer")
    if o["state"] == "absent":
        return _remove(o, service, timer, check_mode, run)
    try:
        s = check_settings(settings)
    except SettingsError as err:
        raise InstallError(str(err)) from None
    files = {os.path.join(o["package_dir"], PACKAGE, name): (text, 0o644)
             for name, text in package_sources().items()}
    files[o["config_file"]] = (json.dumps(s, indent=2, sort_keys=True) + "\n", 0o644)
    files[service] = (render_service(o["name"], o["python"], o["package_dir"], o["config_file"], s), 0o644)
    files[timer] = (render_timer(o["name"], s), 0o644)
    changed = [path for path, (text, mode) in sorted(files.items()) if file_differs(path, text, mode, owner)]
    units_changed = service in changed or timer in changed
    rc, out, _err = run(["systemctl", "is-enabled", o["name"] + ".timer"])
    enabled = rc == 0 and out.strip() == "enabled"
    rc, out, _err = run(["systemctl", "is-active", o["name"] + ".timer"])
    active = rc == 0 and out.strip() == "active"
    result = {"changed": bool(changed) or not (enabled and active), "files": changed,
              "timer": o["name"] + ".timer", "settings": s}
    if check_mode:
        return result
    for path in changed:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        text, mode = files[path]
        write_atomic(path, text, mode, owner)
    if units_changed:
        _must(run, ["systemctl", "daemon-reload"])
    if not enabled or not active:
        _must(run, ["systemctl", "enable", "--now", o["name"] + ".timer"])
    elif units_changed:
        _must(run, ["systemctl", "restart", o["name"] + ".timer"])
    return result


def _must(run, argv):
    rc, _out, err = run(argv)
    if rc != 0:
        raise InstallError("%s failed (rc %s): %s" % (" ".join(argv), rc, err.strip()))


def _remove(o, service, timer, check_mode, run):
    package = os.path.join(o["package_dir"], PACKAGE)
    present = [p for p in (timer, service, o["config_file"]) if os.path.exists(p)]
    if os.path.isdir(package):
        present.append(package)
    result = {"changed": bool(present), "files": present, "timer": o["name"] + ".timer", "settings": None}
    if check_mode or not present:
        return result
    run(["systemctl", "disable", "--now", o["name"] + ".timer"])
    for path in (timer, service, o["config_file"]):
        if os.path.exists(path):
            os.remove(path)
    if os.path.isdir(package):
        shutil.rmtree(package)
    _must(run, ["systemctl", "daemon-reload"])
    return result
