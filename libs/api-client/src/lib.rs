//! The API server's client: connects over plaintext or TLS, sends the bearer token and the
//! trace context with every call, and speaks in [`primus_spec`] resources where it helps.
//! Used by the `primus` CLI, the master's job controller and the tests.

#![warn(missing_docs)]

mod document;

pub use document::document;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use primus_proto::v1::api_service_client::ApiServiceClient;
use primus_proto::v1::{
    ApplyRequest, ApplyResponse, DeleteRequest, GetRequest, ListRequest, ListResponse, Resource,
    ResourceEvent, UpdateStatusRequest, WatchRequest,
};
use primus_spec::Kind;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Status, Streaming};

/// Where the API server is and how to prove who we are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSettings {
    /// `http://host:port`, or `https://host:port` for a TLS listener.
    pub server: String,
    /// The bearer token (`Debug` shows it redacted).
    pub token: primus_config::Secret,
    /// PEM of the CA that signed the server's certificate (default: the system's roots).
    pub ca_file: Option<PathBuf>,
}

/// Why a call to the API server failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server address is not a URL.
    #[error("server address {server:?}: {message}")]
    Address {
        /// The address given.
        server: String,
        /// What is wrong.
        message: String,
    },
    /// The token cannot travel in a header.
    #[error("the token is not a valid header value (printable ASCII only)")]
    Token,
    /// The CA certificate cannot be read.
    #[error("cannot read CA certificate {path}: {message}")]
    CaFile {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The server cannot be reached.
    #[error("cannot connect to the API server at {server}: {message}")]
    Connect {
        /// The address.
        server: String,
        /// Why.
        message: String,
    },
    /// The server answered with an error. (Not a `source`: the message already says the
    /// status's code and message, and a source would say them again.)
    #[error("{}", describe(.0))]
    Status(Status),
    /// A response lacked its resource.
    #[error("the server sent a response without its resource")]
    MissingResource,
    /// The token file cannot be read, or holds no token.
    #[error("api.token_file: {0}")]
    TokenFile(String),
}

fn describe(status: &Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

impl From<Status> for ClientError {
    fn from(status: Status) -> Self {
        Self::Status(status)
    }
}

impl ClientError {
    /// The gRPC code, if the server answered.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ClientError::Status(status) => Some(status.code()),
            _ => None,
        }
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl ClientSettings {
    /// The client settings of a service's `api` section: the token is the first one in
    /// `api.token_file` (required: the API server only answers with a token).
    pub fn from_settings(api: &primus_config::ApiSettings) -> Result<Self, ClientError> {
        let path = api.token_file.as_ref().ok_or_else(|| {
            ClientError::TokenFile("required: the API server only answers with a token".into())
        })?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClientError::TokenFile(format!("{}: {e}", path.display())))?;
        let token = primus_config::tokens_in(&text)
            .next()
            .ok_or_else(|| ClientError::TokenFile(format!("{}: no token in it", path.display())))?;
        Ok(Self {
            server: api.server.clone(),
            token: token.into(),
            ca_file: api.ca_file.clone(),
        })
    }
}

/// Adds `authorization: Bearer <token>` and the trace context to every call.
#[derive(Clone)]
pub struct Credentials {
    authorization: AsciiMetadataValue,
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        request
            .metadata_mut()
            .insert("authorization", self.authorization.clone());
        primus_telemetry::propagation::inject_grpc(request.metadata_mut());
        Ok(request)
    }
}

/// A connected client; cheap to clone (calls share one HTTP/2 connection).
#[derive(Clone)]
pub struct ApiClient {
    inner: ApiServiceClient<InterceptedService<Channel, Credentials>>,
}

impl ApiClient {
    /// Connects, retrying every 500 ms up to `attempts` times: in a cluster starting up
    /// the API server may come up after its clients.
    pub async fn connect_patiently(
        settings: &ClientSettings,
        attempts: u32,
    ) -> Result<Self, ClientError> {
        let mut attempt = 1;
        loop {
            match Self::connect(settings).await {
                Ok(api) => return Ok(api),
                Err(e) if attempt < attempts => {
                    tracing::warn!(attempt, error = %e, "API server not reachable yet");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Connects (the channel connects lazily; a bad address or CA file fails here).
    pub async fn connect(settings: &ClientSettings) -> Result<Self, ClientError> {
        let address_error = |message: String| ClientError::Address {
            server: settings.server.clone(),
            message,
        };
        let mut endpoint = Endpoint::from_shared(settings.server.clone())
            .map_err(|e| address_error(e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT);
        if settings.server.starts_with("https://") {
            endpoint = endpoint
                .tls_config(tls_config(settings)?)
                .map_err(|e| address_error(e.to_string()))?;
        } else if !settings.server.starts_with("http://") {
            return Err(address_error("must start with http:// or https://".into()));
        }
        let authorization = format!("Bearer {}", settings.token.expose())
            .parse()
            .map_err(|_| ClientError::Token)?;
        let channel = endpoint.connect().await.map_err(|e| ClientError::Connect {
            server: settings.server.clone(),
            message: primus_telemetry::error_chain(&e),
        })?;
        let inner = ApiServiceClient::with_interceptor(channel, Credentials { authorization })
            .max_decoding_message_size(64 << 20);
        Ok(Self { inner })
    }

    /// Creates or updates; `expected_version` 0 overwrites, otherwise compare-and-swap.
    pub async fn apply(
        &self,
        resource: &primus_spec::Resource,
        expected_version: u64,
    ) -> Result<ApplyResponse, ClientError> {
        let spec_json = resource
            .spec_json()
            .map_err(|e| Status::invalid_argument(format!("spec: {e}")))?;
        let metadata = resource.metadata();
        let request = ApplyRequest {
            resource: Some(Resource {
                kind: resource.kind().as_str().into(),
                name: metadata.name.clone(),
                labels: metadata.labels.clone().into_iter().collect(),
                spec_json,
                ..Resource::default()
            }),
            expected_version,
        };
        self.apply_raw(request).await
    }

    /// Apply with the request as given (no client-side validation).
    pub async fn apply_raw(&self, request: ApplyRequest) -> Result<ApplyResponse, ClientError> {
        Ok(self.inner.clone().apply(request).await?.into_inner())
    }

    /// Resource `name` of `kind`.
    pub async fn get(&self, kind: Kind, name: &str) -> Result<Resource, ClientError> {
        let request = GetRequest {
            kind: kind.as_str().into(),
            name: name.into(),
        };
        let response = self.inner.clone().get(request).await?.into_inner();
        response.resource.ok_or(ClientError::MissingResource)
    }

    /// Every resource of `kind` whose labels include `selector`, and the version to watch from.
    pub async fn list(
        &self,
        kind: Kind,
        selector: HashMap<String, String>,
    ) -> Result<ListResponse, ClientError> {
        let request = ListRequest {
            kind: kind.as_str().into(),
            label_selector: selector,
        };
        Ok(self.inner.clone().list(request).await?.into_inner())
    }

    /// Deletes resource `name` of `kind`; `expected_version` > 0 deletes only that version.
    pub async fn delete(
        &self,
        kind: Kind,
        name: &str,
        expected_version: u64,
    ) -> Result<Resource, ClientError> {
        let request = DeleteRequest {
            kind: kind.as_str().into(),
            name: name.into(),
            expected_version,
        };
        let response = self.inner.clone().delete(request).await?.into_inner();
        response.resource.ok_or(ClientError::MissingResource)
    }

    /// Replaces `name`'s status; `expected_version` > 0 replaces only that version's.
    pub async fn update_status(
        &self,
        kind: Kind,
        name: &str,
        status: &primus_spec::status::Status,
        expected_version: u64,
    ) -> Result<Resource, ClientError> {
        let status_json = serde_json_status(status)?;
        let request = UpdateStatusRequest {
            kind: kind.as_str().into(),
            name: name.into(),
            status_json,
            expected_version,
        };
        let response = self
            .inner
            .clone()
            .update_status(request)
            .await?
            .into_inner();
        response.resource.ok_or(ClientError::MissingResource)
    }

    /// Changes after `since_version` (0: from now), filtered by kind and name when given.
    /// OUT_OF_RANGE means the version is no longer replayable: list again.
    pub async fn watch(
        &self,
        kind: Option<Kind>,
        name: Option<&str>,
        since_version: u64,
    ) -> Result<Streaming<ResourceEvent>, ClientError> {
        let request = WatchRequest {
            kind: kind.map(|k| k.as_str().to_owned()).unwrap_or_default(),
            name: name.unwrap_or_default().into(),
            since_version,
        };
        Ok(self.inner.clone().watch(request).await?.into_inner())
    }
}

fn serde_json_status(status: &primus_spec::status::Status) -> Result<String, ClientError> {
    serde_json::to_string(status)
        .map_err(|e| ClientError::Status(Status::invalid_argument(format!("status: {e}"))))
}

fn tls_config(settings: &ClientSettings) -> Result<ClientTlsConfig, ClientError> {
    let config = ClientTlsConfig::new();
    match &settings.ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| ClientError::CaFile {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            Ok(config.ca_certificate(Certificate::from_pem(pem)))
        }
        None => Ok(config.with_native_roots()),
    }
}
