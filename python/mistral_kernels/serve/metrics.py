"""Prometheus metrics of the server (``GET /metrics``, text format), prefixed ``mistral_kernels_``.

=========================================  =========  ===================================================
name                                       kind       meaning
=========================================  =========  ===================================================
``requests_running``                       gauge      requests in the engine's running batch
``requests_waiting``                       gauge      requests queued for a first (or re-) schedule
``max_running``                            gauge      most requests that got a token in one step so far
``batch_size``                             histogram  requests that got a token, per engine step
``prompt_tokens_total``                    counter    prompt tokens of the admitted requests
``generation_tokens_total``                counter    tokens generated
``time_to_first_token_seconds``            histogram  request arrival → its first token
``inter_token_latency_seconds``            histogram  between two tokens of one request
``kv_blocks_used`` / ``kv_blocks_total``   gauge      KV cache blocks held by requests (a shared block
                                                     once) / in the pool (cached blocks nobody holds are
                                                     free: reused on demand, not counted as used)
``kv_blocks_cached``                       gauge      cached blocks nobody holds (prefix cache, evictable)
``prefix_cache_queries_total``             counter    tokens of admitted requests looked up in the prefix
                                                     cache (re-admissions after preemption included)
``prefix_cache_hits_total``                counter    of which found cached (not computed); hit rate =
                                                     hits / queries
``preemptions_total``                      counter    requests preempted (recomputed later)
``spec_proposed_tokens_total``             counter    speculative decoding: tokens proposed and verified
``spec_accepted_tokens_total``             counter    of which accepted; acceptance rate = accepted / proposed
``requests_finished_total{finish_reason}`` counter    requests that ended with "stop" / "length"
``requests_aborted_total``                 counter    requests dropped unfinished (client disconnected)
=========================================  =========  ===================================================

The engine thread updates counters and histograms after each step; the gauges of the engine's state are
read when scraped.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric

from ..engine import Engine

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
    """The server's metrics in their own registry (several servers in one process do not collide)."""

    def __init__(self, engine: Engine) -> None:
        r = self.registry = CollectorRegistry()
        p = "mistral_kernels_"
        Gauge(p + "requests_running", "Requests in the running batch", registry=r).set_function(
            lambda: engine.num_running)
        Gauge(p + "requests_waiting", "Requests waiting to be scheduled", registry=r).set_function(
            lambda: engine.num_waiting)
        blocks = engine.blocks
        Gauge(p + "kv_blocks_used", "KV cache blocks held by requests (shared ones once)", registry=r).set_function(
            lambda: blocks.num_used_blocks)
        Gauge(p + "kv_blocks_total", "KV cache blocks in the pool", registry=r).set(blocks.num_blocks)
        Gauge(p + "kv_blocks_cached", "Cached KV blocks held by no request (evictable)", registry=r).set_function(
            lambda: blocks.num_evictable_blocks)
        r.register(_EngineCounters(engine, p))
        self.max_running = Gauge(p + "max_running", "Most requests given a token in one engine step",
                                 registry=r)
        self.max_running_value = 0
        self.batch_size = Histogram(p + "batch_size", "Requests given a token per engine step",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens", registry=r)
        self.time_to_first_token = Histogram(p + "time_to_first_token_seconds", "Arrival to first token",
                                             buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(p + "inter_token_latency_seconds", "Between two tokens of a request",
                                             buckets=_LATENCY_BUCKETS, registry=r)
        self.preemptions = Counter(p + "preemptions", "Requests preempted", registry=r)
        self.finished = Counter(p + "requests_finished", "Finished requests", ["finish_reason"], registry=r)
        self.aborted = Counter(p + "requests_aborted", "Requests dropped unfinished", registry=r)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _EngineCounters:
    """The prefix-cache and speculative-decoding counters, read from the engine's stats when scraped."""

    def __init__(self, engine: Engine, prefix: str) -> None:
        self.engine, self.prefix = engine, prefix

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats
        yield CounterMetricFamily(self.prefix + "prefix_cache_queries", "Prompt tokens looked up in the prefix "
                                  "cache", value=s.prefix_query_tokens)
        yield CounterMetricFamily(self.prefix + "prefix_cache_hits", "Prompt tokens found in the prefix cache",
                                  value=s.prefix_hit_tokens)
        yield CounterMetricFamily(self.prefix + "spec_proposed_tokens", "Speculative decoding: tokens proposed",
                                  value=s.spec_proposed_tokens)
        yield CounterMetricFamily(self.prefix + "spec_accepted_tokens", "Speculative decoding: proposed tokens "
                                  "accepted", value=s.spec_accepted_tokens)
