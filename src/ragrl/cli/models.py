"""`ragrl world | model ... | pretrain`: the synthetic world, the tiny policy, and model checks."""

from __future__ import annotations

import argparse
from pathlib import Path

from ragrl.cli.common import json_arg


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
    settings = PretrainArgs(**json_arg(args.settings)) if args.settings else PretrainArgs()
    out = pretrain(args.world, args.out, spec, settings, cache_dir=args.cache, write_cache=args.write_cache)
    if args.plot:
        plot_pretraining(out / "pretrain_log.jsonl", args.plot)
    print(f"pretrained tiny policy written to {out}")


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


def register(sub: argparse._SubParsersAction) -> None:
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
