"""`ragrl rl` for a recipe with `rl.backend: verl`: the same inputs and outputs as the local backend.

Inputs as rule `rl` passes them (recipe, QA parquet, start policy, retriever flags, --out work
dir, --log-out); outputs where the local backend writes them, so rules `merge_rl`, `eval` and
`results_db` run unchanged:

    <out>/final/                 verl's model merger output, a full HF checkpoint with tokenizer
                                 (model.safetensors: the rule's declared output; merge_rl copies a
                                 full model through)
    <out>/train_log.jsonl        one JSON line per step in our log keys (reward_mean, kl, ...),
                                 copied to --log-out
    <out>/verl_checkpoints/      verl's own checkpoints (global_step_N/actor): a re-run after a
                                 kill resumes from the last one (trainer.resume_mode=auto)
    <out>/verl_logs/*.jsonl      verl's raw per-step metrics, one file per launch attempt
    <out>/verl_data/, agent_loop.yaml, overrides.txt, retriever.log   what the run was given

Steps: write verl's parquet from the QA parquet (checked against the rollout engine's prompts);
start `ragrl serve-retriever` on this node (the agent loops on every node query it over HTTP);
run scripts/verl_ray_launch.sh with the verl env's python and the overrides (Ray head here,
workers on the allocation's other nodes via srun, then `python -m verl.trainer.main_ppo`); merge
the last checkpoint with `python -m verl.model_merger merge --backend fsdp`; convert the log.

Environment: RAGRL_VERL_PYTHON (the verl env's python; default .venv-verl/bin/python),
RAGRL_VERL_LAUNCHER (default scripts/verl_ray_launch.sh), RAGRL_VERL_NNODES /
RAGRL_VERL_GPUS_PER_NODE (default: from SLURM, else 1 node and the visible GPUs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ragrl.io import atomic_dir, atomic_path
from ragrl.verl.overrides import AGENT_NAME, VerlCluster, VerlPaths, build_overrides
from ragrl.workdir import held_fds, release_superseded

REPO = Path(__file__).resolve().parents[3]
AGENT_LOOP_TARGET = "ragrl.verl.agent_loop.RagrlAgentLoop"
# verl metric -> our train_log key (the columns results_db and the plots read)
LOG_KEYS = {
    "critic/score/mean": "reward_mean",
    "critic/score/std": "reward_std",
    "actor/kl_loss": "kl",
    "actor/entropy": "entropy",
    "response_length/mean": "response_length",
    "actor/lr": "lr",
    "timing_s/step": "step_time_s",
    "actor/pg_loss": "pg_loss",
    "actor/grad_norm": "grad_norm",
}


def verl_python() -> Path:
    path = Path(os.environ.get("RAGRL_VERL_PYTHON") or REPO / ".venv-verl" / "bin" / "python")
    if not path.exists():
        raise FileNotFoundError(f"no verl python at {path}: build .venv-verl with `make verl-venv` "
                                "(or create envs/verl.yaml) and/or set RAGRL_VERL_PYTHON")
    return path


def launcher_script() -> Path:
    for path in (os.environ.get("RAGRL_VERL_LAUNCHER"), Path.cwd() / "scripts" / "verl_ray_launch.sh",
                 REPO / "scripts" / "verl_ray_launch.sh"):
        if path and Path(path).is_file():
            return Path(path)
    raise FileNotFoundError("scripts/verl_ray_launch.sh not found; run from the repository or set RAGRL_VERL_LAUNCHER")


def cluster_from_env(env: dict | None = None) -> VerlCluster:
    """Nodes and GPUs per node of this allocation: explicit settings, then SLURM, then this machine."""
    env = os.environ if env is None else env
    nnodes = env.get("RAGRL_VERL_NNODES") or env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    gpus = env.get("RAGRL_VERL_GPUS_PER_NODE") or env.get("SLURM_GPUS_ON_NODE")
    if not gpus and env.get("CUDA_VISIBLE_DEVICES"):
        gpus = str(len([d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]))
    return VerlCluster(nnodes=int(nnodes), gpus_per_node=int(gpus or 1))


def agent_loop_entries(recipe, retriever_url: str | None) -> list[dict]:
    """The YAML list verl loads from rollout.agent.agent_loop_config_path: our loop and its settings."""
    # The recipe travels as JSON: hydra would hand nested mappings over as DictConfig objects.
    return [{
        "name": AGENT_NAME,
        "_target_": AGENT_LOOP_TARGET,
        "recipe": json.dumps(recipe.to_config(), sort_keys=True),
        "recipe_name": recipe.name,
        "retriever_url": retriever_url,
    }]


def convert_log(attempts: list[Path]) -> list[dict]:
    """verl's file-logger lines ({"step", "data"}) -> our train_log records, one per step.

    A resumed run logs again from its checkpoint's step: the later attempt wins for a step.
    """
    from ragrl.errors import DataFormatError

    by_step: dict[int, dict] = {}
    for path in attempts:
        text = path.read_text()
        lines = text.splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                data = obj.get("data") or {}
                record = {"step": int(obj["step"])}
                if not isinstance(data, dict):
                    raise TypeError(f"'data' is a {type(data).__name__}")
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
                if n == len(lines) and not text.endswith("\n"):
                    break  # the line a killed attempt was writing: its step is logged again on resume
                raise DataFormatError(path, f"not a verl log record {{step, data}} ({exc!r})", line=n) from None
            for key, ours in LOG_KEYS.items():
                value = data.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    record[ours] = float(value)
            by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]


def latest_checkpoint(checkpoints: Path) -> Path:
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    if not tracker.is_file():
        raise FileNotFoundError(f"{tracker}: verl saved no checkpoint (trainer.save_freq must be > 0)")
    actor = checkpoints / f"global_step_{int(tracker.read_text().strip())}" / "actor"
    if not actor.is_dir():
        raise FileNotFoundError(f"{actor}: the checkpoint the tracker names is missing")
    return actor


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def start_retriever(index: Path | None, bm25: Path | None, mode: str | None, log: Path, *, multi_node: bool,
                    timeout_s: float = 1800.0) -> tuple[subprocess.Popen | None, str | None]:
    """`ragrl serve-retriever` on this node; its URL must be reachable from every node of the job.

    One node: loopback. Several: this node's address (the service has no authentication, so it is
    bound to the cluster-facing interface only for the job's duration, never to 0.0.0.0).
    """
    import httpx

    if index is None and bm25 is None:
        return None, None
    host = socket.gethostbyname(socket.gethostname()) if multi_node else "127.0.0.1"
    port = _free_port()
    cmd = [sys.executable, "-m", "ragrl", "serve-retriever", "--host", host, "--port", str(port)]
    for flag, value in (("--index", index), ("--bm25", bm25), ("--mode", mode)):
        if value is not None:
            cmd += [flag, str(value)]
    log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"retrieval service exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(2)
    proc.terminate()
    raise TimeoutError(f"retrieval service not healthy after {timeout_s:.0f} s; see {log}")


def run_verl(recipe, qa: Path, policy: Path, out_dir: Path, *, index: Path | None = None, bm25: Path | None = None,
             mode: str | None = None, limit: int | None = None, log_out: Path | None = None) -> Path:
    from transformers import AutoTokenizer

    from ragrl.recipe import rl_config
    from ragrl.train.checkpoint import prepare_work_dir
    from ragrl.verl.data import check_prompts_match_engine, write_verl_parquet

    out_dir = Path(out_dir).resolve()
    python, launcher = verl_python(), launcher_script()
    rl_config(recipe)  # a bad setting fails before the work dir (earlier checkpoints) is touched
    prepare_work_dir(out_dir, {"recipe": dataclasses.asdict(recipe), "limit": limit, "backend": "verl"},
                     {"policy": policy, "qa": qa, "index": index, "bm25": bm25})
    tokenizer = AutoTokenizer.from_pretrained(policy)
    train = out_dir / "verl_data" / "train.parquet"
    stats = write_verl_parquet(qa, train, recipe, tokenizer, limit=limit)
    check_prompts_match_engine(train, recipe, tokenizer)
    cluster = cluster_from_env()
    service, url = start_retriever(index, bm25, mode, out_dir / "retriever.log", multi_node=cluster.nnodes > 1)
    try:
        agent_cfg = out_dir / "agent_loop.yaml"
        with atomic_path(agent_cfg) as tmp:
            tmp.write_text(yaml.safe_dump(agent_loop_entries(recipe, url), sort_keys=False))
        paths = VerlPaths(train_parquet=train, val_parquet=train, policy=Path(policy).resolve(),
                          checkpoints=out_dir / "verl_checkpoints", agent_loop_config=agent_cfg,
                          reward_module=Path(__file__).with_name("reward.py"))
        overrides = build_overrides(recipe, paths, n_prompts=stats["rows"],
                                    max_prompt_length=stats["max_prompt_length"], cluster=cluster)
        (out_dir / "overrides.txt").write_text("\n".join(overrides) + "\n")
        logs = out_dir / "verl_logs"
        logs.mkdir(exist_ok=True)
        # PYTHONPATH: Ray's processes (here and, through srun, on the other nodes) import our agent
        # loop and reward from this source tree, also where the verl env has no ragrl installed.
        src = str(REPO / "src")
        env = dict(os.environ, VERL_FILE_LOGGER_PATH=str(logs / f"attempt-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"),
                   PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p))
        cmd = ["bash", str(launcher), str(python), *overrides]
        print("$ " + " ".join(cmd), flush=True)
        # The launcher and verl's trainer get the work dir's lock too: a kill of this process
        # alone leaves them training, and no second job may start on out_dir meanwhile.
        subprocess.run(cmd, check=True, env=env, cwd=out_dir, pass_fds=held_fds(out_dir))
    finally:
        if service is not None:
            service.terminate()
            service.wait(timeout=60)

    final = out_dir / "final"
    with atomic_dir(final) as tmp:
        subprocess.run([str(python), "-m", "verl.model_merger", "merge", "--backend", "fsdp",
                        "--local_dir", str(latest_checkpoint(paths.checkpoints)), "--target_dir", str(tmp)],
                       check=True, cwd=out_dir)
        if not (tmp / "model.safetensors").is_file():
            raise RuntimeError(f"the model merger wrote {sorted(p.name for p in tmp.iterdir())}, no single "
                               "model.safetensors (a model over save_pretrained's 50 GB shard size); rule rl declares "
                               "final/model.safetensors")
    # verl writes its checkpoints itself; the superseded work goes once this one's model exists.
    release_superseded(out_dir)
    records = convert_log(sorted(logs.glob("attempt-*.jsonl")))
    with atomic_path(out_dir / "train_log.jsonl") as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    if log_out is not None:
        with atomic_path(log_out) as tmp:
            shutil.copyfile(out_dir / "train_log.jsonl", tmp)
    return final
