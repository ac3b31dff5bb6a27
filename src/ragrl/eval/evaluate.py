"""Evaluate a policy on a QA set with the rollout engine used in training.

Outputs (both written atomically, in `out_dir`):

* `predictions.parquet`, one row per question: id, question, golden_answers list<string>,
  prediction (the final answer, "" when there is none), turns (assistant turns), searches
  (executed search actions), queries list<string> (executed queries, in order),
  generated_tokens, observation_tokens, latency_s, em, f1, cover_em, format, stop_reason,
  response (the decoded response, for error analysis); plus the method's own metric columns
  (`extra_metrics`, e.g. KG-R1's hits1, entity_f1 and retrieval_hit over answer entities).
* `metrics.json`: {"run_id", "dataset", "n", "metrics": {em, f1, cover_em, format, turns,
  searches, <extra columns>}, "ci95": {metric: [low, high]}}, each metric the mean of its
  prediction column (null when n = 0) and its 95% percentile-bootstrap interval (1,000 resamples
  of the questions, seeded; null when n = 0); with typed questions (`metadata.type`, the world's
  1hop / bridge / comparison) also "by_type": {type: {"n", "metrics", "ci95"}}, which the results
  database files as dataset `<dataset>:<type>`; "host" (`ragrl.hostinfo.host_info`: CPU, torch
  and its kernels), which the database files in table `hosts`; and "trained": the hosts that
  trained the evaluated model, its pretraining first (`ragrl.hostinfo.lineage` of its `host.json`;
  empty for a model without one), which the database files in table `train_hosts`.

Decoding is greedy by default: `temperature=0.0` overrides the rollout config's (pass
`temperature=None` to sample with the config's own); one sample per question whatever
`rollout_cfg.n` says. A sampled evaluation is reproducible from `seed` (each turn's draw is
seeded from it, as an RL step's rollouts are), and metrics.json records the decoding under
"decoding" ({"temperature", "seed"}; the database's table `decodings`), so a sampled run is
never read as a greedy one.

The environment is given ready-made (a method builds it: `ragrl.methods`); the format reward
checks each turn against that environment's own tool actions.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any
from pathlib import Path

import pyarrow as pa

from ragrl.data.qa import read_qa_rows, row_metadata
from ragrl.errors import InputError
from ragrl.hostinfo import host_info, trained_hosts
from ragrl.io import write_json, write_parquet
from ragrl.agent.protocol import recorded_turns
from ragrl.rewards.qa import cover_exact_match, exact_match, f1, turns_format_reward

METRIC_COLUMNS = ("em", "f1", "cover_em", "format", "turns", "searches")

PREDICTION_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("question", pa.string()),
    ("golden_answers", pa.list_(pa.string())),
    ("prediction", pa.string()),
    ("turns", pa.int32()),
    ("searches", pa.int32()),
    ("queries", pa.list_(pa.string())),
    ("generated_tokens", pa.int64()),
    ("observation_tokens", pa.int64()),
    ("latency_s", pa.float64()),
    ("em", pa.float64()),
    ("f1", pa.float64()),
    ("cover_em", pa.float64()),
    ("format", pa.float64()),
    ("stop_reason", pa.string()),
    ("response", pa.string()),
    ("question_type", pa.string()),
])


def evaluate(model_dir: str | Path | None, qa_parquet: str | Path, env, out_dir: str | Path, *, run_id: str,
             dataset: str, rollout_cfg=None, batch_size: int = 32, max_questions: int | None = None,
             temperature: float | None = 0.0, seed: int | None = None, device: str = "cpu", dtype: str = "auto",
             generator=None, tokenizer=None, extra_metrics: Callable[[dict, Any], dict] | None = None,
             extra_columns: Sequence[str] = (), group_of: Callable[[dict], str | None] | None = None,
             make_engine: Callable[..., Any] | None = None, row_columns: Sequence[str] = ()) -> dict:
    """Roll out the policy in `model_dir` on every question of `qa_parquet` in environment `env`;
    write predictions and metrics.

    `generator` and `tokenizer` replace the HF model loaded from `model_dir` (a vLLM server, a
    scripted policy). `extra_metrics(row, trajectory)` adds the columns `extra_columns` to each
    prediction (and their means to metrics.json; a None value is left out of its column's mean and
    interval, as a metric undefined for that question). `group_of(row)` names each question's
    group in "by_type" instead of its `metadata.type`. Returns the metrics.json object.
    """
    from ragrl.agent.generation import CountingGenerator
    from ragrl.agent.rollout import RolloutConfig, RolloutEngine
    from ragrl.progress import Ticker

    if batch_size < 1:
        raise InputError(f"batch_size={batch_size} must be >= 1")
    cfg = rollout_cfg if rollout_cfg is not None else RolloutConfig()
    if temperature is not None:
        cfg = dataclasses.replace(cfg, temperature=temperature)
    if seed is not None:
        cfg = dataclasses.replace(cfg, seed=seed)
    # The questions before the policy: a bad QA file fails before a model loads. metadata carries a
    # KGQA row's answer entities (text and KB id) for the KG metrics.
    rows = read_qa_rows(qa_parquet, max_questions, ("metadata", *row_columns))
    generator, tokenizer = _policy(model_dir, generator, tokenizer, device, dtype)
    trained = trained_hosts([model_dir] if model_dir is not None else [])  # before the rollouts: fails fast
    desc = f"eval {run_id}/{dataset}"
    # Lines within a batch too: one batch of 100 questions can be a minute of generation.
    generator = CountingGenerator(generator, Ticker(desc).tick)
    engine = (make_engine or RolloutEngine)(generator, tokenizer, env, cfg)

    predictions = run_predictions(engine, rows, batch_size, desc=desc, extra_metrics=extra_metrics, group_of=group_of)
    metrics = {**summarize(predictions, run_id, dataset, extra_columns), "decoding": decoding(cfg)}
    out_dir = Path(out_dir)
    schema = pa.schema([*PREDICTION_SCHEMA, *(pa.field(k, pa.float64()) for k in extra_columns)])
    write_parquet(pa.Table.from_pylist(predictions, schema=schema), out_dir / "predictions.parquet")
    metrics = write_metrics(metrics, out_dir / "metrics.json", trained=trained)
    shown = " ".join(f"{k}={v:.4f}" if v is not None else f"{k}=null" for k, v in metrics["metrics"].items())
    print(f"[eval] {run_id}/{dataset}: n={metrics['n']} {shown}", file=sys.stderr, flush=True)
    return metrics


def decoding(cfg) -> dict:
    """metrics.json's "decoding" for a rollout config: its temperature, and the seed only where it
    decides the draws (a greedy run's seed changes nothing)."""
    return {"temperature": cfg.temperature, "seed": cfg.seed if cfg.temperature > 0 else None}


def write_metrics(metrics: dict, path: str | Path, trained: Sequence[dict] = ()) -> dict:
    """Write a metrics.json with the host that computed it and `trained` (`ragrl.hostinfo.trained_hosts`
    of the evaluated models), and return what was written: results of one commit differ by float
    rounding between CPU kinds and torch builds, and the database shows which host gave which."""
    written = {**metrics, "host": host_info(), "trained": list(trained)}
    write_json(written, path)
    return written


def run_predictions(engine, rows: Sequence[dict], batch_size: int, desc: str = "eval",
                    extra_metrics: Callable[[dict, Any], dict] | None = None,
                    group_of: Callable[[dict], str | None] | None = None) -> list[dict]:
    """One prediction record per row, in row order; batches of `batch_size` questions per rollout."""
    from ragrl.progress import progress

    out: list[dict] = []
    # A method's own engine may write its own prediction fields (ragrl.methods.Method.engine).
    own_record = getattr(engine, "record", None)
    batches = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    for batch in progress(batches, desc=desc, unit="batch"):
        trajs = engine.run_rows(batch, n=1)
        for row, t in zip(batch, trajs, strict=True):
            record = own_record(row, t) if own_record else prediction_record(row, t, engine.env.spec.tools)
            if extra_metrics is not None:
                record.update(extra_metrics(row, t))
            if group_of is not None:
                record["question_type"] = group_of(row) or record["question_type"]
            out.append(record)
    return out


def prediction_record(row: dict, t, tools: Sequence[str]) -> dict:
    golds = [str(g) for g in row["golden_answers"]]
    # Executed tool calls of any environment: search queries, or KG function calls.
    queries = [q for a in t.actions if a["type"] not in ("answer", "invalid") and a["valid"]
               for q in a["queries"]]
    return {
        "id": str(row["id"]),
        "question": row["question"],
        "golden_answers": golds,
        "prediction": t.answer if t.answer is not None else "",
        "turns": len(t.actions),
        "searches": t.num_searches,
        "queries": queries,
        "generated_tokens": t.generated_tokens,
        "observation_tokens": t.observation_tokens,
        "latency_s": float(t.latency_s),
        # Scored on the engine's answer (None when there is none), the same string the RL reward sees.
        "em": exact_match(t.answer, golds),
        "f1": f1(t.answer, golds),
        "cover_em": cover_exact_match(t.answer, golds),
        "format": turns_format_reward(recorded_turns(t), tools),
        "stop_reason": t.stop_reason,
        "response": t.response_text,
        "question_type": question_type(row),
    }


def question_type(row: dict) -> str:
    """The row's `metadata.type` (the world's 1hop / bridge / comparison), "" when it has none.
    Rows come from `read_qa_rows`, which has checked their metadata."""
    kind = row_metadata(row).get("type")
    return kind if isinstance(kind, str) else ""


BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0


def summarize(predictions: Sequence[dict], run_id: str, dataset: str, extra_columns: Sequence[str] = ()) -> dict:
    """metrics.json: means and intervals over all questions, and, when the questions have types
    (the world's 1hop / bridge / comparison), the same per type under "by_type"."""
    columns = METRIC_COLUMNS + tuple(extra_columns)
    out = {"run_id": run_id, "dataset": dataset, **_means(predictions, columns)}
    kinds = sorted({p.get("question_type") or "" for p in predictions} - {""})
    if kinds:
        out["by_type"] = {k: _means([p for p in predictions if p.get("question_type") == k], columns) for k in kinds}
    return out


def _means(predictions: Sequence[dict], columns: Sequence[str]) -> dict:
    # A None value is a metric undefined for that question (fact precision of a text stating no
    # fact): it is left out of that column's mean and interval.
    values = {k: [float(p[k]) for p in predictions if p.get(k) is not None] for k in columns}
    means = {k: (math.fsum(v) / len(v) if v else None) for k, v in values.items()}
    ci95 = {k: bootstrap_ci(v) for k, v in values.items()}
    # how many questions each mean is over, where fewer than n (the database's per-metric n)
    counts = {k: len(v) for k, v in values.items() if len(v) != len(predictions)}
    return {"n": len(predictions), "metrics": means, "ci95": ci95, **({"counts": counts} if counts else {})}


def bootstrap_ci(values: Sequence[float], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """Percentile bootstrap interval [low, high] of the mean of `values` (questions resampled
    with replacement); None for no values. Seeded: the same values give the same interval."""
    import numpy as np

    if not values:
        return None
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return [float(low), float(high)]


def load_policy(model_dir: str | Path, device: str = "cpu", dtype: str = "auto"):
    """(generator, tokenizer) of the HF model in `model_dir`, for several evaluate() calls."""
    return _policy(model_dir, None, None, device, dtype)


def _policy(model_dir, generator, tokenizer, device: str, dtype: str):
    if generator is not None:
        if tokenizer is None:
            if model_dir is None:
                raise ValueError("a custom generator needs tokenizer= or model_dir to load one from")
            import transformers

            tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        return generator, tokenizer
    if model_dir is None:
        raise ValueError("evaluate needs model_dir (or generator= and tokenizer=)")
    from ragrl.agent.generation import HFGenerator

    _quiet_progress_bars()
    started = time.monotonic()
    hf = HFGenerator.from_pretrained(model_dir, device=device, dtype=dtype)
    print(f"[eval] loaded {model_dir} on {device} in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    return hf, tokenizer or hf.tokenizer


def _quiet_progress_bars() -> None:
    # Weight-loading bars are carriage-return spam in a log file; terminals keep them.
    if not sys.stderr.isatty():
        import transformers

        transformers.utils.logging.disable_progress_bar()
