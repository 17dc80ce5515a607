"""Property-based fuzzing of the server's OpenAPI schema with schemathesis, in process (ASGI).

Every operation gets requests generated from its documented parameters and bodies (valid and
invalid ones); every response must be documented: no 5xx, a documented status, content type,
headers and body schema, and invalid requests are refused. Valid requests must be accepted
(`positive_data_acceptance`): the only refusals allowed are limits (413), a cache miss without a
model (404), and the few rules the schema cannot state (see ``_unstateable``; among them the model's layer
count, which a layer id or the number of mix weights must fit). The app is the real
one, with the tiny model and a real cache, so cache hits, live encodings and every error path are
reached. A few hundred examples: well under a minute on 2 cores.
"""

from __future__ import annotations

import re

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.core.failures import FailureGroup  # noqa: E402

import elmo_cache  # noqa: E402
from elmo_cache.server import Settings, create_app  # noqa: E402

LINES = ["The cat sat on the mat .", "hello world", "", "one"]


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory, tiny_model):
    from elmo_cache.builder import BuildOptions, build

    encoder = elmo_cache.Encoder.load(tiny_model, device="cpu")
    folder = tmp_path_factory.mktemp("fuzz")
    corpus = folder / "c.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    build(corpus, BuildOptions(output=folder / "c.zarr", device="cpu", progress=False), encoder=encoder)
    cache = elmo_cache.open(folder / "c.zarr")
    # Small limits so generated requests reach them (413) as well as the happy paths.
    settings = Settings(
        max_wait_ms=0, max_tokens_per_sentence=20, max_sentences_per_request=8, max_body_bytes=4000, access_log=False
    )
    app = create_app(settings, encoder=encoder, cache=cache)
    # A schema-valid request may be refused only for a limit, a miss (404) or a busy server. An invalid one may
    # also be refused for its size before it is parsed (413): generated invalid bodies are often large.
    # (schemathesis' default rejections, plus 413; a 5xx still fails its own check, not_a_server_error)
    rejections = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
    config = SchemathesisConfig.from_dict(
        {
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ["2xx", "401", "404", "413", "429", "503"]},
                "negative_data_rejection": {"expected-statuses": rejections},
            }
        }
    )
    yield schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    cache.close()


OPERATIONS = [
    ("GET", "/embed"),
    ("POST", "/embed"),
    ("POST", "/v1/embeddings"),
    ("GET", "/health"),
    ("GET", "/info"),
    ("GET", "/metrics"),
]


def test_the_fuzzed_operations_are_all_of_them(api_schema):
    found = {(result.ok().method.upper(), result.ok().path) for result in api_schema.get_all_operations()}
    assert found == set(OPERATIONS)


# schemathesis' own pytest parametrisation (`schema.parametrize()` on a fixture) does not run under
# pytest 9, so each operation's strategy is driven through hypothesis here.
# Operations without parameters have no invalid inputs to generate.
CASES = [(m, p, "positive") for m, p in OPERATIONS] + [
    ("GET", "/embed", "negative"),
    ("POST", "/embed", "negative"),
    ("POST", "/v1/embeddings", "negative"),
]


def _unstateable(case, response) -> bool:
    """A 422 for a rule OpenAPI cannot state: across query parameters, a mix whose result overflows, or a
    /v1/embeddings `dimensions` other than the model's width."""
    if response.status_code != 422 or response.json()["error"]["code"] != "invalid_parameter":
        return False
    message = response.json()["error"]["message"]
    if "not finite" in message:  # depends on the vectors, not on the request's shape
        return True
    if case.path == "/v1/embeddings":  # the model's width, known only once it is loaded
        return message.startswith("dimensions:")
    # The model's layer count (ELMo's 3, a Transformer's blocks + 1), known only once it is loaded.
    if re.match(r"(body\.|query\.)?layers: layer [0-9]+ does not exist", message):
        return True
    if re.match(r"(body\.|query\.)?mix: expected [0-9]+ numbers \(one per layer\)", message):
        return True
    query = case.query or {}
    if case.method.upper() == "GET":
        both = "layers" in query and "mix" in query
        return both or ("mix" not in query and ("gamma" in query or "softmax" in query))
    return False


@pytest.mark.parametrize("method,path,mode", CASES, ids=[" ".join(case) for case in CASES])
def test_every_response_is_documented(api_schema, method, path, mode):
    operation = api_schema[path][method]
    strategy = operation.as_strategy(generation_mode=schemathesis.GenerationMode(mode))

    @hypothesis.given(case=strategy)
    @hypothesis.settings(
        max_examples=300 if path in ("/embed", "/v1/embeddings") else 10,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    def check(case):
        try:
            case.call_and_validate()
        except FailureGroup as failures:
            # Only the positive-data check may fail, and only for a rule the schema cannot state.
            response = case.call()
            names = {type(f).__name__ for f in failures.exceptions}
            if names != {"RejectedPositiveData"} or not _unstateable(case, response):
                raise

    check()


def test_the_schema_states_the_rules_across_fields(api_schema):
    """What the issue found accepted by the schema and then refused: now the schema refuses it too."""
    spec = api_schema.raw_schema
    body = spec["components"]["schemas"]["EmbedRequest"]
    assert body["not"] == {"required": ["layers", "mix"]}
    assert body["dependentRequired"] == {"gamma": ["mix"], "softmax": ["mix"]}
    import jsonschema

    validator = jsonschema.Draft202012Validator(body)
    for good in ({"sentences": ["a"], "mix": "1,2,3", "gamma": 2}, {"sentences": ["a"], "layers": [0, 2]}):
        assert validator.is_valid(good), good
    for bad in (
        {"sentences": ["a"], "layers": "1", "mix": "1,1,1"},
        {"sentences": ["a"], "mix": "1,x"},
        {"sentences": ["a"], "mix": "1e5,nan,1"},
        {"sentences": ["a"], "gamma": 2},
        {"sentences": ["a"], "layers": "-1"},
        {"sentences": ["a"], "layers": [1000]},
    ):
        assert not validator.is_valid(bad), bad
    params = {p["name"]: p["schema"] for p in spec["paths"]["/embed"]["get"]["parameters"]}
    mix = next(s for s in params["mix"]["anyOf"] if s.get("type") == "string")
    assert mix["pattern"].startswith("^") and mix["pattern"].endswith("$")


def test_the_cases_the_issue_found(api_schema):
    """layers with mix, a malformed mix, and a mix or gamma that overflows float32: refused, never a 500."""
    get, post = api_schema["/embed"]["GET"], api_schema["/embed"]["POST"]
    for query, code in (
        ({"layers": "1", "mix": "1,1,1"}, "invalid_parameter"),
        ({"mix": "1,,2"}, "validation_error"),
        ({"mix": "1e308,1,1"}, "validation_error"),  # exponents beyond 2 digits are outside the pattern
        ({"mix": "1e99,1,1"}, "invalid_parameter"),  # inside it, but not finite in float32
        ({"mix": "1,1,1", "gamma": 1e300}, "invalid_parameter"),
    ):
        case = get.Case(query={"sentence": "hello world", **query})
        response = case.call()
        assert response.status_code == 422 and response.json()["error"]["code"] == code, response.text
        case.validate_response(response)
    for body in (
        {"sentences": ["hello world"], "layers": "1", "mix": "1,1,1"},
        {"sentences": ["hello world"], "layers": None, "mix": "1,1,1"},
        {"sentences": ["hello world"], "mix": "1;2;3"},
        {"sentences": ["hello world"], "gamma": 2.0},
    ):
        response = post.Case(body=body, media_type="application/json").call()
        assert response.status_code == 422 and response.json()["error"]["code"] == "validation_error", response.text
    overflow = post.Case(body={"sentences": ["one"], "mix": [1e308, 1, 1]}, media_type="application/json").call()
    assert overflow.status_code == 422 and "mix:" in overflow.json()["error"]["message"]
