//! A handler's response body on its way to the client, recorded as it goes.
//!
//! The middleware never holds back the first byte: each frame goes to the client as the
//! handler produces it, and into the record. When the body ends, the record is the response
//! replays get: status, allow-listed headers, and the whole body (a streamed response is
//! replayed in one piece). If the client goes away, the body is still drained (for at most
//! the layer's `detached_stream_timeout`) so that the outcome is stored.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Bytes, HttpBody};
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use crate::error::BoxError;

type Frame = http_body::Frame<Bytes>;

/// Frames buffered between the handler and a slow client.
const BUFFERED_FRAMES: usize = 16;

/// The client's end: a body fed by the recording task.
#[derive(Debug)]
pub(crate) struct ChannelBody {
    frames: mpsc::Receiver<Result<Frame, BoxError>>,
}

impl HttpBody for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame, Self::Error>>> {
        self.frames.poll_recv(cx)
    }
}

/// The recording end.
#[derive(Debug)]
pub(crate) struct Tee {
    client: Option<mpsc::Sender<Result<Frame, BoxError>>>,
}

/// A channel body for the client, and the end that feeds it.
pub(crate) fn tee() -> (Tee, ChannelBody) {
    let (sender, frames) = mpsc::channel(BUFFERED_FRAMES);
    (
        Tee {
            client: Some(sender),
        },
        ChannelBody { frames },
    )
}

/// How a recorded body ended.
#[derive(Debug)]
pub(crate) enum Recorded {
    /// It ended, and every byte is in `body`.
    Whole(Bytes),
    /// It ended, but was longer than the limit: the client got it all, the record has none.
    TooLarge,
    /// It failed part way. The client is told (with [`Tee::fail`]) once the fixed answer is
    /// stored, so that a retry finds it.
    Failed(BoxError),
    /// The client went away and the body did not end within the timeout.
    Abandoned,
}

impl Tee {
    /// Streams `body` to the client while recording it (up to `limit` bytes). Waits for a slow
    /// client (at most `BUFFERED_FRAMES` ahead); a client that went away is no longer fed, and
    /// the body is drained for at most `detached` more.
    ///
    /// The client's body does not end when this returns: it ends when the `Tee` is dropped,
    /// which the caller does once the record is stored, so that a client that has read the
    /// whole response and retries at once finds it stored.
    pub(crate) async fn record<B>(&mut self, body: B, limit: usize, detached: Duration) -> Recorded
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let mut body = std::pin::pin!(body);
        let mut recorded = Vec::new();
        let mut too_large = false;
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            let next = match deadline {
                None => body.frame().await,
                Some(at) => match tokio::time::timeout_at(at, body.frame()).await {
                    Ok(next) => next,
                    Err(_) => return Recorded::Abandoned,
                },
            };
            let frame = match next {
                None => break,
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Recorded::Failed(e.into()),
            };
            if let Some(data) = frame.data_ref()
                && !too_large
            {
                if recorded.len() + data.len() > limit {
                    too_large = true;
                    recorded = Vec::new();
                } else {
                    recorded.extend_from_slice(data);
                }
            }
            if !self.send(Ok(frame)).await && deadline.is_none() {
                deadline = Some(tokio::time::Instant::now() + detached);
            }
        }
        if too_large {
            Recorded::TooLarge
        } else {
            Recorded::Whole(Bytes::from(recorded))
        }
    }

    /// Tells the client the body failed (its stream ends in an error).
    pub(crate) async fn fail(&mut self, error: BoxError) {
        self.send(Err(error)).await;
    }

    /// Feeds the client; `false` once it has gone away.
    async fn send(&mut self, frame: Result<Frame, BoxError>) -> bool {
        let Some(client) = &self.client else {
            return false;
        };
        if client.send(frame).await.is_err() {
            self.client = None;
            return false;
        }
        true
    }
}
