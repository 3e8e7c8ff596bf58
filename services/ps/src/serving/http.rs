//! Predict over HTTP/JSON, beside gRPC on the replica's port: `POST /v1/predict` with
//! `{"job": "...", "samples": [{"feature": value, ...}, ...]}`. A value is a number, a
//! string, a list of ids (integers or strings) or null (as a left-out feature); the answer
//! is `{"probabilities": [...], "sparse_version": n, "dense_version": n}`, an error
//! `{"code": "...", "error": "..."}` with the HTTP status of its gRPC code. Same checks, same
//! scoring and same bearer tokens as the gRPC Predict.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use primus_proto::v1::feature_value::Value as Feature;
use primus_proto::v1::{FeatureValue, IntList, PredictRequest, Sample, StringList};
use primus_service::http::{authorization, error_reply, json_reply};
use serde::Deserialize;
use serde_json::{Value, json};
use tonic::Status;
use tracing::Instrument;

use super::Replica;

/// The route, over `replica`; bodies up to `max_body_bytes` (the gRPC request limit).
pub(super) fn routes(replica: Arc<Replica>, max_body_bytes: usize) -> axum::Router {
    axum::Router::new()
        .route("/v1/predict", axum::routing::post(predict))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(replica)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    #[serde(default)]
    job: String,
    samples: Vec<HashMap<String, Value>>,
}

async fn predict(State(replica): State<Arc<Replica>>, headers: HeaderMap, body: Bytes) -> Response {
    let answer = async {
        replica.authorize(authorization(&headers))?;
        let request = request(&body)?;
        let span = super::predict_span(request.samples.len());
        replica.answer(request).instrument(span).await
    };
    match answer.await {
        Ok(answer) => {
            let mut reply = json!({
                "probabilities": answer.probabilities,
                "sparse_version": answer.sparse_version,
                "dense_version": answer.dense_version,
            });
            if !answer.heads.is_empty() {
                let heads: serde_json::Map<String, Value> = (answer.heads.into_iter())
                    .map(|head| (head.name, json!(head.values)))
                    .collect();
                reply["heads"] = Value::Object(heads);
            }
            json_reply(StatusCode::OK, reply.to_string())
        }
        Err(status) => error_reply(&status),
    }
}

/// The JSON body as a PredictRequest; a bad body names where it is wrong.
fn request(body: &[u8]) -> Result<PredictRequest, Status> {
    let mut reader = serde_json::Deserializer::from_slice(body);
    let body: Body = serde_path_to_error::deserialize(&mut reader)
        .map_err(|e| Status::invalid_argument(format!("body: {e}")))?;
    let samples = body
        .samples
        .into_iter()
        .enumerate()
        .map(|(i, features)| {
            let features = features
                .into_iter()
                .map(|(name, value)| {
                    let value = feature(&value).map_err(|message| {
                        Status::invalid_argument(format!(
                            "samples[{i}]: feature {name:?}: {message}"
                        ))
                    })?;
                    Ok((name, FeatureValue { value }))
                })
                .collect::<Result<_, Status>>()?;
            Ok(Sample { features })
        })
        .collect::<Result<_, Status>>()?;
    Ok(PredictRequest {
        job: body.job,
        samples,
    })
}

/// Integers a double holds exactly.
const EXACT_IN_F64: u64 = 1 << 53;

/// One JSON value as a feature value (None: null).
fn feature(value: &Value) -> Result<Option<Feature>, String> {
    Ok(Some(match value {
        Value::Null => return Ok(None),
        Value::Number(n) => match n.as_i64() {
            // Ids beyond 2^53 stay exact as a one-element id list.
            Some(id) if id.unsigned_abs() > EXACT_IN_F64 => {
                Feature::Integers(IntList { values: vec![id] })
            }
            _ => Feature::Number(
                n.as_f64()
                    .ok_or_else(|| format!("{n} does not fit a 64-bit number"))?,
            ),
        },
        Value::String(text) => Feature::Text(text.clone()),
        Value::Array(items) => list(items)?,
        Value::Bool(_) | Value::Object(_) => {
            return Err("takes a number, a string, a list of ids or null".into());
        }
    }))
}

/// A list of ids: all integers or all strings.
fn list(items: &[Value]) -> Result<Feature, String> {
    if let Some(texts) = items
        .iter()
        .map(|item| item.as_str().map(str::to_owned))
        .collect::<Option<Vec<String>>>()
    {
        return Ok(Feature::Texts(StringList { values: texts }));
    }
    items
        .iter()
        .map(Value::as_i64)
        .collect::<Option<Vec<i64>>>()
        .map(|values| Feature::Integers(IntList { values }))
        .ok_or_else(|| "a list of ids holds integers only or strings only".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_values_become_the_feature_values_grpc_takes() {
        let request = request(
            br#"{"job": "ctr", "samples": [{"price": 1.5, "age": null, "item": 9007199254740993,
                 "shop": 3, "tags": ["a", "b"], "ids": [1, 2], "none": []}]}"#,
        )
        .expect("valid");
        assert_eq!(request.job, "ctr");
        let sample = &request.samples[0].features;
        let value = |name: &str| sample[name].value.clone();
        assert_eq!(value("price"), Some(Feature::Number(1.5)));
        assert_eq!(value("age"), None);
        assert_eq!(
            value("item"),
            Some(Feature::Integers(IntList {
                values: vec![9_007_199_254_740_993]
            }))
        );
        assert_eq!(value("shop"), Some(Feature::Number(3.0)));
        assert_eq!(
            value("tags"),
            Some(Feature::Texts(StringList {
                values: vec!["a".into(), "b".into()]
            }))
        );
        assert_eq!(
            value("ids"),
            Some(Feature::Integers(IntList { values: vec![1, 2] }))
        );
        assert_eq!(
            value("none"),
            Some(Feature::Texts(StringList { values: vec![] }))
        );
    }

    #[test]
    fn a_bad_body_names_the_sample_and_feature_or_the_field() {
        let message = |body: &str| {
            request(body.as_bytes())
                .expect_err("refused")
                .message()
                .to_owned()
        };
        assert_eq!(
            message(r#"{"samples": [{"a": 1}, {"tags": [1, "x"]}]}"#),
            "samples[1]: feature \"tags\": a list of ids holds integers only or strings only"
        );
        assert_eq!(
            message(r#"{"samples": [{"flag": true}]}"#),
            "samples[0]: feature \"flag\": takes a number, a string, a list of ids or null"
        );
        assert!(
            message(r#"{"samples": [], "model": "x"}"#).starts_with("body: "),
            "an unknown field"
        );
        assert!(
            message(r#"{"samples": [{"a": 1}, 7]}"#).contains("samples[1]"),
            "{}",
            message(r#"{"samples": [{"a": 1}, 7]}"#)
        );
        assert!(message("not json").starts_with("body: "));
    }
}
