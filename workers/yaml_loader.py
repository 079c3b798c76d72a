"""The one YAML loader, for sweep specs and trial configs: YAML 1.2 (ruamel.yaml), bounded.

PyYAML implements YAML 1.1, where ``3e-4`` and ``1e3`` are strings, ``on``/``no`` are
booleans and ``1:30`` is 90; strict validation then refuses an ordinary spec. YAML 1.2 (the
JSON-compatible core schema) reads numbers the way JSON does. Two limits keep a hostile file
from exhausting memory or time: a file larger than :data:`MAX_YAML_BYTES` is refused before
it is parsed, and a document whose aliases would expand to more than :data:`MAX_YAML_NODES`
nodes (a "billion laughs" alias bomb) is refused from its event stream, before any object is
built. Duplicated mapping keys are refused too (ruamel.yaml's default).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # ruamel loads on the first file read, not when the API imports spec loading
    from ruamel.yaml import YAML

MAX_YAML_BYTES = 1_048_576
MAX_YAML_NODES = 100_000


class SpecFileError(ValueError):
    """A spec or trial-config file that is too large, an alias bomb, or not YAML; the message
    says which."""


def _yaml() -> YAML:
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.version = (1, 2)
    return yaml


def _expanded_nodes(text: str, limit: int) -> int:
    """Nodes of the document with every alias expanded, counted from the parser's events."""
    from ruamel.yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, NodeEvent

    sizes: dict[str, int] = {}  # anchor -> expanded size of its node
    stack: list[list[Any]] = [[None, 0]]  # [anchor, size so far] per open collection
    for event in _yaml().parse(text):
        if isinstance(event, CollectionStartEvent):
            stack.append([event.anchor, 1])
            continue
        if isinstance(event, CollectionEndEvent):
            anchor, size = stack.pop()
        elif isinstance(event, AliasEvent):
            anchor, size = None, sizes.get(event.anchor, 1)
        elif isinstance(event, NodeEvent):  # a scalar
            anchor, size = event.anchor, 1
        else:
            continue
        if anchor is not None:
            sizes[anchor] = size
        stack[-1][1] += size
        if stack[-1][1] > limit:
            break
    return sum(entry[1] for entry in stack)


def load_yaml(text: str, *, max_nodes: int = MAX_YAML_NODES, source: str = "the spec") -> Any:
    """The YAML 1.2 document in ``text``; :class:`SpecFileError` if it is not YAML or would
    expand past ``max_nodes`` nodes."""
    from ruamel.yaml.error import YAMLError

    try:
        nodes = _expanded_nodes(text, max_nodes)
        if nodes > max_nodes:
            raise SpecFileError(
                f"{source}: its aliases expand to more than {max_nodes} nodes (an alias bomb?); "
                "write the values out or use fewer nested anchors")
        return _yaml().load(text)
    except YAMLError as error:
        raise SpecFileError(f"{source} is not valid YAML: {error}") from None


def read_mapping_file(
    path: str | Path, *, what: str, max_bytes: int = MAX_YAML_BYTES, empty: bool = False,
) -> dict[str, Any]:
    """The mapping in a file (``.json`` as JSON, anything else as YAML 1.2), refused unread when
    it is larger than ``max_bytes``; ``what`` names it in errors ("a sweep spec"). An empty
    document is ``{}`` when ``empty`` is true, and refused otherwise."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise SpecFileError(
            f"{path}: {size} bytes is more than {what} file may hold ({max_bytes} bytes)")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise SpecFileError(f"{path} is not valid JSON: {error}") from None
    else:
        data = load_yaml(text, source=str(path))
    if data is None and empty:
        return {}
    if not isinstance(data, dict):
        raise SpecFileError(f"{path}: {what} must be a mapping, got {type(data).__name__}")
    return data


def read_spec_file(path: str | Path, *, max_bytes: int = MAX_YAML_BYTES) -> dict[str, Any]:
    """The mapping in a sweep spec file (:func:`read_mapping_file`)."""
    return read_mapping_file(path, what="a sweep spec", max_bytes=max_bytes)
