"""The `ragrl` command line: one sub-command per workflow stage.

Every Snakemake rule calls exactly one of these, so the command in a rule's log can be re-run by
hand. This module only parses arguments and calls stage functions; it holds no logic of its own.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def _cmd_world(args: argparse.Namespace) -> None:
    from ragrl.toy.world import generate_world, write_world

    world = generate_world(args.seed, args.size)
    manifest = write_world(world, args.out)
    print(f"world written to {args.out}: {manifest['passages']} passages, {manifest['facts']} facts, "
          f"questions {manifest['questions']}")


def _cmd_model_tiny(args: argparse.Namespace) -> None:
    from ragrl.toy.tiny_model import TinyModelSpec, build_tiny
    from ragrl.toy.world import world_text

    spec = TinyModelSpec(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_layers=args.num_layers,
        num_heads=args.num_heads, num_kv_heads=args.num_kv_heads, intermediate_size=args.intermediate_size,
        seed=args.seed,
    )
    out = build_tiny(world_text(args.world), args.out, spec)
    print(f"tiny policy written to {out}")


def _cmd_model_generate(args: argparse.Namespace) -> None:
    from ragrl.io import write_text
    from ragrl.toy.tiny_model import generate_text

    text = generate_text(args.model, args.prompt, max_new_tokens=args.max_new_tokens, seed=args.seed)
    print(f"prompt: {args.prompt!r}\ncompletion: {text!r}")
    if args.out:
        write_text(text + "\n", args.out)


def _cmd_model_check(args: argparse.Namespace) -> None:
    from ragrl.models import check_model_name

    for name in args.names:
        print(f"{name}: {check_model_name(name, key=args.key)}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

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
    p.add_argument("--vocab-size", type=int, default=2000)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=688)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_model_tiny)

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    _quiet_library_progress_bars()
    # The first log line is the command itself, so a log is enough to re-run a job by hand.
    print("$ ragrl " + " ".join(shlex.quote(a) for a in argv), flush=True)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        # Expected, user-facing failures (bad input, bad config): one clear line, no traceback.
        print(f"ragrl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
