//! The ONNX export of every example model, run in ONNX Runtime (the serving role's
//! `DenseModel`), against the trainer's forward pass (`Model::predict`: the graph engine, MTRM on
//! burn) on random inputs. Needs libonnxruntime.so
//! (ORT_DYLIB_PATH, set by scripts/env.sh after scripts/install-deps.sh); fails without it.

#![expect(
    clippy::disallowed_methods,
    reason = "the test loads ONNX Runtime from the variable scripts/env.sh sets"
)]

use std::path::{Path, PathBuf};

use primus_model::{Inputs, Model, ModelLayout, ParamSet, Tower};
use primus_ps::serving::{DenseInputs, DenseModel};
use primus_spec::job::graph::Loss;

fn library() -> PathBuf {
    let path = std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .expect("ORT_DYLIB_PATH is not set: run scripts/install-deps.sh and source scripts/env.sh");
    assert!(
        path.is_file(),
        "ORT_DYLIB_PATH={} is not a file",
        path.display()
    );
    path
}

/// Every Job of examples/ with the layout it implies.
fn example_layouts() -> Vec<(String, ModelLayout)> {
    let dir = primus_testkit::repo_root().join("examples");
    let mut layouts = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("examples/") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        let resources =
            primus_spec::parse_documents(&path.display().to_string(), &text).expect("valid");
        let datasets: Vec<_> = resources
            .iter()
            .filter_map(|r| match r {
                primus_spec::Resource::Dataset(d) => Some(d),
                _ => None,
            })
            .collect();
        for resource in &resources {
            if let primus_spec::Resource::Job(job) = resource {
                let dataset = datasets
                    .iter()
                    .find(|d| d.metadata.name == job.spec.dataset)
                    .expect("the example holds its dataset");
                let layout =
                    ModelLayout::new(&job.spec.model, &dataset.spec.schema).expect("layout");
                layouts.push((job.metadata.name.clone(), layout));
            }
        }
    }
    layouts
}

/// Values in [-2, 2) from a fixed xorshift sequence.
fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 22) as f32 - 2.0
        })
        .collect()
}

/// `p` with its odds p / (1 - p) multiplied by `rate`: the probability over all rows of a
/// model trained on `rate` of the negatives.
fn corrected(p: f32, rate: f32) -> f32 {
    p * rate / (p * rate + 1.0 - p)
}

/// Inputs of `rows` samples: dense features, pooled embeddings, first-order weights.
struct Batch {
    rows: usize,
    dense: Vec<f32>,
    embedded: Vec<f32>,
    wide: Vec<f32>,
}

/// `layout`'s probabilities for `batch` from the trainer's forward pass and from its ONNX export
/// run in ONNX Runtime (the serving role's `DenseModel`).
fn trained_and_onnx(
    library: &Path,
    layout: &ModelLayout,
    params: &ParamSet,
    tower: Tower,
    batch: &Batch,
) -> (Vec<f32>, Vec<f32>) {
    let (trained, served) = trained_and_onnx_heads(library, layout, params, tower, batch);
    (trained[0].clone(), served[0].clone())
}

/// Each head's predictions of `batch` from the trainer's forward pass and from ONNX
/// Runtime, in the layout's head order.
fn trained_and_onnx_heads(
    library: &Path,
    layout: &ModelLayout,
    params: &ParamSet,
    tower: Tower,
    batch: &Batch,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let inputs = Inputs {
        rows: batch.rows,
        dense: &batch.dense,
        embedded: &batch.embedded,
        wide: &batch.wide,
    };
    let trained = (Model::new(layout.clone())
        .expect("a model of the layout")
        .predict_heads(params, &inputs, tower))
    .expect("the trainer's predict");
    let onnx = primus_model::onnx::export(layout, params, tower, 1).expect("export");
    let model = DenseModel::load(library, 1, &onnx, 1).expect("ONNX Runtime loads it");
    let ort = model
        .predict(DenseInputs {
            rows: batch.rows,
            dense: batch.dense.clone(),
            dense_width: layout.dense_inputs,
            embedded: batch.embedded.clone(),
            embedded_width: layout.embedding_width,
            wide: batch.wide.clone(),
            wide_width: batch.wide.len() / batch.rows,
        })
        .expect("ONNX Runtime predict");
    assert_eq!(ort.probabilities.len(), batch.rows);
    let served = match &ort.heads[..] {
        [] => vec![ort.probabilities],
        heads => {
            let names: Vec<&str> = heads.iter().map(|(name, _)| name.as_str()).collect();
            let want: Vec<&str> = layout.heads.iter().map(|h| h.name.as_str()).collect();
            assert_eq!(names, want, "an output per head, in the layout's order");
            assert_eq!(
                heads[0].1, ort.probabilities,
                "`probability` is the first head's"
            );
            heads.iter().map(|(_, values)| values.clone()).collect()
        }
    };
    assert_eq!(
        served.len(),
        trained.len(),
        "a served output per trained head"
    );
    (trained, served)
}

/// Burn's forward pass, log-odds corrected for the example Datasets that sample negatives.
#[test]
fn onnx_runtime_computes_what_the_trainer_computes_for_every_example_model() {
    let library = library();
    let layouts = example_layouts();
    let kinds: std::collections::BTreeSet<String> = layouts
        .iter()
        .map(|(_, l)| format!("{:?}", l.kind))
        .collect();
    assert_eq!(kinds.len(), 5, "examples cover every model kind: {kinds:?}");
    assert!(
        layouts.iter().any(|(_, layout)| layout.heads.len() > 1),
        "an example of several heads"
    );
    let rows = 33;
    for (seed, (job, layout)) in layouts.iter().enumerate() {
        let params = ParamSet::init(layout, seed as u64 + 1);
        let wide_width = if layout.has_wide() {
            layout.features.len()
        } else {
            0
        };
        let batch = Batch {
            rows,
            dense: noise(3 * seed as u64 + 1, rows * layout.dense_inputs),
            embedded: noise(3 * seed as u64 + 2, rows * layout.embedding_width),
            wide: noise(3 * seed as u64 + 3, rows * wide_width),
        };
        for tower in [Tower::Memory, Tower::Adapt] {
            let (trained, ort) = trained_and_onnx_heads(&library, layout, &params, tower, &batch);
            let rate = layout.negative_sample_rate.unwrap_or(1.0) as f32;
            for ((trained, ort), head) in trained.iter().zip(&ort).zip(&layout.heads) {
                let trained: Vec<f32> = match head.loss {
                    Loss::BinaryCrossEntropy => {
                        trained.iter().map(|p| corrected(*p, rate)).collect()
                    }
                    Loss::SquaredError => trained.clone(),
                };
                let worst = (trained.iter().zip(ort))
                    .map(|(a, b)| (a - b).abs() / a.abs().max(1.0))
                    .fold(0.0f32, f32::max);
                let head = &head.name;
                assert!(
                    worst <= 1e-5,
                    "{job} {tower:?} head {head}: max |trainer - onnx| = {worst}"
                );
                let spread = (trained.iter()).fold(0.0f32, |m, p| m.max((p - trained[0]).abs()));
                assert!(
                    spread > 1e-3,
                    "{job} head {head}: the inputs must move the output ({spread})"
                );
            }
        }
    }
}

/// A schema with a negative sample rate r: the exported model answers the trainer's
/// probability with its odds multiplied by r.
#[test]
fn a_sampled_schemas_model_serves_probabilities_corrected_by_the_rate() {
    let library = library();
    let (job, mut layout) = example_layouts()
        .into_iter()
        .find(|(_, l)| l.has_wide())
        .expect("an example with a wide part");
    let rate = 0.2f32;
    layout.negative_sample_rate = Some(f64::from(rate));
    let params = ParamSet::init(&layout, 7);
    let rows = 17;
    // Small inputs keep the probabilities away from 0 and 1, where no shift shows.
    let small = |seed, n| -> Vec<f32> { noise(seed, n).iter().map(|v| v / 8.0).collect() };
    let batch = Batch {
        rows,
        dense: small(11, rows * layout.dense_inputs),
        embedded: small(12, rows * layout.embedding_width),
        wide: small(13, rows * layout.features.len()),
    };
    let (trained, served) = trained_and_onnx(&library, &layout, &params, Tower::Memory, &batch);
    for (p, q) in trained.iter().zip(&served) {
        let expected = corrected(*p, rate);
        assert!(
            (q - expected).abs() <= 1e-5,
            "{job}: trained {p} corrected to {expected}, served {q}"
        );
        assert!(
            p - q > 0.01,
            "{job}: fewer negatives seen, lower served probability ({p} -> {q})"
        );
    }
}

/// A graph of layer norms (with and without a ReLU, over an MLP's output and over the
/// embeddings), which no example uses: its export computes what the trainer does.
#[test]
fn a_graph_of_layer_norms_exports_what_the_trainer_computes() {
    const FILE: &str = r#"
kind: Dataset
metadata: {name: norms}
spec:
  streams:
    - name: main
      window: {unit: hourly, start: "2026-11-20T00", end: "2026-11-20T03"}
      sources: [{name: logs, parquet: {uri: "memory://norms"}}]
  schema:
    label: label
    dense: [{name: i1}, {name: i2}, {name: i3}]
    sparse: [{name: a, table: t}, {name: b, table: t}, {name: c, table: t}]
---
kind: Job
metadata: {name: norms}
spec:
  dataset: norms
  mode: batch
  model:
    kind: graph
    tables: [{name: t, dim: 4, optimizer: {kind: sgd, learning_rate: 0.1}}]
    dense:
      graph:
        inputs:
          dense: {kind: dense}
          emb: {kind: embeddings}
          first: {kind: first_order}
        blocks:
          hidden: {kind: mlp, input: dense, widths: [6], activation: none}
          hidden_norm: {kind: layer_norm, input: hidden, activation: relu}
          emb_norm: {kind: layer_norm, input: emb}
          joined: {kind: concat, inputs: [hidden_norm, emb_norm]}
          top: {kind: mlp, input: joined, widths: [4, 1]}
          logit: {kind: add, inputs: [top, first]}
        heads: {click: {input: logit, label: label}}
  topology:
    data_executors: {replicas: 1}
    trainers: {replicas: 1}
    ps: {replicas: 1}
"#;
    let library = library();
    let resources = primus_spec::parse_documents("norms.yaml", FILE).expect("valid");
    let (primus_spec::Resource::Dataset(dataset), primus_spec::Resource::Job(job)) =
        (&resources[0], &resources[1])
    else {
        panic!("a Dataset, then a Job");
    };
    let layout = ModelLayout::new(&job.spec.model, &dataset.spec.schema).expect("layout");
    let mut params = ParamSet::init(&layout, 4);
    // Scales and shifts away from their starting ones and zeros.
    let moved: Vec<_> = (params.tensors().iter().enumerate())
        .map(|(i, t)| {
            let mut t = t.clone();
            let offsets = noise(40 + i as u64, t.values.len());
            for (v, n) in t.values.iter_mut().zip(offsets) {
                *v += 0.2 * n;
            }
            t
        })
        .collect();
    params.assign(moved).expect("the same tensors");
    let rows = 29;
    let batch = Batch {
        rows,
        dense: noise(1, rows * layout.dense_inputs),
        embedded: noise(2, rows * layout.embedding_width),
        wide: noise(3, rows * layout.features.len()),
    };
    let (trained, served) = trained_and_onnx(&library, &layout, &params, Tower::Memory, &batch);
    let worst = (trained.iter().zip(&served))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-5, "max |trainer - onnx| = {worst}");
    let spread = (trained.iter()).fold(0.0f32, |m, p| m.max((p - trained[0]).abs()));
    assert!(spread > 1e-3, "the inputs must move the output ({spread})");
}
