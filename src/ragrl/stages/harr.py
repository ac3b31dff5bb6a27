"""HARR's stages (docs/HARR.md): filter the training questions, train the query encoder, evaluate a
frozen generator with an encoder, and the encoders' retrieval recall@k on multi-hop questions.

Each function is what one CLI command (one Snakemake rule) runs. The frozen generator is a
checkpoint (a trained agent run's, or an outside one) with its recipe's rollout settings, loaded in
process (HF) or behind an OpenAI-compatible endpoint (`GeneratorSource`; `served` starts the vLLM
server a job owns); every `<search>` goes through
ragrl.train.retriever_rollout.HistoryAwareSearchEnvironment over the unchanged FAISS index.
The generator decodes at `environment.generator_temperature` (0: greedy), so the only randomness
in training is the Plackett-Luce draw of the retrieval.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ragrl.errors import InputError
from ragrl.recipe import HarrRecipe, Recipe


def set_threads(n: int) -> None:
    """One OpenMP pool size for torch and FAISS: with their default pools, alternating small calls
    on a shared 2-core machine ran 100x slower (docs/HARR.md, "Threads")."""
    import faiss
    import torch

    n = max(1, int(n))
    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)


def step_seed(seed: int, step: int) -> int:
    """The sampler seed of training step `step`: a function of (seed, step) alone, so a run resumed
    at step N draws what the killed run would have drawn (stable across Python runs). 32 bits: the
    rollout engine derives per-turn seeds as seed * 1_000_003 + turn, which must fit in int64."""
    digest = hashlib.sha256(f"harr:{int(seed)}:{int(step)}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def multihop_recall(ranked: Sequence[Sequence[str]], supporting: Sequence[Sequence[str]],
                    ks: Sequence[int]) -> dict[str, list[float]]:
    """Per-question recall@k and all@k over the questions with more than one supporting passage
    (the multi-hop ones), for each k: {"recall@k": [...], "all@k": [...]} (pure)."""
    from ragrl.retrieval.evaluate import support_scores

    out: dict[str, list[float]] = {f"{m}@{k}": [] for k in ks for m in ("recall", "all")}
    for ids, gold in zip(ranked, supporting, strict=True):
        if len(set(gold)) < 2:
            continue
        for k in ks:
            scores = support_scores(list(ids), list(gold), k)
            out[f"recall@{k}"].append(scores["recall"])
            out[f"all@{k}"].append(scores["all"])
    return out


# --- loading ------------------------------------------------------------------------------------


@dataclasses.dataclass
class _World:
    index: Any
    meta: dict
    passages: Any


def _world(index_dir: Path, passages: Path) -> _World:
    from ragrl.retrieval.searcher import PassageStore
    from ragrl.train.retriever_policy import load_index_with_meta

    index, meta = load_index_with_meta(index_dir)
    store = PassageStore.from_parquet(passages)
    if len(store) != index.ntotal:
        raise InputError(f"{passages} holds {len(store)} passages, the index {index_dir} {index.ntotal} vectors")
    return _World(index, meta, store)


def _encoder_info(meta: Mapping[str, Any]) -> dict:
    return dict(meta.get("encoder") or meta)


def _policy(meta: Mapping[str, Any], harr: HarrRecipe, encoder: Path | None, trainable: bool):
    """The query encoder: the index's own (frozen or to be trained) or a trained one (a merged
    sentence-transformers directory, used frozen)."""
    from ragrl.settings import EncoderTraining
    from ragrl.train.retriever_policy import QueryEncoderPolicy

    info = _encoder_info(meta)
    if encoder is not None:
        info = {**info, "model": str(encoder)}
    training = harr.encoder if trainable else EncoderTraining(lora=False, max_length=harr.encoder.max_length)
    policy = QueryEncoderPolicy(info, training, device="cpu", seed=harr.train.seed)
    if not trainable:
        for p in policy.parameters():
            p.requires_grad_(False)
    return policy


@dataclasses.dataclass(frozen=True)
class GeneratorSource:
    """The frozen generator: `model` (a checkpoint dir or hub id) loaded in process when `endpoint`
    is empty; else served: {base_url, served_name?} (an OpenAI-compatible endpoint) or {serve: true |
    settings} (a vLLM server that `served` starts, logging to `server_log`)."""

    model: str
    endpoint: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    server_log: Path | None = None

    def definition(self) -> dict:
        """How the generator is run, as a training's work directory is keyed: without the address
        of a server this job started (a new port at each start), with the serve settings that made it."""
        endpoint = dict(self.endpoint)
        if endpoint.get("serve") not in (None, False):
            endpoint.pop("base_url", None)
        return endpoint


@contextmanager
def served(source: GeneratorSource) -> Iterator[GeneratorSource]:
    """The source with a base_url to call: a `serve` endpoint's vLLM server is started here and
    stopped on exit (ragrl.serving: also on SIGTERM and when the job dies); others pass through."""
    serve = source.endpoint.get("serve")
    if source.endpoint.get("base_url") or serve in (None, False):
        yield source
        return
    from ragrl.serving import model_server
    from ragrl.stages.agent import served_model

    spec = served_model({"model": source.model, "serve": serve},
                        source.server_log or Path("logs/serve/harr-generator.log"))
    with model_server(spec) as url:
        endpoint = {**source.endpoint, "base_url": url, "served_name": spec.served_name}
        yield dataclasses.replace(source, endpoint=endpoint)


def _source(generator: GeneratorSource | Path | str) -> GeneratorSource:
    return generator if isinstance(generator, GeneratorSource) else GeneratorSource(str(generator))


def _engine(recipe: Recipe, harr: HarrRecipe, generator: GeneratorSource | Path | str, env):
    from ragrl.agent.generation import load_generator
    from ragrl.agent.rollout import RolloutEngine

    source = _source(generator)
    base_url = source.endpoint.get("base_url")
    started = time.monotonic()
    gen, tokenizer = load_generator(source.model, base_url=base_url, served_name=source.endpoint.get("served_name"))
    where = f"served at {base_url}" if base_url else f"loaded in {time.monotonic() - started:.1f}s"
    print(f"[harr] generator {source.model} {where}", flush=True)
    cfg = dataclasses.replace(recipe.rollout, temperature=harr.environment.generator_temperature, n=1)
    return RolloutEngine(gen, tokenizer, env, cfg)


def _env(policy, world: _World, harr: HarrRecipe, *, use_history: bool, stochastic: bool, seed: int):
    from ragrl.train.retriever_rollout import HistoryAwareSearchEnvironment

    e = harr.environment
    return HistoryAwareSearchEnvironment(policy, world.index, world.passages, topk=e.topk, pool_size=e.pool_size,
                                         alpha=harr.train.alpha, use_history=use_history, instruction=e.instruction,
                                         template=e.template, stochastic=stochastic, seed=seed,
                                         hop_answer=e.hop_answer, forced_retrieval=e.forced_retrieval)


def _rows(qa: Path, limit: int | None = None, types: Sequence[str] | None = None,
          seed: int | None = None) -> list[dict]:
    """The QA file's rows, only those of `types` (metadata.type) when given, in the order
    np.random.default_rng(seed).permutation gives when `seed` is set (that of HF datasets'
    `shuffle(seed=seed)`), the first `limit` of them."""
    from ragrl.data.qa import read_qa_rows
    from ragrl.eval.evaluate import question_type

    rows = read_qa_rows(qa, columns=("metadata", "supporting_ids"))
    if types is not None:
        kinds = [question_type(r) for r in rows]
        rows = [r for r, kind in zip(rows, kinds) if kind in types]
        if not rows:
            raise InputError(f"{qa}: no question of the types harr.train_mix names ({', '.join(types)}); its "
                             f"metadata.type values: {', '.join(repr(t) for t in sorted(set(kinds)))}")
    if seed is not None:
        import numpy as np

        rows = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))]
    return rows if limit is None else rows[:limit]


def mix_kept(rows: Sequence[dict], kept: set[str], mix: Sequence[tuple[str, int | None]] | None,
             taken: dict[str, int] | None = None) -> list[str]:
    """The ids of `rows` in `kept` after harr.train_mix's caps, in the rows' order: the first N kept
    of each type; a type the mix does not name is not kept (the filter never rolls one out).
    `taken`: how many of each type earlier calls kept (updated), for rows that come in batches."""
    from ragrl.eval.evaluate import question_type

    if mix is None:
        return [str(r["id"]) for r in rows if str(r["id"]) in kept]
    caps = dict(mix)
    taken = {} if taken is None else taken
    out = []
    for r in rows:
        kind, qid = question_type(r), str(r["id"])
        if kind in caps and qid in kept and (caps[kind] is None or taken.get(kind, 0) < caps[kind]):
            taken[kind] = taken.get(kind, 0) + 1
            out.append(qid)
    return out


# --- the stages -----------------------------------------------------------------------------------


def filter_stage(recipe: Recipe, harr: HarrRecipe, qa: Path, index_dir: Path, passages: Path,
                 generator: GeneratorSource | Path, out: Path) -> dict:
    """HARR's training filter: G stochastic rollouts of each question with the initial encoder
    (history-aware states); keep the questions whose answer F1 varies. Writes the kept QA rows
    to `out` and their statistics next to it (`<out stem>.stats.json`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragrl.io import write_json, write_parquet
    from ragrl.progress import progress
    from ragrl.train.retriever_grpo import filter_questions
    from ragrl.train.retriever_rollout import rollout_groups

    mix = harr.train_mix
    rows = _rows(qa, harr.filter_limit, None if mix is None else [kind for kind, _ in mix], harr.filter_seed)
    group = harr.train.group_size
    f1s: dict[str, list[float]] = {}
    keep = harr.filter_keep
    taken: dict[str, int] = {}
    if harr.filter:
        world = _world(index_dir, passages)
        env = _env(_policy(world.meta, harr, None, trainable=False), world, harr, use_history=True, stochastic=True,
                   seed=step_seed(harr.train.seed, 0))
        engine = _engine(recipe, harr, generator, env)
        per = harr.environment.rollout_batch_questions
        batches = [rows[i : i + per] for i in range(0, len(rows), per)]
        passed: set[str] = set()
        in_order: list[str] = []
        for b, batch in enumerate(progress(batches, desc="HARR filter", unit="batch")):
            scores: dict[str, list[float]] = {}
            for t in rollout_groups(engine, env, batch, group, seed=step_seed(harr.train.seed, -1 - b)):
                scores.setdefault(t.question_id, []).append(t.reward)
            f1s.update(scores)
            passed.update(filter_questions(scores, group))
            in_order += mix_kept(batch, passed, mix, taken)
            # HARR's filter_data.py stops once --num_samples questions are kept
            if keep is not None and len(in_order) >= keep:
                rows = rows[: (b + 1) * per]
                print(f"[harr] filter: {keep} kept (harr.filter_keep) after {len(rows)} questions", flush=True)
                break
    else:
        passed = {str(r["id"]) for r in rows}
        in_order = mix_kept(rows, passed, mix, taken)
    kept = set(in_order[:keep] if keep is not None else in_order)
    table = pq.read_table(qa)
    ids = [str(i) for i in table.column("id").to_pylist()]
    order = [i for i, q in enumerate(ids) if q in kept]
    write_parquet(table.take(pa.array(order, type=pa.int64())), out)
    mean = [sum(v) / len(v) for v in f1s.values()]
    stats = {"questions": len(rows), "passed": len(passed), "kept": len(order), "group_size": group, "filter": harr.filter,
             "mean_f1": (sum(mean) / len(mean)) if mean else None,
             "any_f1_share": (sum(1 for v in f1s.values() if max(v) > 0) / len(f1s)) if f1s else None}
    write_json(stats, out.with_name(out.stem + ".stats.json"))
    print(f"[harr] filter: kept {stats['kept']} of {stats['questions']} questions (G={group}); {stats}", flush=True)
    if not order:
        raise InputError(f"the filter kept no question of {len(rows)}: no rollout group's F1 varied, so GRPO has "
                         "no advantage to learn from; use a generator whose answers depend on what it retrieves, "
                         "more questions (harr.filter_limit), or harr.filter: false")
    return stats


def train_stage(recipe: Recipe, harr: HarrRecipe, qa: Path, index_dir: Path, passages: Path,
                generator: GeneratorSource | Path, out_dir: Path, *, use_history: bool,
                log_out: Path | None = None) -> Path:
    """train_retriever with rollout_groups as its rollout callback; the sampler is reseeded from
    (seed, step) before each step's rollouts, so a resumed run repeats the same draws. Returns
    out_dir/final (merged encoder in final/encoder); the training log is copied to `log_out`."""
    from ragrl.train.retriever_rollout import rollout_groups
    from ragrl.train.retriever_train import train_retriever

    rows = _rows(qa)
    world = _world(index_dir, passages)
    _prepare_train_dir(recipe, harr, _source(generator), qa, index_dir, passages, world.meta, Path(out_dir),
                       use_history=use_history)
    policy = _policy(world.meta, harr, None, trainable=True)
    env = _env(policy, world, harr, use_history=use_history, stochastic=True, seed=harr.train.seed)
    engine = _engine(recipe, harr, generator, env)
    timing = {"rollout_s": 0.0}

    def rollout(batch, step):
        seed = step_seed(harr.train.seed, step)
        env.generator.manual_seed(seed)
        started = time.monotonic()
        out = rollout_groups(engine, env, batch, harr.train.group_size, seed=seed)
        timing["rollout_s"] = time.monotonic() - started
        rewards = [t.reward for t in out]
        print(f"[harr] step {step}: {len(batch)} questions x G {harr.train.group_size}, reward mean "
              f"{sum(rewards) / max(1, len(rewards)):.3f}, {sum(len(t.steps) for t in out)} retrieval steps, "
              f"rollout {timing['rollout_s']:.1f}s", flush=True)
        return out

    print(f"[harr] training the query encoder on {len(rows)} questions, history={use_history}: {harr.train}",
          flush=True)
    final = train_retriever(policy, world.index, rows, rollout, out_dir, harr.train)
    print(f"[harr] final encoder: {final / 'encoder'}", flush=True)
    if log_out is not None:
        from ragrl.io import atomic_path

        with atomic_path(log_out) as tmp:
            tmp.write_bytes((Path(out_dir) / "train_log.jsonl").read_bytes())
    return final


def _prepare_train_dir(recipe: Recipe | None, harr: HarrRecipe, source: GeneratorSource, qa: Path, index_dir: Path,
                       passages: Path, meta: Mapping[str, Any], out_dir: Path, *, use_history: bool) -> None:
    """Key the work directory on everything the trained encoder is a function of (ragrl.workdir),
    as the RL trainer's is: checkpoints made with other settings, another generator, encoder,
    filter output or index would otherwise be resumed, and shipped under this training's name."""
    from ragrl.models import resolve_model_path
    from ragrl.workdir import prepare_work_dir

    encoder = _encoder_info(meta).get("model")
    definition = {"recipe": dataclasses.asdict(recipe) if recipe is not None else None,
                  "train": dataclasses.asdict(harr.train), "encoder": dataclasses.asdict(harr.encoder),
                  "environment": dataclasses.asdict(harr.environment), "history": use_history,
                  "generator": source.definition()}
    inputs = {"generator": source.model, "encoder": resolve_model_path(str(encoder)) if encoder else None,
              "qa": qa, "index": index_dir, "passages": passages}
    prepare_work_dir(out_dir, definition, inputs, tag="harr")


def _predictions(engine, env, rows: Sequence[dict], batch_size: int, desc: str) -> list[dict]:
    from ragrl.eval.evaluate import prediction_record
    from ragrl.progress import progress

    out: list[dict] = []
    batches = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    for batch in progress(batches, desc=desc, unit="batch"):
        ids = [str(r["id"]) for r in batch]
        env.begin({sid: str(r["question"]) for sid, r in zip(ids, batch)})
        trajs = engine.run_questions([r["question"] for r in batch], n=1, sample_ids=ids)
        out += [prediction_record(r, t, env.spec.tools) for r, t in zip(batch, trajs, strict=True)]
    return out


def eval_stage(recipe: Recipe, harr: HarrRecipe, qa: Path, index_dir: Path, passages: Path,
               generator: GeneratorSource | Path, out_dir: Path, *, run_id: str, dataset: str,
               encoder: Path | None, use_history: bool,
               max_questions: int | None = None, batch_size: int = 32) -> dict:
    """The frozen generator with `encoder` (None: the index's own) in deterministic top-k mode:
    predictions.parquet and metrics.json, as `ragrl eval` writes them."""
    import pyarrow as pa

    from ragrl.eval.evaluate import PREDICTION_SCHEMA, decoding, summarize, write_metrics
    from ragrl.hostinfo import trained_hosts
    from ragrl.io import write_parquet

    trained = trained_hosts([m for m in (getattr(generator, "model", generator), encoder) if m is not None])
    rows = _rows(qa, max_questions)
    world = _world(index_dir, passages)
    env = _env(_policy(world.meta, harr, encoder, trainable=False), world, harr, use_history=use_history,
               stochastic=False, seed=0)
    engine = _engine(recipe, harr, generator, env)
    predictions = _predictions(engine, env, rows, batch_size, f"harr eval {run_id}/{dataset}")
    metrics = {**summarize(predictions, run_id, dataset), "decoding": decoding(engine.config)}
    write_parquet(pa.Table.from_pylist(predictions, schema=PREDICTION_SCHEMA), out_dir / "predictions.parquet")
    metrics = write_metrics(metrics, out_dir / "metrics.json", trained=trained)
    shown = " ".join(f"{k}={v:.4f}" for k, v in metrics["metrics"].items() if v is not None)
    print(f"[harr] eval {run_id}/{dataset}: n={metrics['n']} {shown}", flush=True)
    return metrics


def recall_stage(harr: HarrRecipe, qa: Path, index_dir: Path, passages: Path, out: Path, *, run_id: str,
                 dataset: str, encoder: Path | None, use_history: bool, batch_size: int = 64) -> dict:
    """recall@k and all@k of the encoder's top-k for the multi-hop questions (more than one
    supporting passage), each question's own text as the query (its first hop's state: no history
    yet). Written as a metrics.json of dataset `<dataset>_multihop`, so the results database files it."""
    import numpy as np

    from ragrl.eval.evaluate import bootstrap_ci, write_metrics
    from ragrl.hostinfo import trained_hosts
    from ragrl.retrieval.query_state import default_instruction, encoder_input, retrieval_state

    trained = trained_hosts([encoder] if encoder is not None else [])
    rows = [r for r in _rows(qa) if len(set(r.get("supporting_ids") or [])) > 1]
    if not rows:
        raise InputError(f"{qa}: no question with more than one supporting passage; multi-hop recall cannot be measured")
    world = _world(index_dir, passages)
    policy = _policy(world.meta, harr, encoder, trainable=False)
    e = harr.environment
    instruction = default_instruction(use_history) if e.instruction is None else e.instruction
    kmax = max(harr.recall_k)
    ranked: list[list[str]] = []
    for i in range(0, len(rows), batch_size):
        batch = rows[i : i + batch_size]
        states = [encoder_input(retrieval_state(str(r["question"]), [], str(r["question"]), use_history=use_history),
                                instruction, e.template) for r in batch]
        q = np.ascontiguousarray(policy.encode(states).cpu().numpy(), dtype=np.float32)
        _, idx = world.index.search(q, kmax)
        for row in idx:
            ranked.append([pid for pid, _, _ in world.passages.rows([int(j) for j in row if j >= 0])])
    values = multihop_recall(ranked, [list(r["supporting_ids"]) for r in rows], harr.recall_k)
    metrics = {k: float(np.mean(v)) for k, v in values.items()}
    report = {"run_id": run_id, "dataset": f"{dataset}_multihop", "n": len(rows), "metrics": metrics,
              "ci95": {k: bootstrap_ci(v) for k, v in values.items()}}
    report = write_metrics(report, out, trained=trained)
    print(f"[harr] recall {run_id}/{dataset}: n={len(rows)} "
          + " ".join(f"{k}={v:.3f}" for k, v in metrics.items()), flush=True)
    return report
