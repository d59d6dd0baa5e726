//! Building responses: JSON bodies, and lazily generated streams that record how they ended.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

use crate::conversation::{Reply, Step, StreamSteps};
use crate::journal::Shared;

pub(crate) const CONTENT_TYPE_JSON: &str = "application/json";
pub(crate) const CONTENT_TYPE_SSE: &str = "text/event-stream";
pub(crate) const CONTENT_TYPE_TEXT: &str = "text/plain; charset=utf-8";

/// Appends the compact JSON of `value` to `out`.
pub(crate) fn write_json(out: &mut BytesMut, value: &impl Serialize) {
    // The wire types serialize infallibly (string keys only); an error would be a bug worth seeing in the logs.
    if let Err(error) = serde_json::to_writer(out.writer(), value) {
        tracing::error!(%error, "cannot serialize a response");
    }
}

pub(crate) fn json(status: StatusCode, value: &impl Serialize) -> Response {
    let mut out = BytesMut::with_capacity(512);
    write_json(&mut out, value);
    with_body(status, CONTENT_TYPE_JSON, Body::from(out.freeze()))
}

pub(crate) fn with_body(status: StatusCode, content_type: &'static str, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Renders the steps of a streamed answer in one wire format; a step it has no frame for appends nothing.
pub(crate) trait Render: Send + 'static {
    fn render(&mut self, step: &Step, reply: &Reply, out: &mut BytesMut);
}

/// Records how a stream ended when the body is dropped: by the connection after the last chunk, or
/// earlier when the client goes away.
struct StreamGuard {
    shared: Arc<Shared>,
    seq: u64,
    completed: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.shared.finish_stream(self.seq, self.completed);
    }
}

struct StreamState<R> {
    steps: StreamSteps,
    renderer: R,
    guard: StreamGuard,
    delay: Duration,
    started: bool,
}

impl<R: Render> StreamState<R> {
    /// The next non-empty chunk: one frame, or every frame at once when there is no delay to wait.
    fn next_chunk(&mut self) -> Option<Bytes> {
        let mut out = BytesMut::new();
        while let Some(step) = self.steps.next() {
            self.renderer.render(&step, self.steps.reply(), &mut out);
            if !out.is_empty() && !self.delay.is_zero() {
                break;
            }
        }
        if out.is_empty() { None } else { Some(out.freeze()) }
    }
}

/// A streamed 200 answer whose chunks are rendered as the client reads them, `chunk_delay` apart.
pub(crate) fn stream(shared: &Arc<Shared>, seq: u64, steps: StreamSteps, renderer: impl Render, content_type: &'static str) -> Response {
    let guard = StreamGuard { shared: Arc::clone(shared), seq, completed: false };
    let state = StreamState { steps, renderer, guard, delay: shared.chunk_delay, started: false };
    let chunks = futures::stream::unfold(state, |mut state| async move {
        let Some(chunk) = state.next_chunk() else {
            state.guard.completed = true;
            // The guard records the completion as it drops.
            drop(state);
            return None;
        };
        if state.started && !state.delay.is_zero() {
            tokio::time::sleep(state.delay).await;
        }
        state.started = true;
        Some((Ok::<Bytes, Infallible>(chunk), state))
    });
    let mut response = with_body(StatusCode::OK, content_type, Body::from_stream(chunks));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
