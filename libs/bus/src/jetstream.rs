//! JetStream: streams, durable pull consumers, ordered readers from a stream sequence,
//! acknowledged publishing of prost messages.

use std::marker::PhantomData;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer, stream};
use futures::StreamExt;
use prost::Message;

use crate::bus::decode;
use crate::{Bus, BusError, Received};

fn js_error(what: impl Into<String>) -> impl FnOnce(String) -> BusError {
    let what = what.into();
    move |message| BusError::JetStream { what, message }
}

/// A JetStream context over a [`Bus`] connection.
#[derive(Clone)]
pub struct JetStream {
    context: jetstream::Context,
}

impl Bus {
    /// The JetStream context of this connection.
    pub fn jetstream(&self) -> JetStream {
        JetStream {
            context: jetstream::new(self.client().clone()),
        }
    }
}

impl JetStream {
    /// Creates the stream `name` over `subjects`, or returns it when it exists.
    pub async fn ensure_stream(
        &self,
        name: &str,
        subjects: Vec<String>,
    ) -> Result<stream::Stream, BusError> {
        let config = stream::Config {
            name: name.to_owned(),
            subjects,
            ..Default::default()
        };
        self.context
            .get_or_create_stream(config)
            .await
            .map_err(|e| js_error(format!("create stream {name}"))(e.to_string()))
    }

    /// Publishes with trace context and waits for the server's ack; returns the sequence.
    #[expect(
        clippy::disallowed_methods,
        reason = "the bus is where every JetStream publish happens"
    )]
    pub async fn publish<M: Message>(&self, subject: String, message: &M) -> Result<u64, BusError> {
        let mut headers = HeaderMap::new();
        primus_telemetry::propagation::inject_nats(&mut headers);
        let what = format!("publish to {subject}");
        let ack = self
            .context
            .publish_with_headers(subject, headers, message.encode_to_vec().into())
            .await
            .map_err(|e| js_error(what.clone())(e.to_string()))?
            .await
            .map_err(|e| js_error(what)(e.to_string()))?;
        Ok(ack.sequence)
    }

    /// A durable pull consumer with explicit acks: a message not acked within `ack_wait`
    /// is delivered again (to this or another process binding the same durable name).
    pub async fn durable_consumer<M: Message + Default>(
        &self,
        stream_name: &str,
        durable: &str,
        filter_subject: Option<String>,
        ack_wait: Duration,
    ) -> Result<Consumer<M>, BusError> {
        // 0 leaves the server's default (1,000 messages delivered and not yet acked).
        self.durable_consumer_with_window(stream_name, durable, filter_subject, ack_wait, 0)
            .await
    }

    /// [`Self::durable_consumer`] that lets up to `max_ack_pending` delivered messages wait
    /// unacked at once (the server stops delivering beyond it), for a consumer that holds
    /// messages a long time, like a joiner waiting for actions.
    pub async fn durable_consumer_with_window<M: Message + Default>(
        &self,
        stream_name: &str,
        durable: &str,
        filter_subject: Option<String>,
        ack_wait: Duration,
        max_ack_pending: i64,
    ) -> Result<Consumer<M>, BusError> {
        let what = format!("consumer {durable} on stream {stream_name}");
        let stream = self.stream(stream_name, &what).await?;
        let config = consumer::pull::Config {
            durable_name: Some(durable.to_owned()),
            filter_subject: filter_subject.unwrap_or_default(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait,
            max_ack_pending,
            ..Default::default()
        };
        let inner = stream
            .get_or_create_consumer(durable, config)
            .await
            .map_err(|e| js_error(what)(e.to_string()))?;
        Ok(Consumer::new(inner))
    }

    /// The durable consumer `durable` of `stream_name` as its creator configured it, or
    /// an error when it does not exist (yet).
    pub async fn existing_consumer<M: Message + Default>(
        &self,
        stream_name: &str,
        durable: &str,
    ) -> Result<Consumer<M>, BusError> {
        let what = format!("consumer {durable} on stream {stream_name}");
        let stream = self.stream(stream_name, &what).await?;
        let inner: consumer::PullConsumer = stream
            .get_consumer(durable)
            .await
            .map_err(|e| js_error(what)(e.to_string()))?;
        Ok(Consumer::new(inner))
    }

    /// Reads the messages of `stream_name` on `filter_subject` in stream order, each once,
    /// from stream sequence `start` (0: the stream's first message). The reader holds no
    /// state on the server that outlives it: the caller keeps the position. A lost
    /// connection or a deleted server-side consumer is recovered from the last message
    /// read, so no message is skipped or repeated.
    pub async fn ordered_reader<M: Message + Default>(
        &self,
        stream_name: &str,
        filter_subject: String,
        start: u64,
    ) -> Result<OrderedReader<M>, BusError> {
        let what = format!("ordered reader of {filter_subject} on stream {stream_name}");
        let stream = self.stream(stream_name, &what).await?;
        let messages = open_ordered(&stream, &filter_subject, start).await?;
        Ok(OrderedReader {
            stream,
            filter_subject,
            next_sequence: start,
            messages: Some(messages),
            _message: PhantomData,
        })
    }

    async fn stream(&self, name: &str, what: &str) -> Result<stream::Stream, BusError> {
        self.context
            .get_stream(name)
            .await
            .map_err(|e| js_error(what)(e.to_string()))
    }
}

/// A durable pull consumer decoding messages as `M`.
pub struct Consumer<M> {
    inner: consumer::PullConsumer,
    ack_wait: Duration,
    _message: PhantomData<M>,
}

/// Where a consumer stands on its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    /// Messages not yet delivered.
    pub pending: u64,
    /// Delivered, not yet acknowledged (redelivered after `ack_wait`).
    pub ack_pending: u64,
}

/// What one fetch brought: decoded deliveries, and messages that did not decode (those
/// were terminated so they are not redelivered forever).
pub struct Fetched<M> {
    /// Messages decoded, each to be acked.
    pub deliveries: Vec<Delivery<M>>,
    /// Messages that did not decode (terminated, so never redelivered).
    pub rejected: Vec<BusError>,
}

impl<M> Consumer<M> {
    /// Fetches wait at most half the ack wait the consumer has on the server (an existing
    /// durable keeps the one it was created with).
    fn new(inner: consumer::PullConsumer) -> Self {
        let ack_wait = inner.cached_info().config.ack_wait;
        Self {
            inner,
            ack_wait,
            _message: PhantomData,
        }
    }
}

impl<M: Message + Default> Consumer<M> {
    /// The consumer's backlog as the server sees it now.
    pub async fn backlog(&self) -> Result<Backlog, BusError> {
        let info = self
            .inner
            .get_info()
            .await
            .map_err(|e| js_error("consumer info")(e.to_string()))?;
        Ok(Backlog {
            pending: info.num_pending,
            ack_pending: info.num_ack_pending as u64,
        })
    }

    /// Up to `max` messages, waiting at most `wait` for them to arrive.
    ///
    /// The wait is capped at half the consumer's `ack_wait`: a longer fetch would see the
    /// first messages of its own batch redelivered before it could ack them.
    pub async fn fetch(&self, max: usize, wait: Duration) -> Result<Fetched<M>, BusError> {
        let mut batch = self
            .inner
            .batch()
            .max_messages(max)
            .expires(wait.min(self.ack_wait / 2))
            .messages()
            .await
            .map_err(|e| js_error("fetch")(e.to_string()))?;
        let mut fetched = Fetched {
            deliveries: Vec::new(),
            rejected: Vec::new(),
        };
        while let Some(next) = batch.next().await {
            let raw = next.map_err(|e| js_error("fetch")(e.to_string()))?;
            match decode::<M>(&raw.subject, raw.headers.as_ref(), &raw.payload) {
                Ok(received) => fetched.deliveries.push(Delivery { received, raw }),
                Err(error) => {
                    raw.ack_with(AckKind::Term)
                        .await
                        .map_err(|e| js_error("terminate an undecodable message")(e.to_string()))?;
                    fetched.rejected.push(error);
                }
            }
        }
        Ok(fetched)
    }
}

/// An ordered consumer of `filter_subject` from stream sequence `start` (0: the first).
async fn open_ordered(
    stream: &stream::Stream,
    filter_subject: &str,
    start: u64,
) -> Result<consumer::pull::Ordered, BusError> {
    let what = format!("ordered reader of {filter_subject} from sequence {start}");
    let deliver_policy = if start == 0 {
        consumer::DeliverPolicy::All
    } else {
        consumer::DeliverPolicy::ByStartSequence {
            start_sequence: start,
        }
    };
    let config = consumer::pull::OrderedConfig {
        filter_subject: filter_subject.to_owned(),
        deliver_policy,
        ..Default::default()
    };
    stream
        .create_consumer(config)
        .await
        .map_err(|e| js_error(what.clone())(e.to_string()))?
        .messages()
        .await
        .map_err(|e| js_error(what)(e.to_string()))
}

/// Messages of one subject read in stream order (see [`JetStream::ordered_reader`]).
pub struct OrderedReader<M> {
    stream: stream::Stream,
    filter_subject: String,
    /// Where reading goes on if the consumer has to be opened again.
    next_sequence: u64,
    /// `None` after the consumer ended: opened again on the next read.
    messages: Option<consumer::pull::Ordered>,
    _message: PhantomData<M>,
}

/// One message an [`OrderedReader`] read.
pub struct OrderedMessage<M> {
    /// Its stream sequence.
    pub sequence: u64,
    /// Messages of the subject after it, as the server counted them when it sent it.
    pub pending: u64,
    /// When the stream stored it (unix ms).
    pub stored_unix_ms: i64,
    /// The message, or why it did not decode as `M`.
    pub decoded: Result<Received<M>, BusError>,
}

impl<M: Message + Default> OrderedReader<M> {
    /// The next message, waiting at most `wait` for one (`None`: none came). An error is
    /// the server out of reach; the reader goes on from the same place once it answers.
    pub async fn next(&mut self, wait: Duration) -> Option<Result<OrderedMessage<M>, BusError>> {
        let messages = match &mut self.messages {
            Some(messages) => messages,
            None => {
                let opened =
                    open_ordered(&self.stream, &self.filter_subject, self.next_sequence).await;
                match opened {
                    Ok(messages) => self.messages.insert(messages),
                    Err(e) => return Some(Err(e)),
                }
            }
        };
        let next = tokio::time::timeout(wait, messages.next()).await.ok()?;
        let raw = match next {
            Some(Ok(raw)) => raw,
            Some(Err(e)) => return Some(Err(js_error("ordered read")(e.to_string()))),
            None => {
                self.messages = None;
                return Some(Err(js_error("ordered read")(
                    "the consumer ended; opening it again".into(),
                )));
            }
        };
        let info = match raw.info() {
            Ok(info) => (
                info.stream_sequence,
                info.pending,
                (info.published.unix_timestamp_nanos() / 1_000_000) as i64,
            ),
            Err(e) => return Some(Err(js_error("message info")(e.to_string()))),
        };
        self.next_sequence = info.0 + 1;
        Some(Ok(OrderedMessage {
            sequence: info.0,
            pending: info.1,
            stored_unix_ms: info.2,
            decoded: decode::<M>(&raw.subject, raw.headers.as_ref(), &raw.payload),
        }))
    }
}

/// One delivered message; [`Delivery::ack`] once it is safely handled.
pub struct Delivery<M> {
    /// The message.
    pub received: Received<M>,
    raw: jetstream::Message,
}

impl<M> Delivery<M> {
    /// The stream sequence of this message.
    pub fn sequence(&self) -> Result<u64, BusError> {
        self.raw
            .info()
            .map(|info| info.stream_sequence)
            .map_err(|e| js_error("message info")(e.to_string()))
    }

    /// When the stream stored this message (unix ms): the event time of a live stream.
    pub fn stored_unix_ms(&self) -> Result<i64, BusError> {
        self.raw
            .info()
            .map(|info| (info.published.unix_timestamp_nanos() / 1_000_000) as i64)
            .map_err(|e| js_error("message info")(e.to_string()))
    }

    /// How many of the consumer's messages were still undelivered when this one was
    /// delivered: 0 once the consumer has read to the end of its stream.
    pub fn pending(&self) -> Result<u64, BusError> {
        self.raw
            .info()
            .map(|info| info.pending)
            .map_err(|e| js_error("message info")(e.to_string()))
    }

    /// Acknowledges the message: it is not delivered again.
    pub async fn ack(&self) -> Result<(), BusError> {
        self.raw
            .double_ack()
            .await
            .map_err(|e| js_error("ack")(e.to_string()))
    }

    /// Still being handled: restarts the server's ack-wait clock for this message.
    pub async fn in_progress(&self) -> Result<(), BusError> {
        self.raw
            .ack_with(AckKind::Progress)
            .await
            .map_err(|e| js_error("in-progress ack")(e.to_string()))
    }

    /// Never deliver this message again (it cannot be handled by anyone).
    pub async fn reject(&self) -> Result<(), BusError> {
        self.raw
            .ack_with(AckKind::Term)
            .await
            .map_err(|e| js_error("terminate")(e.to_string()))
    }
}
