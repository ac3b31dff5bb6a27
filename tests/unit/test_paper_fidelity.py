"""docs/FIDELITY.md's tables hold every paper config against its authors' released code; this
checks that the configs still say what the tables say (issue #37, deliverable 3).

Each method's table follows a `<!-- fidelity: config/paper/<method>.yaml -->` marker. A row whose
`key` column names a config key (`recipes.<recipe>.rl.lr`; `*` for every recipe of the config) is
checked: the value the workflow runs with (config/config.yaml with the paper config over it, as
Snakemake layers them, and the typed defaults of RLConfig, RolloutConfig, SFTArgs, the method's
options and HARR's sections for what neither file sets) must equal the `ours` column, a YAML
value, or `prompt:<name>`, the fenced block of that name on the page. A row with `—` as its key is
code or data, not a setting. And every setting a paper config writes under its recipes (rl,
rollout, sft, reward, turn_reward, options, topk, max_queries, seed), under `harr` and under
`models` has a row, so a new setting cannot go in unchecked. Standard library, PyYAML and
ragrl.recipe only: no model, no workflow run.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "FIDELITY.md"
PAPERS = sorted((REPO / "config" / "paper").glob("*.yaml"))
COLUMNS = ("setting", "authors' value", "authors' file", "key", "ours", "same / why not")
RECIPE_SECTIONS = ("rl", "rollout", "sft", "reward", "turn_reward", "options")
RECIPE_SCALARS = ("topk", "max_queries", "seed")
# The words a status cell starts with (docs/FIDELITY.md, "How to read the tables").
STATUSES = ("same", "ours", "differs", "needs code", "n/a")
NO_KEY = "—"


def _merged(paper: Path) -> dict:
    from snakemake.utils import update_config

    from ragrl.config import drop_null_entries

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    update_config(config, yaml.safe_load(paper.read_text()))
    return drop_null_entries(config)


def _prompts(text: str) -> dict[str, str]:
    """Fenced blocks opened by ```text prompt:<name>: their lines, each ending in a newline; a block
    opened by ```text prompt:<name> no-final-newline drops its last newline (a message that has none)."""
    blocks = re.findall(r"(?ms)^```text prompt:(\S+)( no-final-newline)?\n(.*?)^```$", text)
    return {name: body[:-1] if strip else body for name, strip, body in blocks}


def _cells(line: str) -> list[str]:
    # Cells are split on '|' outside backticks (a value may hold none: the page keeps it so).
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _tables(text: str) -> dict[str, list[dict[str, str]]]:
    """{paper config path: rows} for every marked table on the page."""
    tables = {}
    for m in re.finditer(r"<!-- fidelity: (\S+) -->\n", text):
        lines = text[m.end():].splitlines()
        while lines and not lines[0].startswith("|"):
            lines.pop(0)
        rows = []
        for line in lines:
            if not line.startswith("|"):
                break
            rows.append(_cells(line))
        header, body = rows[0], rows[2:]  # rows[1] is the |---| rule
        assert tuple(header) == COLUMNS, f"{m.group(1)}: columns {header}, expected {COLUMNS}"
        for row in body:
            assert len(row) == len(COLUMNS), f"{m.group(1)}: a row with {len(row)} cells: {row}"
        tables[m.group(1)] = [dict(zip(COLUMNS, row)) for row in body]
    return tables


def _unquote(cell: str) -> str:
    return cell[1:-1] if cell.startswith("`") and cell.endswith("`") else cell


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _equal(a: Any, b: Any) -> bool:
    a, b = _plain(a), _plain(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


_MISSING = object()


def _walk(value: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        elif dataclasses.is_dataclass(value):
            value = getattr(value, part, _MISSING)
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def _resolve(config: dict, key: str) -> Any:
    """The value the workflow runs with at `key`: typed (defaults filled in) where a stage config
    types it, else as the merged config holds it."""
    from ragrl.recipe import parse_harr, parse_recipe, rl_config, sft_args

    parts = key.split(".")
    raw = _walk(config, parts)
    typed = _MISSING
    if parts[0] == "recipes" and len(parts) >= 3:
        recipe = parse_recipe(copy.deepcopy(config["recipes"][parts[1]]), parts[1])
        section, rest = parts[2], parts[3:]
        holder = {"rl": rl_config(recipe), "rollout": recipe.rollout, "sft": sft_args(recipe),
                  "options": recipe.options, "reward": recipe.reward, "turn_reward": recipe.turn_reward}
        if section in holder:
            typed = _walk(holder[section], rest)
        elif section in RECIPE_SCALARS and not rest:
            typed = getattr(recipe, section)
    elif parts[0] == "harr" and len(parts) >= 2 and parts[1] in ("environment", "encoder", "train"):
        typed = _walk(parse_harr(copy.deepcopy(config["harr"])), parts[1:])
    value = typed if typed is not _MISSING else raw
    assert value is not _MISSING, f"{key}: not a setting of the config (nor a typed default)"
    return value


def _expand(key: str, config: dict) -> list[str]:
    parts = key.split(".")
    if parts[0] == "recipes" and len(parts) > 1 and parts[1] == "*":
        return [".".join(["recipes", name, *parts[2:]]) for name in config["recipes"]]
    return [key]


def _written_keys(paper: Path) -> list[str]:
    """The settings a paper config writes: its recipes' sections and scalars, harr's, models'."""
    raw = yaml.safe_load(paper.read_text())
    keys = []
    for name, recipe in (raw.get("recipes") or {}).items():
        if not recipe:
            continue
        for section in RECIPE_SECTIONS:
            keys += [f"recipes.{name}.{section}.{k}" for k in (recipe.get(section) or {})]
        keys += [f"recipes.{name}.{k}" for k in RECIPE_SCALARS if k in recipe]
    harr = raw.get("harr") or {}
    for section in ("environment", "encoder", "train"):
        keys += [f"harr.{section}.{k}" for k in (harr.get(section) or {})]
    keys += [f"harr.{k}" for k in ("filter", "filter_limit", "filter_keep", "filter_seed", "train_dataset") if k in harr]
    generator = harr.get("generator") or {}
    keys += [f"harr.generator.recipe.rollout.{k}" for k in ((generator.get("recipe") or {}).get("rollout") or {})]
    keys += [f"harr.generator.{k}" for k in ("model",) if k in generator]
    keys += [f"models.{k}" for k, v in (raw.get("models") or {}).items() if v is not None]
    return keys


@pytest.fixture(scope="module")
def page() -> tuple[dict[str, list[dict[str, str]]], dict[str, str]]:
    text = DOC.read_text()
    return _tables(text), _prompts(text)


def test_every_paper_config_has_a_table(page):
    tables, _ = page
    assert set(tables) == {str(p.relative_to(REPO)) for p in PAPERS}


@pytest.mark.parametrize("paper", PAPERS, ids=lambda p: p.stem)
def test_every_row_says_what_it_is(page, paper):
    rows = page[0][str(paper.relative_to(REPO))]
    for row in rows:
        status = row["same / why not"]
        assert status.startswith(STATUSES), f"{row['setting']}: status {status!r} starts with none of {STATUSES}"
        assert row["authors' value"] and row["authors' file"], f"{row['setting']}: the authors' side is empty"
        if not status.startswith("same"):
            # a deviation says why: more than the status word
            assert len(status.split(":", 1)[-1].strip()) > 10, f"{row['setting']}: {status!r} gives no reason"


@pytest.mark.parametrize("paper", PAPERS, ids=lambda p: p.stem)
def test_config_values_are_the_tables(page, paper):
    tables, prompts = page
    config = _merged(paper)
    checked = 0
    for row in tables[str(paper.relative_to(REPO))]:
        key = _unquote(row["key"])
        if key == NO_KEY:
            continue
        ours = _unquote(row["ours"])
        expected = prompts[ours[len("prompt:"):]] if ours.startswith("prompt:") else yaml.safe_load(ours)
        for one in _expand(key, config):
            actual = _resolve(config, one)
            assert _equal(actual, expected), (
                f"{paper.name}: {one} is {actual!r}, docs/FIDELITY.md says {expected!r} ({row['setting']}); "
                "change the table with the reason, or the config back")
            checked += 1
    assert checked >= 10, f"{paper.name}: only {checked} settings checked"


@pytest.mark.parametrize("paper", PAPERS, ids=lambda p: p.stem)
def test_every_written_setting_has_a_row(page, paper):
    tables, _ = page
    config = _merged(paper)
    keys = {one for row in tables[str(paper.relative_to(REPO))] if _unquote(row["key"]) != NO_KEY
            for one in _expand(_unquote(row["key"]), config)}
    # A row covers its key, the keys under it, and (for a mapping such as an endpoint) the mapping
    # whose part it checks.
    missing = [k for k in _written_keys(paper)
               if k not in keys and not any(k.startswith(key + ".") or key.startswith(k + ".") for key in keys)]
    assert not missing, f"{paper.name}: settings without a row in docs/FIDELITY.md: {missing}"


def test_a_drifted_config_fails(page, tmp_path):
    # The check bites: a paper config with one value changed no longer matches its table.
    paper = REPO / "config" / "paper" / "kg_r1.yaml"
    raw = yaml.safe_load(paper.read_text())
    raw["recipes"]["kg_r1_webqsp"]["rl"]["num_mini_batches"] = 2
    drifted = tmp_path / "kg_r1.yaml"
    drifted.write_text(yaml.safe_dump(raw))
    config = _merged(drifted)
    row = next(r for r in page[0]["config/paper/kg_r1.yaml"] if _unquote(r["key"]) == "recipes.*.rl.num_mini_batches")
    values = [_resolve(config, k) for k in _expand("recipes.*.rl.num_mini_batches", config)]
    assert 2 in values and not all(_equal(v, yaml.safe_load(_unquote(row["ours"]))) for v in values)
