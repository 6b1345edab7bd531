"""The one YAML reader of the suite's configs (sweep configs, training configs as the driver reads
them): PyYAML's safe loader with two of YAML 1.1's surprises removed.

- ``1e3``, ``3e-3`` and ``6e-4`` are numbers, as in YAML 1.2 and as every user means them
  (YAML 1.1 reads a float without a dot as a string);
- a key given twice in one mapping is refused (PyYAML silently keeps the last one), with its
  line, so that a second ``steps:`` cannot quietly decide a sweep.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

# YAML 1.2's core float, underscores allowed as PyYAML does: 1.5, 1e3, -3e-3, .5, .inf, .nan
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class ConfigLoader(yaml.SafeLoader):
    """SafeLoader, floats as YAML 1.2 reads them, duplicate keys refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1's float resolver out, YAML 1.2's in, after the int resolver (resolvers are tried in
# order, so "1000" stays an int and "1e3" becomes 1000.0).
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _first in "-+0123456789.":
    ConfigLoader.yaml_implicit_resolvers.setdefault(_first, []).append(("tag:yaml.org,2002:float", _FLOAT))


def load(text: str) -> Any:
    """The document in ``text``; yaml.YAMLError (with its line) on bad YAML or a duplicate key."""
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
