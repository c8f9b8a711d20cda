"""The `routing:` section, its classes evaluated in Python, and `specguard routing render|classify`
as a user runs them: what the rendered nginx configuration must hold (the traps of reading bodies,
streaming and keepalive), and every kind of bad input as one line naming the file, line and field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from specguard.cli.entry import main
from specguard.config.routing import RoutingConfig
from specguard.playbook.routing.classify import classify
from specguard.playbook.routing.render import CONF, LUA, MAIN, RULES, Standalone, render

ROUTING: dict[str, Any] = {
    "flag_file": "flag.json",
    "pools": {
        "speculative": {"servers": ["127.0.0.1:8000", "127.0.0.1:8002"]},
        "standard": {"servers": ["127.0.0.1:8001"]},
    },
    "default_pool": "speculative",
    "fallback_pool": "standard",
    "classes": [
        {"name": "high_temperature", "pool": "standard", "when": {"temperature": {"gt": 1.0}}},
        {"name": "short", "pool": "standard", "when": {"max_tokens": {"lt": 32}}},
        {"name": "short_unstreamed", "pool": "standard", "when": {"stream": False, "max_tokens": {"lt": 64}}},
    ],
}


def config_file(tmp_path: Path, routing: Any = None, **changes: Any) -> Path:
    section = {**ROUTING, **changes} if routing is None else routing
    path = tmp_path / "specguard.yaml"
    path.write_text(yaml.safe_dump({"routing": section}, sort_keys=False))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["routing", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def routing(**changes: Any) -> RoutingConfig:
    return RoutingConfig.model_validate({**ROUTING, **changes}, context={"base": "/etc/specguard"})


# --- the Python rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "klass", "pool"),
    [
        ({"temperature": 1.5, "max_tokens": 500, "stream": True}, "high_temperature", "standard"),
        ({"max_tokens": 16, "stream": True}, "short", "standard"),
        ({"max_tokens": 48}, "short_unstreamed", "standard"),  # stream missing: false, the API's default
        ({"max_tokens": 48, "stream": True}, "default", "speculative"),
        ({"max_tokens": 500, "temperature": 0.7}, "default", "speculative"),
    ],
)
def test_the_playbooks_classes(body: dict[str, Any], klass: str, pool: str) -> None:
    decision = classify(routing(), "POST", "/v1/completions", json.dumps(body).encode())
    assert (decision.klass, decision.pool, decision.malformed) == (klass, pool, None)


def test_the_flag_sends_everything_to_the_fallback_pool_and_keeps_the_class() -> None:
    decision = classify(routing(), "POST", "/v1/chat/completions", b'{"max_tokens": 500}', engaged=True)
    assert (decision.klass, decision.pool, decision.fallback) == ("default", "standard", True)
    decision = classify(routing(), "GET", "/v1/models", b"", engaged=True)
    assert (decision.klass, decision.pool) == ("other", "standard")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "json"),
        (b"{", "json"),
        (b'{"temperature": NaN}', "json"),
        (b"\xef\xbb\xbf{}", "json"),  # a byte-order mark: not JSON, for cjson as for Python
        (b'{"prompt": "\\ud800"}', "json"),  # an unpaired surrogate escape: cjson refuses it
        (b'{"prompt": "\\ud83d x \\ude00"}', "json"),
        (b"[]", "not_object"),
        (b'"text"', "not_object"),
        (b'{"temperature": "hot"}', "field_type"),
        (b'{"max_tokens": true}', "field_type"),
        (b'{"stream": 1}', "field_type"),
    ],
)
def test_a_body_it_cannot_read_is_malformed_and_goes_to_the_default_pool(body: bytes, reason: str) -> None:
    decision = classify(routing(), "POST", "/v1/completions", body)
    assert (decision.klass, decision.pool, decision.malformed) == ("malformed", "speculative", reason)


def test_what_cjson_reads_python_reads_alike() -> None:
    classes = [{"name": "long", "pool": "standard", "when": {"prompt_chars": {"ge": 2}}}]
    r = routing(classes=classes)
    for body in (b'{"prompt": "\\ud83d\\ude00x"}', b'{"prompt": "\xff\xfe"}', b'{"prompt": "a\x01"}'):
        assert classify(r, "POST", "/v1/completions", body).klass == "long", body


def test_a_field_no_class_tests_is_not_looked_at() -> None:
    decision = classify(routing(), "POST", "/v1/completions", b'{"top_p": "wide", "max_tokens": 8}')
    assert (decision.klass, decision.malformed) == ("short", None)


def test_missing_fields_are_named_and_their_conditions_do_not_hold() -> None:
    decision = classify(routing(), "POST", "/v1/completions", b'{"prompt": "hi"}')
    assert (decision.klass, decision.missing) == ("default", ("temperature", "max_tokens"))


def test_prompt_chars_counts_characters_not_bytes_and_an_empty_object_as_cjson_sees_it() -> None:
    classes = [{"name": "long", "pool": "standard", "when": {"prompt_chars": {"ge": 3}}}]
    r = routing(classes=classes)
    assert classify(r, "POST", "/v1/completions", json.dumps({"prompt": "é🙂x"}).encode()).klass == "long"
    assert classify(r, "POST", "/v1/completions", json.dumps({"prompt": "é🙂"}).encode()).klass == "default"
    chat = {"messages": {}}  # cjson cannot tell {} from []: no messages, zero characters, not missing
    assert classify(r, "POST", "/v1/chat/completions", json.dumps(chat).encode()).missing == ()
    assert classify(r, "POST", "/v1/chat/completions", b'{"messages": {"a": 1}}').missing == ("prompt_chars",)
    assert classify(r, "POST", "/v1/completions", b'{"prompt": [1, 2, 3]}').missing == ("prompt_chars",)


# --- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"default_pool": "fast"}, "default_pool: no pool 'fast' (pools: speculative, standard)"),
        ({"admin_listen": "0.0.0.0:8081"}, "the admin location sets the flag; it listens on loopback only"),
        ({"listen": "8080"}, "'8080' is not host:port"),
        ({"pools": {"Spec": {"servers": ["127.0.0.1:1"]}}}, "pool name 'Spec'"),
        ({"max_body_size": "1KiB", "body_buffer_size": "2KiB"}, "body_buffer_size is larger than max_body_size"),
        ({"classes": [{"name": "default", "pool": "standard", "when": {"n": 2}}]}, "'default' is the router's own"),
        ({"classes": [{"name": "x", "pool": "standard", "when": {"temp": {"gt": 1}}}]}, "unknown field 'temp'"),
        ({"classes": [{"name": "x", "pool": "standard", "when": {"temperature": {"above": 1}}}]}, "unknown operator 'above'"),
        ({"classes": [{"name": "x", "pool": "standard", "when": {"temperature": {"gt": "1"}}}]}, "temperature is a number"),
        ({"classes": [{"name": "x", "pool": "standard", "when": {"stream": {"gt": True}}}]}, "stream is true or false"),
        ({"classes": [{"name": "x", "pool": "standard", "when": {"path": "/v1/embeddings"}}]}, "path is one of"),
        ({"classes": [{"name": "x", "pool": "standard", "when": {"model": {"in": []}}}]}, "non-empty list"),
        ({"classes": [{"name": "x", "pool": "gpu", "when": {"n": 2}}]}, "classes[0] (x): no pool 'gpu'"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_naming_the_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], message: str
) -> None:
    path = config_file(tmp_path, **changes)
    code, _, err = run(capsys, "render", "--config", str(path), "--out", str(tmp_path / "out"))
    assert code == 1
    first = err.splitlines()[0]
    assert re.match(rf"{re.escape(str(path))}:\d+: routing", first), first
    assert message in first
    assert not (tmp_path / "out").exists()  # nothing written


def test_no_routing_section_or_no_config_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "specguard.yaml"
    path.write_text("interval: 15s\n")
    code, _, err = run(capsys, "render", "--config", str(path), "--out", str(tmp_path / "out"))
    assert (code, "has no `routing:` section" in err) == (2, True)
    code, _, err = run(capsys, "classify", "--config", str(path))
    assert code == 2
    code, _, err = run(capsys, "render", "--out", str(tmp_path / "out"))
    assert (code, "give --config" in err) == (2, True)


# --- render ----------------------------------------------------------------------------------------


def test_render_writes_the_include_the_lua_and_the_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path)
    code, out, _ = run(capsys, "render", "--config", str(path), "--out", str(tmp_path / "out"))
    assert code == 0
    out_dir = (tmp_path / "out").resolve()
    assert out.split() == [str(out_dir / name) for name in (LUA, RULES, CONF)]
    rules = json.loads((out_dir / RULES).read_text())
    assert rules["fields"] == ["temperature", "max_tokens", "stream"]
    assert rules["classes"][2] == {
        "name": "short_unstreamed",
        "pool": "standard",
        "when": [{"field": "stream", "ops": [["eq", False]]}, {"field": "max_tokens", "ops": [["lt", 64]]}],
    }
    conf = (out_dir / CONF).read_text()
    assert f'"{tmp_path / "flag.json"}"' in conf  # the flag file, relative to the config's directory


def conf_of(r: RoutingConfig, tmp_path: Path, standalone: Standalone | None = None) -> str:
    render(r, tmp_path / "out", "specguard.yaml", standalone)
    return (tmp_path / "out" / CONF).read_text()


def test_the_body_is_kept_in_memory_up_to_the_largest_accepted(tmp_path: Path) -> None:
    conf = conf_of(routing(max_body_size="4MiB"), tmp_path)
    assert "client_max_body_size 4194304;" in conf
    assert "client_body_buffer_size 4194304;" in conf
    conf = conf_of(routing(max_body_size="4MiB", body_buffer_size="64KiB"), tmp_path)
    assert "client_body_buffer_size 65536;" in conf  # beyond it, a file the router reads


def test_streams_pass_unbuffered_to_named_upstreams_kept_alive(tmp_path: Path) -> None:
    conf = conf_of(routing(), tmp_path)
    upstream = re.search(r"upstream specguard_speculative \{(.*?)\}", conf, re.S)
    assert upstream is not None
    assert upstream.group(1).split(";")[:3] == [
        "\n    server 127.0.0.1:8000",
        "\n    server 127.0.0.1:8002",
        "\n    keepalive 32",
    ]
    for line in (
        "proxy_pass http://$specguard_upstream;",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "proxy_buffering off;",
        "access_by_lua_block",
        "add_header X-Specguard-Class $specguard_class always;",
        "class=$specguard_class pool=$specguard_pool",
    ):
        assert line in conf, line


def test_the_admin_server_listens_on_loopback_and_denies_everyone_else(tmp_path: Path) -> None:
    conf = conf_of(routing(admin_listen="[::1]:9081"), tmp_path)
    admin = conf[conf.index("# The flag and the router's metrics") :]
    assert "listen [::1]:9081;" in admin
    assert admin.index("allow 127.0.0.0/8;") < admin.index("allow ::1;") < admin.index("deny all;")
    assert "location = /specguard/flag" in admin and "location = /specguard/metrics" in admin


def test_standalone_writes_a_whole_nginx_conf_with_everything_under_the_directory(tmp_path: Path) -> None:
    render(routing(), tmp_path / "out", "specguard.yaml", Standalone(user="www-data", workers=2))
    main_conf = (tmp_path / "out" / MAIN).read_text()
    out = (tmp_path / "out").resolve()
    assert "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;" in main_conf
    assert "user www-data;" in main_conf and "worker_processes 2;" in main_conf
    assert f"include {out / CONF};" in main_conf
    assert f"pid {out / 'nginx.pid'};" in main_conf
    assert f'access_log "{out / "logs" / "access.log"}"' in (out / CONF).read_text()
    render(routing(), tmp_path / "out2", "specguard.yaml", Standalone(modules=None))
    assert "load_module" not in (tmp_path / "out2" / MAIN).read_text()


def test_render_refuses_standalone_options_without_standalone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path)
    code, _, err = run(
        capsys, "render", "--config", str(path), "--out", str(tmp_path / "o"), "--workers", "2"
    )
    assert (code, "go with --standalone" in err) == (2, True)


def test_render_says_why_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = config_file(tmp_path)
    (tmp_path / "file").write_text("")
    code, _, err = run(capsys, "render", "--config", str(path), "--out", str(tmp_path / "file" / "out"))
    assert code == 1
    assert err.startswith(f"specguard routing render: cannot write into {tmp_path / 'file' / 'out'}")


# --- classify --------------------------------------------------------------------------------------


def test_classify_reads_a_body_and_says_where_it_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path)
    body = tmp_path / "body.json"
    body.write_text('{"max_tokens": 10, "stream": true}')
    code, out, _ = run(capsys, "classify", "--config", str(path), str(body))
    assert code == 0
    assert out.splitlines() == [
        "class short → pool standard",
        "missing: temperature (a condition on a missing field does not hold)",
    ]
    code, out, _ = run(capsys, "classify", "--config", str(path), "--engaged", "--json", str(body))
    assert json.loads(out) == {
        "class": "short", "pool": "standard", "malformed": None, "missing": ["temperature"], "fallback": True,
    }  # fmt: skip
    code, _, err = run(capsys, "classify", "--config", str(path), str(tmp_path / "nope.json"))
    assert (code, "cannot read" in err) == (2, True)
