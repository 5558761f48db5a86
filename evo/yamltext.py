"""YAML read as strict data: UTF-8 only, a size cap, no duplicate keys, aliases counted as what they expand to, plain
JSON-like values only; every refusal is one line that names the file (or override) and where in it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_FILE_BYTES = 1 << 20     # a config is a page of settings; a bigger file is a mistake (or an attack)
MAX_VALUES = 10_000          # scalars, lists and mappings once every alias is expanded (a legit config has ~100)
MAX_EXPANDED_CHARS = 1 << 21   # text of those values: a long string used by many aliases counts each time
MAX_DEPTH = 32               # nesting of lists and mappings
# Tags a config may hold once resolved: JSON's kinds. A date, a set or binary would not survive the journal's JSON.
PLAIN_TAGS = frozenset("tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "seq", "map"))
MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlTextError(ValueError):
    """Text that is not a strict YAML config; the message is one line."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that bounds nesting while composing (the composer recurses) and refuses duplicate keys."""

    depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlTextError(f"nests lists or mappings deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG or not isinstance(key_node, ScalarNode):
                continue   # `<<:` merges may be overridden by design; a non-scalar key is refused by SafeLoader
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if key in first:
                raise YamlTextError(f"has the key {key!r} twice in one mapping (lines {first[key]} and {line}); "
                                    "keep one")
            first[key] = line
        return super().construct_mapping(node, deep)


def _expanded(node: Node, sizes: dict[int, tuple[int, int]], path: list[int]) -> tuple[int, int]:
    """How many values and characters `node` stands for with every alias written out; a cycle or too many is an
    error. Sizes are memoised per node, so a chain of aliases that multiplies at every step costs one visit per node,
    not 9**n."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in path:
        raise YamlTextError(f"has an alias inside the value it names (a cycle, line {node.start_mark.line + 1})")
    if node.tag not in PLAIN_TAGS and node.tag != MERGE_TAG:
        raise YamlTextError(f"has a value tagged {node.tag.rsplit(':', 1)[-1]!r} (line {node.start_mark.line + 1}), "
                            "which is not plain data; a config holds strings, numbers, true/false, null, lists and "
                            "mappings (quote a date to keep it a string)")
    path.append(id(node))
    children = node.value if isinstance(node, SequenceNode) else [n for kv in node.value for n in kv] \
        if isinstance(node, MappingNode) else []
    parts = [_expanded(child, sizes, path) for child in children]
    path.pop()
    values = 1 + sum(v for v, _ in parts)
    chars = (len(node.value) if isinstance(node, ScalarNode) else 0) + sum(c for _, c in parts)
    if values > MAX_VALUES or chars > MAX_EXPANDED_CHARS:
        raise YamlTextError(f"expands to more than {MAX_VALUES} values or {MAX_EXPANDED_CHARS} characters at line "
                            f"{node.start_mark.line + 1} (each use of an alias counts its whole value); write a "
                            "smaller config")
    sizes[id(node)] = (values, chars)
    return values, chars


def _one_line(exc: yaml.YAMLError, text: str) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    if isinstance(exc, yaml.reader.ReaderError):   # a control character: say where, as a line, not a position
        line = text[:exc.position].count("\n") + 1
        return f"line {line}: character #x{exc.character:04x} is not allowed in YAML"
    return " ".join(str(exc).split())


def loads(text: str) -> Any:
    """The data of one YAML document, checked as above; YamlTextError (one line) if it is not strict data."""
    try:
        loader = _Loader(text)   # its reader refuses control characters (a NUL) at once, as a YAMLError
    except yaml.YAMLError as exc:
        raise YamlTextError(f"is not valid YAML: {_one_line(exc, text)}") from exc
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded(node, {}, [])
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise YamlTextError(f"is not valid YAML: {_one_line(exc, text)}") from exc
    finally:
        loader.dispose()


def read(path: Path) -> Any:
    """A YAML file's data: a regular file of at most MAX_FILE_BYTES of UTF-8, then loads(). Errors name no file;
    the caller says which file it is."""
    if path.is_dir():
        raise YamlTextError("is a folder, not a file")
    if not path.is_file():
        raise YamlTextError("does not exist")
    with path.open("rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise YamlTextError(f"is larger than {MAX_FILE_BYTES} bytes, the most a config may be")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise YamlTextError(f"is not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} (line {line}); "
                            "save it as UTF-8") from None
    return loads(text)
