"""Config checks that name the offending key.

Snakemake's own `validate` fills defaults but reports a failure as a dump of the schema; users
need the key. Standard library + jsonschema + yaml only: the Snakefile imports this.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

# libyaml's loader when PyYAML was built with it: every `snakemake` start reads the schema twice (the
# key-named errors and ragrl.workflow's checks), 0.10 s a read in pure Python, 0.01 s with libyaml.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# Where an entry set to null removes the default's entry: () is the top level (`harr: null`).
NULLABLE_COLLECTIONS = ((), ("corpora",), ("datasets",), ("recipes",), ("kgs",), ("kbs",), ("retrieval", "indexes"),
                        ("resources", "rules"), ("construct_kg",), ("construct_kg", "constructors"),
                        ("construct_kg", "gold"), ("pipelines",))


def drop_null_entries(config: dict) -> dict:
    """Remove, in place, the entries set to null in the named collections of `config`. A
    --configfile is merged into config/config.yaml key by key and cannot remove an entry, so
    `recipes: {rag_r1: null}` (or a top-level `harr: null`) is how an overlay drops one; this runs
    before validation fills defaults in. Returns `config`."""
    for path in NULLABLE_COLLECTIONS:
        node = config
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            for name in [k for k, v in node.items() if v is None]:
                del node[name]
    return config


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def config_errors(config: dict, schema_path: str | Path) -> list[str]:
    """Every schema violation in `config`, one line each, as `config key 'a.b': message`."""
    validator = jsonschema.Draft202012Validator(yaml.load(Path(schema_path).read_text(), Loader=_LOADER))
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
