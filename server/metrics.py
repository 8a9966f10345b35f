"""The server's Prometheus metrics, under vLLM's names where the meaning is the same.

vLLM (v1, vllm/v1/metrics/loggers.py) exposes, with labels `model_name` and `engine`:
  gauges      vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc (a fraction, 1 = full)
  counters    vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:request_success_total{finished_reason},
              vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total (tokens), vllm:num_preemptions_total
  histograms  vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds,
              vllm:request_queue_time_seconds, vllm:request_prompt_tokens, vllm:request_generation_tokens
Dashboards and load generators written for vLLM read ours unchanged. The gauges are read from the worker when
Prometheus scrapes (`LiveCollector`), so they are never stale. prometheus_client writes the text format.

Ours, under inference_lab: (how the engine sized its BLAS threads, `engine.threads`):
  inference_lab_blas_threads{mode, reason}        threads OpenBLAS uses now (read from the library); mode auto or
                                                  fixed, reason a key of engine.threads.REASONS
  inference_lab_cpu_cores                         cores this process may run on
  inference_lab_cpu_others_busy_cores             cores' worth of CPU other work took in the last window
  inference_lab_blas_thread_gain{kind, threads}   speed at n threads over one thread, timed on a quiet machine
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from engine import threads as blas_threads

# vLLM's buckets (vllm/v1/metrics/loggers.py), so histograms of both servers line up
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
LABELS = ("model_name", "engine")


class LiveCollector:
    """Gauges read from the worker at scrape time: requests running and waiting, KV-cache usage."""

    def __init__(self, model_name: str, worker) -> None:
        self.model_name, self.worker = model_name, worker

    def collect(self):
        snap = self.worker.snapshot()
        labels = [self.model_name, "0"]
        for name, doc, value in (
                ("vllm:num_requests_running", "Number of requests in model execution batches.", snap.running),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", snap.waiting),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                 1.0 - snap.free_blocks / snap.num_blocks if snap.num_blocks else 0.0)):
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(labels, float(value))
            yield g
        yield from blas_gauges(labels)


def blas_gauges(labels: list[str]):
    """The engine's BLAS threads and why (`engine.threads.status()`, this process's)."""
    s = blas_threads.status()
    g = GaugeMetricFamily("inference_lab_blas_threads", "BLAS threads the engine uses now, and why "
                          "(mode auto|fixed|unavailable; reason: engine.threads.REASONS).",
                          labels=(*LABELS, "mode", "reason"))
    g.add_metric([*labels, s.mode, s.reason], float("nan") if s.threads is None else float(s.threads))
    yield g
    g = GaugeMetricFamily("inference_lab_cpu_cores", "CPU cores this process may run on.", labels=LABELS)
    g.add_metric(labels, float(s.cores))
    yield g
    if s.others_busy is not None:
        g = GaugeMetricFamily("inference_lab_cpu_others_busy_cores", "Cores' worth of CPU that work other than "
                              "the engine took over the last measured window.", labels=LABELS)
        g.add_metric(labels, s.others_busy)
        yield g
    g = GaugeMetricFamily("inference_lab_blas_thread_gain", "Speed at n BLAS threads over one thread, timed on "
                          "the model's own matrices when the machine looked quiet.",
                          labels=(*LABELS, "kind", "threads"))
    for kind, gains in s.gains.items():
        for n, gain in gains.items():
            g.add_metric([*labels, kind, str(n)], gain)
    yield g


class ServerMetrics:
    """Counters and histograms updated per request by the HTTP layer; gauges read live from the worker."""

    def __init__(self, model_name: str, worker) -> None:
        self.registry = CollectorRegistry()
        self.labels = dict(model_name=model_name, engine="0")
        r, L = self.registry, LABELS
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", L, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", L,
                                         registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               (*L, "finished_reason"), registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of "
                                      "queried tokens.", L, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                                   "tokens.", L, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              L, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             L, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             L, buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for "
                               "request.", L, buckets=LATENCY_BUCKETS, registry=r)
        self.req_prompt = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", L,
                                    buckets=TOKEN_BUCKETS, registry=r)
        self.req_generation = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                        L, buckets=TOKEN_BUCKETS, registry=r)
        self.registry.register(LiveCollector(model_name, worker))

    def _l(self, metric, **extra):
        return metric.labels(**self.labels, **extra)

    def request_started(self, prompt_tokens: int, max_tokens: int) -> None:
        self._l(self.prompt_tokens).inc(prompt_tokens)

    def first_token(self, seconds: float) -> None:
        self._l(self.ttft).observe(seconds)
        self._l(self.generation_tokens).inc()

    def next_token(self, seconds: float) -> None:
        self._l(self.itl).observe(seconds)
        self._l(self.generation_tokens).inc()

    def request_finished(self, reason: str, prompt_tokens: int, generated: int, e2e_s: float, queue_s: float,
                         prefix_hit_tokens: int = 0) -> None:
        self._l(self.success, finished_reason=reason).inc()
        self._l(self.e2e).observe(e2e_s)
        self._l(self.queue).observe(queue_s)
        self._l(self.req_prompt).observe(prompt_tokens)
        self._l(self.req_generation).observe(generated)
        self._l(self.prefix_queries).inc(prompt_tokens)
        self._l(self.prefix_hits).inc(prefix_hit_tokens)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
