"""diagnose case 2, acceptance collapsing on some classes only: per class from the router's pools
(history's route: components and each pool's servers) or from a bench result; the rule (far below:
under 0.5 and under half the rest's pooled acceptance, 200 drafts each); the routing rule printed,
which config/routing.py takes and which sends the class's requests to the fallback pool."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from specguard.config.routing import RoutingConfig
from specguard.playbook.diagnose.classes import MIN_DRAFTS, judge
from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Finding, Verdict
from specguard.playbook.diagnose.reroute import reroute
from specguard.playbook.routing.classify import classify
from specguard.store.history import Span, route_key

START = 1_796_000_040
CHAT, CREATIVE, STANDARD = "127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"
ROUTER = "127.0.0.1:9001"
SECTION: dict[str, Any] = {
    "flag_file": "/var/lib/specguard/routing-flag.json",
    "pools": {
        "chat": {"servers": [CHAT]},
        "creative": {"servers": [CREATIVE]},
        "standard": {"servers": [STANDARD]},
    },
    "default_pool": "chat",
    "fallback_pool": "standard",
    "classes": [
        {"name": "creative", "pool": "creative", "when": {"temperature": {"ge": 0.9}}},
        {"name": "short", "pool": "standard", "when": {"max_tokens": {"lt": 32}}},
    ],
}
ROUTING = RoutingConfig.model_validate(SECTION)


def drafted(rate: float, drafts: float, k: int = 4) -> dict[str, float]:
    """A server's window: ``drafts`` drafts of k tokens, ``rate`` of them accepted."""
    return {
        "drafts": drafts,
        "draft_tokens": drafts * k,
        "accepted": rate * drafts * k,
        "generation_tokens": 1.0,
    }


def window(
    chat: float = 0.8,
    creative: float = 0.1,
    drafts: float = 1000,
    sent: Mapping[tuple[str, str], float] | None = None,
    routing: RoutingConfig | None = ROUTING,
    bench: dict[str, Any] | None = None,
) -> Evidence:
    sent = sent or {("chat", "default"): 500, ("creative", "creative"): 120, ("standard", "short"): 80,
                    ("chat", "other"): 5}  # fmt: skip
    route_parts = {route_key("n", pool, cls): n for (pool, cls), n in sent.items()}
    return Evidence(
        "history", START, START + 3600,
        servers={
            (CHAT, "m"): [Span(START, 60, drafted(chat, drafts))],
            (CREATIVE, "m"): [Span(START, 60, drafted(creative, drafts))],
            (STANDARD, "m"): [Span(START, 60, {"generation_tokens": 4000.0})],
        },
        routes={ROUTER: [Span(START, 60, route_parts)]},
        routing=routing,
        bench=bench,
    )  # fmt: skip


def values(found: Finding, name: str) -> dict[str, Any]:
    return {f.scope: f.value for f in found.figures if f.name == name}


def applied(rule: str) -> RoutingConfig:
    """The config's routing section with the printed rule pasted in."""
    section = yaml.safe_load(rule)["routing"]
    return RoutingConfig.model_validate({**SECTION, **section})


def pool_of(routing: RoutingConfig, body: dict[str, Any]) -> str:
    return classify(routing, "POST", "/v1/completions", json.dumps(body).encode()).pool


async def test_one_pools_class_collapsing_is_the_cause_and_the_rule_sends_it_to_standard() -> None:
    found = await judge(window(chat=0.8, creative=0.1))
    assert found.verdict is Verdict.CAUSE_FOUND
    assert found.summary.startswith("collapses on class creative (pool creative) (router)")
    assert values(found, "acceptance_rate") == {
        "class default (pool chat)": 0.8,
        "class creative (pool creative)": 0.1,
    }
    assert values(found, "rest_acceptance_rate")["class creative (pool creative)"] == 0.8
    rule = str(found.details["routing_rule"])
    assert rule in found.remedy
    after = applied(rule)
    hot = {"model": "m", "prompt": "a poem", "temperature": 1.2, "max_tokens": 100}
    assert pool_of(ROUTING, hot) == "creative"
    assert pool_of(after, hot) == "standard"
    assert pool_of(after, {"model": "m", "prompt": "hi", "temperature": 0, "max_tokens": 100}) == "chat"
    assert [c.name for c in after.classes] == ["creative", "short"]  # the order kept
    assert "# was creative; diagnose: acceptance 0.10, far below the rest" in rule


async def test_a_collapse_of_the_default_class_moves_the_default_pool() -> None:
    found = await judge(window(chat=0.1, creative=0.8))
    assert found.verdict is Verdict.CAUSE_FOUND
    after = applied(str(found.details["routing_rule"]))
    assert after.default_pool == "standard"
    assert pool_of(after, {"model": "m", "prompt": "hi", "temperature": 1.2, "max_tokens": 100}) == "creative"


async def test_low_but_not_far_below_is_suspect_with_no_rule() -> None:
    found = await judge(window(chat=0.55, creative=0.4))  # under 0.5, under 0.75 x 0.55, over half of it
    assert found.verdict is Verdict.SUSPECT
    assert "routing_rule" not in found.details
    assert "class creative (pool creative) 0.40 against 0.55" in found.summary


async def test_classes_alike_are_fine_even_when_all_are_low() -> None:
    for chat, creative in ((0.8, 0.7), (0.25, 0.2)):
        found = await judge(window(chat=chat, creative=creative))
        assert found.verdict is Verdict.FINE, (chat, creative)
        assert found.remedy == ()


async def test_a_class_with_too_few_drafts_is_not_judged_and_said_so_beside_a_fine_verdict() -> None:
    evidence = window(chat=0.8, creative=0.75)
    servers = {**evidence.servers, ("127.0.0.1:8004", "m"): [Span(START, 60, drafted(0.02, 50))]}
    routing = RoutingConfig.model_validate(
        {**SECTION, "pools": {**SECTION["pools"], "poems": {"servers": ["127.0.0.1:8004"]}}}
    )
    routes = {
        ROUTER: [Span(START, 60, {**evidence.routes[ROUTER][0].parts, route_key("n", "poems", "poems"): 3})]
    }
    found = await judge(Evidence("history", START, START + 3600, servers, routes, routing=routing))
    assert found.verdict is Verdict.FINE
    assert found.missing == (
        "router: too few drafts to judge (at least 200 each): class poems (pool poems) 50",
    )


async def test_too_few_drafts_is_unknown_never_fine() -> None:
    found = await judge(window(chat=0.8, creative=0.05, drafts=MIN_DRAFTS - 1))
    assert found.verdict is Verdict.UNKNOWN
    assert any("too few drafts" in line and "199" in line for line in found.missing)


async def test_classes_sharing_one_speculative_pool_have_no_acceptance_of_their_own() -> None:
    sent = {("chat", "default"): 500, ("chat", "creative"): 120}
    evidence = window(sent=sent)
    servers = dict(evidence.servers)
    del servers[(CREATIVE, "m")]
    found = await judge(
        Evidence(evidence.source, evidence.start, evidence.end, servers, evidence.routes, routing=ROUTING)
    )
    assert found.verdict is Verdict.UNKNOWN
    assert any("share one acceptance" in line for line in found.missing)


async def test_without_a_routing_section_or_router_series_it_says_what_is_missing() -> None:
    found = await judge(window(routing=None))
    assert found.verdict is Verdict.UNKNOWN
    assert any("no routing: section" in line for line in found.missing)
    assert any("bench: none given" in line for line in found.missing)
    bare = window()
    found = await judge(Evidence(bare.source, bare.start, bare.end, bare.servers, {}, routing=ROUTING))
    assert any("no router series" in line for line in found.missing)


async def test_a_pool_whose_servers_are_not_in_the_series_is_said() -> None:
    other = RoutingConfig.model_validate(
        {**SECTION, "pools": {**SECTION["pools"], "creative": {"servers": ["10.0.0.9:8000"]}}}
    )
    found = await judge(window(routing=other))
    assert found.verdict is Verdict.UNKNOWN
    assert any("pool creative: none of its servers (10.0.0.9:8000)" in line for line in found.missing)


# --- a bench result ------------------------------------------------------------------------------


def acceptance(rate: float, drafts: int, k: int = 4) -> dict[str, Any]:
    """A phase's acceptance as `specguard bench --json` writes it (playbook/bench/stats.acceptance)."""
    accepted = round(rate * drafts * k)
    return {"rate": accepted / (drafts * k), "mean_acceptance_length": 1 + accepted / drafts,
            "per_position": [], "drafts": drafts, "draft_tokens": drafts * k, "accepted_tokens": accepted}  # fmt: skip


def bench(phases: dict[str, Any], routed: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "server": {"url": "http://127.0.0.1:8080", "model": "tiny-llama", "draft_positions": 4},
        "phases": {name: {"summary": {}, "acceptance": a, "server": {}} for name, a in phases.items()},
    }
    if routed is not None:
        out["routing"] = {"classes": routed}
    return out


async def test_bench_routing_classes_with_phases_of_their_own_name_the_class() -> None:
    routed = {
        "default": {"requests": 40, "pool": "chat", "phases": ["plain"], "acceptance": acceptance(0.78, 900)},
        "creative": {
            "requests": 40,
            "pool": "creative",
            "phases": ["hot"],
            "acceptance": acceptance(0.06, 1500),
        },
        "short": {"requests": 10, "pool": "standard", "phases": ["brief"], "acceptance": None},
    }
    phases = {
        "plain": acceptance(0.78, 900),
        "hot": acceptance(0.06, 1500),
        "brief": {"error": "no drafts during the run", "drafts": 0},
    }
    found = await judge(window(routing=ROUTING, sent={("chat", "default"): 1}, bench=bench(phases, routed)))
    assert found.verdict is Verdict.CAUSE_FOUND
    assert "(bench)" in found.summary
    assert values(found, "acceptance_rate")["class creative (pool creative)"] == 0.06
    assert (
        pool_of(
            applied(str(found.details["routing_rule"])), {"model": "m", "prompt": "x", "temperature": 1.0}
        )
        == "standard"
    )


async def test_bench_prompt_classes_get_a_rule_on_a_model_name_the_router_can_read() -> None:
    phases = {
        "chat": acceptance(0.7, 800),
        "code": acceptance(0.72, 800),
        "multilingual": acceptance(0.12, 800),
    }
    found = await judge(window(routing=None, bench=bench(phases)))
    assert found.verdict is Verdict.CAUSE_FOUND
    assert "prompt class multilingual" in found.summary
    assert abs(values(found, "rest_acceptance_rate")["prompt class multilingual"] - 0.71) < 1e-9
    rule = str(found.details["routing_rule"])
    section = yaml.safe_load(rule)["routing"]
    assert section["classes"] == [
        {"name": "multilingual", "pool": "standard", "when": {"model": "tiny-llama-multilingual"}}
    ]
    assert any("--served-model-name tiny-llama tiny-llama-<class>" in step for step in found.remedy)
    assert "routing_rule_problems" not in found.details


async def test_bench_phases_without_acceptance_say_why() -> None:
    phases = {
        "chat": {"error": "the server's counters went back during the run (it restarted)"},
        "code": None,
    }
    found = await judge(window(routing=None, bench=bench(phases)))
    assert found.verdict is Verdict.UNKNOWN
    assert any("bench: prompt class chat: the server's counters went back" in line for line in found.missing)


# --- the rule's YAML --------------------------------------------------------------------------------


def test_names_yaml_would_read_as_booleans_are_quoted_and_read_back_as_given() -> None:
    section = {**SECTION, "pools": {**SECTION["pools"], "on": {"servers": ["127.0.0.1:8009"]}},
               "classes": [{"name": "yes", "pool": "on", "when": {"n": {"ge": 2}, "stream": True}}]}  # fmt: skip
    routing = RoutingConfig.model_validate(section)
    rule = reroute(routing, ["yes"], {}, {"yes": "why"})
    assert rule.problems == ()
    assert '- name: "yes"' in rule.text
    after = RoutingConfig.model_validate({**section, **yaml.safe_load(rule.text)["routing"]})
    assert [(c.name, c.pool, c.when) for c in after.classes] == [("yes", "standard", routing.classes[0].when)]


def test_a_prompt_class_name_the_router_cannot_take_is_made_one_it_can() -> None:
    rule = reroute(None, [], {"long context": {"model": "m-long"}, "default": {"model": "m-default"}}, {})
    names = [c["name"] for c in yaml.safe_load(rule.text)["routing"]["classes"]]
    assert names == ["long_context", "default_prompts"]
    assert rule.problems == ()


def test_what_cannot_be_written_is_said() -> None:
    rule = reroute(ROUTING, ["nosuch", "short"], {}, {})
    assert rule.text == ""  # nothing would change: no rule to paste
    assert rule.problems == (
        "class nosuch: the config's routing section has no class of that name, so its conditions are unknown",
        "class short already goes to the fallback pool standard, whose servers speculate: turn speculation "
        "off there, or name another pool",
    )
    assert reroute(None, ["default"], {}, {}).problems == (
        "class default: the config has no routing section whose default_pool to change",
    )
