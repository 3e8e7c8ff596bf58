use serde_json::{Value, json};

use super::*;

/// A span in Jaeger's JSON: (span id, parent, operation, process, start, tags, links).
fn span(
    id: &str,
    parent: Option<&str>,
    operation: &str,
    process: &str,
    start: u64,
    tags: Value,
    links: &[(&str, &str)],
) -> Value {
    let mut references: Vec<Value> = parent
        .map(|p| json!({"refType": "CHILD_OF", "traceID": "T", "spanID": p}))
        .into_iter()
        .collect();
    references.extend(
        (links.iter()).map(|(t, s)| json!({"refType": "FOLLOWS_FROM", "traceID": t, "spanID": s})),
    );
    let tags: Vec<Value> = (tags.as_object().into_iter().flatten())
        .map(|(k, v)| json!({"key": k, "type": "string", "value": v}))
        .collect();
    json!({"spanID": id, "operationName": operation, "references": references,
           "startTime": start, "duration": 10, "tags": tags, "processID": process})
}

/// Jaeger's `data` for one trace `id` of `spans` (their `traceID` set to it).
fn trace(id: &str, spans: Vec<Value>) -> Value {
    let spans: Vec<Value> = spans
        .into_iter()
        .map(|mut s| {
            s["traceID"] = json!(id);
            for r in s["references"].as_array_mut().into_iter().flatten() {
                if r["refType"] == "CHILD_OF" {
                    r["traceID"] = json!(id);
                }
            }
            s
        })
        .collect();
    let process = |service: &str, instance: &str| {
        json!({"serviceName": service, "tags": [
            {"key": "service.instance.id", "type": "string", "value": instance},
            {"key": "primus.job", "type": "string", "value": "ctr"}]})
    };
    json!({"traceID": id, "spans": spans, "processes": {
        "data": process("primus-data-executor", "data_executor-0"),
        "trainer": process("primus-trainer", "trainer-0"),
        "ps0": process("primus-ps", "ps-0"),
        "ps1": process("primus-ps", "ps-1"),
        "sync": json!({"serviceName": "primus-serving-sync", "tags": []}),
        "serving": process("primus-ps", "serving-0"),
    }})
}

fn step_trace() -> Value {
    trace(
        "A",
        vec![
            span(
                "task",
                None,
                "data task criteo",
                "data",
                100,
                json!({}),
                &[],
            ),
            span(
                "step",
                Some("task"),
                "trainer.step",
                "trainer",
                200,
                json!({}),
                &[],
            ),
            span(
                "compute",
                Some("step"),
                "trainer.compute",
                "trainer",
                210,
                json!({}),
                &[],
            ),
            span(
                "push",
                Some("step"),
                "trainer.push",
                "trainer",
                300,
                json!({}),
                &[],
            ),
            span(
                "call1",
                Some("push"),
                "/primus.v1.ParameterServer/PushTables",
                "trainer",
                301,
                json!({}),
                &[],
            ),
            span(
                "ps1",
                Some("call1"),
                "ps.push_tables",
                "ps1",
                302,
                json!({"primus.version": 42}),
                &[],
            ),
            span(
                "step2",
                Some("task"),
                "trainer.step",
                "trainer",
                400,
                json!({}),
                &[],
            ),
        ],
    )
}

fn cycle_trace(id: &str, start: u64, applied: bool) -> Value {
    let mut spans = vec![span(
        "cycle",
        None,
        "serving_sync.sparse",
        "sync",
        start,
        json!({"primus.job": "ctr"}),
        &[("A", "ps1")],
    )];
    if applied {
        spans.push(span(
            "apply",
            Some("cycle"),
            "/primus.v1.ServingService/ApplyDelta",
            "sync",
            start + 5,
            json!({}),
            &[],
        ));
    }
    trace(id, spans)
}

fn predict_trace(id: &str, start: u64, applied: &str) -> Value {
    trace(
        id,
        vec![span(
            "p",
            None,
            "serving.predict",
            "serving",
            start,
            json!({"primus.applied": applied}),
            &[],
        )],
    )
}

#[test]
fn a_push_is_followed_from_its_step_through_the_cycle_that_moved_it_to_the_predicts_that_held_it() {
    let steps = traces(&json!([step_trace()]));
    let cycles = traces(&json!([
        cycle_trace("C1", 500, false),
        cycle_trace("C2", 600, true)
    ]));
    let linked: Vec<_> = linked_pushes(&cycles, "ctr").collect();
    assert_eq!(linked.len(), 1, "only the cycle that applied a delta");
    let (cycle, (trace_id, span_id)) = &linked[0];
    assert_eq!((trace_id.as_str(), span_id.as_str()), ("A", "ps1"));
    let ops: Vec<(&str, usize)> = cycle
        .iter()
        .map(|s| (s.operation.as_str(), s.depth))
        .collect();
    assert_eq!(
        ops,
        [
            ("serving_sync.sparse", 0),
            ("/primus.v1.ServingService/ApplyDelta", 1)
        ]
    );

    let (step, push) = step_of_push(&steps[0], span_id).expect("the push's step");
    assert_eq!(
        push,
        PushedAt {
            shard: "ps-1".into(),
            version: 42
        }
    );
    let ops: Vec<(&str, usize)> = step
        .iter()
        .map(|s| (s.operation.as_str(), s.depth))
        .collect();
    assert_eq!(
        ops,
        [
            ("trainer.step", 0),
            ("trainer.compute", 1),
            ("trainer.push", 1),
            ("/primus.v1.ParameterServer/PushTables", 2),
            ("ps.push_tables", 3),
        ]
    );
    assert_eq!(step[4].instance, "ps-1");
    assert!(step_of_push(&steps[0], "step").is_none(), "not a push span");

    let predicts = traces(&json!([
        predict_trace("P1", 550, "ps-0=10 ps-1=50"),
        predict_trace("P2", 700, "ps-0=10 ps-1=41"),
        predict_trace("P3", 900, "ps-0=10 ps-1=43"),
        predict_trace("P4", 800, "ps-0=10 ps-1=42"),
    ]));
    let used: Vec<String> = predicts_using(&predicts, "ctr", &push, 600)
        .iter()
        .map(|p| p[0].trace_id.clone())
        .collect();
    assert_eq!(
        used,
        ["P4", "P3"],
        "after the cycle, holding ps-1 at 42 or later, earliest first"
    );
    assert!(
        predicts_using(&predicts, "other", &push, 600).is_empty(),
        "another Job's replica"
    );
}

#[test]
fn without_a_sync_the_newest_step_of_the_job_is_shown() {
    let steps = traces(&json!([step_trace()]));
    let step = newest_step(&steps, "ctr").expect("a step");
    assert_eq!(step[0].span_id, "step2");
    assert!(newest_step(&steps, "other").is_none());
    assert!(linked_pushes(&steps, "ctr").next().is_none());
}

#[test]
fn numbers_are_read_as_numbers_or_as_text() {
    assert_eq!(number(&json!(42)), Some(42));
    assert_eq!(number(&json!("18446744073709551615")), Some(u64::MAX));
    assert_eq!(number(&json!("x")), None);
}

#[test]
fn query_values_are_percent_encoded() {
    assert_eq!(encode("data task a/b c"), "data%20task%20a%2Fb%20c");
    assert_eq!(encode("serving_sync.sparse"), "serving_sync.sparse");
}
