"""Proxmox VE VM config values: checked against the committed API schema excerpt (proxmox_api_schema.py), parsed and
printed as Proxmox's property strings.

`check(key, value)` returns Proxmox's own error text for a value the API would refuse (None when it passes), worded
as pve-common's PVE/JSONSchema.pm words it (check_prop, parse_property_string, the `pve-cpuset` verifier);
`validate(config)` raises ProxmoxConfigError naming the first bad key. The lab's API stand-in answers with the same
`check`, so the rules live once: in the schema excerpt, read here.
"""
import re

from .proxmox_api_schema import SCHEMA

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
NOT_DEFINED = "property is not defined in schema and the schema does not allow additional properties"


class ProxmoxConfigError(Exception):
    """A value the Proxmox API refuses; the message starts with the key."""


def schema_key(key):
    """Config key -> its parameter name in the schema ('hostpci3' -> 'hostpci[n]'), None when not in the excerpt."""
    params = SCHEMA["parameters"]
    if key in params:
        return key
    m = re.fullmatch(r"([a-z]+)(\d+)", key)
    if m and m.group(1) + "[n]" in params and int(m.group(2)) < SCHEMA["max_index"].get(m.group(1) + "[n]", 0):
        return m.group(1) + "[n]"
    return None


def parse_boolean(value):
    """PVE::JSONSchema::parse_boolean: 1/on/yes/true -> 1, 0/off/no/false -> 0, else None."""
    text = str(value).lower()
    if text in ("1", "on", "yes", "true"):
        return 1
    if text in ("0", "off", "no", "false"):
        return 0
    return None


def _is_number(text):
    return re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text) is not None


def _cpuset(fmt, text):
    for part in text.split(","):
        m = re.fullmatch(fmt["part_pattern"], part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            return fmt["error"] + "\n"
    return None


def parse_property_string(fmt, text):
    """{key: value} of a property string ("cpus=0-3,policy=bind"); raises ValueError with JSONSchema's text."""
    default_key = next((k for k, s in fmt.items() if s.get("default_key")), None)
    out = {}
    for part in text.split(","):
        if not part.strip():
            continue
        m = re.fullmatch(r"([^=]+)=(.+)", part, re.S)
        if m:
            k, v = m.groups()
            if k in out:
                raise ValueError("duplicate key in comma-separated list property: %s" % k)
            if k not in fmt:
                raise ValueError("invalid key in comma-separated list property: %s" % k)
            out[k] = v
        elif "=" not in part:
            if default_key is None:
                raise ValueError("value without key, but schema does not define a default key")
            if default_key in out:
                raise ValueError("duplicate key in comma-separated list property: %s" % default_key)
            out[default_key] = part
        else:
            raise ValueError("missing key in comma-separated list property")
    return out


def print_property_string(fmt, values):
    """The property string Proxmox prints: the default key's value first without its name, then the rest in the
    format's key order as given (topolaunch writes them in one order, so a re-read compares equal)."""
    default_key = next((k for k, s in fmt.items() if s.get("default_key")), None)
    parts = [str(values[default_key])] if default_key in values else []
    parts += ["%s=%s" % (k, values[k]) for k in values if k != default_key]
    return ",".join(parts)


def _check(schema, text, path):
    """{path: message} for one value, as PVE::JSONSchema::check_prop adds them."""
    kind = schema.get("type")
    if kind == "boolean":
        return {} if parse_boolean(text) is not None else {path: "type check ('boolean') failed - got '%s'" % text}
    if kind == "integer" and not re.fullmatch(r"[+-]?\d+", text):
        return {path: "type check ('integer') failed - got '%s'" % text}
    if kind == "number" and not _is_number(text):
        return {path: "type check ('number') failed - got '%s'" % text}
    fmt = schema.get("format")
    if isinstance(fmt, str):
        fmt = SCHEMA["formats"].get(fmt, fmt)
    if isinstance(fmt, str):
        return {path: "invalid format - undefined format '%s' (not in topolaunch's schema excerpt)\n" % fmt}
    if isinstance(fmt, dict) and fmt.get("type") == "cpuset":
        err = _cpuset(fmt, text)
        if err:
            return {path: "invalid format - " + err}
    elif isinstance(fmt, dict):
        try:
            values = parse_property_string(fmt, text)
        except ValueError as exc:
            return {path: "invalid format - %s\n" % exc}
        errors = {}
        for sub, sub_schema in fmt.items():
            if sub in values:
                errors.update(_check(sub_schema, str(values[sub]), "%s.%s" % (path, sub)))
            elif not sub_schema.get("optional"):
                errors["%s.%s" % (path, sub)] = "property is missing and it is not optional"
        if errors:
            return {path: "invalid format - format error\n" + "".join("%s: %s\n" % e for e in sorted(errors.items()))}
    if "pattern" in schema and not re.fullmatch(schema["pattern"], text):
        return {path: "value does not match the regex pattern"}
    if "maxLength" in schema and len(text) > schema["maxLength"]:
        return {path: "value may only be %d characters long" % schema["maxLength"]}
    if _is_number(text) and kind in ("integer", "number"):
        if "maximum" in schema and float(text) > schema["maximum"]:
            return {path: "value must have a maximum value of %s" % schema["maximum"]}
        if "minimum" in schema and float(text) < schema["minimum"]:
            return {path: "value must have a minimum value of %s" % schema["minimum"]}
    if "enum" in schema and text not in schema["enum"]:
        return {path: "value '%s' does not have a value in the enumeration '%s'" % (text, ", ".join(schema["enum"]))}
    return {}


def check(key, value):
    """Proxmox's error text for config key=value (None when the schema accepts it). Control characters are refused
    here too: the API would take some of them, but no value topolaunch writes has one."""
    name = schema_key(key)
    if name is None:
        return NOT_DEFINED
    text = ("1" if value else "0") if isinstance(value, bool) else str(value)
    if CONTROL.search(text):
        return "value contains a control character"
    errors = _check(SCHEMA["parameters"][name], text, key)
    return errors.get(key) if errors else None


def validate(config, source="computed config"):
    """Raise ProxmoxConfigError on the first key (sorted) whose value the schema refuses."""
    for key in sorted(config):
        err = check(key, config[key])
        if err:
            raise ProxmoxConfigError("%s: %s %r refused by the Proxmox API schema (%s): %s"
                                     % (source, key, config[key], SCHEMA["endpoint"], err.strip().replace("\n", "; ")))


def root_only(key):
    """Whether only root@pam (with a password: an API token never is root) may set key, as qemu-server's
    check_vm_modify_config_perm decides (the excerpt's `privileges`; hostpciN with a host address)."""
    return SCHEMA["privileges"].get(schema_key(key) or key, "root@pam") == "root@pam"


def hostpci_format():
    return SCHEMA["formats"]["pve-qm-hostpci"]


def numa_format():
    return SCHEMA["parameters"]["numa[n]"]["format"]
