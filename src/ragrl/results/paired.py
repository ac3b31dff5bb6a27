"""Paired comparisons: two runs that answered the same questions, the mean of their per-question
differences in a metric, and its 95% paired bootstrap interval.

What a run is and where it started from (its *lineage*) comes from the workflow, which knows it
from the recipes (`ragrl.workflow.lineage`); the results database keeps it in the `runs`
columns family, step, start_run, variant_of, ablation_of:

* family       the recipe whose pipeline the run belongs to (an ablation sharing another recipe's
               SFT start belongs to that recipe's family; the corpus-level graphs and their reader
               runs to ``construct_kg``; HARR's runs to ``harr``)
* step         where in that pipeline: ``base``, ``sft``, ``rl``, ``oracle``, ``no_retrieval``, ...
* start_run    the run evaluating the model this run's training started from (RL: its SFT run,
               or the base run when SFT is off; SFT: the base run; HARR: the frozen encoder)
* variant_of   the run this one changes one thing of other than training (oracle retrieval, no
               retrieval, a graph's ranking instead of the index, the gold graph for a built one)
* ablation_of  the full run this one is an ablation of (a recipe with ``sft: {from: ...}``: its RL
               run against that recipe's RL run; HARR without history against HARR)

`derive_pairs` turns each link into a pair (run, baseline, relation): ``"rl vs sft"``,
``"sft vs base"``, ``"oracle vs rl"``, ``"ablation vs full"``, ... (the two steps, or
``ablation vs full``), one more for a run whose start is a variant (against the run the variant
varies: HARR against the plain frozen encoder as well as the history-aware one), and adds
``"method vs method"`` for the final runs (trained, neither a variant nor an ablation, nobody's
start) of two families that one table shows together: the table
that lists them is where a reader compares them. No run or recipe is named here.

`paired_rows` computes, for every pair, every dataset both runs answered (and every question type
of it, as ``<dataset>:<type>``) and every metric the tables show for both runs (the database's
main metric when no table shows both), over the questions both answered with a value (`n`):
the two means, the mean difference run - baseline and its percentile bootstrap interval
(`RESAMPLES` resamples of the questions with replacement, seeded with `SEED`, so equal inputs
give equal intervals).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ragrl.errors import InputError

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95
LINEAGE_FIELDS = ("family", "step", "start_run", "variant_of", "ablation_of")
LINKS = ("start_run", "variant_of", "ablation_of")
METHOD_RELATION = "method vs method"
ABLATION_RELATION = "ablation vs full"
# Bounds the index matrix of one batch of resamples (resamples x questions) to ~16 MB.
_CELLS_PER_CHUNK = 2_000_000


@dataclass(frozen=True)
class Lineage:
    family: str
    step: str
    start_run: str | None = None
    variant_of: str | None = None
    ablation_of: str | None = None

    def link(self, name: str) -> str | None:
        return getattr(self, name)


@dataclass(frozen=True)
class Pair:
    run: str
    baseline: str
    relation: str


def parse_lineage(obj: Mapping[str, Any], runs: Mapping[str, tuple[str, str]] | None = None) -> dict[str, Lineage]:
    """Check run -> {family, step, start_run?, variant_of?, ablation_of?} (as the workflow passes
    it) and return it as `Lineage` records.

    With `runs` (run -> (recipe, stage), the database's runs), every entry must be one of them and
    the result covers them all, in their order: a run without an entry is its own recipe's family
    at its stage, linked to nothing. Links must name runs of the result, never the run itself."""
    if not isinstance(obj, Mapping):
        raise InputError(f"lineage must be an object of run -> fields, got {type(obj).__name__}")
    out: dict[str, Lineage] = {}
    for run, fields in obj.items():
        where = f"lineage of run {run!r}"
        if runs is not None and run not in runs:
            raise InputError(f"{where}: no such run among the run manifests")
        if not isinstance(fields, Mapping):
            raise InputError(f"{where}: expected an object, got {fields!r}")
        unknown = sorted(set(fields) - set(LINEAGE_FIELDS))
        if unknown:
            raise InputError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(LINEAGE_FIELDS)}")
        for key in ("family", "step"):
            if not isinstance(fields.get(key), str) or not fields[key]:
                raise InputError(f"{where}: '{key}' must be a non-empty string, got {fields.get(key)!r}")
        for key in LINKS:
            value = fields.get(key)
            if value is not None and (not isinstance(value, str) or not value):
                raise InputError(f"{where}: '{key}' must be a run id or null, got {value!r}")
            if value == run:
                raise InputError(f"{where}: '{key}' names the run itself")
        out[run] = Lineage(**{k: fields.get(k) for k in LINEAGE_FIELDS})
    if runs is not None:  # in the runs' order (the workflow's), which pairs and figures follow
        out = {run: out.get(run) or Lineage(recipe, stage) for run, (recipe, stage) in runs.items()}
    for run, lin in out.items():
        for key in LINKS:
            target = lin.link(key)
            if target is not None and target not in out:
                raise InputError(f"lineage of run {run!r}: '{key}' names {target!r}, which is not a run")
    return out


# --------------------------------------------------------------------------------------------
# which pairs
# --------------------------------------------------------------------------------------------

def final_runs(lineage: Mapping[str, Lineage]) -> list[str]:
    """Runs at the end of their pipeline: trained (a start run), neither a variant nor an
    ablation, and no other run's start."""
    starts = {lin.start_run for lin in lineage.values()}
    return [run for run, lin in lineage.items()
            if lin.start_run and not lin.variant_of and not lin.ablation_of and run not in starts]


def derive_pairs(lineage: Mapping[str, Lineage], shown_together: Iterable[Sequence[str] | None] = ()) -> list[Pair]:
    """Every pair a reader compares: one per lineage link, one per run whose start is a variant
    (against the run the variant varies), and "method vs method" for final runs
    of different families that a table shows together (`shown_together`: each table's run list in
    its order, None for a table of all runs; the earlier-listed run is the baseline)."""
    pairs: list[Pair] = []
    seen: set[frozenset[str]] = set()

    def add(run: str, baseline: str, relation: str) -> None:
        key = frozenset((run, baseline))
        if key not in seen:
            seen.add(key)
            pairs.append(Pair(run, baseline, relation))

    for run, lin in lineage.items():
        if lin.ablation_of:
            add(run, lin.ablation_of, ABLATION_RELATION)
        for key in ("start_run", "variant_of"):
            target = lin.link(key)
            if target:
                add(run, target, f"{lin.step} vs {lineage[target].step}")
        # A run that starts from a variant (HARR from the frozen encoder on history-aware states)
        # is also judged against what the variant varies: training may recover what the variant
        # cost without beating the plain run, and a reader asks both.
        start = lineage[lin.start_run] if lin.start_run else None
        if start is not None and start.variant_of:
            add(run, start.variant_of, f"{lin.step} vs {lineage[start.variant_of].step}")
    finals = final_runs(lineage)
    for listed in shown_together:
        order = [r for r in (finals if listed is None else listed) if r in finals]
        for j, run in enumerate(order):
            for baseline in order[:j]:
                if lineage[run].family != lineage[baseline].family:
                    add(run, baseline, METHOD_RELATION)
    return pairs


def pair_metrics(pair: Pair, tables: Iterable[tuple[str, Sequence[str] | None]], main_metric: str) -> list[str]:
    """The metrics the tables show for both runs of `pair` (`tables`: (metric, run list or None
    for all runs) per table), in table order; the main metric when no table shows both."""
    shown: list[str] = []
    for metric, listed in tables:
        if (listed is None or (pair.run in listed and pair.baseline in listed)) and metric not in shown:
            shown.append(metric)
    return shown or [main_metric]


def family_order(runs: Iterable[str], lineage: Mapping[str, Lineage]) -> list[str]:
    """`runs` in pipeline order: each run, then its variants and ablations, then what was trained
    from it (base, no_retrieval, sft, rl, oracle; an ablation right after its full run). Runs
    linked to nothing in `runs` come in the order given."""
    chosen = list(dict.fromkeys(runs))
    members = set(chosen)

    def parent(run: str) -> tuple[str | None, int]:
        lin = lineage.get(run)
        if lin is None:
            return None, 0
        # The ablation hangs under its full run (not under the SFT run both start from); a run
        # both trained from one and varying another hangs under its start.
        for rank, key in ((0, "ablation_of"), (1, "start_run"), (0, "variant_of")):
            target = lin.link(key)
            if target in members:
                return target, rank
        return None, 0

    children: dict[str | None, list[tuple[int, int, str]]] = {}
    for i, run in enumerate(chosen):
        up, rank = parent(run)
        children.setdefault(up, []).append((rank, i, run))
    out: list[str] = []

    def visit(run: str) -> None:
        out.append(run)
        for _, _, child in sorted(children.get(run, [])):
            visit(child)

    for _, _, root in sorted(children.get(None, []), key=lambda c: c[1]):
        visit(root)
    # Links that go round in a circle reach no root: such runs keep their given order.
    return out + [run for run in chosen if run not in set(out)]


# --------------------------------------------------------------------------------------------
# the bootstrap
# --------------------------------------------------------------------------------------------

def paired_bootstrap(run_values: Sequence[float], baseline_values: Sequence[float], *, resamples: int = RESAMPLES,
                     seed: int = SEED, level: float = LEVEL) -> tuple[float, float, float]:
    """(mean difference, low, high): the mean of run - baseline over the questions (the two
    sequences aligned by question) and its percentile bootstrap interval at `level`, the
    questions resampled with replacement `resamples` times (seeded: equal inputs, equal interval)."""
    import numpy as np

    a = np.asarray(run_values, dtype=np.float64)
    b = np.asarray(baseline_values, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values must be two equal-length sequences, got {a.shape} and {b.shape}")
    if not len(a):
        raise ValueError("no paired questions")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("paired values must be finite")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"resamples={resamples} must be >= 1 and level={level} in (0, 1)")
    d = a - b
    n = len(d)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, _CELLS_PER_CHUNK // n)
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        means[start:start + k] = d[rng.integers(0, n, size=(k, n))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(d.mean()), float(low), float(high)


# --------------------------------------------------------------------------------------------
# from the database
# --------------------------------------------------------------------------------------------

PAIRED_COLUMNS = ("run_id", "baseline", "relation", "family", "dataset", "metric", "n", "mean_run",
                  "mean_baseline", "diff", "ci_low", "ci_high")


def _numeric_prediction_columns(con) -> set[str]:
    rows = con.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'predictions'").fetchall()
    numeric = ("DOUBLE", "FLOAT", "REAL", "DECIMAL", "BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT",
               "UBIGINT", "UINTEGER", "USMALLINT", "UTINYINT", "BOOLEAN")
    return {name for name, kind in rows if kind.upper().startswith(numeric)}


def _has_column(con, table: str, column: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?",
                            [table, column]).fetchone()[0])


def paired_rows(con, pairs: Sequence[Pair], lineage: Mapping[str, Lineage],
                tables: Sequence[tuple[str, Sequence[str] | None]], main_metric: str, *,
                resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL) -> list[tuple]:
    """The `paired` table's rows (`PAIRED_COLUMNS`) from the predictions table of `con`."""
    from ragrl.results.query import quote_ident

    numeric = _numeric_prediction_columns(con)
    typed = _has_column(con, "predictions", "question_type")
    type_expr = "a.question_type" if typed else "NULL"
    out: list[tuple] = []
    for pair in pairs:
        for metric in pair_metrics(pair, tables, main_metric):
            if metric not in numeric:
                continue  # not a per-question column (a metric metrics.json alone reports)
            col = quote_ident(metric)
            rows = con.execute(
                f"SELECT a.dataset, a.id, {type_expr}, CAST(a.{col} AS DOUBLE), CAST(b.{col} AS DOUBLE) "
                "FROM predictions a JOIN predictions b ON a.dataset = b.dataset AND a.id = b.id "
                f"WHERE a.run_id = ? AND b.run_id = ? AND a.{col} IS NOT NULL AND b.{col} IS NOT NULL "
                "ORDER BY a.dataset, a.id", [pair.run, pair.baseline]).fetchall()
            groups: dict[str, list[tuple[str, float, float]]] = {}
            for dataset, qid, qtype, x, y in rows:
                if not (math.isfinite(x) and math.isfinite(y)):
                    continue
                groups.setdefault(dataset, []).append((qid, x, y))
                if qtype:
                    groups.setdefault(f"{dataset}:{qtype}", []).append((qid, x, y))
            for dataset in sorted(groups):
                values = groups[dataset]
                ids = [v[0] for v in values]
                if len(set(ids)) != len(ids):
                    dup = next(i for i in ids if ids.count(i) > 1)
                    raise InputError(f"question id {dup!r} appears more than once in the predictions of run "
                                     f"{pair.run!r} or {pair.baseline!r} on {dataset!r}: cannot pair")
                xs, ys = [v[1] for v in values], [v[2] for v in values]
                diff, low, high = paired_bootstrap(xs, ys, resamples=resamples, seed=seed, level=level)
                out.append((pair.run, pair.baseline, pair.relation, lineage[pair.run].family, dataset, metric,
                            len(values), sum(xs) / len(xs), sum(ys) / len(ys), diff, low, high))
    return out
