//! A resource as one JSON document: what `primus get -o json|yaml` prints and the API
//! server's dashboard serves.

use primus_proto::v1::Resource;
use serde_json::{Value, json};

/// `{kind, metadata: {name, labels, resource_version, generation, created_unix_ms,
/// updated_unix_ms}, spec, status}`, spec and status as JSON values (null where empty, the
/// stored text where it is not JSON).
pub fn document(resource: &Resource) -> Value {
    let parsed = |text: &str| match text {
        "" => Value::Null,
        text => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned())),
    };
    json!({
        "kind": resource.kind,
        "metadata": {
            "name": resource.name,
            "labels": resource.labels,
            "resource_version": resource.resource_version,
            "generation": resource.generation,
            "created_unix_ms": resource.created_unix_ms,
            "updated_unix_ms": resource.updated_unix_ms,
        },
        "spec": parsed(&resource.spec_json),
        "status": parsed(&resource.status_json),
    })
}
