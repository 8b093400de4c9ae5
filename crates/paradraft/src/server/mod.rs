//! The OpenAI-compatible HTTP API over an [`Engine`]: `POST /v1/chat/completions`,
//! `POST /v1/completions` (JSON, or server-sent events with `stream`), `GET /v1/models`,
//! `GET /health` and `GET /metrics` (Prometheus text).
//!
//! A handler validates the request ([`openai`]), submits it to the engine and relays the
//! engine's events; a client that goes away drops its receiver, which cancels the request and
//! frees its KV pages. The server keeps no state beyond requests in flight, so replicas behind
//! any HTTP load balancer scale it out.

mod choices;
mod error;
mod extensions;
pub mod flags;
mod messages;
pub mod openai;
mod response;
mod structured;
pub mod tools;

use crate::engine::{Engine, Rejected, Request};
use crate::process::TokenLogprob;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use openai::{ApiError, ChatRequest, CompletionRequest, Validated};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::unbounded_channel;

/// What the handlers share.
pub struct AppState {
    pub engine: Engine,
    /// The name `/v1/models` lists and responses carry.
    pub model_name: String,
    /// `Authorization: Bearer <key>` required on `/v1/*` when set.
    pub api_key: Option<String>,
    ids: AtomicU64,
    started: u64,
}

impl AppState {
    pub fn new(engine: Engine, model_name: String, api_key: Option<String>) -> Self {
        AppState {
            engine,
            model_name,
            api_key,
            ids: AtomicU64::new(0),
            started: now_secs(),
        }
    }

    /// A request id, unique in this process and unlikely to repeat across replicas.
    fn next_id(&self, prefix: &str) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!(
            "{prefix}-{:08x}{n:08x}",
            self.started as u32 ^ std::process::id()
        )
    }

    /// A seed for a request that gave none.
    fn draw_seed(&self) -> u64 {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        splitmix(t ^ n.rotate_left(32))
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The API's routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        (status, Json(self.body())).into_response()
    }
}

async fn not_found() -> ApiError {
    ApiError::invalid("no such endpoint", None)
        .status(404)
        .with_code("not_found")
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.engine.metrics().render(),
    )
        .into_response()
}

async fn models(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [{
        "id": st.model_name,
        "object": "model",
        "created": st.started,
        "owned_by": "paradraft",
        "max_model_len": st.engine.config().ctx,
        "drafter": st.engine.drafter(),
    }]}))
    .into_response()
}

fn authorize(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &st.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.map(str::trim) == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "Incorrect or missing API key: send it as `Authorization: Bearer <key>`",
            None,
        )
        .status(401)
        .with_code("invalid_api_key"))
    }
}

/// Parses a JSON body into `T`, answering malformed JSON and unknown fields in the OpenAI shape.
fn parse<T: serde::de::DeserializeOwned>(headers: &HeaderMap, body: &Bytes) -> Result<T, ApiError> {
    if let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        if !ct.starts_with("application/json") {
            return Err(ApiError::invalid(
                format!("Content-Type must be application/json, got {ct}"),
                None,
            ));
        }
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}"), None))
}

fn check_model(st: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != &st.model_name => Err(ApiError::invalid(
            format!(
                "The model `{m}` does not exist (this server serves `{}`)",
                st.model_name
            ),
            Some("model"),
        )
        .status(404)
        .with_code("model_not_found")),
        _ => Ok(()),
    }
}

/// Which endpoint's shapes a response takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

async fn chat(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let run = || -> Result<Validated, ApiError> {
        authorize(&st, &headers)?;
        let req: ChatRequest = parse(&headers, &body)?;
        check_model(&st, &req.model)?;
        let e = &st.engine;
        let vocab = e.loaded().model.config.vocab_size;
        req.validate(&e.loaded().tokenizer, e.config().ctx, vocab, || {
            st.draw_seed()
        })
    };
    match run() {
        Ok(v) => respond(st.clone(), v, Kind::Chat).await,
        Err(e) => refused(&st, e),
    }
}

async fn completions(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let run = || -> Result<Validated, ApiError> {
        authorize(&st, &headers)?;
        let req: CompletionRequest = parse(&headers, &body)?;
        check_model(&st, &req.model)?;
        let e = &st.engine;
        let vocab = e.loaded().model.config.vocab_size;
        req.validate(&e.loaded().tokenizer, e.config().ctx, vocab, || {
            st.draw_seed()
        })
    };
    match run() {
        Ok(v) => respond(st.clone(), v, Kind::Completion).await,
        Err(e) => refused(&st, e),
    }
}

/// A request refused before the queue (authorisation, parsing, validation), counted.
fn refused(st: &AppState, e: ApiError) -> Response {
    let outcome = if e.status == 401 {
        "unauthorized"
    } else {
        "invalid"
    };
    st.engine
        .metrics()
        .requests
        .with_label_values(&[outcome])
        .inc();
    e.into_response()
}

/// Submits a validated request and answers with JSON or an event stream.
async fn respond(st: Arc<AppState>, v: Validated, kind: Kind) -> Response {
    let prompt_tokens = v.prompt.len();
    let logprobs = v.params.processing.logprobs.is_some();
    // `n` choices: one engine request each, seeded seed, seed + 1, …; the first computes the
    // prompt and the others copy it (the engine's prefix cache waits for it).
    let mut rxs = Vec::with_capacity(v.n);
    for i in 0..v.n {
        let (tx, rx) = unbounded_channel();
        let mut params = v.params.clone();
        params.sampling.seed = params.sampling.seed.wrapping_add(i as u64);
        let req = Request {
            prompt: v.prompt.clone(),
            params,
            events: tx,
            max_draft: v.max_draft,
        };
        rxs.push(rx);
        let Err(e) = st.engine.submit(req) else {
            continue;
        };
        let err = match e {
            Rejected::Busy(_) => ApiError::invalid(e.to_string(), None)
                .status(429)
                .kind("rate_limit_error")
                .with_code("too_many_requests"),
            Rejected::Stopped => ApiError::invalid(e.to_string(), None)
                .status(503)
                .kind("server_error")
                .with_code("shutting_down"),
        };
        // The choices already queued are cancelled with their receivers.
        return err.into_response();
    }
    let meta = Meta {
        id: st.next_id(if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        created: now_secs(),
        model: st.model_name.clone(),
        kind,
        prompt_tokens,
        logprobs,
        tool_format: v.tool_format,
        st: st.clone(),
    };
    if v.stream {
        choices::sse(meta, rxs, v.include_usage).into_response()
    } else {
        choices::whole(meta, rxs).await
    }
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    prompt_tokens: usize,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
    /// How tool calls are read from the text, when the request offers tools.
    tool_format: Option<tools::Format>,
    st: Arc<AppState>,
}

impl Meta {
    /// The `logprobs` of a choice holding `lps` (null when not asked for); `offset`: where
    /// the first token starts in the completion's text (moved past the last).
    fn logprobs(&self, lps: &[TokenLogprob], offset: &mut usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let tok = &self.st.engine.loaded().tokenizer;
        match self.kind {
            Kind::Chat => response::chat(tok, lps),
            Kind::Completion => response::completion(tok, lps, offset),
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// A response or chunk with these choices.
    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": concat!("paradraft-", env!("CARGO_PKG_VERSION")),
            "choices": choices,
        })
    }

    /// Choice `index`: the whole message (`chunk` false) or a delta.
    fn choice(
        &self,
        index: usize,
        chunk: bool,
        text: Option<&str>,
        finish: Option<&str>,
        first: bool,
        logprobs: Value,
    ) -> Value {
        match (self.kind, chunk) {
            (Kind::Chat, false) => json!({
                "index": index,
                "message": {"role": "assistant", "content": text.unwrap_or(""), "refusal": null},
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (Kind::Chat, true) => {
                let mut delta = json!({});
                if first {
                    delta["role"] = json!("assistant");
                }
                if let Some(t) = text {
                    delta["content"] = json!(t);
                }
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            (Kind::Completion, _) => json!({
                "index": index,
                "text": text.unwrap_or(""),
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        }
    }
}

impl Meta {
    /// Choice `index`'s tool calls as the API gives them: whole (`chunk` false, with `id`,
    /// `type`, `function`) or as a stream's delta (also with its `index`).
    fn tool_calls(&self, index: usize, calls: &[tools::Call], chunk: bool) -> Value {
        let tail = self.id.rsplit('-').next().unwrap_or_default();
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let mut v = json!({
                    "id": self.tool_format.map_or_else(
                        || tools::Format::Generic.call_id(tail, index, k),
                        |f| f.call_id(tail, index, k),
                    ),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                });
                if chunk {
                    v["index"] = json!(k);
                }
                v
            })
            .collect();
        Value::Array(calls)
    }
}

fn internal(msg: String) -> ApiError {
    ApiError::invalid(msg, None)
        .status(500)
        .kind("server_error")
        .with_code("internal_error")
}

/// Serves `state` on `listener` until `shutdown` resolves, then lets requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
