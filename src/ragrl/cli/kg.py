"""`ragrl serve-kg | construct-kg | graph-rank`: knowledge graphs, served, built and ranked over."""

from __future__ import annotations

import argparse
from pathlib import Path

from ragrl.cli.common import hold_work_dir, http_limit_args, http_limits


def _cmd_serve_kg(args: argparse.Namespace) -> None:
    from ragrl.kg.server import kg_dirs, serve

    serve(kg_dirs(args.kg, args.dataset_name), args.host, args.port, mode=args.mode, http_limits=http_limits(args))


def _cmd_construct_kg(args: argparse.Namespace) -> None:
    from ragrl.kg.construct import ConstructSettings, construct_kg_stage

    settings = ConstructSettings(batch_size=args.batch_size, max_turn_tokens=args.max_turn_tokens,
                                 temperature=args.temperature, limit=args.limit or None, seed=args.seed,
                                 system_prompt=args.system_prompt or None)
    hold_work_dir(args.work, "construct-kg")
    construct_kg_stage(args.passages, args.model, args.out, args.work, settings, base_url=args.base_url,
                       served_name=args.served_name)


def _cmd_graph_rank(args: argparse.Namespace) -> None:
    from ragrl.retrieval.encoder import Encoder
    from ragrl.stages.graph_rag import graph_rank

    graph_rank(args.triples, args.passages, args.qa, args.out, run_id=args.run_id, dataset=args.dataset,
               embed=Encoder(args.embedding_model).encode_queries, top_triples=args.top_triples,
               max_questions=args.max_questions or None)


def register(sub: argparse._SubParsersAction) -> None:
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
    http_limit_args(p, 4 * 1024 * 1024)
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
    # nargs "?": the workflow passes the flag with an empty value for ragrl's prompt, and Snakemake
    # quotes an empty string as nothing at all.
    p.add_argument("--system-prompt", nargs="?", const="", default="",
                   help="the constructor's system message (absent or empty: ragrl's; AutoGraph-R1's own is "
                        "their DEFAULT_SYSTEM_CONTENT)")
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
