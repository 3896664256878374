"""Prometheus metrics: counters fed by runtime and agent observers, served at GET /metrics."""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

if TYPE_CHECKING:
    from .agent import Agent
    from .runtime import Runtime

Route = tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]
LABEL_VALUES_MAX = 200
"""Distinct values one label of one metric may take; later new ones count as "other"."""


class Metrics:
    """One registry per bot (so in-process tests and several bots never share counters)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], set[str]] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.inbound = Counter(
            "bub_inbound_messages",
            "Inbound messages by channel and outcome",
            ["channel", "outcome"],
            registry=r,
        )
        self.turns = Counter("bub_turns", "Finished turns by outcome", ["outcome"], registry=r)
        self.model_calls = Counter(
            "bub_model_calls", "Model calls by outcome", ["outcome"], registry=r
        )
        self.model_latency = Histogram(
            "bub_model_latency_seconds",
            "Model call latency",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 60, 120),
            registry=r,
        )
        self.tokens = Counter("bub_tokens", "Model tokens by direction", ["direction"], registry=r)
        # Usage (issue 23): bounded labels only (channels and configured models, no user ids).
        self.usage_tokens = Counter(
            "bub_usage_tokens",
            "Model tokens charged to budgets by channel, model and direction",
            ["channel", "model", "direction"],
            registry=r,
        )
        self.usage_cost = Counter(
            "bub_usage_cost_dollars",
            "Model cost in US dollars (BUB_MODEL_PRICES) by channel and model",
            ["channel", "model"],
            registry=r,
        )
        self.refusals = Counter(
            "bub_refusals",
            "Messages and model calls refused by a limit, by reason",
            ["reason"],
            registry=r,
        )
        self.tool_calls = Counter(
            "bub_tool_calls", "Tool calls by tool and outcome", ["tool", "outcome"], registry=r
        )
        self.spills = Counter(
            "bub_spills", "Tool outputs spilled to the sidecar", ["outcome"], registry=r
        )
        self.auto_handoffs = Counter("bub_auto_handoffs", "Context-overflow handoffs", registry=r)
        self.subagents = Counter(
            "bub_subagents",
            "Subagent runs by session mode (temp, inherit, named) and how they ended",
            ["mode", "status"],
            registry=r,
        )
        self.replies = Counter(
            "bub_replies", "Reply pieces by channel and outcome", ["channel", "outcome"], registry=r
        )
        self.commands = Counter("bub_commands", "Chat commands run", ["command"], registry=r)
        self.first_text = Histogram(
            "bub_first_text_seconds",
            "Time from the start of a turn to the first text of its answer the user sees"
            " (streamed: the first update; else the first piece delivered)",
            ["channel", "streamed"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 60, 120),
            registry=r,
        )
        self.running_turns = Gauge(
            "bub_running_turns", "Sessions with a turn in progress", registry=r
        )
        self.leases_held = Gauge(
            "bub_leases_held",
            "Leases this replica holds (sessions it runs and jobs it leads; several replicas)",
            registry=r,
        )
        self.lease_events = Counter(
            "bub_lease_events",
            "Session leases taken by how (acquired: new work; takeover: lapsed, its replica"
            " died; handover: another replica shut down) and leases lost",
            ["outcome"],
            registry=r,
        )
        self.leading = Gauge(
            "bub_leading",
            "1 while this replica runs a one-replica job (e.g. telegram:poller:<bot id>)",
            ["job"],
            registry=r,
        )
        self.job_delay = Histogram(
            "bub_job_delay_seconds",
            "Due jobs fired, by kind and outcome (fired: its entry written; noted: a note"
            " instead; skipped: nothing written): time from the due time to the commit",
            ["kind", "outcome"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 30, 300, 3600),
            registry=r,
        )
        self.last_inbound = Gauge(
            "bub_seconds_since_last_inbound",
            "Seconds since the last inbound message",
            ["channel"],
            registry=r,
        )

    def _bound(self, metric: str, *values: Any) -> list[str]:
        """`values` as label values, each label of `metric` limited to LABEL_VALUES_MAX
        distinct values (every label set stays bounded, whatever feeds it)."""
        out = []
        for index, value in enumerate(values):
            text = str(value)[:100]
            seen = self._seen.setdefault((metric, index), set())
            if text not in seen:
                if len(seen) >= LABEL_VALUES_MAX:
                    text = "other"
                seen.add(text)
            out.append(text)
        return out

    # -- observers -----------------------------------------------------------------------------
    def on_runtime(self, event: str, data: dict[str, Any]) -> None:
        if event == "inbound":
            self.inbound.labels(
                *self._bound("inbound", data.get("channel", ""), data.get("outcome", ""))
            ).inc()
        elif event == "turn":
            self.turns.labels(*self._bound("turns", data.get("outcome", ""))).inc()
        elif event == "reply":
            self.replies.labels(
                *self._bound("replies", data.get("channel", ""), data.get("outcome", ""))
            ).inc()
        elif event == "command":
            self.commands.labels(*self._bound("commands", data.get("name", ""))).inc()
        elif event == "refusal":
            self.refusals.labels(*self._bound("refusals", data.get("reason", ""))).inc()
        elif event == "lease":
            self.lease_events.labels(*self._bound("leases", data.get("outcome", ""))).inc()
        elif event == "leader":
            leading = 1 if data.get("outcome") == "acquired" else 0
            self.leading.labels(*self._bound("leading", data.get("job", ""))).set(leading)
        elif event == "job":
            labels = (data.get("kind", ""), data.get("outcome", ""))
            self.job_delay.labels(*self._bound("jobs", *labels)).observe(
                max(0.0, data.get("delay", 0.0))
            )
        elif event == "first_text":
            streamed = "yes" if data.get("streamed") else "no"
            self.first_text.labels(
                *self._bound("first_text", data.get("channel", ""), streamed)
            ).observe(data["seconds"])

    def on_agent(self, event: str, data: dict[str, Any]) -> None:
        if event == "model_call":
            ok = data.get("ok", True)
            self.model_calls.labels("ok" if ok else "error").inc()
            if "latency_ms" in data:
                self.model_latency.observe(data["latency_ms"] / 1000)
            usage = data.get("usage") or {}
            self.tokens.labels("in").inc(usage.get("prompt_tokens") or 0)
            self.tokens.labels("out").inc(usage.get("completion_tokens") or 0)
        elif event == "usage":
            labels = self._bound("usage", data.get("channel", ""), data.get("model", ""))
            self.usage_tokens.labels(*labels, "in").inc(data.get("tokens_in", 0))
            self.usage_tokens.labels(*labels, "out").inc(data.get("tokens_out", 0))
            self.usage_cost.labels(*labels).inc(data.get("cost", 0) / 1_000_000)
        elif event == "refusal":
            self.refusals.labels(*self._bound("refusals", data.get("reason", ""))).inc()
        elif event == "tool_call":
            outcome = "ok" if data.get("ok") else "error"
            self.tool_calls.labels(*self._bound("tools", data.get("tool", ""), outcome)).inc()
        elif event == "spill":
            self.spills.labels("ok" if data.get("ok") else "failed").inc()
        elif event == "auto_handoff":
            self.auto_handoffs.inc()
        elif event == "subagent":
            labels = self._bound("subagents", data.get("mode", ""), data.get("status", ""))
            self.subagents.labels(*labels).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def install(
    runtime: Runtime, agent: Agent, channels: Iterable[str], token: str | None
) -> tuple[Metrics, Route]:
    """Feed the runtime's and agent's events into counters; returns them and the
    GET /metrics route (`token`: the bearer token it requires, if any)."""
    metrics = Metrics()
    runtime.observers.append(metrics.on_runtime)
    agent.hooks.append(metrics.on_agent)
    metrics.running_turns.set_function(lambda: runtime.running_turns)
    metrics.leases_held.set_function(lambda: runtime.lease_keeper.held)
    for name in channels:

        def age(name: str = name) -> float:
            last = runtime.last_inbound.get(name)
            return float("nan") if last is None else time.monotonic() - last

        metrics.last_inbound.labels(name).set_function(age)

    async def handler(request: web.Request) -> web.Response:
        if token:
            # surrogatepass: aiohttp decodes bytes that are not UTF-8 to lone surrogates.
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogatepass")
            if not hmac.compare_digest(given, f"Bearer {token}".encode()):
                return web.json_response({"error": "unauthorized"}, status=401)
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return metrics, ("GET", "/metrics", handler)
