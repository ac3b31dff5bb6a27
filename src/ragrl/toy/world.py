"""The synthetic world of the embedded default: entities, facts, passages, questions, KGs, a KB.

`generate_world(seed, size)` is pure (a seeded `random.Random` is the only source of variation);
`write_world(world, out)` is the side effect. Same seed and size → byte-identical files.

Splits are made by entity, not by question: every fact a dev/test question needs has a head
entity of that split, so no train question (nor its supporting passages' facts used in train)
can teach a test answer; a model must retrieve it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from ragrl.errors import InputError
from ragrl.io import write_json, write_parquet
from ragrl.paths import SPLITS
from ragrl.toy.names import NameFactory
from ragrl.toy.relations import ANAPHORS, COMPARISONS, ENTITY_TYPES, RELATION_BY_KEY, RELATIONS

SPLIT_WEIGHTS = (0.7, 0.1, 0.2)
QUESTION_MIX = (("1hop", 0.4), ("bridge", 0.4), ("comparison", 0.2))
WORLD_VERSION = 1

# KG-R1's training split may hold up to this many times the text split's questions (the tiny world
# has 901 entity-answer training questions): its SFT on 901 distinct questions for 3 epochs reached
# EM 0.30 on KG A, on 400 for 6 epochs 0.24, at about the same cost (docs/READING.md).
KGQA_TRAIN_FACTOR = 3

# Named sizes: number of people; every other entity type scales with it.
SIZE_PRESETS = {"tiny": 100, "small": 1000, "medium": 10000, "bench": 40000}

_FILLERS = {
    "person": ("{h} is known for a lifelong interest in {x}.", "Friends describe {h} as devoted to {x}."),
    "city": ("{h} is famous for its {x}.", "Visitors come to {h} for its {x}."),
    "country": ("{h} is known abroad for its {x}.",),
    "company": ("{h} is best known for its {x}.",),
    "university": ("{h} is renowned for its {x}.",),
    "film": ("Critics praised {h} for its {x}.",),
    "book": ("Readers remember {h} for its {x}.",),
}
_FILLER_WORDS = {
    "person": ("chess", "sailing", "astronomy", "pottery", "beekeeping", "rowing", "calligraphy", "botany"),
    "city": ("old bridges", "night markets", "harbour", "clock tower", "river festival", "stone walls"),
    "country": ("mountain railways", "textiles", "folk music", "coastline", "tea"),
    "company": ("quiet engines", "modular kits", "durable fabrics", "field sensors", "spare parts service"),
    "university": ("library", "botanical garden", "rowing club", "observatory"),
    "film": ("long takes", "score", "ensemble cast", "photography"),
    "book": ("dry humour", "maps", "letters", "slow pacing"),
}


@dataclass
class Entity:
    id: str
    type: str
    name: str
    aliases: list[str] = field(default_factory=list)
    split: str = "train"

    @property
    def anaphor(self) -> str:
        # People are referred to by surname, everything else by "The <type>".
        return self.name.split()[-1] if self.type == "person" else ANAPHORS[self.type]


@dataclass(frozen=True)
class Fact:
    head: str  # entity id
    relation: str
    tail: str  # entity id, or a literal for attributes

    @property
    def is_attribute(self) -> bool:
        return RELATION_BY_KEY[self.relation].is_attribute


@dataclass
class World:
    seed: int
    size: int
    entities: dict[str, Entity]
    facts: list[Fact]
    passages: list[dict]  # id, title, text, source
    entity_passage: dict[str, str]  # entity id → its passage id
    fact_passage: dict[Fact, str]
    qa: dict[str, list[dict]]
    kgqa: dict[str, dict[str, list[dict]]]  # kg → split → rows
    kb_documents: list[dict]
    factual: dict[str, list[dict]]


def size_to_people(size: int | str) -> int:
    if isinstance(size, str):
        if size in SIZE_PRESETS:
            return SIZE_PRESETS[size]
        if size.isdigit():
            size = int(size)
        else:
            raise InputError(f"world size '{size}': expected one of {sorted(SIZE_PRESETS)} or a positive integer")
    if size < 20:
        raise InputError(f"world size {size}: at least 20 people are needed for every question type")
    return size


def entity_counts(people: int) -> dict[str, int]:
    return {
        "person": people,
        "city": max(12, people // 4),
        "country": max(6, people // 60),
        "company": max(8, people // 5),
        "university": max(6, people // 10),
        "film": max(8, people // 3),
        "book": max(8, people // 3),
    }


def question_counts(people: int) -> dict[str, int]:
    return {"train": min(20000, 4 * people), "dev": min(1000, max(40, people // 2)), "test": min(2000, people)}


# --------------------------------------------------------------------------- entities and facts


def _make_entities(names: NameFactory, counts: dict[str, int]) -> dict[str, Entity]:
    entities: dict[str, Entity] = {}
    for etype in ENTITY_TYPES:
        make = getattr(names, etype)
        for _ in range(counts[etype]):
            eid = f"E{len(entities):06d}"
            entities[eid] = Entity(eid, etype, make())
    for ent in entities.values():
        for alias in _alias_candidates(ent):
            if names.reserve(alias):
                ent.aliases.append(alias)
    return entities


def _alias_candidates(ent: Entity) -> list[str]:
    words = ent.name.split()
    if ent.type == "person":
        return [f"{words[0]} {words[-1]}"]  # without the middle initial
    if ent.type == "city" and len(words) > 1:
        return [words[-1]]  # "Port Velmar" → "Velmar"
    if ent.type == "film" and words[0] == "The":
        return [" ".join(words[1:])]
    if ent.type == "company":
        return [f"{ent.name} Ltd"]
    return []


def _make_facts(rng: random.Random, entities: dict[str, Entity]) -> list[Fact]:
    by_type: dict[str, list[str]] = {t: [] for t in ENTITY_TYPES}
    for e in entities.values():
        by_type[e.type].append(e.id)
    facts: list[Fact] = []
    country_of: dict[str, str] = {}
    birth: dict[str, int] = {}

    countries = by_type["country"]
    for i, city in enumerate(by_type["city"]):
        # Round-robin first so every country has at least one city (it needs a capital).
        country = countries[i] if i < len(countries) else rng.choice(countries)
        country_of[city] = country
        facts.append(Fact(city, "located_in", country))
        facts.append(Fact(city, "population", f"{rng.randrange(12, 5000) * 1000 + rng.randrange(0, 1000, 10):,}"))
    cities_in: dict[str, list[str]] = {c: [] for c in countries}
    for city, country in country_of.items():
        cities_in[country].append(city)
    for country in countries:
        facts.append(Fact(country, "capital", rng.choice(cities_in[country])))

    for uni in by_type["university"]:
        facts.append(Fact(uni, "university_in", rng.choice(by_type["city"])))
        facts.append(Fact(uni, "founding_year_univ", str(rng.randrange(1650, 1990))))

    for person in by_type["person"]:
        city = rng.choice(by_type["city"])
        birth[person] = rng.randrange(1900, 1986)
        citizen = country_of[city] if rng.random() < 0.8 else rng.choice(countries)
        facts += [
            Fact(person, "born_in", city),
            Fact(person, "citizen_of", citizen),
            Fact(person, "educated_at", rng.choice(by_type["university"])),
            Fact(person, "employer", rng.choice(by_type["company"])),
            Fact(person, "birth_year", str(birth[person])),
        ]

    people = by_type["person"]
    for company in by_type["company"]:
        founder = rng.choice(people)
        facts += [
            Fact(company, "headquartered_in", rng.choice(by_type["city"])),
            Fact(company, "founded_by", founder),
            Fact(company, "founded_year", str(min(2024, birth[founder] + rng.randrange(25, 56)))),
        ]
    for film in by_type["film"]:
        director = rng.choice(people)
        facts += [
            Fact(film, "directed_by", director),
            Fact(film, "film_country", rng.choice(countries)),
            Fact(film, "release_year", str(min(2024, birth[director] + rng.randrange(20, 61)))),
        ]
    for book in by_type["book"]:
        author = rng.choice(people)
        facts += [
            Fact(book, "written_by", author),
            Fact(book, "publication_year", str(min(2024, birth[author] + rng.randrange(20, 71)))),
        ]
    return facts


def surface(entities: dict[str, Entity], fact: Fact) -> str:
    """The tail as it appears in text: an entity's name, or the literal itself."""
    return fact.tail if fact.is_attribute else entities[fact.tail].name


def head_refs(entity: Entity) -> tuple[str, ...]:
    """Every way a passage may refer to its own subject."""
    return (entity.name, entity.anaphor)


def render_fact(template: str, head: str, tail: str) -> str:
    return template.format(h=head, t=tail)


def fact_stated(text: str, entity: Entity, relation: str, tail: str) -> bool:
    """True if `text` contains a sentence stating (entity, relation, tail) in one of its templates."""
    return any(
        render_fact(tpl, ref, tail) in text
        for tpl in RELATION_BY_KEY[relation].sentences
        for ref in head_refs(entity)
    )


# --------------------------------------------------------------------------- passages


def _entity_passage(rng: random.Random, ent: Entity, facts: list[Fact], entities) -> tuple[str, list[Fact]]:
    order = list(facts)
    rng.shuffle(order)
    sentences = []
    for i, fact in enumerate(order):
        tpl = rng.choice(RELATION_BY_KEY[fact.relation].sentences)
        # After the first sentence, a sentence that opens with its subject may use the anaphor.
        ref = ent.anaphor if i > 0 and tpl.startswith("{h}") and rng.random() < 0.4 else ent.name
        sentences.append(render_fact(tpl, ref, surface(entities, fact)))
    if rng.random() < 0.7:
        filler = rng.choice(_FILLERS[ent.type]).format(h=ent.name, x=rng.choice(_FILLER_WORDS[ent.type]))
        sentences.insert(rng.randrange(1, len(sentences) + 1), filler)
    return " ".join(sentences), order


def _distractor_passage(rng: random.Random, title: str, entities: list[Entity]) -> str:
    # Mentions real entities (so lexical and dense retrievers are tempted) but states no KG fact.
    people = [e.name for e in entities if e.type == "person"]
    others = [e.name for e in entities if e.type != "person"]
    parts = [f"{title} drew large crowds in its opening week."]
    if people:
        parts.append(f"Among the speakers were {' and '.join(people)}, who discussed {rng.choice(_FILLER_WORDS['person'])}.")
    if others:
        parts.append(f"Exhibits referred to {', '.join(others)}, though organisers stressed no official ties.")
    parts.append("The programme ended with a concert and a public lecture.")
    return " ".join(parts)


def _make_passages(rng, entities, facts_by_head, names: NameFactory):
    drafts = []  # (title, text, source, entity id or None, facts)
    for eid, ent in entities.items():
        text, order = _entity_passage(rng, ent, facts_by_head[eid], entities)
        drafts.append((ent.name, text, "world", eid, order))
    pool = list(entities.values())
    for _ in range(max(10, len(entities) * 3 // 10)):
        mentioned = rng.sample(pool, k=min(len(pool), rng.randrange(2, 5)))
        title = names.event()
        drafts.append((title, _distractor_passage(rng, title, mentioned), "distractor", None, []))
    rng.shuffle(drafts)
    passages, entity_passage, fact_passage = [], {}, {}
    for i, (title, text, source, eid, order) in enumerate(drafts):
        pid = f"w{i:07d}"
        passages.append({"id": pid, "title": title, "text": text, "source": source})
        if eid is not None:
            entity_passage[eid] = pid
            for fact in order:
                fact_passage[fact] = pid
    return passages, entity_passage, fact_passage


# --------------------------------------------------------------------------- questions


def _assign_splits(rng: random.Random, entities: dict[str, Entity]) -> None:
    for ent in entities.values():
        ent.split = rng.choices(SPLITS, weights=SPLIT_WEIGHTS)[0]


def _answers(entities, fact: Fact) -> list[str]:
    if fact.is_attribute:
        plain = fact.tail.replace(",", "")
        return [fact.tail] + ([plain] if plain != fact.tail else [])
    ent = entities[fact.tail]
    return [ent.name] + ent.aliases


def _hop(entities, fact: Fact) -> list[str]:
    return [entities[fact.head].name, fact.relation, surface(entities, fact)]


def _question_candidates(rng, entities, facts, facts_by_head) -> dict[str, dict[str, list[dict]]]:
    """All questions per split and type, each with the facts it needs."""
    out = {s: {t: [] for t, _ in QUESTION_MIX} for s in SPLITS}
    for fact in facts:
        head = entities[fact.head]
        rel = RELATION_BY_KEY[fact.relation]
        q = rng.choice(rel.questions).format(h=head.name)
        out[head.split]["1hop"].append(_qa(q, _answers(entities, fact), [fact], "1hop", head))
        if fact.is_attribute or not rel.descriptor:
            continue
        mid = entities[fact.tail]
        if mid.split != head.split:
            continue  # a test question must not need a fact whose head lives in train
        for second in facts_by_head[mid.id]:
            if second.tail == head.id:
                continue  # "the capital of the country where X is located" → X: answer in question
            descriptor = rel.descriptor.format(h=head.name)
            q2 = rng.choice(RELATION_BY_KEY[second.relation].questions).format(h=descriptor)
            out[head.split]["bridge"].append(_qa(q2, _answers(entities, second), [fact, second], "bridge", head))
    return out


def _comparisons(rng, entities, facts, split: str, want: int) -> list[dict]:
    values: dict[str, dict[str, Fact]] = {}
    for fact in facts:
        values.setdefault(fact.relation, {})[fact.head] = fact
    rows, seen = [], set()
    specs = [c for c in COMPARISONS if c[0] in values]
    for _ in range(want * 4):
        if len(rows) >= want:
            break
        attr, pick, templates = rng.choice(specs)
        pool = sorted(e for e in values[attr] if entities[e].split == split)
        if len(pool) < 2:
            continue
        a, b = rng.sample(pool, 2)
        va, vb = (float(values[attr][x].tail.replace(",", "")) for x in (a, b))
        if va == vb or (attr, a, b) in seen or (attr, b, a) in seen:
            continue
        seen.add((attr, a, b))
        winner = a if (va < vb) == (pick == "min") else b
        q = rng.choice(templates).format(a=entities[a].name, b=entities[b].name)
        fa, fb = values[attr][a], values[attr][b]
        row = _qa(q, [entities[winner].name] + entities[winner].aliases, [fa, fb], "comparison", entities[a])
        rows.append(row)
    return rows


def _qa(question: str, answers: list[str], facts: list[Fact], qtype: str, topic: Entity) -> dict:
    return {"question": question, "answers": answers, "facts": facts, "type": qtype, "topic": topic.id}


def _sample_split(rng, cands: dict[str, list[dict]], comparisons: list[dict], n: int) -> list[dict]:
    pools = dict(cands)
    pools["comparison"] = comparisons
    chosen, seen = [], set()
    for qtype, share in QUESTION_MIX:
        pool = [c for c in pools[qtype] if c["question"] not in seen]
        k = min(len(pool), round(n * share))
        for c in rng.sample(pool, k):
            if c["question"] not in seen:
                seen.add(c["question"])
                chosen.append(c)
    rng.shuffle(chosen)
    return chosen


def _qa_row(entities, entity_passage, split: str, i: int, c: dict) -> dict:
    supporting = []
    for fact in c["facts"]:
        pid = entity_passage[fact.head]
        if pid not in supporting:
            supporting.append(pid)
    meta = {
        "type": c["type"],
        "topic_entity": entities[c["topic"]].name,
        "hops": [_hop(entities, f) for f in c["facts"]],
    }
    return {
        "id": f"{split}-{i:05d}",
        "question": c["question"],
        "golden_answers": c["answers"],
        "supporting_ids": supporting,
        "metadata": json.dumps(meta, sort_keys=True),
    }


def kb_ids(entity_id: str) -> tuple[str, str]:
    """The entity's id in KG A (Freebase-like mid) and KG B (Wikidata-like QID)."""
    n = int(entity_id[1:])
    return f"m.0{n + 4096:x}", f"Q{n + 100000}"


def _kg_answerable(c: dict) -> bool:
    # KGQA answers are entities with ids: no comparisons, no attribute (date, number) answers.
    return c["type"] != "comparison" and not c["facts"][-1].is_attribute


def _kgqa_pairs(rng, split: str, rows: list[dict], chosen: list[dict], cands: dict[str, list[dict]],
                want: int) -> list[tuple[dict, dict]]:
    """The split's KGQA questions: its text questions with entity answers, topped up to `want`
    with the split's other entity-answer questions. Only about 60% of the text questions qualify,
    which left KG A's test split at 61 questions and its train split at 219; the top-up draws
    from its own random stream so that the world, its text questions and the pretrained policy's
    cache key (the world's names) stay as they were."""
    pairs = [(r, c) for r, c in zip(rows, chosen) if _kg_answerable(c)]
    seen = {c["question"] for c in chosen}
    pool = [c for qtype in ("1hop", "bridge") for c in cands[qtype] if _kg_answerable(c) and c["question"] not in seen]
    extra = rng.sample(pool, min(len(pool), max(0, want - len(pairs))))
    return pairs + [({"id": f"{split}-kg-{i:05d}", "question": c["question"]}, c) for i, c in enumerate(extra)]


def _kgqa_rows(entities, rows_and_cands, kg: str) -> list[dict]:
    out = []
    for row, c in rows_and_cands:
        last = c["facts"][-1]
        ans = entities[last.tail]
        idx = 0 if kg == "A" else 1
        out.append({
            "id": row["id"],
            "question": row["question"],
            "answers": [{"text": ans.name, "kb_id": kb_ids(ans.id)[idx]}],
            "topic_entities": [entities[c["topic"]].name],
            "kg": kg,
            "subgraph_id": kb_ids(c["topic"])[idx],
        })
    return out


def _kb_documents(entities, facts_by_head) -> list[dict]:
    # One document per entity listing its atomic facts in canonical form: KnowRL-style factuality
    # checks compare a model's claims against exactly these statements.
    docs = []
    for eid, ent in entities.items():
        lines = [render_fact(RELATION_BY_KEY[f.relation].sentences[0], ent.name, surface(entities, f))
                 for f in facts_by_head[eid]]
        docs.append({"id": f"kb-{eid}", "title": ent.name, "text": " ".join(lines)})
    return docs


def _factual_rows(entities, facts_by_head, cands_1hop: list[dict], split: str, n: int, rng) -> list[dict]:
    rows = []
    for i, c in enumerate(rng.sample(cands_1hop, min(n, len(cands_1hop)))):
        fact = c["facts"][0]
        head = entities[fact.head]
        atomic = [render_fact(RELATION_BY_KEY[f.relation].sentences[0], head.name, surface(entities, f))
                  for f in facts_by_head[head.id]]
        meta = {"type": "factual", "topic_entity": head.name, "hops": [_hop(entities, fact)], "facts": atomic}
        rows.append({
            "id": f"fact-{split}-{i:05d}",
            "question": c["question"],
            "golden_answers": c["answers"],
            "supporting_ids": [f"kb-{head.id}"],
            "metadata": json.dumps(meta, sort_keys=True),
        })
    return rows


# --------------------------------------------------------------------------- assembly


def generate_world(seed: int, size: int | str = "tiny", reserved: Iterable[str] = ()) -> World:
    """The world of `seed` and `size`; `reserved` names (another world's) are never given out here."""
    people = size_to_people(size)
    rng = random.Random(seed)
    counts = entity_counts(people)
    names = NameFactory(rng)  # one namespace: event titles never collide with entity names/aliases
    for name in reserved:
        names.reserve(name)
    entities = _make_entities(names, counts)
    facts = _make_facts(rng, entities)
    facts_by_head: dict[str, list[Fact]] = {eid: [] for eid in entities}
    for f in facts:
        facts_by_head[f.head].append(f)
    passages, entity_passage, fact_passage = _make_passages(rng, entities, facts_by_head, names)
    _assign_splits(rng, entities)
    cands = _question_candidates(rng, entities, facts, facts_by_head)
    want = question_counts(people)

    qa, kgqa, factual = {}, {"A": {}, "B": {}}, {}
    for split in SPLITS:
        comps = _comparisons(rng, entities, facts, split, round(want[split] * 0.2) + 1)
        chosen = _sample_split(rng, cands[split], comps, want[split])
        rows = [_qa_row(entities, entity_passage, split, i, c) for i, c in enumerate(chosen)]
        qa[split] = rows
        kg_want = want[split] * (KGQA_TRAIN_FACTOR if split == "train" else 1)
        kg_pairs = _kgqa_pairs(random.Random(f"{seed}:kgqa:{split}"), split, rows, chosen, cands[split], kg_want)
        for kg in ("A", "B"):
            kgqa[kg][split] = _kgqa_rows(entities, kg_pairs, kg)
        # The test split is drawn last, so its factual set can have the 100 questions an evaluation
        # needs (the KnowRL toy) without moving the random stream behind anything else here.
        n_factual = want[split] if split == SPLITS[-1] else max(10, want[split] // 4)
        factual[split] = _factual_rows(entities, facts_by_head, cands[split]["1hop"], split, n_factual, rng)
    return World(seed, people, entities, facts, passages, entity_passage, fact_passage, qa, kgqa,
                 _kb_documents(entities, facts_by_head), factual)


# --------------------------------------------------------------------------- files

_QA_SCHEMA = pa.schema([
    ("id", pa.string()), ("question", pa.string()), ("golden_answers", pa.list_(pa.string())),
    ("supporting_ids", pa.list_(pa.string())), ("metadata", pa.string()),
])
_KGQA_SCHEMA = pa.schema([
    ("id", pa.string()), ("question", pa.string()),
    ("answers", pa.list_(pa.struct([("text", pa.string()), ("kb_id", pa.string())]))),
    ("topic_entities", pa.list_(pa.string())), ("kg", pa.string()), ("subgraph_id", pa.string()),
])
_PASSAGE_SCHEMA = pa.schema([("id", pa.string()), ("title", pa.string()), ("text", pa.string()),
                             ("source", pa.string())])
_TRIPLE_SCHEMA = pa.schema([("head", pa.string()), ("relation", pa.string()), ("tail", pa.string()),
                            ("source_id", pa.string())])


def write_world(world: World, out: str | Path) -> dict:
    out = Path(out)
    ents = world.entities
    write_parquet(pa.Table.from_pylist(world.passages, schema=_PASSAGE_SCHEMA), out / "passages.parquet")
    write_parquet(pa.Table.from_pylist([
        {"id": e.id, "type": e.type, "name": e.name, "aliases": e.aliases, "split": e.split,
         "kb_id_a": kb_ids(e.id)[0], "kb_id_b": kb_ids(e.id)[1]} for e in ents.values()
    ]), out / "entities.parquet")
    write_parquet(pa.Table.from_pylist([
        {"key": r.key, "head_type": r.head_type, "tail_type": r.tail_type, "kg_a": r.kg_a, "kg_b": r.kg_b,
         "wikidata_pid": r.wikidata_pid} for r in RELATIONS
    ]), out / "relations.parquet")
    for kg, attr in (("A", "kg_a"), ("B", "kg_b")):
        rows = [{"head": ents[f.head].name, "relation": getattr(RELATION_BY_KEY[f.relation], attr),
                 "tail": surface(ents, f), "source_id": world.fact_passage[f]} for f in world.facts]
        write_parquet(pa.Table.from_pylist(rows, schema=_TRIPLE_SCHEMA), out / f"kg/{kg}/triples.parquet")
    for split in SPLITS:
        write_parquet(pa.Table.from_pylist(world.qa[split], schema=_QA_SCHEMA), out / f"qa/{split}.parquet")
        write_parquet(pa.Table.from_pylist(world.factual[split], schema=_QA_SCHEMA),
                      out / f"factual/{split}.parquet")
        for kg in ("A", "B"):
            write_parquet(pa.Table.from_pylist(world.kgqa[kg][split], schema=_KGQA_SCHEMA),
                          out / f"kgqa/{kg}/{split}.parquet")
    write_parquet(pa.Table.from_pylist(world.kb_documents, schema=_PASSAGE_SCHEMA.remove(3)),
                  out / "kb/documents.parquet")
    manifest = {
        "world_version": WORLD_VERSION,
        "seed": world.seed,
        "people": world.size,
        "entities": len(ents),
        "entity_types": sorted({e.type for e in ents.values()}),
        "relations": len(RELATIONS),
        "facts": len(world.facts),
        "passages": len(world.passages),
        "questions": {s: len(world.qa[s]) for s in SPLITS},
        "kgqa": {kg: {s: len(world.kgqa[kg][s]) for s in SPLITS} for kg in ("A", "B")},
        "factual": {s: len(world.factual[s]) for s in SPLITS},
        "kb_documents": len(world.kb_documents),
    }
    write_json(manifest, out / "manifest.json")
    return manifest


def world_text(world_dir: str | Path) -> list[str]:
    """The text a tokenizer is trained on: passages, questions and answers of the written world."""
    import pyarrow.parquet as pq

    world_dir = Path(world_dir)
    p = pq.read_table(world_dir / "passages.parquet", columns=["title", "text"]).to_pydict()
    texts = [f"{t}\n{x}" for t, x in zip(p["title"], p["text"])]
    for split in SPLITS:
        q = pq.read_table(world_dir / f"qa/{split}.parquet", columns=["question", "golden_answers"]).to_pydict()
        texts += [f"{qq} {' '.join(a)}" for qq, a in zip(q["question"], q["golden_answers"])]
    # The KG agent reads relation names ("people.person.employer", "P108") in observations and
    # writes them in queries: without them here they would cost a dozen tokens each.
    for kg in ("A", "B"):
        t = pq.read_table(world_dir / f"kg/{kg}/triples.parquet", columns=["head", "relation", "tail"]).to_pydict()
        texts += [f'"{h}", "{r}" {t}' for h, r, t in zip(t["head"], t["relation"], t["tail"])]
    return texts
