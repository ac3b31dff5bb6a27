"""Arguments and helpers more than one command group shares: the searcher flags, the HTTP
limits, the recipe, a work directory's lock."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragrl.errors import InputError


def json_arg(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise InputError(f"expected a JSON object, got {text!r}")
    return value


def searcher_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", type=Path, help="dense index dir (from `ragrl index build`)")
    p.add_argument("--bm25", type=Path, help="BM25 index dir (from `ragrl index bm25`)")
    p.add_argument("--mode", choices=["dense", "bm25", "hybrid"], help="default: what the given dirs allow")
    p.add_argument("--passages", type=Path,
                   help="passages parquet (default: the one the index's meta.json records)")
    p.add_argument("--gpu", action="store_true",
                   help="retrieval.gpu: the FAISS index on this job's GPUs and the query encoder on CUDA; "
                        "without a GPU, the CPU (said once)")


def open_searcher(args: argparse.Namespace):
    from ragrl.retrieval.searcher import load_searcher

    if args.index is None and args.bm25 is None:
        raise InputError("give --index and/or --bm25")
    return load_searcher(args.index, args.bm25, args.mode, passages=args.passages, use_gpu=args.gpu)


def http_limit_args(p: argparse.ArgumentParser, max_body_bytes: int) -> None:
    p.add_argument("--max-body-bytes", type=int, default=max_body_bytes,
                   help="larger request bodies get 413 before they are read")
    p.add_argument("--header-timeout-s", type=float, default=10.0, help="request headers must arrive within this")
    p.add_argument("--body-timeout-s", type=float, default=30.0, help="a request body must arrive within this")


def http_limits(args: argparse.Namespace):
    from ragrl.http_server import HttpLimits

    return HttpLimits(args.max_body_bytes, args.header_timeout_s, args.body_timeout_s)


def hold_work_dir(work: Path, tag: str) -> None:
    """A resumable job takes its work directory's lock (ragrl.workdir) before it loads a model or
    starts a server, so a second job on the directory fails at once (issue 34 F6); the stage's
    prepare_work_dir keeps it."""
    from ragrl.workdir import is_main_process, lock_work_dir

    if is_main_process():
        lock_work_dir(work, tag=tag)


def load_recipe(args: argparse.Namespace):
    from ragrl.recipe import parse_recipe

    return parse_recipe(args.recipe, args.recipe_name)
