"""The model gateway's entry point in its unit: smg's router with the API key read from the unit's credential.

`smg launch` takes the key only as `--api-key KEY`, which every user would read in /proc/<pid>/cmdline. This
launcher, run by the gateway venv's python, reads the key from the systemd credential `api-key`
($CREDENTIALS_DIRECTORY/api-key: LoadCredential= of a root 0600 file) and hands it to smg's own parser in-process,
so the command line shows only the arguments the unit names. smg enforces the key on every request to the gateway
and sends it to the workers (the replicas, started with the same key). Without the credential the gateway runs
without a key. Python 3.9+ stdlib + smg.
"""
import os
import sys

CREDENTIAL = "api-key"


def api_key(environ=None):
    """The key of the credential, or None; an empty or multi-line key is refused."""
    environ = os.environ if environ is None else environ
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = os.path.join(directory, CREDENTIAL)
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip("\n")
    except FileNotFoundError:
        return None
    if not key or "\n" in key or "\r" in key:
        raise SystemExit("gateway_launcher: the credential %s is empty or holds a line break" % CREDENTIAL)
    return key


def router_argv(argv, key):
    """smg's router arguments: the unit's, then the key (never given on the command line itself)."""
    if any(a == "--api-key" or a.startswith("--api-key=") for a in argv):
        raise SystemExit("gateway_launcher: --api-key on the command line would show the key to every user; "
                         "give it as the credential %s" % CREDENTIAL)
    return list(argv) + (["--api-key", key] if key is not None else [])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from smg.launch_router import launch_router, parse_router_args  # pylint: disable=import-outside-toplevel

    launch_router(parse_router_args(router_argv(argv, api_key())))


if __name__ == "__main__":
    main()
