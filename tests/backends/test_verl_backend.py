"""The verl backend (rl.backend: verl) on CPU, with a REAL verl 0.9 from .venv-verl.

verl cannot train without GPUs, so this checks every piece of the launch that does not need one,
through verl's own code paths, in the verl venv's python (scripts/verl_venv.sh; it cannot share
.venv: verl pins transformers < 5.11):

* verl imports, and so does our agent loop module inside it;
* our reward loads through verl's custom-reward loader (`get_custom_reward_fn`, with the
  reward_kwargs of the launch overrides) and scores hand-computed cases;
* verl's `RLHFDataset` reads the parquet our data writer produces;
* our agent loop, registered from the agent_loop_config_path YAML and instantiated the way verl's
  AgentLoopWorker does it, rolls out rows of that dataset against a REAL retrieval service
  (`ragrl serve-retriever` over BM25) and a FAKE server manager: in verl that is a pool of
  vLLM/SGLang servers on GPUs, here tests/verl_side_check.py's FakeServer (same generate
  signature and TokenOutput), sampling from the tiny policy or scripted to search then answer.
  Its response mask must be 0 on every observation token and 1 on every generated token, located
  independently from the <information> tag ids; generated tokens must be what the server sent;
  log-probs must line up with them;
* the full launch override set composes with `python -m verl.trainer.main_ppo ... --cfg job`.

Not tested here (no GPU): FSDP training, vLLM rollout servers, weight sync, checkpoint save and
the model merger on a real checkpoint, the Ray cluster over SLURM nodes (the launcher script's
orchestration is checked with fake `ray`/`srun`/`scontrol`). docs/VERL.md lists the same.

Skipped only when RAGRL_VERL_VENV is unset (`make test` sets it); a venv that is set but broken fails.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers
import yaml

from ragrl.agent.generation import cut_at_stop
from ragrl.agent.protocol import OBS_PREFIX, OBS_SUFFIX, forced_answer_prompt
from ragrl.recipe import parse_recipe
from ragrl.toy.tiny_model import build_tiny
from ragrl.toy.world import generate_world, world_text, write_world
from ragrl.verl.data import check_prompts_match_engine, write_verl_parquet
from ragrl.verl.launch import agent_loop_entries, cluster_from_env, convert_log, start_retriever
from ragrl.verl.overrides import VerlPaths, build_overrides, hydra_value
from helpers import SPEC, check_mask_against_info_spans

REPO = Path(__file__).resolve().parents[2]
VENV = os.environ.get("RAGRL_VERL_VENV")
needs_verl = pytest.mark.skipif(not VENV, reason="RAGRL_VERL_VENV is unset; `make test` builds .venv-verl "
                                                  "(scripts/verl_venv.sh) and sets it")
RECIPE = {
    "env": "search", "topk": 2,
    "rollout": {"max_turns": 2, "max_turn_tokens": 64, "max_response_tokens": 400, "max_obs_tokens": 160},
    "rl": {"backend": "verl", "group_size": 2, "batch_prompts": 4, "steps": 3, "kl_coef": 0.001, "loss_agg": "grpo",
           "lr": 1e-5, "checkpoint_every": 2, "padding_free": True,
           "verl": {"actor_rollout_ref.rollout.gpu_memory_utilization": 0.6}},
    "reward": {"em": 1.0, "format": 0.1},
}
# Hand-computed: score = 1.0 * em + 0.1 * format.
REWARD_CASES = [
    ({"text": "<think>easy</think><answer>Paris</answer>", "golds": ["Paris"]}, 1.1),
    ({"text": "<think>look</think><search>capital</search>\n\n<information>Doc 1(Title: P) P is big.\n"
              "</information>\n\n<think>so</think><answer>The Paris</answer>", "golds": ["Paris", "Lutece"]}, 1.1),
    ({"text": "<think>hm</think><answer>London</answer>", "golds": ["Paris"]}, 0.1),
    ({"text": "<answer>Paris</answer>", "golds": ["Paris"]}, 1.0),  # no <think>: format 0
    ({"text": "<think>no idea</think>", "golds": ["Paris"]}, 0.0),
    # the answer inside an observation is the environment's text, not the model's
    ({"text": "<think>a</think><search>q</search>\n\n<information><answer>Paris</answer></information>\n\n"
              "<think>b</think><answer>Rome</answer>", "golds": ["Paris"]}, 0.1),
]


def _verl_python() -> Path:
    python = Path(VENV) / "bin" / "python"
    if not python.exists():
        pytest.fail(f"RAGRL_VERL_VENV={VENV} has no bin/python; run scripts/verl_venv.sh")
    return python


def _run(cmd, timeout=900, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"), **kw)


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """What `ragrl rl` prepares for verl: data, agent loop YAML, retrieval service, overrides."""
    root = tmp_path_factory.mktemp("verl")
    write_world(generate_world(3, 30), root / "world")
    model = build_tiny(world_text(root / "world"), root / "model", SPEC)
    tok = transformers.AutoTokenizer.from_pretrained(model)
    recipe = parse_recipe(RECIPE, "search_r1")
    train = root / "work" / "verl_data" / "train.parquet"
    stats = write_verl_parquet(root / "world" / "qa" / "train.parquet", train, recipe, tok, limit=8)
    check_prompts_match_engine(train, recipe, tok)
    built = _run([sys.executable, "-m", "ragrl", "index", "bm25", "--passages", root / "world" / "passages.parquet",
                  "--out", root / "bm25"])
    assert built.returncode == 0, built.stderr[-2000:]
    service, url = start_retriever(None, root / "bm25", None, root / "retriever.log", multi_node=False, timeout_s=300)
    try:
        agent_cfg = root / "work" / "agent_loop.yaml"
        agent_cfg.write_text(yaml.safe_dump(agent_loop_entries(recipe, url), sort_keys=False))
        paths = VerlPaths(train_parquet=train, val_parquet=train, policy=model, checkpoints=root / "work" / "ckpt",
                          agent_loop_config=agent_cfg, reward_module=REPO / "src/ragrl/verl/reward.py")
        overrides = build_overrides(recipe, paths, n_prompts=stats["rows"], max_prompt_length=stats["max_prompt_length"])
        yield SimpleNamespace(root=root, model=model, tok=tok, recipe=recipe, stats=stats, url=url, paths=paths,
                              overrides=overrides)
    finally:
        service.terminate()
        service.wait(timeout=30)


@pytest.fixture(scope="module")
def report(launch):
    """One run of tests/verl_side_check.py in the verl venv (imports cost ~10 s there)."""
    spec = {"overrides": launch.overrides, "policy": str(launch.model), "n_rows": 4, "n": 2,
            "reward_cases": [{**case, "extra_info": _recorded(case["text"])} for case, _ in REWARD_CASES]}
    spec_path, out = launch.root / "spec.json", launch.root / "report.json"
    spec_path.write_text(json.dumps(spec))
    t0 = time.monotonic()
    proc = _run([_verl_python(), REPO / "tests" / "verl_side_check.py", spec_path, out])
    assert proc.returncode == 0, f"verl side failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    print(f"\nverl side check: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return json.loads(out.read_text())


# --------------------------------------------------------------------------- in the verl venv


@pytest.mark.slow
@needs_verl
def test_verl_imports(report):
    assert report["verl_version"].startswith("0.9."), report["verl_version"]
    major, minor = map(int, report["transformers"].split(".")[:2])
    assert (major, minor) < (5, 11), report["transformers"]  # verl 0.9's pin, the reason for the separate venv


@pytest.mark.slow
@needs_verl
def test_reward_through_verls_loader(report):
    assert report["reward_fn"] == "_call_with_kwargs"  # verl's wrapper that merges reward_kwargs
    for (case, expected), got in zip(REWARD_CASES, report["reward_cases"], strict=True):
        assert got["score"] == pytest.approx(expected), (case, got)
    assert "no 'ragrl_turns'" in report["no_record"]


def _recorded(text):
    """What the agent loop records for a response that is exactly `text` (a hand-written case)."""
    from dataclasses import asdict

    from ragrl.agent.protocol import parse_turns
    from ragrl.rewards.qa import extract_answer

    return {"ragrl_answer": extract_answer(text), "ragrl_turns": [asdict(t) for t in parse_turns(text)]}


@pytest.mark.slow
@needs_verl
def test_rlhf_dataset_reads_our_parquet(launch, report):
    rows = report["dataset"]
    assert len(rows) == launch.stats["rows"] == 8
    import pyarrow.parquet as pq

    ours = pq.read_table(launch.paths.train_parquet).to_pylist()
    for got, want in zip(rows, ours, strict=True):
        assert got["raw_prompt"] == want["prompt"]
        assert got["ground_truth"] == want["reward_model"]["ground_truth"]
        assert got["data_source"] == "ragrl/search_r1"
        assert got["index"] == want["extra_info"]["index"]


def _expected_mask(t, tok) -> list[int]:
    """The mask rebuilt from what the server sent, independently of the engine's bookkeeping.

    The response must read: turn 0's tokens as sent (cut after the first stop id, and to the
    turn's max_tokens), then an observation (`\n\n<information>` ... `</information>\n\n`, plus
    the turn-limit prompt ending in the prefilled <answer> after the last tool turn), then turn 1's
    tokens, and so on. Generated tokens get 1, the rest 0. A policy that itself writes
    <information> (the untrained tiny one does) cannot fool this, unlike a tag-span scan.
    """
    ids = t["response_ids"]
    head, tail = tok.encode(OBS_PREFIX, add_special_tokens=False), tok.encode(OBS_SUFFIX, add_special_tokens=False)
    forced = tok.encode(forced_answer_prompt(True), add_special_tokens=False)
    expected, pos = [], 0
    for call in t["calls"]:
        params = call["sampling_params"]
        gen = cut_at_stop(call["token_ids"], params["stop_token_ids"], params["max_tokens"])
        assert ids[pos : pos + len(gen)] == gen, "generated tokens differ from what the server sent"
        expected += [1] * len(gen)
        pos += len(gen)
        if pos == len(ids):
            break
        assert ids[pos : pos + len(head)] == head, "an observation must follow an unfinished turn"
        close = ids.index(tok.convert_tokens_to_ids("</information>"), pos + len(head))
        end = close + len(tail)
        assert ids[close:end] == tail
        if ids[end : end + len(forced)] == forced:
            end += len(forced)
        expected += [0] * (end - pos)
        pos = end
    assert pos == len(ids), "response tokens beyond the last turn"
    return expected


def _check_trajectory(t, tok, max_response):
    assert len(t["response_ids"]) == len(t["response_mask"]) <= max_response
    assert t["response_mask"] == _expected_mask(t, tok)
    # Log-probs: the server's, in order, on each turn's generated tokens; 0 on observation tokens.
    expected, calls, run_of, pos = [], [c for c in t["calls"] if c["token_ids"]], 0, 0
    for i, mask in enumerate(t["response_mask"]):
        if mask:
            if i == 0 or not t["response_mask"][i - 1]:
                pos = 0
                run_of += 1
            expected.append(calls[run_of - 1]["log_probs"][pos])
            pos += 1
        else:
            expected.append(0.0)
    assert t["response_logprobs"] == pytest.approx(expected)


@pytest.mark.slow
@needs_verl
def test_agent_loop_scripted_search_and_answer(launch, report):
    trajs = report["scripted"]["trajectories"]
    assert len(trajs) == 8 and {t["class"] for t in trajs} == {"RagrlAgentLoop"}
    for k, (t, score) in enumerate(zip(trajs, report["scripted"]["scores"])):
        _check_trajectory(t, launch.tok, launch.recipe.rollout.max_response_tokens)
        # and the rollout tests' tag-span scan (tests/helpers.py) agrees (this policy never writes <information>)
        check_mask_against_info_spans(SimpleNamespace(response_ids=t["response_ids"], loss_mask=t["response_mask"]),
                                      launch.tok)
        assert t["extra_fields"]["ragrl_searches"] == 1 and t["extra_fields"]["ragrl_stop_reason"] == "answer"
        # a real BM25 result came back from the service, and the overshoot after </search> is gone
        assert "Doc 1(Title:" in t["text"] and "overshoot" not in t["text"]
        assert t["response_mask"].count(0) > 20
        # the reward of the full trajectory through verl's loader: gold answer, well formed
        assert score["score"] == pytest.approx(1.1), t["text"]
        assert t["prompt_ids"] == launch.tok.encode(
            launch.tok.apply_chat_template(report["dataset"][k // 2]["raw_prompt"], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)


@pytest.mark.slow
@needs_verl
def test_agent_loop_on_the_tiny_policy_masks_observations(launch, report):
    trajs = report["tiny"]["trajectories"]
    assert len(trajs) == 8
    generated = observed = 0
    for t in trajs:
        _check_trajectory(t, launch.tok, launch.recipe.rollout.max_response_tokens)
        generated += sum(t["response_mask"])
        observed += t["response_mask"].count(0)
        # the sampler's settings are verl's rollout config, plus the engine's budget and stops
        for call in t["calls"]:
            assert call["sampling_params"]["temperature"] == 1.0 and call["sampling_params"]["logprobs"] is True
            assert call["sampling_params"]["max_tokens"] <= launch.recipe.rollout.max_turn_tokens
    assert generated > 0 and observed > 0  # an untrained policy writes junk: invalid-action observations


@pytest.mark.slow
@needs_verl
def test_launch_overrides_compose_with_hydra(launch):
    proc = _run([_verl_python(), "-m", "verl.trainer.main_ppo", *launch.overrides, "--cfg", "job"],
                cwd=launch.root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["algorithm"]["adv_estimator"] == "grpo"
    rollout = cfg["actor_rollout_ref"]["rollout"]
    assert rollout["n"] == 2 and rollout["name"] == "vllm" and rollout["gpu_memory_utilization"] == 0.6
    assert rollout["agent"]["agent_loop_config_path"] == str(launch.paths.agent_loop_config)
    assert rollout["agent"]["default_agent_loop"] == "ragrl_agent"
    actor = cfg["actor_rollout_ref"]["actor"]
    assert actor["use_kl_loss"] is True and actor["kl_loss_type"] == "k3"
    assert cfg["actor_rollout_ref"]["model"]["use_remove_padding"] is True  # rl.padding_free
    assert actor["loss_agg_mode"] == "seq-mean-token-mean" and actor["ppo_mini_batch_size"] == 4
    reward = cfg["reward"]["custom_reward_function"]
    assert reward["path"].endswith("ragrl/verl/reward.py") and reward["name"] == "compute_score"
    assert reward["reward_kwargs"] == {"weights": {"em": 1.0, "format": 0.1}, "env": "search", "plugin": ""}
    assert cfg["reward"]["reward_manager"]["name"] == "naive"  # the manager that hands extra_fields to the reward
    assert cfg["data"]["train_files"] == str(launch.paths.train_parquet)
    assert cfg["data"]["max_prompt_length"] == launch.stats["max_prompt_length"]
    assert cfg["trainer"]["total_training_steps"] == 3 and cfg["trainer"]["save_freq"] == 2
    assert cfg["trainer"]["resume_mode"] == "auto"


@pytest.mark.slow
@needs_verl
def test_a_wrong_override_fails_hydra(launch):
    """The --cfg job check has teeth: a key verl's config lacks is refused."""
    proc = _run([_verl_python(), "-m", "verl.trainer.main_ppo", *launch.overrides,
                 "actor_rollout_ref.rollout.no_such_key=1", "--cfg", "job"], cwd=launch.root)
    assert proc.returncode != 0 and "no_such_key" in proc.stderr


def test_ray_launcher_orchestration(tmp_path):
    """scripts/verl_ray_launch.sh in a fake 3-node SLURM allocation: fake ray/srun/scontrol and a
    fake python that records its arguments; checks order, addresses, and that Ray is stopped."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "calls.log"
    fakes = {
        "scontrol": 'echo "$@" >> LOG; printf "n1\\nn2\\nn3\\n"',
        # A real srun runs the workers (ray start --block) until the launcher kills it.
        "srun": 'echo "srun $@" >> LOG; exec sleep 60',
        "ray": 'echo "ray $@" >> LOG',
        # The launcher's join check prints the number of alive nodes: the two workers count once
        # srun has started them (before that, the head alone), as on a cluster. Answering 3 at once
        # let the launcher finish and kill the backgrounded srun before it ran, under load.
        # main_ppo records its overrides.
        "python": 'if [ "$1" = "-c" ]; then if grep -q "^srun" LOG; then echo 3; else echo 1; fi; '
                  'else echo "python $@" >> LOG; fi',
    }
    for name, body in fakes.items():
        path = bin_ / name
        path.write_text("#!/usr/bin/env bash\n" + body.replace("LOG", str(log)) + "\n")
        path.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="n[1-3]",
               RAGRL_RAY_JOIN_TIMEOUT_S="20")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "verl_ray_launch.sh"), str(bin_ / "python"), "a=1", "b=x y"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    head = next(i for i, c in enumerate(calls) if c.startswith("ray start --head"))
    assert "--port=6621" in calls[head]  # 6379 + 4242 % 1000
    workers = next(i for i, c in enumerate(calls) if c.startswith("srun"))
    assert "--nodes=2" in calls[workers] and "--exclude=n1" in calls[workers] and "--overlap" in calls[workers]
    assert "ray start --address=" in calls[workers]
    train = calls.index("python -m verl.trainer.main_ppo a=1 b=x y")
    stop = next(i for i, c in enumerate(calls) if c.startswith("ray stop"))
    assert head < workers < train < stop


# --------------------------------------------------------------------------- pure, main venv


def test_overrides_refuse_what_verl_cannot_do():
    base = dict(RECIPE, rl=dict(RECIPE["rl"]))
    paths = VerlPaths(*(Path(f"/x/{n}") for n in ("t.parquet", "v.parquet", "m", "c", "a.yaml", "r.py")))
    for bad, message in (({"algorithm": "ppo_clip"}, "GRPO only"), ({"algorithm": "remax"}, "GRPO only"),
                         ({"turn_advantage_weight": 0.5}, "turn-level"),
                         ({"filter_tied_groups": True}, "filter_tied_groups: verl's main_ppo"),
                         ({"num_mini_batches": 3}, "divisible"), ({"lr": -1, "steps": 0}, "steps=0 must be >= 1")):
        # Settings RLConfig rejects already fail when the recipe is read (before any job starts).
        with pytest.raises(ValueError, match=message):
            build_overrides(parse_recipe(dict(base, rl={**base["rl"], **bad}), "r"), paths, n_prompts=8,
                            max_prompt_length=100)
    with pytest.raises(ValueError, match="fewer than batch_prompts"):
        build_overrides(parse_recipe(base, "r"), paths, n_prompts=3, max_prompt_length=100)


def test_overrides_mapping_and_escape_hatch():
    recipe = parse_recipe(dict(RECIPE, rl={**RECIPE["rl"], "loss_agg": "dr_grpo", "micro_batch_size": 2,
                                           "kl_coef": 0.0, "verl": {"trainer.nnodes": 4, "+trainer.extra": "a b"}}), "r")
    paths = VerlPaths(*(Path(f"/x/{n}") for n in ("t.parquet", "v.parquet", "m", "c", "a.yaml", "r.py")))
    out = build_overrides(recipe, paths, n_prompts=8, max_prompt_length=100)
    kv = dict(o.split("=", 1) for o in out)
    assert kv["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert kv["actor_rollout_ref.actor.loss_scale_factor"] == "400"  # the response budget
    assert kv["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "2"
    assert kv["actor_rollout_ref.actor.use_kl_loss"] == "false"
    # No dual clip in the recipe: a cap verl's clamped ratio (<= e^20) never reaches, not verl's 3.0.
    assert float(kv["actor_rollout_ref.actor.clip_ratio_c"]) > 5e8
    dual = parse_recipe(dict(RECIPE, rl={**RECIPE["rl"], "clip_ratio_c": 3.0}), "r")
    assert "actor_rollout_ref.actor.clip_ratio_c=3.0" in build_overrides(dual, paths, n_prompts=8, max_prompt_length=100)
    assert kv["actor_rollout_ref.actor.optim.lr_scheduler_type"] == "constant"
    assert kv["actor_rollout_ref.actor.shuffle"] == "true"  # RLConfig's default; the verl forks split in order
    cosine = parse_recipe(dict(RECIPE, rl={**RECIPE["rl"], "lr_scheduler": "cosine"}), "r")
    assert "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine" in build_overrides(cosine, paths, n_prompts=8,
                                                                                       max_prompt_length=100)
    assert kv["actor_rollout_ref.model.use_remove_padding"] == "true"  # RECIPE's rl.padding_free
    assert kv["trainer.nnodes"] == "4" and list(kv).count("trainer.nnodes") == 1
    assert kv["+trainer.extra"] == "'a b'"
    assert kv["trainer.total_epochs"] == "2"  # 3 steps at 2 steps per epoch (8 prompts / 4)
    assert len(out) == len(kv)


def test_hydra_values():
    assert hydra_value(True) == "true" and hydra_value(None) == "null" and hydra_value(0.5) == "0.5"
    assert hydra_value("/a/b-c.parquet") == "/a/b-c.parquet"
    assert hydra_value("it's here") == "'it\\'s here'" and hydra_value("null") == "'null'"
    assert hydra_value({"w": {"em": 1.0}, "env": "search"}) == "{w:{em:1.0},env:search}"
    assert hydra_value(["console", "file"]) == "[console,file]"


def test_cluster_shape_from_slurm():
    assert cluster_from_env({}).nnodes == 1 and cluster_from_env({}).gpus_per_node == 1
    slurm = cluster_from_env({"SLURM_JOB_NUM_NODES": "3", "SLURM_GPUS_ON_NODE": "8"})
    assert (slurm.nnodes, slurm.gpus_per_node) == (3, 8)
    assert cluster_from_env({"CUDA_VISIBLE_DEVICES": "0,1"}).gpus_per_node == 2
    assert cluster_from_env({"RAGRL_VERL_NNODES": "2", "SLURM_JOB_NUM_NODES": "3"}).nnodes == 2


def test_train_log_from_verl_attempts(tmp_path):
    """A resumed run re-logs from its checkpoint: the later attempt wins; keys become ours."""
    first, second = tmp_path / "attempt-1.jsonl", tmp_path / "attempt-2.jsonl"
    first.write_text("\n".join(json.dumps({"step": s, "data": {"critic/score/mean": s / 10, "actor/entropy": 1.0}})
                               for s in (1, 2, 3)) + "\n")
    second.write_text(json.dumps({"step": 3, "data": {"critic/score/mean": 0.9, "timing_s/step": 2}}) + "\n"
                      + json.dumps({"step": 4, "data": {"critic/score/mean": 1.0, "actor/kl_loss": 0.01}}) + "\n")
    records = convert_log([first, second])
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[2] == {"step": 3, "reward_mean": 0.9, "step_time_s": 2.0}
    assert records[3] == {"step": 4, "reward_mean": 1.0, "kl": 0.01}


def test_train_log_skips_a_killed_attempts_half_line_and_names_a_bad_one(tmp_path):
    from ragrl.errors import DataFormatError

    killed = tmp_path / "attempt-1.jsonl"
    killed.write_text(json.dumps({"step": 1, "data": {"critic/score/mean": 0.5}}) + '\n{"step": 2, "da')
    assert convert_log([killed]) == [{"step": 1, "reward_mean": 0.5}]
    bad = tmp_path / "attempt-2.jsonl"
    bad.write_text('{"data": {}}\n' + json.dumps({"step": 3, "data": {}}) + "\n")
    with pytest.raises(DataFormatError, match=r"attempt-2\.jsonl:1: not a verl log record.*'step'"):
        convert_log([killed, bad])
    bad.write_text('{"step": 3, "da\n')  # a broken line that is not the last write of a killed run
    bad.write_text(bad.read_text() + json.dumps({"step": 4, "data": {}}) + "\n")
    with pytest.raises(DataFormatError, match=r"attempt-2\.jsonl:1:"):
        convert_log([bad])


def test_verl_reward_scores_the_recorded_turns_not_the_text():
    """verl's reward reads the agent loop's turn record: a turn-limit notice the policy typed into
    its own turn does not excuse that turn from <think>, as it would if the text were re-parsed."""
    from ragrl.agent.protocol import TURN_LIMIT_NOTICE
    from ragrl.verl.reward import compute_score

    typed = f"<information>{TURN_LIMIT_NOTICE}</information><answer>Paris</answer>"
    text = "<think>a</think><search>q</search>\n\n<information>Doc 1</information>\n\n" + typed
    turns = [{"text": "<think>a</think><search>q</search>", "observation": "Doc 1", "after_notice": False},
             {"text": typed, "observation": None, "after_notice": False}]
    weights = {"em": 1.0, "format": 0.1}
    recorded = compute_score("ragrl/test", text, ["Paris"], {"ragrl_answer": "Paris", "ragrl_turns": turns},
                             weights=weights)
    assert recorded["format"] == 0.0 and recorded["score"] == pytest.approx(1.0)
    assert compute_score("ragrl/test", text, ["Paris"], _recorded(text), weights=weights)["format"] == 1.0
    with pytest.raises(ValueError, match="ragrl_turns"):
        compute_score("ragrl/test", text, ["Paris"], {"index": 3}, weights=weights)
