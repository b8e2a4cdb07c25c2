"""SGLang's log format: `[2026-11-30 10:15:02 PP0 TP3] message` on stderr (sglang.srt.utils.configure_logger)."""
import logging
import os
import sys

from sglang._sim import release


def simulated_banner():
    return ("SGLang simulator %s (lab): no GPU work is done; memory is registered with the fake NVML and token "
            "timing comes from a performance model. Every number in this log is simulated." % release.sim_version())


def configure(level="info", prefix=""):
    maybe_ms = ".%(msecs)03d" if os.environ.get("SGLANG_LOG_MS", "").lower() in ("1", "true") else ""
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="[%%(asctime)s%s%s] %%(message)s" % (maybe_ms, prefix),
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stderr,
        force=True,
    )


def uvicorn(message, level="INFO"):
    """A line as uvicorn's error logger writes it (stderr)."""
    print("%s:%s%s" % (level, " " * (9 - len(level)), message), file=sys.stderr, flush=True)


def access(client, method, path, status, phrase):
    """A line as uvicorn's access logger writes it (stdout)."""
    print('INFO:     %s:%d - "%s %s HTTP/1.1" %d %s' % (client[0], client[1], method, path, status, phrase),
          file=sys.stdout, flush=True)
