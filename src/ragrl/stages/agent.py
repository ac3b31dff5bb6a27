"""The stages of every agent method: SFT data, SFT, RL, evaluation.

Each function is what one CLI command (and so one Snakemake rule) runs: it loads what the command
names, asks the recipe's method (ragrl.methods) for its environment, reward and SFT builder, and
calls the core. Nothing here knows a method by name.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from ragrl.errors import InputError
from ragrl.recipe import Recipe, serve_settings, sft_args
from ragrl.serving import ServerSpec, model_server, resolve_endpoint
from ragrl.serving import api_key as endpoint_api_key


def load_backends(*, index: Path | None = None, bm25: Path | None = None, mode: str | None = None,
                  passages: Path | None = None, gpu: bool = False, kg: Path | None = None, kg_mode: str = "whole",
                  kg_url: str | None = None, kg_dataset: str | None = None, oracle_qa: Path | None = None,
                  ranking: Path | None = None) -> dict[str, Any]:
    """What the CLI flags name, by input kind: a passage retriever (`retriever`), a knowledge graph (`graph`).

    `oracle_qa`: the retriever is replaced by oracle retrieval, each query answered with its
    question's supporting passages from `passages` (the upper-bound row of a table), topped up to
    top-k from the index when the question has fewer (ragrl.retrieval.oracle). `ranking`: each
    question's passages as a ranking file orders them (a graph retriever's, ragrl.stages.graph_rag)."""
    backends: dict[str, Any] = {}

    def searcher():
        from ragrl.retrieval.searcher import load_searcher

        return load_searcher(index, bm25, mode, passages=passages, use_gpu=gpu)

    indexed = index is not None or bm25 is not None
    if ranking is not None:
        from ragrl.retrieval.oracle import RankingRetriever

        if passages is None:
            raise InputError("a ranking retriever needs --passages (the corpus the ranked ids point into)")
        backends["retriever"] = RankingRetriever(passages, ranking)
    elif oracle_qa is not None:
        from ragrl.retrieval.oracle import OracleRetriever

        if passages is None:
            raise InputError("oracle retrieval needs --passages (the corpus the supporting ids point into)")
        backends["retriever"] = OracleRetriever(passages, oracle_qa, fill=searcher() if indexed else None)
    elif indexed:
        backends["retriever"] = searcher()
    if kg_url:
        from ragrl.kg.client import KGClient

        backends["graph"] = KGClient(kg_url, dataset_name=kg_dataset)
    elif kg_dataset is not None:
        raise InputError("--kg-dataset names the dataset of a --kg-url server; an in-process --kg needs none")
    elif kg is not None:
        from ragrl.kg.server import KGService
        from ragrl.kg.store import load_kg

        backends["graph"] = KGService(load_kg(kg, kg_mode))
    return backends


def environment(recipe: Recipe, backends: Mapping[str, Any]):
    missing = [kind for kind in recipe.method.inputs if backends.get(kind) is None]
    if missing:
        flags = {"retriever": "--index/--bm25", "graph": "--kg/--kg-url"}
        raise InputError(f"recipe {recipe.name!r} (method {recipe.env!r}) needs {', '.join(flags[m] for m in missing)}")
    return recipe.method.make_environment(recipe, backends)


def served_model(endpoint: Mapping[str, Any], log: Path) -> ServerSpec | None:
    """The server a job starts for a config endpoint entry ({base_url?, model, serve?}); None when
    base_url names an external one (ragrl.serving)."""
    serve = serve_settings(dict(endpoint))
    if serve is None:
        return None
    model = endpoint["model"]
    return ServerSpec(model=model, served_name=serve.get("served_name", model), log=Path(log),
                      python=serve.get("python"), args=tuple(serve.get("args", ())),
                      startup_timeout_s=float(serve.get("startup_timeout_s", 900)))


@contextmanager
def served_endpoints(recipe: Recipe, log_dir: Path | None = None) -> Iterator[None]:
    """While the body runs, every endpoint entry of the recipe's options (Method.endpoints) without
    a base_url is served by a vLLM server this job starts (log `<log_dir>/<recipe>.<field>.log`) and
    stops, its URL registered for the method's hooks (ragrl.serving.endpoint_url)."""
    from ragrl.serving import registered_endpoint, served_name

    with ExitStack() as stack:
        for name in recipe.method.endpoints:
            entry = dict(getattr(recipe.options, name) or {})
            server = served_model(entry, Path(log_dir or "logs/serve") / f"{recipe.name}.{name}.log") if entry else None
            if server is not None:
                url = stack.enter_context(model_server(server))
                stack.enter_context(registered_endpoint(served_name(entry), url))
        yield


def sft_data(recipe: Recipe, qa: Path, policy: Path, backends: Mapping[str, Any], out: Path,
             limit: int | None = None, server_log: Path | None = None) -> dict:
    """Cold-start SFT data by the recipe's route: the method's gold trajectories, a teacher's
    correct trajectories (OpenAI-compatible endpoint: external, or served by this job with its log
    at `server_log`), or a published SFT file."""
    from ragrl.train.sft_data import teacher_sft_stage

    source = recipe.sft_source
    if source == "import":
        from ragrl.train.sft_import import import_sft_stage

        spec = recipe.sft["import"]
        return import_sft_stage(spec["path"], spec.get("format", "chat_json"), policy, out, rollout_cfg=recipe.rollout,
                                limit=limit)
    env = environment(recipe, backends)
    if source == "gold":
        return recipe.method.gold_sft(recipe, qa, policy, env, backends, out, limit)
    teacher = dict(recipe.sft["teacher"])
    api_key = endpoint_api_key(teacher)
    server = served_model(teacher, server_log or Path("logs/serve") / f"{recipe.name}.teacher.log")
    with resolve_endpoint(teacher.get("base_url"), server) as base_url:
        return teacher_sft_stage(qa, policy, env, out, base_url=base_url,
                                 teacher_model=server.served_name if server else teacher["model"], api_key=api_key,
                                 rollout_cfg=recipe.rollout, limit=limit, n=teacher.get("n", 1),
                                 max_per_question=teacher.get("max_per_question", 1),
                                 batch_size=teacher.get("batch_size", 64), seed=recipe.seed)


def sft(recipe: Recipe, data: Path, policy: Path, out: Path) -> Path:
    from ragrl.train.sft import train_sft

    return train_sft(policy, data, out, sft_args(recipe))


def rl(recipe: Recipe, qa: Path, policy: Path, backends: Mapping[str, Any], out_dir: Path, *,
       limit: int | None = None, log_out: Path | None = None, flags: Mapping[str, Any] | None = None,
       server_log_dir: Path | None = None) -> Path:
    """RL on the recipe's backend: our trainer here, or verl on a Ray cluster (docs/VERL.md)."""
    flags = dict(flags or {})
    if recipe.rl.get("backend", "local") == "verl":
        from ragrl.verl.launch import run_verl

        return run_verl(recipe, qa, policy, out_dir, index=flags.get("index"), bm25=flags.get("bm25"),
                        mode=flags.get("mode"), limit=limit, log_out=log_out)
    from ragrl.stages.agent_rl import train_agent

    # The files the environment reads key the resume check by content (ragrl.workdir), and a KG
    # service's description of what it serves by value.
    inputs = {k: flags.get(k) for k in ("index", "bm25", "passages", "kg") if flags.get(k) is not None}
    fingerprint = {kind: b.health().get("datasets", {}) for kind, b in backends.items()
                   if kind != "retriever" and hasattr(b, "health")}
    with served_endpoints(recipe, server_log_dir):
        return train_agent(recipe, qa, policy, out_dir, environment(recipe, backends), limit=limit, log_out=log_out,
                           fingerprint=fingerprint, inputs=inputs)


def evaluate(recipe: Recipe, model: Path, qa: Path, backends: Mapping[str, Any], out_dir: Path, *, run_id: str,
             dataset: str, max_questions: int | None = None, batch_size: int = 32, generator=None,
             tokenizer=None, temperature: float | None = 0.0, seed: int | None = None) -> dict:
    from ragrl.eval.evaluate import evaluate as run_eval

    method = recipe.method
    cfg = method.eval_rollout(recipe.rollout) if method.eval_rollout else recipe.rollout
    extra = functools.partial(method.eval_metrics, recipe) if method.eval_metrics else None
    group = functools.partial(method.eval_group, recipe) if method.eval_group else None
    return run_eval(model, qa, environment(recipe, backends), out_dir, run_id=run_id, dataset=dataset,
                    rollout_cfg=cfg, batch_size=batch_size, max_questions=max_questions,
                    extra_metrics=extra, extra_columns=method.eval_metric_columns, group_of=group,
                    generator=generator, tokenizer=tokenizer, make_engine=method.make_engine,
                    row_columns=method.row_columns, temperature=temperature, seed=seed)


def evaluate_run(recipe: Recipe, model: Path, datasets: Sequence[tuple[str, Path, Mapping[str, Any]]],
                 out_dir: Path, *, run_id: str, max_questions: int | None = None,
                 batch_size: int = 32, server_log_dir: Path | None = None, temperature: float | None = 0.0,
                 seed: int | None = None) -> dict[str, dict]:
    """Evaluate one run on each (dataset, qa, backends): `out_dir/<dataset>/` gets its predictions
    and metrics; greedy unless `temperature` > 0 (None: the recipe's rollout temperature), sampled
    reproducibly from `seed` (None: the recipe's rollout seed). The policy is loaded once: one job
    per run instead of one per (run, dataset) pays the interpreter, torch and index start-up once
    (~10 s a job on 2 CPU cores, which was most of a toy evaluation; a model load at scale)."""
    from ragrl.eval.evaluate import load_policy

    names = [name for name, _, _ in datasets]
    if not names:
        raise InputError(f"run {run_id!r}: no dataset to evaluate")
    if len(set(names)) != len(names):
        raise InputError(f"run {run_id!r}: dataset named twice in {names}")
    generator, tokenizer = load_policy(model)
    with served_endpoints(recipe, server_log_dir):
        return {name: evaluate(recipe, model, qa, backends, Path(out_dir) / name, run_id=run_id, dataset=name,
                               max_questions=max_questions, batch_size=batch_size, generator=generator,
                               tokenizer=tokenizer, temperature=temperature, seed=seed)
                for name, qa, backends in datasets}
