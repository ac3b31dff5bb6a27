"""The multi-turn rollout engine: generate, parse, search, append, repeat, batched over trajectories.

Each turn makes ONE batched generate call for every active trajectory and ONE retriever call for
every query of that turn (through the environment). Tokens are appended by id, never by
re-encoding text: generated tokens as sampled (loss mask 1), observations encoded on their own
and concatenated (loss mask 0). That keeps the response ids exactly the sequence the policy was
conditioned on, which is what the trainer must score.

Turn indices: turn t's generated tokens AND the environment's reply to that turn (its
observation, plus the turn-limit prompt after the last tool turn) carry index t. So every turn
is "what the model wrote, then what it got back"; a turn-level advantage (KG-R1) is written onto
the mask-1 tokens of a turn, and the mask-0 tokens in between belong to the action that caused
them.

Turn budget: turns 0..max_turns-1 are tool turns (a search or an invalid action each uses one,
so a model that only writes junk cannot loop). After the last tool turn the engine appends
`<information>Turn limit reached…</information>\\n\\n<answer>` (see `forced_answer_prompt`): the
prefilled <answer> (config `forced_answer_prefill`, default on) makes the forced turn an answer
attempt by construction, so trajectories that hit the limit still get a scorable answer, and
the final turn costs a few tokens instead of another round of reasoning. The price: that turn has
no <think> (the format reward exempts the turn after the notice) and the <answer> tag itself is
never trained there (mask 0). Without prefill the model must write `<think>…</think><answer>…`
itself; a search in the forced turn is then not executed and the trajectory ends unanswered.

Stops: each closing action tag that is one token (the tiny model) is a stop id, together with
eos; tags a tokenizer splits into pieces (Qwen2.5) become stop strings. A turn that ends at eos
without an action is an invalid action like any other: it gets an explanatory observation.

Bounds: per turn `max_turn_tokens`; per response `max_response_tokens` (generated + observation
tokens); per sequence `max_context_tokens` (prompt + response). A trajectory that cannot fit its
next generation or observation ends there, with the answer it has (None unless it answered).
With `context_overflow: roll` the context bound is a window instead, as the authors' loops keep
it: each turn is generated from the last `max_context_tokens` tokens, and the trajectory (what
is trained and scored) stays whole.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from ragrl.agent.environments import Environment
from ragrl.errors import InputError
from ragrl.settings import RolloutConfig  # noqa: F401  (re-exported)
from ragrl.agent.generation import Generator, cut_at_stop, cut_at_strings, keep_prefixes
from ragrl.agent.protocol import (
    ANSWER_OPEN,
    CLOSING_ACTION_TAGS,
    DEFAULT_INSTRUCTION,
    DEFAULT_MULTI_QUERY_INSTRUCTION,
    OBS_PREFIX,
    OBS_SUFFIX,
    RAG_R1_JSON_OPENING,
    Action,
    forced_answer_prompt,
    observation,
    prompt_messages,
)



@dataclass
class Trajectory:
    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 generated, 0 observation, per response token
    turn_index: list[int] = field(default_factory=list)  # per response token
    actions: list[dict] = field(default_factory=list)
    answer: str | None = None  # content of the final (valid) <answer>
    num_searches: int = 0  # executed search actions
    num_queries: int = 0  # executed queries (> num_searches with multi-query search)
    generated_tokens: int = 0
    observation_tokens: int = 0
    finished: bool = False  # ended with a valid answer
    stop_reason: str = ""  # answer | no_answer | response_limit | context_limit
    latency_s: float = 0.0  # from the start of the batch to this trajectory's end
    env_time_s: float = 0.0  # time spent waiting for the retriever (a shared call counts in full for each)
    response_text: str = ""
    sample_id: str | None = None  # the question's id, for environments that serve per-question data

    def to_dict(self) -> dict:
        return asdict(self)


def chat_prompt_text(tokenizer, messages: Sequence[Mapping[str, str]], continue_user_turn: bool = False) -> str:
    """A rollout's prompt as text: the chat template with its generation prompt (the assistant
    header), or, with `continue_user_turn`, cut right after the last message's text (KnowRL's
    `continue_final_message=True` over a conversation that ends with the user)."""
    messages = [dict(m) for m in messages]
    if continue_user_turn:
        return tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class RolloutEngine:
    def __init__(self, generator: Generator, tokenizer, env: Environment,
                 config: RolloutConfig = RolloutConfig()) -> None:
        self.generator = generator
        self.tokenizer = tokenizer
        self.env = env
        self.config = config
        # An environment that cuts parts of an observation itself (RAG-R1 cuts each query's
        # documents) counts them in the policy's tokens.
        use_tokenizer = getattr(env, "use_tokenizer", None)
        if callable(use_tokenizer):
            use_tokenizer(tokenizer)
        self.stop_token_ids, self.stop_strings = _stops(tokenizer)
        # Chat tokens and the like must not appear verbatim in observations (see protocol.sanitize).
        self.reserved = tuple(getattr(tokenizer, "all_special_tokens", ()) or ())
        self._head = self._encode(OBS_PREFIX)
        self._tail = self._encode(OBS_SUFFIX)
        self._forced = self._encode(forced_answer_prompt(config.forced_answer_prefill, config.turn_limit_notice))
        if config.max_obs_tokens < len(self._head) + len(self._tail):
            raise InputError(f"rollout.max_obs_tokens={config.max_obs_tokens} cannot even hold the "
                             f"<information> tags ({len(self._head) + len(self._tail)} tokens)")

    # ----------------------------------------------------------------------- prompts

    def prompt_ids(self, question: str, instruction: str | None = None) -> list[int]:
        """The chat-templated prompt (user turn + assistant header) for one question."""
        instruction = instruction or self.config.instruction
        if instruction is None:
            # An environment with its own tools (the KG functions) brings its own default prompt.
            instruction = getattr(self.env, "instruction", None)
        if instruction is None:
            instruction = DEFAULT_MULTI_QUERY_INSTRUCTION if self.env.spec.multi_query else DEFAULT_INSTRUCTION
        messages = prompt_messages(question, instruction, self.env.spec.max_queries, self.reserved,
                                   self.config.system_prompt, self.config.question_mark)
        text = chat_prompt_text(self.tokenizer, messages, self.config.continue_user_turn)
        # The template already wrote any BOS; adding special tokens again would double it.
        return self._encode(text)

    def run_questions(self, questions: Sequence[str], instruction: str | None = None, **kwargs) -> list[Trajectory]:
        return self.run([self.prompt_ids(q, instruction) for q in questions], **kwargs)

    def run_rows(self, rows: Sequence[dict], n: int | None = None, seed: int | None = None) -> list[Trajectory]:
        """The engine protocol the RL and evaluation stages drive (`ragrl.methods.Method.engine`):
        `n` samples per QA row (prompt-major). Question ids reach environments that answer per
        question (KG subgraph mode, oracle retrieval)."""
        return self.run_questions([r["question"] for r in rows], n=n, seed=seed,
                                  sample_ids=[str(r["id"]) for r in rows])

    # ----------------------------------------------------------------------- the loop

    def run(self, prompts: Sequence[Sequence[int]], n: int | None = None, seed: int | None = None,
            sample_ids: Sequence[str | None] | None = None) -> list[Trajectory]:
        """Roll out `n` samples per prompt (prompt-major order). Retrieval errors propagate.

        `sample_ids` (one per prompt) reach the environment with each action, for environments
        that answer per question, as KG-R1's subgraph mode does."""
        if sample_ids is not None and len(sample_ids) != len(prompts):
            raise ValueError(f"{len(sample_ids)} sample ids for {len(prompts)} prompts")
        cfg = self.config
        n = cfg.n if n is None else n
        seed = cfg.seed if seed is None else seed
        start = time.monotonic()
        trajs = [Trajectory(p, s, list(ids), sample_id=None if sample_ids is None else sample_ids[p])
                 for p, ids in enumerate(prompts) for s in range(n)]
        active = list(trajs)
        turn = 0
        with keep_prefixes(self.generator):  # each turn's contexts extend the last turn's sequences
            while active:
                active = self._step(active, turn, None if seed is None else seed * 1_000_003 + turn, start)
                turn += 1
        for t in trajs:
            t.response_text = self.tokenizer.decode(t.response_ids, skip_special_tokens=True)
        return trajs

    def _step(self, active: list[Trajectory], turn: int, seed: int | None, start: float) -> list[Trajectory]:
        cfg = self.config
        forced = turn >= cfg.max_turns
        budgets = {id(t): self._room(t) for t in active}
        for t in active:
            if budgets[id(t)][0] <= 0:
                self._end(t, budgets[id(t)][1], start)
        gen = [t for t in active if budgets[id(t)][0] > 0]
        if not gen:
            return []
        limits = [min(cfg.max_turn_tokens, budgets[id(t)][0]) for t in gen]
        # roll: the turn is generated from the context's last max_context_tokens tokens (the
        # authors' rolling state); the trajectory keeps all of it.
        window = -cfg.max_context_tokens if cfg.context_overflow == "roll" else 0
        outputs = self.generator.generate(
            [(t.prompt_ids + t.response_ids)[window:] for t in gen], limits, cfg.temperature, cfg.top_p, seed,
            stop_token_ids=self.stop_token_ids, stop_strings=self.stop_strings,
        )
        if len(outputs) != len(gen):
            raise RuntimeError(f"generator returned {len(outputs)} sequences for {len(gen)} prompts")

        pending: list[tuple[Trajectory, Action]] = []
        for t, out, limit in zip(gen, outputs, limits):
            ids = self._cut(out, limit)
            self._append(t, ids, 1, turn)
            t.generated_tokens += len(ids)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            prefilled = forced and cfg.max_turns > 0 and cfg.forced_answer_prefill
            if prefilled:
                text = ANSWER_OPEN + text
            action = self.env.parse(text)
            # `text` and `observation` are the turn record rewards read (`recorded_turns`): which
            # text the policy wrote and which the environment inserted is known here, and only here;
            # the decoded response cannot tell an <information> block the policy typed from ours.
            record = {"turn": turn, "type": action.kind, "queries": list(action.queries), "valid": action.valid,
                      "error": action.error, "dropped": list(action.dropped), "observation_tokens": 0, "forced": forced,
                      "text": text, "observation": None, "retrieved": [],
                      # the environment's turn-limit notice preceded this turn (a closed-book turn is
                      # past a budget of 0 tool turns, but no notice was shown: it still needs <think>)
                      "after_notice": forced and cfg.max_turns > 0 and cfg.turn_limit_notice}
            t.actions.append(record)
            if action.kind == "answer":
                t.answer = action.answer
                t.finished = True
                self._end(t, "answer", start)
            elif forced:
                if action.valid:  # a search after the turn limit is not executed
                    record.update(valid=False, error="turn limit reached; action not executed")
                self._end(t, "no_answer", start)
            elif self._room(t)[0] < len(self._head) + len(self._tail):  # not even an empty observation fits
                if action.valid:
                    record.update(valid=False, error="length limit reached; action not executed")
                self._end(t, self._room(t)[1], start)
            else:
                pending.append((t, action))
        if not pending:
            return []

        infos = self.env.respond([a for _, a in pending], self.reserved, sample_ids=[t.sample_id for t, _ in pending])
        searched = getattr(self.env, "last_search_s", 0.0) if any(_is_tool_call(a) for _, a in pending) else 0.0
        # (id, title, rank) of the passages behind each observation, where the environment says (search
        # environments); the record keeps those the policy was shown (`shown_passages`).
        hits = getattr(self.env, "last_hits", None)
        hits = hits if isinstance(hits, list) and len(hits) == len(pending) else [[] for _ in pending]
        still: list[Trajectory] = []
        for (t, action), info, turn_hits in zip(pending, infos, hits):
            if _is_tool_call(action):
                t.env_time_s += searched
                t.num_searches += 1
                t.num_queries += len(action.queries)
            obs, shown = self._encode_observation(info or "", min(cfg.max_obs_tokens, self._room(t)[0]))
            self._append(t, obs, 0, turn)
            t.actions[-1].update(observation_tokens=len(obs), observation=shown,
                                 retrieved=shown_passages(turn_hits, (info or "").strip(), shown))
            if turn + 1 == cfg.max_turns:
                room, reason = self._room(t)
                if len(self._forced) + 1 > room:  # the prompt plus at least one answer token
                    self._end(t, reason, start)
                    continue
                self._append(t, self._forced, 0, turn)
                t.actions[-1]["observation_tokens"] += len(self._forced)
            still.append(t)
        return still

    # ----------------------------------------------------------------------- helpers

    def _room(self, t: Trajectory) -> tuple[int, str]:
        """Tokens the response may still grow by, and which bound is the tighter one."""
        by_response = self.config.max_response_tokens - len(t.response_ids)
        if self.config.context_limit is None:  # roll: the context is cut, never full
            return by_response, "response_limit"
        by_context = self.config.context_limit - len(t.prompt_ids) - len(t.response_ids)
        return (by_response, "response_limit") if by_response <= by_context else (by_context, "context_limit")

    def _cut(self, ids: Sequence[int], limit: int) -> list[int]:
        """Backends may overshoot: cut at the first stop token / closing tag, and at the budget."""
        ids = cut_at_stop(list(ids), self.stop_token_ids, limit)
        if self.stop_strings:
            ids = cut_at_strings(ids, self.tokenizer, self.stop_strings)
        return ids

    def _append(self, t: Trajectory, ids: list[int], mask: int, turn: int) -> None:
        t.response_ids.extend(ids)
        t.loss_mask.extend([mask] * len(ids))
        t.turn_index.extend([turn] * len(ids))
        if not mask:
            t.observation_tokens += len(ids)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _encode_observation(self, info: str, budget: int) -> tuple[list[int], str]:
        """`observation(info)` as ids, its inner text cut so that the whole fits `budget`; and
        that inner text as the policy sees it (what a reward may credit it with having read).

        The closing </information> is always kept, so the model never sees an observation that
        appears to run on into its own next turn. The caller guarantees room for head + tail.
        """
        full = self._encode(observation(info))
        if len(full) <= budget:
            return full, info.strip()
        room = max(budget - len(self._head) - len(self._tail), 0)
        inner = self._encode(info.strip())[:room]
        return self._head + inner + self._tail, self.tokenizer.decode(inner, skip_special_tokens=True)

    def _end(self, t: Trajectory, reason: str, start: float) -> None:
        t.stop_reason = reason
        t.latency_s = time.monotonic() - start


def _is_tool_call(action: Action) -> bool:
    # A parsed call to the environment's tool (<search> or <kg-query>); invalid actions are not.
    return action.kind not in ("answer", "invalid")


def _stops(tokenizer) -> tuple[list[int], list[str]]:
    """Closing action tags as stop ids where each is one token, else as stop strings; plus eos."""
    ids, strings = [], []
    for tag in CLOSING_ACTION_TAGS:
        encoded = tokenizer.encode(tag, add_special_tokens=False)
        if len(encoded) == 1:
            ids.append(int(encoded[0]))
        else:
            strings.append(tag)
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return ids, strings


def shown_passages(hits: Sequence[tuple[str, str, int]], full: str, shown: str) -> list[str]:
    """Ids of the passages an observation showed the policy: all of them when it was shown in
    full; when the engine cut it to the token budget, those whose block header and title came
    before the cut (a passage cut off unread was not retrieved as far as the policy is concerned).

    A block starts "Doc {rank}(Title: {title})" or, in RAG-R1's JSON, "Doc {rank}: {title}", at a
    line's start or a JSON string's; the blocks are in hit order, so they are found in turn. "Doc 2"
    in the policy's own query (echoed in a Query line or the JSON's query list) is no header, and a
    title an earlier passage's text mentions is not its block."""
    if shown == full:
        return [pid for pid, _, _ in hits]
    cut = len(os.path.commonprefix([full, shown]))
    # RAG-R1's JSON lists the queries first, each a JSON string as the documents are: start after
    # them. A note on dropped queries may come first, and it quotes the policy's text raw: the JSON
    # is where its opening last occurs (inside JSON strings a newline is escaped), and its
    # "documents" key is the first after that (inside them a quote is escaped).
    start = full.rfind(RAG_R1_JSON_OPENING)
    pos = max(full.find('"documents":', start), 0) if start >= 0 else 0
    out = []
    for pid, title, rank in hits:
        header = re.compile(rf'(?:^|\n|\\n|")Doc {rank}(?:\(Title: |: )').search(full, pos)
        if header is None:
            break
        name = " ".join(title.split())
        # the title as shown (JSON may escape it: then only its escaped length is known)
        end = header.end() + (len(name) if full.startswith(name, header.end()) else len(json.dumps(name)) - 2)
        if end > cut:
            break
        out.append(pid)
        pos = end
    return out
