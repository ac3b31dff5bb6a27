"""`ragrl corpus | qa | kb | factscore`: public formats into the workflow's own files, and
factuality against a knowledge base."""

from __future__ import annotations

import argparse
from pathlib import Path

from ragrl.errors import InputError


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
            raise InputError("--backend paper needs --base-url and --model (an OpenAI-compatible endpoint)")
        endpoint = ChatEndpoint(args.base_url, args.model, timeout_s=args.timeout_s, max_retries=args.max_retries,
                                max_workers=args.max_workers,
                                api_key=os.environ.get(args.api_key_env) if args.api_key_env else None)
        scorer = PaperFactScorer(args.kb, endpoint, entailment=NLIModel(args.nli_model) if args.verifier == "nli" else None,
                                 threshold=args.nli_threshold, ranker=DenseRanker(args.ranker) if args.ranker else None,
                                 top_k=args.top_k, gamma=args.gamma, prompts_dir=args.prompts_dir)
    print(f"factscore: {score_file(scorer, args.input, args.out, args.batch_size)}")


def register(sub: argparse._SubParsersAction) -> None:
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
