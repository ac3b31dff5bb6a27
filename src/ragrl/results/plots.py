"""Figures from the results database (matplotlib, Agg, PNG).

* `plot_training(db, out_dir)` writes `{run}_training.png` for every run in `train_log`: reward
  mean (with a +-std band when `reward_std` is logged) and KL against step. A run whose KL is
  never logged gets a "KL not logged" note in that panel. With no training logs at all it writes
  **no files** and returns an empty list (no placeholder).
* `plot_metrics(db, out_dir, metric)` writes `metrics_{metric}.png`: grouped bars, one group per
  dataset, one bar per run (missing values: no bar). A metric absent from the DB is an error.

File names are deterministic; characters outside ``[A-Za-z0-9._=+-]`` in run/metric names become
``_`` (two names that collide after that are an error). PNGs are written atomically and carry no
matplotlib version stamp, so equal data gives equal bytes with the same library versions.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from ragrl.io import atomic_path
from ragrl.paths import safe_name
from ragrl.results.query import fetch


def _figure(width: float, height: float, ncols: int = 1):
    from matplotlib.figure import Figure  # Figure renders with Agg by default; no pyplot state

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})


def _series(rows: Sequence[tuple], idx: int) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        v = row[idx]
        if v is not None and math.isfinite(v):
            xs.append(row[0])
            ys.append(v)
    return xs, ys


def plot_training(db_path: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """One figure per run with reward and KL curves; returns the written paths (maybe none)."""
    out_dir = Path(out_dir)
    _, runs = fetch(db_path, "SELECT DISTINCT run_id FROM train_log ORDER BY run_id")
    paths: dict[Path, str] = {}
    for (run_id,) in runs:
        path = out_dir / f"{safe_name(run_id)}_training.png"
        if path in paths:
            raise ValueError(f"runs {paths[path]!r} and {run_id!r} map to the same plot file "
                             f"{path.name}")
        paths[path] = run_id
    for path, run_id in paths.items():
        _, rows = fetch(db_path, "SELECT step, reward_mean, reward_std, kl FROM train_log "
                                 "WHERE run_id = ? ORDER BY step", [run_id])
        fig, (ax_r, ax_kl) = _figure(9, 3.2, ncols=2)
        fig.suptitle(f"{run_id}: training")
        xs, ys = _series(rows, 1)
        ax_r.plot(xs, ys, color="C0", label="reward mean")
        band = [(r[0], r[1], r[2]) for r in rows
                if r[1] is not None and r[2] is not None and math.isfinite(r[1] + r[2])]
        if band:
            ax_r.fill_between([b[0] for b in band], [b[1] - b[2] for b in band],
                              [b[1] + b[2] for b in band], color="C0", alpha=0.2,
                              label="± std")
        if not xs:
            ax_r.text(0.5, 0.5, "reward not logged", ha="center", va="center",
                      transform=ax_r.transAxes)
            ax_r.set_xticks([])
            ax_r.set_yticks([])
        else:
            ax_r.legend(loc="best", fontsize="small")
        ax_r.set_xlabel("step")
        ax_r.set_ylabel("reward")
        xs, ys = _series(rows, 3)
        ax_kl.plot(xs, ys, color="C3")
        if not xs:
            ax_kl.text(0.5, 0.5, "KL not logged", ha="center", va="center",
                       transform=ax_kl.transAxes)
            ax_kl.set_xticks([])
            ax_kl.set_yticks([])
        ax_kl.set_xlabel("step")
        ax_kl.set_ylabel("KL")
        for ax in (ax_r, ax_kl):
            ax.grid(True, alpha=0.3)
        _save(fig, path)
    return list(paths)


def plot_metrics(db_path: str | os.PathLike, out_dir: str | os.PathLike, metric: str) -> Path:
    """Grouped bars of `metric`: one group per dataset, one bar per run."""
    _, rows = fetch(db_path, "SELECT run_id, dataset, value FROM evals WHERE metric = ? "
                             "ORDER BY dataset, run_id", [metric])
    if not rows:
        _, have = fetch(db_path, "SELECT DISTINCT metric FROM evals ORDER BY metric")
        raise ValueError(f"metric {metric!r} not in the results database "
                         f"(have: {', '.join(m for (m,) in have) or 'none'})")
    datasets = sorted({r[1] for r in rows})
    run_ids = sorted({r[0] for r in rows})
    values = {(r[0], r[1]): r[2] for r in rows}
    fig, (ax,) = _figure(max(6.0, 1.2 + 0.35 * len(datasets) * len(run_ids)), 4)
    width = 0.8 / len(run_ids)
    for i, run_id in enumerate(run_ids):
        xs, hs = [], []
        for j, ds in enumerate(datasets):
            v = values.get((run_id, ds))
            if v is not None and math.isfinite(v):
                xs.append(j - 0.4 + width * (i + 0.5))
                hs.append(v)
        ax.bar(xs, hs, width=width, label=run_id, color=f"C{i % 10}")
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} by dataset")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="best", fontsize="small", ncols=max(1, len(run_ids) // 8))
    path = Path(out_dir) / f"metrics_{safe_name(metric)}.png"
    _save(fig, path)
    return path


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
