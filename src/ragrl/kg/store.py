"""Knowledge-graph store: triples as integer arrays with CSR adjacency in both directions.

Entities and relations are dictionary-encoded to dense integer ids (pyarrow does the encoding,
numpy the sorting), so a build is a handful of vectorised passes however many triples there are.
Each direction is a CSR structure whose edges are sorted by (entity, relation, neighbour):
an entity's edges are one contiguous slice, and the edges of one relation inside that slice are
found by binary search. That is all the four KG-R1 operations need.

Every entity has a `key` (its identity: a KB id such as "m.0abc" or "Q42" where one is known,
otherwise its name) and a display `name`. Lookups accept either, exact first, then
case-insensitively, then through aliases (when an entities table supplied some). Lookup indexes
are built on first use, so a store that only serves per-question subgraphs never pays for the
whole-KG ones.

Two ways to serve a KG (`KGSource`): the whole graph, or one subgraph per question, as KG-R1
does with the RoG subgraphs of WebQSP/CWQ. Subgraphs come from the question file's own tuples
(the public "simple" format) or, for our parquet KGs, from the k-hop neighbourhood of the
question's topic entities; they are built on demand and kept in a small LRU cache.
"""

from __future__ import annotations

import bisect
import copy
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ragrl.errors import DataFormatError, InputError

TRIPLE_COLUMNS = ("head", "relation", "tail")
_LOOKUP_INDEXES = ("_exact", "_folded", "_alias", "_alias_folded", "_prefix", "_relation_index")
SIMPLE_ENTITIES, SIMPLE_RELATIONS, SIMPLE_ENTITY_TEXT = "entities.txt", "relations.txt", "entities_text.txt"


def fold(text: str) -> str:
    """Case-insensitive, whitespace-collapsed form of a string (for comparing queries, not for KG lookups)."""
    return " ".join(text.casefold().split())


# --------------------------------------------------------------------------- adjacency


@dataclass(frozen=True, eq=False)
class Adjacency:
    """One direction of the graph as CSR: edges of entity e are positions indptr[e]:indptr[e+1],
    sorted by (relation, neighbour) inside that slice."""

    indptr: np.ndarray  # int64 [n_entities + 1]
    rel: np.ndarray  # int32 [n_edges]
    nbr: np.ndarray  # int32 [n_edges]

    @classmethod
    def build(cls, src: np.ndarray, rel: np.ndarray, dst: np.ndarray, n_entities: int, n_relations: int,
              presorted: bool = False) -> Adjacency:
        order = None if presorted else _triple_order(src, rel, dst, n_entities, n_relations)
        indptr = np.zeros(n_entities + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n_entities), out=indptr[1:])
        return cls(indptr, rel if order is None else rel[order], dst if order is None else dst[order])

    def degree(self, entity: int) -> int:
        return int(self.indptr[entity + 1] - self.indptr[entity])

    def relations(self, entity: int) -> np.ndarray:
        """Distinct relation ids on this entity's edges, ascending."""
        r = self.rel[self.indptr[entity] : self.indptr[entity + 1]]
        if r.size < 2:
            return r.copy()
        keep = np.empty(r.size, dtype=bool)
        keep[0] = True
        np.not_equal(r[1:], r[:-1], out=keep[1:])
        return r[keep]

    def neighbours(self, entity: int, relation: int) -> np.ndarray:
        """Neighbour ids of `entity` through `relation` (two binary searches in the entity's slice)."""
        lo, hi = int(self.indptr[entity]), int(self.indptr[entity + 1])
        rels = self.rel[lo:hi]
        a = int(np.searchsorted(rels, relation, side="left"))
        b = int(np.searchsorted(rels, relation, side="right"))
        return self.nbr[lo + a : lo + b]

    def gather(self, entities: np.ndarray) -> np.ndarray:
        """Neighbour ids of all `entities` through any relation (vectorised, no per-entity loop)."""
        entities = np.asarray(entities, dtype=np.int64)
        starts = self.indptr[entities]
        lengths = self.indptr[entities + 1] - starts
        total = int(lengths.sum())
        if total == 0:
            return np.empty(0, dtype=self.nbr.dtype)
        exclusive = np.cumsum(lengths) - lengths
        positions = np.repeat(starts - exclusive, lengths) + np.arange(total)
        return self.nbr[positions]


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class Resolution:
    """Entity ids a name resolved to, and how (exact / casefold / alias / alias_casefold)."""

    ids: tuple[int, ...]
    how: str


class KGStore:
    """An immutable KG. Build with `from_triples`, `from_ids`, `load_triples_parquet`, or a loader."""

    def __init__(
        self,
        heads: np.ndarray,
        relations: np.ndarray,
        tails: np.ndarray,
        entity_keys: Sequence[str],
        relation_names: Sequence[str],
        entity_names: Sequence[str] | None = None,
        entity_aliases: Sequence[Sequence[str]] | None = None,
        *,
        source: str = "",
    ) -> None:
        n, r = len(entity_keys), len(relation_names)
        h, rel, t = (np.asarray(a) for a in (heads, relations, tails))
        if not (h.shape == rel.shape == t.shape) or h.ndim != 1:
            raise ValueError("heads/relations/tails must be 1-D arrays of one length, "
                             f"got {h.shape}, {rel.shape}, {t.shape}")
        if entity_names is not None and len(entity_names) != n:
            raise ValueError(f"{len(entity_names)} entity names for {n} entity keys")
        if entity_aliases is not None and len(entity_aliases) != n:
            raise ValueError(f"{len(entity_aliases)} alias lists for {n} entities")
        if h.size:
            if min(h.min(), t.min()) < 0 or max(h.max(), t.max()) >= n:
                raise ValueError(f"entity id out of range [0, {n})")
            if rel.min() < 0 or rel.max() >= r:
                raise ValueError(f"relation id out of range [0, {r})")
        h, rel, t = _dedupe(h.astype(np.int32), rel.astype(np.int32), t.astype(np.int32), n, r)
        for arr in (h, rel, t):
            arr.flags.writeable = False  # views of these arrays are shared by copies and adjacency
        self.heads, self.rels, self.tails = h, rel, t
        self.entity_keys: list[str] = list(entity_keys)
        self.entity_names: list[str] = list(entity_names) if entity_names is not None else self.entity_keys
        self.entity_aliases: list[tuple[str, ...]] | None = (
            [tuple(a) for a in entity_aliases] if entity_aliases is not None else None
        )
        self.relation_names: list[str] = list(relation_names)
        self.source = source
        self.out = Adjacency.build(h, rel, t, n, r, presorted=True)  # _dedupe sorted by (h, r, t)
        self.inc = Adjacency.build(t, rel, h, n, r)

    # ------------------------------------------------------------------- builders

    @classmethod
    def from_triples(cls, heads, relations, tails, *, source: str = "") -> KGStore:
        """Build from three string sequences (lists or Arrow arrays); entity keys are the strings."""
        h, r, t = (_string_array(x) for x in (heads, relations, tails))
        if not len(h) == len(r) == len(t):
            raise ValueError(f"heads/relations/tails have lengths {len(h)}, {len(r)}, {len(t)}")
        entities = pc.dictionary_encode(pa.concat_arrays([h, t]))
        ids = entities.indices.to_numpy(zero_copy_only=False)
        rel_names, rel_ids = _sorted_dictionary(r)
        return cls(ids[: len(h)], rel_ids, ids[len(h) :], entities.dictionary.to_pylist(), rel_names, source=source)

    @classmethod
    def from_ids(cls, heads, relations, tails, entity_keys: Sequence[str], relation_names: Sequence[str],
                 entity_names: Sequence[str] | None = None, *, keep: Iterable[int] = (), source: str = "") -> KGStore:
        """Build from ids into a larger vocabulary, keeping only the entities that occur (plus `keep`).

        This is how a per-question subgraph is made: its tuples index the dataset's vocabulary.
        """
        h, r, t = (np.asarray(a, dtype=np.int64) for a in (heads, relations, tails))
        used = np.unique(np.concatenate([h, t, np.asarray(list(keep), dtype=np.int64)]))
        names = entity_keys if entity_names is None else entity_names
        return cls(np.searchsorted(used, h), r, np.searchsorted(used, t),
                   [entity_keys[i] for i in used], relation_names, [names[i] for i in used], source=source)

    def subgraph(self, entity_ids: Iterable[int]) -> KGStore:
        """The induced subgraph on `entity_ids` (triples with both ends inside), renumbered.

        Entities without any triple inside stay in it, so a topic entity with no edges answers
        "no results" rather than "not found". Relation ids are shared with this store.
        """
        ids = np.unique(np.fromiter(entity_ids, dtype=np.int64))
        member = np.zeros(self.num_entities, dtype=bool)
        member[ids] = True
        mask = member[self.heads] & member[self.tails]
        aliases = None if self.entity_aliases is None else [self.entity_aliases[i] for i in ids]
        return KGStore(np.searchsorted(ids, self.heads[mask]), self.rels[mask], np.searchsorted(ids, self.tails[mask]),
                       [self.entity_keys[i] for i in ids], self.relation_names,
                       [self.entity_names[i] for i in ids], aliases, source=self.source)

    def neighbourhood(self, seeds: Iterable[int], hops: int) -> np.ndarray:
        """Entity ids within `hops` edges of `seeds`, following edges in both directions."""
        seen = np.zeros(self.num_entities, dtype=bool)
        frontier = np.unique(np.asarray(list(seeds), dtype=np.int64))
        seen[frontier] = True
        for _ in range(hops):
            if frontier.size == 0:
                break
            nb = np.unique(np.concatenate([self.out.gather(frontier), self.inc.gather(frontier)]))
            frontier = nb[~seen[nb]]
            seen[frontier] = True
        return np.flatnonzero(seen)

    def with_entity_table(self, names: Sequence[str], aliases: Sequence[Sequence[str]] | None = None,
                          kb_ids: Sequence[str | None] | None = None) -> KGStore:
        """A copy whose entities gain aliases and KB ids from an entities table matched by name.

        Entities of the table that are not in the KG are ignored (they have no edges to query);
        KG nodes not in the table (literals such as "1957") keep their name as key.
        """
        index = {k: i for i, k in enumerate(self.entity_names)}
        keys = list(self.entity_keys)
        alias_lists: list[tuple[str, ...]] = list(self.entity_aliases or [()] * self.num_entities)
        for row, name in enumerate(names):
            i = index.get(name)
            if i is None:
                continue
            if aliases is not None and aliases[row]:
                alias_lists[i] = tuple(dict.fromkeys([*alias_lists[i], *aliases[row]]))
            if kb_ids is not None and kb_ids[row]:
                keys[i] = kb_ids[row]
        out = copy.copy(self)  # shares the (immutable) arrays; only the vocabularies change
        out.entity_keys, out.entity_names, out.entity_aliases = keys, list(self.entity_names), alias_lists
        for cached in _LOOKUP_INDEXES:
            out.__dict__.pop(cached, None)
        return out

    # ------------------------------------------------------------------- sizes

    @property
    def num_entities(self) -> int:
        return len(self.entity_keys)

    @property
    def num_relations(self) -> int:
        return len(self.relation_names)

    @property
    def num_triples(self) -> int:
        return int(self.heads.size)

    def info(self) -> dict[str, Any]:
        return {"entities": self.num_entities, "relations": self.num_relations, "triples": self.num_triples,
                "source": self.source}

    def __repr__(self) -> str:
        return (f"KGStore({self.num_entities} entities, {self.num_relations} relations, "
                f"{self.num_triples} triples{', ' + self.source if self.source else ''})")

    # ------------------------------------------------------------------- lookups

    @cached_property
    def _exact(self) -> _NameIndex:
        return _NameIndex.of_entities(self.entity_keys, self.entity_names, case_fold=False)

    @cached_property
    def _folded(self) -> _NameIndex:
        return _NameIndex.of_entities(self.entity_keys, self.entity_names, case_fold=True)

    @cached_property
    def _alias(self) -> _NameIndex:
        return _NameIndex.of_aliases(self.entity_aliases, case_fold=False)

    @cached_property
    def _alias_folded(self) -> _NameIndex:
        return _NameIndex.of_aliases(self.entity_aliases, case_fold=True)

    @cached_property
    def _prefix(self) -> tuple[list[str], np.ndarray]:
        folded = normalise_names(pa.array(self.entity_names, type=pa.string()), case_fold=True)
        order = pc.sort_indices(folded).to_numpy()
        return folded.take(order).to_pylist(), order

    @cached_property
    def _relation_index(self) -> tuple[_NameIndex, _NameIndex]:
        names = pa.array(self.relation_names, type=pa.string())
        ids = np.arange(len(self.relation_names))
        return _NameIndex(names, ids, case_fold=False), _NameIndex(names, ids, case_fold=True)

    def warm(self) -> KGStore:
        """Build the lookup indexes now (a server does this before it accepts requests)."""
        for name in _LOOKUP_INDEXES:
            getattr(self, name)
        return self

    def resolve(self, name: str) -> Resolution:
        """Entity ids for `name`: exact key or name, then case-insensitive, then aliases (exact,
        then case-insensitive). Several ids when several entities share the winning name."""
        exact, folded = normalise_name(name, False), normalise_name(name, True)
        for how, index, key in (("exact", self._exact, exact), ("casefold", self._folded, folded),
                                ("alias", self._alias, exact), ("alias_casefold", self._alias_folded, folded)):
            ids = index.get(key)
            if ids:
                return Resolution(ids, how)
        return Resolution((), "none")

    def lookup(self, name: str) -> int | None:
        """The single best entity id for `name` (the first of `resolve`), or None."""
        ids = self.resolve(name).ids
        return ids[0] if ids else None

    def relation_id(self, name: str) -> int | None:
        """Relation id by exact name, else case-insensitively; None if unknown."""
        exact, folded = self._relation_index
        ids = exact.get(normalise_name(name, False)) or folded.get(normalise_name(name, True))
        return ids[0] if ids else None

    def suggest(self, name: str, limit: int = 5, min_prefix: int = 3) -> list[str]:
        """Entity names sharing the longest possible case-insensitive prefix with `name`, of at
        least `min_prefix` characters: a query of one or two letters gets none, or the policy could
        list the (question's subgraph's) names letter by letter."""
        keys, ids = self._prefix
        query = normalise_name(name[:200], True)
        for length in range(len(query), max(min_prefix, 1) - 1, -1):
            prefix = query[:length]
            if not prefix:
                break
            found: list[str] = []
            for k in range(bisect.bisect_left(keys, prefix), len(keys)):
                if not keys[k].startswith(prefix) or len(found) >= limit:
                    break
                candidate = self.entity_names[ids[k]]
                if candidate not in found:
                    found.append(candidate)
            if found:
                return found
        return []

    # ------------------------------------------------------------------- neighbourhoods

    def relations_out(self, entity: int) -> np.ndarray:
        return self.out.relations(entity)

    def relations_in(self, entity: int) -> np.ndarray:
        return self.inc.relations(entity)

    def entities_out(self, entity: int, relation: int) -> np.ndarray:
        return self.out.neighbours(entity, relation)

    def entities_in(self, entity: int, relation: int) -> np.ndarray:
        return self.inc.neighbours(entity, relation)

    def triples(self) -> pa.Table:
        """All triples as names (head, relation, tail), e.g. for export or inspection."""
        keys, rels = np.asarray(self.entity_names, dtype=object), np.asarray(self.relation_names, dtype=object)
        return pa.table({"head": keys[self.heads], "relation": rels[self.rels], "tail": keys[self.tails]})


def _triple_order(a: np.ndarray, b: np.ndarray, c: np.ndarray, n_a: int, n_b: int) -> np.ndarray:
    """Permutation sorting triples by (a, b, c); one int64 key when it fits (about 3x faster than lexsort)."""
    if a.size and n_a * n_b * n_a < 2**62:
        key = (a.astype(np.int64) * n_b + b) * n_a + c
        return np.argsort(key, kind="stable")
    return np.lexsort((c, b, a))


def _dedupe(h: np.ndarray, r: np.ndarray, t: np.ndarray, n: int, n_rel: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort triples by (head, relation, tail) and drop repeats (KG dumps often contain them)."""
    if h.size < 2:
        return h, r, t
    order = _triple_order(h, r, t, n, n_rel)
    h, r, t = h[order], r[order], t[order]
    keep = np.empty(h.size, dtype=bool)
    keep[0] = True
    keep[1:] = (h[1:] != h[:-1]) | (r[1:] != r[:-1]) | (t[1:] != t[:-1])
    if keep.all():
        return h, r, t
    return h[keep], r[keep], t[keep]


# Lookup normalisation runs in Arrow for whole vocabularies and for single queries alike, so both
# sides of a lookup are normalised by the same code (Python's casefold and Arrow's utf8_lower
# differ on a few characters).
_SPACES = r"[\s\p{Z}]+"


def normalise_names(names: pa.Array, case_fold: bool) -> pa.Array:
    """Collapse whitespace runs to one space and trim; lowercase too with `case_fold`."""
    out = pc.utf8_trim_whitespace(pc.replace_substring_regex(names, pattern=_SPACES, replacement=" "))
    return pc.utf8_lower(out) if case_fold else out


def normalise_name(name: str, case_fold: bool) -> str:
    # Fast path, same result: printable ASCII has no whitespace but " ", so without a double,
    # leading or trailing space `normalise_names` changes nothing but ASCII case. (One Arrow call
    # per query string costs ~70 µs; this path, taken by most lookups, well under 1 µs.)
    if name.isascii() and name.isprintable() and "  " not in name and name[:1] != " " and name[-1:] != " ":
        return name.lower() if case_fold else name
    return normalise_names(pa.array([name], type=pa.string()), case_fold)[0].as_py()


class _NameIndex:
    """Normalised string -> entity ids. Unique strings (the usual case) live in a plain dict of
    ints; only strings shared by several entities get a tuple, found without a Python pass over
    the whole vocabulary."""

    def __init__(self, strings: pa.Array, ids: np.ndarray, case_fold: bool) -> None:
        norm = normalise_names(strings, case_fold)
        keys, id_list = norm.to_pylist(), ids.tolist()
        self.first: dict[str, int] = dict(zip(reversed(keys), reversed(id_list)))  # first occurrence wins
        self.multi: dict[str, tuple[int, ...]] = {}
        if len(self.first) < len(keys):
            counts = pc.value_counts(norm)
            shared = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
            groups: dict[str, list[int]] = {}
            for i in np.flatnonzero(pc.is_in(norm, value_set=shared).to_numpy(zero_copy_only=False)):
                group = groups.setdefault(keys[i], [])
                if id_list[i] not in group:
                    group.append(id_list[i])
            self.multi = {k: tuple(v) for k, v in groups.items() if len(v) > 1}

    @classmethod
    def of_entities(cls, keys: list[str], names: list[str], case_fold: bool) -> _NameIndex:
        n = len(keys)
        key_arr = pa.array(keys, type=pa.string())
        if names is keys:
            return cls(key_arr, np.arange(n), case_fold)
        name_arr = pa.array(names, type=pa.string())
        differs = pc.not_equal(key_arr, name_arr)  # entities without a separate name add nothing
        return cls(pa.concat_arrays([key_arr, name_arr.filter(differs)]),
                   np.concatenate([np.arange(n), np.flatnonzero(differs.to_numpy(zero_copy_only=False))]), case_fold)

    @classmethod
    def of_aliases(cls, aliases: list[tuple[str, ...]] | None, case_fold: bool) -> _NameIndex:
        flat = [(a, i) for i, al in enumerate(aliases or ()) for a in al]
        return cls(pa.array([a for a, _ in flat], type=pa.string()), np.array([i for _, i in flat], dtype=np.int64),
                   case_fold)

    def get(self, key: str | None) -> tuple[int, ...]:
        if key is None:
            return ()
        if key in self.multi:
            return self.multi[key]
        i = self.first.get(key)
        return () if i is None else (i,)


def _string_array(values) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(list(values), type=pa.string())
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise TypeError(f"expected strings, got {values.type}")
    return values.cast(pa.large_string()) if pa.types.is_large_string(values.type) else values


def _sorted_dictionary(values: pa.Array) -> tuple[list[str], np.ndarray]:
    """Dictionary-encode and renumber so ids follow the names' sort order (stable listings)."""
    enc = pc.dictionary_encode(values)
    names = enc.dictionary.to_pylist()
    order = sorted(range(len(names)), key=names.__getitem__)
    rank = np.empty(len(names), dtype=np.int64)
    rank[order] = np.arange(len(names))
    return [names[i] for i in order], rank[enc.indices.to_numpy(zero_copy_only=False)]


# --------------------------------------------------------------------------- parquet triples


def load_triples_parquet(path: str | os.PathLike, entities: str | os.PathLike | pa.Table | None = None,
                         kb_id_column: str | None = None) -> KGStore:
    """Our triples parquet (`head, relation, tail[, source_id]`, entity names as strings).

    With an `entities` table (`name`, optional `aliases: list<str>`, optional `kb_id_column`),
    entities gain aliases and KB ids as lookup keys.
    """
    path = Path(path)
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise DataFormatError(path, f"cannot read parquet: {exc}") from exc
    missing = [c for c in TRIPLE_COLUMNS if c not in schema.names]
    if missing:
        raise DataFormatError(path, f"missing column(s) {missing}; expected {list(TRIPLE_COLUMNS)}")
    for col in TRIPLE_COLUMNS:
        typ = schema.field(col).type
        if pa.types.is_dictionary(typ):
            typ = typ.value_type
        if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
            raise DataFormatError(path, f"must be strings, got {typ}", field=col)
    table = pq.read_table(path, columns=list(TRIPLE_COLUMNS))
    arrays = {}
    for col in TRIPLE_COLUMNS:
        arr = _string_array(table.column(col))
        blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(arr)), 0)
        bad = pc.fill_null(pc.or_kleene(pc.is_null(arr), blank), True)
        if pc.any(bad).as_py():
            row = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
            raise DataFormatError(path, "null or empty value", record=row, field=col)
        arrays[col] = arr
    store = KGStore.from_triples(arrays["head"], arrays["relation"], arrays["tail"], source=str(path))
    if entities is not None:
        store = _attach_entities(store, entities, kb_id_column)
    return store


def _attach_entities(store: KGStore, entities, kb_id_column: str | None) -> KGStore:
    where = "<table>" if isinstance(entities, pa.Table) else str(entities)
    try:
        table = entities if isinstance(entities, pa.Table) else pq.read_table(entities)
    except (OSError, pa.ArrowException) as exc:
        raise DataFormatError(where, f"cannot read parquet: {exc}") from exc
    if "name" not in table.column_names:
        raise DataFormatError(where, "missing column 'name'")
    if kb_id_column is not None and kb_id_column not in table.column_names:
        raise DataFormatError(where, f"missing column '{kb_id_column}'")
    names = table.column("name").to_pylist()
    aliases = table.column("aliases").to_pylist() if "aliases" in table.column_names else None
    kb_ids = table.column(kb_id_column).to_pylist() if kb_id_column else None
    return store.with_entity_table(names, [a or [] for a in aliases] if aliases else None, kb_ids)


# --------------------------------------------------------------------------- "simple" KGQA format


@dataclass(frozen=True)
class SimpleQuestion:
    """One question of a "simple"-format KGQA file (WebQSP/CWQ subsets as released by NSM/RoG)."""

    id: str
    question: str
    answers: tuple[dict[str, str], ...]  # {"kb_id", "text"}
    topic_entities: tuple[int, ...]  # ids into the dataset vocabulary
    subgraph_entities: tuple[int, ...]
    file: str
    line: int


class SimpleKGQA:
    """A directory in the "simple" format: `entities.txt` (one KB id a line), `relations.txt`,
    optional `entities_text.txt` (names, aligned with entities.txt), and JSON-lines question files
    whose `subgraph.tuples` index those vocabularies."""

    def __init__(self, root: str | os.PathLike, files: Sequence[str | os.PathLike] | None = None) -> None:
        self.root = Path(root)
        self.entity_keys = _read_vocab(self.root / SIMPLE_ENTITIES)
        self.relation_names = _read_vocab(self.root / SIMPLE_RELATIONS)
        self.entity_names = self._read_names()
        self._key_index = {k: i for i, k in enumerate(self.entity_keys)}
        paths = [Path(f) for f in files] if files is not None else _question_files(self.root)
        self.questions: list[SimpleQuestion] = []
        chunks: list[np.ndarray] = []
        for path in paths:
            for q, tuples in _read_questions(path, self):
                self.questions.append(q)
                chunks.append(tuples)
        self._offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
        np.cumsum([len(c) for c in chunks], out=self._offsets[1:])
        self._tuples = np.concatenate(chunks) if chunks else np.empty((0, 3), dtype=np.int32)
        self.by_id: dict[str, int] = {}
        for i, q in enumerate(self.questions):
            if q.id in self.by_id:
                raise DataFormatError(q.file, f"duplicate question id {q.id!r}", line=q.line, field="id")
            self.by_id[q.id] = i

    def _read_names(self) -> list[str]:
        path = self.root / SIMPLE_ENTITY_TEXT
        if not path.exists():
            return list(self.entity_keys)
        lines = _read_lines(path)
        if len(lines) != len(self.entity_keys):
            raise DataFormatError(path, f"{len(lines)} lines for {len(self.entity_keys)} entities in "
                                  f"{SIMPLE_ENTITIES}; the files must be aligned line by line",
                                  line=min(len(lines), len(self.entity_keys)) + 1)
        # An empty line means "no name" (Freebase CVT nodes): the KB id is shown instead.
        return [" ".join(t.split()) or k for t, k in zip(lines, self.entity_keys)]

    def key_id(self, key: str) -> int | None:
        return self._key_index.get(key)

    def question_triples(self, index: int) -> np.ndarray:
        return self._tuples[self._offsets[index] : self._offsets[index + 1]]

    def whole_store(self) -> KGStore:
        """The union of all questions' subgraphs, over the full vocabulary."""
        t = self._tuples
        return KGStore(t[:, 0], t[:, 1], t[:, 2], self.entity_keys, self.relation_names, self.entity_names,
                       source=str(self.root))

    def question_store(self, sample_id: str) -> KGStore | None:
        index = self.by_id.get(sample_id)
        if index is None:
            return None
        q, t = self.questions[index], self.question_triples(index)
        return KGStore.from_ids(t[:, 0], t[:, 1], t[:, 2], self.entity_keys, self.relation_names, self.entity_names,
                                keep=(*q.topic_entities, *q.subgraph_entities), source=f"{self.root}#{sample_id}")


def _read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise DataFormatError(path, f"not UTF-8 ({exc.reason})", line=line) from exc
    except OSError as exc:
        raise DataFormatError(path, f"cannot read: {exc}") from exc
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln.rstrip("\r") for ln in lines]


def _read_vocab(path: Path) -> list[str]:
    if not path.exists():
        raise DataFormatError(path, "missing (the simple KGQA format needs entities.txt and relations.txt)")
    out: list[str] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(_read_lines(path), 1):
        item = raw.strip()
        if not item:
            raise DataFormatError(path, "empty line", line=lineno)
        if item in seen:
            raise DataFormatError(path, f"duplicate entry {item!r} (first on line {seen[item]})", line=lineno)
        seen[item] = lineno
        out.append(item)
    return out


def _question_files(root: Path) -> list[Path]:
    files = sorted(p for p in root.iterdir() if p.suffix in (".json", ".jsonl") and p.is_file())
    if not files:
        raise DataFormatError(root, "no question files (*.json / *.jsonl) next to entities.txt")
    return files


def _read_questions(path: Path, vocab: SimpleKGQA):
    n_ent, n_rel = len(vocab.entity_keys), len(vocab.relation_names)
    for lineno, raw in enumerate(_read_lines(path), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DataFormatError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=lineno) from exc
        if not isinstance(rec, dict):
            raise DataFormatError(path, f"expected a JSON object per line, got {type(rec).__name__}", line=lineno)

        def bad(message: str, field: str) -> DataFormatError:
            return DataFormatError(path, message, line=lineno, field=field)

        question = rec.get("question")
        if not isinstance(question, str):
            raise bad("must be a string", "question")
        qid = rec.get("id", f"{path.stem}-{lineno}")
        if not isinstance(qid, (str, int)) or isinstance(qid, bool):
            raise bad("must be a string", "id")
        answers = rec.get("answers", [])
        if not isinstance(answers, list):
            raise bad("must be a list of {kb_id, text} objects", "answers")
        clean_answers = []
        for j, a in enumerate(answers):
            if not isinstance(a, dict):
                raise bad("must be an object with kb_id and text", f"answers[{j}]")
            kb, text = a.get("kb_id"), a.get("text")
            if kb is not None and not isinstance(kb, str) or text is not None and not isinstance(text, str):
                raise bad("kb_id and text must be strings or null", f"answers[{j}]")
            if not kb and not text:
                raise bad("needs a kb_id or a text", f"answers[{j}]")
            clean_answers.append({"kb_id": kb or "", "text": text if text else (kb or "")})
        topic = _entity_refs(rec.get("entities", []), vocab, n_ent, bad, "entities")
        sub = rec.get("subgraph", {})
        if not isinstance(sub, dict):
            raise bad("must be an object with 'tuples' and 'entities'", "subgraph")
        sub_entities = _entity_refs(sub.get("entities", []), vocab, n_ent, bad, "subgraph.entities")
        tuples = _tuples(sub.get("tuples", []), n_ent, n_rel, bad)
        yield SimpleQuestion(str(qid), question, tuple(clean_answers), topic, sub_entities, str(path), lineno), tuples


def _entity_refs(refs, vocab: SimpleKGQA, n_ent: int, bad, field: str) -> tuple[int, ...]:
    if not isinstance(refs, list):
        raise bad("must be a list of entity indices or ids", field)
    out = []
    for j, ref in enumerate(refs):
        if isinstance(ref, bool) or not isinstance(ref, (int, str)):
            raise bad(f"must be an index into {SIMPLE_ENTITIES} or an entity id", f"{field}[{j}]")
        if isinstance(ref, str):
            i = vocab.key_id(ref)
            if i is None:
                raise bad(f"unknown entity id {ref!r} (not in {SIMPLE_ENTITIES})", f"{field}[{j}]")
        else:
            i = ref
            if not 0 <= i < n_ent:
                raise bad(f"entity index {i} out of range [0, {n_ent})", f"{field}[{j}]")
        out.append(i)
    return tuple(out)


def _tuples(raw, n_ent: int, n_rel: int, bad) -> np.ndarray:
    if not isinstance(raw, list):
        raise bad("must be a list of [head, relation, tail] index triples", "subgraph.tuples")
    if not raw:
        return np.empty((0, 3), dtype=np.int32)
    try:
        arr = np.asarray(raw)
    except ValueError:
        arr = None
    ok = arr is not None and arr.ndim == 2 and arr.shape[1] == 3 and arr.dtype.kind in "iu"
    if ok:
        limits = np.array([n_ent, n_rel, n_ent])
        out_of_range = (arr < 0) | (arr >= limits)
        if not out_of_range.any():
            return arr.astype(np.int32)
    # Slow path, only to name the first bad tuple.
    for j, tup in enumerate(raw):
        ints = isinstance(tup, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in tup)
        if not ints or len(tup) != 3:
            raise bad(f"must be [head, relation, tail] integer indices, got {json.dumps(tup)[:80]}",
                      f"subgraph.tuples[{j}]")
        h, r, t = tup
        if not (0 <= h < n_ent and 0 <= t < n_ent):
            raise bad(f"entity index out of range [0, {n_ent}) in {tup}", f"subgraph.tuples[{j}]")
        if not 0 <= r < n_rel:
            raise bad(f"relation index {r} out of range [0, {n_rel})", f"subgraph.tuples[{j}]")
    raise bad("malformed tuples", "subgraph.tuples")  # unreachable in practice


# --------------------------------------------------------------------------- sources: whole KG or per question


class KGSource:
    """One named KG as the server sees it: the whole store, or per-question subgraph stores.

    `subgraph_of(sample_id)` returns a store, or None for an unknown sample. Built subgraphs are
    kept in an LRU cache (the server answers from several threads, hence the lock).
    """

    def __init__(self, name: str, store: KGStore | None, subgraph_of: Callable[[str], KGStore | None] | None = None,
                 *, num_samples: int | None = None, cache_size: int = 512) -> None:
        if store is None and subgraph_of is None:
            raise ValueError("a KGSource needs a store or a subgraph builder")
        self.name = name
        self.store = store
        self._subgraph_of = subgraph_of
        self.num_samples = num_samples
        self._cache: OrderedDict[str, KGStore | None] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    @property
    def mode(self) -> str:
        return "subgraph" if self._subgraph_of is not None else "whole"

    def store_for(self, sample_id: str | None) -> KGStore | None:
        """The store a request queries: the whole KG, or the sample's subgraph (None if unknown)."""
        if self._subgraph_of is None:
            return self.store
        if sample_id is None:
            return None
        with self._lock:
            if sample_id in self._cache:
                self._cache.move_to_end(sample_id)
                return self._cache[sample_id]
        built = self._subgraph_of(sample_id)
        with self._lock:
            self._cache[sample_id] = built
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return built

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode}
        if self.store is not None:
            out.update(self.store.info())
        if self.num_samples is not None:
            out["samples"] = self.num_samples
        return out


def neighbourhood_subgraphs(store: KGStore, seeds: Mapping[str, Sequence[int]], hops: int = 2
                            ) -> Callable[[str], KGStore | None]:
    """Per-sample subgraph builder: the `hops`-hop neighbourhood of each sample's seed entities."""
    def build(sample_id: str) -> KGStore | None:
        ids = seeds.get(sample_id)
        if ids is None:
            return None
        return store.subgraph(store.neighbourhood(ids, hops))
    return build


def question_seeds(store: KGStore, paths: Iterable[str | os.PathLike]) -> dict[str, list[int]]:
    """Seed entities per question id from our KGQA parquet files (`id`, `topic_entities`, `subgraph_id`)."""
    seeds: dict[str, list[int]] = {}
    for path in paths:
        try:
            rows = pq.read_table(path, columns=["id", "topic_entities", "subgraph_id"]).to_pylist()
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise DataFormatError(path, f"cannot read KGQA parquet (id, topic_entities, subgraph_id): {exc}") from exc
        for i, row in enumerate(rows):
            names = [*(row["topic_entities"] or []), *([row["subgraph_id"]] if row["subgraph_id"] else [])]
            ids = sorted({e for n in names for e in store.resolve(n).ids})
            if not ids:
                raise DataFormatError(path, f"no topic entity of {names} is in the KG", record=i,
                                      field="topic_entities")
            seeds[str(row["id"])] = ids
    return seeds


def load_kg(path: str | os.PathLike, mode: str = "whole", *, name: str | None = None,
            entities: str | os.PathLike | None = None, kb_id_column: str | None = None,
            questions: Sequence[str | os.PathLike] | None = None, hops: int = 2, cache_size: int = 512) -> KGSource:
    """Load a KG directory as a `KGSource`.

    `path`: a directory with `triples.parquet` (or the parquet file itself), or a directory in the
    simple KGQA format (`entities.txt`, `relations.txt`, question files). `mode`: "whole" or
    "subgraph". Subgraph mode over parquet needs KGQA question files (`questions`); inside a
    `ragrl world` output (`<world>/kg/A`) the entities table and `<world>/kgqa/A/*.parquet` are
    found by themselves.
    """
    if mode not in ("whole", "subgraph"):
        raise InputError(f"mode must be 'whole' or 'subgraph', got {mode!r}")
    path = Path(path)
    if (path / SIMPLE_ENTITIES).exists() and (path / SIMPLE_RELATIONS).exists():
        data = SimpleKGQA(path, questions)
        if mode == "whole":
            return KGSource(name or path.name, data.whole_store().warm(), num_samples=len(data.questions))
        return KGSource(name or path.name, None, data.question_store, num_samples=len(data.questions),
                        cache_size=cache_size)
    triples = path if path.suffix == ".parquet" else path / "triples.parquet"
    if not triples.exists():
        raise DataFormatError(path, "no KG here: expected triples.parquet, or entities.txt + relations.txt")
    kg_name = name or (triples.parent.name if path.suffix == ".parquet" else path.name)
    toy_entities, toy_kb_column, toy_questions = _world_layout(triples.parent)
    if entities is None and toy_entities is not None:
        entities, kb_id_column = toy_entities, kb_id_column or toy_kb_column
    store = load_triples_parquet(triples, entities, kb_id_column).warm()
    # Arrow's allocator keeps the freed parquet buffers cached (~270 MB of RSS at 1M triples,
    # docs/BENCHMARKS.md); a long-lived server should not hold them.
    pa.default_memory_pool().release_unused()
    if mode == "whole":
        return KGSource(kg_name, store)
    qfiles = list(questions) if questions is not None else toy_questions
    if not qfiles:
        raise DataFormatError(path, "subgraph mode needs KGQA question files (pass questions=[...])")
    seeds = question_seeds(store, qfiles)
    return KGSource(kg_name, store, neighbourhood_subgraphs(store, seeds, hops), num_samples=len(seeds),
                    cache_size=cache_size)


def _world_layout(kg_dir: Path) -> tuple[Path | None, str | None, list[Path]]:
    """Companions of `<world>/kg/<K>/triples.parquet` written by `ragrl world`, if this is one."""
    if kg_dir.parent.name != "kg":
        return None, None, []
    root, kg = kg_dir.parent.parent, kg_dir.name
    entities = root / "entities.parquet"
    if not entities.exists():
        return None, None, []
    column = f"kb_id_{kg.lower()}"
    if column not in pq.read_schema(entities).names:
        column = None
    return entities, column, sorted((root / "kgqa" / kg).glob("*.parquet"))
