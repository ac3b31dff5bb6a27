"""Cold-start SFT data for the KG agent (KG-R1 recipe): gold trajectories over a KG.

A KGQA row names its topic entities and its gold answer entities, not the path between them, so
the plan is found in the KG itself: the shortest chain of outgoing edges (at most `max_hops`)
from the topic entity to a gold answer, ties broken by relation and entity id (reproducible).
A perfect agent then, per hop, lists the entity's relations and follows the right one:

    <think>…</think>\\n<kg-query>get_relations_out("X")</kg-query>      → relations of X
    <think>…</think>\\n<kg-query>get_entities_out("X", "r")</kg-query>  → entities (the next hop)
    …
    <think>…</think>\\n<answer>gold</answer><eos>

Listing relations first is what lets the same agent work on another KG whose relation names
differ (the transfer KG-R1 reports): it never has to know a relation name in advance.

With `readable_share` > 0, that share of the trajectories shows every relation in a readable
form of its own name (`people.person.place_of_birth` → `place of birth`: the last dotted segment,
underscores as spaces), in the listings, the calls and the thoughts alike; the calls still reach
the KG under the real name. A pretrained 3B model reads `place_of_birth` and "place of birth" as
the same words, which is what lets KG-R1 move to another KG's vocabulary zero-shot; a policy that
has seen only one spelling of each relation recalls that spelling instead of reading the listing.
The readable forms come from the training KG's own names, not from any evaluation KG.

With `restate_question`, the thought that names the relation to follow opens with the question,
copied as the prompt shows it. The words that decide the relation ("attend", "works for") then
stand right before the choice instead of a listing and a turn away, where the toy's 1.1M policy
mostly wrote a common relation whatever the question asked (docs/READING.md, "KG-R1: the question
restated").

Observations are what the real environment (`KGEnvironment.respond` over the KG service)
returns, and sequences are tokenized exactly as the rollout engine tokenizes rollouts (the
helpers of `ragrl.train.sft_data`), so SFT and RL see one format. Rows are dropped, with the
reason counted, when no path exists within `max_hops`, when the final observation does not show
the answer (e.g. a listing cut by the server's cap), or when the trajectory would not fit the
rollout budgets unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ragrl.agent.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    KG_CLOSE,
    KG_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    observation,
    shown_question,
)
from ragrl.agent.rollout import RolloutEngine
from ragrl.data.qa import row_golds, row_metadata
from ragrl.errors import InputError
from ragrl.hashing import in_hashed_share
from ragrl.kg.store import KGStore
from ragrl.train.sft_data import (
    Draft,
    SFTDataStats,
    append_segment,
    encode_segment,
    finish_drafts,
    read_qa_rows,
    report_stats,
    write_sft_data,
)

Edge = tuple[str, str, str]  # (head name, relation name, tail name)


@dataclass(frozen=True)
class KGPlan:
    row_id: str
    question: str
    answer: str
    path: tuple[Edge, ...]


@dataclass
class _Draft(Draft):
    texts: list[str] = field(default_factory=list)  # the query turns of the plan, in order
    # What reaches the KG: the plain query turns (real relation names, no restated question).
    # With readable names the observation is renamed (canonical → readable) before tokenizing.
    sent: list[str] = field(default_factory=list)
    renames: tuple[tuple[str, str], ...] = ()
    # The question id the KG knows (in subgraph mode it picks the question's subgraph); a readable
    # copy's own row id carries a suffix.
    question_id: str = ""


def readable_relation(name: str) -> str:
    """`people.person.place_of_birth` → `place of birth`; a name without dots keeps its words."""
    return name.rsplit(".", 1)[-1].replace("_", " ").strip() or name


def readable_names(relation_names: Iterable[str]) -> dict[str, str]:
    """canonical → readable, for the names whose readable form is unambiguous in this KG (two
    relations that would read alike keep their own names)."""
    names = sorted(set(relation_names))
    forms: dict[str, list[str]] = {}
    for name in names:
        forms.setdefault(readable_relation(name), []).append(name)
    return {group[0]: form for form, group in forms.items()
            if len(group) == 1 and form != group[0] and form not in names}


def _rename(text: str, renames: Sequence[tuple[str, str]]) -> str:
    for name, form in renames:
        text = text.replace(name, form)
    return text


def topic_entities(row: dict) -> list[str]:
    return [str(t) for t in row_metadata(row).get("topic_entities") or []]


def _answer_ids(store: KGStore, golds: Sequence[dict | str]) -> set[int]:
    ids: set[int] = set()
    for gold in golds:
        names = [gold] if isinstance(gold, str) else [gold.get("kb_id"), gold.get("text")]
        for name in names:
            if name:
                ids.update(store.resolve(str(name)).ids)
    return ids


def gold_path(store: KGStore, topic: str, golds: Sequence[dict | str], max_hops: int = 2) -> tuple[Edge, ...] | None:
    """The shortest outgoing path topic → … → a gold entity, as names; None if none within max_hops."""
    targets = _answer_ids(store, golds)
    start = store.lookup(topic)
    if start is None or not targets:
        return None
    # Breadth-first over (entity, path-so-far); ids ascend inside each adjacency slice, so the first
    # path found is the same on every run.
    frontier: list[tuple[int, tuple[tuple[int, int, int], ...]]] = [(start, ())]
    seen = {start}
    for _ in range(max_hops):
        nxt = []
        for node, path in frontier:
            for rel in store.relations_out(node):
                for tail in store.entities_out(node, int(rel)):
                    tail = int(tail)
                    step = path + ((node, int(rel), tail),)
                    if tail in targets:
                        return tuple((store.entity_names[h], store.relation_names[r], store.entity_names[t])
                                     for h, r, t in step)
                    if tail not in seen:
                        seen.add(tail)
                        nxt.append((tail, step))
        frontier = nxt
    return None


def query_turns(plan: KGPlan, restate_question: bool = False, reserved: Iterable[str] = ()) -> list[str]:
    """The assistant text of each query turn (two per hop). With `restate_question`, each thought
    that picks a relation opens with the question as the prompt shows it (`shown_question`), so
    that it is a copy the policy can make.

    Each argument opens with a space inside its quotes (`get_relations_out(" Ada Lovelace")`; the KG
    trims names): byte-level BPE gives `"Ada` other pieces than ` Ada`, the form in which the
    question and the thought hold the name, so the policy copies it token for token. On the default
    world kg_r1_sft went from EM 0.098 (format 0.44) to 0.164 (format 0.74) on KG A's test split.
    """
    asked = ""
    if restate_question:
        asked = shown_question(plan.question, reserved)
        # A question without end punctuation (WebQSP's "what is the name of justin bieber
        # brother") would run into the entity name that follows it.
        if asked:
            asked += " " if asked.endswith(("?", ".", "!")) else "? "
    turns = []
    for i, (head, rel, tail) in enumerate(plan.path):
        known = f"{plan.path[i - 1][0]} {plan.path[i - 1][1]} {head}. " if i else ""
        turns.append(f"{THINK_OPEN}{known}I need the relations of {head}.{THINK_CLOSE}\n"
                     f'{KG_OPEN}get_relations_out(" {head}"){KG_CLOSE}')
        turns.append(f"{THINK_OPEN}{asked}{head} has the relation {rel}; I follow it.{THINK_CLOSE}\n"
                     f'{KG_OPEN}get_entities_out(" {head}", " {rel}"){KG_CLOSE}')
    return turns


def answer_turn(plan: KGPlan) -> str:
    # "<answer> X": the name in the same word pieces as in the thought (ragrl.toy.gold, search_text).
    head, rel, tail = plan.path[-1]
    return (f"{THINK_OPEN}{head} {rel} {tail}. So the answer is {plan.answer}.{THINK_CLOSE}\n"
            f"{ANSWER_OPEN} {plan.answer}{ANSWER_CLOSE}")


def plan_row(row: dict, store: KGStore, max_hops: int = 2) -> KGPlan | str:
    """A plan, or the reason the row cannot have one."""
    golds = row_golds(row)
    topics = topic_entities(row)
    if not golds:
        return "no_gold_answer"
    if not topics:
        return "no_topic_entity"
    path = gold_path(store, topics[0], golds, max_hops)
    if path is None:
        return "no_path_within_max_hops"
    answer = path[-1][2]  # the KG's display name of the gold entity reached
    return KGPlan(str(row["id"]), str(row["question"]), answer, path)


def kg_gold_trajectories(qa_rows: Iterable[dict], engine: RolloutEngine, store: KGStore, *, max_hops: int = 2,
                         append_eos: bool = True, readable_share: float = 0.0,
                         readable_copies: bool = False, restate_question: bool = False
                         ) -> tuple[list[dict], SFTDataStats]:
    """Gold SFT rows under `engine`'s prompt, KG environment, tokenizer and budgets; one batched
    environment call per turn, as in a rollout. The engine's generator is never called.
    `readable_share`: the share of rows shown with readable relation names (module docstring);
    with `readable_copies` those rows are shown both ways, as two SFT rows (the copy's id is
    `<row id>#readable`), and the stats count trajectories: `total` = questions + copies."""
    if not 0.0 <= readable_share <= 1.0:
        raise InputError(f"readable_share={readable_share} must be in [0, 1]")
    env = engine.env
    stats = SFTDataStats("gold")
    drafts: list[_Draft] = []
    readable = readable_names(store.relation_names) if readable_share > 0 else {}
    # Longest names first, so that a name that extends another is renamed whole.
    renames = tuple(sorted(readable.items(), key=lambda item: -len(item[0])))
    for row in qa_rows:
        stats.total += 1
        plan = plan_row(row, store, max_hops)
        if isinstance(plan, str):
            stats.dropped[plan] += 1
            continue
        # Turns 0..max_turns-1 are tool turns; the answer comes at turn 2 x hops, and from
        # max_turns on the engine forces it (its own notice and <answer> prefill) instead.
        if 2 * len(plan.path) >= engine.config.max_turns:
            stats.dropped["too_many_turns"] += 1
            continue
        prompt = engine.prompt_ids(plan.question)
        # A hash of the row id, not a random draw: the same rows are renamed on every run.
        renamed = in_hashed_share(plan.row_id, readable_share)
        shown: list[tuple[KGPlan, tuple[tuple[str, str], ...]]] = []
        if not renamed or readable_copies:
            shown.append((plan, ()))
        if renamed:
            shown.append((replace(plan, path=tuple((h, readable.get(r, r), t) for h, r, t in plan.path),
                                  row_id=f"{plan.row_id}#readable" if readable_copies else plan.row_id), renames))
        stats.total += len(shown) - 1  # a copy is a trajectory of its own, kept or dropped on its own
        sent = query_turns(plan)  # what reaches the KG: always its real names
        for shown_plan, row_renames in shown:
            drafts.append(_Draft(shown_plan, list(prompt), [0] * len(prompt),
                                 texts=query_turns(shown_plan, restate_question, engine.reserved), sent=sent,
                                 renames=row_renames, question_id=plan.row_id))

    for turn in range(max((len(d.texts) for d in drafts), default=0)):
        active = [d for d in drafts if d.dropped is None and turn < len(d.texts)]
        if not active:
            continue
        actions = [env.parse(d.sent[turn]) for d in active]
        infos = env.respond(actions, engine.reserved, sample_ids=[d.question_id for d in active])
        for d, action, info in zip(active, actions, infos):
            append_segment(d, encode_segment(engine, d.texts[turn]), engine)
            if d.dropped is not None:
                continue
            # What the policy learns to write must parse too (it differs from what was sent when
            # it restates the question or shows readable names).
            written = action if d.texts[turn] == d.sent[turn] else env.parse(d.texts[turn])
            if action.kind != "kg-query" or written.kind != "kg-query" or written.overshoot:
                d.dropped = "unparsed_query"  # e.g. a name the call syntax cannot quote
                continue
            last = turn == len(d.texts) - 1
            if last and d.plan.answer not in (info or ""):
                d.dropped = "answer_not_observed"
                continue
            obs = encode_segment(engine, observation(_rename(info or "", d.renames)))
            if len(obs) > engine.config.max_obs_tokens:
                d.dropped = "observation_too_long"
                continue
            d.ids += obs
            d.mask += [0] * len(obs)

    return finish_drafts(drafts, answer_turn, engine, stats, append_eos), stats


def kg_gold_sft_stage(qa_parquet: str | Path, model_dir: str | Path, env, store: KGStore, out: str | Path, *,
                      rollout_cfg=None, limit: int | None = None, max_hops: int = 2,
                      readable_share: float = 0.0, readable_copies: bool = False,
                      restate_question: bool = False) -> dict:
    """Gold KG trajectories for the rows of `qa_parquet`, tokenized with the policy's tokenizer."""
    import transformers

    from ragrl.agent.rollout import RolloutConfig

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    engine = RolloutEngine(None, tokenizer, env, rollout_cfg or RolloutConfig())
    rows, stats = kg_gold_trajectories(read_qa_rows(qa_parquet, limit), engine, store, max_hops=max_hops,
                                       readable_share=readable_share, readable_copies=readable_copies,
                                       restate_question=restate_question)
    write_sft_data(rows, stats, out)
    report_stats(stats, out)
    return stats.to_dict()
