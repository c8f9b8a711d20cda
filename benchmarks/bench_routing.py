"""The latency the router's Lua adds to a request: nginx running `specguard routing render`'s
standalone configuration, against a plain ``proxy_pass`` server block included into the same nginx
(same worker, same upstream, same keepalive, body and proxy buffering settings; only the Lua
differs: its body read and parse, classes, headers and counters).

The upstream is a ``return 200`` location of that same nginx, so that nothing but the two front
servers' own work differs and the Lua's share is visible. The load generator sends one request at a
time, alternating routed and plain on two keep-alive connections (the order swapped every pair, so
the machine's load hits both alike), and times each request from its first byte sent to its whole
answer read. Bodies are valid OpenAI completion requests whose prompt makes them 1 KiB and 64 KiB;
``max_body_size`` (and so ``client_body_buffer_size``) is 1 MiB, so both stay in memory and the
router parses them whole. The classes are the playbook's three and one on ``prompt_chars`` (which
makes the router count the prompt's characters, byte by byte, the most it does), with an ASCII
prompt and one that is not; the requests match none of
them and go to the default pool, every class tested.

Result: p50 and p99 of each, and the added p50 and p99 (routed minus plain), per round; the median
round and the spread across rounds. Target: p99 added at most 1 ms for 1 KiB bodies. Run:
    .venv/bin/python benchmarks/bench_routing.py [--write benchmarks/results/routing_latency.md]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ports import free_ports

from specguard.config.routing import RoutingConfig
from specguard.playbook.routing.nginx_test import lua_modules
from specguard.playbook.routing.render import CONF, MAIN, Standalone, render
from specguard.playbook.routing.running import NginxError, RunningNginx

SIZES = (1024, 64 * 1024)
PLAIN = "bench-plain.conf"


def routing(listen: int, admin: int, upstream: int, flag_file: Path, chars: bool) -> RoutingConfig:
    """The playbook's three classes; with ``chars``, one on ``prompt_chars`` after them."""
    server = f"127.0.0.1:{upstream}"
    classes: list[dict[str, Any]] = [
        {"name": "high_temperature", "pool": "standard", "when": {"temperature": {"gt": 1.0}}},
        {"name": "short", "pool": "standard", "when": {"max_tokens": {"lt": 32}}},
        {"name": "short_unstreamed", "pool": "standard", "when": {"stream": False, "max_tokens": {"lt": 64}}},
    ]
    if chars:
        classes.append({"name": "long_prompt", "pool": "standard", "when": {"prompt_chars": {"gt": 200_000}}})
    return RoutingConfig.model_validate(
        {
            "listen": f"127.0.0.1:{listen}",
            "admin_listen": f"127.0.0.1:{admin}",
            "flag_file": str(flag_file),
            "max_body_size": "1MiB",
            "pools": {"speculative": {"servers": [server]}, "standard": {"servers": [server]}},
            "default_pool": "speculative",
            "fallback_pool": "standard",
            "classes": classes,
        }
    )


def plain_conf(config: RoutingConfig, plain: int, upstream: int, log: Path) -> str:
    """The baseline front server (the routed server's settings without the Lua) and the upstream."""
    return f"""
upstream bench_plain {{
    server 127.0.0.1:{upstream};
    keepalive 32;
}}
server {{
    listen 127.0.0.1:{plain};
    access_log {log} combined;
    client_max_body_size {config.max_body_size};
    client_body_buffer_size {config.buffer_size};
    client_body_in_single_buffer on;
    location / {{
        proxy_pass http://bench_plain;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_buffering off;
        proxy_cache off;
    }}
}}
server {{
    listen 127.0.0.1:{upstream};
    access_log off;
    client_max_body_size {config.max_body_size};
    location / {{
        default_type application/json;
        return 200 '{{"id":"cmpl-bench","object":"text_completion","choices":[{{"index":0,"text":"ok"}}]}}';
    }}
}}
"""


ASCII = "the quick brown fox jumps over the lazy dog "
NOT_ASCII = "über größere Straßen läuft ein naïver Fuchs "


def body(size: int, words: str = ASCII) -> bytes:
    """A completion request of ``size`` bytes (UTF-8, not escaped): its prompt fills it."""
    request = {"model": "tiny-llama", "prompt": "", "max_tokens": 128, "temperature": 0.7, "stream": False}

    def encoded(prompt: str) -> bytes:
        return json.dumps({**request, "prompt": prompt}, ensure_ascii=False).encode()

    repeats = max(0, (size - len(encoded(""))) // len(words.encode()))
    while repeats and len(encoded(words * repeats)) > size:
        repeats -= 1
    prompt = words * repeats
    prompt += "x" * (size - len(encoded(prompt)))
    data = encoded(prompt)
    assert len(data) == size, len(data)
    return data


def send(connection: http.client.HTTPConnection, data: bytes) -> tuple[float, str | None]:
    """One request; (seconds, the X-Specguard-Pool it came back with)."""
    began = time.perf_counter()
    connection.request("POST", "/v1/completions", data, {"Content-Type": "application/json"})
    answer = connection.getresponse()
    answer.read()
    seconds = time.perf_counter() - began
    if answer.status != 200:
        sys.exit(f"HTTP {answer.status} from {connection.host}:{connection.port}")
    return seconds, answer.getheader("X-Specguard-Pool")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_round(
    routed: http.client.HTTPConnection, plain: http.client.HTTPConnection, data: bytes, pairs: int
) -> dict[str, float]:
    times: dict[str, list[float]] = {"routed": [], "plain": []}
    for i in range(pairs):
        order = (
            (("routed", routed), ("plain", plain)) if i % 2 == 0 else (("plain", plain), ("routed", routed))
        )
        for name, connection in order:
            seconds, pool = send(connection, data)
            if name == "routed" and pool != "speculative":
                sys.exit(f"the routed request went to pool {pool!r}, not the default pool")
            times[name].append(seconds)
    return {
        f"{name} {label}": quantile(values, q)
        for name, values in times.items()
        for label, q in (("p50", 0.5), ("p99", 0.99))
    }


VARIANTS = {  # name: (a class on prompt_chars, the prompt's words)
    "the playbook's three classes": (False, ASCII),
    "the three and a prompt_chars class": (True, ASCII),
    "the three and a prompt_chars class, a prompt not all ASCII": (True, NOT_ASCII),
}
Results = dict[int, list[dict[str, float]]]


def run_variant(
    binary: str, modules: Path | None, chars: bool, words: str, rounds: int, pairs: int
) -> Results:
    """One nginx with the routed and the plain server; the rounds measured against it."""
    listen, admin, plain, upstream = free_ports(4)
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        out = Path(tmp)
        config = routing(listen, admin, upstream, out / "flag.json", chars)
        user = "root" if os.geteuid() == 0 else None  # the workers must reach the 0700 directory
        render(config, out, "bench_routing.py", Standalone(modules=modules, user=user, workers=1))
        (out / PLAIN).write_text(plain_conf(config, plain, upstream, out / "logs" / "plain.log"))
        main_conf = (out / MAIN).read_text()
        include = f"    include {out / CONF};\n"
        assert include in main_conf
        (out / MAIN).write_text(main_conf.replace(include, include + f"    include {out / PLAIN};\n"))
        nginx = RunningNginx(binary, out, [f"127.0.0.1:{port}" for port in (listen, admin, plain, upstream)])
        try:
            nginx.start()
        except NginxError as exc:
            sys.exit(str(exc))
        try:
            return measure(listen, plain, rounds, pairs, words)
        finally:
            nginx.stop()


def measure(listen: int, plain: int, rounds: int, pairs: int, words: str) -> Results:
    routed_c = http.client.HTTPConnection("127.0.0.1", listen, timeout=10)
    plain_c = http.client.HTTPConnection("127.0.0.1", plain, timeout=10)
    bodies = {size: body(size, words) for size in SIZES}
    for size in SIZES:  # warm-up: connections, the upstream's keepalive, Lua's compiled paths
        one_round(routed_c, plain_c, bodies[size], 200)
    results: Results = {size: [] for size in SIZES}
    for _ in range(rounds):
        for size in SIZES:
            figures = one_round(routed_c, plain_c, bodies[size], pairs)
            for q in ("p50", "p99"):
                figures[f"added {q}"] = figures[f"routed {q}"] - figures[f"plain {q}"]
            results[size].append(figures)
    routed_c.close()
    plain_c.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--pairs", type=int, default=5000, help="routed and plain requests per round and size"
    )
    parser.add_argument("--write", type=Path, help="also write the results to this markdown file")
    args = parser.parse_args()
    binary = shutil.which("nginx")
    modules = lua_modules(binary) if binary else "nginx is not installed"
    if binary is None or isinstance(modules, str):
        sys.exit(f"bench_routing needs nginx with its Lua module and lua-cjson: {modules}")
    version = subprocess.run([binary, "-v"], capture_output=True, text=True).stderr.strip()
    began = time.monotonic()
    results = {
        name: run_variant(binary, modules, chars, words, args.rounds, args.pairs)
        for name, (chars, words) in VARIANTS.items()
    }
    write(results, args, version.removeprefix("nginx version: "), time.monotonic() - began)


def write(results: dict[str, Results], args: argparse.Namespace, version: str, seconds: float) -> None:
    ms = 1000.0
    lines = [
        "# The router's added latency (nginx + Lua against a plain proxy_pass)",
        "",
        f"{version}, one worker process; the routed server rendered by `specguard routing render` "
        "(standalone), a plain `proxy_pass` server block included into the same nginx, both to one "
        "upstream, a `return 200` location of that nginx, with keepalive 32. One request at a time, "
        f"routed and plain alternating on two keep-alive connections: {args.pairs} of each per round and "
        f"body size, {args.rounds} rounds, for each set of classes (an nginx of its own each). Bodies: "
        "valid completion requests, the prompt filling them, matching no class (every class tested); "
        "max_body_size 1 MiB (client_body_buffer_size the same), so the 64 KiB body stays in memory. "
        f"Python {platform.python_version()} client (http.client), {platform.machine()}, "
        f"{os.cpu_count()} cores shared with other work; {seconds:.0f} s in all. Milliseconds: the median "
        "round, then the lowest and highest round; added = routed minus plain, per round.",
        "",
        "| classes | body | plain p50 | routed p50 | added p50 | plain p99 | routed p99 | added p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for name, variant in results.items():
        for size, rounds in variant.items():
            cells = []
            for key in ("plain p50", "routed p50", "added p50", "plain p99", "routed p99", "added p99"):
                values = [r[key] * ms for r in rounds]
                cells.append(f"{statistics.median(values):.3f} ({min(values):.3f} to {max(values):.3f})")
            lines.append(f"| {name} | {size // 1024} KiB | " + " | ".join(cells) + " |")
            if size == 1024:
                added = statistics.median(r["added p99"] for r in rounds) * ms
                worst = max(r["added p99"] for r in rounds) * ms
                verdicts.append(
                    f"{name}: {'met' if added <= 1.0 else 'NOT met'}, {added:.3f} ms in the median round, "
                    f"{worst:.3f} ms in the worst"
                )
    lines += ["", "Target: p99 added at most 1 ms for 1 KiB bodies. " + "; ".join(verdicts) + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text)


if __name__ == "__main__":
    main()
