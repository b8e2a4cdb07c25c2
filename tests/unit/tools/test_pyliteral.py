"""tools/pyliteral.py: a generated table is the value again, and no line of it runs past pep8's limit (a long regex
without spaces, as the Proxmox schema's, split into adjacent literals)."""
import paths

pyliteral = paths.load_script(paths.ROOT / "tools" / "pyliteral.py", "pyliteral")


def test_a_long_string_without_spaces_is_split_and_the_value_is_the_same():
    value = {"pattern": "(pc|pc(-i440fx)?-\\d+(\\.\\d+)+(\\+pve\\d+)?(\\.pxe)?|q35|" * 6,
             "nested": [{"deep": {"deeper": "x" * 400}}], "plain": 1}
    text = pyliteral.literal("TABLE", value)
    assert max(len(line) for line in text.splitlines()) <= pyliteral.MAX_LINE
    namespace = {}
    exec(text, namespace)  # pylint: disable=exec-used
    assert namespace["TABLE"] == value
    assert text.startswith("TABLE = (\n    {") and text.endswith("\n)")


def test_the_committed_tables_keep_within_the_limit():
    for name in ("proxmox_api_schema.py", "sglang_facts_0_5_9.py", "sglang_facts_0_5_23.py"):
        lines = (paths.ROOT / "module_utils" / "topolaunch" / name).read_text().splitlines()
        assert max(len(line) for line in lines) <= 160, name
