"""The <kg-query> parser: KG-R1's accepted forms, helpful errors, and no exception on any string."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ragrl.agent.protocol import Action
from ragrl.kg.environment import KGEnvironment
from ragrl.kg.query_parser import MAX_ARG_CHARS, MAX_QUERY_CHARS, KGQuery, QueryFormatError, parse_query


def ok(text: str) -> KGQuery:
    result = parse_query(text)
    assert isinstance(result, KGQuery), result
    return result


def err(text: str) -> str:
    result = parse_query(text)
    assert isinstance(result, QueryFormatError), result
    return result.message


@pytest.mark.parametrize(
    ("text", "fn", "args"),
    [
        ('get_relations_out("Ada Lovelace")', "get_relations_out", ("Ada Lovelace",)),
        ("get_relations_in('Ada Lovelace')", "get_relations_in", ("Ada Lovelace",)),
        ("get_relations_out(Ada Lovelace)", "get_relations_out", ("Ada Lovelace",)),
        ('  get_entities_out( "Ada Lovelace" ,  "place of birth" )  ', "get_entities_out",
         ("Ada Lovelace", "place of birth")),
        ("get_entities_in(London, place of birth)", "get_entities_in", ("London", "place of birth")),
        ('get_entities_out(m.046vpjr, "film.directed_by")', "get_entities_out", ("m.046vpjr", "film.directed_by")),
        ('get_entities_in("Washington, D.C.", "capital")', "get_entities_in", ("Washington, D.C.", "capital")),
        ("get_entities_out('Paris, Texas', 'containedby')", "get_entities_out", ("Paris, Texas", "containedby")),
        ('get_relations_out("He said \\"hi\\"")', "get_relations_out", ('He said "hi"',)),
        ("get_relations_out(Tera's Thread)", "get_relations_out", ("Tera's Thread",)),  # apostrophe inside a bare name
        ('get_relations_out("Tera\'s Thread")', "get_relations_out", ("Tera's Thread",)),
        ("get_relations_out(Paris (city))", "get_relations_out", ("Paris (city)",)),
        ('get_relations_out(\u201cAda Lovelace\u201d)', "get_relations_out", ("Ada Lovelace",)),  # typographic quotes
        ('"get_relations_out(\\"Ada\\")"', "get_relations_out", ('\\"Ada\\"',)),
        ("'get_relations_out(Ada)'", "get_relations_out", ("Ada",)),  # a whole call in quotes, as KG-R1 strips
        ('get_relations_out("Ada");', "get_relations_out", ("Ada",)),
        ('get_relations_out("Ada   \n Lovelace")', "get_relations_out", ("Ada Lovelace",)),
        # legacy names map onto the four canonical ops; function names are case-insensitive
        ('get_tail_relations("Ada")', "get_relations_out", ("Ada",)),
        ('get_head_relations("Ada")', "get_relations_in", ("Ada",)),
        ('get_tail_entities("Ada", "field")', "get_entities_out", ("Ada", "field")),
        ('get_head_entities("Ada", "field")', "get_entities_in", ("Ada", "field")),
        ('Get_Relations_Out("Ada")', "get_relations_out", ("Ada",)),
    ],
)
def test_accepted_forms(text, fn, args):
    q = ok(text)
    assert (q.fn, q.args) == (fn, args)


def test_called_name_and_dedup_key():
    q = ok('get_tail_entities("Ada Lovelace", "Field")')
    assert q.called == "get_tail_entities"
    assert q.key == ok("get_entities_out(ada lovelace, field)").key
    assert q.key != ok("get_entities_in(ada lovelace, field)").key
    assert q.to_request("webqsp", "WebQTest-1") == {
        "action_type": "get_entities_out", "dataset_name": "webqsp", "sample_id": "WebQTest-1",
        "entity_id": "Ada Lovelace", "relation": "Field"}
    assert ok('get_relations_in("x")').to_request()["relation"] is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty query"),
        ("   ", "empty query"),
        ("Ada Lovelace", "expected a function call"),
        ("get_relations_out", "needs its arguments in parentheses"),
        ('get_relations_out("Ada", "field")', "takes 1 argument (entity), got 2"),
        ('get_entities_out("Ada")', "takes 2 arguments (entity, relation), got 1"),
        ("get_entities_out(Washington, D.C., capital)", "quote names that contain commas"),
        ("get_entities_out()", "got 0"),
        ('get_relation_out("Ada")', "did you mean get_relations_out"),
        ('drop_table("triples")', "unknown function"),
        ('get_relations_out("Ada', "unterminated quote"),
        ('get_relations_out("Ada"', "missing closing parenthesis"),
        ("get_relations_out(Ada", "missing closing parenthesis"),
        ('get_relations_out("Ada" "Lovelace")', "separate arguments with commas"),
        ('get_relations_out("Ada") get_relations_in("Ada")', "exactly one call"),
        ('get_entities_out("Ada", "")', "relation argument of get_entities_out is empty"),
        ('get_relations_out("  ")', "entity argument"),
        ("x" * (MAX_QUERY_CHARS + 1), "too long"),
        ("get_relations_out(" + "x" * (MAX_ARG_CHARS + 1) + ")", "257 characters"),
    ],
)
def test_errors_say_what_is_wrong(text, words):
    message = err(text)
    assert words in message
    assert "get_entities_out(" in message  # every error shows the usage
    assert len(message) < 1000


# --------------------------------------------------------------------------- properties

HOSTILE = st.sampled_from([
    '"', "'", ",", "(", ")", "\\", ";", "--", "' OR 1=1 --", "'; DROP TABLE kg; --", "$(rm -rf /)", "`id`",
    "| cat /etc/passwd", "&&", "${IFS}", "%s%s%n", "{0}", "\x00", "\u202e", "\ufffd", "\U0001f600", "\u201c",
    "\u2019", "<kg-query>", "</kg-query>", "<|im_end|>", "get_relations_out(", "get_entities_out(\"", "\n", "\t",
])
TEXT = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(HOSTILE, st.text(max_size=8)), max_size=40).map("".join),
    st.builds(lambda name, body: f"{name}({body})", st.sampled_from(["get_relations_out", "get_entities_in", "f"]),
              st.lists(st.one_of(HOSTILE, st.text(max_size=6)), max_size=12).map("".join)),
)


@settings(max_examples=400, deadline=None)
@given(TEXT)
@example("x" * 10_000)
@example("(" * 10_000)
@example('get_relations_out("' + "\\" * 10_000)
@example("get_entities_out(" + "a," * 5_000 + ")")
@example("get_relations_out(" + "(" * 3_000 + ")" * 3_000 + ")")
def test_never_raises_on_any_string(text):
    result = parse_query(text)
    assert isinstance(result, (KGQuery, QueryFormatError))
    if isinstance(result, KGQuery):
        assert all(a.strip() for a in result.args)
    else:
        assert result.message


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


NAME = st.text(min_size=1, max_size=60).filter(lambda s: s.strip())


@settings(max_examples=100, deadline=None)
@given(st.integers(9_000, 11_000), HOSTILE)
def test_ten_thousand_characters_go_through_the_scanner(n, piece):
    text = "get_entities_out(" + (piece * n)[:n] + ")"
    assert len(text) < MAX_QUERY_CHARS
    result = parse_query(text)
    assert isinstance(result, (KGQuery, QueryFormatError))
    if isinstance(result, KGQuery):
        assert all(len(a) <= MAX_ARG_CHARS for a in result.args)


@settings(max_examples=300, deadline=None)
@given(NAME, NAME)
def test_quoted_arguments_round_trip(entity, relation):
    q = ok(f'get_entities_out("{_escape(entity)}", "{_escape(relation)}")')
    assert q.args == (" ".join(entity.split()), " ".join(relation.split()))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
@example("<think>x</think><kg-query>get_relations_out(\"a\")</kg-query>")
@example("<kg-query>" + "'" * 10_000 + "</kg-query>")
@example("<kg-query>get_relations_out(\"<|im_end|>\")</kg-query>")
def test_environment_parse_never_raises(text):
    env = KGEnvironment(backend=None)  # parse never touches the backend
    for candidate in (text, f"<kg-query>{text}</kg-query>", f"<think>t</think><kg-query>{text}</kg-query> tail"):
        action = env.parse(candidate)
        assert isinstance(action, Action)
        assert action.kind in ("kg-query", "answer", "invalid")
        if action.kind == "kg-query":
            assert isinstance(parse_query(action.queries[0]), KGQuery)
