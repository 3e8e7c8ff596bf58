//! Resource files: the shipped examples, and every way a user gets one wrong.
use primus_spec::job::{Device, OptimizerSpec, TablePooling};
use primus_spec::{Kind, MAX_DOCUMENT_BYTES, Resource, SpecError, parse_documents};

const JOB: &str = r#"
kind: Job
metadata: {name: ctr}
spec:
  dataset: criteo-like
  mode: batch
  model:
    kind: deepfm
    tables:
      - {name: a, dim: 8, optimizer: {kind: sgd, learning_rate: 0.1}}
      - {name: b, dim: 8, optimizer: {kind: adagrad, learning_rate: 0.1}}
      - {name: c, dim: 8, optimizer: {kind: adam, learning_rate: 0.01}}
    dense: {top: [64, 1]}
  topology:
    data_executors: {replicas: 1}
    trainers: {replicas: 1}
    ps: {replicas: 1}
"#;

fn error_text(text: &str) -> String {
    parse_documents("job.yaml", text)
        .expect_err("must be refused")
        .to_string()
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "Cargo sets the package's folder at run time; the compile-time path goes stale under a shared target folder"
)]
fn every_example_parses_and_validates() {
    // Cargo sets the variable at run time too; the compile-time value goes stale when a
    // shared target folder serves a checkout at another path.
    let crate_dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let dir = format!("{crate_dir}/../../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/") {
        let path = entry.expect("entry").path();
        if path
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        {
            let text = std::fs::read_to_string(&path).expect("read");
            let resources = parse_documents(&path.display().to_string(), &text)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                resources.iter().any(|r| r.kind() == Kind::Job),
                "{}",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "examples checked: {checked}");
}

#[test]
fn a_valid_job_parses_with_defaults_filled() {
    let resources = parse_documents("job.yaml", JOB).expect("valid");
    let [Resource::Job(job)] = &resources[..] else {
        panic!("one job expected")
    };
    assert_eq!(job.metadata.name, "ctr");
    match &job.spec.model.tables[1].optimizer {
        OptimizerSpec::Adagrad {
            initial_accumulator,
            ..
        } => assert_eq!(*initial_accumulator, 0.0),
        other => panic!("{other:?}"),
    }
    assert_eq!(job.spec.model.tables[0].admission.probability, 1.0);
    assert!(matches!(
        job.spec.model.dense.optimizer,
        OptimizerSpec::Adam { learning_rate, .. } if learning_rate == 0.001
    ));
    assert_eq!(job.spec.training.batch_size, 2048);
    assert!(!job.spec.serving_sync.enabled);
}

#[test]
fn a_hot_set_parses_with_defaults_and_its_bad_fields_are_named() {
    let text = JOB.replace(
        "  mode: batch\n",
        "  mode: batch\n  training: {hot_set: {enabled: true, rows: 500}}\n",
    );
    let resources = parse_documents("job.yaml", &text).expect("valid");
    let [Resource::Job(job)] = &resources[..] else {
        panic!("one job expected")
    };
    let hot = &job.spec.training.hot_set;
    assert!(hot.enabled);
    assert_eq!(
        (hot.rows, hot.warmup_batches, hot.max_rows),
        (Some(500), 20, 100_000)
    );

    let text = JOB.replace(
        "  mode: batch\n",
        "  mode: batch\n  training: {hot_set: {enabled: true, rows: 0, drift_tolerance: 2}}\n",
    );
    let err = error_text(&text);
    assert!(
        err.contains("spec.training.hot_set.rows: must be > 0"),
        "{err}"
    );
    assert!(
        err.contains("spec.training.hot_set.drift_tolerance"),
        "{err}"
    );
    let text = JOB.replace(
        "  mode: batch\n",
        "  mode: batch\n  training: {hot_set: {enable: true}}\n",
    );
    assert!(error_text(&text).contains("enable"));
}

#[test]
fn ps_and_trainers_may_run_on_cuda_and_rows_on_a_gpu_need_a_kernel_optimizer() {
    let resources = parse_documents("job.yaml", JOB).expect("valid");
    let [Resource::Job(job)] = &resources[..] else {
        panic!("one job expected")
    };
    assert_eq!(job.spec.topology.ps.device, Device::Cpu);
    let on_gpu = JOB.replace("ps: {replicas: 1}", "ps: {replicas: 1, device: cuda}");
    let err = error_text(&on_gpu);
    // Table a uses sgd; b (adagrad) and c (adam) have fused kernels.
    assert!(
        err.contains("spec.model.tables[0].optimizer: topology.ps.device cuda"),
        "{err}"
    );
    assert!(
        !err.contains("tables[1]") && !err.contains("tables[2]"),
        "{err}"
    );
    let fixed = on_gpu.replace(
        "optimizer: {kind: sgd, learning_rate: 0.1}",
        "optimizer: {kind: adam, learning_rate: 0.1}",
    );
    let resources = parse_documents("job.yaml", &fixed).expect("valid on a GPU");
    let [Resource::Job(job)] = &resources[..] else {
        panic!("one job expected")
    };
    assert_eq!(job.spec.topology.ps.device, Device::Cuda);
    let data_on_gpu = fixed.replace(
        "data_executors: {replicas: 1}",
        "data_executors: {replicas: 1, device: cuda}",
    );
    assert!(
        error_text(&data_on_gpu)
            .contains("spec.topology.data_executors.device: only ps and trainers run on a GPU"),
        "{}",
        error_text(&data_on_gpu)
    );
    // A trainer on a GPU needs kernel optimizers only where it trains rows: its hot set.
    let trainer_on_gpu = JOB.replace(
        "trainers: {replicas: 1}",
        "trainers: {replicas: 1, device: cuda}",
    );
    let resources = parse_documents("job.yaml", &trainer_on_gpu).expect("valid without a hot set");
    let [Resource::Job(job)] = &resources[..] else {
        panic!("one job expected")
    };
    assert_eq!(job.spec.topology.trainers.device, Device::Cuda);
    let with_hot_set = format!("{trainer_on_gpu}  training:\n    hot_set: {{enabled: true}}\n");
    let err = error_text(&with_hot_set);
    assert!(
        err.contains(
            "spec.model.tables[0].optimizer: topology.trainers.device cuda with training.hot_set"
        ),
        "{err}"
    );
    let unknown = JOB.replace("ps: {replicas: 1}", "ps: {replicas: 1, device: tpu}");
    assert!(
        error_text(&unknown).contains("tpu"),
        "{}",
        error_text(&unknown)
    );
}

#[test]
fn a_bad_dense_optimizer_names_its_field() {
    let text = JOB.replace(
        "dense: {top: [64, 1]}",
        "dense: {top: [64, 1], optimizer: {kind: sgd, learning_rate: 0}}",
    );
    let err = error_text(&text);
    assert!(
        err.contains("spec.model.dense.optimizer.learning_rate"),
        "{err}"
    );
}

#[test]
fn negative_dim_names_the_field() {
    let text = JOB.replace("{name: c, dim: 8", "{name: c, dim: -4");
    let err = error_text(&text);
    assert!(err.contains("spec.model.tables[2].dim"), "{err}");
    assert!(err.contains("job.yaml, document 1"), "{err}");
}

#[test]
fn zero_dim_is_a_validation_error_with_path() {
    let text = JOB.replace("{name: c, dim: 8", "{name: c, dim: 0");
    let err = error_text(&text);
    assert!(
        err.contains("spec.model.tables[2].dim: must be > 0"),
        "{err}"
    );
}

#[test]
fn unknown_optimizer_names_the_field_and_the_choices() {
    let text = JOB.replace("kind: adam", "kind: adamw");
    let err = error_text(&text);
    assert!(err.contains("spec.model.tables[2].optimizer"), "{err}");
    assert!(err.contains("adamw") && err.contains("adagrad"), "{err}");
}

#[test]
fn unknown_field_names_the_field() {
    let text = JOB.replace("mode: batch", "mode: batch\n  replicas: 3");
    let err = error_text(&text);
    assert!(err.contains("replicas"), "{err}");
    assert!(err.contains("unknown field"), "{err}");
}

#[test]
fn malformed_yaml_is_a_parse_error_with_its_line() {
    let err =
        parse_documents("job.yaml", "kind: Job\nmetadata: {name: [\n").expect_err("malformed");
    assert!(matches!(err, SpecError::Parse { document: 1, .. }), "{err}");
    assert!(err.to_string().contains("line"), "{err}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = JOB
        .replace("{name: a, dim: 8", "{name: a, dim: 0")
        .replace("learning_rate: 0.01", "learning_rate: -1")
        .replace("trainers: {replicas: 1}", "trainers: {replicas: 0}")
        .replace("mode: batch", "mode: batch\n  training: {batch_size: 0}")
        .replace("name: ctr", "name: Bad_Name");
    let Err(SpecError::Invalid { errors, .. }) = parse_documents("job.yaml", &text) else {
        panic!("expected validation errors")
    };
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    for wanted in [
        "metadata.name",
        "spec.model.tables[0].dim",
        "spec.model.tables[2].optimizer.learning_rate",
        "spec.topology.trainers.replicas",
        "spec.training.batch_size",
    ] {
        assert!(paths.contains(&wanted), "{wanted} missing from {paths:?}");
    }
}

#[test]
fn a_bad_second_document_refuses_the_whole_file() {
    let text = format!("{JOB}---\nkind: Gadget\nmetadata: {{name: x}}\nspec: {{}}\n");
    let err = parse_documents("job.yaml", &text).expect_err("unknown kind");
    assert!(matches!(err, SpecError::Parse { document: 2, .. }), "{err}");
    assert!(err.to_string().contains("Gadget"), "{err}");
}

#[test]
fn dataset_source_needs_exactly_one_kind_and_valid_windows() {
    let text = r#"
kind: Dataset
metadata: {name: d}
spec:
  streams:
    - name: s
      window: {unit: hourly, start: "2026-02-30T25", end: "2026-01-01T00"}
      sources:
        - {name: both, parquet: {uri: "file:///x"}, jetstream: {stream: S, subject: s.x}}
        - {name: neither}
  schema:
    label: y
    sparse: [{name: f, table: t}, {name: f, table: t}]
"#;
    let Err(SpecError::Invalid { errors, .. }) = parse_documents("d.yaml", text) else {
        panic!("expected validation errors")
    };
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let all = text.join("\n");
    assert!(all.contains("spec.streams[0].window.start"), "{all}");
    assert!(
        all.contains("spec.streams[0].sources[0]: needs exactly one"),
        "{all}"
    );
    assert!(
        all.contains("spec.streams[0].sources[1]: needs exactly one"),
        "{all}"
    );
    assert!(all.contains("duplicate feature \"f\""), "{all}");
}

#[test]
fn a_join_source_parses_with_defaults_and_its_fields_are_checked() {
    let dataset = |join: &str| {
        format!(
            r#"
kind: Dataset
metadata: {{name: d}}
spec:
  streams:
    - name: s
      window: {{unit: hourly, start: "2026-01-01T00"}}
      sources:
        - {{name: joined, join: {join}}}
  schema: {{label: y, sparse: [{{name: f, table: t}}]}}
"#
        )
    };
    let good =
        dataset("{stream: LOG, features: log.features, actions: log.actions, request_id: rid}");
    let resources = parse_documents("d.yaml", &good).expect("valid join source");
    let Resource::Dataset(parsed) = &resources[0] else {
        panic!("a Dataset")
    };
    let source = &parsed.spec.streams[0].sources[0];
    assert!(source.is_stream());
    let join = source.join.as_ref().expect("join");
    assert_eq!((join.wait_seconds, join.memory_rows), (600.0, 100_000));

    let bad =
        dataset("{stream: L.G, features: log.x, actions: log.x, request_id: ' ', wait_seconds: 0}");
    let Err(SpecError::Invalid { errors, .. }) = parse_documents("d.yaml", &bad) else {
        panic!("expected validation errors")
    };
    let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let all = all.join("\n");
    for path in [
        "join.stream",
        "join.actions",
        "join.request_id",
        "join.wait_seconds",
    ] {
        assert!(
            all.contains(&format!("spec.streams[0].sources[0].{path}")),
            "{path} missing from {all}"
        );
    }
}

#[test]
fn a_negative_sample_rate_is_a_share_and_needs_every_source_to_be_a_join() {
    let dataset = |rate: &str, parquet: &str| {
        format!(
            r#"
kind: Dataset
metadata: {{name: d}}
spec:
  streams:
    - name: s
      window: {{unit: hourly, start: "2026-01-01T00"}}
      sources:
        - {{name: joined, join: {{stream: LOG, features: log.f, actions: log.a, request_id: rid}}}}
        {parquet}
  schema: {{label: y, negative_sample_rate: {rate}, sparse: [{{name: f, table: t}}]}}
"#
        )
    };
    let resources = parse_documents("d.yaml", &dataset("0.25", "")).expect("valid rate");
    let Resource::Dataset(parsed) = &resources[0] else {
        panic!("a Dataset")
    };
    assert_eq!(parsed.spec.schema.negative_sample_rate, Some(0.25));

    for rate in ["0", "1.5", "-0.1"] {
        let Err(SpecError::Invalid { errors, .. }) = parse_documents("d.yaml", &dataset(rate, ""))
        else {
            panic!("rate {rate} must be refused")
        };
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "spec.schema.negative_sample_rate");
    }

    let mixed = dataset("0.5", "- {name: logs, parquet: {uri: /data/logs}}");
    let Err(SpecError::Invalid { errors, .. }) = parse_documents("d.yaml", &mixed) else {
        panic!("a Parquet source beside a sampled join must be refused")
    };
    let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(
        all[0].starts_with("spec.streams[0].sources[1]: schema.negative_sample_rate is set"),
        "{all:?}"
    );
}

#[test]
fn targets_are_distinct_columns_neither_label_nor_feature_and_not_of_a_join() {
    let dataset = |targets: &str, source: &str| {
        format!(
            r#"
kind: Dataset
metadata: {{name: d}}
spec:
  streams:
    - name: s
      window: {{unit: hourly, start: "2026-01-01T00"}}
      sources: [{source}]
  schema:
    label: click
    targets: {targets}
    dense: [{{name: price}}]
    sparse: [{{name: item, table: t}}]
"#
        )
    };
    let parquet = "{name: logs, parquet: {uri: /data/logs}}";
    let resources =
        parse_documents("d.yaml", &dataset("[buy, watch_time]", parquet)).expect("valid targets");
    let Resource::Dataset(parsed) = &resources[0] else {
        panic!("a Dataset")
    };
    assert_eq!(parsed.spec.schema.targets, ["buy", "watch_time"]);

    for (targets, path, message) in [
        ("[buy, buy]", "spec.schema.targets[1]", "duplicate target"),
        ("[click]", "spec.schema.targets[0]", "already a label"),
        ("[buy, price]", "spec.schema.targets[1]", "a feature column"),
        ("[item]", "spec.schema.targets[0]", "a feature column"),
        ("[Buy]", "spec.schema.targets[0]", ""),
    ] {
        let Err(SpecError::Invalid { errors, .. }) =
            parse_documents("d.yaml", &dataset(targets, parquet))
        else {
            panic!("targets {targets} must be refused")
        };
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, path, "{errors:?}");
        assert!(errors[0].to_string().contains(message), "{errors:?}");
    }
    let join =
        "{name: joined, join: {stream: LOG, features: log.f, actions: log.a, request_id: rid}}";
    let Err(SpecError::Invalid { errors, .. }) = parse_documents("d.yaml", &dataset("[buy]", join))
    else {
        panic!("targets with a join source must be refused")
    };
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "spec.streams[0].sources[0].join");
}

#[test]
fn json_files_work_and_spec_json_round_trips() {
    let resources = parse_documents("job.yaml", JOB).expect("valid");
    let job = &resources[0];
    let json = job.spec_json().expect("json");
    let back = Resource::from_json(Kind::Job, job.metadata().clone(), &json).expect("back");
    assert_eq!(&back, job);

    let document = format!(r#"{{"kind": "Job", "metadata": {{"name": "ctr"}}, "spec": {json}}}"#);
    let from_json = parse_documents("job.json", &document).expect("JSON is YAML");
    assert_eq!(&from_json[0], job);

    let err = Resource::from_json(Kind::Job, job.metadata().clone(), r#"{"mode": 3}"#)
        .expect_err("bad stored spec");
    assert!(err.starts_with("spec."), "{err}");
}

#[test]
fn oversized_and_empty_files_are_refused() {
    let huge = format!("{JOB}#{}", "x".repeat(MAX_DOCUMENT_BYTES));
    let err = parse_documents("big.yaml", &huge).expect_err("too large");
    assert!(matches!(err, SpecError::TooLarge { .. }), "{err}");
    let err = parse_documents("empty.yaml", "---\n").expect_err("empty");
    assert!(matches!(err, SpecError::Empty { .. }), "{err}");
}

#[test]
fn kinds_parse_as_users_type_them() {
    assert_eq!(Kind::parse("jobs"), Some(Kind::Job));
    assert_eq!(Kind::parse("Dataset"), Some(Kind::Dataset));
    assert_eq!(Kind::parse("metrics"), Some(Kind::Metric));
    assert_eq!(Kind::parse("pods"), None);
}

#[test]
fn memory_quantities() {
    use primus_spec::job::parse_memory;
    assert_eq!(parse_memory("4Gi"), Ok(4 << 30));
    assert_eq!(parse_memory("512Mi"), Ok(512 << 20));
    assert_eq!(parse_memory("2G"), Ok(2_000_000_000));
    assert!(parse_memory("lots").is_err());
    assert!(parse_memory("0").is_err());
    assert!(parse_memory("99999999999Ti").is_err());
}

#[test]
fn relative_local_paths_resolve_against_the_applying_directory() {
    let text = r#"
kind: Dataset
metadata: {name: d}
spec:
  streams:
    - name: s
      window: {unit: daily, start: "2026-01-01"}
      sources:
        - {name: a, parquet: {uri: "file://./data/a"}}
        - {name: b, parquet: {uri: "data/b"}}
        - {name: c, parquet: {uri: "s3://bucket/c"}}
        - {name: d, parquet: {uri: "/abs/d"}}
  schema: {label: y, sparse: [{name: f, table: t}]}
"#;
    let mut resources = parse_documents("d.yaml", text).expect("valid");
    resources[0].resolve_local_paths(std::path::Path::new("/work/here"));
    let Resource::Dataset(dataset) = &resources[0] else {
        panic!("a Dataset")
    };
    let uris: Vec<&str> = dataset.spec.streams[0]
        .sources
        .iter()
        .filter_map(|s| s.parquet.as_ref().map(|p| p.uri.as_str()))
        .collect();
    assert_eq!(
        uris,
        [
            "file:///work/here/data/a",
            "file:///work/here/data/b",
            "s3://bucket/c",
            "/abs/d"
        ]
    );
}

#[test]
fn metric_series_names_may_be_dotted_but_not_arbitrary() {
    let metric = |name: &str| {
        format!(
            "kind: Metric\nmetadata: {{name: ctr}}\nspec:\n  job: ctr\n  series:\n    - {{name: \"{name}\", points: [{{unix_ms: 1, value: 2.0}}]}}\n"
        )
    };
    parse_documents("m.yaml", &metric("buffer_rows.criteo-like")).expect("dotted gauge name");
    let error = error_text(&metric("Buffer rows"));
    assert!(
        error.contains("spec.series[0].name") && error.contains("not a valid metric name"),
        "{error}"
    );
}

#[test]
fn incremental_checkpoints_default_to_one_full_in_four_and_refuse_bad_lengths() {
    let with = |checkpoint: &str| {
        JOB.replace(
            "  mode: batch\n",
            &format!("  mode: batch\n  checkpoint: {checkpoint}\n"),
        )
    };
    let resources = parse_documents(
        "job.yaml",
        &with("{uri: \"file:///c\", interval_seconds: 60}"),
    )
    .expect("valid");
    let [Resource::Job(job)] = &resources[..] else {
        panic!("one job expected")
    };
    let checkpoint = job.spec.checkpoint.as_ref().expect("a checkpoint");
    assert_eq!(checkpoint.full_every, 4);
    for bad in [0, 65] {
        let text = with(&format!(
            "{{uri: \"file:///c\", interval_seconds: 60, full_every: {bad}}}"
        ));
        let err = error_text(&text);
        assert!(
            err.contains("spec.checkpoint.full_every: must be between 1 and 64"),
            "{err}"
        );
    }
}

#[test]
fn a_scaling_policy_with_impossible_bounds_or_weights_names_each_field() {
    let scaling = |policy: &str| {
        JOB.replace(
            "  mode: batch\n",
            &format!("  mode: batch\n  scaling: {policy}\n"),
        )
    };
    let resources = parse_documents(
        "job.yaml",
        &scaling("{enabled: true, min_data_executors: 1, max_data_executors: 3}"),
    )
    .expect("valid");
    let [Resource::Job(job)] = &resources[..] else {
        panic!("one job expected")
    };
    let policy = &job.spec.scaling;
    assert_eq!(
        (
            policy.load_threshold,
            policy.scale_in_threshold,
            policy.cooldown_seconds
        ),
        (0.6, 0.25, 30)
    );
    assert_eq!(
        (
            policy.weights.starvation,
            policy.weights.cpu,
            policy.weights.memory
        ),
        (0.7, 0.2, 0.1)
    );

    let err = error_text(&scaling(
        "{enabled: true, min_data_executors: 3, max_data_executors: 2, weights: {starvation: -1, cpu: 0, memory: 0}, load_threshold: 0.2, scale_in_threshold: 0.5}",
    ));
    for expected in [
        "spec.scaling.max_data_executors: must be >= min_data_executors (2 < 3)",
        "spec.scaling.weights.starvation: must be >= 0 (got -1)",
        "spec.scaling.scale_in_threshold: must be below load_threshold (0.5 >= 0.2)",
    ] {
        assert!(err.contains(expected), "{expected}: {err}");
    }
    let err = error_text(&scaling("{weights: {starvation: 0, cpu: 0, memory: 0}}"));
    assert!(
        err.contains("spec.scaling.weights: are all 0: at least one must be > 0"),
        "{err}"
    );
    assert_eq!(
        (policy.stragglers.enabled, policy.stragglers.slowdown),
        (true, 3.0),
        "stragglers are handled by default"
    );
    let err = error_text(&scaling("{stragglers: {slowdown: 1}}"));
    assert!(
        err.contains("spec.scaling.stragglers.slowdown: must be > 1 (got 1)"),
        "{err}"
    );
    assert!(
        policy.memory.oom_prevention,
        "OOM prevention is on by default"
    );
    let err = error_text(&scaling("{memory: {samples: 1, safety_margin: 1}}"));
    for expected in [
        "spec.scaling.memory.samples: must be >= 2 (got 1)",
        "spec.scaling.memory.safety_margin: must be within [0, 1) (got 1)",
    ] {
        assert!(err.contains(expected), "{expected}: {err}");
    }
    let err = error_text(&scaling(
        "{enabled: true, min_data_executors: 2, max_data_executors: 4}",
    ));
    assert!(
        err.contains(
            "spec.topology.data_executors.replicas: must be within spec.scaling's 2..=4 while scaling is enabled (got 1)"
        ),
        "{err}"
    );
}

#[test]
fn a_model_graph_s_problems_are_each_named_by_path() {
    use primus_spec::Validate;
    use primus_spec::job::graph::GraphSpec;
    let graph: GraphSpec = serde_yaml_ng::from_str(
        r#"
inputs:
  emb: {kind: embeddings}
  Dense: {kind: dense}
blocks:
  a: {kind: concat, inputs: [emb, b]}
  b: {kind: mlp, input: a, widths: [4, 0]}
  emb: {kind: fm, input: missing}
  c: {kind: cross, input: emb, layers: 0, rank: 0}
  g: {kind: gate, input: emb, experts: [b, nobody]}
  g0: {kind: gate, input: emb, experts: []}
heads:
  h: {input: nowhere, label: "", weight: 0}
"#,
    )
    .expect("parses");
    let problems: Vec<String> = (graph.problems("spec.model.graph").iter())
        .map(ToString::to_string)
        .collect();
    for want in [
        "spec.model.graph.inputs.Dense: \"Dense\" is not a valid name",
        "spec.model.graph.blocks.b.widths[1]: must be at least 1",
        "spec.model.graph.blocks.emb: an input has the same name",
        "spec.model.graph.blocks.emb.input: \"missing\" is neither an input nor a block",
        "spec.model.graph.blocks.c.layers: must be at least 1",
        "spec.model.graph.blocks.c.rank: must be at least 1 when set",
        "spec.model.graph.blocks.g.experts[1]: \"nobody\" is neither an input nor a block",
        "spec.model.graph.blocks.g0.experts: needs at least one expert",
        "spec.model.graph.blocks.a: the blocks read each other in a cycle: a -> b -> a",
        "spec.model.graph.heads.h.input: \"nowhere\" is neither an input nor a block",
        "spec.model.graph.heads.h.label: must name the label column",
        "spec.model.graph.heads.h.weight: must be a positive number",
    ] {
        assert!(
            problems.iter().any(|p| p.starts_with(want)),
            "{want:?} not among {problems:#?}"
        );
    }
    let unknown = serde_yaml_ng::from_str::<GraphSpec>(
        "inputs: {}\nblocks: {x: {kind: transformer, input: y}}\nheads: {}\n",
    )
    .expect_err("an unknown block kind");
    assert!(unknown.to_string().contains("transformer"), "{unknown}");
}

#[test]
fn a_graph_model_declares_its_graph_and_only_it_does() {
    let graph = "graph: {inputs: {emb: {kind: embeddings}}, \
                 blocks: {out: {kind: mlp, input: emb, widths: [1]}}, \
                 heads: {click: {input: out, label: label}}}";
    let with = |kind: &str, dense: &str| {
        JOB.replace("kind: deepfm", &format!("kind: {kind}"))
            .replace("dense: {top: [64, 1]}", &format!("dense: {{{dense}}}"))
    };
    let resources = parse_documents("job.yaml", &with("graph", graph)).expect("valid");
    let [Resource::Job(job)] = &resources[..] else {
        panic!("one job expected")
    };
    let declared = job.spec.model.dense.graph.as_ref().expect("the graph");
    assert_eq!(declared.heads["click"].input, "out");
    for (kind, dense, want) in [
        (
            "graph",
            "top: [1]",
            "spec.model.dense.graph: kind graph needs the graph of its blocks",
        ),
        (
            "graph",
            &format!("top: [8, 1], {graph}"),
            "spec.model.dense.top: a graph model declares its layers in dense.graph",
        ),
        (
            "dlrm",
            &format!("bottom: [8], top: [8, 1], {graph}"),
            "spec.model.dense.graph: only kind graph reads a graph",
        ),
        (
            "graph",
            &graph.replace("input: emb", "input: embs"),
            "spec.model.dense.graph.blocks.out.input: \"embs\" is neither an input nor a block",
        ),
    ] {
        let err = error_text(&with(kind, dense));
        assert!(err.contains(want), "{kind} {dense}: {err}");
    }
}

#[test]
fn a_layer_norm_block_has_no_activation_unless_given() {
    use primus_spec::job::graph::{Activation, Block, GraphSpec};
    let graph: GraphSpec = serde_yaml_ng::from_str(
        r#"
inputs: {emb: {kind: embeddings}}
blocks:
  plain: {kind: layer_norm, input: emb}
  relu: {kind: layer_norm, input: plain, activation: relu}
  out: {kind: mlp, input: relu, widths: [1]}
heads: {click: {input: out, label: label}}
"#,
    )
    .expect("parses");
    let activation = |name: &str| match &graph.blocks[name] {
        Block::LayerNorm { activation, .. } => *activation,
        other => panic!("{name} is {other:?}"),
    };
    assert_eq!(activation("plain"), Activation::None);
    assert_eq!(activation("relu"), Activation::Relu);
    assert_eq!(graph.block_order(), Ok(vec!["plain", "relu", "out"]));
}

#[test]
fn a_tables_pooling_is_sum_or_mean_and_another_names_the_field() {
    let mean = JOB.replace("{name: c, dim: 8", "{name: c, pooling: mean, dim: 8");
    let resources = parse_documents("job.yaml", &mean).expect("mean pooling parses");
    let [Resource::Job(job)] = &resources[..] else {
        panic!("one Job");
    };
    let pooling = |t: usize| job.spec.model.tables[t].pooling;
    assert_eq!(pooling(2), TablePooling::Mean);
    assert_eq!(pooling(0), TablePooling::Sum, "the default");
    let err = error_text(&JOB.replace("{name: c, dim: 8", "{name: c, pooling: max, dim: 8"));
    assert!(err.contains("spec.model.tables[2].pooling"), "{err}");
    assert!(err.contains("max") && err.contains("mean"), "{err}");
}
