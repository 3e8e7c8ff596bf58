//! What a [`Node`](crate::Node) serves: gRPC services (named, so reflection describes
//! exactly these) and, beside them on the same port, plain HTTP routes.

use std::convert::Infallible;

use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tonic::service::Routes;

/// The gRPC services and HTTP routes of one listener.
#[derive(Default)]
pub struct Services {
    routes: Routes,
    names: Vec<&'static str>,
}

impl Services {
    /// Nothing added: a node serving only health and reflection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a gRPC service.
    #[must_use]
    pub fn grpc<S>(mut self, service: S) -> Self
    where
        S: Service<http::Request<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        self.routes = self.routes.add_service(service);
        self.names.push(S::NAME);
        self
    }

    /// Adds plain HTTP routes (HTTP/1.1 or h2, on the gRPC port).
    #[must_use]
    pub fn http(mut self, router: axum::Router) -> Self {
        let routes = self.routes.axum_router_mut();
        *routes = std::mem::take(routes).merge(router);
        self
    }

    /// The fully qualified names of the gRPC services added.
    pub fn names(&self) -> &[&'static str] {
        &self.names
    }

    pub(crate) fn into_routes(self) -> Routes {
        self.routes
    }
}
