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
  grpo_vs_trl  ragrl's GRPO step against TRL's GRPOTrainer on the same model, prompts and reward
             (8 prompts x 4 samples, 128 new tokens, bf16, HF generate in both, no DeepSpeed, KL
             off in both), in alternating rounds in one process: step time, generation time,
             tokens/s, peak memory of each.
  generation HF generate (transformers' dynamic cache, sampling) of 128 new tokens at batch 32 and
             256: tokens/s and the time of one decode step, the figure that says how far rollouts
             are from the hardware.
  retrieval  FAISS on the GPU (ragrl.retrieval.dense with use_gpu=True) against FAISS on the CPU on
             the same index; where this python has no GPU FAISS (faiss-cpu, or no faiss at all),
             exact search with torch on the GPU against FAISS (or numpy) on the CPU. The query
             encoder (sentence-transformers) on CUDA against the CPU.
  report     the parts' JSON files merged into one, with each part's status, wall time and, for a
             failed part, the tail of its log (scripts/gpu_check.sh writes it after every part).

--smoke runs a part on the CPU on a small shape: a check of the code, not figures.
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
# The RL parts' reward: 1.0 when a completion holds one of these token ids (rl_toy's task). The
# figures are about time and memory; the reward only has to be the same for both trainers.
REWARD_TOKENS = list(range(300, 400))
TRAINERS = ("ragrl", "trl")
# --smoke (CPU, this repository's tests): the same code on a small shape, in float32.
SMOKE = dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256,
             max_position_embeddings=2048)
SMOKE_VOCAB = 4096


def _write(path: str | Path, record: dict, sort_keys: bool = True) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2, sort_keys=sort_keys) + "\n")
    print(json.dumps(record, sort_keys=sort_keys), flush=True)


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
    inner = make_rollout(REWARD_TOKENS, max_new_tokens=args.max_new_tokens)
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


def _sync() -> None:
    """Wait for the GPU: a timer read before the queued kernels finish measures the launch only."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _gib(n_bytes: int) -> float:
    return round(n_bytes / 2**30, 2)


def _memory() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"peak_mem_gib": None}
    return {"peak_mem_gib": _gib(torch.cuda.max_memory_allocated()),
            "peak_reserved_gib": _gib(torch.cuda.max_memory_reserved())}


def _left_padded(prompt_ids: list[list[int]], pad: int):
    import torch

    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p):] = torch.tensor(p)
        att[i, width - len(p):] = 1
    return ids, att


def _step(step: int, step_s: float, gen: dict, reward) -> dict:
    return {"step": step, "step_time_s": round(step_s, 3), "generate_s": round(gen["generate_s"], 3),
            "generated_tokens": gen["generated_tokens"], "tokens_per_s": round(gen["generated_tokens"] / step_s, 1),
            "reward_mean": reward}


def _ragrl_run(args, prompts: list[dict], work: Path, overrides: dict) -> tuple[list[dict], dict]:
    """ragrl's train_rl for args.steps steps; per-step times from its train log."""
    from dataclasses import asdict

    from rl_toy import make_rollout

    from ragrl.train.rl import LOG_NAME, RLConfig, train_rl

    inner = make_rollout(REWARD_TOKENS, max_new_tokens=args.max_new_tokens)
    gen: list[dict] = []
    info: dict = {}

    def rollout(batch, group_size, model, step):
        info.setdefault("weights_dtype", str(next(model.parameters()).dtype).removeprefix("torch."))
        _sync()
        start = time.perf_counter()
        samples = inner(batch, group_size, model, step)
        _sync()
        gen.append({"generate_s": time.perf_counter() - start,
                    "generated_tokens": sum(len(s.response_ids) for s in samples)})
        return samples

    cfg = RLConfig.from_dict({**dict(
        steps=args.steps, batch_prompts=args.prompts, group_size=args.group_size, lr=1e-6, kl_coef=0.0,
        loss_agg="token-mean", mixed_precision="no" if args.smoke else "bf16", checkpoint_every=10**9,
        keep_checkpoints=1, seed=0), **overrides})
    train_rl(args.model, None, prompts, rollout, cfg, work)
    log = [json.loads(line) for line in (work / LOG_NAME).read_text().splitlines()]
    keys = ("mixed_precision", "kl_coef", "loss_agg", "micro_batch_size", "log_entropy", "logprob_chunk_tokens",
            *overrides)
    info["config"] = {k: v for k, v in asdict(cfg).items() if k in keys}
    return [_step(k + 1, rec["step_time_s"], g, rec.get("reward_mean")) for k, (g, rec) in enumerate(zip(gen, log))], info


def _trl_run(args, prompts: list[dict], work: Path) -> tuple[list[dict], dict]:
    """TRL's GRPOTrainer on the same prompts (each step's 8 in a row, unshuffled), reward and
    sampling; per-step times from a callback, generation time from a wrapper of the model's
    generate (TRL calls it once a step). Its settings match ragrl's: token-mean loss (dapo),
    std-scaled group advantages, no KL, one update per batch, no gradient checkpointing (TRL's
    default is on; ragrl has none)."""
    import torch
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    targets = set(REWARD_TOKENS)

    def reward(prompts, completions, completion_ids, **_):
        return [float(any(int(t) in targets for t in ids)) for ids in completion_ids]

    bf16 = not args.smoke
    dtype = torch.bfloat16 if bf16 and args.trl_weights == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    stops = model.generation_config.eos_token_id
    stops = torch.tensor([stops] if isinstance(stops, int) else list(stops))
    gen: list[dict] = []
    plain_generate = model.generate

    def timed_generate(*a, **kw):
        _sync()
        start = time.perf_counter()
        out = plain_generate(*a, **kw)
        _sync()
        width = (kw["input_ids"] if "input_ids" in kw else a[0]).shape[1]
        # Up to and including the first stop token, as ragrl's rollout counts its response.
        completion = out[:, width:].cpu()
        is_stop = torch.isin(completion, stops)
        lengths = torch.where(is_stop.any(1), is_stop.int().argmax(1) + 1, completion.shape[1])
        gen.append({"generate_s": time.perf_counter() - start, "generated_tokens": int(lengths.sum())})
        return out

    model.generate = timed_generate
    times: list[float] = []

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, *_, **__):
            _sync()
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            _sync()
            times.append(time.perf_counter() - self.start)

    config = GRPOConfig(
        output_dir=str(work), seed=0, data_seed=0, use_cpu=args.smoke, bf16=bf16, fp16=False, report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, log_level="warning", max_steps=args.steps,
        learning_rate=1e-6, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", per_device_train_batch_size=args.prompts * args.group_size,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, num_generations=args.group_size,
        shuffle_dataset=False, beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        gradient_checkpointing=False, dataloader_num_workers=0)
    rows = [{"prompt": p["text"]} for _ in range(args.steps) for p in prompts]
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[StepTimer()])
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    if not (len(times) == len(gen) == args.steps):
        raise RuntimeError(f"TRL ran {len(times)} steps with {len(gen)} generate calls; {args.steps} asked for "
                           "(one generation per step expected)")
    return ([_step(k + 1, t, g, r) for k, (t, g, r) in enumerate(zip(times, gen, rewards + [None] * len(times)))],
            {"weights_dtype": str(dtype).removeprefix("torch."), "config": {"bf16": bf16, "loss_type": "dapo",
                                                                           "beta": 0.0, "gradient_checkpointing": False}})


def _trainer_summary(runs: list[dict]) -> dict:
    """Over every round: the steps after each run's first (the first pays the warm-up)."""
    import statistics

    steps = [s for run in runs for s in (run["steps"][1:] or run["steps"])]
    step_s = [s["step_time_s"] for s in steps]
    peaks = [run["peak_mem_gib"] for run in runs if run["peak_mem_gib"] is not None]
    return {"steps_counted": len(steps), "step_time_s_median": round(statistics.median(step_s), 3),
            "step_time_s_range": [min(step_s), max(step_s)],
            "generate_s_median": round(statistics.median(s["generate_s"] for s in steps), 3),
            "generate_share": round(sum(s["generate_s"] for s in steps) / sum(step_s), 3),
            "tokens_per_s_median": round(statistics.median(s["tokens_per_s"] for s in steps), 1),
            "peak_mem_gib": max(peaks) if peaks else None}


def _json_object(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--rl-overrides: not JSON ({exc}): {text!r}")
    if not isinstance(value, dict):
        raise SystemExit(f"--rl-overrides: a JSON object of RLConfig fields expected, got {text!r}")
    return value


def cmd_grpo_vs_trl(args) -> None:
    import gc
    import shutil

    import torch
    import transformers
    import trl
    from rl_toy import make_prompts

    _require_cuda(args.smoke)
    overrides = _json_object(args.rl_overrides)
    prompts = make_prompts(args.model, n=args.prompts)
    runs = []
    for rnd in range(1, args.rounds + 1):
        # Alternating order: a machine that warms up or slows down over the run favours neither.
        for name in TRAINERS if rnd % 2 else TRAINERS[::-1]:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            _reset_peak()
            # What the earlier runs left allocated is in this run's peak too; shown, not subtracted.
            at_start = _gib(torch.cuda.memory_allocated()) if torch.cuda.is_available() else None
            work = Path(args.work) / f"{name}_round{rnd}"
            shutil.rmtree(work, ignore_errors=True)  # ragrl would resume a finished run instead of training
            start = time.perf_counter()
            steps, info = _ragrl_run(args, prompts, work, overrides) if name == "ragrl" else _trl_run(args, prompts, work)
            runs.append({"trainer": name, "round": rnd, "wall_s": round(time.perf_counter() - start, 1),
                         "mem_at_start_gib": at_start, **_memory(), **info, "steps": steps})
            shutil.rmtree(work, ignore_errors=True)
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "steps"}), flush=True)
    summary = {t: _trainer_summary([r for r in runs if r["trainer"] == t]) for t in TRAINERS}
    if summary["ragrl"]["peak_mem_gib"] and summary["trl"]["peak_mem_gib"]:
        summary["peak_mem_ratio_ragrl_to_trl"] = round(summary["ragrl"]["peak_mem_gib"] / summary["trl"]["peak_mem_gib"], 2)
    summary["step_time_ratio_ragrl_to_trl"] = round(summary["ragrl"]["step_time_s_median"]
                                                    / summary["trl"]["step_time_s_median"], 2)
    _write(args.json, {"part": "grpo_vs_trl", **_device_info(), "transformers": transformers.__version__,
                       "trl": trl.__version__, "prompts": args.prompts, "group_size": args.group_size,
                       "max_new_tokens": args.max_new_tokens, "steps_per_run": args.steps, "rounds": args.rounds,
                       "rl_overrides": overrides, "summary": summary, "runs": runs})


def cmd_generation(args) -> None:
    import torch
    import transformers
    from rl_toy import make_prompts

    _require_cuda(args.smoke)
    if args.new_tokens < 2:
        raise SystemExit("--new-tokens must be >= 2: the decode step is (all tokens - the first) / (n - 1)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    pad = model.generation_config.pad_token_id
    prompts = [p["prompt_ids"] for p in make_prompts(args.model, n=8)]  # grpo_vs_trl's prompts, cycled

    def timed(ids, att, n: int) -> float:
        _sync()
        start = time.perf_counter()
        with torch.no_grad():
            # min_new_tokens: every row runs the full n steps, so tokens/s counts no early stop.
            out = model.generate(input_ids=ids, attention_mask=att, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=n, min_new_tokens=n, pad_token_id=pad)
        _sync()
        if out.shape[1] - ids.shape[1] != n:
            raise RuntimeError(f"generate returned {out.shape[1] - ids.shape[1]} new tokens, {n} asked for")
        return time.perf_counter() - start

    rows = []
    for batch in args.batches:
        ids, att = _left_padded([prompts[i % len(prompts)] for i in range(batch)], pad)
        ids, att = ids.to(device), att.to(device)
        timed(ids, att, min(8, args.new_tokens))  # warm-up: kernels, allocator
        _reset_peak()
        first = [timed(ids, att, 1) for _ in range(args.repeats)]
        full = [timed(ids, att, args.new_tokens) for _ in range(args.repeats)]
        # The fastest of the repeats: noise on a shared machine only ever adds time.
        t1, tn = min(first), min(full)
        rows.append({"batch": batch, "prompt_len": ids.shape[1], "new_tokens": args.new_tokens,
                     "generate_s": [round(t, 4) for t in full], "prefill_and_first_token_s": [round(t, 4) for t in first],
                     "tokens_per_s": round(batch * args.new_tokens / tn, 1),
                     "decode_ms_per_step": round((tn - t1) / (args.new_tokens - 1) * 1000, 3), **_memory()})
        print(json.dumps(rows[-1]), flush=True)
    params = list(model.parameters())
    _write(args.json, {"part": "generation", **_device_info(), "transformers": transformers.__version__,
                       "dtype": str(dtype).removeprefix("torch."), "cache": "dynamic (transformers' default)",
                       "sampling": "temperature 1, no top-k/top-p", "repeats": args.repeats,
                       "params_m": round(sum(p.numel() for p in params) / 1e6, 1),
                       "weight_gib": _gib(sum(p.numel() * p.element_size() for p in params)), "batches": rows})


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


def _tail(path: Path, lines: int = 30, chars: int = 4000) -> str:
    if not path.exists():
        return f"(no log: {path.name})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])[-chars:]


def cmd_report(args) -> None:
    """One JSON of every part run so far: `name:rc:seconds` per part (gpu_check.sh's), the part's
    own JSON merged into its entry, a failed part's log tail beside it."""
    out_dir = Path(args.dir)
    parts = {}
    for entry in args.status:
        name, rc, seconds = entry.rsplit(":", 2)
        path = out_dir / f"{name}.json"
        record = json.loads(path.read_text()) if path.exists() else {}
        ok = int(rc) == 0 and bool(record)
        status = "ok" if ok else "timed out" if int(rc) in (124, 137) else "failed"
        parts[name] = {"status": status, "rc": int(rc), "wall_s": int(seconds), **record}
        if not ok:
            parts[name]["error_tail"] = _tail(out_dir / f"{name}.log")
    install = Path(args.install) if args.install else None
    machine = Path(args.machine) if args.machine else None
    _write(args.json, {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "smoke": args.smoke,
        "machine": machine.read_text().splitlines()[1:] if machine and machine.exists() else None,
        "install": json.loads(install.read_text()) if install and install.exists() else None,
        "parts": parts}, sort_keys=False)  # the parts in the order they ran


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
    vs = _parser(sub, "grpo_vs_trl", cmd_grpo_vs_trl, "model", "work", steps=5, rounds=2, prompts=8, group_size=4,
                 max_new_tokens=128)
    vs.add_argument("--rl-overrides", help="a JSON object of RLConfig fields for ragrl's side (e.g. a memory setting)")
    # bf16: TRL's weights as its users run it in bf16 (and as the first GPU run did); ragrl's are what its trainer keeps.
    vs.add_argument("--trl-weights", choices=("bf16", "fp32"), default="bf16")
    gen = _parser(sub, "generation", cmd_generation, "model", new_tokens=128, repeats=2)
    gen.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    rep = _parser(sub, "report", cmd_report, "dir")
    rep.add_argument("--install", help="scripts/gpu_wheels.py's JSON")
    rep.add_argument("--machine", help="gpu_check.sh's machine.log")
    rep.add_argument("status", nargs="*", help="name:rc:seconds of each part run")
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
