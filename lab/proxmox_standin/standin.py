#!/usr/bin/env python3
"""A stand-in for the Proxmox VE API (HTTPS, /api2/json), enough for community.proxmox's proxmox_kvm and for
ansible.builtin.uri to read and change one node's VM configs.

It answers from a recorded state (JSON: nodes, VMs with config, status and pending changes, users), and refuses what
the committed API schema excerpt refuses (module_utils/topolaunch/proxmox_api_schema.py, through proxmox_config.check)
with Proxmox's own answer: HTTP 400 "Parameter verification failed." and {"errors": {key: text}}; keys only root may
set (the excerpt's privileges, from qemu-server's Qemu.pm: "only root can set 'args' config") with 500, as
pve-http-server answers a die. A running VM's changes become
pending (GET .../config shows them applied, GET .../pending lists them, a start applies them), as on Proxmox.
Every write is appended to the state's "writes" (method, path, params, user) and the state file is rewritten.
A power action (POST .../status/{start,stop,shutdown,reboot,reset}) answers a task id at once, as Proxmox does; with
--power-hook, the task runs `HOOK ACTION VMID` (the lab powers its host off and on) and its status
(GET /nodes/N/tasks/UPID/status) is "running" until the hook ends, then "stopped" with exitstatus "OK" or the hook's
error.

    standin.py --state STATE.json --port 35500 --tls-dir DIR     # DIR gets ca.pem (trust it) and the server cert
"""
import argparse
import http.server
import json
import os
import secrets
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

from ansible_collections.topolaunch.sglang.plugins.module_utils.proxmox_config import check, root_only, schema_key

LOCK = threading.Lock()


def make_tls(tls_dir, host="127.0.0.1"):
    """A CA and a server certificate for host (openssl), made once."""
    os.makedirs(tls_dir, exist_ok=True)
    ca, key, cert = (os.path.join(tls_dir, n) for n in ("ca.pem", "server.key", "server.pem"))
    if os.path.exists(cert):
        return cert, key
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=proxmox stand-in CA",
        "-keyout", os.path.join(tls_dir, "ca.key"), "-out", ca)
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=%s" % host, "-keyout", key,
        "-out", os.path.join(tls_dir, "server.csr"))
    ext = os.path.join(tls_dir, "ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:%s\nbasicConstraints=CA:FALSE\n" % host)
    run("x509", "-req", "-in", os.path.join(tls_dir, "server.csr"), "-CA", ca, "-CAkey",
        os.path.join(tls_dir, "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", cert)
    return cert, key


class State:
    def __init__(self, path):
        self.path = path
        with open(path) as f:
            self.data = json.load(f)
        self.data.setdefault("writes", [])
        self.tickets = {}
        self.tasks = {}     # UPID -> task status, for the power actions a hook runs

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    def vm(self, node, vmid):
        return self.data["nodes"].get(node, {}).get("vms", {}).get(str(vmid))


def effective(vm):
    """The config with pending changes applied (what GET config returns by default)."""
    conf = dict(vm["config"])
    for key, value in vm.get("pending", {}).items():
        if value is None:
            conf.pop(key, None)
        else:
            conf[key] = value
    return conf


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "pve-api-daemon/3.0"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("standin: %s\n" % (fmt % args))

    # -- answers -----------------------------------------------------------------------------------------------------
    def answer(self, code, data=None, message=None, errors=None, cookie=None):
        body = {"data": data}
        if errors:
            body["errors"] = errors
        if message:
            body["message"] = message if message.endswith("\n") else message + "\n"
        raw = json.dumps(body).encode()
        self.send_response(code, (message or "OK").strip())
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(raw)))
        if cookie:
            self.send_header("Set-Cookie", "PVEAuthCookie=%s; path=/; secure" % cookie)
        self.end_headers()
        self.wfile.write(raw)

    def params(self):
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode() if length else ""
        if raw and "json" in (self.headers.get("Content-Type") or ""):
            query.update({k: v for k, v in json.loads(raw).items()})
        elif raw:
            query.update(dict(urllib.parse.parse_qsl(raw, keep_blank_values=True)))
        return query

    def user(self, write):
        """The authenticated user ("root@pam", "topolaunch@pve!tok" for a token), None when not authenticated."""
        state = self.server.state
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("PVEAPIToken="):
            ident, _sep, secret = auth[len("PVEAPIToken="):].partition("=")
            if state.data.get("tokens", {}).get(ident) == secret:
                return ident
            return None
        cookies = dict(c.strip().split("=", 1) for c in (self.headers.get("Cookie") or "").split(";") if "=" in c)
        ticket = urllib.parse.unquote(cookies.get("PVEAuthCookie", ""))
        user = state.tickets.get(ticket)
        if user and write and self.headers.get("CSRFPreventionToken") != state.tickets.get("csrf:" + ticket):
            return None
        return user

    # -- routes ------------------------------------------------------------------------------------------------------
    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_PUT(self):
        self.route("PUT")

    def route(self, method):
        path = urllib.parse.urlsplit(self.path).path
        if not path.startswith("/api2/json/"):
            return self.answer(501, message="Method '%s %s' not implemented" % (method, path))
        parts = path[len("/api2/json/"):].strip("/").split("/")
        params = self.params()
        with LOCK:
            if parts == ["access", "ticket"] and method == "POST":
                return self.ticket(params)
            user = self.user(write=method != "GET")
            if not user:
                return self.answer(401, message="authentication failure")
            try:
                return self.dispatch(method, parts, params, user)
            finally:
                self.server.state.save()

    def ticket(self, params):
        users = self.server.state.data.get("users", {})
        name = params.get("username", "")
        if "@" not in name and params.get("realm"):
            name += "@" + params["realm"]
        if users.get(name) is None or users[name] != params.get("password"):
            return self.answer(401, message="authentication failure")
        ticket = "PVE:%s:%s" % (name, secrets.token_hex(16))
        csrf = secrets.token_hex(16)
        self.server.state.tickets[ticket] = name
        self.server.state.tickets["csrf:" + ticket] = csrf
        return self.answer(200, {"ticket": ticket, "CSRFPreventionToken": csrf, "username": name}, cookie=ticket)

    def dispatch(self, method, parts, params, user):
        state = self.server.state
        data = state.data
        if parts == ["version"]:
            return self.answer(200, data.get("version", {"version": "9.1.3", "release": "9.1", "repoid": "standin"}))
        if parts == ["nodes"]:
            return self.answer(200, [{"node": n, "status": "online", "type": "node"} for n in sorted(data["nodes"])])
        if parts == ["cluster", "resources"]:
            return self.answer(200, [
                {"vmid": int(vmid), "node": node, "name": vm["config"].get("name"), "type": "qemu",
                 "status": vm.get("status", "stopped"), "id": "qemu/%s" % vmid}
                for node, n in sorted(data["nodes"].items()) for vmid, vm in sorted(n.get("vms", {}).items())])
        if len(parts) >= 4 and parts[0] == "nodes" and parts[2] == "qemu":
            vm = state.vm(parts[1], parts[3])
            if vm is None:
                return self.answer(500, message="Configuration file 'nodes/%s/qemu-server/%s.conf' does not exist"
                                   % (parts[1], parts[3]))
            rest = parts[4:]
            if rest == ["config"] and method == "GET":
                return self.answer(200, vm["config"] if params.get("current") in ("1", "true") else effective(vm))
            if rest == ["pending"] and method == "GET":
                return self.answer(200, self.pending(vm))
            if rest == ["config"] and method in ("PUT", "POST"):
                return self.set_config(parts[1], parts[3], vm, params, user)
            if rest == ["status", "current"] and method == "GET":
                return self.answer(200, {"status": vm.get("status", "stopped"), "vmid": int(parts[3]),
                                         "name": vm["config"].get("name"), "qmpstatus": vm.get("status", "stopped")})
            if len(rest) == 2 and rest[0] == "status" and method == "POST":
                return self.power(parts[1], parts[3], vm, rest[1], user)
        if len(parts) == 5 and parts[0] == "nodes" and parts[2] == "tasks" and parts[4] == "status":
            task = state.tasks.get(parts[3], {"status": "stopped", "exitstatus": "OK"})
            return self.answer(200, dict(task, upid=parts[3]))
        if len(parts) == 5 and parts[0] == "nodes" and parts[2] == "tasks" and parts[4] == "log":
            return self.answer(200, [{"n": 1, "t": "TASK OK"}])
        return self.answer(501, message="Method '%s /%s' not implemented" % (method, "/".join(parts)))

    @staticmethod
    def pending(vm):
        out = []
        conf = vm["config"]
        for key in sorted(set(conf) | set(vm.get("pending", {}))):
            entry = {"key": key}
            if key in conf:
                entry["value"] = conf[key]
            if key in vm.get("pending", {}):
                if vm["pending"][key] is None:
                    entry["delete"] = 1
                else:
                    entry["pending"] = vm["pending"][key]
            out.append(entry)
        return out

    def set_config(self, node, vmid, vm, params, user):
        delete = [k for k in (params.pop("delete", "") or "").replace(";", ",").split(",") if k]
        for extra in ("digest", "skiplock", "background_delay", "revert", "force"):
            params.pop(extra, None)
        errors = {}
        for key, value in sorted(params.items()):
            err = check(key, value)
            if err:
                errors[key] = err
        for key in delete:
            if schema_key(key) is None and key not in vm["config"]:
                errors[key] = "property is not defined in schema and the schema does not allow additional properties"
        if errors:
            return self.answer(400, message="Parameter verification failed.", errors=errors)
        if user != "root@pam":
            for key in sorted(set(params) | set(delete)):
                if schema_key(key) == "hostpci[n]":
                    return self.answer(500, message=("only root can delete '%s' config for real devices" if key in delete
                                                     else "only root can set '%s' config for non-mapped devices") % key)
                if root_only(key):
                    return self.answer(500, message="only root can set '%s' config" % key)
        running = vm.get("status") == "running"
        target = vm.setdefault("pending", {}) if running else vm["config"]
        for key, value in params.items():
            target[key] = value
        for key in delete:
            if running:
                target[key] = None
            else:
                target.pop(key, None)
        self.server.state.data["writes"].append({"method": "PUT", "path": "/nodes/%s/qemu/%s/config" % (node, vmid),
                                                 "params": params, "delete": delete, "user": user})
        return self.answer(200, None)

    def power(self, node, vmid, vm, action, user):
        if action not in ("start", "stop", "shutdown", "reboot", "reset"):
            return self.answer(501, message="Method 'POST status/%s' not implemented" % action)
        if action in ("start", "reboot", "reset"):
            vm["config"] = effective(vm)
            vm["pending"] = {}
        vm["status"] = "stopped" if action in ("stop", "shutdown") else "running"
        self.server.state.data["writes"].append({"method": "POST", "path": "/nodes/%s/qemu/%s/status/%s"
                                                 % (node, vmid, action), "params": {}, "delete": [], "user": user})
        upid = "UPID:%s:%08X:00000000:%08X:qm%s:%s:%s:" % (node, os.getpid(), int(time.time()), action, vmid, user)
        if self.server.power_hook:
            self.server.state.tasks[upid] = {"status": "running"}
            threading.Thread(target=run_hook, args=(self.server.state, upid, self.server.power_hook, action, vmid),
                             daemon=True).start()
        return self.answer(200, upid)


def run_hook(state, upid, hook, action, vmid):
    """The power action's task: `hook action vmid`; its end is the task's status."""
    try:
        proc = subprocess.run([hook, action, str(vmid)], capture_output=True, text=True, check=False, timeout=900)
        last = ((proc.stderr or proc.stdout).strip().splitlines() or [""])[-1]
        result = "OK" if proc.returncode == 0 else "hook failed (rc %d): %s" % (proc.returncode, last)
    except (OSError, subprocess.TimeoutExpired) as exc:
        result = "hook failed: %s" % exc
    with LOCK:
        state.tasks[upid] = {"status": "stopped", "exitstatus": result}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tls-dir", required=True)
    ap.add_argument("--power-hook", help="an executable run as HOOK ACTION VMID for each power action (its task)")
    args = ap.parse_args(argv)
    cert, key = make_tls(args.tls_dir, args.host)
    server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    server.state = State(args.state)
    server.power_hook = args.power_hook
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print("standin: listening on https://%s:%d" % (args.host, args.port), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
