"""roles/gateway/files/gateway_launcher.py: the API key from the unit's credential, never on the command line.
The script runs on the host with the gateway venv's python (smg); loaded here from its path without smg."""

import pytest
import paths

SCRIPT = paths.ROOT / "roles" / "gateway" / "files" / "gateway_launcher.py"
launcher = paths.load_script(SCRIPT, "gateway_launcher")


def test_key_from_the_credential(tmp_path):
    (tmp_path / "api-key").write_text("s3cret\n")
    assert launcher.api_key({"CREDENTIALS_DIRECTORY": str(tmp_path)}) == "s3cret"
    assert launcher.router_argv(["--port", "1"], "s3cret") == ["--port", "1", "--api-key", "s3cret"]


def test_no_credential_no_key(tmp_path):
    assert launcher.api_key({}) is None
    assert launcher.api_key({"CREDENTIALS_DIRECTORY": str(tmp_path)}) is None
    assert launcher.router_argv(["--port", "1"], None) == ["--port", "1"]


@pytest.mark.parametrize("text", ["", "\n", "a\nb\n", "a\rb"])
def test_an_empty_or_broken_key_is_refused(tmp_path, text):
    (tmp_path / "api-key").write_text(text)
    with pytest.raises(SystemExit, match="empty or holds a line break"):
        launcher.api_key({"CREDENTIALS_DIRECTORY": str(tmp_path)})


@pytest.mark.parametrize("argv", [["--api-key", "x"], ["--api-key=x"]])
def test_a_key_on_the_command_line_is_refused(argv):
    with pytest.raises(SystemExit, match="give it as the credential api-key"):
        launcher.router_argv(argv, None)
