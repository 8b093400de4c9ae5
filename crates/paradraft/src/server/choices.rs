//! A response's choices (`n` of them, one engine request each) relayed as one JSON body or as
//! one event stream whose chunks name their choice's `index`.

use super::response::{finish_reason, Usage};
use super::tools::{self, Reader};
use super::{internal, Kind, Meta};
use crate::engine::{Event, Finished};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::pin::Pin;
use tokio::sync::mpsc::UnboundedReceiver;

fn dropped() -> Response {
    internal("the engine dropped the request".into()).into_response()
}

/// A non-streaming response: every choice's events, then one JSON body.
pub(super) async fn whole(meta: Meta, rxs: Vec<UnboundedReceiver<Event>>) -> Response {
    let mut choices = Vec::with_capacity(rxs.len());
    let mut done = Vec::with_capacity(rxs.len());
    for (i, mut rx) in rxs.into_iter().enumerate() {
        let (mut text, mut lps) = (String::new(), Vec::new());
        let f = loop {
            match rx.recv().await {
                Some(Event::Text(t)) => text.push_str(&t),
                Some(Event::Logprobs(l)) => lps.extend(l),
                Some(Event::Done(f)) => break f,
                Some(Event::Error(e)) => return internal(e).into_response(),
                None => return dropped(),
            }
        };
        let logprobs = meta.logprobs(&lps, &mut 0);
        let reason = finish_reason(f.stop_reason);
        let mut choice = meta.choice(i, false, Some(&text), Some(reason), false, logprobs);
        if let Some(format) = meta.tool_format {
            let p = tools::read(format, &text);
            choice["message"]["content"] = json!(p.content);
            if !p.calls.is_empty() {
                choice["message"]["tool_calls"] = meta.tool_calls(i, &p.calls, false);
                choice["finish_reason"] = json!("tool_calls");
            }
        }
        choices.push(choice);
        done.push(f);
    }
    let mut body = meta.envelope(false, Value::Array(choices));
    body["usage"] = json!(Usage::of(meta.prompt_tokens, &done));
    Json(body).into_response()
}

type Events = Pin<Box<dyn Stream<Item = (usize, Event)> + Send>>;

/// The state of an event stream.
struct Streaming {
    meta: Meta,
    events: Events,
    include_usage: bool,
    /// Per choice: no chunk sent yet (chat's first delta carries the role).
    first: Vec<bool>,
    /// Per choice, with log-probabilities: the text of the step whose log-probabilities come
    /// next (a chunk carries a step's text and its tokens' log-probabilities together).
    pending: Vec<String>,
    /// Per choice: where its next token starts in its text (completions' `text_offset`).
    offset: Vec<usize>,
    finished: Vec<Option<Finished>>,
    /// Per choice, with tools: the reader holding back what may be a call.
    readers: Vec<Option<Reader>>,
    /// Events still to send before reading more (the final chunks).
    queue: std::collections::VecDeque<SseEvent>,
    done: bool,
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

impl Streaming {
    fn chunk(&mut self, i: usize, text: Option<&str>, finish: Option<&str>, lp: Value) -> SseEvent {
        data(&self.chunk_value(i, text, finish, lp))
    }

    /// A chunk of choice `i` as JSON (the first carries the role).
    fn chunk_value(
        &mut self,
        i: usize,
        text: Option<&str>,
        finish: Option<&str>,
        lp: Value,
    ) -> Value {
        let choice = self.meta.choice(i, true, text, finish, self.first[i], lp);
        self.first[i] = false;
        let mut v = self.meta.envelope(true, json!([choice]));
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// Takes one choice's event; queues what it sends.
    fn take(&mut self, i: usize, ev: Event) {
        match ev {
            Event::Text(t) => {
                let t = match &mut self.readers[i] {
                    Some(r) => r.push(&t),
                    None => t,
                };
                if self.meta.logprobs {
                    self.pending[i].push_str(&t);
                } else if !t.is_empty() {
                    let c = self.chunk(i, Some(&t), None, Value::Null);
                    self.queue.push_back(c);
                }
            }
            Event::Logprobs(l) => {
                let text = std::mem::take(&mut self.pending[i]);
                let lp = self.meta.logprobs(&l, &mut self.offset[i]);
                let c = self.chunk(i, Some(&text), None, lp);
                self.queue.push_back(c);
            }
            Event::Done(f) => self.finish(i, f),
            Event::Error(e) => self.fail(internal(e).body()),
        }
    }

    fn fail(&mut self, body: Value) {
        self.queue.push_back(data(&body));
        self.queue.push_back(SseEvent::default().data("[DONE]"));
        self.done = true;
    }

    fn finish(&mut self, i: usize, f: Finished) {
        let read = self.readers[i].as_mut().map(Reader::finish);
        if let Some(rest) = read.as_ref().and_then(|p| p.content.as_deref()) {
            self.pending[i].push_str(rest);
        }
        if !self.pending[i].is_empty() {
            let text = std::mem::take(&mut self.pending[i]);
            let c = self.chunk(i, Some(&text), None, Value::Null);
            self.queue.push_back(c);
        }
        let mut reason = finish_reason(f.stop_reason);
        if let Some(p) = read.filter(|p| !p.calls.is_empty()) {
            let mut v = self.chunk_value(i, None, None, Value::Null);
            v["choices"][0]["delta"]["tool_calls"] = self.meta.tool_calls(i, &p.calls, true);
            self.queue.push_back(data(&v));
            reason = "tool_calls";
        }
        let text = (self.meta.kind == Kind::Completion).then_some("");
        let last = self.chunk(i, text, Some(reason), Value::Null);
        self.queue.push_back(last);
        self.finished[i] = Some(f);
        if self.finished.iter().all(Option::is_some) {
            if self.include_usage {
                let done: Vec<Finished> = self.finished.iter().flatten().cloned().collect();
                let mut v = self.meta.envelope(true, json!([]));
                v["usage"] = json!(Usage::of(self.meta.prompt_tokens, &done));
                self.queue.push_back(data(&v));
            }
            self.queue.push_back(SseEvent::default().data("[DONE]"));
            self.done = true;
        }
    }
}

/// A streaming response: per choice a chunk per text piece and its finish chunk (chunks of
/// different choices interleave as their tokens come), then optionally a usage chunk, then
/// `[DONE]`. Dropping the stream (client gone) drops the receivers: the engine cancels.
pub(super) fn sse(
    meta: Meta,
    rxs: Vec<UnboundedReceiver<Event>>,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let n = rxs.len();
    let meta_format = meta.tool_format;
    let events: Events = Box::pin(stream::select_all(rxs.into_iter().enumerate().map(
        |(i, rx)| {
            Box::pin(stream::unfold(rx, move |mut rx| async move {
                rx.recv().await.map(|ev| ((i, ev), rx))
            }))
        },
    )));
    let mut st = Streaming {
        meta,
        events,
        include_usage,
        first: vec![true; n],
        pending: vec![String::new(); n],
        offset: vec![0; n],
        finished: vec![None; n],
        readers: (0..n).map(|_| meta_format.map(Reader::new)).collect(),
        queue: Default::default(),
        done: false,
    };
    // Each choice's role chunk goes first (with empty content), as OpenAI's do.
    if st.meta.kind == Kind::Chat {
        for i in 0..n {
            let c = st.chunk(i, Some(""), None, Value::Null);
            st.queue.push_back(c);
        }
    }
    let s = stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.done {
                return None;
            }
            match st.events.next().await {
                Some((i, ev)) => st.take(i, ev),
                None => st.fail(internal("the engine dropped the request".into()).body()),
            }
        }
    });
    Sse::new(s)
}
