"""Filter: the secret variables an inventory gives in plaintext, so that a play can warn before it uses them.

    warning: "{{ ansible_inventory_sources | topolaunch.sglang.plaintext_secrets }}"

A secret (the Hugging Face token, the API key) belongs in a file encrypted with ansible-vault, or in a `!vault`
value; a plaintext `vault.yml` works the same and passes silently. This reads the files Ansible reads for an
inventory source (the source itself, its group_vars/ and host_vars/, with Ansible's variable file extensions) and
names each one that gives a secret a non-empty value in plaintext. Values are never returned, only names.
"""

import os

import yaml

# The variables that hold secrets: the shared API key, the Hugging Face token, the Proxmox API token's secret and
# root password, and the roles' own names for them
# (every argument spec option marked no_log is here: tests/unit/plugins/filter/test_secrets.py).
SECRET_VARS = ("topolaunch_api_key", "model_weights_hf_token", "launch_api_key", "launch_hf_token",
               "health_api_key", "bench_api_key", "proxmox_api_token_secret", "proxmox_root_password",
               "proxmox_vm_api_token_secret", "proxmox_vm_root_password", "topolaunch_watermark_config",
               "launch_watermark_config")
VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")     # Ansible's YAML_FILENAME_EXTENSIONS
VAULT_HEADER = "$ANSIBLE_VAULT;"


class _Encrypted:  # pylint: disable=too-few-public-methods
    """A `!vault` value: encrypted, not a finding."""


class _Loader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """YAML with Ansible's tags: `!vault` is encrypted; any other tag (`!unsafe`) is its plain value."""


_Loader.add_constructor("!vault", lambda loader, node: _Encrypted())
_Loader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node)
                              if isinstance(node, yaml.ScalarNode) else None)


def _var_files(source):
    """The files Ansible reads variables from for one inventory source (a file or a directory of them): the
    source's own files, then its group_vars/ and host_vars/."""
    if os.path.isdir(source):
        base = source
        files = [os.path.join(source, n) for n in sorted(os.listdir(source))]
    else:
        base = os.path.dirname(source)
        files = [source]
    for sub in ("group_vars", "host_vars"):
        for folder, dirs, names in os.walk(os.path.join(base, sub)):
            dirs.sort()
            files += [os.path.join(folder, n) for n in sorted(names)]
    return [f for f in dict.fromkeys(files) if os.path.isfile(f) and not os.path.basename(f).startswith(".")
            and os.path.splitext(f)[1] in VARS_EXTENSIONS]


def _plain_secrets(data, names):
    """The secret names given a non-empty plaintext value anywhere in `data` (a vars file, or an inventory's
    groups, hosts and vars)."""
    found = set()
    if isinstance(data, dict):
        for key, value in data.items():
            if key in names and isinstance(value, (str, int)) and str(value).strip():
                found.add(key)
            else:
                found |= _plain_secrets(value, names)
    elif isinstance(data, list):
        for value in data:
            found |= _plain_secrets(value, names)
    return found


def plaintext_secrets(sources, names=SECRET_VARS):
    """'<file>: <name>, ...' for every file of the inventory `sources` (ansible_inventory_sources) that gives one
    of `names` a value in plaintext; encrypted files, `!vault` values and files that do not parse are left out."""
    if isinstance(sources, str):
        sources = [sources]
    found = []
    for source in sources or []:
        for path in _var_files(str(source)):
            try:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
            except (OSError, UnicodeDecodeError):
                continue
            if text.lstrip().startswith(VAULT_HEADER):
                continue
            try:
                data = yaml.load(text, Loader=_Loader)  # nosec B506: a SafeLoader with Ansible's tags
            except yaml.YAMLError:
                continue
            secrets = _plain_secrets(data, set(names))
            if secrets:
                found.append("%s: %s" % (path, ", ".join(sorted(secrets))))
    return found


class FilterModule:
    """topolaunch.sglang secrets filters."""

    def filters(self):
        return {"plaintext_secrets": plaintext_secrets}
