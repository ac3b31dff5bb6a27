"""Run by tests/backends/test_verl_backend.py with the verl venv's python (not collected by pytest).

    python tests/verl_side_check.py SPEC.json REPORT.json

SPEC holds the launch override list (built by ragrl.verl.overrides in the main venv), the
policy dir, reward cases and the golds per question. Everything below is verl's own code path
except the server manager, which in verl is a pool of vLLM/SGLang servers on GPUs: `FakeServer`
stands in for it with the same `generate(request_id, *, prompt_ids, sampling_params)` ->
`TokenOutput` signature, in two modes:

  tiny      samples from the tiny policy with transformers (stop ids honoured like vLLM's)
  scripted  answers turn 0 with a search (plus text after the closing tag, which vLLM would not
            send but a sloppy backend might) and turn 1 with the gold answer, so a real search
            against the retrieval service and a full-reward trajectory are certain to occur

The report is JSON; the assertions live in the test, which reads it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import hydra
import numpy as np
import torch
import transformers
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import verl
from verl.experimental.agent_loop import agent_loop as al
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput


class FakeServer:
    def __init__(self, mode: str, model, tok, golds_by_question: dict[str, list[str]]) -> None:
        self.mode, self.model, self.tok, self.golds = mode, model, tok, golds_by_question
        self.calls: dict[str, list[dict]] = {}

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        calls = self.calls.setdefault(request_id, [])
        if self.mode == "tiny":
            ids, logprobs = self._sample(prompt_ids, sampling_params, seed=len(calls) * 7919 + hash(request_id) % 10_000)
        else:
            ids = self._script(prompt_ids, len(calls))
            logprobs = [-0.01 * (i + 1) for i in range(len(ids))]
        calls.append({"prompt_len": len(prompt_ids), "token_ids": ids, "log_probs": logprobs,
                      "sampling_params": {k: v for k, v in sampling_params.items()}})
        return TokenOutput(token_ids=ids, log_probs=logprobs if sampling_params.get("logprobs") else None)

    def _sample(self, prompt_ids, params, seed):
        torch.manual_seed(seed)
        config = transformers.GenerationConfig(
            max_new_tokens=int(params["max_tokens"]), do_sample=True, temperature=float(params["temperature"]),
            top_p=float(params["top_p"]), top_k=0, eos_token_id=list(params.get("stop_token_ids") or []) or None,
            pad_token_id=self.tok.pad_token_id, return_dict_in_generate=True, output_scores=True)
        with torch.no_grad():
            out = self.model.generate(input_ids=torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids),
                                      dtype=torch.long), generation_config=config)
        new = out.sequences[0, len(prompt_ids):].tolist()
        logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, new)]
        return new, logprobs

    def _script(self, prompt_ids, turn) -> list[int]:
        context = self.tok.decode(prompt_ids)
        question = next(q for q in self.golds if q in context)
        if turn == 0:
            text = f"<think>I need to look this up.</think><search>{question}</search> and some overshoot"
        else:
            text = f"<think>Found it.</think><answer>{self.golds[question][0]}</answer>"
        return self.tok.encode(text, add_special_tokens=False)


async def rollouts(cfg, tok, rows, make_server, n: int) -> list[dict]:
    # Registration exactly as verl's AgentLoopWorker does it: entries of agent_loop_config_path.
    for entry in OmegaConf.load(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path):
        al._agent_loop_registry[entry.name] = entry
    entry = al._agent_loop_registry[cfg.actor_rollout_ref.rollout.agent.default_agent_loop]
    rollout = cfg.actor_rollout_ref.rollout
    # The sampling params AgentLoopManager builds for a training step.
    sampling_params = dict(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                           repetition_penalty=1.0, logprobs=rollout.calculate_log_probs)

    async def one(row):
        server = make_server()  # one per trajectory, so its calls are that trajectory's turns
        loop = hydra.utils.instantiate(
            config=entry, trainer_config=al.DictConfigWrap(config=cfg), server_manager=server, tokenizer=tok,
            processor=None, hf_model_type="qwen2", dataset_cls=RLHFDataset, data_config=al.DictConfigWrap(cfg.data),
            tools=al.ToolListWrap([]))
        kwargs = {k: v for k, v in row.items() if k != "dummy_tensor"}
        return type(loop).__name__, await loop.run(dict(sampling_params), **kwargs), list(server.calls.values())

    results = await asyncio.gather(*[one(row) for row in rows for _ in range(n)])
    report = []
    for k, (cls, out, calls) in enumerate(results):
        row = rows[k // n]
        report.append({
            "class": cls, "question": row["extra_info"]["question"],
            "golds": list(row["reward_model"]["ground_truth"]),
            "prompt_ids": out.prompt_ids, "response_ids": out.response_ids, "response_mask": out.response_mask,
            "response_logprobs": out.response_logprobs, "num_turns": out.num_turns,
            "extra_fields": {k: v for k, v in out.extra_fields.items()},
            # what verl's naive reward manager decodes and scores
            "text": tok.decode(out.response_ids, skip_special_tokens=True),
            "calls": [c for per_request in calls for c in per_request],
            "request_ids": len(calls),
        })
    return report


def main(spec_path: str, report_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    report: dict = {"verl_version": verl.__version__, "transformers": transformers.__version__,
                    "torch": torch.__version__}
    torch.set_num_threads(1)
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=spec["overrides"])

    # 1. Our reward through verl's custom-reward loader (path/name/reward_kwargs from the overrides).
    fn = get_custom_reward_fn(cfg)
    report["reward_fn"] = getattr(getattr(fn, "func", None), "__name__", None)
    report["reward_cases"] = [
        fn(data_source="ragrl/test", solution_str=case["text"], ground_truth=np.array(case["golds"], dtype=object),
           extra_info={"index": i, **case["extra_info"]})
        for i, case in enumerate(spec["reward_cases"])
    ]
    try:  # a response without our agent loop's turn record is refused, not re-parsed
        fn(data_source="ragrl/test", solution_str="<think>a</think><answer>Paris</answer>",
           ground_truth=np.array(["Paris"], dtype=object), extra_info={"index": 0})
        report["no_record"] = None
    except ValueError as exc:
        report["no_record"] = str(exc)

    # 2. verl's RLHFDataset on our parquet, with the composed data config.
    tok = transformers.AutoTokenizer.from_pretrained(spec["policy"])
    dataset = RLHFDataset(data_files=[cfg.data.train_files], tokenizer=tok, config=cfg.data)
    rows = [dataset[i] for i in range(len(dataset))]
    report["dataset"] = [{"raw_prompt": [dict(m) for m in r["raw_prompt"]], "data_source": r["data_source"],
                          "ground_truth": list(r["reward_model"]["ground_truth"]),
                          "extra_info": {k: (int(v) if isinstance(v, np.integer) else v) for k, v in r["extra_info"].items()},
                          "index": int(r["index"])} for r in rows]

    # 3. Our agent loop, instantiated as verl does, against the fake server manager.
    model = transformers.AutoModelForCausalLM.from_pretrained(spec["policy"], dtype=torch.float32).eval()
    golds = {r["extra_info"]["question"]: list(r["reward_model"]["ground_truth"]) for r in rows}
    take = rows[: spec["n_rows"]]
    for mode in ("scripted", "tiny"):
        trajs = asyncio.run(rollouts(cfg, tok, take, lambda: FakeServer(mode, model, tok, golds), spec["n"]))
        report[mode] = {"trajectories": trajs}
        report[mode]["scores"] = [
            # verl's reward loop merges the agent loop's extra_fields into extra_info
            fn(data_source="ragrl/test", solution_str=t["text"], ground_truth=np.array(t["golds"], dtype=object),
               extra_info=dict(t["extra_fields"])) for t in trajs]
    Path(report_path).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
