"""Peak CPU memory of one RL micro-batch's log-probs + policy loss + backward, with the logits at once
(rl.logprob_chunk_tokens 0) and in chunks (issue #38).

A one-layer Qwen2 with Qwen2.5's 151,936-token vocabulary and a narrow body (hidden 64), so the
logits are nearly all of the memory, as they were on the GPU. Each setting runs in its own
process; the figure is the process's peak resident memory (VmHWM) minus its resident memory just
before the pass, so the model, the batch and the libraries are not counted. A figure for the
record, not a test: CPU allocators return memory lazily, so it is an upper bound.

    .venv/bin/python scripts/bench_logprob_chunks.py --rows 8 --response 128 --chunks 0 1024 256
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys

VOCAB = 151_936


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def one(rows: int, response: int, prompt: int, chunk: int) -> dict:
    import torch
    import transformers

    from ragrl.train.losses import policy_loss
    from ragrl.train.rl import Sample, collate, response_logprobs

    torch.set_num_threads(1)
    config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                                      max_position_embeddings=prompt + response, tie_word_embeddings=True,
                                      pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).train()
    g = torch.Generator().manual_seed(1)

    def batch_of(n_rows: int, n_response: int) -> dict:
        return collate([Sample(prompt_ids=torch.randint(1, VOCAB, (prompt,), generator=g).tolist(),
                               response_ids=torch.randint(1, VOCAB, (n_response,), generator=g).tolist(),
                               loss_mask=[1] * n_response, turn_index=[0] * n_response, reward=0.0, group=0)
                        for _ in range(n_rows)], 0)

    # A warm-up pass on one short row, so that library start-up and the parameters' gradient
    # buffers are not counted as the pass's.
    logp, _ = response_logprobs(model, batch_of(1, 2), 1.0, chunk, False, contextlib.nullcontext)
    logp.sum().backward()
    batch = batch_of(rows, response)
    model.zero_grad(set_to_none=False)
    before = _status_kib("VmRSS")
    logp, _ = response_logprobs(model, batch, 1.0, chunk, False, contextlib.nullcontext)
    loss, _ = policy_loss(logp, logp.detach(), torch.ones_like(logp), batch["loss_mask"], clip_low=0.2,
                          clip_high=0.2, loss_agg="token-mean")
    loss.backward()
    peak = _status_kib("VmHWM")
    return {"rows": rows, "response": response, "chunk": chunk, "vocab": VOCAB,
            "full_logits_fp32_mib": rows * response * VOCAB * 4 / 2**20,
            "peak_over_start_mib": (peak - before) / 1024, "loss": float(loss)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 1024, 256])
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(args.rows, args.response, args.prompt, args.one)))
        return
    for chunk in args.chunks:
        # A fresh process per setting: VmHWM only ever rises within one.
        out = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--response", str(args.response),
                              "--prompt", str(args.prompt), "--one", str(chunk)],
                             check=True, capture_output=True, text=True)
        print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
