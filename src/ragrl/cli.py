"""The `ragrl` command line: one sub-command per workflow stage.

Every Snakemake rule calls exactly one of these, so the command in a rule's log can be re-run by
hand. This module only parses arguments and calls stage functions; it holds no logic of its own.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shlex
import sys
from pathlib import Path


def _cmd_world(args: argparse.Namespace) -> None:
    from ragrl.toy.world import generate_world, write_world

    world = generate_world(args.seed, args.size)
    manifest = write_world(world, args.out)
    print(f"world written to {args.out}: {manifest['passages']} passages, {manifest['facts']} facts, "
          f"questions {manifest['questions']}")


def _tiny_spec(args: argparse.Namespace):
    from ragrl.toy.tiny_model import TinyModelSpec

    return TinyModelSpec(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_layers=args.num_layers,
        num_heads=args.num_heads, num_kv_heads=args.num_kv_heads, intermediate_size=args.intermediate_size,
        seed=args.seed,
    )


def _add_tiny_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vocab-size", type=int, default=2000)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=688)
    p.add_argument("--seed", type=int, default=0)


def _cmd_model_tiny(args: argparse.Namespace) -> None:
    from ragrl.toy.tiny_model import build_tiny, with_prompt_text
    from ragrl.toy.world import world_text

    spec = _tiny_spec(args)
    out = build_tiny(with_prompt_text(world_text(args.world)), args.out, spec)
    print(f"tiny policy written to {out}")


def _cmd_pretrain(args: argparse.Namespace) -> None:
    from ragrl.results.plots import plot_pretraining
    from ragrl.train.pretrain import PretrainArgs, pretrain

    spec = _tiny_spec(args)
    settings = PretrainArgs(**_json_arg(args.settings)) if args.settings else PretrainArgs()
    out = pretrain(args.world, args.out, spec, settings, cache_dir=args.cache, write_cache=args.write_cache)
    if args.plot:
        plot_pretraining(out / "pretrain_log.jsonl", args.plot)
    print(f"pretrained tiny policy written to {out}")


def _json_arg(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


def _cmd_model_generate(args: argparse.Namespace) -> None:
    from ragrl.io import write_text
    from ragrl.toy.tiny_model import generate_text

    import os

    # This smoke check is the cheapest job that can ask for a GPU; its log shows which devices
    # the scheduler gave it (SLURM sets CUDA_VISIBLE_DEVICES for a --gpus job).
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}")
    text = generate_text(args.model, args.prompt, max_new_tokens=args.max_new_tokens, seed=args.seed)
    print(f"prompt: {args.prompt!r}\ncompletion: {text!r}")
    if args.out:
        write_text(text + "\n", args.out)


def _cmd_model_check(args: argparse.Namespace) -> None:
    from ragrl.models import check_model_name

    for name in args.names:
        print(f"{name}: {check_model_name(name, key=args.key)}")


def _cmd_corpus(args: argparse.Namespace) -> None:
    from ragrl.corpus import write_passages

    fmt = args.format[0] if len(args.format) == 1 else args.format
    n = write_passages(fmt, args.inputs, args.out, words=args.words, source=args.source,
                       strip_title_quotes=args.strip_title_quotes)
    print(f"{n} passages written to {args.out}")


def _cmd_qa(args: argparse.Namespace) -> None:
    from ragrl.data.qa import write_qa

    fmt, path = (args.format[0], args.input[0]) if len(args.format) == len(args.input) == 1 else (args.format, args.input)
    n = write_qa(fmt, path, args.out)
    print(f"{n} questions written to {args.out}")


def _cmd_kb(args: argparse.Namespace) -> None:
    from ragrl.kb.build import build_kb

    stats = build_kb(args.inputs, args.out, fmt=args.format, tokenizer=args.tokenizer, max_tokens=args.max_tokens)
    print(f"knowledge base written to {args.out}: {stats}")


def _cmd_factscore(args: argparse.Namespace) -> None:
    from ragrl.factscore.run import score_file

    if args.backend == "embedded":
        from ragrl.factscore.embedded import EmbeddedFactScorer

        scorer = EmbeddedFactScorer(args.kb, args.gamma)
    else:
        import os

        from ragrl.factscore.paper import ChatEndpoint, DenseRanker, NLIModel, PaperFactScorer

        if not (args.base_url and args.model):
            raise ValueError("--backend paper needs --base-url and --model (an OpenAI-compatible endpoint)")
        endpoint = ChatEndpoint(args.base_url, args.model, timeout_s=args.timeout_s, max_retries=args.max_retries,
                                max_workers=args.max_workers,
                                api_key=os.environ.get(args.api_key_env) if args.api_key_env else None)
        scorer = PaperFactScorer(args.kb, endpoint, entailment=NLIModel(args.nli_model) if args.verifier == "nli" else None,
                                 threshold=args.nli_threshold, ranker=DenseRanker(args.ranker) if args.ranker else None,
                                 top_k=args.top_k, gamma=args.gamma, prompts_dir=args.prompts_dir)
    print(f"factscore: {score_file(scorer, args.input, args.out, args.batch_size)}")


def _cmd_index_embed_shard(args: argparse.Namespace) -> None:
    from ragrl.retrieval.dense import embed_shard

    # The plain name goes into the index meta (portable); the encoder resolves it to a path itself.
    meta = embed_shard(
        args.passages, args.model, args.shard, args.num_shards, args.out,
        query_prefix=args.query_prefix, passage_prefix=args.passage_prefix, batch_size=args.batch_size,
        max_length=args.max_length,
    )
    print(f"shard {args.shard}/{args.num_shards}: {meta}")


def _cmd_index_build(args: argparse.Namespace) -> None:
    from ragrl.retrieval.dense import build_faiss_index

    # Without --gpu, training still uses a GPU where faiss sees one (use_gpu=None).
    meta = build_faiss_index(args.shards, args.factory, args.out, train_sample=args.train_sample, seed=args.seed,
                             passages=args.passages, use_gpu=True if args.gpu else None)
    print(f"index written to {args.out}: {meta}")


def _cmd_index_bm25(args: argparse.Namespace) -> None:
    from ragrl.retrieval.sparse import build_bm25

    meta = build_bm25(args.passages, args.out)
    print(f"bm25 index written to {args.out}: {meta}")


def _searcher_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", type=Path, help="dense index dir (from `ragrl index build`)")
    p.add_argument("--bm25", type=Path, help="BM25 index dir (from `ragrl index bm25`)")
    p.add_argument("--mode", choices=["dense", "bm25", "hybrid"], help="default: what the given dirs allow")
    p.add_argument("--passages", type=Path,
                   help="passages parquet (default: the one the index's meta.json records)")
    p.add_argument("--gpu", action="store_true",
                   help="retrieval.gpu: the FAISS index on this job's GPUs and the query encoder on CUDA; "
                        "without a GPU, the CPU (said once)")


def _load_searcher(args: argparse.Namespace):
    from ragrl.retrieval.searcher import load_searcher

    if args.index is None and args.bm25 is None:
        raise ValueError("give --index and/or --bm25")
    return load_searcher(args.index, args.bm25, args.mode, passages=args.passages, use_gpu=args.gpu)


def _http_limit_args(p: argparse.ArgumentParser, max_body_bytes: int) -> None:
    p.add_argument("--max-body-bytes", type=int, default=max_body_bytes,
                   help="larger request bodies get 413 before they are read")
    p.add_argument("--header-timeout-s", type=float, default=10.0, help="request headers must arrive within this")
    p.add_argument("--body-timeout-s", type=float, default=30.0, help="a request body must arrive within this")


def _http_limits(args: argparse.Namespace):
    from ragrl.http_server import HttpLimits

    return HttpLimits(args.max_body_bytes, args.header_timeout_s, args.body_timeout_s)


def _cmd_serve_retriever(args: argparse.Namespace) -> None:
    from ragrl.retrieval.service import serve

    if args.index is None and args.bm25 is None:
        raise ValueError("give --index and/or --bm25")
    serve(args.index if args.index is not None else args.bm25, args.host, args.port,
          bm25_dir=args.bm25 if args.index is not None else None, mode=args.mode, max_batch=args.max_batch,
          max_topk=args.max_topk, max_queries=args.max_queries, batch_window_ms=args.batch_window_ms,
          http_limits=_http_limits(args), passages=args.passages, use_gpu=args.gpu)


def _cmd_serve_kg(args: argparse.Namespace) -> None:
    from ragrl.kg.server import kg_dirs, serve

    serve(kg_dirs(args.kg, args.dataset_name), args.host, args.port, mode=args.mode, http_limits=_http_limits(args))


def _hold_work_dir(work: Path, tag: str) -> None:
    """A resumable job takes its work directory's lock (ragrl.workdir) before it loads a model or
    starts a server, so a second job on the directory fails at once (issue 34 F6); the stage's
    prepare_work_dir keeps it."""
    from ragrl.workdir import is_main_process, lock_work_dir

    if is_main_process():
        lock_work_dir(work, tag=tag)


def _cmd_construct_kg(args: argparse.Namespace) -> None:
    from ragrl.kg.construct import ConstructSettings, construct_kg_stage

    settings = ConstructSettings(batch_size=args.batch_size, max_turn_tokens=args.max_turn_tokens,
                                 temperature=args.temperature, limit=args.limit or None, seed=args.seed)
    _hold_work_dir(args.work, "construct-kg")
    construct_kg_stage(args.passages, args.model, args.out, args.work, settings, base_url=args.base_url,
                       served_name=args.served_name)


def _cmd_graph_rank(args: argparse.Namespace) -> None:
    from ragrl.retrieval.encoder import Encoder
    from ragrl.stages.graph_rag import graph_rank

    graph_rank(args.triples, args.passages, args.qa, args.out, run_id=args.run_id, dataset=args.dataset,
               embed=Encoder(args.embedding_model).encode_queries, top_triples=args.top_triples,
               max_questions=args.max_questions or None)


def _cmd_retrieval_eval(args: argparse.Namespace) -> None:
    from ragrl.retrieval.evaluate import evaluate_retrieval, write_recall_report

    searcher = _load_searcher(args)
    rows = []
    for spec in args.qa:
        name, _, path = spec.partition("=")
        if not path:
            raise ValueError(f"--qa {spec!r}: expected NAME=PATH")
        for row in evaluate_retrieval(searcher, path, args.k):
            rows.append({"retriever": args.name, "dataset": name, **row})
            print(f"{args.name} {name} k={row['k']}: recall {row['recall']:.3f} hit {row['hit']:.3f} "
                  f"all {row['all']:.3f} (n={row['n']})")
    write_recall_report(rows, args.out)


def _cmd_retrieval_table(args: argparse.Namespace) -> None:
    from ragrl.retrieval.evaluate import recall_table

    print(recall_table(args.reports, args.out_md, args.out_csv))


def _cmd_retrieval_service_check(args: argparse.Namespace) -> None:
    from ragrl.retrieval.service_check import check_service

    index_args = [a for flag, v in (("--index", args.index), ("--bm25", args.bm25), ("--mode", args.mode))
                  if v is not None for a in (flag, str(v))] + (["--gpu"] if args.gpu else [])
    report = check_service(index_args, _load_searcher(args), args.qa, args.out, topk=args.topk)
    print(f"service check passed: {report}")


def _recipe(args: argparse.Namespace):
    from ragrl.recipe import parse_recipe

    return parse_recipe(args.recipe, args.recipe_name)


def _backends(args: argparse.Namespace) -> dict:
    """What the recipe's environment reads, from the flags the rule passed (ragrl.stages.agent)."""
    from ragrl.stages.agent import load_backends

    oracle = getattr(args, "oracle", False)
    return load_backends(index=args.index, bm25=args.bm25, mode=args.mode, passages=args.passages, gpu=args.gpu,
                         kg=args.kg, kg_mode=args.kg_mode, kg_url=args.kg_url,
                         oracle_qa=args.qa if oracle else None, ranking=getattr(args, "ranking", None))


def _cmd_sft_data(args: argparse.Namespace) -> None:
    from ragrl.stages import agent

    recipe = _recipe(args)
    agent.sft_data(recipe, args.qa, args.policy, _backends(args), args.out, limit=args.limit or None,
                   server_log=args.server_log)


def _cmd_sft(args: argparse.Namespace) -> None:
    from ragrl.stages import agent

    print(f"SFT model written to {agent.sft(_recipe(args), args.data, args.policy, args.out)}")


def _cmd_merge(args: argparse.Namespace) -> None:
    from ragrl.train.merge import merge_lora

    print(f"merged checkpoint written to {merge_lora(args.base, args.adapter, args.out)}")


def _cmd_rl(args: argparse.Namespace) -> None:
    from ragrl.stages import agent

    recipe = _recipe(args)
    # verl queries the retriever over HTTP from its own processes: it gets the index flags, not a
    # loaded searcher. What the environment reads keys the resume check by content, like the
    # policy and the QA file.
    verl = recipe.rl.get("backend") == "verl"
    _hold_work_dir(args.out, "rl")
    final = agent.rl(recipe, args.qa, args.policy, {} if verl else _backends(args), args.out,
                     limit=args.limit or None, log_out=args.log_out,
                     flags={"index": args.index, "bm25": args.bm25, "mode": args.mode, "passages": args.passages,
                            "kg": args.kg})
    print(f"RL policy written to {final}")


def _eval_datasets(args: argparse.Namespace) -> list[tuple[str, Path, dict]]:
    """(dataset, qa, backends) per --dataset. --qa, --kg and --kg-mode pair with --dataset by
    position (--kg/--kg-mode given once serve every dataset); datasets that read the same things
    share one loaded copy (the index, a KG)."""
    names, n = args.dataset, len(args.dataset)

    def per_dataset(flag: str, values: list | None, default=None) -> list:
        values = values or [default]
        if len(values) == 1:
            return values * n
        if len(values) != n:
            raise ValueError(f"{flag} given {len(values)} times for {n} --dataset ({', '.join(names)}): "
                             "give it once or once per dataset, in the same order")
        return values

    if len(args.qa) != n:
        raise ValueError(f"--qa given {len(args.qa)} times for {n} --dataset ({', '.join(names)}): one each")
    kgs, modes = per_dataset("--kg", args.kg), per_dataset("--kg-mode", args.kg_mode, "whole")
    loaded: dict[tuple, dict] = {}
    out = []
    for name, qa, kg, mode in zip(names, args.qa, kgs, modes, strict=True):
        key = (kg, mode, qa if args.oracle else None)
        if key not in loaded:
            loaded[key] = _backends(argparse.Namespace(**{**vars(args), "qa": qa, "kg": kg, "kg_mode": mode}))
        out.append((name, qa, loaded[key]))
    return out


def _cmd_eval(args: argparse.Namespace) -> None:
    from ragrl.stages import agent

    results = agent.evaluate_run(_recipe(args), args.model, _eval_datasets(args), args.out, run_id=args.run_id,
                                 max_questions=args.max_questions or None, batch_size=args.batch_size)
    for dataset, metrics in results.items():
        print(f"{args.run_id} on {dataset}: {metrics['metrics']}")


def _cmd_run_manifest(args: argparse.Namespace) -> None:
    from ragrl.stages.manifest import run_manifest

    manifest = run_manifest(args.run_id, args.recipe_name, args.model, args.stage, json.loads(args.settings),
                            json.loads(args.seeds), args.out)
    print(f"run {args.run_id}: config hash {manifest['config_hash']}, commit {manifest['git_commit']}")


def _cmd_results_build(args: argparse.Namespace) -> None:
    from ragrl.results import build_database

    benchmarks = sorted(Path(args.benchmarks_dir).rglob("*.tsv")) if args.benchmarks_dir else []
    build_database(args.db, runs=args.runs, evals=args.evals, predictions=args.predictions,
                   train_logs=args.train_logs or [], benchmarks=benchmarks, rule_gpus=json.loads(args.rule_gpus),
                   table_specs=json.loads(args.tables), main_metric=args.main_metric,
                   benchmarks_root=args.benchmarks_dir, lineage=json.loads(args.lineage))
    print(f"results database written to {args.db}")


def _cmd_results_tables(args: argparse.Namespace) -> None:
    from ragrl.results import render_delta_tables, render_tables

    specs = json.loads(args.tables)
    for path in [*render_tables(args.db, specs, args.out_dir), *render_delta_tables(args.db, specs, args.out_dir)]:
        print(f"wrote {path}")


def _cmd_results_plots(args: argparse.Namespace) -> None:
    from ragrl.results import plot_families, plot_metrics, plot_paired, plot_reward_curves, plot_training

    for path in [*plot_training(args.db, args.out_dir), plot_reward_curves(args.db, args.out_dir),
                 *(plot_metrics(args.db, args.out_dir, m) for m in args.metrics),
                 *(plot_paired(args.db, args.out_dir, m) for m in args.metrics),
                 *plot_families(args.db, args.out_dir)]:
        print(f"wrote {path}")


def _cmd_query(args: argparse.Namespace) -> None:
    from ragrl.results import query

    query(args.db, args.sql, fmt=args.format, out=args.out)


def _harr(args: argparse.Namespace):
    """The generator run's recipe (its rollout settings), HARR's settings, and the job's threads."""
    from ragrl.recipe import parse_harr
    from ragrl.stages.harr import set_threads

    set_threads(args.threads)
    return (_recipe(args) if getattr(args, "recipe", None) else None), parse_harr(args.harr)


def _harr_generator(args: argparse.Namespace):
    from ragrl.stages.harr import GeneratorSource

    return GeneratorSource(args.generator, dict(args.generator_endpoint or {}), args.server_log)


def _cmd_harr_filter(args: argparse.Namespace) -> None:
    from ragrl.stages.harr import filter_stage, served

    recipe, harr = _harr(args)
    with served(_harr_generator(args)) as generator:
        filter_stage(recipe, harr, args.qa, args.index, args.passages, generator, args.out)


def _cmd_harr_train(args: argparse.Namespace) -> None:
    from ragrl.stages.harr import served, train_stage

    _hold_work_dir(args.out_dir, "harr")
    recipe, harr = _harr(args)
    with served(_harr_generator(args)) as generator:
        final = train_stage(recipe, harr, args.qa, args.index, args.passages, generator, args.out_dir,
                            use_history=args.history, log_out=args.log_out)
    print(f"HARR encoder written to {final}")


def _cmd_harr_eval(args: argparse.Namespace) -> None:
    from ragrl.stages.harr import eval_stage, served

    recipe, harr = _harr(args)
    with served(_harr_generator(args)) as generator:
        metrics = eval_stage(recipe, harr, args.qa, args.index, args.passages, generator, args.out,
                             run_id=args.run_id, dataset=args.dataset, encoder=args.encoder,
                             use_history=args.history, max_questions=args.max_questions or None,
                             batch_size=args.batch_size)
    print(f"{args.run_id} on {args.dataset}: {metrics['metrics']}")


def _cmd_harr_recall(args: argparse.Namespace) -> None:
    from ragrl.stages.harr import recall_stage

    _, harr = _harr(args)
    recall_stage(harr, args.qa, args.index, args.passages, args.out, run_id=args.run_id, dataset=args.dataset,
                 encoder=args.encoder, use_history=args.history)


def _harr_args(p: argparse.ArgumentParser, generator: bool = True) -> None:
    if generator:
        p.add_argument("--recipe", required=True,
                       help="the generator run's recipe as one JSON object (its rollout settings)")
        p.add_argument("--recipe-name", default="recipe", help="its name in config, used in error messages")
        p.add_argument("--generator", required=True, help="the frozen generator's checkpoint: a dir or a hub id")
        p.add_argument("--generator-endpoint", type=_json_arg, default=None,
                       help="JSON: how the generator is served: {base_url, served_name?} (external OpenAI-compatible "
                            "endpoint) or {serve: true | {python, args, startup_timeout_s, served_name}} (a vLLM "
                            "server this job starts and stops); default: loaded in process (HF)")
        p.add_argument("--server-log", type=Path, help="log of the generator server this job starts (with serve)")
    p.add_argument("--harr", required=True, help="config `harr` as one JSON object (ragrl.recipe.parse_harr)")
    p.add_argument("--index", type=Path, required=True, help="the dense index dir (reused unchanged)")
    p.add_argument("--passages", type=Path, required=True, help="the passages parquet the index was built from")
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1, help="torch and FAISS threads (the job's thread count)")
    p.add_argument("--history", action=argparse.BooleanOptionalAction, default=True,
                   help="history-aware states (--no-history: the query alone, the ablation)")


def _recipe_args(p: argparse.ArgumentParser, retriever: bool = True, per_dataset: bool = False) -> None:
    p.add_argument("--recipe", required=True, help="the recipe's settings as one JSON object (from config)")
    p.add_argument("--recipe-name", default="recipe", help="its name in config, used in error messages")
    if retriever:
        _searcher_args(p)
        # Methods whose environment queries a KG (input kind "kg") get it here; `eval` takes one
        # per --dataset (each dataset may have its own KG).
        if per_dataset:
            p.add_argument("--kg", type=Path, action="append",
                           help="KG dir for the --dataset in the same position (once: for all)")
            p.add_argument("--kg-mode", choices=["whole", "subgraph"], action="append",
                           help="per --dataset like --kg (default whole)")
        else:
            p.add_argument("--kg", type=Path, help="KG dir for env kg (triples parquet dir or simple KGQA format)")
            p.add_argument("--kg-mode", choices=["whole", "subgraph"], default="whole")
        p.add_argument("--kg-url", help="a running `ragrl serve-kg` instead of an in-process KG")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("corpus", help="read a corpus in a public format into the passages parquet")
    p.add_argument("--format", nargs="+", required=True,
                   help="parquet | kilt | dpr | flashrag | hotpotqa | 2wikimultihopqa | musique: one for every input, "
                        "or one per input in order (a mixed corpus)")
    p.add_argument("--inputs", nargs="+", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--words", type=int, default=100, help="passage length in words (kilt)")
    p.add_argument("--source", help="value of the `source` column (default: the format)")
    p.add_argument("--strip-title-quotes", action="store_true",
                   help='remove one outer pair of double quotes from titles (wiki-18 writes "Title"); default: keep them')
    p.set_defaults(func=_cmd_corpus)

    p = sub.add_parser("qa", help="read a QA set in a public format into the QA parquet")
    p.add_argument("--format", nargs="+", required=True,
                   help="flashrag | hotpotqa | 2wikimultihopqa | musique | kgqa | simpleqa | truthfulqa | knowrl: one, "
                        "or one per --input in order (their questions are mixed, see ragrl.data.qa.write_qa)")
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_qa)

    p = sub.add_parser("kb", help="a knowledge base in KnowRL's SQLite schema (documents(title, text), passages "
                       "joined by their separator)")
    p.add_argument("--inputs", nargs="+", required=True,
                   help="documents: parquet (title, text), JSONL / JSON array of {title, text}, or one existing "
                        "knowledge_base.db (validated, copied as is)")
    p.add_argument("--format", choices=["parquet", "jsonl", "json", "sqlite"], help="default: from the suffix")
    p.add_argument("--tokenizer", default="words",
                   help="passage length unit: words, or a tokenizer by HF id or path (KnowRL: roberta-large)")
    p.add_argument("--max-tokens", type=int, default=256, help="longest passage (KnowRL: 256)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_kb)

    p = sub.add_parser("factscore", help="factuality of texts against a KB: JSONL {id?, topic, text} in, scores out")
    p.add_argument("--backend", choices=["embedded", "paper"], default="embedded")
    p.add_argument("--kb", type=Path, required=True)
    p.add_argument("--input", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gamma", type=int, default=10, help="length penalty: exp(1 - gamma/n) up to gamma facts")
    p.add_argument("--batch-size", type=int, default=64, help="texts per extraction batch")
    p.add_argument("--base-url", help="paper: OpenAI-compatible endpoint")
    p.add_argument("--model", help="paper: the model name the endpoint serves")
    p.add_argument("--api-key-env", help="paper: environment variable holding the API key")
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--max-retries", type=int, default=3)
    p.add_argument("--max-workers", type=int, default=8, help="concurrent requests")
    p.add_argument("--verifier", choices=["nli", "llm"], default="nli")
    p.add_argument("--nli-model", default="MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli")
    p.add_argument("--nli-threshold", type=float, default=0.3)
    p.add_argument("--ranker", default="sentence-transformers/gtr-t5-large",
                   help="dense encoder ranking the topic's passages ('' for all passages)")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--prompts-dir", type=Path, help="default resources/knowrl/prompts")
    p.set_defaults(func=_cmd_factscore)

    index = sub.add_parser("index", help="dense (FAISS) and BM25 indexes").add_subparsers(
        dest="index_command", required=True)
    p = index.add_parser("embed-shard", help="encode one contiguous shard of the passages")
    p.add_argument("--passages", type=Path, required=True)
    p.add_argument("--model", required=True, help="sentence-transformers model: HF id or local path")
    p.add_argument("--shard", type=int, required=True)
    p.add_argument("--num-shards", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--query-prefix", default="")
    p.add_argument("--passage-prefix", default="")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int)
    p.set_defaults(func=_cmd_index_embed_shard)
    p = index.add_parser("build", help="stream embedding shards into a FAISS index_factory index")
    p.add_argument("--shards", nargs="+", required=True)
    p.add_argument("--factory", default="Flat", help='faiss index_factory string: "Flat", "HNSW32", "IVF1024,PQ32"...')
    p.add_argument("--passages", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--train-sample", type=int, default=262_144)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu", action="store_true",
                   help="retrieval.gpu: train on this job's GPU; without one, the CPU (said once)")
    p.set_defaults(func=_cmd_index_build)
    p = index.add_parser("bm25", help="build a BM25 index (bm25s)")
    p.add_argument("--passages", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_index_bm25)

    p = sub.add_parser("serve-retriever", help="HTTP retrieval service (Search-R1 compatible POST /retrieve)")
    _searcher_args(p)
    p.add_argument("--host", default="127.0.0.1", help="loopback by default: the service has no authentication")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=64, help="queries per encode + search call (larger requests are split)")
    p.add_argument("--max-queries", type=int, default=4096, help="queries per request (a memory guard)")
    p.add_argument("--max-topk", type=int, default=50)
    p.add_argument("--batch-window-ms", type=float, default=0.0, help="extra wait to gather a batch; 0: batch whatever queued while the last batch ran (fastest here, docs/BENCHMARKS.md)")
    _http_limit_args(p, 8 * 1024 * 1024)
    p.set_defaults(func=_cmd_serve_retriever)

    p = sub.add_parser("serve-kg", help="HTTP KG server (KG-R1's batch POST /retrieve) over a KG directory")
    p.add_argument("--kg", type=Path, required=True, action="append",
                   help="a KG dir: triples parquet (e.g. results/world/kg/A) or the simple KGQA format; repeat for several KGs")
    p.add_argument("--dataset-name", action="append", default=[],
                   help="the dataset_name requests use for the --kg in the same position (KG-R1 sends e.g. webqsp, "
                        "CWQ); default: the directory name. With one KG, any dataset_name is accepted")
    p.add_argument("--host", default="127.0.0.1", help="loopback by default: the service has no authentication")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--mode", choices=["whole", "subgraph"], default="whole",
                   help="whole KG, or each question restricted to its subgraph (as KG-R1 does)")
    _http_limit_args(p, 4 * 1024 * 1024)
    p.set_defaults(func=_cmd_serve_kg)

    p = sub.add_parser("construct-kg", help="build a KG (triples.parquet, serve-kg's format) from every passage "
                                           "with a constructor model; resumable after a kill")
    p.add_argument("--passages", type=Path, required=True)
    p.add_argument("--model", required=True, help="the constructor: a checkpoint dir (its tokenizer is used)")
    p.add_argument("--out", type=Path, required=True, help="KG directory to write (triples.parquet, construction.json)")
    p.add_argument("--work", type=Path, required=True, help="work directory of finished batches (resume)")
    p.add_argument("--base-url", help="an OpenAI-compatible completions endpoint serving --model (default: in process)")
    p.add_argument("--served-name", help="the model name the endpoint serves (default: --model)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-turn-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--limit", type=int, help="only the first N passages (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_construct_kg)

    p = sub.add_parser("graph-rank", help="rank a corpus' passages for each question with the PPR retriever over "
                                         "a KG whose triples name their passage: ranking.parquet + metrics.json")
    p.add_argument("--triples", type=Path, required=True, help="triples.parquet with source_id (built or gold KG)")
    p.add_argument("--passages", type=Path, required=True)
    p.add_argument("--qa", type=Path, required=True, help="QA parquet with supporting_ids")
    p.add_argument("--run-id", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--embedding-model", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--top-triples", type=int, default=10)
    p.add_argument("--max-questions", type=int)
    p.set_defaults(func=_cmd_graph_rank)

    retrieval = sub.add_parser("retrieval", help="evaluate and check retrieval").add_subparsers(
        dest="retrieval_command", required=True)
    p = retrieval.add_parser("eval", help="recall/hit/all@k of supporting passages on QA sets")
    _searcher_args(p)
    p.add_argument("--name", required=True, help="retriever name in the report")
    p.add_argument("--qa", nargs="+", required=True, metavar="NAME=PATH")
    p.add_argument("--k", nargs="+", type=int, default=[1, 5, 10])
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_retrieval_eval)
    p = retrieval.add_parser("table", help="collect eval reports into one markdown + CSV table")
    p.add_argument("--reports", nargs="+", required=True)
    p.add_argument("--out-md", type=Path, required=True)
    p.add_argument("--out-csv", type=Path, required=True)
    p.set_defaults(func=_cmd_retrieval_table)
    p = retrieval.add_parser("service-check", help="start the service, query it like Search-R1, compare, stop it")
    _searcher_args(p)
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_retrieval_service_check)

    p = sub.add_parser("sft-data", help="cold-start SFT data: gold, teacher or imported trajectories (sft.source)")
    _recipe_args(p)
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--policy", type=Path, required=True, help="model dir whose tokenizer and template are used")
    p.add_argument("--limit", type=int)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--server-log", type=Path,
                   help="log of a teacher server this job starts (sft.teacher without base_url); default "
                        "logs/serve/<recipe>.teacher.log")
    p.set_defaults(func=_cmd_sft_data)

    p = sub.add_parser("sft", help="supervised fine-tuning (TRL SFTTrainer, loss on generated tokens only)")
    _recipe_args(p, retriever=False)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--policy", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_sft)

    p = sub.add_parser("merge", help="fold a LoRA adapter into a full HF checkpoint (a full model is copied)")
    p.add_argument("--base", type=Path, required=True)
    p.add_argument("--adapter", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_merge)

    p = sub.add_parser("rl", help="RL (GRPO / PPO-clip / PPO with a critic) of the agent on accelerate; resumes from checkpoints")
    _recipe_args(p)
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--policy", type=Path, required=True)
    p.add_argument("--limit", type=int)
    p.add_argument("--out", type=Path, required=True, help="training dir: checkpoints/, train_log.jsonl, final/")
    p.add_argument("--log-out", type=Path, help="where to copy the finished training log")
    p.set_defaults(func=_cmd_rl)

    p = sub.add_parser("eval", help="roll out a checkpoint on QA sets: <out>/<dataset>/predictions.parquet + "
                       "metrics.json for each --dataset")
    _recipe_args(p, per_dataset=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--dataset", required=True, action="append", help="a dataset name (repeat for several)")
    p.add_argument("--qa", type=Path, required=True, action="append",
                   help="the QA parquet of the --dataset in the same position")
    p.add_argument("--max-questions", type=int)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", type=Path, required=True, help="the run's evaluation dir")
    p.add_argument("--oracle", action="store_true",
                   help="oracle retrieval: every query gets its question's supporting passages (from --passages)")
    p.add_argument("--ranking", type=Path,
                   help="ranking.parquet (id, passage_ids): every query gets its question's ranked passages")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("harr-filter", help="HARR: G stochastic rollouts per question with the initial encoder; "
                       "keep the questions whose F1 varies")
    _harr_args(p)
    p.add_argument("--out", type=Path, required=True, help="the kept QA rows (parquet); stats next to it")
    p.set_defaults(func=_cmd_harr_filter)

    p = sub.add_parser("harr-train", help="HARR: GRPO over retrieval steps for the query encoder; resumes")
    _harr_args(p)
    p.add_argument("--out-dir", type=Path, required=True, help="checkpoints/, train_log.jsonl, final/encoder")
    p.add_argument("--log-out", type=Path, help="where to copy the finished training log")
    p.set_defaults(func=_cmd_harr_train)

    p = sub.add_parser("harr-eval", help="HARR: the frozen generator with an encoder, deterministic top-k: "
                       "predictions.parquet + metrics.json")
    _harr_args(p)
    p.add_argument("--encoder", type=Path, help="a trained encoder dir (default: the index's own, frozen)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--max-questions", type=int)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", type=Path, required=True, help="output dir")
    p.set_defaults(func=_cmd_harr_eval)

    p = sub.add_parser("harr-recall", help="HARR: an encoder's recall@k / all@k on the multi-hop questions")
    _harr_args(p, generator=False)
    p.add_argument("--encoder", type=Path, help="a trained encoder dir (default: the index's own, frozen)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--out", type=Path, required=True, help="metrics.json of dataset <dataset>_multihop")
    p.set_defaults(func=_cmd_harr_recall)

    p = sub.add_parser("run-manifest", help="write run.json (run id, recipe, model, config hash, commit, seeds)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--recipe-name", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--stage", required=True)
    p.add_argument("--settings", required=True, help="JSON object: everything that defines the run")
    p.add_argument("--seeds", required=True, help="JSON object")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_run_manifest)

    results = sub.add_parser("results", help="the DuckDB results database, tables and plots").add_subparsers(
        dest="results_command", required=True)
    p = results.add_parser("build", help="build results/ragrl.duckdb from the workflow's output files")
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--runs", nargs="+", required=True, help="run.json files")
    p.add_argument("--evals", nargs="+", required=True, help="metrics.json files")
    p.add_argument("--predictions", nargs="+", required=True, help="predictions.parquet files")
    p.add_argument("--train-logs", nargs="*", help="train_log.jsonl files")
    p.add_argument("--benchmarks-dir", type=Path, help="Snakemake benchmark files (*.tsv) under this dir")
    p.add_argument("--rule-gpus", default="{}", help="JSON: rule → GPUs it requests (for GPU-hours)")
    p.add_argument("--tables", default="[]", help="JSON list of table specs (views table_<name>)")
    p.add_argument("--main-metric", default="em")
    p.add_argument("--lineage", default="{}", help="JSON: run → {family, step, start_run, variant_of, ablation_of}, "
                   "what the paired comparisons come from (ragrl.results.paired)")
    p.set_defaults(func=_cmd_results_build)
    p = results.add_parser("tables", help="paper-style tables (md, csv, tex) from table specs, and each "
                           "table's paired differences (<name>_delta.md, .csv)")
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--tables", required=True, help="JSON list of table specs")
    p.add_argument("--out-dir", type=Path, required=True)
    p.set_defaults(func=_cmd_results_tables)
    p = results.add_parser("plots", help="training and reward curves, runs per family with intervals, "
                           "paired differences (PNG)")
    p.add_argument("--db", type=Path, required=True)
    p.add_argument("--metrics", nargs="+", default=["em"])
    p.add_argument("--out-dir", type=Path, required=True)
    p.set_defaults(func=_cmd_results_plots)

    p = sub.add_parser("query", help="run SQL on the results database (read-only)")
    p.add_argument("sql")
    p.add_argument("--db", type=Path, default=Path("results/ragrl.duckdb"))
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--out", type=Path, help="output file (required for parquet)")
    p.set_defaults(func=_cmd_query)

    p = sub.add_parser("world", help="generate the synthetic world (passages, QA, KGs, KB)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--size", default="tiny", help="tiny | small | medium | bench, or a number of people")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_world)

    model = sub.add_parser("model", help="build, check and smoke-test models").add_subparsers(
        dest="model_command", required=True)
    p = model.add_parser("tiny", help="train the tiny tokenizer on a world and build the tiny Qwen2 policy")
    p.add_argument("--world", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    _add_tiny_spec_args(p)
    p.set_defaults(func=_cmd_model_tiny)

    p = sub.add_parser("pretrain", help="train the tiny policy's tokenizer and pretrain it to read (fresh-name corpus)")
    p.add_argument("--world", type=Path, required=True, help="the evaluation world: its names are kept out")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--plot", type=Path, help="write the loss / reading-probe curve here (PNG)")
    p.add_argument("--settings", help="PretrainArgs as a JSON object, e.g. '{\"steps\": 2000}'")
    p.add_argument("--cache", type=Path, help="pretrained models by cache key (resources/pretrained): "
                   "a model with this spec, settings and world is copied from there instead of retrained")
    p.add_argument("--write-cache", action="store_true", help="add a newly pretrained model to --cache")
    _add_tiny_spec_args(p)
    p.set_defaults(func=_cmd_pretrain)

    p = model.add_parser("generate", help="load a model dir with Auto* classes and generate (smoke test)")
    p.add_argument("--model", required=True)
    p.add_argument("--prompt", default="Where was")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    p.set_defaults(func=_cmd_model_generate)

    p = model.add_parser("check", help="say how model names resolve here (built-in, path, packaged, hub)")
    p.add_argument("names", nargs="+")
    p.add_argument("--key", default="model")
    p.set_defaults(func=_cmd_model_check)
    return parser


def _quiet_library_progress_bars() -> None:
    # transformers/hub draw tqdm bars with carriage returns; in a log file they are noise.
    if not sys.stderr.isatty():
        import os

        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")


def _end_logs_with_newline() -> None:
    """A job log (`> log 2>&1`) ends with a newline whatever wrote to it last: a progress bar
    closed with a carriage return at exit, or a library message without one, would otherwise
    leave the last line unterminated (tail, grep and the next appended run all suffer)."""
    import os
    import stat

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for fd in (1, 2):
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            # The descriptor is usually write-only; read the file through its /proc link (Linux).
            with open(f"/proc/self/fd/{fd}", "rb") as fh:
                if fh.seek(0, os.SEEK_END) == 0:
                    continue
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    os.write(fd, b"\n")
        except OSError:
            continue


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    # Registered first, so it runs after the exit handlers libraries register while the command runs.
    atexit.register(_end_logs_with_newline)
    _quiet_library_progress_bars()
    # The first log line is the command itself, so a log is enough to re-run a job by hand
    # (stderr for `query`, whose stdout is data a user may pipe).
    echo = sys.stderr if args.command == "query" else sys.stdout
    print("$ ragrl " + " ".join(shlex.quote(a) for a in argv), file=echo, flush=True)
    try:
        args.func(args)
    except Exception as exc:
        if not isinstance(exc, _user_facing_errors()):
            raise
        print(f"ragrl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


# Expected, user-facing failures: bad input or config, a work directory another job holds, a judge
# or fact endpoint that answered nothing usable. One clear line, no traceback. Found in sys.modules
# so that no command pays for importing a module it never used (an error of one was never raised).
_USER_FACING = (("ragrl.workdir", "WorkDirBusy"), ("ragrl.factscore.paper", "EndpointError"),
                ("ragrl.rewards.autograph", "JudgeError"))


def _user_facing_errors() -> tuple[type[BaseException], ...]:
    found = [getattr(sys.modules[m], name) for m, name in _USER_FACING if m in sys.modules]
    return (ValueError, FileNotFoundError, ImportError, *found)


if __name__ == "__main__":
    sys.exit(main())
