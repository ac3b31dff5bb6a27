"""The GPU paths of ragrl, run once on a real GPU (scripts/gpu_check.sh runs every part; docs/GPU.md).

Parts, each writing one JSON file (`--json`), so that a part that fails or lacks a package does
not hide the others' figures:
  model      a randomly initialised model of Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads,
             2 KV heads, MLP 4864, vocab 151936, tied embeddings) with a small BPE tokenizer: no
             network, no download; the shape is what costs memory and time.
  sft        ragrl.train.sft.train_sft: a few CUDA steps in bf16 (TRL SFTTrainer).
  rl         ragrl.train.rl.train_rl: a few GRPO steps in bf16; run it under
             `accelerate launch --config_file src/ragrl/train/deepspeed/accelerate_zero2.yaml
             --num_processes 1` for DeepSpeed ZeRO-2 on one GPU.
  retrieval  FAISS on the GPU (ragrl.retrieval.dense with use_gpu=True) against FAISS on the CPU on
             the same index; where this python has no GPU FAISS (faiss-cpu, or no faiss at all),
             exact search with torch on the GPU against FAISS (or numpy) on the CPU. The query
             encoder (sentence-transformers) on CUDA against the CPU.
  report     the parts' JSON files merged into one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

QWEN25_05B = dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                  max_position_embeddings=32768)
QWEN25_05B_VOCAB = 151936
# --smoke (CPU, this repository's tests): the same code on a small shape, in float32.
SMOKE = dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256,
             max_position_embeddings=2048)
SMOKE_VOCAB = 4096


def _write(path: str | Path, record: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(json.dumps(record, sort_keys=True), flush=True)


def _device_info() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info.update(device=torch.cuda.get_device_name(0), devices=torch.cuda.device_count(),
                    bf16=torch.cuda.is_bf16_supported(),
                    memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    return info


def _require_cuda(smoke: bool) -> None:
    import torch

    if not torch.cuda.is_available() and not smoke:
        raise SystemExit("no CUDA device: this check is for a GPU machine (docs/GPU.md)")


def cmd_model(args) -> None:
    from rl_toy import corpus

    from ragrl.toy.tiny_model import TinyModelSpec, build_model, train_tokenizer

    spec = TinyModelSpec(vocab_size=2000, **(SMOKE if args.smoke else QWEN25_05B))
    tokenizer = train_tokenizer(corpus(400), spec.vocab_size)
    tokenizer.model_max_length = spec.max_position_embeddings
    model = build_model(tokenizer, spec)
    # Qwen2.5's vocabulary size, for the embedding/LM-head cost; ids past the tokenizer's are unused.
    model.resize_token_embeddings(SMOKE_VOCAB if args.smoke else QWEN25_05B_VOCAB, mean_resizing=False)
    out = Path(args.out)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    shape = {k: getattr(model.config, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                   "num_key_value_heads", "intermediate_size", "vocab_size")}
    _write(args.json, {"part": "model", "params_m": round(params / 1e6, 1), "shape": shape})


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def _sft_rows(model_dir: str, n: int, length: int) -> list[dict]:
    import random

    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(0)
    rows = []
    for i in range(n):
        ids = [rng.randrange(300, len(tok)) for _ in range(length)]
        mask = [0] * (length // 2) + [1] * (length - length // 2)  # loss on the second half, like a reply
        rows.append({"id": f"r{i}", "input_ids": ids, "assistant_masks": mask, "num_turns": 1, "text": ""})
    return rows


def cmd_sft(args) -> None:
    from ragrl.train.sft import SFTArgs, train_sft
    from ragrl.train.sft_data import write_sft_parquet

    _require_cuda(args.smoke)
    work = Path(args.work)
    data = work / "sft.parquet"
    write_sft_parquet(_sft_rows(args.model, args.batch_size * args.steps, args.seq_len), data)
    _reset_peak()
    start = time.perf_counter()
    train_sft(args.model, data, work / "sft_out", SFTArgs(max_steps=args.steps, batch_size=args.batch_size, lr=1e-5,
                                                          bf16=not args.smoke, log_every=1, lr_scheduler="constant"))
    seconds = time.perf_counter() - start
    log = [json.loads(line) for line in (work / "sft_out" / "sft_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    tokens = args.steps * args.batch_size * args.seq_len
    _write(args.json, {"part": "sft", **_device_info(), "steps": args.steps, "batch_size": args.batch_size,
                       "seq_len": args.seq_len, "bf16": not args.smoke, "seconds_incl_load_and_save": round(seconds, 2),
                       "tokens_per_s_incl_overhead": round(tokens / seconds, 1), "losses": losses,
                       "peak_mem_gib": _peak()})


def cmd_rl(args) -> None:
    from rl_toy import make_prompts, make_rollout

    from ragrl.train.rl import LOG_NAME, RLConfig, train_rl

    _require_cuda(args.smoke)
    prompts = make_prompts(args.model, n=args.prompts)
    inner = make_rollout(list(range(300, 400)), max_new_tokens=args.max_new_tokens)
    gen = []

    def rollout(batch, group_size, model, step):
        start = time.perf_counter()
        samples = inner(batch, group_size, model, step)
        gen.append({"step": step, "generate_s": round(time.perf_counter() - start, 3),
                    "generated_tokens": sum(len(s.response_ids) for s in samples)})
        return samples

    cfg = RLConfig(steps=args.steps, batch_prompts=args.prompts, group_size=args.group_size, lr=1e-6,
                   mixed_precision="no" if args.smoke else "bf16", kl_coef=0.001, checkpoint_every=args.steps, seed=0)
    out = Path(args.work) / "rl_out"
    _reset_peak()
    start = time.perf_counter()
    train_rl(args.model, None, prompts, rollout, cfg, out)
    seconds = time.perf_counter() - start
    if int(os.environ.get("RANK", "0")) != 0:
        return
    log = [json.loads(line) for line in (out / LOG_NAME).read_text().splitlines()]
    steps = [{**g, "step_time_s": rec["step_time_s"], "reward_mean": rec.get("reward_mean"),
              "tokens_per_s": round(g["generated_tokens"] / rec["step_time_s"], 1)} for g, rec in zip(gen, log)]
    _write(args.json, {"part": "rl", **_device_info(), "algorithm": cfg.algorithm, "bf16": not args.smoke,
                       "deepspeed": os.environ.get("ACCELERATE_USE_DEEPSPEED", "false"),
                       "processes": int(os.environ.get("WORLD_SIZE", "1")), "group_size": cfg.group_size,
                       "batch_prompts": cfg.batch_prompts, "steps": steps,
                       "seconds_incl_load_and_save": round(seconds, 2), "peak_mem_gib": _peak()})


def _faiss_gpu() -> bool:
    try:
        from ragrl.retrieval.gpu import faiss_gpu_count

        return faiss_gpu_count() > 0
    except ImportError:
        return False


def cmd_retrieval(args) -> None:
    import numpy as np
    import torch

    _require_cuda(args.smoke)
    rng = np.random.default_rng(0)
    base = rng.standard_normal((args.n, args.dim)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[rng.choice(args.n, 256, replace=False)] + 0.1 * rng.standard_normal((256, args.dim)).astype(np.float32)
    rec: dict = {"part": "retrieval", **_device_info(), "n": args.n, "dim": args.dim, "k": 10}
    if _faiss_gpu():
        from ragrl.retrieval.dense import build_faiss_index, load_faiss_index

        shard = Path(args.work) / "emb.npy"
        np.save(shard, base)  # no sidecar: the index needs no encoder here
        build_faiss_index([shard], "Flat", Path(args.work) / "index", use_gpu=False)
        cpu = load_faiss_index(Path(args.work) / "index", use_gpu=False)
        gpu = load_faiss_index(Path(args.work) / "index", use_gpu=True)
        t0 = time.perf_counter()
        s_cpu, i_cpu = cpu.search(queries, 10)
        t1 = time.perf_counter()
        s_gpu, i_gpu = gpu.search(queries, 10)
        t2 = time.perf_counter()
        rec.update(method="faiss-gpu vs faiss-cpu (ragrl.retrieval.dense)", on_gpu=gpu.on_gpu,
                   cpu_s=round(t1 - t0, 4), gpu_s=round(t2 - t1, 4))
    else:
        # No GPU FAISS here (the wheel is too big to carry): the same exact search, on the GPU in torch.
        t0 = time.perf_counter()
        try:
            import faiss

            index = faiss.IndexFlatIP(args.dim)
            index.add(base)
            s_cpu, i_cpu = index.search(queries, 10)
            method = "torch exact search on GPU vs faiss-cpu IndexFlatIP"
        except ImportError:
            scores = queries @ base.T
            i_cpu = np.argsort(-scores, axis=1)[:, :10]
            s_cpu = np.take_along_axis(scores, i_cpu, 1)
            method = "torch exact search on GPU vs numpy on CPU (no faiss installed)"
        t1 = time.perf_counter()
        device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: --smoke only
        b, q = torch.from_numpy(base).to(device), torch.from_numpy(queries).to(device)
        top = torch.topk(q @ b.T, 10, dim=1)
        if device == "cuda":
            torch.cuda.synchronize()
        s_gpu, i_gpu = top.values.cpu().numpy(), top.indices.cpu().numpy()
        rec.update(method=method, on_gpu=device == "cuda", cpu_s=round(t1 - t0, 4), gpu_s=round(time.perf_counter() - t1, 4))
    # Equal up to float rounding: identical ids except where two scores tie within 1e-5.
    same = (i_cpu == i_gpu) | np.isclose(s_cpu, s_gpu, atol=1e-5)
    rec.update(ids_equal_share=float((i_cpu == i_gpu).mean()), equal_up_to_ties=bool(same.all()),
               max_score_diff=float(np.abs(s_cpu - s_gpu).max()))
    rec["encoder"] = _encoder_check(Path(args.work), args.model)
    _write(args.json, rec)
    if not rec["equal_up_to_ties"]:
        raise SystemExit("GPU search disagrees with CPU search")


def _encoder_dir(work: Path, tokenizer_dir: str) -> Path:
    """A randomly initialised BERT of all-MiniLM-L6-v2's shape (6 layers, hidden 384) with the
    check model's tokenizer: sentence-transformers loads it with mean pooling. No download; the
    point is ragrl's Encoder on CUDA, not the embeddings' quality."""
    import transformers

    out = work / "encoder"
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    config = transformers.BertConfig(vocab_size=len(tok), hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                     intermediate_size=1536, max_position_embeddings=512, pad_token_id=tok.pad_token_id)
    transformers.BertModel(config).save_pretrained(out)
    tok.model_max_length = 256
    tok.save_pretrained(out)
    return out


def _encoder_check(work: Path, tokenizer_dir: str) -> dict:
    import numpy as np

    try:
        from ragrl.retrieval.encoder import Encoder
        from ragrl.retrieval.gpu import query_device

        model = str(_encoder_dir(work, tokenizer_dir))
        texts = [f"question number {i} about the capital of country {i % 37}" for i in range(512)]
        cpu = Encoder(model, device="cpu").encode_queries(texts)
        device = query_device(True, None)
        enc = Encoder(model, device=device)
        enc.encode_queries(texts[:8])  # warm-up
        start = time.perf_counter()
        gpu = enc.encode_queries(texts)
        seconds = time.perf_counter() - start
        return {"device": device, "model": "random BERT, all-MiniLM-L6-v2's shape",
                "queries_per_s": round(len(texts) / seconds, 1), "max_abs_diff_vs_cpu": float(np.abs(cpu - gpu).max())}
    except Exception as exc:  # the encoder is one item of the report, not a reason to lose the rest
        return {"error": f"{type(exc).__name__}: {exc}"}


def cmd_report(args) -> None:
    parts = {}
    for path in args.parts:
        p = Path(path)
        parts[p.stem] = json.loads(p.read_text()) if p.exists() else {"error": "no output (see the log)"}
    _write(args.json, {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "parts": parts})


def _parser(sub, name: str, func, *flags: str, **ints: int) -> argparse.ArgumentParser:
    """A part's subcommand: its required path flags, then integer settings (name=default)."""
    p = sub.add_parser(name)
    for flag in (*flags, "json"):
        p.add_argument(f"--{flag}", required=True)
    for key, default in ints.items():
        p.add_argument(f"--{key.replace('_', '-')}", type=int, default=default)
    p.add_argument("--smoke", action="store_true", help="allow a CPU and use a small shape (a code check, no figures)")
    p.set_defaults(func=func)
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="part", required=True)
    _parser(sub, "model", cmd_model, "out")
    _parser(sub, "sft", cmd_sft, "model", "work", steps=5, batch_size=8, seq_len=1024)
    _parser(sub, "rl", cmd_rl, "model", "work", steps=3, prompts=8, group_size=4, max_new_tokens=128)
    # --model: the check model's dir, whose tokenizer serves the encoder check.
    _parser(sub, "retrieval", cmd_retrieval, "model", "work", n=200_000, dim=768)
    _parser(sub, "report", cmd_report).add_argument("parts", nargs="+")
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
