"""Write the blocks of config/schemas/config.schema.yaml that restate ragrl.settings.

Each block sits between two marker comments,

    # generated from ragrl.settings.RLConfig by scripts/gen_schema.py: edit the dataclass, then run it
    ...
    # end of ragrl.settings.RLConfig

and is replaced by one line per field of that dataclass (ragrl.settings.schema_fragment), at the
marker's indentation; everything outside the markers is left as written. The defaults are not
written: Snakemake's validate(set_default=True) would fill them into every recipe, where some are
not the dataclass's (a recipe's rl.temperature is its rollout's, its sft/rl seed its own seed).

    python scripts/gen_schema.py           # rewrite the file
    python scripts/gen_schema.py --check   # exit 1 if it is stale (tests/unit/test_settings_schema.py)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from ragrl import settings  # noqa: E402

SCHEMA = REPO / "config/schemas/config.schema.yaml"
BEGIN = re.compile(r"^(?P<indent> *)# generated from ragrl\.settings\.(?P<cls>\w+) by scripts/gen_schema\.py")
END = "# end of ragrl.settings.{cls}"
# Scalars YAML would read as something other than the string (YAML 1.1 booleans, null).
_NOT_PLAIN = {"null", "true", "false", "yes", "no", "on", "off", "y", "n"}


def _flow(value) -> str:
    """`value` as a one-line YAML flow node, strings quoted unless plain lower-case words."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, str):
        return value if re.fullmatch(r"[a-z_]+", value) and value not in _NOT_PLAIN else json.dumps(value)
    if isinstance(value, float) and "e" in repr(value):
        raise ValueError(f"{value!r}: PyYAML reads an exponent without a dot as a string")
    return json.dumps(value)


def block(cls_name: str, indent: str) -> list[str]:
    """The schema lines of one settings dataclass, defaults left out (see the module docstring)."""
    fragment = settings.schema_fragment(getattr(settings, cls_name))
    return [f"{indent}{name}: {_flow({k: v for k, v in prop.items() if k != 'default'})}\n"
            for name, prop in fragment.items()]


def render(text: str) -> str:
    """`text` with every generated block rewritten."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        begin = BEGIN.match(lines[i])
        i += 1
        if not begin:
            continue
        end = END.format(cls=begin["cls"])
        while i < len(lines) and lines[i].strip() != end:
            i += 1
        if i == len(lines):
            raise ValueError(f"{SCHEMA.name}: no '{end}' after the block of {begin['cls']}")
        out.extend(block(begin["cls"], begin["indent"]))
    return "".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether the file is stale")
    args = parser.parse_args()
    text = SCHEMA.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(f"{SCHEMA.relative_to(REPO)} is stale: run python scripts/gen_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
