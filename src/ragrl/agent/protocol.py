"""The text protocol between the policy and its environment: tags, action parsing, observations.

Everything here is a pure function of strings, so that the rollout engine, the reward functions
and offline analysis of saved transcripts all read a turn the same way.

One assistant turn is free text (reasoning, by convention inside <think>…</think>) followed by
exactly one action:

    <search>query</search>          one query (env "search", Search-R1)
    <search>q1 | q2 | q3</search>    several queries (env "multi_query_search", RAG-R1); queries
                                    are separated by "|" or by newlines; several adjacent
                                    <search>…</search> blocks are read as one multi-query action too
    <answer>text</answer>           ends the episode
    <kg-query>…</kg-query>          KG environments only

A turn ends at its first closing action tag: everything after it is cut here as well as in the
generation backends (which may overshoot), so the model is never credited or blamed for text the
environment did not see. Validity means "the environment can execute this action"; whether the
turn is also well styled (think first, nothing else) is the format reward's business, not the
parser's, so a valid action with sloppy reasoning still gets its search results.

The parser never raises, whatever the string: a malformed turn becomes an `Action` of kind
"invalid" whose `error` is shown to the model inside an <information> block.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ragrl.errors import InputError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
KG_OPEN, KG_CLOSE = "<kg-query>", "</kg-query>"

PROTOCOL_TAGS: tuple[str, ...] = (
    THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, INFO_OPEN, INFO_CLOSE,
    ANSWER_OPEN, ANSWER_CLOSE, KG_OPEN, KG_CLOSE,
)
ACTION_NAMES: tuple[str, ...] = ("search", "answer", "kg-query")
OPEN_TAG = {name: f"<{name}>" for name in ACTION_NAMES}
CLOSE_TAG = {name: f"</{name}>" for name in ACTION_NAMES}
CLOSING_ACTION_TAGS: tuple[str, ...] = tuple(CLOSE_TAG.values())

OBS_PREFIX = "\n\n" + INFO_OPEN
OBS_SUFFIX = INFO_CLOSE + "\n\n"
DEFAULT_QUERY_SEPARATORS: tuple[str, ...] = ("|", "\n")

# The notice that precedes the forced final turn. The format reward recognises it by this exact
# text (a forced turn starts with the environment's prefilled <answer>, not with <think>).
TURN_LIMIT_NOTICE = "Turn limit reached. Give your final answer now."

_TAG_RE = re.compile("|".join(re.escape(t) for t in sorted(PROTOCOL_TAGS, key=len, reverse=True)))
_CLOSING_RE = re.compile("|".join(re.escape(t) for t in CLOSING_ACTION_TAGS))
# HARR's authors take the last match of this pattern in the turn (generator.py, _cur_response_pattern).
# Anything tag-shaped that is not ours: reported when a turn has no action, since a model that
# writes <query>…</query> deserves a more useful hint than "no action".
_ANY_TAG_RE = re.compile(r"</?([A-Za-z][A-Za-z0-9_-]{0,30})>")
_WS_RE = re.compile(r"\s+")
_CHAT_TOKEN_RE = re.compile(r"<\|[^<>|\s]{1,40}\|>")


@dataclass(frozen=True)
class ActionSpec:
    """What an environment accepts. `max_queries` > 1 only makes sense with `multi_query`."""

    actions: tuple[str, ...] = ("search", "answer")
    multi_query: bool = False
    max_queries: int = 1
    separators: tuple[str, ...] = DEFAULT_QUERY_SEPARATORS

    def __post_init__(self) -> None:
        unknown = set(self.actions) - set(ACTION_NAMES)
        if unknown:
            raise InputError(f"unknown action(s) {sorted(unknown)}; known: {list(ACTION_NAMES)}")
        if self.max_queries < 1:
            raise InputError(f"max_queries={self.max_queries} must be >= 1")
        if not self.multi_query and self.max_queries != 1:
            raise InputError("max_queries > 1 needs multi_query=True")

    @property
    def tools(self) -> tuple[str, ...]:
        """The tool actions (everything but <answer>): what a well-formed non-final turn may call."""
        return tuple(a for a in self.actions if a != "answer")


SEARCH_SPEC = ActionSpec()


@dataclass(frozen=True)
class Action:
    """One parsed turn. `kind` is "search", "answer", "kg-query" or "invalid"."""

    kind: str
    queries: tuple[str, ...] = ()
    answer: str | None = None
    error: str | None = None
    dropped: tuple[str, ...] = ()  # queries over the per-turn cap, reported to the model
    overshoot: str = ""  # text after the action, discarded
    # The last <think> content before a query action, verbatim (None: the turn had none). Not part
    # of what the action *does*, so two actions that search the same thing compare equal; HARR's
    # history-aware state carries it as the hop's "answer", as the authors' Search-R1 loop does.
    think: str | None = field(default=None, compare=False)

    @property
    def valid(self) -> bool:
        return self.kind != "invalid"


# --------------------------------------------------------------------------- parsing


def truncate_turn(text: str, spec: ActionSpec = SEARCH_SPEC) -> tuple[str, str]:
    """Split a turn into (kept, overshoot) right after its first closing action tag.

    In multi-query mode a run of <search>…</search> blocks separated only by whitespace counts as
    one action and is kept whole. Without any closing action tag the whole text is kept.
    """
    match = _CLOSING_RE.search(text)
    if match is None:
        return text, ""
    end = match.end()
    if spec.multi_query and match.group() == SEARCH_CLOSE:
        follow = re.compile(r"\s*" + re.escape(SEARCH_OPEN) + r"(.*?)" + re.escape(SEARCH_CLOSE), re.S)
        while (more := follow.match(text, end)) and not _TAG_RE.search(more.group(1)):
            end = more.end()
    return text[:end], text[end:]


def parse_action(text: str, spec: ActionSpec = SEARCH_SPEC) -> Action:
    """Parse one generated assistant turn. Never raises (any `str` gives an `Action`)."""
    try:
        return _parse(text, spec)
    except Exception as exc:  # noqa: BLE001 - a parser bug must not kill a training run; it is reported to the model
        return Action("invalid", error=f"unparseable turn ({type(exc).__name__})")


def _parse(text: str, spec: ActionSpec) -> Action:
    kept, overshoot = truncate_turn(text, spec)
    close = _last_closing(kept)
    if close is None:
        return _invalid(_no_action_error(kept), overshoot)
    name, close_at = close
    blocks = _action_blocks(kept, name, close_at, spec)
    if isinstance(blocks, str):
        return _invalid(blocks, overshoot)
    prefix, contents = blocks
    problem = _prefix_problem(prefix)
    if problem:
        return _invalid(problem, overshoot)
    for content in contents:
        if _TAG_RE.search(content):
            return _invalid(f"tags nested inside <{name}>…</{name}>; an action's content must be plain text.", overshoot)
    if name not in spec.actions:
        return _invalid(f"<{name}> is not available here.", overshoot)
    if name == "answer":
        return Action("answer", answer=contents[0].strip(), overshoot=overshoot)
    thinks = split_blocks(prefix, THINK_OPEN, THINK_CLOSE)[1::2]
    return _query_action(name, contents, spec, overshoot, thinks[-1] if thinks else None)


def _last_closing(kept: str) -> tuple[str, int] | None:
    """The action whose closing tag ends `kept` (after truncation there is at most one run)."""
    matches = list(_CLOSING_RE.finditer(kept))
    if not matches:
        return None
    last = matches[-1]
    return last.group()[2:-1], last.start()


def _action_blocks(kept: str, name: str, close_at: int, spec: ActionSpec) -> tuple[str, list[str]] | str:
    """(text before the action, content of each block), or an error message."""
    open_tag, close_tag = OPEN_TAG[name], CLOSE_TAG[name]
    end = close_at + len(close_tag)
    contents: list[str] = []
    while True:
        start = kept.rfind(open_tag, 0, end)
        if start < 0:
            return f"{close_tag} without an opening {open_tag}."
        contents.append(kept[start + len(open_tag) : end - len(close_tag)])
        before = kept[:start]
        # Walk back over an adjacent run of blocks (multi-query only; truncate_turn kept it).
        stripped = before.rstrip()
        if spec.multi_query and name == "search" and stripped.endswith(close_tag) and len(contents) < 64:
            end = len(stripped)
            continue
        contents.reverse()
        return before, contents


def _prefix_problem(prefix: str) -> str | None:
    for tag in _TAG_RE.findall(prefix):
        if tag in (INFO_OPEN, INFO_CLOSE):
            return "<information> blocks are written by the environment, not by you."
        name = tag.strip("</>")
        if name in ACTION_NAMES:
            return f"several or overlapping actions ({tag} before the final action); write exactly one action per turn."
    return None


def _no_action_error(kept: str) -> str:
    for name in ACTION_NAMES:
        if OPEN_TAG[name] in kept:
            return f"unclosed {OPEN_TAG[name]} (missing {CLOSE_TAG[name]})."
    foreign = [m.group(1) for m in _ANY_TAG_RE.finditer(kept) if m.group(0) not in PROTOCOL_TAGS]
    if foreign:
        return f"unknown tag <{foreign[0]}>."
    if not kept.strip():
        return "empty turn, no action."
    return "no action found."


def _query_action(name: str, contents: list[str], spec: ActionSpec, overshoot: str, think: str | None) -> Action:
    if spec.multi_query:
        raw = [q for c in contents for q in split_queries(c, spec.separators)]
    else:
        if len(contents) > 1:  # unreachable via truncate_turn; kept for direct callers
            return _invalid("several actions in one turn; write exactly one.", overshoot)
        raw = [contents[0]]
    queries: list[str] = []
    for q in map(normalize_query, raw):
        if q and q not in queries:  # duplicates would only repeat the same documents
            queries.append(q)
    if not queries:
        return _invalid(f"empty query in <{name}>…</{name}>.", overshoot)
    kept, dropped = queries[: spec.max_queries], queries[spec.max_queries :]
    return Action(name, queries=tuple(kept), dropped=tuple(dropped), overshoot=overshoot, think=think)


def _invalid(error: str, overshoot: str) -> Action:
    return Action("invalid", error=error, overshoot=overshoot)


def query_joiner(separator: str) -> str:
    """How queries are written joined by `separator` ("q1 | q2", RAG-R1's "q1, q2"): the gold plans
    and the refusal's hint both, so they split back as `split_queries` reads them."""
    return f" {separator} " if separator == "|" else f"{separator} "


def split_queries(content: str, separators: Sequence[str] = DEFAULT_QUERY_SEPARATORS) -> list[str]:
    """Split one <search> block's content on any of `separators` (empty pieces are kept, as '')."""
    pieces = [content]
    for sep in separators:
        if sep:
            pieces = [p for piece in pieces for p in piece.split(sep)]
    return pieces


def normalize_query(query: str) -> str:
    """Drop control characters and U+FFFD (byte junk from sampling), collapse whitespace."""
    cleaned = "".join(
        " " if ch.isspace() else ch
        for ch in query
        if ch.isspace() or (unicodedata.category(ch) not in ("Cc", "Cs", "Co", "Cn") and ch != "\ufffd")
    )
    return _WS_RE.sub(" ", cleaned).strip()


# --------------------------------------------------------------------------- observations


def sanitize(text: str, reserved: Iterable[str] = ()) -> str:
    """Defuse protocol tags and chat tokens inside retrieved text or a question.

    A passage that contained "</information>" or "<|im_end|>" would otherwise be encoded as the
    real token and end the observation or the turn early; "&lt;" keeps it readable but inert.
    """
    return _CHAT_TOKEN_RE.sub(lambda m: "&lt;" + m.group()[1:], defuse(text, {*PROTOCOL_TAGS, *reserved}))


def defuse(text: str, tokens: Iterable[str]) -> str:
    """`text` with each of `tokens` that starts with "<" made inert ("&lt;…"), longest first."""
    for token in sorted(set(tokens), key=len, reverse=True):
        if token and token.startswith("<"):
            text = text.replace(token, "&lt;" + token[1:])
    return text


def format_docs(hits: Sequence[dict], reserved: Iterable[str] = ()) -> str:
    """Search-R1's passage layout: one `Doc i(Title: …) text` line per hit."""
    reserved = tuple(reserved)
    lines = []
    for i, hit in enumerate(hits, 1):
        title = sanitize(_one_line(str(hit.get("title") or "")), reserved)
        body = sanitize(str(hit["text"]), reserved)
        lines.append(f"Doc {i}(Title: {title}) {body}\n")
    return "".join(lines) if lines else "No results.\n"


def format_multi_docs(queries: Sequence[str], hits: Sequence[Sequence[dict]], reserved: Iterable[str] = ()) -> str:
    """Results grouped per query, each group headed by its query so the model can tell them apart."""
    reserved = tuple(reserved)
    groups = [f"Query {i}: {sanitize(q, reserved)}\n{format_docs(h, reserved)}" for i, (q, h) in
              enumerate(zip(queries, hits, strict=True), 1)]
    return "\n".join(groups)


def format_rag_r1_json(queries: Sequence[str], hits: Sequence[Sequence[dict]], reserved: Iterable[str] = ()) -> str:
    """RAG-R1's multi-query observation (`rag_r1/llm_agent/generation_mq.py`, `_passages2string`):
    `json.dumps({"query": [...], "documents": ["Doc 1: {title}\\n{text}\\nDoc 2: ...", ...]}, indent=2)`,
    one documents string per query, uncut (the environment may cut each, as RAG-R1 does, and
    write them with `rag_r1_json`; else the rollout engine cuts the whole observation)."""
    reserved = tuple(reserved)
    return rag_r1_json(queries, [rag_r1_documents(per_query, reserved) for per_query in hits], reserved)


# How json.dumps(..., indent=2) opens RAG-R1's observation object.
RAG_R1_JSON_OPENING = '{\n  "query": ['


def rag_r1_json(queries: Sequence[str], documents: Sequence[str], reserved: Iterable[str] = ()) -> str:
    if len(documents) != len(queries):
        raise ValueError(f"{len(documents)} result lists for {len(queries)} queries")
    reserved = tuple(reserved)
    return json.dumps({"query": [sanitize(q, reserved) for q in queries], "documents": list(documents)}, indent=2)


def rag_r1_documents(hits: Sequence[dict], reserved: tuple[str, ...] = ()) -> str:
    """One query's documents string of RAG-R1's JSON observation: "Doc 1: {title}\\n{text}\\nDoc 2: ..."."""
    return "\n".join(f"Doc {i}: {_contents(hit, reserved)}" for i, hit in enumerate(hits, 1)).strip()


def rag_r1_header_ends(hits: Sequence[dict], reserved: tuple[str, ...] = ()) -> list[int]:
    """Where each hit's "Doc i: {title}" header ends in `rag_r1_documents(hits)` (character
    offsets): a cut of that string before one of them left the passage unshown."""
    ends, pos = [], 0
    for i, hit in enumerate(hits, 1):
        line = f"Doc {i}: {_contents(hit, reserved)}"
        ends.append(pos + len(line.split("\n", 1)[0]))
        pos += len(line) + 1
    return ends


def _contents(hit: dict, reserved: tuple[str, ...]) -> str:
    # Search-R1's `contents`: the title line, then the text.
    return sanitize(f"{_one_line(str(hit.get('title') or ''))}\n{hit['text']}", reserved)


def dropped_note(dropped: Sequence[str], max_queries: int) -> str:
    if not dropped:
        return ""
    return f"Note: at most {max_queries} queries per turn; not searched: {' | '.join(dropped)}\n"


def invalid_message(error: str | None, spec: ActionSpec = SEARCH_SPEC, reserved: Iterable[str] = ()) -> str:
    """The explanation an invalid action gets. The error may quote the model ("unknown tag <s>."
    names Llama's BOS token), so the tokenizer's reserved tokens in it are defused; its protocol
    tags stay literal, as they name what the model should write."""
    if error:
        error = defuse(error, set(reserved) - set(PROTOCOL_TAGS))
    hint = []
    if "search" in spec.actions:
        # The environment's own separator: under RAG-R1's commas a "q1 | q2" hint would teach one query.
        hint.append(f"<search>q1{query_joiner(spec.separators[0])}q2</search>" if spec.multi_query
                    else "<search>query</search>")
    if "kg-query" in spec.actions:
        hint.append("<kg-query>query</kg-query>")
    if "answer" in spec.actions:
        hint.append("<answer>answer</answer>")
    return f"Invalid action: {error or 'unknown problem.'} Use {' or '.join(hint)}."


def observation(inner: str) -> str:
    """The full observation string appended after an action (leading/trailing blank lines included)."""
    return OBS_PREFIX + inner.strip() + OBS_SUFFIX


def forced_answer_prompt(prefill: bool = True, notice: bool = True) -> str:
    """Appended (as environment tokens) after the last allowed tool turn.

    It follows an observation that already ends in a blank line. With `notice`, the turn-limit
    notice in an <information> block; with `prefill` the <answer> tag is written for the model:
    the final turn then only has to produce the answer text and </answer>, so every trajectory
    that reaches the limit yields a scorable answer attempt instead of another (unexecuted)
    search. Neither (the authors' Search-R1 and KG-R1 loops): the last turn is generated as any
    other, and a search in it is not executed.
    """
    return (INFO_OPEN + TURN_LIMIT_NOTICE + OBS_SUFFIX if notice else "") + (ANSWER_OPEN if prefill else "")


# --------------------------------------------------------------------------- turn records


@dataclass(frozen=True)
class TurnRecord:
    """One assistant turn as the rollout engine recorded it: what the policy wrote (`text`, with
    the environment's prefilled <answer> of a forced turn), what the environment inserted after
    it (`observation`, the inner text of its <information> block as the policy saw it, or None),
    whether the environment's turn-limit notice preceded it (`after_notice`), and the ids of the
    passages its observation showed (`retrieved`, search environments).

    Rewards read these, not the decoded response: a policy can type `<information>…</information>`
    into its own turn, and a reward that re-parses the response would credit that block as
    something the environment returned."""

    text: str
    observation: str | None = None
    after_notice: bool = False
    retrieved: tuple[str, ...] = ()
    # the environment took the turn's action as valid (a search whose queries all split to
    # nothing, "<search> , </search>", reads as a search in the text but was refused)
    valid: bool = True


def recorded_turns(trajectory) -> list[TurnRecord]:
    """The turn records of a trajectory (a `Trajectory` or its dict) from the engine's `actions`.

    A trajectory without them (an engine that records no turns, a transcript saved before they
    existed) is an error, not a reason to fall back to parsing its text; a RuntimeError, since it
    is a defect of the engine, not of the user's input (the CLI shows its traceback)."""
    actions = trajectory.get("actions") if isinstance(trajectory, Mapping) else getattr(trajectory, "actions", None)
    if actions is None or any("text" not in a for a in actions):
        raise RuntimeError("trajectory has no turn record (actions[*].text / .observation): rewards do not re-parse "
                           "response text, where the policy's own <information> blocks would pass as observations")
    return [TurnRecord(str(a["text"]), a.get("observation"), bool(a.get("after_notice", False)),
                       tuple(str(i) for i in a.get("retrieved") or ()), bool(a.get("valid", True))) for a in actions]


def parse_turns(response_text: str) -> list[TurnRecord]:
    """Turn records re-read from a decoded response, for the one path that has only text (verl's
    reward function). An <information> block the policy typed reads as an observation here:
    prefer `recorded_turns` wherever the trajectory is at hand.

    The response alternates turn, <information>, turn, …; the turn-limit notice that follows the
    last observation is not a turn of its own (it marks the next turn as forced), and a
    whitespace-only tail after the last observation (a length limit) is not a turn."""
    pieces = split_information(response_text)
    texts, infos = pieces[0::2], pieces[1::2]
    turns: list[TurnRecord] = []
    forced = False
    for i, text in enumerate(texts):
        info = infos[i] if i < len(infos) else None
        if i > 0 and not text.strip() and (info is None or info.strip() == TURN_LIMIT_NOTICE):
            forced = forced or info is not None
            continue
        turns.append(TurnRecord(text, info, forced))
        forced = info is not None and info.strip() == TURN_LIMIT_NOTICE
    return turns


def split_information(text: str) -> list[str]:
    """[turn, info, turn, info, ..., turn]: `text` split at its <information>…</information> blocks."""
    return split_blocks(text, INFO_OPEN, INFO_CLOSE)


def split_blocks(text: str, open_tag: str, close_tag: str) -> list[str]:
    """[outside, inside, outside, ..., outside]: `text` split at its open_tag…close_tag blocks.

    The same pairing as the regex `<x>(.*?)</x>` (each opening tag with the next closing tag), but
    linear: the regex restarts its search for a closing tag at every unclosed opening tag, which
    is quadratic in text a policy writes (52 s for 20,000 of them). Once no closing tag follows an
    opening tag, none follows any later one either, so the scan stops there.
    """
    pieces: list[str] = []
    pos = 0
    while (start := text.find(open_tag, pos)) >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            break
        pieces += [text[pos:start], text[start + len(open_tag) : end]]
        pos = end + len(close_tag)
    pieces.append(text[pos:])
    return pieces


def _one_line(text: str) -> str:
    return _WS_RE.sub(" ", text).strip()


# --------------------------------------------------------------------------- prompts

DEFAULT_INSTRUCTION = (
    "Answer the given question. Reason step by step inside <think> and </think> every time you "
    "get new information. If you lack some knowledge after reasoning, call a search engine with "
    "<search> query </search>; it returns the top results between <information> and "
    "</information>. You may search as many times as you need. When no further knowledge is "
    "needed, give the final answer inside <answer> and </answer>, without explanation, for "
    "example <answer> Beijing </answer>. Question: {question}\n"
)

DEFAULT_MULTI_QUERY_INSTRUCTION = (
    "Answer the given question. Reason step by step inside <think> and </think> every time you "
    "get new information. If you lack some knowledge after reasoning, call a search engine with "
    "up to {max_queries} queries at once, separated by |, as in <search> query 1 | query 2 "
    "</search>; it returns the top results for each query between <information> and "
    "</information>. You may search as many times as you need. When no further knowledge is "
    "needed, give the final answer inside <answer> and </answer>, without explanation, for "
    "example <answer> Beijing </answer>. Question: {question}\n"
)


# RAG-R1's queries are separated by commas (its generation_mq.py splits on ","), so its prompt says so.
RAG_R1_MULTI_QUERY_INSTRUCTION = (
    "Answer the given question. Reason step by step inside <think> and </think> every time you "
    "get new information. If you lack some knowledge after reasoning, call a search engine with "
    "up to {max_queries} queries at once, separated by commas, as in <search> query 1, query 2 "
    "</search>; it returns the top results for each query between <information> and "
    "</information>. You may search as many times as you need. When no further knowledge is "
    "needed, give the final answer inside <answer> and </answer>, without explanation, for "
    "example <answer> Beijing </answer>. Question: {question}\n"
)


def shown_question(question: str, reserved: Iterable[str] = ()) -> str:
    """The question as the prompt shows it: stripped, its tags and chat tokens defused."""
    return sanitize(question.strip(), reserved)


def build_instruction(question: str, template: str = DEFAULT_INSTRUCTION, max_queries: int = 1,
                      reserved: Iterable[str] = ()) -> str:
    """Fill `{question}` and `{max_queries}` by plain replacement (other braces are left alone)."""
    return template.replace("{max_queries}", str(max_queries)).replace("{question}", shown_question(question, reserved))


def prompt_messages(question: str, template: str = DEFAULT_INSTRUCTION, max_queries: int = 1,
                    reserved: Iterable[str] = (), system_prompt: str | None = None,
                    question_mark: bool = False) -> list[dict[str, str]]:
    """The chat messages of a rollout's prompt: the filled instruction as the user turn, after a
    system message when `system_prompt` is given (KnowRL's: its instruction as the system turn,
    the question as the user turn). `question_mark`: the question stripped and ended with "?" where
    it has none, as Search-R1's data processing writes it."""
    if question_mark:
        question = question.strip()
        question += "" if question.endswith("?") else "?"
    user = {"role": "user", "content": build_instruction(question, template, max_queries, reserved)}
    return [{"role": "system", "content": system_prompt}, user] if system_prompt is not None else [user]
