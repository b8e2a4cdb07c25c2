"""module_utils/topolaunch/system.py: systemctl show parsing, file comparison, the atomic writer."""
import os
import stat

from ansible_collections.topolaunch.sglang.plugins.module_utils.system import (file_differs, journal, parse_show,
                                                                               show, write_atomic)

ME = (os.getuid(), os.getgid())


class Boom(Exception):
    pass


def test_parse_show_and_show():
    assert parse_show("ActiveState=active\nInvocationID=\nNoise\nA=b=c\n") == {
        "ActiveState": "active", "InvocationID": "", "A": "b=c"}
    calls = []
    props = show("u.service", ["ActiveState"], lambda argv: calls.append(argv) or (0, "ActiveState=failed\n", ""), Boom)
    assert props == {"ActiveState": "failed"} and calls == [["systemctl", "show", "--property=ActiveState", "u.service"]]
    try:
        show("u.service", ["X"], lambda argv: (1, "", "Access denied\n"), Boom)
    except Boom as exc:
        assert str(exc) == "systemctl show u.service failed (rc 1): Access denied"
    else:
        raise AssertionError("no error")


def test_journal_of_one_start_or_of_the_unit():
    seen = []

    def run(argv):
        seen.append(argv)
        return 0, "a\nb\n", ""

    assert journal("u.service", 5, run, Boom, "abc") == ["a", "b"]
    assert seen[0][-3:] == ["_SYSTEMD_INVOCATION_ID=abc", "+", "INVOCATION_ID=abc"]
    journal("u.service", 5, run, Boom)
    assert seen[1][-2:] == ["-u", "u.service"]


def test_journal_by_pattern():
    """--grep when journalctl has it; no match (rc 1, nothing said) is no line; without pattern matching compiled
    in, the last lines filtered here; any other failure is the error."""
    seen = []

    def grep_ok(argv):
        seen.append(argv)
        return 0, "ready\n", ""

    assert journal("u.service", 5, grep_ok, Boom, "abc", grep="ready|begin") == ["ready"]
    assert seen[0][-4:] == ["--quiet", "--grep", "ready|begin", "--case-sensitive=true"]
    assert journal("u.service", 5, lambda argv: (1, "", ""), Boom, grep="x") == []

    def no_pcre(argv):
        if "--grep" in argv:
            return 1, "", "Compiled without pattern matching support\n"
        return 0, "a begin\nnoise\nready\n", ""

    assert journal("u.service", 5, no_pcre, Boom, grep="ready|begin") == ["a begin", "ready"]
    try:
        journal("u.service", 5, lambda argv: (1, "", "Access denied\n"), Boom, grep="x")
    except Boom as exc:
        assert "Access denied" in str(exc)
    else:
        raise AssertionError("no error")


def test_write_atomic_then_file_differs(tmp_path):
    path = str(tmp_path / "f")
    assert file_differs(path, "x", 0o644, ME)
    write_atomic(path, "x", 0o600, ME)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and open(path).read() == "x"
    assert not file_differs(path, "x", 0o600, ME)
    assert file_differs(path, "x", 0o644, ME) and file_differs(path, "y", 0o600, ME)
    assert os.listdir(tmp_path) == ["f"]


def test_a_root_or_login_service_user_is_refused_unless_forced():
    """Issue 25 item 13: topolaunch_service_user root (or any login user) was accepted; cleanup then took that
    user's other processes on our GPUs for ours."""
    import collections
    from ansible_collections.topolaunch.sglang.plugins.module_utils.system import service_user_problem
    entry = collections.namedtuple("pw", "pw_name pw_uid pw_shell")
    users = {"root": entry("root", 0, "/bin/bash"), "ops": entry("ops", 1000, "/bin/bash"),
             "sglang": entry("sglang", 998, "/usr/sbin/nologin"), "svc": entry("svc", 997, "/bin/false")}

    def getpwnam(name):
        return users[name]
    assert service_user_problem("root", getpwnam=getpwnam).startswith(
        "the service user 'root' (topolaunch_service_user) has uid 0 (root): ")
    assert "has a login shell (/bin/bash)" in service_user_problem("ops", getpwnam=getpwnam)
    assert service_user_problem("ops", getpwnam=getpwnam).endswith("or set topolaunch_force_service_user: true")
    assert service_user_problem("ops", True, getpwnam=getpwnam) is None
    assert service_user_problem("sglang", getpwnam=getpwnam) is None and service_user_problem("svc", getpwnam=getpwnam) is None
    assert service_user_problem("absent", getpwnam=getpwnam) is None      # the callers say it does not exist
