//! deploy/docker-compose.yaml run by Docker Compose on a Docker engine of the test's own:
//! the compose example Job succeeds with its data and checkpoints in MinIO, its replica
//! answers Predict, Jaeger holds the trace of a PS push, the serving-sync cycle that moved
//! it and a Predict that used it, and the dashboard's trace page draws that path (its
//! screenshot in docs/tracing.md is taken here, with `PRIMUS_BLESS=1`).

use std::time::{Duration, Instant};

use primus_cluster_tests::compose::{ComposeDeployment, JOB, ROWS};
use primus_spec::status::ExecutorState;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_example_job_succeeds_with_minio_and_its_traces_reach_jaeger() {
    let deployment = ComposeDeployment::up().unwrap_or_else(|e| panic!("docker-compose up: {e}"));
    let data = deployment.objects("data/criteo-like").await;
    assert!(
        data.len() >= 24,
        "example-data wrote 24 windows to MinIO: {data:?}"
    );

    let (run, status) = deployment.run_example().await;
    eprintln!(
        "compose example: {} samples in {:.0}s, AUC {:.4}",
        run.samples, run.seconds, run.auc
    );
    assert_eq!(run.samples, ROWS, "{status:#?}");
    assert!(run.auc > 0.7, "AUC {:.4}: {status:#?}", run.auc);
    let checkpoints = deployment.objects(&format!("checkpoints/{JOB}")).await;
    assert!(
        !checkpoints.is_empty(),
        "the Job's checkpoints in MinIO: none"
    );

    let replica = (status.executors.iter())
        .find(|e| e.id == "serving-0")
        .unwrap_or_else(|| panic!("no serving replica: {:#?}", status.executors));
    // The replica serves on; the rest of the Job exited or was stopped.
    for executor in &status.executors {
        let running = executor.state == ExecutorState::Running;
        assert_eq!(
            running,
            executor.id == "serving-0",
            "{:#?}",
            status.executors
        );
    }
    let answer = deployment.predict_in_master(&replica.address, &samples(JOB));
    let probabilities = answer["probabilities"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(probabilities.len(), 16, "{answer}");
    assert!(
        (probabilities.iter()).all(|p| p.as_f64().is_some_and(|p| p > 0.0 && p < 1.0)),
        "{answer}"
    );

    let walk = push_sync_predict(&deployment, Duration::from_secs(90))
        .unwrap_or_else(|e| panic!("{e}\n{}", deployment.diagnostics()));
    eprintln!("jaeger: {walk}");

    // The same path on the dashboard's trace page, in Chromium.
    let screenshot = primus_browser::screenshot_path("traces.png", &std::env::temp_dir());
    let browser = primus_browser::script(
        "traces.cjs",
        &deployment.dashboard(),
        &deployment.token(),
        JOB,
        &screenshot,
    )
    .output()
    .expect("node runs (scripts/install-deps.sh installs it)");
    let said = String::from_utf8_lossy(&browser.stdout);
    eprintln!("traces.cjs: {said}");
    assert!(
        browser.status.success() && said.lines().last() == Some("ok"),
        "the trace page ({}): {said}{}",
        browser.status,
        String::from_utf8_lossy(&browser.stderr)
    );
    deployment.down();
}

/// 16 samples of the example's features.
fn samples(job: &str) -> Value {
    let samples: Vec<Value> = (0..16)
        .map(|i| json!({"i1": i, "i5": 402, "c1": 1204 + i, "c2": 87}))
        .collect();
    json!({"job": job, "samples": samples})
}

/// Asks Jaeger (until `timeout`, while the exporters' batches arrive) for a serving-sync
/// cycle that links a PS push, the push's trace (a trainer step of the Job pushing to a
/// shard at a version), and a Predict whose replica holds that shard at that version or
/// later; says what it found.
fn push_sync_predict(deployment: &ComposeDeployment, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let found = find_push_sync_predict(deployment);
        match found {
            Ok(found) => return Ok(found),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_secs(3)),
        }
    }
}

fn find_push_sync_predict(deployment: &ComposeDeployment) -> Result<String, String> {
    let cycles = deployment.jaeger_query(
        "/api/traces?service=primus-serving-sync&operation=serving_sync.sparse&limit=500&lookback=2h",
    );
    let (cycle, push_trace, push_span) = (cycles.as_array().into_iter().flatten())
        .filter(|trace| (spans(trace)).any(|s| operation(s).ends_with("ServingService/ApplyDelta")))
        .find_map(|trace| {
            let cycle = spans(trace).find(|s| operation(s) == "serving_sync.sparse")?;
            let link = (cycle["references"].as_array().into_iter().flatten())
                .find(|r| r["refType"] == "FOLLOWS_FROM")?;
            Some((
                cycle.clone(),
                link["traceID"].as_str()?.to_owned(),
                link["spanID"].as_str()?.to_owned(),
            ))
        })
        .ok_or("no serving_sync.sparse span with an ApplyDelta and a link to a push yet")?;

    let traces = deployment.jaeger_query(&format!("/api/traces/{push_trace}"));
    let trace = traces
        .get(0)
        .ok_or(format!("the linked trace {push_trace}: not found"))?;
    let push = spans(trace)
        .find(|s| s["spanID"] == push_span.as_str())
        .ok_or(format!("span {push_span}: not in trace {push_trace}"))?;
    if operation(push) != "ps.push_tables" || service(trace, push) != "primus-ps" {
        return Err(format!("the cycle links {push}, not a ps.push_tables span"));
    }
    let shard = process_tag(trace, push, "service.instance.id")
        .ok_or("the push's process has no service.instance.id")?;
    let version = tag(push, "primus.version")
        .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
        .ok_or(format!("the push has no primus.version: {push}"))?;
    let ancestors: Vec<(String, String)> = ancestors(trace, push)
        .map(|s| (service(trace, s), operation(s).to_owned()))
        .collect();
    for (process, name) in [
        ("primus-trainer", "trainer.push"),
        ("primus-trainer", "trainer.step"),
    ] {
        if !ancestors.iter().any(|(p, n)| p == process && n == name) {
            return Err(format!(
                "the push's ancestors {ancestors:?} lack {process} {name}"
            ));
        }
    }

    let predicts = deployment.jaeger_query(
        "/api/traces?service=primus-ps&operation=serving.predict&limit=100&lookback=2h",
    );
    let cycle_start = cycle["startTime"].as_u64().unwrap_or(0);
    let held = |applied: &str| {
        applied
            .split_whitespace()
            .filter_map(|pair| pair.split_once('='))
            .find(|(s, _)| *s == shard)
            .and_then(|(_, v)| v.parse::<u64>().ok())
    };
    let predict = (predicts.as_array().into_iter().flatten())
        .flat_map(|trace| spans(trace).map(move |s| (trace, s)))
        .find(|(_, s)| {
            operation(s) == "serving.predict"
                && s["startTime"].as_u64().unwrap_or(0) > cycle_start
                && (tag(s, "primus.applied").and_then(Value::as_str))
                    .and_then(held)
                    .is_some_and(|v| v >= version)
        })
        .ok_or(format!(
            "no serving.predict after the cycle holding {shard} at version {version} or later"
        ))?;
    Ok(format!(
        "push to {shard} at version {version} (trace {push_trace}) under {ancestors:?}; \
         moved by serving_sync.sparse {} (trace {}); used by serving.predict of {} with {}",
        cycle["spanID"].as_str().unwrap_or_default(),
        cycle["traceID"].as_str().unwrap_or_default(),
        process_tag(predict.0, predict.1, "service.instance.id").unwrap_or_default(),
        tag(predict.1, "primus.applied").unwrap_or(&Value::Null),
    ))
}

fn spans(trace: &Value) -> impl Iterator<Item = &Value> {
    trace["spans"].as_array().into_iter().flatten()
}

fn operation(span: &Value) -> &str {
    span["operationName"].as_str().unwrap_or_default()
}

fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    (span["tags"].as_array().into_iter().flatten())
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

fn process<'a>(trace: &'a Value, span: &Value) -> &'a Value {
    let id = span["processID"].as_str().unwrap_or_default();
    &trace["processes"][id]
}

fn service(trace: &Value, span: &Value) -> String {
    process(trace, span)["serviceName"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn process_tag(trace: &Value, span: &Value, key: &str) -> Option<String> {
    (process(trace, span)["tags"]
        .as_array()
        .into_iter()
        .flatten())
    .find(|t| t["key"] == key)
    .and_then(|t| t["value"].as_str())
    .map(str::to_owned)
}

/// The span's parents, nearest first.
fn ancestors<'a>(trace: &'a Value, span: &'a Value) -> impl Iterator<Item = &'a Value> {
    std::iter::successors(parent(trace, span), move |s| parent(trace, s))
}

fn parent<'a>(trace: &'a Value, span: &Value) -> Option<&'a Value> {
    let reference = (span["references"].as_array().into_iter().flatten())
        .find(|r| r["refType"] == "CHILD_OF")?;
    spans(trace).find(|s| s["spanID"] == reference["spanID"])
}
