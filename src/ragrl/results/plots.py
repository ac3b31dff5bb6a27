"""Figures from the results database (matplotlib, Agg, PNG), each sized to be read at 100%: no
figure is wider than `MAX_WIDTH_IN` inches (at 100 dpi) and no panel shows more than `MAX_ROWS`
runs or pairs (a longer list is split over panels).

* `plot_training(db, out_dir)` writes `{run}_training.png` for every run in `train_log`: the reward
  per step (raw, its trailing mean, and a +-std band when `reward_std` is logged), the tied-group
  share (the share of GRPO groups whose rewards all tie, which give no advantage) and KL. A
  quantity a run does not log gets a "not logged" note in its panel. With no training logs at all
  it writes **no files** and returns an empty list (no placeholder).
* `plot_reward_curves(db, out_dir)` writes `reward_curves.png`: one small panel per trained run,
  raw and smoothed reward with the tied-group share on a second axis (a note when nothing is logged).
* `plot_metrics(db, out_dir, metric)` writes `metrics_{metric}.png`: one panel per method family
  and dataset, the family's runs in pipeline order (base, SFT, RL, oracle; `paired.family_order`)
  as points with their 95% intervals. Only runs a table shows with `metric` are drawn (all runs
  when no table has it). A metric absent from the DB is an error.
* `plot_paired(db, out_dir, metric)` writes `paired_{metric}.png`: a forest plot of the `paired`
  table, one row per pair and dataset, its mean difference and 95% paired bootstrap interval, a
  line at 0; one panel per family (a note when no pair has the metric).
* `plot_families(db, out_dir)` writes `family_{family}.png` per family: per metric its tables
  show, the runs with intervals on the left and the forest of its pairs on the right.

Figures show whole datasets; the per-question-type breakdown is in the tables. File names are
deterministic; characters outside ``[A-Za-z0-9._=+-]`` in run/metric/family names become ``_``
(two names that collide after that are an error). PNGs are written atomically and carry no
matplotlib version stamp, so equal data gives equal bytes with the same library versions.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ragrl.errors import InputError
from ragrl.io import atomic_path
from ragrl.paths import safe_name
from ragrl.results.paired import LINKS, Lineage, family_order
from ragrl.results.query import connect_read_only, fetch

DPI = 100
MAX_WIDTH_IN = 14.0  # 1,400 px
MAX_ROWS = 10
PANEL_WIDTH_IN = 4.6
_ROW_IN = 0.32  # height of one run or pair row
_PANEL_EXTRA_IN = 1.0  # title, axis label and ticks of one panel


def _figure(width: float, height: float, ncols: int = 1):
    from matplotlib.figure import Figure  # Figure renders with Agg by default; no pyplot state

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def _grid(width: float, heights: Sequence[float], ncols: int):
    """A figure of len(heights) rows x ncols panels, row i `heights[i]` inches tall."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(min(width, MAX_WIDTH_IN), sum(heights)), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(heights), ncols, squeeze=False, gridspec_kw={"height_ratios": list(heights)})
    return fig, axes


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})


def _suptitle(fig, text: str) -> None:
    """The figure's title, wrapped to its width (a long title on a narrow figure is cut off)."""
    import textwrap

    chars = max(30, int(fig.get_figwidth() * DPI / 7))  # ~7 px per character at the medium font size
    fig.suptitle(textwrap.fill(text, chars), fontsize="medium")


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _series(rows: Sequence[tuple], idx: int) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        v = row[idx]
        if v is not None and math.isfinite(v):
            xs.append(row[0])
            ys.append(v)
    return xs, ys


def smoothing_window(n: int) -> int:
    """Steps in the trailing mean of a curve of `n` steps: a tenth of them, at least 3."""
    return max(1, min(n, max(3, round(n / 10))))


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and the `window - 1` before it (fewer at the start)."""
    if window < 1:
        raise ValueError(f"window={window} must be >= 1")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _chunks(items: Sequence, size: int = MAX_ROWS) -> list[Sequence]:
    return [items[i:i + size] for i in range(0, len(items), size)] or [items]


def _titled_chunks(items: Sequence, title: str) -> list[tuple[str, Sequence]]:
    """`_chunks` of `items`, each titled `title`, numbered "(i/n)" when there are several."""
    chunks = _chunks(items)
    return [(f"{title} ({c + 1}/{len(chunks)})" if len(chunks) > 1 else title, part) for c, part in enumerate(chunks)]


# --------------------------------------------------------------------------------------------
# training curves
# --------------------------------------------------------------------------------------------

_CURVE_SQL = ("SELECT step, reward_mean, reward_std, kl, {tied} FROM train_log WHERE run_id = ? ORDER BY step")


def _train_columns(db_path) -> set[str]:
    _, cols = fetch(db_path, "SELECT column_name FROM information_schema.columns WHERE table_name = 'train_log'")
    return {c for (c,) in cols}


def _curve_rows(db_path, run_id: str, columns: set[str]) -> list[tuple]:
    # A log without the column (an older trainer, HARR's retriever GRPO) has no tied-group share.
    tied = "tied_group_share" if "tied_group_share" in columns else "NULL::DOUBLE"
    return fetch(db_path, _CURVE_SQL.format(tied=tied), [run_id])[1]


def _draw_reward(ax, rows: Sequence[tuple], *, band: bool = True, legend: bool = True) -> bool:
    """Raw and smoothed reward of `rows` (step, reward_mean, reward_std, ...) on `ax`."""
    xs, ys = _series(rows, 1)
    if not xs:
        _note(ax, "reward not logged")
        return False
    w = smoothing_window(len(ys))
    ax.plot(xs, ys, color="C0", alpha=0.45, lw=1, marker="o", ms=2.5, label="reward (per step)")
    ax.plot(xs, trailing_mean(ys, w), color="C0", lw=2.2, label=f"mean of last {w} steps")
    spread = [(r[0], r[1], r[2]) for r in rows
              if band and r[1] is not None and r[2] is not None and math.isfinite(r[1] + r[2])]
    if spread:
        ax.fill_between([b[0] for b in spread], [b[1] - b[2] for b in spread], [b[1] + b[2] for b in spread],
                        color="C0", alpha=0.12, label="± std")
    if legend:
        ax.legend(loc="best", fontsize="x-small")
    _integer_steps(ax)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(True, alpha=0.3)
    return True


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_tied(ax, rows: Sequence[tuple], label: bool = True) -> bool:
    xs, ys = _series(rows, 4)
    if not xs:
        return False
    ax.plot(xs, ys, color="C3", lw=1.2, ls="--", marker=".", ms=3, label="tied-group share")
    ax.set_ylim(-0.03, 1.03)
    if label:
        ax.set_ylabel("tied-group share", color="C3")
    return True


def plot_training(db_path: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """One figure per run: reward (raw, smoothed, ±std), tied-group share, KL; returns the written
    paths (maybe none)."""
    out_dir = Path(out_dir)
    _, runs = fetch(db_path, "SELECT DISTINCT run_id FROM train_log ORDER BY run_id")
    paths: dict[Path, str] = {}
    for (run_id,) in runs:
        path = out_dir / f"{safe_name(run_id)}_training.png"
        if path in paths:
            raise InputError(f"runs {paths[path]!r} and {run_id!r} map to the same plot file "
                             f"{path.name}")
        paths[path] = run_id
    columns = _train_columns(db_path) if paths else set()
    for path, run_id in paths.items():
        rows = _curve_rows(db_path, run_id, columns)
        fig, (ax_r, ax_t, ax_kl) = _figure(12, 3.2, ncols=3)
        fig.suptitle(f"{run_id}: training")
        _draw_reward(ax_r, rows)
        if _draw_tied(ax_t, rows):
            _integer_steps(ax_t)
            ax_t.set_xlabel("step")
            ax_t.grid(True, alpha=0.3)
        else:
            _note(ax_t, "tied-group share not logged")
        xs, ys = _series(rows, 3)
        if xs:
            ax_kl.plot(xs, ys, color="C2")
            _integer_steps(ax_kl)
            ax_kl.set_xlabel("step")
            ax_kl.grid(True, alpha=0.3)
        else:
            _note(ax_kl, "KL not logged")
        ax_kl.set_ylabel("KL")
        _save(fig, path)
    return list(paths)


def reward_curves_figure(db_path: str | os.PathLike):
    """The figure of `plot_reward_curves` (a Figure), for callers that check it before saving."""
    _, runs = fetch(db_path, "SELECT DISTINCT run_id FROM train_log ORDER BY run_id")
    if not runs:
        fig, (ax,) = _figure(6, 2)
        _note(ax, "no training logs in the results database")
        return fig
    columns = _train_columns(db_path)
    ncols = min(3, len(runs))
    nrows = math.ceil(len(runs) / ncols)
    fig, axes = _grid(ncols * PANEL_WIDTH_IN, [2.9] * nrows, ncols)
    _suptitle(fig, "Reward per RL step (thin: raw; thick: trailing mean) and the tied-group share "
                   "(dashed, right axis: GRPO groups whose rewards all tie)")
    for i, ax in enumerate(axes.flat):
        if i >= len(runs):
            ax.set_axis_off()
            continue
        (run_id,) = runs[i]
        rows = _curve_rows(db_path, run_id, columns)
        ax.set_title(run_id, fontsize="medium")
        if not _draw_reward(ax, rows, band=False, legend=False):
            continue
        twin = ax.twinx()
        if _draw_tied(twin, rows, label=False):
            twin.set_ylabel("tied share", color="C3", fontsize="small")
        else:
            twin.set_yticks([])
            ax.text(0.99, 0.02, "tied-group share not logged", ha="right", va="bottom", transform=ax.transAxes,
                    fontsize="x-small", color="0.4")
    return fig


def plot_reward_curves(db_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """`reward_curves.png`: every trained run's reward and tied-group share, one panel each."""
    path = Path(out_dir) / "reward_curves.png"
    _save(reward_curves_figure(db_path), path)
    return path


# --------------------------------------------------------------------------------------------
# evaluations by family, paired differences
# --------------------------------------------------------------------------------------------

@dataclass
class _Results:
    """What the evaluation figures read from the database, fetched once."""

    lineage: dict[str, Lineage]
    runs: list[str]  # in the runs table's order
    families: list[str]  # in order of first appearance
    values: dict[tuple[str, str, str], tuple[float, float | None, float | None]]  # (run, dataset, metric)
    pairs: list[tuple]  # paired rows without question types, PAIRED_COLUMNS order
    table_specs: list[dict]
    main_metric: str

    def __post_init__(self) -> None:
        position = {r: i for i, r in enumerate(family_order(self.runs, self.lineage))}
        # Pairs in pipeline order (sft − base before rl − sft before oracle − rl), whatever order
        # the database holds them in.
        self.pairs.sort(key=lambda row: (position.get(row[0], 0), position.get(row[1], 0), row[4]))

    def members(self, family: str) -> list[str]:
        """The family's runs and the runs outside it they start from, vary or ablate, in order."""
        own = [r for r in self.runs if self.lineage[r].family == family]
        linked = [t for r in own for k in LINKS if (t := self.lineage[r].link(k)) and t not in own]
        return family_order(own + linked, self.lineage)

    def shown(self, metric: str) -> set[str] | None:
        """Runs a table shows with `metric`; None for all (a table of all runs, or no table has it)."""
        specs = [s for s in self.table_specs if s.get("metric") == metric]
        if not specs or any(s.get("runs") is None for s in specs):
            return None
        return {r for s in specs for r in s["runs"]}

    def metrics(self, family: str) -> list[str]:
        """The metrics the tables show for the family's runs (the main metric when none does)."""
        own = {r for r in self.runs if self.lineage[r].family == family}
        out = [s["metric"] for s in self.table_specs if s.get("runs") is None or own & set(s["runs"])]
        return list(dict.fromkeys(out)) or [self.main_metric]

    def datasets(self, runs: Sequence[str], metric: str) -> list[str]:
        return sorted({d for (r, d, m) in self.values if m == metric and r in runs})

    def higher_is_better(self, metric: str) -> bool | None:
        """As the first table of `metric` says (true when no table has it; None: neither)."""
        return next((s.get("higher_is_better", True) for s in self.table_specs if s.get("metric") == metric), True)


def _load(db_path: str | os.PathLike) -> _Results:
    con = connect_read_only(db_path)
    try:
        lineage, runs = {}, []
        for run_id, family, step, start, variant, ablation in con.execute(
                "SELECT run_id, family, step, start_run, variant_of, ablation_of FROM runs ORDER BY rowid").fetchall():
            lineage[run_id] = Lineage(family, step, start, variant, ablation)
            runs.append(run_id)
        values = {(r, d, m): (v, lo, hi) for r, d, m, v, lo, hi in con.execute(
            "SELECT run_id, dataset, metric, value, ci_low, ci_high FROM evals WHERE value IS NOT NULL").fetchall()
            if math.isfinite(v)}
        pairs = con.execute("SELECT * FROM paired WHERE NOT contains(dataset, ':') ORDER BY rowid").fetchall()
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    finally:
        con.close()
    return _Results(lineage, runs, list(dict.fromkeys(lineage[r].family for r in runs)), values, pairs,
                    json.loads(meta.get("table_specs") or "[]"), json.loads(meta.get("main_metric") or '"em"'))


def _step_colors(res: _Results) -> dict[str, str]:
    steps = list(dict.fromkeys(res.lineage[r].step for r in res.runs))
    # matplotlib's default cycle has 10 colours: past ten steps two would share one (the default
    # run has 11: "gold" was drawn as "base"). tab20 has twenty distinct ones; beyond that, cycle.
    if len(steps) <= 10:
        return {s: f"C{i}" for i, s in enumerate(steps)}
    import matplotlib

    tab20 = matplotlib.colormaps["tab20"]
    return {s: matplotlib.colors.to_hex(tab20(i % 20)) for i, s in enumerate(steps)}


def _draw_runs(ax, res: _Results, runs: Sequence[str], datasets: Sequence[str], metric: str, title: str) -> None:
    """One row per run: its value per dataset with the 95% interval. One dataset: coloured by step;
    several: a colour and marker per dataset, offset within the run's row."""
    colors = _step_colors(res)
    k = len(datasets)
    markers = "osD^v<>PX*"
    for j, ds in enumerate(datasets):
        offset = (j - (k - 1) / 2) * (0.6 / max(k, 1)) if k > 1 else 0.0
        labelled = False
        for i, run in enumerate(runs):
            cell = res.values.get((run, ds, metric))
            if cell is None:
                continue
            v, lo, hi = cell
            err = [[v - lo], [hi - v]] if lo is not None and hi is not None else None
            ax.errorbar([v], [i + offset], xerr=err, fmt=markers[j % len(markers)], ms=5, capsize=3,
                        color=colors[res.lineage[run].step] if k == 1 else f"C{j % 10}", ecolor="0.35",
                        elinewidth=1.2, label=ds if k > 1 and not labelled else None)
            labelled = True
            if k == 1:
                ax.annotate(f"{v:.3f}", (hi if hi is not None else v, i), xytext=(4, 0), textcoords="offset points",
                            va="center", fontsize="x-small")
    ax.set_yticks(range(len(runs)), runs, fontsize="small")
    ax.set_ylim(len(runs) - 0.5, -0.5)
    ax.set_xlabel(metric)
    ax.set_title(title, fontsize="medium")
    ax.grid(True, axis="x", alpha=0.3)
    ax.margins(x=0.15)
    if k > 1:  # below the panel: inside, it would hide the points
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.32), ncols=min(k, 2),
                  frameon=False)


def _forest_label(row: tuple, with_dataset: bool) -> str:
    run, baseline, relation, _family, dataset = row[:5]
    label = f"{run} − {baseline} ({relation})"
    if with_dataset:
        label += f" · {dataset}"
    return label


def _draw_forest(ax, rows: Sequence[tuple], title: str, with_dataset: bool, higher_is_better: bool | None = True) -> None:
    """One row per paired comparison: mean difference and 95% interval, a line at 0; an interval
    clear of 0 is green when the run is better, red when worse (blue where neither direction is
    better), grey otherwise. The numbers stand on the right-hand axis."""
    if not rows:
        _note(ax, "no pair of runs with per-question values")
        ax.set_title(title, fontsize="medium")
        return
    ys = list(range(len(rows)))
    for y, row in zip(ys, rows):
        diff, lo, hi = row[9], row[10], row[11]
        if lo <= 0 <= hi:
            color = "0.45"
        elif higher_is_better is None:
            color = "C0"
        else:
            color = "C2" if (diff > 0) == higher_is_better else "C3"
        ax.errorbar([diff], [y], xerr=[[diff - lo], [hi - diff]], fmt="o", ms=5, capsize=3, color=color)
    ax.axvline(0, color="black", lw=0.9)
    ax.set_yticks(ys, [_forest_label(r, with_dataset) for r in rows], fontsize="small")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    right = ax.secondary_yaxis("right")
    right.set_yticks(ys, [f"{r[9]:+.3f} [{r[10]:+.3f}, {r[11]:+.3f}] n={r[6]}" for r in rows], fontsize="x-small")
    right.tick_params(length=0)
    direction = {True: "; higher is better", False: "; lower is better", None: ""}[higher_is_better]
    ax.set_xlabel(f"difference in {rows[0][5]} (run − baseline{direction})")
    ax.set_title(title, fontsize="medium")
    ax.grid(True, axis="x", alpha=0.3)
    ax.margins(x=0.1)


def _panel_height(rows: int) -> float:
    return _PANEL_EXTRA_IN + _ROW_IN * max(rows, 1)


def metrics_figure(db_path: str | os.PathLike, metric: str):
    """The figure of `plot_metrics` (a Figure)."""
    res = _load(db_path)
    if not any(m == metric for (_, _, m) in res.values):
        have = sorted({m for (_, _, m) in res.values})
        raise InputError(f"metric {metric!r} not in the results database (have: {', '.join(have) or 'none'})")
    shown = res.shown(metric)
    panels = []  # (title, runs, dataset)
    for family in res.families:
        runs = [r for r in res.members(family) if shown is None or r in shown]
        own = [r for r in runs if res.lineage[r].family == family]
        # A dataset only a linked run of another family answered (a shared base row) is not this family's.
        for ds in res.datasets(own, metric):
            present = [r for r in runs if (r, ds, metric) in res.values]
            panels += [(title, part, ds) for title, part in _titled_chunks(present, f"{family} · {ds}")]
    if not panels:
        fig, (ax,) = _figure(7, 2)
        _note(ax, f"no run a {metric} table shows has a {metric} value")
        return fig
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    heights = [_panel_height(max(len(p[1]) for p in panels[r * ncols:(r + 1) * ncols])) for r in range(nrows)]
    fig, axes = _grid(ncols * PANEL_WIDTH_IN, heights, ncols)
    _suptitle(fig, f"{metric} per method family (points: mean over the questions; bars: 95% bootstrap interval)")
    for i, ax in enumerate(axes.flat):
        if i < len(panels):
            title, runs, ds = panels[i]
            _draw_runs(ax, res, runs, [ds], metric, title)
        else:
            ax.set_axis_off()
    return fig


def plot_metrics(db_path: str | os.PathLike, out_dir: str | os.PathLike, metric: str) -> Path:
    """`metrics_{metric}.png`: per family and dataset, the runs in pipeline order with intervals."""
    fig = metrics_figure(db_path, metric)
    path = Path(out_dir) / f"metrics_{safe_name(metric)}.png"
    _save(fig, path)
    return path


def paired_figure(db_path: str | os.PathLike, metric: str):
    """The figure of `plot_paired` (a Figure)."""
    res = _load(db_path)
    panels = []
    for family in res.families:
        rows = [r for r in res.pairs if r[3] == family and r[5] == metric]
        multi = len({r[4] for r in rows}) > 1
        panels += [(title, part, multi) for title, part in _titled_chunks(rows, family) if part]
    if not panels:
        fig, (ax,) = _figure(7, 2)
        _note(ax, f"no paired runs with per-question {metric}")
        return fig
    fig, axes = _grid(2 * PANEL_WIDTH_IN, [_panel_height(len(p[1])) for p in panels], 1)
    _suptitle(fig, f"Paired differences in {metric} (mean over the questions both runs answered; 95% paired "
                   "bootstrap interval; green / red: clear of 0, run better / worse)")
    for ax, (title, rows, multi) in zip(axes.flat, panels):
        _draw_forest(ax, rows, title, multi, res.higher_is_better(metric))
    return fig


def plot_paired(db_path: str | os.PathLike, out_dir: str | os.PathLike, metric: str) -> Path:
    """`paired_{metric}.png`: the forest plot of every pair's difference in `metric`."""
    path = Path(out_dir) / f"paired_{safe_name(metric)}.png"
    _save(paired_figure(db_path, metric), path)
    return path


def family_figure(db_path: str | os.PathLike, family: str, res: _Results | None = None):
    """The figure of `plot_families` for one family (a Figure)."""
    res = res or _load(db_path)
    members = res.members(family)
    rows_by_metric = []
    own = {r for r in members if res.lineage[r].family == family}
    for metric in res.metrics(family):
        shown = res.shown(metric)
        if shown is not None and not shown & own:  # no table lists the family: all its runs
            shown = None
        listed = [r for r in members if shown is None or r in shown]
        # The family's own datasets: a linked run of another family (a shared base row) is drawn
        # where the family's runs were evaluated, not on datasets of its own.
        datasets = res.datasets([r for r in listed if r in own], metric)
        runs = [r for r in listed if any((r, d, metric) in res.values for d in datasets)]
        pairs = [p for p in res.pairs if p[3] == family and p[5] == metric]
        if runs or pairs:
            # Up to MAX_ROWS runs and pairs per panel; datasets beyond MAX_ROWS would be more series.
            rows_by_metric += [(metric, part, datasets[:MAX_ROWS], ppart)
                               for part, ppart in _zip_chunks(runs, pairs)]
    if not rows_by_metric:
        fig, (ax,) = _figure(7, 2)
        _note(ax, f"{family}: no evaluations")
        return fig
    # A panel of several datasets carries its legend underneath.
    heights = [_panel_height(max(len(r), len(p))) + (0.2 * math.ceil(len(d) / 2) if len(d) > 1 else 0)
               for _, r, d, p in rows_by_metric]
    fig, axes = _grid(2 * PANEL_WIDTH_IN + 2.4, heights, 2)
    _suptitle(fig, f"{family}: runs in pipeline order (left, 95% bootstrap intervals) and paired differences "
                   "(right, run − baseline, 95% paired bootstrap)")
    for (metric, runs, datasets, pairs), (ax_runs, ax_pairs) in zip(rows_by_metric, axes):
        if runs:
            _draw_runs(ax_runs, res, runs, datasets, metric, metric if len(datasets) > 1 else f"{metric} · {datasets[0]}")
        else:
            _note(ax_runs, f"no {metric} values")
        _draw_forest(ax_pairs, pairs, f"Δ {metric}", len({p[4] for p in pairs}) > 1, res.higher_is_better(metric))
    return fig


def _zip_chunks(runs: Sequence[str], pairs: Sequence[tuple]) -> list[tuple[Sequence[str], Sequence[tuple]]]:
    run_parts, pair_parts = _chunks(runs), _chunks(pairs)
    n = max(len(run_parts), len(pair_parts))
    return [(run_parts[i] if i < len(run_parts) else [], pair_parts[i] if i < len(pair_parts) else [])
            for i in range(n)]


def plot_families(db_path: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """`family_{family}.png` for every family of the runs table; returns the paths."""
    res = _load(db_path)
    paths: dict[Path, str] = {}
    for family in res.families:
        path = Path(out_dir) / f"family_{safe_name(family)}.png"
        if path in paths:
            raise InputError(f"families {paths[path]!r} and {family!r} map to the same plot file {path.name}")
        paths[path] = family
    for path, family in paths.items():
        _save(family_figure(db_path, family, res), path)
    return list(paths)


def plot_pretraining(log_jsonl: str | os.PathLike, out_png: str | os.PathLike) -> Path:
    """The pretraining curve of `ragrl pretrain`: loss per logged step, and the reading probe's EM."""
    import json

    records = [json.loads(line) for line in Path(log_jsonl).read_text().splitlines() if line.strip()]
    fig, (ax_loss, ax_em) = _figure(9, 3.2, ncols=2)
    fig.suptitle("pretraining of the tiny policy")
    ax_loss.plot([r["step"] for r in records], [r["loss"] for r in records], color="C0")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("LM loss")
    probed = [r for r in records if "probe_em" in r]
    ax_em.plot([r["step"] for r in probed], [r["probe_em"] for r in probed], color="C1", marker="o")
    ax_em.set_ylim(0, 1)
    ax_em.set_xlabel("step")
    ax_em.set_ylabel("reading probe EM (held-out names)")
    out_png = Path(out_png)
    _save(fig, out_png)
    return out_png
