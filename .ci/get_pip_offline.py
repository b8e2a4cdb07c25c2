"""Stand-in for the get-pip.py that ansible-test downloads from ci-files.testing.ansible.com to put pip into the
empty venvs of `ansible-test sanity --venv`. Where that host cannot be reached (this project's CI reaches only
package registries), `make sanity` saves this file under the name ansible-test caches the real one:
~/.ansible/test/cache/get_pip_<version>.py. It bootstraps pip from the interpreter's own ensurepip wheel, then
installs what ansible-test asked for (pip==<version>, setuptools, wheel) from the configured package index.

ansible-test runs it as __main__ with get-pip's arguments: pip options, requirements, --no-setuptools, --no-wheel.
"""
import subprocess
import sys


def main():
    args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
    subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet"] + args, check=True)


if __name__ == "__main__":
    main()
