"""Config checks that name the offending key.

Snakemake's own `validate` fills defaults but reports a failure as a dump of the schema; users
need the key. Standard library + jsonschema + yaml only: the Snakefile imports this.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def config_errors(config: dict, schema_path: str | Path) -> list[str]:
    """Every schema violation in `config`, one line each, as `config key 'a.b': message`."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    lines = []
    for err in errors:
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = sorted(err.schema.get("properties", {}))
            for extra in sorted(set(err.instance) - set(allowed)):
                lines.append(f"config key '{_key([*err.absolute_path, extra])}': unknown key (allowed here: {allowed})")
            continue
        message = err.message
        if err.validator == "oneOf" and "description" in err.schema:
            message = f"{err.instance!r} is not valid: expected {err.schema['description']}"
        lines.append(f"config key '{_key(err.absolute_path)}': {message}")
    return lines
