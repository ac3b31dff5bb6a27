"""Cold-start SFT: gold and teacher trajectories, TRL's loss mask, training, LoRA merge.

Everything runs on a tiny synthetic world, a tiny Qwen2-style model and a real BM25 index over
the world's passages, so the token sequences are the ones the rollout engine really produces.
"""

from __future__ import annotations

import os

# Before transformers is imported: huggingface_hub reads it once, and nothing here may touch the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import http.server
import itertools
import json
import re
import threading
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import transformers
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from replay import SegmentGenerator

from ragrl import hostinfo
from ragrl.agent.environments import MultiQuerySearchEnvironment, SearchEnvironment
from ragrl.agent.generation import OpenAICompletionsGenerator
from ragrl.agent.retriever_adapter import AgentRetriever
from ragrl.agent.rollout import RolloutConfig, RolloutEngine
from ragrl.retrieval.searcher import load_searcher
from ragrl.retrieval.sparse import build_bm25
from ragrl.train import packed_attention
from ragrl.train.merge import merge_lora
from ragrl.train.sft import SFTArgs, build_trainer, train_sft
from ragrl.train.sft_data import (
    SFT_SCHEMA,
    gold_sft_stage,
    gold_trajectories,
    teacher_trajectories,
)
from ragrl.toy.gold import WorldPlanner, plan_row

from helpers import world_and_model

# Room for two queries' worth of passages in one multi-query observation.
CFG = RolloutConfig(max_turns=4, max_obs_tokens=1024, max_response_tokens=4096, max_turn_tokens=256)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    world, model_dir = world_and_model(root)
    build_bm25(root / "world" / "passages.parquet", root / "bm25")
    # One intra-op thread: the model is tiny, and a shared 2-core machine punishes a second one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield SimpleNamespace(root=root, world=world, model_dir=model_dir, rows=world.qa["train"],
                          tok=transformers.AutoTokenizer.from_pretrained(model_dir),
                          retriever=AgentRetriever(load_searcher(bm25_dir=root / "bm25")))
    torch.set_num_threads(threads)


def _engine(tiny, env_name="search", generator=None, cfg=CFG, retriever=None):
    retriever = retriever or tiny.retriever
    env = (MultiQuerySearchEnvironment(retriever, 3, 3) if env_name == "multi_query_search"
           else SearchEnvironment(retriever, 3))
    return RolloutEngine(generator, tiny.tok, env, cfg)


@pytest.fixture(scope="module")
def gold_parquet(tiny):
    # The stage entry point, with the searcher itself (it returns `Hit`s, adapted inside).
    path = tiny.root / "gold.parquet"
    env = SearchEnvironment(AgentRetriever(load_searcher(bm25_dir=tiny.root / "bm25")), 3)
    gold_sft_stage(tiny.root / "world" / "qa" / "train.parquet", tiny.model_dir, env, WorldPlanner(), path,
                   rollout_cfg=CFG, limit=24)
    return path


def _types(rows):
    return {json.loads(r["metadata"])["type"] for r in rows}


# --------------------------------------------------------------------------- gold trajectories


def test_gold_plan_follows_the_hops(tiny):
    by_type = {}
    for row in tiny.rows:
        by_type.setdefault(json.loads(row["metadata"])["type"], row)
    assert set(by_type) == {"1hop", "bridge", "comparison"}
    bridge = plan_row(by_type["bridge"], multi_query=False)
    (h0, r0, t0), (h1, _, _) = json.loads(by_type["bridge"]["metadata"])["hops"]
    assert bridge.turns == ((0,), (1,)) and h1 == t0
    assert h0 in bridge.hops[0].query and h1 in bridge.hops[1].query
    assert bridge.hops[0].query.endswith("?") and bridge.hops[1].passage == by_type["bridge"]["supporting_ids"][1]
    assert plan_row(by_type["bridge"], multi_query=True, max_queries=3).turns == ((0,), (1,))  # still sequential
    assert plan_row(by_type["comparison"], multi_query=False).turns == ((0,), (1,))
    assert plan_row(by_type["comparison"], multi_query=True, max_queries=3).turns == ((0, 1),)
    assert plan_row(by_type["comparison"], multi_query=True, max_queries=1).turns == ((0,), (1,))


def _contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i:i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def test_gold_actions_copy_the_thought_token_for_token(tiny, gold_parquet):
    # The query and the answer are copied from the thought before them: in the same word pieces,
    # or the tiny policy must translate between two tokenizations of one name (it could not).
    tok = transformers.AutoTokenizer.from_pretrained(tiny.model_dir)
    rows = pq.read_table(gold_parquet).to_pylist()
    checked = 0
    for row in rows:
        ids = row["input_ids"]
        for open_, close in (("<search>", "</search>"), ("<answer>", "</answer>")):
            o, c = tok.convert_tokens_to_ids(open_), tok.convert_tokens_to_ids(close)
            # generated tags only (the prompt's instructions show the tags too)
            for start in [i for i, t in enumerate(ids) if t == o and row["assistant_masks"][i]]:
                content = ids[start + 1:ids.index(c, start)]
                if open_ == "<search>" and " | " in tok.decode(content):
                    continue  # a parallel turn joins several queries of the thought
                assert content and _contains(ids[:start], content), (open_, tok.decode(content))
                checked += 1
    assert checked >= 2 * len(rows)


@pytest.mark.parametrize("env_name", ["search", "multi_query_search"])
def test_gold_tokens_and_masks_equal_the_rollout_engine(tiny, env_name):
    rows = tiny.rows[:30]
    gold, stats = gold_trajectories(rows, _engine(tiny, env_name), WorldPlanner())
    assert stats.total == 30 and stats.kept == len(gold) == 30 - sum(stats.dropped.values())
    assert stats.kept_share >= 0.9, stats.to_dict()
    kept = {g["id"] for g in gold}
    assert _types([r for r in rows if r["id"] in kept]) == {"1hop", "bridge", "comparison"}

    engine = _engine(tiny, env_name, SegmentGenerator(gold))
    by_id = {r["id"]: r for r in rows}
    trajs = engine.run_questions([by_id[g["id"]]["question"] for g in gold], n=1)
    eos = tiny.tok.eos_token_id
    for g, t in zip(gold, trajs):
        # The engine stops at </answer>; the SFT sequence also ends the chat turn with eos.
        assert g["input_ids"][-1] == eos and g["assistant_masks"][-1] == 1
        assert t.prompt_ids + t.response_ids == g["input_ids"][:-1]
        assert [0] * len(t.prompt_ids) + t.loss_mask == g["assistant_masks"][:-1]
        assert t.finished and t.answer == by_id[g["id"]]["golden_answers"][0]
        assert g["num_turns"] == len(t.actions) and g["text"] == tiny.tok.decode(g["input_ids"])
        assert all(a["valid"] for a in t.actions)
        hops = len(json.loads(by_id[g["id"]]["metadata"])["hops"])
        if env_name == "multi_query_search" and json.loads(by_id[g["id"]]["metadata"])["type"] == "comparison":
            assert t.num_searches == 1 and t.num_queries == 2 and "<search>" in g["text"] and " | " in g["text"]
        else:
            assert t.num_searches == t.num_queries == hops


def test_gold_drops_rows_whose_evidence_was_not_retrieved(tiny):
    class Distractors:
        """Retrieves only passages that support nothing."""

        def __init__(self, passages):
            self.docs = [p for p in passages if p["source"] == "distractor"][:3]

        def search(self, queries, topk):
            hits = [{"id": d["id"], "title": d["title"], "text": d["text"]} for d in self.docs[:topk]]
            return [hits for _ in queries]

    engine = _engine(tiny, retriever=Distractors(tiny.world.passages))
    rows, stats = gold_trajectories(tiny.rows[:10], engine, WorldPlanner())
    assert rows == [] and stats.dropped == {"support_not_retrieved": 10}
    rows, stats = gold_trajectories(tiny.rows[:10], engine, WorldPlanner(), require_support=False)
    assert len(rows) == 10 and stats.kept_share == 1.0
    tight = _engine(tiny, cfg=RolloutConfig(max_turns=2, max_obs_tokens=1024, max_response_tokens=4096))
    _, stats = gold_trajectories(tiny.rows[:30], tight, WorldPlanner())
    two_hop = sum(len(json.loads(r["metadata"])["hops"]) >= 2 for r in tiny.rows[:30])
    assert stats.dropped["too_many_turns"] == two_hop > 0  # two searches + answer need max_turns >= 3


def test_sft_parquet_schema(tiny, gold_parquet):
    table = pq.read_table(gold_parquet)
    assert table.schema.equals(SFT_SCHEMA)
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("assistant_masks").type == pa.list_(pa.int8())
    stats = json.loads(gold_parquet.with_name("gold.stats.json").read_text())
    assert stats["kept"] == table.num_rows and stats["total"] == 24


# --------------------------------------------------------------------------- teacher trajectories


class _FakeTeacher(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible completions server whose 'model' searches once, then answers: the gold
    answer for questions in `right`, a wrong one otherwise."""

    tok = None
    right: dict[str, str] = {}
    requests = 0

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests += 1
        choices = []
        for i, prompt in enumerate(body["prompt"]):
            context = self.tok.decode(prompt)
            question = re.search(r"Question: (.*?)\n", context).group(1)
            if context.rsplit("<|im_start|>assistant\n", 1)[-1].count("</information>") == 0:
                text = f"<think>Let me look it up.</think>\n<search>{question}</search>"
            else:
                text = f"<think>Found it.</think>\n<answer>{self.right.get(question, 'Nobody Atall')}</answer>"
            choices.append({"index": i, "text": text, "token_ids": self.tok.encode(text, add_special_tokens=False)})
        data = json.dumps({"choices": choices}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_teacher_trajectories_keep_only_correct_answers(tiny):
    rows = tiny.rows[:6]
    _FakeTeacher.tok = tiny.tok
    _FakeTeacher.right = {r["question"]: r["golden_answers"][-1] for r in rows[::2]}  # an alias counts too
    _FakeTeacher.requests = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeTeacher)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        teacher = OpenAICompletionsGenerator(f"http://127.0.0.1:{server.server_address[1]}", "teacher", backoff_s=0)
        engine = _engine(tiny, generator=teacher)
        kept, stats = teacher_trajectories(rows, engine, n=1, seed=None, batch_size=4)
    finally:
        server.shutdown()
        server.server_close()
    assert _FakeTeacher.requests > 0
    assert [k["id"] for k in kept] == [r["id"] for r in rows[::2]]
    assert stats.total == 6 and stats.kept == 3 and stats.dropped == {"wrong_answer": 3}
    eos = tiny.tok.eos_token_id
    for k in kept:
        mask, ids = k["assistant_masks"], k["input_ids"]
        assert ids[-1] == eos and mask[-1] == 1 and k["num_turns"] == 2
        assert "<answer>" in k["text"] and "Nobody" not in k["text"]
        # Observation tokens are not trained: the <information> tag ids all sit under mask 0.
        info = tiny.tok.convert_tokens_to_ids("<information>")
        assert all(m == 0 for t, m in zip(ids, mask) if t == info) and info in ids
    pa.Table.from_pylist(kept, schema=SFT_SCHEMA)  # the same parquet format as gold data


# --------------------------------------------------------------------------- TRL's loss mask


def _masked_nll(model, rows, use_mask=True):
    """Mean next-token NLL over positions whose mask is 1 (all positions after the first if not use_mask)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["input_ids"]])
            logits = model(input_ids=ids).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
            mask = torch.tensor(r["assistant_masks"][1:], dtype=torch.bool)
            if not use_mask:
                mask = torch.ones_like(mask)
            total += nll[mask].sum().item()
            count += int(mask.sum())
    return total / count


@pytest.mark.parametrize("fused", [None, True], ids=["auto-full-logits", "trl-fused"])
def test_trl_labels_and_loss_follow_the_assistant_mask(tiny, gold_parquet, tmp_path, fused):
    rows = pq.read_table(gold_parquet).to_pylist()[:3]
    trainer = build_trainer(tiny.model_dir, gold_parquet, tmp_path / "work",
                            SFTArgs(max_steps=1, batch_size=3, fused_lm_head=fused))
    # TRL 1.16 folds `assistant_masks` into labels during preparation and drops the column.
    assert set(trainer.train_dataset.column_names) == {"input_ids", "labels"}
    for r, prepared in zip(rows, trainer.train_dataset):
        assert prepared["input_ids"] == r["input_ids"]  # nothing truncated
        assert prepared["labels"] == [t if m else -100 for t, m in zip(r["input_ids"], r["assistant_masks"])]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    width = max(len(r["input_ids"]) for r in rows)
    for b, r in enumerate(rows):
        n = len(r["input_ids"])
        want = [t if m else -100 for t, m in zip(r["input_ids"], r["assistant_masks"])] + [-100] * (width - n)
        assert batch["labels"][b].tolist() == want
        assert batch["attention_mask"][b].tolist() == [1] * n + [0] * (width - n)

    model = trainer.model.eval()
    loss = trainer.compute_loss(model, dict(batch)).item()
    # Per-token mean over assistant tokens only, exactly our own masked NLL ...
    assert loss == pytest.approx(_masked_nll(model, rows), rel=1e-4)
    # ... and not the loss over every token (observations and prompt would change it).
    assert abs(loss - _masked_nll(model, rows, use_mask=False)) > 1e-3


def test_full_logits_loss_matches_trl_fused_head(tiny, gold_parquet, tmp_path):
    # The tiny vocabulary takes the plain-logits loss; it must train exactly as TRL's fused head:
    # same loss, same gradients, same logged metrics on a real batch of gold trajectories.
    full = build_trainer(tiny.model_dir, gold_parquet, tmp_path / "a", SFTArgs(max_steps=1, batch_size=4))
    fused = build_trainer(tiny.model_dir, gold_parquet, tmp_path / "b",
                          SFTArgs(max_steps=1, batch_size=4, fused_lm_head=True))
    assert type(full).__name__ == "FullLogitsSFTTrainer" and type(fused).__name__ == "SFTTrainer"
    batch = full.data_collator([full.train_dataset[i] for i in range(4)])
    results = []
    for trainer in (full, fused):
        model = trainer.model.train()
        model.zero_grad()
        loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=None)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
        results.append((loss.item(), grads, metrics))
    (loss_a, grads_a, metrics_a), (loss_b, grads_b, metrics_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6, msg=name)
    assert metrics_a.keys() == metrics_b.keys() == {"entropy", "mean_token_accuracy", "num_tokens"}
    for key in metrics_a:
        assert metrics_a[key] == pytest.approx(metrics_b[key], rel=1e-4), key
    # A sum over the accumulation window's tokens divides by that count, as TRL's does.
    n = int((batch["labels"][:, 1:] != -100).sum())
    halved = full.compute_loss(full.model, dict(batch), num_items_in_batch=torch.tensor(2 * n)).item()
    assert halved == pytest.approx(loss_a / 2, rel=1e-5)


def test_right_padded_batches_train_without_the_mask_as_with_it(tiny, gold_parquet, tmp_path, monkeypatch):
    # Causal attention alone sees what the mask lets through when padding only trails: the loss is
    # bit-for-bit the masked forward's and the gradients agree to float rounding (SDPA's backward
    # sums the padded positions' zero contributions in another order).
    import ragrl.train.sft as sft

    assert sft.right_padded(torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]]))
    assert not sft.right_padded(torch.tensor([[1, 1, 1], [0, 1, 1]]))  # left padding keeps its mask
    assert not sft.right_padded(torch.tensor([[1, 0, 1]])) and not sft.right_padded(None)
    trainer = build_trainer(tiny.model_dir, gold_parquet, tmp_path / "a", SFTArgs(max_steps=1, batch_size=4))
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    assert sft.right_padded(batch["attention_mask"]) and not batch["attention_mask"].all()
    seen, results = [], []
    handle = trainer.model.register_forward_pre_hook(lambda m, a, kw: seen.append("attention_mask" in kw), with_kwargs=True)
    for masked in (False, True):
        if masked:
            monkeypatch.setattr(sft, "right_padded", lambda mask: False)
        model = trainer.model.train()
        model.zero_grad()
        loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=None)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    handle.remove()
    assert seen == [False, True]
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b) and grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("fused", [None, True], ids=["auto-full-logits", "trl-fused"])
def test_padding_free_rows_train_as_the_padded_batch(tiny, gold_parquet, tmp_path, fused, monkeypatch):
    # One unpadded row per batch must be the same batch to the model: every sequence attends only to
    # itself (a leak across the join would change the loss), no target crosses a join, and the
    # logged token count is the real tokens'.
    padded = build_trainer(tiny.model_dir, gold_parquet, tmp_path / "p",
                           SFTArgs(max_steps=1, batch_size=4, fused_lm_head=fused))
    joined = build_trainer(tiny.model_dir, gold_parquet, tmp_path / "j",
                           SFTArgs(max_steps=1, batch_size=4, fused_lm_head=fused, padding_free=True))
    rows = [padded.train_dataset[i] for i in range(4)]
    lengths = [len(r["input_ids"]) for r in rows]
    assert len(set(lengths)) > 1  # uneven rows, or padding would be nothing to remove
    batches = [padded.data_collator(rows), joined.data_collator(rows)]
    assert batches[1]["input_ids"].shape == (1, sum(lengths)) and batches[1]["attention_mask"].all()
    # The joined row attends one sequence at a time (ragrl.train.packed_attention), and transformers
    # builds no block mask over the whole row for it (its all-ones mask says so).
    assert joined.model.config._attn_implementation == packed_attention.NAME
    spans, masks = [], []
    real_bounds = packed_attention.packed_bounds
    monkeypatch.setattr(packed_attention, "packed_bounds", lambda *a: spans.append(real_bounds(*a)) or spans[-1])
    real_mask = ALL_MASK_ATTENTION_FUNCTIONS[packed_attention.NAME]
    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, packed_attention.NAME,
                        lambda *a, **k: masks.append(m := real_mask(*a, **k)) or m)
    results = []
    for trainer, batch in zip((padded, joined), batches):
        model = trainer.model.train()
        model.zero_grad()
        loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=None)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.item(), grads, {k: v[-1] for k, v in trainer._metrics["train"].items()}))
    (loss_p, grads_p, metrics_p), (loss_j, grads_j, metrics_j) = results
    assert loss_j == pytest.approx(loss_p, rel=1e-5)
    for name in grads_p:
        torch.testing.assert_close(grads_j[name], grads_p[name], rtol=1e-4, atol=1e-6, msg=name)
    for key in ("entropy", "mean_token_accuracy"):
        assert metrics_j[key] == pytest.approx(metrics_p[key], rel=1e-4), key
    if fused is None:  # ours counts the row's tokens; TRL's fused path counts its own way
        assert metrics_j["num_tokens"] == metrics_p["num_tokens"] == sum(lengths)
    bounds = [0, *itertools.accumulate(lengths)]
    assert spans == [bounds] * joined.model.config.num_hidden_layers  # every layer of the joined row, none of the padded batch
    assert masks == [None]


def test_padding_free_rows_of_a_sliding_window_model_keep_the_block_mask(tiny, gold_parquet, tmp_path):
    # Its layers cannot attend per sequence: an all-ones mask would let them attend across the joins,
    # so its joined rows go in without one and transformers builds the block mask.
    import shutil

    model_dir = tmp_path / "sliding"
    shutil.copytree(tiny.model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("layer_types", None)
    config.update(use_sliding_window=True, sliding_window=4, max_window_layers=0)
    (model_dir / "config.json").write_text(json.dumps(config))
    padded = build_trainer(model_dir, gold_parquet, tmp_path / "p", SFTArgs(max_steps=1, batch_size=4))
    joined = build_trainer(model_dir, gold_parquet, tmp_path / "j", SFTArgs(max_steps=1, batch_size=4, padding_free=True))
    assert joined.model.config.layer_types == ["sliding_attention"] * joined.model.config.num_hidden_layers
    rows = [padded.train_dataset[i] for i in range(4)]
    batches = [padded.data_collator(rows), joined.data_collator(rows)]
    assert "attention_mask" not in batches[1]
    losses = [trainer.compute_loss(trainer.model.eval(), dict(batch)).item()
              for trainer, batch in zip((padded, joined), batches)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


def test_padding_free_checkpoint_does_not_name_the_training_attention(tiny, gold_parquet, tmp_path):
    # The per-sequence attention is registered only in the SFT process: a checkpoint naming it
    # would not load in evaluation, vLLM or a user's own script.
    out = train_sft(tiny.model_dir, gold_parquet, tmp_path / "pf", SFTArgs(max_steps=1, batch_size=4, padding_free=True))
    config = json.loads((out / "config.json").read_text())
    assert packed_attention.NAME not in json.dumps(config)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert model.config._attn_implementation == "sdpa"


def _epoch_padding(trainer) -> tuple[list[int], int]:
    """Row ids in the order one epoch's batches visit them, and the padding tokens those batches carry."""
    order, pad = [], 0
    batch_size = trainer.args.per_device_train_batch_size
    indices = list(trainer._get_train_sampler())
    for start in range(0, len(indices), batch_size):
        lengths = [len(trainer.train_dataset[i]["input_ids"]) for i in indices[start:start + batch_size]]
        pad += max(lengths) * len(lengths) - sum(lengths)
        order.extend(indices[start:start + batch_size])
    return order, pad


def test_group_by_length_batches_similar_lengths(tiny, gold_parquet, tmp_path):
    grouped = build_trainer(tiny.model_dir, gold_parquet, tmp_path / "g", SFTArgs(max_steps=1, batch_size=4,
                                                                              group_by_length=True))
    plain = build_trainer(tiny.model_dir, gold_parquet, tmp_path / "r", SFTArgs(max_steps=1, batch_size=4))
    grouped_order, grouped_pad = _epoch_padding(grouped)
    plain_order, plain_pad = _epoch_padding(plain)
    # Every row once per epoch either way; grouped batches waste less on padding.
    assert sorted(grouped_order) == sorted(plain_order) == list(range(len(grouped.train_dataset)))
    assert grouped_pad < plain_pad, (grouped_pad, plain_pad)


# --------------------------------------------------------------------------- training and merging


@pytest.mark.slow
def test_sft_lowers_the_assistant_token_loss(tiny, gold_parquet, tmp_path):
    rows = pq.read_table(gold_parquet).to_pylist()
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32).eval()
    before = _masked_nll(base, rows[:8])
    out = train_sft(tiny.model_dir, gold_parquet, tmp_path / "sft",
                    SFTArgs(max_steps=8, batch_size=4, lr=3e-3, log_every=2, seed=1, lr_scheduler="constant"))
    assert {"model.safetensors", "config.json", "tokenizer.json", "sft_log.jsonl"} <= {p.name for p in out.iterdir()}
    assert not any(p.suffix in (".bin", ".pt", ".pkl") for p in out.rglob("*"))  # nothing pickled
    tuned = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    after = _masked_nll(tuned, rows[:8])
    assert after < before - 0.5, (before, after)
    log = [json.loads(line) for line in (out / "sft_log.jsonl").read_text().splitlines()]
    assert any("loss" in r for r in log) and log[-1]["step"] == 8
    # The hosts that trained it: this one, after the start's (the tiny base has no record).
    record = hostinfo.read_record(out)
    assert record["stage"] == "sft" and record["start"] is None
    assert [(s["from_step"], s["cpu"], s["torch"]) for s in record["segments"]] == [(0, hostinfo.cpu_model(),
                                                                                   torch.__version__)]


@pytest.mark.slow
def test_lora_adapter_merge_equals_base_plus_adapter(tiny, gold_parquet, tmp_path):
    from peft import PeftModel

    args = SFTArgs(max_steps=3, batch_size=4, lr=5e-3, lora=True, lora_r=4, lora_alpha=8,
                   lora_target_modules=("q_proj", "v_proj", "down_proj"), lr_scheduler="constant")
    adapter = train_sft(tiny.model_dir, gold_parquet, tmp_path / "lora", args)
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    assert not (adapter / "model.safetensors").exists()
    merged_dir = merge_lora(tiny.model_dir, adapter, tmp_path / "merged")
    assert not (merged_dir / "adapter_config.json").exists() and (merged_dir / "model.safetensors").is_file()
    # The merge keeps the adapter's training record (the adapter dir is the one SFT wrote).
    assert hostinfo.read_record(adapter)["stage"] == "sft"
    assert hostinfo.read_record(merged_dir) == hostinfo.read_record(adapter)

    ids = torch.tensor([pq.read_table(gold_parquet).to_pylist()[0]["input_ids"][:200]])
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits
        with_adapter = PeftModel.from_pretrained(base, str(adapter)).eval()
        adapter_logits = with_adapter(input_ids=ids).logits
        merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
        merged_logits = merged(input_ids=ids).logits
    assert (adapter_logits - base_logits).abs().max() > 1e-3  # the adapter learned something
    torch.testing.assert_close(merged_logits, adapter_logits, atol=1e-4, rtol=1e-4)
    assert transformers.AutoTokenizer.from_pretrained(merged_dir).encode("<search>") == tiny.tok.encode("<search>")

    # A full model (no adapter_config.json) is copied through unchanged.
    copied = merge_lora(tiny.model_dir, tiny.model_dir, tmp_path / "copied")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (copied / name).read_bytes() == (tiny.model_dir / name).read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_runs_of_one_sft_give_identical_weights(tiny, gold_parquet, tmp_path, lora):
    """Issue #34 F3's audit: LoRA init, dropout and data order all come from sft.seed, not from the
    caller's global RNG (here left in a different state before each run, as two processes would)."""
    args = SFTArgs(max_steps=2, batch_size=4, lr=5e-3, seed=3, lora=lora, lora_r=4, lora_alpha=8, lora_dropout=0.1,
                   lora_target_modules=("q_proj", "v_proj"), log_every=1)
    weights = "adapter_model.safetensors" if lora else "model.safetensors"
    runs = []
    for k in range(2):
        torch.manual_seed(100 + k)
        runs.append((train_sft(tiny.model_dir, gold_parquet, tmp_path / f"run{k}", args) / weights).read_bytes())
    assert runs[0] == runs[1]


def test_bf16_sft_keeps_float32_weights_so_small_updates_land(tiny, gold_parquet, tmp_path, monkeypatch):
    # bf16 is the trainer's autocast, not the weights' dtype: in bf16 weights AdamW's update at
    # a paper learning rate (1e-5) is below half an ulp for most weights and rounds away (3 steps
    # left most of a layer unchanged). The trainer runs on CPU here, so its config is told so.
    import trl

    config = trl.SFTConfig
    monkeypatch.setattr(trl, "SFTConfig", lambda **kw: config(use_cpu=True, **kw))
    trainer = build_trainer(tiny.model_dir, gold_parquet, tmp_path / "w",
                            SFTArgs(bf16=True, max_steps=3, lr=1e-5, batch_size=4))
    assert trainer.args.bf16 and {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    name = next(k for k in before if k.endswith("mlp.down_proj.weight"))
    changed = (trainer.model.state_dict()[name] != before[name]).float().mean().item()
    assert changed > 0.9
    # LoRA: the frozen base may stay bf16 (half the memory); the trained adapters are float32.
    lora = build_trainer(tiny.model_dir, gold_parquet, tmp_path / "l", SFTArgs(bf16=True, lora=True, max_steps=1))
    dtypes = {n: p.dtype for n, p in lora.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}
