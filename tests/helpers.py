"""What several test files share: the tiny workflow config and its Snakemake runner, the tiny
rollout policy and its invariants, HARR's toy retriever policy, the retrieval tests' passages.

Test files import from here, never from one another (tests/unit/test_test_layout.py checks). The
fixtures here are imported by the files that use them, so each file keeps its own instance, of
the scope it declares (tests/conftest.py groups a file's module fixtures on one xdist worker).
"""

from __future__ import annotations

import os

# Before transformers is imported: huggingface_hub reads it once, and nothing here may touch the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from ragrl.agent.protocol import OBS_PREFIX, OBS_SUFFIX, TURN_LIMIT_NOTICE
from ragrl.agent.rollout import RolloutConfig
from ragrl.retrieval.searcher import PassageStore
from ragrl.toy.tiny_model import TinyModelSpec, build_tiny
from ragrl.toy.world import generate_world, world_text, write_world

# --------------------------------------------------------------------------- the workflow on a tiny config

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

_SMALL = {
    "sft": {"limit": 12, "epochs": 1, "batch_size": 4},
    "rl": {"steps": 2, "batch_prompts": 2, "group_size": 2, "checkpoint_every": 1},
    "rollout": {"max_turns": 3, "max_turn_tokens": 64, "max_response_tokens": 2048, "max_obs_tokens": 800},
}
RUNS = ["base", "no_retrieval", "search_r1_sft", "search_r1_rl", "search_r1_oracle"]
KG_RUNS = ["kg_r1_sft", "kg_r1_rl"]
KG_DATASETS = ["world_kgqa_A_test", "world_kgqa_B_test"]


def tiny_config() -> dict:
    """The default config, shrunk: a 30-person world, a smaller policy, one recipe, one index.

    Built from config/config.yaml rather than layered over it, because a layered file cannot
    remove entries (the second recipe, the format examples) and the test must stay within minutes.
    """
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["world"] = {"seed": 3, "size": 30}
    # A randomly initialised policy: the pretrained reader is the default world's (shipped by
    # cache key), and pretraining one for this world would take half an hour (tests/workflow/test_learning.py
    # runs the pretrained route).
    cfg["pretrain"]["enabled"] = False
    cfg["models"]["tiny"] = {"vocab_size": 600, "hidden_size": 128, "num_heads": 2, "num_kv_heads": 1,
                             "num_layers": 2, "intermediate_size": 256, "seed": 0}
    cfg["corpora"] = {"world": cfg["corpora"]["world"], "dpr_example": cfg["corpora"]["dpr_example"]}
    cfg["datasets"] = {k: v for k, v in cfg["datasets"].items() if k.startswith("world_") or k == "musique_example"}
    cfg["retrieval"]["indexes"] = {"flat": "Flat"}
    recipes = cfg["recipes"]
    # The KG agent keeps its own turn budget (two queries per hop): only training is shrunk.
    kg_small = {k: v for k, v in _SMALL.items() if k != "rollout"}
    cfg["recipes"] = {
        "search_r1": {**recipes["search_r1"], **{k: {**recipes["search_r1"][k], **v} for k, v in _SMALL.items()}},
        "kg_r1": {**recipes["kg_r1"], **{k: {**recipes["kg_r1"][k], **v} for k, v in kg_small.items()}},
    }
    # AutoGraph-R1's constructor, graphs and the KG-R1 row over the built KG join in the end-to-end
    # test of tests/workflow/test_workflow.py (_end_to_end_config); the other tests run without them.
    cfg["recipes"]["kg_r1"]["eval_datasets"] = KG_DATASETS
    cfg["construct_kg"] = None
    cfg["datasets"].pop("world_kgqa_A_test_built")
    cfg["kgs"].pop("world_built")
    cfg["evaluation"].update(max_questions=4, batch_size=4)
    # No HARR: this world's random generator answers nothing, so HARR's filter would keep no
    # question (tests/workflow/test_harr_workflow.py runs HARR on this world with the filter off).
    cfg["harr"] = None
    # Pretraining on the same tiny budget, for when pretrain.enabled is on (its 600 default steps
    # would be minutes of every run here); config/test/*.yaml give the twins the same.
    cfg["pretrain"]["settings"].update(steps=2, batch_size=2, warmup_steps=1, log_every=1, eval_every=0,
                                       eval_questions=2, tokenizer_worlds=5, mix_worlds=1, world_people=20)
    # Four questions need not cover every question type: the by-type table is tested on its own
    # (tests/unit/test_results_db.py) and in the default run.
    # KnowRL's recipes and tables run in tests/workflow/test_knowrl_recipe.py.
    cfg["results"]["tables"] = [t for t in cfg["results"]["tables"]
                                if t["name"] != "toy_em_by_type" and not t["name"].startswith(("knowrl_", "autograph_"))]
    for table in cfg["results"]["tables"]:
        if table["name"].startswith("toy_"):
            table["runs"] = RUNS
    return cfg


TINY = tiny_config()


def jobs_run(output: str) -> set[tuple[str, str]]:
    """(rule, wildcards) of every job Snakemake announced: "rule X:" then indented details."""
    jobs = set()
    lines = output.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(?:local)?rule (\w+):$", line.strip())
        if not m:
            continue
        wildcards = ""
        for detail in lines[i + 1:]:
            if not detail.startswith("    "):
                break
            if detail.strip().startswith("wildcards:"):
                wildcards = detail.strip()[len("wildcards:"):].strip()
        jobs.add((m.group(1), wildcards))
    return jobs


def run_snakemake(workdir: Path, config: dict, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    # Config paths are relative to the working directory, as for a user's own corpora; the
    # default config's format examples live in the repository's resources/.
    if not (workdir / "resources").exists():
        (workdir / "resources").symlink_to(REPO / "resources")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), "--configfile", str(cfg),
         "--cores", "2", *args],
        capture_output=True, text=True, env=env, timeout=timeout,
    )


# --------------------------------------------------------------------------- the tiny rollout policy

SPEC = TinyModelSpec(vocab_size=600, hidden_size=128, num_heads=2, num_kv_heads=1, num_layers=2, intermediate_size=256)


def world_and_model(root, spec=SPEC):
    """The 3 x 30 toy world under root/world and a tiny model built on its text under root/model."""
    world = generate_world(3, 30)
    write_world(world, root / "world")
    return world, build_tiny(world_text(root / "world"), root / "model", spec)


class FakeRetriever:
    """Word-overlap ranking over the world's passages; records every call."""

    def __init__(self, passages, fail: Exception | None = None, mangle: Callable | None = None):
        self.passages = passages
        self.words = [set(re.findall(r"\w+", f"{p['title']} {p['text']}".lower())) for p in passages]
        self.calls: list[list[str]] = []
        self.fail = fail
        self.mangle = mangle

    def search(self, queries, topk):
        self.calls.append(list(queries))
        if self.fail is not None:
            raise self.fail
        out = [self._rank(q)[:topk] for q in queries]
        return self.mangle(out) if self.mangle else out

    def _rank(self, query):
        q = set(re.findall(r"\w+", query.lower()))
        order = sorted(range(len(self.passages)), key=lambda i: (-len(q & self.words[i]), self.passages[i]["id"]))
        return [{"id": self.passages[i]["id"], "title": self.passages[i]["title"], "text": self.passages[i]["text"],
                 "score": float(len(q & self.words[i]))} for i in order]


class RecordingGenerator:
    """Wraps a real backend and remembers what it returned for each context."""

    def __init__(self, inner):
        self.inner = inner
        self.outputs: dict[tuple[int, ...], list[list[int]]] = {}  # a GRPO group shares its first context
        self.calls = 0

    def generate(self, batch, max_new_tokens, *args, **kwargs):
        self.calls += 1
        out = self.inner.generate(batch, max_new_tokens, *args, **kwargs)
        for ids, new in zip(batch, out):
            self.outputs.setdefault(tuple(ids), []).append(new)
        return out


def encode_text(tok, text):
    return tok.encode(text, add_special_tokens=False)


def check_mask_against_info_spans(t, tok):
    """Locate observation spans by their tag ids (independently of the engine) and compare masks."""
    info_open, info_close = tok.convert_tokens_to_ids("<information>"), tok.convert_tokens_to_ids("</information>")
    answer_open = tok.convert_tokens_to_ids("<answer>")
    head, tail = encode_text(tok, OBS_PREFIX), encode_text(tok, OBS_SUFFIX)
    notice = encode_text(tok, TURN_LIMIT_NOTICE)
    ids = t.response_ids
    expected = [1] * len(ids)
    i = 0
    while i < len(ids):
        if ids[i] != info_open:
            i += 1
            continue
        j = ids.index(info_close, i)
        start, end = i - len(head) + 1, j + len(tail)
        assert ids[start : i + 1] == head and ids[j : end] == tail
        if ids[i + 1 : j] == notice and end < len(ids) and ids[end] == answer_open:
            end += 1  # the prefilled <answer> of the forced turn
        expected[start:end] = [0] * (end - start)
        i = end
    assert t.loss_mask == expected


def check_turns(t):
    n = len(t.response_ids)
    assert len(t.loss_mask) == len(t.turn_index) == n
    assert set(t.loss_mask) <= {0, 1}
    assert t.turn_index == sorted(t.turn_index), "turn indices must be non-decreasing"
    assert sum(t.loss_mask) == t.generated_tokens and n - sum(t.loss_mask) == t.observation_tokens
    if n:
        assert t.turn_index[0] == 0 and t.turn_index[-1] + 1 == len(t.actions)
    for k, action in enumerate(t.actions):
        assert action["turn"] == k
        masks = [m for m, ti in zip(t.loss_mask, t.turn_index) if ti == k]
        assert masks == sorted(masks, reverse=True), "a turn is its generated tokens, then the reply to them"
        assert masks.count(0) == action["observation_tokens"]
    assert t.num_searches == sum(a["type"] == "search" and a["valid"] for a in t.actions)
    assert t.finished == (t.answer is not None) == (t.stop_reason == "answer")


def check_bounds(t, cfg: RolloutConfig):
    assert len(t.response_ids) <= cfg.max_response_tokens
    assert len(t.prompt_ids) + len(t.response_ids) <= cfg.max_context_tokens
    assert len(t.actions) <= cfg.max_turns + 1


class FirstTurnSearches:
    """A random policy never writes a well-formed search: script the first turn (overshooting the
    closing tag), so that the server then continues from contexts holding retrieved passages."""

    def __init__(self, tok, inner):
        self.tok, self.inner, self.turns = tok, inner, 0

    def generate(self, batch, max_new_tokens, *args, **kwargs):
        self.turns += 1
        if self.turns > 1:
            return self.inner.generate(batch, max_new_tokens, *args, **kwargs)
        limits = [max_new_tokens] * len(batch) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        text = "<think>look it up</think><search>Velmar founded</search> spill"
        return [encode_text(self.tok, text)[:lim] for lim in limits]


# --------------------------------------------------------------------------- HARR: a toy retriever policy

DIM = 16


class HashedBagPolicy(torch.nn.Module):
    """Words hashed to fixed random vectors, summed, then one learnable linear map."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(DIM, DIM)

    @staticmethod
    def _bag(text: str) -> torch.Tensor:
        vecs = [torch.randn(DIM, generator=torch.Generator().manual_seed(
            int(hashlib.sha1(w.encode()).hexdigest()[:8], 16))) for w in text.split()]
        return torch.stack(vecs).sum(0) if vecs else torch.zeros(DIM)

    def forward(self, texts):
        return torch.nn.functional.normalize(self.proj(torch.stack([self._bag(t) for t in texts])), dim=-1)

    @torch.no_grad()
    def encode(self, texts):
        return self.forward(texts)


@pytest.fixture()
def world():
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(20, DIM)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(DIM)
    index.add(docs)
    store = PassageStore(pa.table({"id": [f"p{i}" for i in range(20)], "title": [f"T{i}" for i in range(20)],
                                   "text": [f"text {i}" for i in range(20)]}))
    torch.manual_seed(0)
    return HashedBagPolicy(), index, store


# --------------------------------------------------------------------------- retrieval: passages and vectors

MODEL = "sentence-transformers/all-MiniLM-L6-v2"

PASSAGES = [
    ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France, completed in 1889."),
    ("Photosynthesis", "Photosynthesis is the process by which green plants turn sunlight, water and carbon dioxide into sugar."),
    ("Python (programming language)", "Python is a programming language created by Guido van Rossum, first released in 1991."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas between Nepal and China."),
    ("Great Barrier Reef", "The Great Barrier Reef off Queensland, Australia is the world's largest coral reef system."),
    ("Penicillin", "Penicillin was discovered by Alexander Fleming in 1928 and was the first widely used antibiotic."),
    ("Jazz", "Jazz is a music genre that originated in African-American communities of New Orleans."),
    ("Quokka", "The quokka is a small wallaby that lives on Rottnest Island; locals call it the zorblax."),
    ("Apollo 11", "Apollo 11 was the spaceflight that first landed humans on the Moon, in July 1969."),
    ("Chess", "Chess is a board game for two players on a checkered board of 64 squares."),
    ("Volcano", "A volcano is a rupture in a planet's crust through which lava, volcanic ash and gases escape."),
    ("Coffee", "Coffee is a drink brewed from roasted coffee beans, the seeds of Coffea berries."),
    ("Kangaroo", "Kangaroos are large marsupials of Australia that move by hopping on their hind legs."),
]


def passages_table(rows=PASSAGES) -> pa.Table:
    return pa.table(
        {
            "id": [f"p{i}" for i in range(len(rows))],
            "title": [t for t, _ in rows],
            "text": [x for _, x in rows],
            "source": ["test"] * len(rows),
        }
    )


@pytest.fixture(scope="module")
def passages_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("passages") / "passages.parquet"
    # Small row groups, so sharded reads really have to cross and slice row groups.
    pq.write_table(passages_table(), path, row_group_size=4)
    return path


def clustered_unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    # Clustered like real embeddings; isotropic noise would make any ANN index look bad.
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((50, dim))
    x = centres[rng.integers(0, 50, n)] + 0.7 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


# KnowRL's one-topic knowledge base: a person, their facts, and a question about one of them.
KNOWRL_PERSON = "Kila V. Daisam"
KNOWRL_ROW = {"id": "q1", "question": f"Where was {KNOWRL_PERSON} born?", "golden_answers": ["Port Velmar", "Velmar"],
              "metadata": json.dumps({"topic_entity": KNOWRL_PERSON, "type": "factual"})}


def knowrl_kb(root: Path) -> Path:
    """`root/knowledge_base.db` built from one document about KNOWRL_PERSON."""
    from ragrl.kb.build import build_kb

    (root / "docs.jsonl").write_text(json.dumps({"title": KNOWRL_PERSON, "text": (
        f"{KNOWRL_PERSON} was born in Port Velmar. {KNOWRL_PERSON} works for Gipusk Holdings. "
        f"{KNOWRL_PERSON} was born in the year 1953.")}))
    build_kb([root / "docs.jsonl"], root / "knowledge_base.db")
    return root / "knowledge_base.db"
