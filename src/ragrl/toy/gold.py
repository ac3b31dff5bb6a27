"""The synthetic world's gold plans: what a perfect search agent does for a world question.

Only the world's QA rows can be planned: their `metadata.hops` list (head, relation, tail) with
the world's relation keys, whose 1-hop question templates and fact sentences are in
`ragrl.toy.relations`. Real datasets carry no such annotations; their cold-start SFT data come
from a teacher or a published SFT file (recipes.<name>.sft.source).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from ragrl.agent.gold_plan import GoldPlan, Hop
from ragrl.agent.protocol import ANSWER_CLOSE, ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN, THINK_CLOSE, THINK_OPEN
from ragrl.errors import InputError
from ragrl.toy.relations import RELATION_BY_KEY


@dataclass(frozen=True)
class WorldPlanner:
    """`seed` varies which question template each hop's query uses (reproducibly); `joiner` puts
    a parallel turn's queries together as the environment splits them (RAG-R1's preset: ", ")."""

    seed: int = 0
    joiner: str = " | "

    def plan(self, row: dict, multi_query: bool, max_queries: int = 1) -> GoldPlan:
        return plan_row(row, multi_query, max_queries, self.seed)

    def search_text(self, plan: GoldPlan, turn: int) -> str:
        return search_text(plan, turn, self.joiner)

    def answer_text(self, plan: GoldPlan) -> str:
        return answer_text(plan)


def plan_row(row: dict, multi_query: bool, max_queries: int = 1, seed: int = 0) -> GoldPlan:
    meta = json.loads(row["metadata"]) if isinstance(row["metadata"], str) else dict(row["metadata"] or {})
    raw_hops = meta.get("hops")
    if not isinstance(raw_hops, list) or not all(isinstance(h, list | tuple) and len(h) == 3 and h[1] in RELATION_BY_KEY
                                                 for h in raw_hops):
        raise InputError(f"QA row {row.get('id')!r}: no world hop annotations (metadata.hops of (head, relation, "
                         "tail) with world relation keys); gold SFT data need the synthetic world's questions")
    supporting = list(row.get("supporting_ids") or [])
    # The world lists one supporting passage per hop (the hop head's passage), in hop order.
    aligned = len(supporting) == len(raw_hops)
    hops = tuple(
        Hop(head, rel, str(tail), hop_query(rel, head, f"{row['id']}:{i}", seed), supporting[i] if aligned else None)
        for i, (head, rel, tail) in enumerate(raw_hops)
    )
    parallel = meta.get("type") == "comparison" and multi_query and max_queries >= len(hops)
    turns = (tuple(range(len(hops))),) if parallel else tuple((i,) for i in range(len(hops)))
    golds = list(row["golden_answers"])
    return GoldPlan(row["id"], row["question"], golds[0] if golds else "", hops, turns)


def hop_query(relation: str, head: str, key: str, seed: int = 0) -> str:
    """One of the relation's 1-hop question templates, picked by a stable hash (varied, reproducible)."""
    templates = RELATION_BY_KEY[relation].questions
    return templates[zlib.crc32(f"{seed}:{key}".encode()) % len(templates)].format(h=head)


def _read(hop: Hop) -> str:
    # What was just read, as the pretrained reader learnt to read: the passages, then "Question: …
    # Answer: …" (ragrl.train.pretrain.reading_prompt). Right after an <information> block this
    # is the lookup the base policy can already do; a restated fact sentence ("X was born in Y")
    # made the policy pick the relation's wording first, and it picked wrong ones.
    return f"Question: {hop.query}\nAnswer: {hop.tail}."


def _just_read(plan: GoldPlan, turn: int) -> list[str]:
    """What the previous turn's searches found (nothing before the first search)."""
    return [_read(plan.hops[i]) for i in plan.turns[turn - 1]] if turn > 0 else []


# How a thought after an observation goes on: another hop, or the answer (scripts/rl_ablation.py's
# --decision probes the policy's choice between the two).
NEXT_HOP = "Next I need to find out:"
ANSWER_LEAD = "So the answer is"


# A space after <search> and <answer>, as in Search-R1's own prompt ("<answer> Beijing </answer>"):
# byte-level BPE splits " Cheafeaxara" and "Cheafeaxara" into different pieces (ĠChea|f|eax|ara vs
# C|hea|f|eax|ara), and the reader wrote and read names with the leading space. Without it the
# policy had to copy a name from its thought into <answer> through pieces it had hardly seen, and
# wrote garbage after a right thought: on the default world search_r1_sft EM 0.09 -> 0.31, format
# 0.69 -> 0.94 (docs/READING.md). The parsers strip the space.
def search_text(plan: GoldPlan, turn: int, joiner: str = " | ") -> str:
    hops = [plan.hops[i] for i in plan.turns[turn]]
    known = _just_read(plan, turn)
    need = " and ".join(h.query for h in hops)
    if known:
        thought = f"{' '.join(known)} {NEXT_HOP} {need}"
    else:
        thought = f"I need to find out: {need}{_later(plan)}"
    return f"{THINK_OPEN}{thought}{THINK_CLOSE}\n{SEARCH_OPEN} {joiner.join(h.query for h in hops)}{SEARCH_CLOSE}"


def _later(plan: GoldPlan) -> str:
    """The first thought also plans the later turns' queries, an entity found on the way written
    #k (hop k's answer): "… Then: Where was #1 born?". Right after the question this is a rewording
    of text in view; in a later turn the query is then copied from the plan, where it had to be
    recalled from the question many tokens back (the policy asked for the wrong relation about half
    the time on bridge questions)."""
    tails = {plan.hops[i].tail: i + 1 for i in range(len(plan.hops))}
    later = []
    for turn in plan.turns[1:]:
        queries = []
        for i in turn:
            hop = plan.hops[i]
            ref = tails.get(hop.head)
            queries.append(hop.query.replace(hop.head, f"#{ref}") if ref is not None and ref <= i else hop.query)
        later.append(" and ".join(queries))
    return "".join(f" Then: {q}" for q in later)


def answer_text(plan: GoldPlan) -> str:
    facts = " ".join(_just_read(plan, len(plan.turns)))
    return f"{THINK_OPEN}{facts} {ANSWER_LEAD} {plan.answer}.{THINK_CLOSE}\n{ANSWER_OPEN} {plan.answer}{ANSWER_CLOSE}"
