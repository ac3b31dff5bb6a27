"""HARR's stage helpers and settings: the per-step sampler seed, multi-hop recall, parse_harr."""

from __future__ import annotations

import json

import pytest
import torch

from ragrl.recipe import HARR_RUNS, harr_generator_spec, harr_lineage, parse_harr
from ragrl.stages.harr import GeneratorSource, multihop_recall, served, step_seed

from harr_helpers import one_thread  # noqa: F401  (autouse: one OpenMP thread)
from helpers import HashedBagPolicy, world  # noqa: F401  (world: a toy index, passages and policy)

BASE = {"generator": "search_r1_sft", "index": "flat", "train_dataset": "world_train", "eval_datasets": ["world_test"]}


def test_step_seed_depends_on_seed_and_step_only():
    assert step_seed(0, 5) == step_seed(0, 5)  # a resumed run redraws what the killed one drew
    seeds = {step_seed(s, t) for s in range(3) for t in range(-3, 50)}
    assert len(seeds) == 3 * 53  # no two (seed, step) pairs share a sampler seed
    assert all(0 <= x < 2**32 for x in seeds)  # the engine's per-turn seed * 1_000_003 + turn fits in int64
    assert step_seed(0, 1) == 2440984149  # stable across Python processes (no hash())


def test_multihop_recall_counts_only_questions_with_several_supporting_passages():
    ranked = [["a", "b", "c"], ["x", "y", "z"], ["p", "q", "r"]]
    supporting = [["b", "c"], ["x"], ["r", "s"]]  # the 1-hop question in the middle is left out
    out = multihop_recall(ranked, supporting, [1, 2, 3])
    assert out["recall@1"] == [0.0, 0.0]
    assert out["recall@2"] == [0.5, 0.0]
    assert out["recall@3"] == [1.0, 0.5]
    assert out["all@3"] == [1.0, 0.0]
    with pytest.raises(ValueError):
        multihop_recall(ranked, supporting[:2], [1])


def test_parse_harr_checks_every_section_against_its_dataclass():
    parsed = parse_harr({**BASE, "train": {"steps": 3, "group_size": 4}, "encoder": {"lora_r": 4},
                         "environment": {"topk": 2, "template": "{state}"}})
    assert (parsed.train.steps, parsed.train.group_size, parsed.encoder.lora_r, parsed.environment.topk) == (3, 4, 4, 2)
    assert parse_harr(parsed.to_config()) == parsed
    for bad, needle in [({"train": {"stepz": 1}}, "harr.train"), ({"encoder": {"rank": 1}}, "harr.encoder"),
                        ({"environment": {"topk": 5, "pool_size": 3}}, "harr.environment"),
                        ({"environment": {"template": "no placeholder"}}, "harr.environment"),
                        ({"train": {"group_size": 1}}, "harr.train"), ({"recall_k": [0]}, "harr.recall_k"),
                        ({"eval_datasets": []}, "harr.eval_datasets"), ({"typo": 1}, "harr")]:
        with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
            parse_harr({**BASE, **bad})


GEN_RECIPE = {"env": "search", "topk": 3, "rollout": {"max_turns": 4}}


def test_the_generator_is_a_run_or_an_outside_checkpoint_and_says_how_it_is_served():
    assert harr_generator_spec("search_r1_rl") == {"run": "search_r1_rl"}
    served_spec = harr_generator_spec({"model": "org/searcher", "recipe": GEN_RECIPE,
                                       "serve": {"args": ["--dtype", "bfloat16"]}})
    assert served_spec["serve"] == {"args": ["--dtype", "bfloat16"]} and served_spec["recipe"]["env"] == "search"
    # env defaults as in a recipes entry, and is filled in for the workflow to read
    assert harr_generator_spec({"model": "m", "recipe": {"topk": 2}})["recipe"]["env"] == "search"
    external = harr_generator_spec({"run": "search_r1_sft", "base_url": "http://h:8000", "served_name": "g"})
    assert external == {"run": "search_r1_sft", "base_url": "http://h:8000", "served_name": "g"}
    assert "serve" not in harr_generator_spec({"run": "r", "serve": None})  # an overlay's null: in process
    for bad, needle in [({"model": "m"}, r"harr\.generator\.recipe'.*needs the recipe settings"),
                        ({"run": "r", "model": "m", "recipe": {}}, "exactly one of run"),
                        ({"recipe": GEN_RECIPE}, "exactly one of run"),
                        ({"run": "r", "recipe": GEN_RECIPE}, "brings its own recipe"),
                        ({"run": "r", "base_url": "http://h", "serve": True}, "exclude each other"),
                        ({"run": "r", "serve": {"argz": []}}, r"harr\.generator\.serve\.argz"),
                        ({"run": "r", "served_name": "g"}, "only with base_url"),
                        ({"run": "r", "port": 1}, r"harr\.generator\.port"),
                        ({"model": "m", "recipe": {"rollout": {"max_turnz": 2}}}, r"harr\.generator\.recipe\.rollout"),
                        ("", "a run name or a mapping"), (None, "a run name or a mapping")]:
        with pytest.raises(ValueError, match=needle):
            harr_generator_spec(bad)
    with pytest.raises(ValueError, match=r"harr\.generator"):
        parse_harr({**BASE, "generator": {"model": "m"}})
    assert parse_harr({**BASE, "generator": {"run": "x", "serve": True}}).generator == {"run": "x", "serve": True}


def test_served_starts_nothing_for_an_in_process_or_external_generator():
    for source in (GeneratorSource("m"), GeneratorSource("m", {"base_url": "http://127.0.0.1:9", "served_name": "g"}),
                   GeneratorSource("m", {"serve": False})):
        with served(source) as got:
            assert got is source


def test_a_generator_this_job_serves_is_defined_by_its_settings_not_its_port():
    started = GeneratorSource("m", {"serve": {"args": ["--dtype", "bfloat16"]}, "base_url": "http://127.0.0.1:41234",
                                    "served_name": "g"})
    assert started.definition() == {"serve": {"args": ["--dtype", "bfloat16"]}, "served_name": "g"}
    outside = {"base_url": "http://h:8000", "served_name": "g"}
    assert GeneratorSource("m", outside).definition() == outside  # another server is another generator
    assert GeneratorSource("m").definition() == {}


def test_the_four_evaluated_runs_and_their_lineage():
    # frozen: the index's own encoder, query-only states; the same encoder on history-aware states;
    # HARR: trained with history; the ablation without.
    assert HARR_RUNS == {"harr_frozen": (False, False), "harr_frozen_history": (False, True), "harr": (True, True),
                         "harr_no_history": (True, False)}
    lineage = harr_lineage(HARR_RUNS)
    # what each trained encoder was before training, under the states it is evaluated with
    assert lineage["harr"]["start_run"] == "harr_frozen_history"
    assert lineage["harr_no_history"]["start_run"] == "harr_frozen"
    assert lineage["harr_no_history"]["ablation_of"] == "harr" and lineage["harr"]["ablation_of"] is None
    assert lineage["harr_frozen_history"]["variant_of"] == "harr_frozen"
    assert lineage["harr_frozen_history"]["step"] == "history" and lineage["harr_frozen"]["step"] == "base"
    assert lineage["harr_frozen"]["variant_of"] is None
    # without a frozen run under the same features, a trained run starts from the plain frozen one
    assert harr_lineage({"f": (False, False), "h": (True, True)})["h"]["start_run"] == "f"


class AnswerByQuestion:
    """Stands in for the rollout engine: one search per trajectory, then a scripted answer per question
    (q1 alternates right / wrong over g, q2 is always right, q3 always wrong)."""

    def __init__(self, env):
        self.env = env
        self.runs = 0

    def prompt_ids(self, question):
        return [len(question)]

    def run(self, prompts, n=1, seed=None, sample_ids=None):
        from types import SimpleNamespace

        from ragrl.agent.protocol import Action

        self.runs += 1
        self.env.respond([Action("search", (f"about {sid}",)) for sid in sample_ids], sample_ids=sample_ids)
        answers = {"q1": lambda g: "Paris" if g % 2 == 0 else "Rome", "q2": lambda g: "London", "q3": lambda g: "Oslo",
                   "q4": lambda g: "Lima" if g % 2 == 0 else "Rome", "q5": lambda g: "Quito" if g % 2 else "Rome"}
        return [SimpleNamespace(answer=answers[sid.split("#")[0]](int(sid.split("#")[1]))) for sid in sample_ids]


def _scripted_filter(monkeypatch, tmp_path, world, questions, types=None, metadata=None, **settings):
    import pyarrow as pa

    from ragrl.io import write_parquet
    from ragrl.stages import harr as stage

    policy, index, store = world
    monkeypatch.setattr(stage, "_world", lambda index_dir, passages: stage._World(index, {}, store))
    monkeypatch.setattr(stage, "_policy", lambda meta, harr, encoder, trainable: policy)
    monkeypatch.setattr(stage, "_engine", lambda recipe, harr, generator, env: AnswerByQuestion(env))
    golds = {"q1": ["Paris"], "q2": ["London"], "q3": ["Berlin"], "q4": ["Lima"], "q5": ["Quito"]}
    qa = tmp_path / "train.parquet"
    columns = {"id": questions, "question": [f"Question {q}?" for q in questions],
               "golden_answers": [golds[q] for q in questions]}
    if types is not None:
        columns["metadata"] = metadata or [json.dumps({"type": t}) for t in types]
    write_parquet(pa.table(columns), qa)
    harr = parse_harr({**BASE, "environment": {"topk": 2, "pool_size": 5, "rollout_batch_questions": 2},
                       "train": {"group_size": 4}, **settings})
    out = tmp_path / "kept.parquet"
    return stage.filter_stage(None, harr, qa, tmp_path, tmp_path, tmp_path, out), out


def test_filter_keeps_the_questions_whose_f1_varies(monkeypatch, tmp_path, world):
    import pyarrow.parquet as pq

    stats, out = _scripted_filter(monkeypatch, tmp_path, world, ["q1", "q2", "q3"])
    assert pq.read_table(out).column("id").to_pylist() == ["q1"]
    assert stats["questions"] == 3 and stats["kept"] == 1 and stats["group_size"] == 4
    assert stats["any_f1_share"] == pytest.approx(2 / 3)


def test_train_mix_rolls_out_only_its_types_and_caps_what_the_filter_keeps(monkeypatch, tmp_path, world):
    import pyarrow.parquet as pq

    questions, types = ["q1", "q4", "q3", "q5", "q2"], ["bridge", "1hop", "comparison", "1hop", "bridge"]
    stats, out = _scripted_filter(monkeypatch, tmp_path, world, questions, types,
                                  train_mix={"bridge": None, "1hop": 1})
    # q3 (comparison) is never rolled out; q1, q4 and q5 vary, q2 does not; the cap keeps q4, the
    # first 1-hop question the filter passed, and drops q5.
    assert (stats["questions"], stats["passed"], stats["kept"]) == (4, 3, 2)
    assert pq.read_table(out).column("id").to_pylist() == ["q1", "q4"]
    with pytest.raises(ValueError, match=r"no question of the types harr\.train_mix names \(film\).*'1hop'"):
        _scripted_filter(monkeypatch, tmp_path, world, questions, types, train_mix={"film": None})
    # Metadata that is not a JSON object fails naming the file and the row, not typed "" (never rolled out).
    with pytest.raises(ValueError, match=r"train\.parquet: QA row 'q3': metadata: not a JSON object"):
        metadata = [json.dumps({"type": t}) if q != "q3" else "{not json" for q, t in zip(questions, types)]
        _scripted_filter(monkeypatch, tmp_path, world, questions, types, metadata, train_mix={"bridge": None, "1hop": 1})
    for bad in ({}, {"bridge": 0}, {"bridge": True}, ["bridge"]):
        with pytest.raises(ValueError, match=r"harr\.train_mix"):
            parse_harr({**BASE, "train_mix": bad})
    assert parse_harr(parse_harr({**BASE, "train_mix": {"bridge": None, "1hop": 8}}).to_config()).train_mix == (
        ("bridge", None), ("1hop", 8))


def test_filter_keep_stops_at_its_target_in_the_order_filter_seed_gives(monkeypatch, tmp_path, world):
    # HARR's filter_data.py: shuffle the questions (HF datasets' shuffle(seed)), roll them out a
    # batch at a time, stop once --num_samples are kept.
    import numpy as np
    import pyarrow.parquet as pq

    stats, out = _scripted_filter(monkeypatch, tmp_path, world, ["q2", "q1", "q3", "q4", "q5"], filter_keep=2)
    # batches of 2: [q2, q1] keeps q1, [q3, q4] keeps q4: the target; q5 is never rolled out
    assert (stats["questions"], stats["passed"], stats["kept"]) == (4, 2, 2)
    assert pq.read_table(out).column("id").to_pylist() == ["q1", "q4"]
    stats, out = _scripted_filter(monkeypatch, tmp_path, world, ["q1", "q4", "q5"], filter_keep=1)
    assert (stats["questions"], stats["kept"]) == (2, 1)  # the first batch already holds two that vary
    assert pq.read_table(out).column("id").to_pylist() == ["q1"]
    questions = ["q1", "q4", "q5"]
    for seed in (0, 1, 7):
        first = questions[np.random.default_rng(seed).permutation(3)[0]]
        stats, out = _scripted_filter(monkeypatch, tmp_path, world, questions, filter_keep=1, filter_seed=seed)
        assert pq.read_table(out).column("id").to_pylist() == [first]
    # with train_mix's caps, the target counts what the caps keep
    stats, out = _scripted_filter(monkeypatch, tmp_path, world, ["q1", "q4", "q5", "q2"],
                                  ["1hop", "1hop", "bridge", "bridge"], train_mix={"1hop": 1, "bridge": None},
                                  filter_keep=2)
    assert pq.read_table(out).column("id").to_pylist() == ["q1", "q5"]
    for key, bad in (("filter_keep", 0), ("filter_keep", True), ("filter_seed", -1), ("filter_seed", "42")):
        with pytest.raises(ValueError, match=rf"harr\.{key}"):
            parse_harr({**BASE, key: bad})
    again = parse_harr(parse_harr({**BASE, "filter_keep": 2400, "filter_seed": 42}).to_config())
    assert (again.filter_keep, again.filter_seed) == (2400, 42)
    # unset, they stay out of the jobs' params: results made before they existed do not re-run
    assert not {"filter_keep", "filter_seed"} & set(parse_harr(BASE).to_config())


def test_a_filter_that_keeps_nothing_fails_saying_why(monkeypatch, tmp_path, world):
    with pytest.raises(ValueError, match="kept no question"):
        _scripted_filter(monkeypatch, tmp_path, world, ["q2", "q3"])


def test_the_generator_is_prompted_as_the_agent_it_was_trained_as(world):
    """The HARR environment's query-encoder instruction must not become the generator's prompt (the
    rollout engine reads an environment's `instruction` as the prompt; it once read the encoder's)."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from ragrl.agent.environments import SearchEnvironment
    from ragrl.agent.rollout import RolloutEngine
    from ragrl.train.retriever_rollout import HistoryAwareSearchEnvironment

    policy, index, store = world
    tok = AutoTokenizer.from_pretrained(Path(__file__).parents[2] / "resources/pretrained/96870ad46090db11")
    plain = RolloutEngine(None, tok, SearchEnvironment(None, 2)).prompt_ids("Where is Velmora?")
    for history in (True, False):
        env = HistoryAwareSearchEnvironment(policy, index, store, topk=2, pool_size=5, use_history=history)
        assert RolloutEngine(None, tok, env).prompt_ids("Where is Velmora?") == plain


# --- the training's work directory -------------------------------------------------------------------


TRAIN = {"steps": 2, "questions_per_step": 2, "group_size": 4, "lr": 0.05, "checkpoint_every": 1}


def _scripted_train(monkeypatch, tmp_path, world, *, questions=("q1", "q2"), generator=b"weights v1", **train):
    """train_stage on the scripted generator, a fresh seeded policy as a new process would build;
    returns (the trained policy, the rollout calls this run made)."""
    import pyarrow as pa

    from ragrl.io import write_parquet
    from ragrl.stages import harr as stage

    _, index, store = world
    made = {}

    def policy(meta, harr, encoder, trainable):
        torch.manual_seed(0)
        made["policy"] = HashedBagPolicy()
        return made["policy"]

    def engine(recipe, harr, generator, env):
        made["engine"] = AnswerByQuestion(env)
        return made["engine"]

    monkeypatch.setattr(stage, "_world", lambda index_dir, passages: stage._World(index, {}, store))
    monkeypatch.setattr(stage, "_policy", policy)
    monkeypatch.setattr(stage, "_engine", engine)
    qa, gen = tmp_path / "kept.parquet", tmp_path / "generator"
    gen.mkdir(parents=True, exist_ok=True)
    (gen / "model.safetensors").write_bytes(generator)
    golds = {"q1": ["Paris"], "q2": ["London"], "q3": ["Berlin"]}
    write_parquet(pa.table({"id": list(questions), "question": [f"Question {q}?" for q in questions],
                            "golden_answers": [golds[q] for q in questions]}), qa)
    harr = parse_harr({**BASE, "environment": {"topk": 2, "pool_size": 5}, "train": {**TRAIN, **train}})
    stage.train_stage(None, harr, qa, tmp_path / "index", tmp_path / "passages", gen, tmp_path / "work",
                      use_history=True)
    return made["policy"], made["engine"].runs


def _rebuild(tmp_path):
    # What Snakemake does before re-running the rule: it deletes the declared output, not the work.
    (tmp_path / "work" / "final" / "state.json").unlink()


def test_the_same_training_rebuilt_resumes_its_checkpoints(monkeypatch, tmp_path, world):
    first, runs = _scripted_train(monkeypatch, tmp_path, world)
    assert runs == TRAIN["steps"]
    _rebuild(tmp_path)
    again, runs = _scripted_train(monkeypatch, tmp_path, world)
    assert runs == 0 and torch.equal(again.proj.weight, first.proj.weight)


@pytest.mark.parametrize("change", [{"lr": 0.2}, {"questions": ("q1", "q3")}, {"generator": b"weights v2"}],
                         ids=["setting", "filter-output", "generator"])
def test_a_changed_definition_retrains_instead_of_resuming(monkeypatch, tmp_path, world, change):
    """Issue #34 F2: an overlay of harr.train.lr (or a new filter output, or other generator weights)
    resumed the finished run's last checkpoint, ran no step, and shipped the old encoder."""
    _scripted_train(monkeypatch, tmp_path, world)
    _rebuild(tmp_path)
    changed, runs = _scripted_train(monkeypatch, tmp_path, world, **change)
    assert runs == TRAIN["steps"]  # every step made again, none resumed
    fresh, _ = _scripted_train(monkeypatch, tmp_path / "fresh", world, **change)
    assert torch.equal(changed.proj.weight, fresh.proj.weight)
    # The old work went aside, and was deleted with the new run's first checkpoint.
    assert not [p for p in (tmp_path / "work").iterdir() if p.name.startswith("superseded-")]
    definition = json.loads((tmp_path / "work" / "definition.json").read_text())
    assert definition["settings"]["train"]["lr"] == change.get("lr", TRAIN["lr"])
