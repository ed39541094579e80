"""Prometheus metrics of the server and the batched engine, in a registry of their own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from speclm.engine.engine import Engine
from speclm.engine.request import GenerationStats, SequenceOutput

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """Counters, gauges and latency histograms exposed at /metrics; also the engine's observer."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "speclm_requests",
            "HTTP generation requests by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter("speclm_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter("speclm_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(
            "speclm_time_to_first_token_seconds",
            "Arrival to first generated token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "speclm_inter_token_latency_seconds",
            "Time between a sequence's committed tokens",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.running = Gauge("speclm_num_requests_running", "Sequences in the running queue", registry=r)
        self.waiting = Gauge("speclm_num_requests_waiting", "Sequences waiting (new or preempted)", registry=r)
        self.blocks_used = Gauge("speclm_kv_blocks_used", "KV blocks referenced by live sequences", registry=r)
        self.blocks_total = Gauge("speclm_kv_blocks_total", "KV blocks in the pool", registry=r)
        self.prefix_queried = Gauge(
            "speclm_prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache", registry=r
        )
        self.prefix_hits = Gauge(
            "speclm_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache", registry=r
        )
        self.prefix_hit_rate = Gauge(
            "speclm_prefix_cache_hit_rate", "prefix_cache_hit_tokens / queried_tokens", registry=r
        )
        self.preemptions = Gauge("speclm_num_preemptions", "Sequences preempted for recompute so far", registry=r)
        self.drafted = Counter(
            "speclm_spec_drafted_tokens", "Speculative tokens verified, by draft position", ["position"], registry=r
        )
        self.accepted = Counter(
            "speclm_spec_accepted_tokens", "Speculative tokens accepted, by draft position", ["position"], registry=r
        )
        self.steps = Counter("speclm_engine_steps", "Batched engine steps", registry=r)
        # Of finished requests: tau is decode_tokens / decode_steps; the grammar's share of the tokens
        # and of the time (structured outputs and tool calls).
        self.decode_steps = Counter(
            "speclm_decode_steps", "Target passes after prefill, of finished requests", registry=r
        )
        self.decode_tokens = Counter(
            "speclm_decode_tokens", "Tokens committed by those passes, of finished requests", registry=r
        )
        self.constrained_tokens = Counter(
            "speclm_grammar_tokens", "Generated tokens of finished constrained requests", registry=r
        )
        self.forced_tokens = Counter(
            "speclm_grammar_forced_tokens",
            "Generated tokens the grammar forced (proposed as free drafts), of finished requests",
            registry=r,
        )
        self.grammar_seconds = Counter(
            "speclm_grammar_seconds",
            "Time in grammar work (masks, matcher, masking logits) of finished constrained requests",
            registry=r,
        )
        self.in_flight = Gauge("speclm_num_requests_in_flight", "HTTP generation requests being served", registry=r)

    def on_step(self, engine: Engine, outputs: list[SequenceOutput], seconds: float) -> None:
        self.steps.inc()
        self.generation_tokens.inc(sum(len(o.token_ids) for o in outputs))
        for o in outputs:
            for i in range(o.num_drafted if o.draft_depth is None else o.draft_depth):  # a tree: per depth
                self.drafted.labels(str(i)).inc()
                if i < o.num_accepted:
                    self.accepted.labels(str(i)).inc()
            if o.output is not None:
                self._finished(o.output.stats)
        self.update_engine(engine)

    def _finished(self, stats: GenerationStats) -> None:
        self.decode_steps.inc(stats.decode_steps)
        self.decode_tokens.inc(stats.decode_tokens)
        self.forced_tokens.inc(stats.forced_tokens)
        if stats.grammar_seconds > 0:  # a constrained request (any grammar work takes some time)
            self.constrained_tokens.inc(stats.completion_tokens)
            self.grammar_seconds.inc(stats.grammar_seconds)

    def on_token_times(self, ttft: list[float], itl: list[float]) -> None:
        for t in ttft:
            self.ttft.observe(t)
        for t in itl:
            self.itl.observe(t)

    def update_engine(self, engine: Engine | None, in_flight: int | None = None) -> None:
        """Refresh the gauges that mirror engine state (and the server's requests in flight); no engine
        (a deployment's coordinator: the engine runs in the target service) leaves them unset."""
        if in_flight is not None:
            self.in_flight.set(in_flight)
        if engine is None:
            return
        blocks = engine.block_manager
        self.running.set(len(engine.scheduler.running))
        self.waiting.set(len(engine.scheduler.waiting))
        self.blocks_used.set(blocks.num_used_blocks)
        self.blocks_total.set(blocks.num_blocks)
        self.prefix_queried.set(blocks.stats.queried_tokens)
        self.prefix_hits.set(blocks.stats.hit_tokens)
        self.prefix_hit_rate.set(blocks.stats.hit_rate)
        self.preemptions.set(engine.scheduler.num_preemptions)

    def render(self) -> bytes:
        return generate_latest(self.registry)
