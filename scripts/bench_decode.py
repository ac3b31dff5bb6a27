"""Where HF generation time goes on the tiny policy: prefill against decode in a real evaluation
job, and what one decode step costs.

    python scripts/bench_decode.py --eval-log logs/eval/kg_r1_rl.log --dataset world_kgqa_B_test
    python scripts/bench_decode.py --model results/models/kg_r1/rl_merged --batch 100 --context 1000

With `--eval-log`, re-runs the `ragrl eval` command a finished run logged (first line of the log),
for one of its datasets, output to a temp dir, with forward hooks on the model that time each
forward pass: more than one new token per row is a prefill (the whole context again, each turn),
one is a decode step. The loop timed is the one the job runs: ragrl's (which prefills only what
the previous turn did not leave in its cache), or transformers' `generate` with
RAGRL_HF_DECODE=transformers; the padding counts are of the contexts handed to either. Without
it, times decode steps of `--batch` rows over a KV cache of `--context` positions (ragrl's
growing cache, as `HFGenerator` uses), and one layer's attention over the same cache with SDPA
and with matmul + softmax, and the bytes of K and V that attention reads per step. One thread,
as the workflow's jobs run. JSON to `--out` (default stdout).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from benchlib import emit_json, logged_command, machine_info, with_option

from ragrl.agent import generation


def eval_split(log: str, dataset: str) -> dict:
    """Prefill and decode time of the logged eval command's rollouts on `dataset`."""
    from ragrl.cli import main

    argv = logged_command(Path(log), "eval")
    # --qa, --kg and --kg-mode pair with --dataset by position (ragrl.cli): keep the asked one's block
    blocks, rest, i = {}, [], 0
    while i < len(argv):
        if argv[i] == "--dataset":
            j = i + 2
            while j < len(argv) and argv[j] in ("--qa", "--kg", "--kg-mode"):
                j += 2
            blocks[argv[i + 1]] = argv[i:j]
            i = j
        else:
            rest.append(argv[i])
            i += 1
    if dataset not in blocks:
        raise SystemExit(f"{log}: no --dataset {dataset} in its command (has {sorted(blocks)})")
    rest = with_option(rest, "--out", tempfile.mkdtemp(prefix="bench-decode-"))
    stats = collections.defaultdict(lambda: {"calls": 0, "s": 0.0, "tokens": 0})
    padded = {"prompt_tokens": 0, "pad_tokens": 0}
    inner = {name: getattr(generation.HFGenerator, name) for name in ("_generate_chunk", "_decode")}

    def timed(name, self, prompts, *args, **kwargs):
        if not getattr(self.model, "_bench_hooked", False):
            def before(module, args, kwargs):
                module._bench = (time.perf_counter(), tuple(kwargs["input_ids"].shape))

            def after(module, args, kwargs, output):
                started, shape = module._bench
                s = stats["prefill" if shape[1] > 1 else "decode"]
                s["calls"] += 1
                s["s"] += time.perf_counter() - started
                s["tokens"] += shape[0] * shape[1]

            self.model.register_forward_pre_hook(before, with_kwargs=True)
            self.model.register_forward_hook(after, with_kwargs=True)
            self.model._bench_hooked = True
        widths = [len(p) for p in prompts]
        padded["prompt_tokens"] += sum(widths)
        padded["pad_tokens"] += max(widths) * len(widths) - sum(widths)
        return inner[name](self, prompts, *args, **kwargs)

    for name in inner:
        setattr(generation.HFGenerator, name, lambda self, *a, _name=name, **kw: timed(_name, self, *a, **kw))
    started = time.perf_counter()
    try:
        main(rest + blocks[dataset])
    except SystemExit as exit:
        if exit.code not in (0, None):
            raise
    finally:
        for name, method in inner.items():
            setattr(generation.HFGenerator, name, method)
    wall = time.perf_counter() - started
    return {"log": log, "dataset": dataset, "job_s": round(wall, 1), **padded,
            **{k: {**v, "s": round(v["s"], 1)} for k, v in stats.items()}}


def decode_step(model_dir: str, batch: int, context: int, steps: int) -> dict:
    """ms per decode step of the whole model, and one layer's attention alone, at batch x context."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    cfg = model.config
    ids = torch.randint(5, cfg.vocab_size, (batch, context))
    mask = torch.ones(batch, context + steps + 4, dtype=torch.long)
    with torch.no_grad():
        cache = generation.growing_cache(cfg)
        for start in range(0, context, 128):  # fill the cache in chunks: a full prefill is the slow part
            end = min(context, start + 128)
            out = model(input_ids=ids[:, start:end], attention_mask=mask[:, :end], past_key_values=cache,
                        use_cache=True, cache_position=torch.arange(start, end))
        token = out.logits[:, -1:].argmax(-1)

        def step(at: int) -> None:
            model(input_ids=token, attention_mask=mask[:, :at + 1], past_key_values=cache, use_cache=True,
                  cache_position=torch.tensor([at]))

        step(context)
        started = time.perf_counter()
        for k in range(steps):
            step(context + 1 + k)
        step_ms = (time.perf_counter() - started) / steps * 1000
        layer = cache.layers[0]
        keys, values = layer.keys, layer.values  # views into the growing buffer, as attention gets them
        query = torch.randn(batch, cfg.num_attention_heads, 1, keys.shape[-1])
        if cfg.num_key_value_heads != cfg.num_attention_heads:
            rep = cfg.num_attention_heads // cfg.num_key_value_heads
            keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)

        def timed(fn, n: int = 20) -> float:
            fn()
            started = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - started) / n * 1000

        sdpa_ms = timed(lambda: torch.nn.functional.scaled_dot_product_attention(query, keys, values))
        scale = keys.shape[-1] ** -0.5
        matmul_ms = timed(lambda: torch.softmax(query @ keys.transpose(-1, -2) * scale, -1) @ values)
    kv_mb = 2 * keys.numel() * keys.element_size() / 2**20
    return {"model": model_dir, "batch": batch, "context": keys.shape[-2], "decode_step_ms": round(step_ms, 1),
            "layers": cfg.num_hidden_layers, "attention_layer_ms": {"sdpa": round(sdpa_ms, 2), "matmul_softmax": round(matmul_ms, 2)},
            "attention_share_of_step": round(cfg.num_hidden_layers * sdpa_ms / step_ms, 2),
            "kv_read_mb_per_layer": round(kv_mb, 1), "kv_read_gb_per_s": round(kv_mb / 1024 / (sdpa_ms / 1000), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-log", help="a finished eval job's log: split its generation into prefill and decode")
    parser.add_argument("--dataset", help="with --eval-log: which of its datasets")
    parser.add_argument("--model", default="results/models/kg_r1/rl_merged")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.eval_log:
        if not args.dataset:
            parser.error("--eval-log needs --dataset")
        result = eval_split(args.eval_log, args.dataset)
    else:
        result = decode_step(args.model, args.batch, args.context, args.steps)
    print(f"[bench-decode] {result}", file=sys.stderr, flush=True)
    emit_json({"machine": machine_info(["torch", "transformers"]), "result": result}, args.out)


if __name__ == "__main__":
    main()
