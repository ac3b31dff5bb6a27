"""`ragrl index ...`, `serve-retriever` and `retrieval ...`: build, serve, evaluate and check
retrieval."""

from __future__ import annotations

import argparse
from pathlib import Path

from ragrl.cli.common import http_limit_args, http_limits, open_searcher, searcher_args
from ragrl.errors import InputError


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


def _cmd_serve_retriever(args: argparse.Namespace) -> None:
    from ragrl.retrieval.service import serve

    if args.index is None and args.bm25 is None:
        raise InputError("give --index and/or --bm25")
    serve(args.index if args.index is not None else args.bm25, args.host, args.port,
          bm25_dir=args.bm25 if args.index is not None else None, mode=args.mode, max_batch=args.max_batch,
          max_topk=args.max_topk, max_queries=args.max_queries, batch_window_ms=args.batch_window_ms,
          http_limits=http_limits(args), passages=args.passages, use_gpu=args.gpu)


def _cmd_retrieval_eval(args: argparse.Namespace) -> None:
    from ragrl.retrieval.evaluate import evaluate_retrieval, write_recall_report

    searcher = open_searcher(args)
    rows = []
    for spec in args.qa:
        name, _, path = spec.partition("=")
        if not path:
            raise InputError(f"--qa {spec!r}: expected NAME=PATH")
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
    report = check_service(index_args, open_searcher(args), args.qa, args.out, topk=args.topk)
    print(f"service check passed: {report}")


def register_indexes(sub: argparse._SubParsersAction) -> None:
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
    searcher_args(p)
    p.add_argument("--host", default="127.0.0.1", help="loopback by default: the service has no authentication")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=64, help="queries per encode + search call (larger requests are split)")
    p.add_argument("--max-queries", type=int, default=4096, help="queries per request (a memory guard)")
    p.add_argument("--max-topk", type=int, default=50)
    p.add_argument("--batch-window-ms", type=float, default=0.0, help="extra wait to gather a batch; 0: batch whatever queued while the last batch ran (fastest here, docs/BENCHMARKS.md)")
    http_limit_args(p, 8 * 1024 * 1024)
    p.set_defaults(func=_cmd_serve_retriever)



def register_checks(sub: argparse._SubParsersAction) -> None:
    retrieval = sub.add_parser("retrieval", help="evaluate and check retrieval").add_subparsers(
        dest="retrieval_command", required=True)
    p = retrieval.add_parser("eval", help="recall/hit/all@k of supporting passages on QA sets")
    searcher_args(p)
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
    searcher_args(p)
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_retrieval_service_check)
