use std::marker::PhantomData;
use std::time::Duration;

use async_nats::{Client, ConnectOptions, HeaderMap};
use futures::StreamExt;
use primus_config::NatsSettings;
use prost::Message;

use crate::Subjects;

/// Why a NATS operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// NATS could not be reached.
    #[error(
        "cannot connect to NATS at {url} (setting `nats.url`) after {attempts} attempts: {last}"
    )]
    Connect {
        /// The server.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: String,
    },
    /// A subject token that would change the subject's shape.
    #[error("`{0}` is not a valid subject token (no dots, spaces, `*` or `>`)")]
    InvalidToken(String),
    /// A publish failed.
    #[error("publish to {subject}: {message}")]
    Publish {
        /// The subject.
        subject: String,
        /// Why.
        message: String,
    },
    /// A subscription failed.
    #[error("subscribe to {subject}: {message}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// Why.
        message: String,
    },
    /// A message is not the type expected.
    #[error("message on {subject} is not a valid {type_name}: {message}")]
    Decode {
        /// The subject.
        subject: String,
        /// The type expected.
        type_name: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A JetStream operation failed.
    #[error("JetStream {what}: {message}")]
    JetStream {
        /// The operation.
        what: String,
        /// Why.
        message: String,
    },
    /// Flushing to the server failed.
    #[error("flush: {0}")]
    Flush(String),
}

/// A NATS connection plus the subject names of this cluster.
#[derive(Clone)]
pub struct Bus {
    client: Client,
    subjects: Subjects,
}

impl Bus {
    /// Connects, retrying with backoff up to `nats.connect_attempts` times.
    pub async fn connect(settings: &NatsSettings) -> Result<Self, BusError> {
        let subjects = Subjects::new(&settings.subject_prefix)?;
        let attempts = settings.connect_attempts.max(1);
        let mut backoff = Duration::from_millis(100);
        let mut last = String::new();
        for attempt in 1..=attempts {
            let options = ConnectOptions::new()
                .connection_timeout(Duration::from_millis(settings.connect_timeout_ms));
            match options.connect(settings.url.as_str()).await {
                Ok(client) => return Ok(Self { client, subjects }),
                Err(e) => {
                    last = e.to_string();
                    tracing::warn!(url = %primus_config::redact_url(&settings.url), attempt, error = %last, "NATS connect failed");
                }
            }
            if attempt < attempts {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
        Err(BusError::Connect {
            url: primus_config::redact_url(&settings.url),
            attempts,
            last,
        })
    }

    /// This cluster's subject names.
    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// The raw client, for what this crate does not wrap.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Whether the connection is up.
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Publishes `message` with the current trace context in its headers.
    #[expect(
        clippy::disallowed_methods,
        reason = "the bus is where every NATS publish happens"
    )]
    pub async fn publish<M: Message>(&self, subject: String, message: &M) -> Result<(), BusError> {
        let mut headers = HeaderMap::new();
        primus_telemetry::propagation::inject_nats(&mut headers);
        self.client
            .publish_with_headers(subject.clone(), headers, message.encode_to_vec().into())
            .await
            .map_err(|e| BusError::Publish {
                subject,
                message: e.to_string(),
            })
    }

    /// Subscribes to `subject` (wildcards allowed), decoding each message as `M`.
    pub async fn subscribe<M: Message + Default>(
        &self,
        subject: String,
    ) -> Result<Subscription<M>, BusError> {
        let inner =
            self.client
                .subscribe(subject.clone())
                .await
                .map_err(|e| BusError::Subscribe {
                    subject,
                    message: e.to_string(),
                })?;
        Ok(Subscription {
            inner,
            _message: PhantomData,
        })
    }

    /// Waits until everything published so far reached the server.
    pub async fn flush(&self) -> Result<(), BusError> {
        self.client
            .flush()
            .await
            .map_err(|e| BusError::Flush(e.to_string()))
    }

    /// Flushes, then closes subscriptions and the connection (graceful shutdown).
    pub async fn drain(&self) -> Result<(), BusError> {
        self.flush().await?;
        self.client
            .drain()
            .await
            .map_err(|e| BusError::Flush(e.to_string()))
    }
}

/// A decoded message and the span it should be handled in (child of the publisher's).
pub struct Received<M> {
    /// The subject it came on.
    pub subject: String,
    /// The decoded message.
    pub message: M,
    /// A `nats.receive` span, child of the publisher's.
    pub span: tracing::Span,
}

/// Messages of one subscription, decoded as `M`.
pub struct Subscription<M> {
    inner: async_nats::Subscriber,
    _message: PhantomData<M>,
}

impl<M: Message + Default> Subscription<M> {
    /// The next message; `None` once the subscription or connection is closed.
    /// A message that does not decode is an error for that message only.
    pub async fn next(&mut self) -> Option<Result<Received<M>, BusError>> {
        let raw = self.inner.next().await?;
        Some(decode(&raw.subject, raw.headers.as_ref(), &raw.payload))
    }
}

pub(crate) fn decode<M: Message + Default>(
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<Received<M>, BusError> {
    let message = M::decode(payload).map_err(|e| BusError::Decode {
        subject: subject.to_owned(),
        type_name: std::any::type_name::<M>(),
        message: e.to_string(),
    })?;
    Ok(Received {
        subject: subject.to_owned(),
        span: primus_telemetry::propagation::nats_span(subject, headers),
        message,
    })
}
