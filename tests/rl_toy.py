"""Toy RL task for the trainer tests: importable by the tests and runnable as a script (for the
subprocess resume test and `accelerate launch`).

Task: sample a few tokens after a short prompt; reward 1.0 if the target token appears. A tiny
random model gives every token roughly the same small probability, so learning shows up as a
clear rise of the success rate within a few dozen steps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import string
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from ragrl.toy.tiny_model import TinyModelSpec, build_tiny
from ragrl.train.rl import RLConfig, Sample, train_rl

SPEC = TinyModelSpec(
    vocab_size=400,
    hidden_size=128,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    intermediate_size=256,
    max_position_embeddings=256,
    seed=0,
)


@contextlib.contextmanager
def one_torch_thread():
    """One intra-op thread while a test module runs: on 2 shared cores a second thread per process
    only adds contention, and the subprocesses such tests compare against run with one thread too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tiny_qwen2(tied: bool, vocab: int = 97, seed: int = 0, attn: str | None = None, cls=None, **extra):
    """A seeded two-layer Qwen2 small enough for exact comparisons of log-prob paths."""
    import transformers

    config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=64, tie_word_embeddings=tied, pad_token_id=0, **extra)
    if attn is not None:
        config._attn_implementation = attn
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (cls or transformers.Qwen2ForCausalLM)(config)
    assert cls is not None or (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    return model


def logp_loss_grads(model, batch, chunk: int, temperature: float = 0.7, loss_agg: str = "token-mean"):
    """A micro-batch's response log-probs, a clipped policy loss with a KL term over them, and every
    parameter's gradient of it: what two log-prob paths must agree on."""
    import contextlib

    from ragrl.train.losses import policy_loss
    from ragrl.train.rl import response_logprobs

    model.zero_grad()
    logp, _ = response_logprobs(model, batch, temperature, chunk, False, contextlib.nullcontext)
    old = logp.detach() - 0.05
    adv = torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape)
    loss, _ = policy_loss(logp, old, adv, batch["loss_mask"], clip_low=0.2, clip_high=0.2, loss_agg=loss_agg,
                          ref_logp=old + 0.1, kl_coef=0.1)
    loss.backward()
    return logp.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def corpus(n: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lexicon = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 6))) for _ in range(300)]
    return [" ".join(rng.choice(lexicon) for _ in range(10)) + "." for _ in range(n)]


def build_model(out_dir: str | Path) -> Path:
    return build_tiny(corpus(), out_dir, SPEC)


def make_prompts(model_dir: str | Path, n: int = 8) -> list[dict]:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = [" ".join(line.split()[:3]) for line in corpus()[:n]]
    return [{"text": t, "prompt_ids": tok(t).input_ids} for t in texts]


def make_rollout(targets: int | list[int], max_new_tokens: int = 6, block_at_step: int | None = None):
    """rollout_fn sampling `max_new_tokens` tokens (temperature 1, no top-k/top-p, so the sampling
    distribution is exactly the one the trainer scores); reward 1.0 if any target token appears."""
    targets = {targets} if isinstance(targets, int) else set(targets)

    def rollout(batch_prompts: list[dict], group_size: int, model, step: int) -> list[Sample]:
        if block_at_step is not None and step >= block_at_step:
            time.sleep(3600)  # the resume test kills the process while it waits here
        pad = model.generation_config.pad_token_id
        eos = set(model.generation_config.eos_token_id)
        width = max(len(p["prompt_ids"]) for p in batch_prompts)
        ids = torch.full((len(batch_prompts), width), pad, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, p in enumerate(batch_prompts):
            ids[i, width - len(p["prompt_ids"]) :] = torch.tensor(p["prompt_ids"])
            att[i, width - len(p["prompt_ids"]) :] = 1
        out = model.generate(
            # On the model's device: scripts/gpu_check.py runs this rollout on a GPU.
            input_ids=ids.repeat_interleave(group_size, 0).to(model.device),
            attention_mask=att.repeat_interleave(group_size, 0).to(model.device),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
        )
        samples = []
        for row in range(out.shape[0]):
            group = row // group_size
            response = out[row, width:].tolist()
            for k, tok in enumerate(response):
                if tok in eos:  # keep the stop token: the policy chose it
                    response = response[: k + 1]
                    break
            samples.append(
                Sample(
                    prompt_ids=list(batch_prompts[group]["prompt_ids"]),
                    response_ids=response,
                    loss_mask=[1] * len(response),
                    turn_index=[0] * len(response),
                    reward=float(any(t in targets for t in response)),
                    group=group,
                    stats={"searches": sum(t in targets for t in response)},
                )
            )
        return samples

    return rollout


def initial_token_probs(model_dir: str | Path, prompts: list[dict]) -> torch.Tensor:
    """Mean next-token distribution after the prompts under the initial model."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        probs = [model(torch.tensor([p["prompt_ids"]])).logits[0, -1].softmax(-1) for p in prompts]
    return torch.stack(probs).mean(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", required=True, help="token id(s), comma-separated")
    ap.add_argument("--config", default="{}", help="JSON overrides of RLConfig")
    ap.add_argument("--block-at-step", type=int, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = RLConfig.from_dict(json.loads(args.config))
    prompts = make_prompts(args.model)
    rollout = make_rollout([int(t) for t in args.target.split(",")], block_at_step=args.block_at_step)
    final = train_rl(args.model, None, prompts, rollout, cfg, args.out)
    print(f"FINAL {final}", file=sys.stderr)


if __name__ == "__main__":
    main()
