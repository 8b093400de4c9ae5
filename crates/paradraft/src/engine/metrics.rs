//! The engine's Prometheus metrics (served as text at `GET /metrics`).

use prometheus::{
    CounterVec, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, Opts, Registry, TextEncoder,
};

/// Every metric, registered in one registry.
pub struct Metrics {
    registry: Registry,
    /// Requests by outcome: finished, cancelled, rejected (queue full), invalid (refused by
    /// validation: 4xx before the queue), error.
    pub requests: IntCounterVec,
    pub prompt_tokens: IntCounter,
    pub generation_tokens: IntCounter,
    /// Arrival to first token (queue + prefill).
    pub ttft: Histogram,
    /// Time per output token after the first (a round's interval over the tokens it commits).
    pub itl: Histogram,
    /// Arrival to the last token.
    pub e2e: Histogram,
    pub queue_depth: IntGauge,
    pub running: IntGauge,
    pub kv_pages_used: IntGauge,
    pub preempted: IntGauge,
    pub preemptions: IntCounter,
    pub kv_pages_total: IntGauge,
    /// Rows of each forward (all requests' prompt chunks and verify rows).
    pub step_rows: Histogram,
    /// Seconds of the engine's steps by phase: plan, draft_pass, forward, commit.
    pub step_seconds: CounterVec,
    /// Draft tokens accepted per speculative round, per drafter.
    pub accepted: HistogramVec,
    /// Speculative rounds that drafted nothing, per drafter and reason (`speed_guard`: drafting
    /// measured slower than AR here; `probe`: AR timed; `cost_model`: no draft worth its
    /// verify rows).
    pub undrafted: IntCounterVec,
    /// Requests that reused a cached prompt prefix, the tokens they did not prefill, entries
    /// evicted, and the bytes the cache holds.
    pub prefix_hits: IntCounter,
    pub prefix_hit_tokens: IntCounter,
    pub prefix_evictions: IntCounter,
    pub prefix_bytes: IntGauge,
}

fn latency_buckets() -> Vec<f64> {
    vec![
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
        5.0, 10.0, 30.0, 60.0,
    ]
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let h = |name: &str, help: &str, buckets: Vec<f64>| {
            let m = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                .expect("valid histogram");
            registry.register(Box::new(m.clone())).expect("unique name");
            m
        };
        let g = |name: &str, help: &str| {
            let m = IntGauge::new(name, help).expect("valid gauge");
            registry.register(Box::new(m.clone())).expect("unique name");
            m
        };
        let c = |name: &str, help: &str| {
            let m = IntCounter::new(name, help).expect("valid counter");
            registry.register(Box::new(m.clone())).expect("unique name");
            m
        };
        let step_seconds = CounterVec::new(
            Opts::new(
                "paradraft_step_seconds_total",
                "Seconds of the engine's steps by phase (plan: prompt chunks, sizing and the \
                 drafters' own work; draft_pass: the drafters' shared passes; forward; commit: \
                 verification, streaming, the drafters' bookkeeping)",
            ),
            &["phase"],
        )
        .expect("valid counter");
        registry
            .register(Box::new(step_seconds.clone()))
            .expect("unique name");
        let requests = IntCounterVec::new(
            Opts::new("paradraft_requests_total", "Requests by outcome"),
            &["outcome"],
        )
        .expect("valid counter");
        registry
            .register(Box::new(requests.clone()))
            .expect("unique name");
        let accepted = HistogramVec::new(
            HistogramOpts::new(
                "paradraft_accepted_tokens_per_round",
                "Draft tokens accepted per verification round",
            )
            .buckets((0..=16).map(|b| b as f64).collect()),
            &["drafter"],
        )
        .expect("valid histogram");
        registry
            .register(Box::new(accepted.clone()))
            .expect("unique name");
        let undrafted = IntCounterVec::new(
            Opts::new(
                "paradraft_undrafted_rounds_total",
                "Speculative rounds that drafted nothing, by reason",
            ),
            &["drafter", "reason"],
        )
        .expect("valid counter");
        registry
            .register(Box::new(undrafted.clone()))
            .expect("unique name");
        Metrics {
            requests,
            undrafted,
            prompt_tokens: c("paradraft_prompt_tokens_total", "Prompt tokens prefilled"),
            generation_tokens: c("paradraft_generation_tokens_total", "Tokens generated"),
            ttft: h(
                "paradraft_time_to_first_token_seconds",
                "Arrival to first token",
                latency_buckets(),
            ),
            itl: h(
                "paradraft_inter_token_latency_seconds",
                "Time per output token after the first",
                latency_buckets(),
            ),
            e2e: h(
                "paradraft_request_duration_seconds",
                "Arrival to last token",
                latency_buckets(),
            ),
            queue_depth: g("paradraft_queue_depth", "Requests waiting for admission"),
            running: g(
                "paradraft_running_requests",
                "Requests in the running batch",
            ),
            kv_pages_used: g(
                "paradraft_kv_pages_used",
                "KV pages held by running requests (beyond cached prefixes they share) and counted for drafters' caches",
            ),
            preempted: g(
                "paradraft_preempted_requests",
                "Requests preempted for KV pages, waiting to resume",
            ),
            preemptions: c(
                "paradraft_preemptions_total",
                "Requests preempted for KV pages (their caches rebuilt when resumed)",
            ),
            kv_pages_total: g("paradraft_kv_pages_total", "KV pages in the pool"),
            step_seconds,
            step_rows: h(
                "paradraft_step_rows",
                "Rows per batched forward",
                vec![
                    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
                ],
            ),
            accepted,
            prefix_hits: c(
                "paradraft_prefix_cache_hits_total",
                "Requests that reused a cached prompt prefix",
            ),
            prefix_hit_tokens: c(
                "paradraft_prefix_cache_hit_tokens_total",
                "Prompt tokens taken from the prefix cache instead of prefilled",
            ),
            prefix_evictions: c(
                "paradraft_prefix_cache_evictions_total",
                "Prefix-cache entries evicted for room",
            ),
            prefix_bytes: g(
                "paradraft_prefix_cache_bytes",
                "Bytes the prefix cache holds",
            ),
            registry,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
