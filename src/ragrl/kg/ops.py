"""KG-R1's four one-hop operations as pure functions over a `KGStore`, with typed results.

    get_relations_out(entity)            relations where the entity is the head   (legacy: get_tail_relations)
    get_relations_in(entity)             relations where the entity is the tail   (legacy: get_head_relations)
    get_entities_out(entity, relation)   tails of (entity, relation, ?)           (legacy: get_tail_entities)
    get_entities_in(entity, relation)    heads of (?, relation, entity)           (legacy: get_head_entities)

Every call returns an `OpResult` whose `message` is what the model reads. Failures are not
exceptions: a query naming an unknown entity is an ordinary event in an RL rollout, and the
message says what to do next (similar names, the entity's actual relations, the other
direction). Each status has a fixed message prefix, so rewards can classify an observation from
its text alone (`status_of_message`).

The model's strings are only ever used as dictionary keys into the store; nothing is evaluated,
formatted into a query language, or executed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from ragrl.errors import InputError
from ragrl.kg.store import KGStore


class Status(StrEnum):
    SUCCESS = "success"
    FORMAT_ERROR = "format_error"
    ENTITY_NOT_FOUND = "entity_not_found"
    RELATION_NOT_FOUND = "relation_not_found"
    NO_RESULTS = "no_results"
    # Not the model's doing: the request named a dataset or question the server does not have.
    DATASET_NOT_FOUND = "dataset_not_found"
    SAMPLE_NOT_FOUND = "sample_not_found"
    # A lookup that raised: a server bug, reported for its item only.
    INTERNAL_ERROR = "internal_error"


# Statuses that mean the pipeline, not the policy, is wrong; environments raise on these.
BACKEND_ERRORS = frozenset({Status.DATASET_NOT_FOUND, Status.SAMPLE_NOT_FOUND, Status.INTERNAL_ERROR})

MESSAGE_PREFIX = {
    Status.FORMAT_ERROR: "Format error: ",
    Status.ENTITY_NOT_FOUND: "Entity not found: ",
    Status.RELATION_NOT_FOUND: "Relation not found: ",
    Status.NO_RESULTS: "No results: ",
    Status.DATASET_NOT_FOUND: "Server error: ",
    Status.SAMPLE_NOT_FOUND: "Server error: ",
    Status.INTERNAL_ERROR: "Server error: ",
}
# Success messages echo the call, so they start with the function name.
SUCCESS_PREFIX = "get_"


@dataclass(frozen=True)
class OpLimits:
    """Caps that keep an observation short: a hub entity can have thousands of neighbours."""

    max_results: int = 50
    max_listed_relations: int = 30  # in "relation not found" hints
    max_suggestions: int = 5
    max_arg_chars: int = 256

    def __post_init__(self) -> None:
        for name in ("max_results", "max_listed_relations", "max_suggestions", "max_arg_chars"):
            if getattr(self, name) < 1:
                raise InputError(f"{name}={getattr(self, name)} must be >= 1")


DEFAULT_LIMITS = OpLimits()


@dataclass(frozen=True)
class OpResult:
    status: Status
    message: str
    results: tuple[str, ...] = ()  # shown results (capped)
    total: int = 0  # results before the cap
    op: str = ""
    entity: str | None = None  # resolved entity name where there was one, else as given
    relation: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.SUCCESS

    @property
    def truncated(self) -> int:
        return self.total - len(self.results)

    def to_dict(self) -> dict:
        return {"status": self.status.value, "message": self.message, "results": list(self.results),
                "total": self.total, "action_type": self.op}


@dataclass(frozen=True)
class Operation:
    name: str
    params: tuple[str, ...]
    direction: str  # "out" or "in"
    target: str  # "relations" or "entities"
    legacy: str
    fn: Callable[..., OpResult] = field(repr=False, compare=False)

    @property
    def arity(self) -> int:
        return len(self.params)

    @property
    def usage(self) -> str:
        quoted = ", ".join('"' + p + '"' for p in self.params)
        return f"{self.name}({quoted})"


# --------------------------------------------------------------------------- messages


def _q(text: str, limit: int = 80) -> str:
    """A model string quoted for a message, shortened so a 10k-character argument stays a short error."""
    text = " ".join(text.split())
    return f'"{text if len(text) <= limit else text[: limit - 1] + "…"}"'


def _call(op: str, *args: str) -> str:
    return f"{op}({', '.join(_q(a) for a in args)})"


format_call = _call  # public: clients that rebuild a success message echo the call the same way


def _listing(items: Sequence[str], cap: int) -> str:
    shown = ", ".join(items[:cap])
    return shown + (f" (+{len(items) - cap} more)" if len(items) > cap else "")


def _fail(status: Status, text: str, op: str, entity: str | None = None, relation: str | None = None) -> OpResult:
    return OpResult(status, MESSAGE_PREFIX[status] + text, op=op, entity=entity, relation=relation)


def status_of_message(message: str | None) -> Status | None:
    """The status an op message was written for (None for text that is not an op message)."""
    if not message:
        return None
    text = message.lstrip()
    for status, prefix in MESSAGE_PREFIX.items():
        if text.startswith(prefix):
            return status
    return Status.SUCCESS if text.startswith(SUCCESS_PREFIX) else None


# --------------------------------------------------------------------------- the operations


def get_relations_out(store: KGStore, entity: str, limits: OpLimits = DEFAULT_LIMITS, *, op: str = "") -> OpResult:
    return _relations(store, entity, "out", limits, op or "get_relations_out")


def get_relations_in(store: KGStore, entity: str, limits: OpLimits = DEFAULT_LIMITS, *, op: str = "") -> OpResult:
    return _relations(store, entity, "in", limits, op or "get_relations_in")


def get_entities_out(store: KGStore, entity: str, relation: str, limits: OpLimits = DEFAULT_LIMITS, *,
                     op: str = "") -> OpResult:
    return _entities(store, entity, relation, "out", limits, op or "get_entities_out")


def get_entities_in(store: KGStore, entity: str, relation: str, limits: OpLimits = DEFAULT_LIMITS, *,
                    op: str = "") -> OpResult:
    return _entities(store, entity, relation, "in", limits, op or "get_entities_in")


# Legacy names (KG-R1's first release and its prompts): head/tail name the *other* end.
def get_tail_relations(store: KGStore, entity: str, limits: OpLimits = DEFAULT_LIMITS) -> OpResult:
    return get_relations_out(store, entity, limits, op="get_tail_relations")


def get_head_relations(store: KGStore, entity: str, limits: OpLimits = DEFAULT_LIMITS) -> OpResult:
    return get_relations_in(store, entity, limits, op="get_head_relations")


def get_tail_entities(store: KGStore, entity: str, relation: str, limits: OpLimits = DEFAULT_LIMITS) -> OpResult:
    return get_entities_out(store, entity, relation, limits, op="get_tail_entities")


def get_head_entities(store: KGStore, entity: str, relation: str, limits: OpLimits = DEFAULT_LIMITS) -> OpResult:
    return get_entities_in(store, entity, relation, limits, op="get_head_entities")


OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation("get_relations_out", ("entity",), "out", "relations", "get_tail_relations", get_relations_out),
        Operation("get_relations_in", ("entity",), "in", "relations", "get_head_relations", get_relations_in),
        Operation("get_entities_out", ("entity", "relation"), "out", "entities", "get_tail_entities", get_entities_out),
        Operation("get_entities_in", ("entity", "relation"), "in", "entities", "get_head_entities", get_entities_in),
    )
}
LEGACY_NAMES: dict[str, str] = {op.legacy: op.name for op in OPERATIONS.values()}
ALL_NAMES: tuple[str, ...] = (*OPERATIONS, *LEGACY_NAMES)
USAGE = ", ".join(op.usage for op in OPERATIONS.values())


def canonical_name(name: str) -> str | None:
    """The canonical op for a function name (canonical or legacy, any case), or None."""
    key = name.strip().lower()
    return key if key in OPERATIONS else LEGACY_NAMES.get(key)


def execute(store: KGStore, fn: str, args: Sequence[str | None], limits: OpLimits = DEFAULT_LIMITS) -> OpResult:
    """Run one op by name (canonical or legacy) with positional string arguments; never raises on bad input."""
    name = canonical_name(fn) if isinstance(fn, str) else None
    if name is None:
        return _fail(Status.FORMAT_ERROR, f"unknown function {_q(str(fn), 40)}. Available: {USAGE}.", str(fn))
    spec = OPERATIONS[name]
    called = fn.strip().lower()  # echoed in messages, whose "get_" prefix marks success
    args = list(args)
    if len(args) != spec.arity:
        return _fail(Status.FORMAT_ERROR, f"{called} takes {spec.arity} argument{'s' if spec.arity > 1 else ''} "
                     f"({', '.join(spec.params)}), got {len(args)}. Usage: {spec.usage}.", called)
    for param, value in zip(spec.params, args):
        if not isinstance(value, str) or not value.strip():
            return _fail(Status.FORMAT_ERROR, f"{called}: the {param} is empty. Usage: {spec.usage}.", called)
        if len(value) > limits.max_arg_chars:
            return _fail(Status.FORMAT_ERROR, f"{called}: the {param} has {len(value)} characters "
                         f"(limit {limits.max_arg_chars}). Usage: {spec.usage}.", called)
    return spec.fn(store, *args, limits, op=called)


def _resolve(store: KGStore, entity: str, op: str, limits: OpLimits) -> tuple[tuple[int, ...], OpResult | None]:
    ids = store.resolve(entity).ids
    if ids:
        return ids, None
    similar = store.suggest(entity, limits.max_suggestions)
    hint = (f"Similar names: {', '.join(_q(s) for s in similar)}." if similar
            else "No similar names.")
    return (), _fail(Status.ENTITY_NOT_FOUND, f"{_q(entity)} is not in the knowledge graph. {hint} "
                     "Use an entity name exactly as it appears in the question or in earlier results.", op, entity)


def _display(store: KGStore, ids: tuple[int, ...], given: str) -> str:
    """The entity as results should call it: its canonical name when the lookup was unambiguous."""
    names = {store.entity_names[i] for i in ids}
    return names.pop() if len(names) == 1 else given


def _relation_ids(store: KGStore, ids: tuple[int, ...], direction: str) -> np.ndarray:
    adj = store.out if direction == "out" else store.inc
    parts = [adj.relations(i) for i in ids]
    return parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))


def _relation_names(store: KGStore, rel_ids: np.ndarray) -> list[str]:
    return sorted((store.relation_names[r] for r in rel_ids.tolist()), key=lambda s: (s.casefold(), s))


def _other(direction: str) -> str:
    return "in" if direction == "out" else "out"


def _ambiguity(store: KGStore, ids: tuple[int, ...], name: str) -> str:
    return f"\n(Note: {len(ids)} entities are named {_q(name)}; their results are merged.)" if len(ids) > 1 else ""


def _relations(store: KGStore, entity: str, direction: str, limits: OpLimits, op: str) -> OpResult:
    ids, failure = _resolve(store, entity, op, limits)
    if failure:
        return failure
    name = _display(store, ids, entity)
    names = _relation_names(store, _relation_ids(store, ids, direction))
    if not names:
        word = "outgoing" if direction == "out" else "incoming"
        other = f"get_relations_{_other(direction)}"
        return _fail(Status.NO_RESULTS, f"{_q(name)} has no {word} relations. Try {_call(other, name)}.", op, name)
    return _success(op, (name,), names, "relation", limits, _ambiguity(store, ids, name))


def _entities(store: KGStore, entity: str, relation: str, direction: str, limits: OpLimits, op: str) -> OpResult:
    ids, failure = _resolve(store, entity, op, limits)
    if failure:
        return failure
    name = _display(store, ids, entity)
    word = "outgoing" if direction == "out" else "incoming"
    available = _relation_names(store, _relation_ids(store, ids, direction))
    rid = store.relation_id(relation)
    if not available:
        other = f"get_relations_{_other(direction)}"
        return _fail(Status.NO_RESULTS, f"{_q(name)} has no {word} relations, so nothing matches {_q(relation)}. "
                     f"Try {_call(other, name)}.", op, name, relation)
    rel_name = store.relation_names[rid] if rid is not None else relation
    adj = store.out if direction == "out" else store.inc
    found = [adj.neighbours(i, rid) for i in ids] if rid is not None else []
    neighbour_ids = np.unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)
    if neighbour_ids.size == 0:
        listing = f"{word.capitalize()} relations of {_q(name)}: {_listing(available, limits.max_listed_relations)}."
        if rid is None:
            text = f"{_q(relation)} is not a relation in the knowledge graph. {listing}"
        else:
            text = f"{_q(rel_name)} is not an {word} relation of {_q(name)}. {listing}"
            if rel_name in _relation_names(store, _relation_ids(store, ids, _other(direction))):
                other = f"get_entities_{_other(direction)}"
                other_word = "incoming" if direction == "out" else "outgoing"
                text += f" It is an {other_word} relation: try {_call(other, name, rel_name)}."
        return _fail(Status.RELATION_NOT_FOUND, text, op, name, relation)
    results = sorted(dict.fromkeys(store.entity_names[i] for i in neighbour_ids.tolist()),
                     key=lambda s: (s.casefold(), s))
    return _success(op, (name, rel_name), results, "entity", limits, _ambiguity(store, ids, name))


def _success(op: str, args: tuple[str, ...], items: list[str], noun: str, limits: OpLimits, note: str = "") -> OpResult:
    total = len(items)
    shown = items[: limits.max_results]
    plural = noun if total == 1 else ("entities" if noun == "entity" else noun + "s")
    head = f"{_call(op, *args)} found {total} {plural}"
    if total > len(shown):
        head += f", showing the first {len(shown)}"
    message = f"{head}:\n{', '.join(shown)}{note}"
    return OpResult(Status.SUCCESS, message, tuple(shown), total, op, args[0], args[1] if len(args) > 1 else None)
