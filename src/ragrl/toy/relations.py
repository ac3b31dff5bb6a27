"""The synthetic world's schema: relations, their two KG vocabularies, and their surface forms.

Everything the generator says about a fact comes from here: the passage sentences that state it,
the questions that ask it, and the noun phrase that refers to its tail inside a 2-hop question.
Keeping them together is what lets tests check that every answer is stated where it is claimed.
"""

from __future__ import annotations

from dataclasses import dataclass

ENTITY_TYPES = ("person", "city", "country", "company", "university", "film", "book")


@dataclass(frozen=True)
class Relation:
    key: str
    head_type: str
    tail_type: str  # an entity type, or "year" / "number" for literal attributes
    kg_a: str  # Freebase-like dotted name (KG A)
    kg_b: str  # Wikidata-like label (KG B)
    wikidata_pid: str
    sentences: tuple[str, ...]  # passage sentences; {h} head, {t} tail
    questions: tuple[str, ...]  # 1-hop questions about {h}; the answer is the tail
    descriptor: str = ""  # "the city where {h} was born": refers to the tail in a bridge question

    @property
    def is_attribute(self) -> bool:
        return self.tail_type in ("year", "number")


RELATIONS: tuple[Relation, ...] = (
    Relation(
        "born_in", "person", "city", "people.person.place_of_birth", "place of birth", "P19",
        ("{h} was born in {t}.", "{h} was born and raised in the city of {t}.", "{t} is the birthplace of {h}.",
         "Born in {t}, {h} spent a childhood there."),
        ("Where was {h} born?", "In which city was {h} born?", "What is the birthplace of {h}?"),
        "the city where {h} was born",
    ),
    Relation(
        "citizen_of", "person", "country", "people.person.nationality", "country of citizenship", "P27",
        ("{h} is a citizen of {t}.", "{h} holds citizenship of {t}.", "By nationality, {h} is from {t}."),
        ("Which country is {h} a citizen of?", "What is the nationality of {h}?"),
        "the country of which {h} is a citizen",
    ),
    Relation(
        "educated_at", "person", "university", "people.person.education", "educated at", "P69",
        ("{h} studied at {t}.", "{h} graduated from {t}.", "{h} received an education at {t}."),
        ("Which university did {h} attend?", "Where was {h} educated?"),
        "the university that {h} attended",
    ),
    Relation(
        "employer", "person", "company", "business.person.employer", "employer", "P108",
        ("{h} works for {t}.", "{h} is employed by {t}.", "{t} employs {h}."),
        ("Which company does {h} work for?", "Who is the employer of {h}?"),
        "the company that {h} works for",
    ),
    Relation(
        "located_in", "city", "country", "location.location.containedby", "country", "P17",
        ("{h} is a city in {t}.", "{h} lies in {t}.", "{h} is located in the country of {t}."),
        ("In which country is {h} located?", "Which country is {h} in?"),
        "the country where {h} is located",
    ),
    Relation(
        "capital", "country", "city", "location.country.capital", "capital", "P36",
        ("The capital of {h} is {t}.", "{h} has its capital at {t}.", "{t} serves as the capital of {h}."),
        ("What is the capital of {h}?", "Which city is the capital of {h}?"),
        "the capital of {h}",
    ),
    Relation(
        "headquartered_in", "company", "city", "organization.organization.headquarters", "headquarters location",
        "P159",
        ("{h} is headquartered in {t}.", "{h} has its head office in {t}.", "The headquarters of {h} are in {t}."),
        ("Where is {h} headquartered?", "In which city is the headquarters of {h}?"),
        "the city where {h} is headquartered",
    ),
    Relation(
        "founded_by", "company", "person", "organization.organization.founders", "founded by", "P112",
        ("{h} was founded by {t}.", "{t} founded {h}.", "{h} was established by {t}."),
        ("Who founded {h}?", "Who is the founder of {h}?"),
        "the founder of {h}",
    ),
    Relation(
        "university_in", "university", "city", "education.university.campus_location", "location", "P276",
        ("{h} is located in {t}.", "{h} has its campus in {t}.", "The campus of {h} is in {t}."),
        ("In which city is {h} located?", "Where is the campus of {h}?"),
        "the city where {h} is located",
    ),
    Relation(
        "directed_by", "film", "person", "film.film.directed_by", "director", "P57",
        ("{h} was directed by {t}.", "{t} directed {h}.", "{h} is a film by director {t}."),
        ("Who directed {h}?", "Who is the director of {h}?"),
        "the director of {h}",
    ),
    Relation(
        "written_by", "book", "person", "book.written_work.author", "author", "P50",
        ("{h} was written by {t}.", "{t} is the author of {h}.", "{h} is a book by {t}."),
        ("Who wrote {h}?", "Who is the author of {h}?"),
        "the author of {h}",
    ),
    Relation(
        "film_country", "film", "country", "film.film.country", "country of origin", "P495",
        ("{h} was produced in {t}.", "{h} is a film from {t}.", "The country of origin of {h} is {t}."),
        ("Which country is {h} from?", "In which country was {h} produced?"),
        "the country where {h} was produced",
    ),
    Relation(
        "birth_year", "person", "year", "people.person.date_of_birth", "date of birth", "P569",
        ("{h} was born in the year {t}.", "{h} was born in {t}.", "The year {t} saw the birth of {h}."),
        ("In what year was {h} born?", "What is the birth year of {h}?"),
    ),
    Relation(
        "founded_year", "company", "year", "organization.organization.date_founded", "inception", "P571",
        ("{h} was founded in {t}.", "{h} has been in business since {t}.", "In {t}, {h} opened for business."),
        ("In what year was {h} founded?", "When was {h} founded?"),
    ),
    Relation(
        "release_year", "film", "year", "film.film.initial_release_date", "publication date", "P577",
        ("{h} was released in {t}.", "{h} premiered in {t}.", "Audiences first saw {h} in {t}."),
        ("In what year was {h} released?", "When did {h} premiere?"),
    ),
    Relation(
        "publication_year", "book", "year", "book.written_work.date_of_first_publication", "publication date",
        "P577",
        ("{h} was first published in {t}.", "{h} appeared in print in {t}.", "The first edition of {h} came out in {t}."),
        ("In which year was {h} first published?", "When was {h} first published?"),
    ),
    Relation(
        "founding_year_univ", "university", "year", "organization.organization.date_founded", "inception", "P571",
        ("{h} was founded in {t}.", "{h} admitted its first students in {t}."),
        ("In what year was {h} founded?", "When did {h} admit its first students?"),
    ),
    Relation(
        "population", "city", "number", "location.statistical_region.population", "population", "P1082",
        ("{h} has a population of {t}.", "About {t} people live in {h}.", "The population of {h} is {t}."),
        ("What is the population of {h}?", "How many people live in {h}?"),
    ),
)

RELATION_BY_KEY = {r.key: r for r in RELATIONS}

# Comparison questions: attribute, which value wins, and question templates over {a} and {b}.
COMPARISONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("birth_year", "min", ("Who was born first, {a} or {b}?", "Which person is older, {a} or {b}?")),
    ("founded_year", "min", ("Which company was founded earlier, {a} or {b}?", "Which is older, {a} or {b}?")),
    ("release_year", "min", ("Which film came out first, {a} or {b}?", "Which film premiered earlier, {a} or {b}?")),
    ("publication_year", "max", ("Which book was published more recently, {a} or {b}?",)),
    ("population", "max", ("Which city has a larger population, {a} or {b}?", "Which city is bigger, {a} or {b}?")),
)

# Referring expressions used instead of the full name after a passage's first sentence.
ANAPHORS = {
    "city": "The city",
    "country": "The country",
    "company": "The company",
    "university": "The university",
    "film": "The film",
    "book": "The book",
}
