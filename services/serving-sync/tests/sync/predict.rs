//! Predict on serving replicas: it scores as the trainer's forward pass does (nulls
//! imputed as in training), names bad features, and answers over HTTP/JSON as over gRPC
//! behind the same bearer tokens.

use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, Float32Array, Float64Array, Int64Array, RecordBatch};
use primus_batch::FeaturePipeline;
use primus_model::pooling::{BatchKeys, CpuKernels};
use primus_model::{Inputs, Model, ParamSet, ParamTensor, Tower};
use primus_proto::v1::feature_value::Value;
use primus_proto::v1::{FeatureValue, PredictRequest, Sample};
use primus_testkit::restartable_port;
use primus_testkit::service::{http_request, reflected_services};
use tonic::Code;

use super::{Cluster, JOB, number, predict, sample, serving_client};

#[tokio::test(flavor = "multi_thread")]
async fn predict_names_a_feature_of_a_wrong_type() {
    let cluster = Cluster::start().await;
    let _sync = cluster.synced().await;
    let mut client = serving_client(&cluster.replicas[0].addr).await;
    let mut unknown = sample(1);
    unknown.features.insert("colour".into(), number(1.0));
    let mut wrong = sample(2);
    wrong.features.insert(
        "price".into(),
        FeatureValue {
            value: Some(Value::Text("cheap".into())),
        },
    );
    let mut fraction = sample(3);
    fraction.features.insert("item".into(), number(1.5));
    for (bad, feature) in [(unknown, "colour"), (wrong, "price"), (fraction, "item")] {
        let status = client
            .predict(PredictRequest {
                job: JOB.into(),
                samples: vec![sample(0), bad],
            })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
        assert!(
            status
                .message()
                .contains(&format!("samples[1]: feature \"{feature}\"")),
            "{}",
            status.message()
        );
    }
    let other_job = client
        .predict(PredictRequest {
            job: "other".into(),
            samples: vec![sample(0)],
        })
        .await
        .expect_err("refused");
    assert_eq!(other_job.code(), Code::NotFound);
}

/// Which features sample `i` of the parity rows leaves null, as a training file's cell may
/// be: every pattern of dense, single-id and multi-hot nulls, and one row of nothing.
fn null_in_row(i: usize, feature: &str) -> bool {
    match feature {
        _ if i == 11 => true,
        "price" => i.is_multiple_of(2),
        "age" => i.is_multiple_of(3),
        "item" => i % 4 == 1,
        "shop" => i % 5 == 2,
        "tags" => i % 3 == 1,
        _ => false,
    }
}

/// The parity rows as the columns of a training file (nulls where [`null_in_row`] says).
fn parity_columns(rows: usize) -> RecordBatch {
    let null = |i: usize, f: &str| null_in_row(i, f);
    let price: Float64Array = (0..rows)
        .map(|i| (!null(i, "price")).then_some(12.5 + i as f64))
        .collect();
    let age: Float64Array = (0..rows)
        .map(|i| (!null(i, "age")).then_some(0.3))
        .collect();
    let item: Int64Array = (0..rows)
        .map(|i| (!null(i, "item")).then_some(i as i64))
        .collect();
    let shop: Int64Array = (0..rows)
        .map(|i| (!null(i, "shop")).then_some((i % 7) as i64))
        .collect();
    let mut tags = ListBuilder::new(StringBuilder::new());
    for i in 0..rows {
        if null(i, "tags") {
            tags.append(false);
        } else {
            tags.values().append_value(format!("t{}", i % 5));
            tags.values().append_value("sale");
            tags.append(true);
        }
    }
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("label", Arc::new(Float32Array::from(vec![0.0f32; rows]))),
        ("watch", Arc::new(Float32Array::from(vec![0.0f32; rows]))),
        ("price", Arc::new(price)),
        ("age", Arc::new(age)),
        ("item", Arc::new(item)),
        ("shop", Arc::new(shop)),
        ("tags", Arc::new(tags.finish())),
    ];
    RecordBatch::try_from_iter(columns).expect("columns")
}

/// What the trainer's forward pass gives `batch`: the training pipeline, the rows looked
/// up from the training PS, pooled, through the dense parameters the PS holds.
async fn trainer_forward(cluster: &Cluster, batch: &RecordBatch) -> Vec<f32> {
    let heads = trainer_forward_heads(cluster, batch).await;
    heads.into_iter().next().expect("a head")
}

/// [`trainer_forward`] of every head, in the layout's order.
async fn trainer_forward_heads(cluster: &Cluster, batch: &RecordBatch) -> Vec<Vec<f32>> {
    let minibatch = FeaturePipeline::new(&cluster.schema)
        .minibatch(batch)
        .expect("minibatch");
    let keys =
        BatchKeys::collect(&cluster.layout, &minibatch.to_kjt().expect("kjt")).expect("keys");
    let mut rows = Vec::new();
    for (slot, unique) in cluster.layout.tables.iter().zip(&keys.tables) {
        let (weights, _) = cluster
            .training
            .lookup(&slot.name, unique)
            .await
            .expect("lookup");
        rows.push(weights);
    }
    let embedded = keys
        .pool(&CpuKernels, &cluster.layout, &rows)
        .expect("pool");
    let model = Model::new(cluster.layout.clone()).expect("a model of the layout");
    let mut params = ParamSet::init(&cluster.layout, 0);
    let pulled = cluster
        .training
        .pull_dense(&params.names())
        .await
        .expect("pull dense");
    params
        .assign(pulled.into_iter().map(ParamTensor::from).collect())
        .expect("dense parameters");
    let inputs = Inputs {
        rows: batch.num_rows(),
        dense: model.dense_inputs(&minibatch).expect("dense inputs"),
        embedded: &embedded,
        wide: &[],
    };
    model
        .predict_heads(&params, &inputs, Tower::Adapt)
        .expect("forward")
}

#[tokio::test(flavor = "multi_thread")]
async fn predict_answers_each_head_of_a_graph_by_name_as_the_trainer_computes_it() {
    let cluster = Cluster::start_with(&super::two_heads()).await;
    let rows = 12;
    let _sync = cluster.synced().await;
    let samples: Vec<Sample> = (0..rows)
        .map(|i| {
            let mut s = sample(i as i64);
            s.features.retain(|feature, _| !null_in_row(i, feature));
            s
        })
        .collect();
    let mut client = serving_client(&cluster.replicas[0].addr).await;
    let answer = (client.predict(PredictRequest {
        job: JOB.into(),
        samples: samples.clone(),
    }))
    .await
    .expect("predict")
    .into_inner();
    let trained = trainer_forward_heads(&cluster, &parity_columns(rows)).await;
    let names: Vec<&str> = answer.heads.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["click", "watch"]);
    assert_eq!(
        answer.probabilities, answer.heads[0].values,
        "the first head's"
    );
    for ((head, trained), name) in answer.heads.iter().zip(&trained).zip(names) {
        assert_eq!(head.values.len(), rows, "{name}");
        for (i, (s, t)) in head.values.iter().zip(trained).enumerate() {
            assert!(
                (s - t).abs() <= 1e-5 * t.abs().max(1.0),
                "{name} row {i}: Predict {s}, the trainer's forward pass {t}"
            );
        }
    }
    assert_ne!(answer.heads[0].values, answer.heads[1].values);

    let body = serde_json::json!({
        "job": JOB,
        "samples": [{"price": 3.0, "item": 4, "tags": ["sale"]}],
    })
    .to_string();
    let (status, reply) = http_request(
        &cluster.replicas[0].addr,
        "POST",
        "/v1/predict",
        &[("content-type", "application/json")],
        &body,
    )
    .await
    .expect("http");
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).expect("json");
    let heads = reply["heads"].as_object().expect("heads by name");
    assert_eq!(heads.keys().collect::<Vec<_>>(), ["click", "watch"]);
    assert_eq!(reply["heads"]["click"], reply["probabilities"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn predict_scores_as_the_trainers_forward_pass_with_nulls_imputed_as_in_training() {
    let cluster = Cluster::start().await;
    let rows = 12;
    for i in 0..rows {
        cluster.train_on(&sample(i as i64), 0.3).await;
    }
    let _sync = cluster.synced().await;
    // A null is left out of odd rows' samples and sent without a value in even rows'.
    let samples: Vec<Sample> = (0..rows)
        .map(|i| {
            let mut s = sample(i as i64);
            for (feature, value) in &mut s.features {
                if null_in_row(i, feature) {
                    value.value = None;
                }
            }
            if i % 2 == 1 {
                s.features.retain(|_, value| value.value.is_some());
            }
            s
        })
        .collect();
    let mut client = serving_client(&cluster.replicas[0].addr).await;
    let served = predict(&mut client, samples).await;
    let columns = parity_columns(rows);
    let trained = trainer_forward(&cluster, &columns).await;
    assert_eq!(served.len(), trained.len());
    for (i, (s, t)) in served.iter().zip(&trained).enumerate() {
        assert!(
            (s - t).abs() <= 1e-5,
            "row {i}: Predict {s}, the trainer's forward pass {t}"
        );
    }
    let spread = trained
        .iter()
        .fold(0.0f32, |m, p| m.max((p - trained[0]).abs()));
    assert!(spread > 1e-4, "the rows score apart: {trained:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn predict_over_http_json_answers_as_grpc_behind_the_same_tokens() {
    let mut cluster = Cluster::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# Predict callers\ns3cret\n").expect("token file");
    let guarded = cluster
        .start_replica_with(restartable_port().expect("port"), Some(tokens))
        .await;
    let guarded_addr = guarded.addr.clone();
    cluster.replicas.push(guarded);
    for i in 0..4 {
        cluster.train_on(&sample(i), 0.4).await;
    }
    let _sync = cluster.synced().await;

    // gRPC: the open replica and the guarded one (with its token) score alike.
    let mut samples = vec![sample(1), sample(2), sample(3)];
    samples[1].features.remove("price");
    let open = predict(
        &mut serving_client(&cluster.replicas[0].addr).await,
        samples.clone(),
    )
    .await;
    let mut guarded = serving_client(&guarded_addr).await;
    let refused = guarded
        .predict(PredictRequest {
            job: JOB.into(),
            samples: samples.clone(),
        })
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let mut request = tonic::Request::new(PredictRequest {
        job: JOB.into(),
        samples,
    });
    request
        .metadata_mut()
        .insert("authorization", "Bearer s3cret".parse().expect("ascii"));
    let answer = guarded.predict(request).await.expect("with the token");
    assert_eq!(answer.into_inner().probabilities, open);

    // HTTP/JSON on the same port: the same rows (a null as left out) score the same.
    let body = r#"{"job": "ctr", "samples": [
        {"price": 13.5, "age": 0.3, "item": 1, "shop": 1, "tags": ["t1", "sale"]},
        {"price": null, "age": 0.3, "item": 2, "shop": 2, "tags": ["t2", "sale"]},
        {"price": 15.5, "age": 0.3, "item": 3, "shop": 3, "tags": ["t3", "sale"]}]}"#;
    let post = |addr: String, headers: Vec<(&'static str, &'static str)>, body: &'static str| async move {
        http_request(&addr, "POST", "/v1/predict", &headers, body)
            .await
            .expect("HTTP answer")
    };
    let json = ("content-type", "application/json");
    let (status, answer) = post(cluster.replicas[0].addr.clone(), vec![json], body).await;
    assert_eq!(status, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
    let scored: Vec<f32> = answer["probabilities"]
        .as_array()
        .expect("probabilities")
        .iter()
        .map(|p| p.as_f64().expect("a number") as f32)
        .collect();
    assert_eq!(scored, open);
    assert!(answer["dense_version"].as_u64().expect("dense version") > 0);

    let (status, answer) = post(guarded_addr.clone(), vec![json], body).await;
    assert_eq!(status, 401, "{answer}");
    let bearer = ("authorization", "Bearer s3cret");
    let (status, answer) = post(guarded_addr.clone(), vec![json, bearer], body).await;
    assert_eq!(status, 200, "{answer}");

    let bad = r#"{"samples": [{"item": 1}, {"price": "cheap"}]}"#;
    let (status, answer) = post(guarded_addr.clone(), vec![json, bearer], bad).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.contains(r#"samples[1]: feature \"price\""#),
        "{answer}"
    );
    let (status, answer) = post(
        cluster.replicas[0].addr.clone(),
        vec![json],
        r#"{"job": "other", "samples": [{}]}"#,
    )
    .await;
    assert_eq!(status, 404, "{answer}");

    // grpcurl and friends discover the API.
    assert_eq!(
        reflected_services(&guarded_addr).await.expect("reflection"),
        ["grpc.health.v1.Health", "primus.v1.ServingService"]
    );
}
