//! JSON over plain HTTP beside gRPC: one mapping of a gRPC status to the HTTP answer a
//! caller acts on alike (a replica's Predict, the API server's dashboard).

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tonic::{Code, Status};

/// `body` as an `application/json` answer with `status`.
pub fn json_reply(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A failed call as `{"code": "...", "error": "..."}` with the HTTP status of its code.
pub fn error_reply(error: &Status) -> Response {
    let body = serde_json::json!({
        "code": format!("{:?}", error.code()),
        "error": error.message(),
    });
    json_reply(http_status(error.code()), body.to_string())
}

/// The `authorization` header's value (None when absent; empty when not text).
pub fn authorization(headers: &HeaderMap) -> Option<&str> {
    (headers.get(header::AUTHORIZATION)).map(|value| value.to_str().unwrap_or(""))
}

/// The HTTP status a caller of the gRPC code would act on alike.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
