"""The rendered router on a real nginx: every request reaches the pool its class names, as the same
rules evaluated in Python say (playbook.routing.classify), whatever the body; malformed bodies reach
the default pool and are counted; bodies over the memory buffer still route by their content.

Behind nginx are recording upstreams (tests/routing_upstream.py), one per pool: each answers which
pool it is, the class and pool the router told it, and a digest of the body it received."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specguard.playbook.routing.classify import Decision, classify
from tests.nginx_router import Router, _wait_port
from tests.ports import free_port

UPSTREAM = Path(__file__).resolve().parents[2] / "routing_upstream.py"
BUFFER = 2048  # bodies over this go to a temporary file, which the router must read

CLASSES: list[dict[str, Any]] = [
    {"name": "hot", "pool": "standard", "when": {"temperature": {"gt": 1.0}}},
    {"name": "nucleus", "pool": "standard", "when": {"top_p": {"lt": 0.5}}},
    {"name": "short", "pool": "standard", "when": {"max_tokens": {"lt": 32}}},
    {"name": "short_unstreamed", "pool": "standard", "when": {"stream": False, "max_tokens": {"lt": 64}}},
    {"name": "fanout", "pool": "standard", "when": {"n": {"ge": 2, "le": 4}}},
    {
        "name": "long_chat",
        "pool": "long",
        "when": {"path": "/v1/chat/completions", "prompt_chars": {"ge": 3000}},
    },
    {"name": "long_prompt", "pool": "long", "when": {"prompt_chars": {"gt": 6000}}},
    {"name": "side_model", "pool": "standard", "when": {"model": {"in": ["other", "m-ü"]}}},
    {"name": "odd_stream", "pool": "long", "when": {"model": {"ne": "target"}, "stream": {"ne": False}}},
]


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, str]]:
    servers = {name: f"127.0.0.1:{free_port()}" for name in ("speculative", "standard", "long")}
    processes = [
        subprocess.Popen([sys.executable, str(UPSTREAM), name, address.rsplit(":", 1)[1]])
        for name, address in servers.items()
    ]
    try:
        for address in servers.values():
            _wait_port(address, time.monotonic() + 30)
        yield servers
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def router(upstreams: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    directory = tmp_path_factory.mktemp("router")
    routing = {
        "listen": f"127.0.0.1:{free_port()}",
        "admin_listen": f"127.0.0.1:{free_port()}",
        "flag_file": str(directory / "flag.json"),
        "pools": {name: {"servers": [address]} for name, address in upstreams.items()},
        "default_pool": "speculative",
        "fallback_pool": "standard",
        "max_body_size": "256KiB",
        "body_buffer_size": BUFFER,
        "classes": CLASSES,
    }
    with Router(directory, routing) as running:
        yield running


class Client:
    """One keep-alive connection to an address, as a client of the router would hold it."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.connection = http.client.HTTPConnection(host, int(port), timeout=30)

    def send(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def close(self) -> None:
        self.connection.close()


@pytest.fixture(scope="module")
def client(router: Router) -> Iterator[Client]:
    client = Client(router.config.listen)
    yield client
    client.close()


@pytest.fixture(scope="module")
def admin(router: Router) -> Iterator[Client]:
    client = Client(router.config.admin_listen)
    yield client
    client.close()


def counters(admin: Client) -> dict[str, float]:
    """The router's malformed and missing-field counters, by series."""
    status, _, text = admin.send("GET", "/specguard/metrics")
    assert status == 200
    found = {}
    for line in text.decode().splitlines():
        match = re.match(r"(specguard_route_(?:malformed|missing_field)_total\{[^}]*\}) (\S+)$", line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


def expected_counts(decision: Decision) -> dict[str, float]:
    counts = {f'specguard_route_missing_field_total{{field="{f}"}}': 1.0 for f in decision.missing}
    if decision.malformed:
        counts[f'specguard_route_malformed_total{{reason="{decision.malformed}"}}'] = 1.0
    return counts


def check_routed(
    router: Router, client: Client, admin: Client, method: str, path: str, body: bytes
) -> Decision:
    """Send one request through nginx; it must reach the pool Python's classify names, labelled
    with its class, its body whole, and the router's counters must move by what classify says."""
    expected = classify(router.config, method, path, body)
    before = counters(admin)
    status, headers, data = client.send(method, path, body if method == "POST" else None)
    assert status == 200, data[:300]
    seen = json.loads(data)
    assert (seen["pool"], seen["class"]) == (expected.pool, expected.klass), (body[:300], expected)
    assert (headers["x-specguard-class"], headers["x-specguard-pool"]) == (expected.klass, expected.pool)
    if method == "POST":
        assert (seen["length"], seen["sha256"]) == (len(body), hashlib.sha256(body).hexdigest())
    after = counters(admin)
    moved = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    assert moved == expected_counts(expected)
    return expected


# --- request bodies ------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8"), max_size=300)
NUMBER = st.one_of(
    st.integers(-5, 300),
    st.floats(-5, 300, allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 0.5, 1, 1.0, 1.0000001, 0.4999999, 31, 32, 63, 64, 2, 4, 5]),
)
WRONG = st.one_of(TEXT, st.booleans(), st.lists(st.integers(), max_size=2), st.just({}))


def maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Usually a value of the right type, sometimes null, rarely the wrong type (which makes the
    whole request malformed)."""
    return st.one_of(*[values] * 10, st.none(), WRONG)


def big(text: str, size: int) -> str:
    return text + "é" * size


PROMPT = st.one_of(
    st.builds(big, TEXT, st.sampled_from([0, 0, 0, 1500, 3200, 7000])),
    st.lists(TEXT, max_size=4),
    st.lists(st.integers(0, 50000), max_size=8),  # token ids: no characters to count
    st.none(),
)
CONTENT = st.one_of(
    st.builds(big, TEXT, st.sampled_from([0, 0, 0, 1000, 3200])),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=3),
    st.none(),
)
MESSAGES = st.one_of(
    st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": CONTENT}), max_size=3
    ),
    st.just({}),
    TEXT,
)
FIELDS = {
    "model": maybe(st.sampled_from(["target", "other", "m-ü", "draft"])),
    "temperature": maybe(NUMBER),
    "top_p": maybe(NUMBER),
    "max_tokens": maybe(st.integers(0, 200)),
    "max_completion_tokens": maybe(st.integers(0, 200)),
    "stream": maybe(st.booleans()),
    "n": maybe(st.integers(1, 6)),
}


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, bytes]:
    path = draw(st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    body = draw(st.fixed_dictionaries({}, optional=FIELDS))
    if path == "/v1/completions":
        body.update(draw(st.fixed_dictionaries({}, optional={"prompt": PROMPT})))
    else:
        body.update(draw(st.fixed_dictionaries({}, optional={"messages": MESSAGES})))
    text = json.dumps(body, ensure_ascii=draw(st.booleans()))
    return "POST", path, text.encode()


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(request=requests())
def test_every_request_reaches_the_pool_its_class_names(
    router: Router, client: Client, admin: Client, request: tuple[str, str, bytes]
) -> None:
    check_routed(router, client, admin, *request)


MALFORMED = st.one_of(
    st.builds(
        lambda b, cut: b[: max(1, len(b) * cut // 10)], requests().map(lambda r: r[2]), st.integers(1, 9)
    ),
    st.sampled_from(
        [b"", b"null", b"[]", b"[1, 2]", b'"{}"', b"42", b"true", b"{", b"{}}", b"\xef\xbb\xbf{}"]
    ),
    st.sampled_from([b'{"temperature": NaN}', b'{"max_tokens": Infinity}', b"{'a': 1}", b"not json"]),
    st.builds(lambda v: json.dumps({"temperature": v}).encode(), WRONG),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=MALFORMED, path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_malformed_bodies_reach_the_default_pool_and_are_counted(
    router: Router, client: Client, admin: Client, body: bytes, path: str
) -> None:
    decision = check_routed(router, client, admin, "POST", path, body)
    if body.lstrip(b" \t\r\n")[:1] != b"{":
        assert (decision.klass, decision.pool, decision.malformed is not None) == (
            "malformed",
            "speculative",
            True,
        )


@pytest.mark.parametrize(
    "body",
    [
        b'{"prompt": "\\ud800", "max_tokens": 3}',  # an unpaired surrogate escape: not JSON to cjson
        b'{"prompt": "\\ud83d\\ude00' + "é".encode() * 3100 + b'", "max_tokens": 3}',
        b'{"prompt": "\xff\xfe' + b"a" * 6000 + b'", "max_tokens": 300}',  # not UTF-8: bytes pass through
        b'{"prompt": "tab\tand\x01", "max_tokens": 3}',  # control characters inside a string
        b'{"max_tokens": 1e400}',
        b'{"max_tokens": -0}',
        b' \n{"max_tokens": 2}\n',
    ],
)
def test_bodies_where_json_readers_differ_are_read_as_cjson_reads_them(
    router: Router, client: Client, admin: Client, body: bytes
) -> None:
    check_routed(router, client, admin, "POST", "/v1/completions", body)


def test_the_malformed_reasons_each_counted_under_its_name(
    router: Router, client: Client, admin: Client
) -> None:
    for body, reason in [
        (b"{not json", "json"),
        (b"[1, 2]", "not_object"),
        (b'{"temperature": "hot", "max_tokens": 8}', "field_type"),
        (b'{"stream": "yes"}', "field_type"),
    ]:
        decision = check_routed(router, client, admin, "POST", "/v1/completions", body)
        assert (decision.klass, decision.pool, decision.malformed) == ("malformed", "speculative", reason)


BOUNDARIES = [
    ({"temperature": 1.0}, "default"),
    ({"temperature": 1}, "default"),
    ({"temperature": 1.0000001}, "hot"),
    ({"top_p": 0.5}, "default"),
    ({"top_p": 0.4999999}, "nucleus"),
    ({"max_tokens": 31}, "short"),
    ({"max_tokens": 32, "stream": False}, "short_unstreamed"),
    ({"max_tokens": 32}, "default"),
    ({"max_tokens": 63, "stream": False}, "short_unstreamed"),
    ({"max_tokens": 40, "stream": None}, "short_unstreamed"),  # stream null: the API's default, false
    ({"max_tokens": 64, "stream": False}, "default"),
    ({"max_completion_tokens": 10, "max_tokens": 100}, "short"),
    ({"max_completion_tokens": None, "max_tokens": 10}, "short"),
    ({"max_completion_tokens": 100, "max_tokens": 10}, "default"),
    ({"n": 1}, "default"),
    ({"n": 2}, "fanout"),
    ({"n": 4}, "fanout"),
    ({"n": 5}, "default"),
    ({"prompt": "a" * 6000}, "default"),
    ({"prompt": "a" * 6001}, "long_prompt"),
    ({"prompt": ["é" * 3000, "ü" * 3001]}, "long_prompt"),
    ({"prompt": ["a" * 7000, None]}, "default"),
    ({"model": "other"}, "side_model"),
    ({"model": "m-ü"}, "side_model"),
    ({"model": "draft"}, "odd_stream"),
    ({"model": "draft", "stream": False}, "default"),
]


@pytest.mark.parametrize(("fields", "klass"), BOUNDARIES)
def test_each_condition_at_its_boundary(
    router: Router, client: Client, admin: Client, fields: dict[str, Any], klass: str
) -> None:
    body = {"model": "target", "stream": True, "max_tokens": 500, **fields}
    decision = check_routed(router, client, admin, "POST", "/v1/completions", json.dumps(body).encode())
    assert decision.klass == klass


@pytest.mark.parametrize(("chars", "klass"), [(2999, "default"), (3000, "long_chat")])
def test_a_chat_prompt_counts_the_characters_of_every_text_content(
    router: Router, client: Client, admin: Client, chars: int, klass: str
) -> None:
    messages = [
        {"role": "system", "content": "s" * 1000},
        {"role": "user", "content": [{"type": "text", "text": "€" * 1000}, {"type": "image_url"}]},
        {"role": "user", "content": "🙂" * (chars - 2000)},
        {"role": "assistant", "content": None},
    ]
    body = {"model": "target", "stream": True, "max_tokens": 500, "messages": messages}
    decision = check_routed(router, client, admin, "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert decision.klass == klass


def test_a_missing_field_is_counted_and_its_condition_does_not_hold(
    router: Router, client: Client, admin: Client
) -> None:
    decision = check_routed(
        router, client, admin, "POST", "/v1/completions", b'{"model": "target", "prompt": "hi"}'
    )
    assert (decision.klass, decision.pool) == ("default", "speculative")
    assert set(decision.missing) == {"temperature", "top_p", "max_tokens"}


def spilled(router: Router) -> int:
    return router.error_log.read_text(errors="replace").count("buffered to a temporary file")


@pytest.mark.parametrize(
    ("path", "body", "klass", "pool"),
    [
        (
            "/v1/completions",
            {"model": "target", "prompt": "x" * 20000, "max_tokens": 10},
            "short",
            "standard",
        ),
        (
            "/v1/completions",
            {"model": "target", "prompt": "é" * 7000, "max_tokens": 200},
            "long_prompt",
            "long",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "target",
                "messages": [{"role": "user", "content": "y" * 4000}],
                "max_tokens": 500,
                "stream": True,
            },
            "long_chat",
            "long",
        ),
        (
            "/v1/completions",
            {"model": "target", "prompt": "z" * 100000, "max_tokens": 500, "stream": True},
            "long_prompt",
            "long",
        ),
    ],
)
def test_a_body_over_the_memory_buffer_is_read_from_its_file_and_routed_by_its_content(
    router: Router, client: Client, admin: Client, path: str, body: dict[str, Any], klass: str, pool: str
) -> None:
    data = json.dumps(body).encode()
    assert len(data) > BUFFER
    before = spilled(router)
    decision = check_routed(router, client, admin, "POST", path, data)
    assert (decision.klass, decision.pool) == (klass, pool)
    assert spilled(router) == before + 1  # nginx did write it to a file: the file path was taken


def test_requests_that_are_not_completions_are_not_inspected(
    router: Router, client: Client, admin: Client
) -> None:
    for method, path in [("GET", "/v1/models"), ("GET", "/v1/completions"), ("POST", "/v1/embeddings")]:
        decision = check_routed(router, client, admin, method, path, b'{"temperature": 2}')
        assert (decision.klass, decision.pool) == ("other", "speculative")
    decision = check_routed(router, client, admin, "POST", "/v1/completions?x=1", b'{"temperature": 2}')
    assert decision.klass == "hot"


def test_connections_to_a_pool_are_kept_alive_and_reused(router: Router) -> None:
    """nginx keeps its connections to the pool open (keepalive, HTTP/1.1, no Connection: close):
    many requests one after another reach the upstream over the same connection or two, not one
    each (one worker; a fresh client connection each time, so the reuse is nginx's own)."""
    peers = set()
    for _ in range(30):
        client = Client(router.config.listen)
        status, _, data = client.send("POST", "/v1/completions", b'{"max_tokens": 500, "stream": true}')
        client.close()
        assert status == 200
        peers.add(tuple(json.loads(data)["peer"]))
    assert len(peers) <= 2, peers


def test_a_body_over_max_body_size_is_refused_with_413_and_counted_nowhere(
    router: Router, client: Client, admin: Client
) -> None:
    before = counters(admin)
    status, _, _ = client.send("POST", "/v1/completions", b'{"prompt": "' + b"x" * 300000 + b'"}')
    assert status == 413
    assert counters(admin) == before


def test_the_flag_sends_every_request_to_the_fallback_pool_and_back(
    router: Router, client: Client, admin: Client
) -> None:
    hot = b'{"model": "target", "temperature": 0.2, "max_tokens": 500, "stream": true}'
    try:
        status, _, answer = admin.send("PUT", "/specguard/flag", b'{"fallback": true}')
        assert (status, json.loads(answer)["fallback"]) == (200, True)
        status, headers, data = client.send("POST", "/v1/completions", hot)
        assert json.loads(data)["pool"] == "standard"
        assert headers["x-specguard-class"] == "default"  # the class is still named: the flag moved it
        assert classify(router.config, "POST", "/v1/completions", hot, engaged=True).pool == "standard"
    finally:
        status, _, answer = admin.send("PUT", "/specguard/flag", b'{"fallback": false}')
    assert (status, json.loads(answer)["fallback"]) == (200, False)
    assert json.loads(client.send("POST", "/v1/completions", hot)[2])["pool"] == "speculative"


@pytest.mark.parametrize(
    ("method", "body", "status"),
    [("PUT", b"yes", 400), ("PUT", b'{"fallback": "true"}', 400), ("PUT", b"{}", 400), ("DELETE", b"", 405)],
)
def test_the_admin_location_refuses_a_bad_flag_with_its_reason(
    admin: Client, method: str, body: bytes, status: int
) -> None:
    got, _, answer = admin.send(method, "/specguard/flag", body)
    assert got == status
    assert "error" in json.loads(answer)
    assert json.loads(admin.send("GET", "/specguard/flag")[2])["fallback"] is False
