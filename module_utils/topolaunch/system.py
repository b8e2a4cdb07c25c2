"""Small system helpers shared by the lifecycle modules (service, cleanup, health): run a command, read
`systemctl show`, write a file atomically with its mode and owner. Plain Python 3.9+ stdlib."""
import os
import pwd
import re
import subprocess
import tempfile

__all__ = ["run", "parse_show", "show", "journal", "file_differs", "write_atomic", "service_user_problem",
           "NO_LOGIN_SHELLS", "FORCE_SERVICE_USER"]

# Shells that refuse a login (the sglang role creates the service user with /usr/sbin/nologin).
NO_LOGIN_SHELLS = ("nologin", "false")
# The inventory's explicit opt-in to a service user that is root or can log in.
FORCE_SERVICE_USER = "topolaunch_force_service_user"


def service_user_problem(name, forced=False, getpwnam=None):
    """Why `name` may not run the server, or None (also None when it does not exist: the callers say so in their
    words). Root, or a user with a login shell: the unit would run SGLang with that user's rights and cleanup would
    take every process of that user on our GPUs for ours (signalling them), unless the inventory forces it."""
    try:
        entry = (getpwnam or pwd.getpwnam)(name)
    except KeyError:
        return None
    if forced is True:
        return None
    if entry.pw_uid == 0:
        why = "has uid 0 (root)"
    elif os.path.basename(entry.pw_shell or "") not in NO_LOGIN_SHELLS:
        why = "has a login shell (%s)" % entry.pw_shell
    else:
        return None
    return ("the service user %r (topolaunch_service_user) %s: the server would run with its rights and cleanup "
            "would signal its other processes on our GPUs; use a system user without a login shell (the sglang "
            "role creates one), or set %s: true" % (name, why, FORCE_SERVICE_USER))


def run(argv):
    """Run argv; (returncode, stdout, stderr). The modules take this as their injectable `run`."""
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    return p.returncode, p.stdout, p.stderr


def parse_show(text):
    """`systemctl show` KEY=VALUE lines -> dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


def show(unit, props, run, error):
    """`systemctl show` of the properties `props` of `unit` as a dict; raises `error(message)` when it fails."""
    rc, out, err = run(["systemctl", "show", "--property=" + ",".join(props), unit])
    if rc != 0:
        raise error("systemctl show %s failed (rc %s): %s" % (unit, rc, err.strip()))
    return parse_show(out)


def journal(unit, lines, run, error, invocation_id=None, grep=None):
    """The last `lines` log lines of `unit` (of one start, its own output and systemd's messages about it, when
    invocation_id is given), only those matching the regular expression `grep` when given (journalctl --grep; a
    journalctl built without pattern matching: the Python filter of the last `lines`); raises `error(message)`
    when journalctl fails."""
    argv = ["journalctl", "--no-pager", "-o", "cat", "-n", str(lines)]
    if invocation_id:
        argv += ["_SYSTEMD_INVOCATION_ID=%s" % invocation_id, "+", "INVOCATION_ID=%s" % invocation_id]
    else:
        argv += ["-u", unit]
    if grep:
        rc, out, err = run(argv + ["--quiet", "--grep", grep, "--case-sensitive=true"])
        if rc == 0 or "pattern matching" not in err:
            if rc != 0 and not (rc == 1 and not out.strip() and not err.strip()):
                raise error("journalctl failed (rc %s): %s" % (rc, err.strip()))
            return out.splitlines()
        return [line for line in journal(unit, lines, run, error, invocation_id) if re.search(grep, line)]
    rc, out, err = run(argv)
    if rc != 0:
        raise error("journalctl failed (rc %s): %s" % (rc, err.strip()))
    return out.splitlines()


def file_differs(path, content, mode, owner):
    """True when `path` is missing or its content, permission bits or (uid, gid) differ."""
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8", newline="") as f:
            current = f.read()
    except FileNotFoundError:
        return True
    except UnicodeDecodeError:
        return True
    return current != content or (st.st_mode & 0o7777) != mode or (st.st_uid, st.st_gid) != tuple(owner)


def write_atomic(path, content, mode, owner):
    """Write `content` to `path` through a temp file in the same directory: mkstemp creates it 0600, the
    content goes in, then its owner and mode are set and it is renamed over `path`. A reader sees the old file or
    the new one, never a half-written one; a 0600 file is never readable by anyone else, not even briefly."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(content)
            f.flush()
            os.fchown(f.fileno(), owner[0], owner[1])
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
