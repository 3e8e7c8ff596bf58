//! The models' gradients against finite differences, the layout's checks, pooling's
//! backward, and that each model learns a planted signal.

#![allow(
    clippy::print_stdout,
    reason = "a check that cannot run here says so on stdout, beside the test's name"
)]

mod graph;
mod job_graph;
mod on_device;
mod pooling;
mod sequence;

use primus_batch::{Ikjt, JaggedFeature, Kjt, Sparse};
use primus_model::pooling::{BatchKeys, CpuKernels};
use primus_model::{
    DenseDevice, EmbeddingGrads, Inputs, Model, ModelError, ModelLayout, ParamSet, Tower,
};
use primus_spec::dataset::{DenseFeature, FeatureSchema, SparseFeature};
use primus_spec::job::{
    AdmissionSpec, DenseSpec, Initializer, ModelKind, ModelSpec, OptimizerSpec, TablePooling,
    TableSpec,
};

fn schema(dense: usize, sparse: &[(&str, &str)]) -> FeatureSchema {
    FeatureSchema {
        label: "label".into(),
        negative_sample_rate: None,
        targets: Vec::new(),
        dense: (0..dense)
            .map(|i| DenseFeature {
                name: format!("i{i}"),
                transform: Default::default(),
                missing: 0.0,
            })
            .collect(),
        sparse: sparse
            .iter()
            .map(|(name, table)| SparseFeature {
                name: (*name).into(),
                table: (*table).into(),
                multi_hot: false,
                dedup_group: None,
                sequence: None,
                same_ids_as: None,
            })
            .collect(),
    }
}

fn table(name: &str, dim: u32) -> TableSpec {
    TableSpec {
        name: name.into(),
        dim,
        optimizer: OptimizerSpec::Sgd { learning_rate: 0.1 },
        initializer: Initializer::default(),
        admission: AdmissionSpec::default(),
        ttl_seconds: None,
        pooling: TablePooling::Sum,
    }
}

fn model(kind: ModelKind, tables: Vec<TableSpec>, bottom: &[u32], top: &[u32]) -> ModelSpec {
    ModelSpec {
        kind,
        tables,
        dense: DenseSpec::new(bottom.to_vec(), top.to_vec()),
    }
}

fn small(kind: ModelKind) -> ModelLayout {
    let spec = model(kind, vec![table("t", 4)], &[6, 4], &[8, 1]);
    ModelLayout::new(&spec, &schema(3, &[("a", "t"), ("b", "t")])).expect("layout")
}

/// Parameters moved off zero biases: a zero bias puts an all-dead sample on a ReLU's kink.
fn shifted(params: &ParamSet) -> ParamSet {
    let mut params = params.clone();
    let tensors = (params.tensors().iter().enumerate())
        .map(|(i, t)| {
            let mut t = t.clone();
            let offsets = noise(50 + i as u64, t.values.len());
            for (v, n) in t.values.iter_mut().zip(offsets) {
                *v += 0.05 * n;
            }
            t
        })
        .collect();
    params.assign(tensors).expect("assign");
    params
}

/// A deterministic pseudo-random sequence in [-1, 1).
fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn loss(
    model: &Model,
    params: &ParamSet,
    inputs: &Inputs<'_>,
    labels: &[f32],
    tower: Tower,
) -> f64 {
    f64::from(
        model
            .train_step(params, inputs, &[labels], tower)
            .expect("step")
            .loss,
    )
}

/// Noise as `rows` samples' dense, pooled and wide inputs (wide only where the model has
/// a wide part), and alternating labels.
fn random_batch(layout: &ModelLayout, rows: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let wide_len = if layout.has_wide() {
        rows * layout.features.len()
    } else {
        0
    };
    (
        noise(1, rows * layout.dense_inputs),
        noise(2, rows * layout.embedding_width),
        noise(3, wide_len),
        (0..rows).map(|i| (i % 2) as f32).collect(),
    )
}

const EVERY_KIND: [ModelKind; 4] = [
    ModelKind::Dlrm,
    ModelKind::Deepfm,
    ModelKind::WideDeep,
    ModelKind::Mtrm,
];

#[test]
fn gradients_match_finite_differences_for_every_model() {
    for kind in EVERY_KIND {
        let layout = small(kind);
        let model = Model::new(layout.clone()).expect("a model of the layout");
        let rows = 5;
        let (dense, mut embedded, wide, labels) = random_batch(&layout, rows);
        // Zero biases put a sample with all-dead inputs exactly on a ReLU's kink, where
        // the central difference averages two one-sided slopes; nonzero biases avoid it.
        let mut params = shifted(&ParamSet::init(&layout, 7));
        let towers: &[Tower] = if kind == ModelKind::Mtrm {
            &[Tower::Memory, Tower::Adapt]
        } else {
            &[Tower::Memory]
        };
        for &tower in towers {
            let inputs = Inputs {
                rows,
                dense: &dense,
                embedded: &embedded,
                wide: &wide,
            };
            let step = model
                .train_step(&params, &inputs, &[&labels], tower)
                .expect("step");
            // Small enough that no ReLU flips between the two probes.
            let eps = 1e-3f32;
            // A few entries of every dense gradient.
            for grad in &step.dense_grads {
                for index in [0, grad.values.len() / 2, grad.values.len() - 1] {
                    let original = params.get(&grad.name).expect("param").values[index];
                    let mut shifted = |delta: f32| {
                        let mut tensors: Vec<_> = params.tensors().to_vec();
                        let t = tensors.iter_mut().find(|t| t.name == grad.name).expect("t");
                        t.values[index] = original + delta;
                        params.assign(tensors).expect("assign");
                        let inputs = Inputs {
                            rows,
                            dense: &dense,
                            embedded: &embedded,
                            wide: &wide,
                        };
                        loss(&model, &params, &inputs, &labels, tower)
                    };
                    let numeric = (shifted(eps) - shifted(-eps)) / (2.0 * f64::from(eps));
                    shifted(0.0);
                    let analytic = f64::from(grad.values[index]);
                    assert!(
                        (numeric - analytic).abs() < 2e-3 + 2e-2 * analytic.abs(),
                        "{kind:?} {tower:?} {}[{index}]: numeric {numeric} analytic {analytic}",
                        grad.name
                    );
                }
            }
            // And of the pooled embeddings; the adapt tower reads them through the memory
            // tower too, deliberately without gradient (stop-gradient is not a derivative).
            if tower == Tower::Adapt {
                continue;
            }
            for index in [0, embedded.len() / 3, embedded.len() - 1] {
                let original = embedded[index];
                let mut at = |delta: f32| {
                    embedded[index] = original + delta;
                    let inputs = Inputs {
                        rows,
                        dense: &dense,
                        embedded: &embedded,
                        wide: &wide,
                    };
                    loss(&model, &params, &inputs, &labels, tower)
                };
                let numeric = (at(eps) - at(-eps)) / (2.0 * f64::from(eps));
                at(0.0);
                let analytic = f64::from(step.embedded_grad[index]);
                assert!(
                    (numeric - analytic).abs() < 2e-3 + 2e-2 * analytic.abs(),
                    "{kind:?} {tower:?} embedded[{index}]: numeric {numeric} analytic {analytic}"
                );
            }
        }
    }
}

/// The CPU networks against burn's graph of the same model: losses, probabilities and
/// every gradient, at shapes that split rows into blocks and run products on every core.
#[test]
fn cpu_networks_compute_what_burn_computes() {
    let cases = [
        (ModelKind::Dlrm, 5, &[64, 8][..]),
        (ModelKind::Deepfm, 5, &[][..]),
        (ModelKind::WideDeep, 5, &[][..]),
        (ModelKind::WideDeep, 0, &[][..]),
    ];
    for (kind, dense_features, bottom) in cases {
        let spec = model(kind, vec![table("t", 8)], bottom, &[128, 64, 1]);
        let features = [("a", "t"), ("b", "t"), ("c", "t")];
        let layout = ModelLayout::new(&spec, &schema(dense_features, &features)).expect("layout");
        let rows = 1000;
        let (dense, embedded, wide, labels) = random_batch(&layout, rows);
        let params = ParamSet::init(&layout, 11);
        let inputs = Inputs {
            rows,
            dense: &dense,
            embedded: &embedded,
            wide: &wide,
        };
        let tower = Tower::Memory;
        let cpu = Model::new(layout.clone()).expect("a model of the layout");
        let burn = Model::burn_cpu(layout.clone()).expect("every kind runs on burn");
        let mut early = Vec::new();
        let mut keep = |grads: EmbeddingGrads<'_>| {
            early.push((grads.embedded.to_vec(), grads.wide.to_vec()));
        };
        let got = cpu
            .train_step_with(&params, &inputs, &[&labels], tower, &mut keep)
            .expect("cpu step");
        let want = burn
            .train_step_with(&params, &inputs, &[&labels], tower, &mut keep)
            .expect("burn step");
        let case = format!("{kind:?} with {dense_features} dense features");
        // What the step hands out early is what it returns: the pushed gradients.
        let returned = [got.embedded_grad.clone(), got.wide_grad.clone()];
        let returned_by_burn = [want.embedded_grad.clone(), want.wide_grad.clone()];
        assert_eq!(early.len(), 2, "{case}: one early hand-out per step");
        assert_eq!([early[0].0.clone(), early[0].1.clone()], returned, "{case}");
        assert_eq!(
            [early[1].0.clone(), early[1].1.clone()],
            returned_by_burn,
            "{case}"
        );
        assert!(
            (got.loss - want.loss).abs() < 1e-5,
            "{case}: loss {} vs {}",
            got.loss,
            want.loss
        );
        close(
            got.probabilities(),
            want.probabilities(),
            &format!("{case}: probabilities"),
        );
        close(
            &got.embedded_grad,
            &want.embedded_grad,
            &format!("{case}: embedded grad"),
        );
        close(
            &got.wide_grad,
            &want.wide_grad,
            &format!("{case}: wide grad"),
        );
        let names =
            |s: &[primus_model::ParamTensor]| s.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&got.dense_grads), names(&want.dense_grads), "{case}");
        for (g, w) in got.dense_grads.iter().zip(&want.dense_grads) {
            assert_eq!(g.shape, w.shape, "{case}: {}", g.name);
            close(&g.values, &w.values, &format!("{case}: {}", g.name));
        }
        let predicted = cpu.predict(&params, &inputs, tower).expect("cpu predict");
        close(
            &predicted,
            want.probabilities(),
            &format!("{case}: predict"),
        );
    }
}

/// Root-mean-square difference relative to `want`'s norm.
fn relative_difference(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        diff += f64::from(g - w).powi(2);
        norm += f64::from(*w).powi(2);
    }
    (diff / norm.max(1e-30)).sqrt()
}

/// Equal up to float summation order: relative to the largest magnitude of `want`.
fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * scale,
            "{what}[{i}]: {g} vs {w} (scale {scale})"
        );
    }
}

#[test]
fn mtrm_trains_each_tower_only_on_its_own_data() {
    let layout = small(ModelKind::Mtrm);
    let model = Model::new(layout.clone()).expect("a model of the layout");
    let params = ParamSet::init(&layout, 1);
    let rows = 4;
    let dense = noise(1, rows * 3);
    let embedded = noise(2, rows * layout.embedding_width);
    let inputs = Inputs {
        rows,
        dense: &dense,
        embedded: &embedded,
        wide: &[],
    };
    let labels = [0.0, 1.0, 1.0, 0.0];
    let names = |tower| -> Vec<String> {
        let step = model
            .train_step(&params, &inputs, &[&labels], tower)
            .expect("step");
        step.dense_grads.into_iter().map(|g| g.name).collect()
    };
    let memory = names(Tower::Memory);
    let adapt = names(Tower::Adapt);
    assert!(
        memory
            .iter()
            .all(|n| n.starts_with("memory.") || n.starts_with("bottom."))
    );
    assert!(memory.iter().any(|n| n.starts_with("bottom.")));
    // The adapt tower reads the memory tower but never trains it.
    assert!(adapt.iter().all(|n| n.starts_with("adapt.")), "{adapt:?}");
}

#[test]
fn layout_names_the_feature_that_does_not_fit() {
    let sparse = [("user", "users"), ("item", "items")];
    let missing = ModelLayout::new(
        &model(ModelKind::Dlrm, vec![table("users", 4)], &[4], &[1]),
        &schema(2, &sparse),
    );
    assert!(
        matches!(&missing, Err(ModelError::Mismatch { feature, message })
            if feature == "item" && message.contains("\"items\"")),
        "{missing:?}"
    );
    let dims = ModelLayout::new(
        &model(
            ModelKind::Dlrm,
            vec![table("users", 4), table("items", 8)],
            &[4],
            &[1],
        ),
        &schema(2, &sparse),
    );
    assert!(
        matches!(&dims, Err(ModelError::Mismatch { feature, message })
            if feature == "item" && message.contains("dim 8")),
        "{dims:?}"
    );
    let output = ModelLayout::new(
        &model(
            ModelKind::WideDeep,
            vec![table("users", 4), table("items", 8)],
            &[],
            &[16],
        ),
        &schema(2, &sparse),
    );
    assert!(
        matches!(&output, Err(ModelError::Spec { field, .. }) if field == "spec.model.dense.top"),
        "{output:?}"
    );
    let wide = ModelLayout::new(
        &model(
            ModelKind::WideDeep,
            vec![table("users", 4), table("items", 8)],
            &[],
            &[16, 1],
        ),
        &schema(2, &sparse),
    )
    .expect("wide & deep takes any dims");
    let tables: Vec<(String, u32)> = wide
        .ps_tables()
        .into_iter()
        .map(|t| (t.name, t.dim))
        .collect();
    assert_eq!(
        tables,
        [
            ("users", 4),
            ("items", 8),
            ("users_wide", 1),
            ("items_wide", 1)
        ]
        .map(|(n, d)| (n.to_string(), d))
    );
}

#[test]
fn wrong_input_sizes_are_errors_not_panics() {
    let layout = small(ModelKind::Dlrm);
    let model = Model::new(layout.clone()).expect("a model of the layout");
    let params = ParamSet::init(&layout, 1);
    let inputs = Inputs {
        rows: 2,
        dense: &[0.0; 5],
        embedded: &[0.0; 16],
        wide: &[],
    };
    let error = model.train_step(&params, &inputs, &[&[0.0, 1.0]], Tower::Memory);
    assert!(
        matches!(&error, Err(ModelError::Inputs(m)) if m.contains("dense")),
        "{error:?}"
    );
    let mut bad = params.clone();
    let mut tensors = params.tensors().to_vec();
    tensors[0].values.pop();
    assert!(bad.assign(tensors).is_err());
    assert_eq!(bad, params, "a rejected assign changes nothing");
    // The first tensors fit and the last does not: still nothing changes.
    let mut tensors = params.tensors().to_vec();
    tensors[0].values.iter_mut().for_each(|v| *v += 1.0);
    tensors.last_mut().expect("a tensor").values.pop();
    assert!(bad.assign(tensors).is_err());
    assert_eq!(bad, params, "a rejected assign changes none of its tensors");
}

/// Labels from a planted logistic model of one dense feature and per-key weights; a few
/// hundred SGD steps (dense and sparse, applied here) must rank well above chance.
#[test]
fn every_model_learns_a_planted_signal() {
    for kind in EVERY_KIND {
        let layout = small(kind);
        let model = Model::new(layout.clone()).expect("a model of the layout");
        let mut params = ParamSet::init(&layout, 3);
        let mut table: std::collections::HashMap<u64, Vec<f32>> = Default::default();
        let mut wide: std::collections::HashMap<u64, f32> = Default::default();
        let key_weight = |k: u64| if k.is_multiple_of(2) { 1.5 } else { -1.5 };
        let mut window = primus_metrics::EvalWindow::new(2_000);
        let rows = 64;
        for step in 0..300u64 {
            let x = noise(step + 100, rows * 3);
            let ks = noise(step + 5_000, rows * 2);
            let mut kjt = Kjt {
                rows,
                features: vec![JaggedFeature::new("a"), JaggedFeature::new("b")],
            };
            let mut labels = Vec::with_capacity(rows);
            for r in 0..rows {
                let ka = ((ks[2 * r] + 1.0) * 20.0) as u64;
                let kb = ((ks[2 * r + 1] + 1.0) * 20.0) as u64 + 100;
                kjt.features[0].push_row(&[ka]);
                kjt.features[1].push_row(&[kb]);
                let z = 2.0 * x[3 * r] + key_weight(ka) + key_weight(kb);
                let p = 1.0 / (1.0 + (-z).exp());
                labels.push(if noise(step * 1_000 + r as u64, 1)[0] * 0.5 + 0.5 < p {
                    1.0
                } else {
                    0.0
                });
            }
            let keys = BatchKeys::collect(&layout, &kjt).expect("keys");
            let rows_t: Vec<f32> = keys.tables[0]
                .iter()
                .flat_map(|k| {
                    table
                        .entry(*k)
                        .or_insert_with(|| noise(*k, 4).iter().map(|v| v * 0.1).collect())
                        .clone()
                })
                .collect();
            let wide_t: Vec<f32> = keys.tables[0]
                .iter()
                .map(|k| *wide.entry(*k).or_default())
                .collect();
            let embedded = keys.pool(&CpuKernels, &layout, &[rows_t]).expect("pooling");
            let pooled_wide = if layout.has_wide() {
                keys.pool_wide(&CpuKernels, &[wide_t])
                    .expect("wide pooling")
            } else {
                Vec::new()
            };
            let inputs = Inputs {
                rows,
                dense: &x,
                embedded: &embedded,
                wide: &pooled_wide,
            };
            let out = model
                .train_step(&params, &inputs, &[&labels], Tower::Memory)
                .expect("step");
            window.add(out.probabilities(), &labels);
            let lr = 0.5f32;
            let mut tensors = params.tensors().to_vec();
            for g in &out.dense_grads {
                let t = tensors.iter_mut().find(|t| t.name == g.name).expect("t");
                for (w, d) in t.values.iter_mut().zip(&g.values) {
                    *w -= lr * d;
                }
            }
            params.assign(tensors).expect("assign");
            let grads = keys
                .scatter(&CpuKernels, &layout, &out.embedded_grad)
                .expect("backward");
            for (i, k) in keys.tables[0].iter().enumerate() {
                let row = table.get_mut(k).expect("row");
                for (w, d) in row.iter_mut().zip(&grads[0][i * 4..(i + 1) * 4]) {
                    *w -= lr * 20.0 * d;
                }
            }
            if layout.has_wide() {
                let grads = keys
                    .scatter_wide(&CpuKernels, &out.wide_grad)
                    .expect("wide backward");
                for (i, k) in keys.tables[0].iter().enumerate() {
                    *wide.get_mut(k).expect("w") -= lr * 20.0 * grads[0][i];
                }
            }
        }
        let auc = window.evaluate().auc.expect("both classes");
        assert!(auc > 0.8, "{kind:?}: progressive AUC {auc}");
    }
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "Cargo sets the package's folder at run time; the compile-time path goes stale under a shared target folder"
)]
fn every_example_job_fits_its_dataset() {
    let crate_dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let dir = format!("{crate_dir}/../../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let resources =
            primus_spec::parse_documents(&path.display().to_string(), &text).expect("valid");
        for resource in &resources {
            let primus_spec::Resource::Job(job) = resource else {
                continue;
            };
            let dataset = resources
                .iter()
                .find_map(|r| match r {
                    primus_spec::Resource::Dataset(d) if d.metadata.name == job.spec.dataset => {
                        Some(d)
                    }
                    _ => None,
                })
                .expect("the example holds the job's dataset");
            ModelLayout::new(&job.spec.model, &dataset.spec.schema)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            checked += 1;
        }
    }
    assert!(checked >= 3, "{checked}");
}

#[test]
fn the_onnx_export_has_the_documented_inputs_and_every_parameter_once() {
    use primus_model::onnx::{DENSE_INPUT, EMBEDDED_INPUT, OUTPUT, WIDE_INPUT, export};
    use primus_proto::onnx::ModelProto;
    use prost::Message;
    for kind in EVERY_KIND {
        let layout = small(kind);
        let params = ParamSet::init(&layout, 1);
        let bytes = export(&layout, &params, Tower::Adapt, 7).expect("export");
        let model = ModelProto::decode(bytes.as_slice()).expect("decodes");
        let graph = model.graph.expect("graph");
        let inputs: Vec<_> = graph.input.iter().filter_map(|i| i.name.clone()).collect();
        let mut want = vec![DENSE_INPUT, EMBEDDED_INPUT];
        if layout.has_wide() {
            want.push(WIDE_INPUT);
        }
        assert_eq!(inputs, want, "{kind:?}");
        assert_eq!(graph.output[0].name.as_deref(), Some(OUTPUT));
        for tensor in params.tensors() {
            let copies = graph
                .initializer
                .iter()
                .filter(|t| t.name.as_deref() == Some(tensor.name.as_str()))
                .count();
            assert_eq!(copies, 1, "{kind:?}: {}", tensor.name);
        }
        assert_eq!(model.model_version, Some(7));
    }
}

#[test]
fn the_onnx_export_records_the_negative_sample_rate_it_corrects_for() {
    use primus_model::onnx::{NEGATIVE_SAMPLE_RATE_KEY, export};
    use primus_proto::onnx::ModelProto;
    use prost::Message;
    let recorded = |rate: Option<f64>| {
        let mut layout = small(ModelKind::WideDeep);
        layout.negative_sample_rate = rate;
        let params = ParamSet::init(&layout, 1);
        let bytes = export(&layout, &params, Tower::Memory, 1).expect("export");
        let model = ModelProto::decode(bytes.as_slice()).expect("decodes");
        let adds = model.graph.expect("graph").node.len();
        let rate = model
            .metadata_props
            .into_iter()
            .find(|p| p.key.as_deref() == Some(NEGATIVE_SAMPLE_RATE_KEY))
            .and_then(|p| p.value);
        (rate, adds)
    };
    let (unsampled, nodes) = recorded(None);
    assert_eq!(unsampled.as_deref(), Some("1"));
    let (sampled, sampled_nodes) = recorded(Some(0.25));
    assert_eq!(sampled.as_deref(), Some("0.25"));
    assert_eq!(sampled_nodes, nodes + 1, "one Add shifts the logit");
    assert_eq!(recorded(Some(1.0)), (Some("1".to_owned()), nodes));
}

/// The dense network on a GPU (the graphs on cuBLAS, MTRM on burn's CUDA backend with the
/// `cuda` feature) computes what the CPU model computes, to float tolerance (other
/// summation orders, TF32 matmuls in burn), for every model kind. Without a GPU, or
/// without the feature MTRM needs, asking for one is an error that says which is missing.
#[test]
fn a_model_on_a_gpu_computes_like_the_cpu_model_or_says_why_it_cannot() {
    let mtrm = Model::on(small(ModelKind::Mtrm), DenseDevice::Cuda(0));
    if !cfg!(feature = "cuda") {
        assert_eq!(
            mtrm.err(),
            Some(ModelError::NoCudaBuild),
            "MTRM on a GPU needs the cuda feature"
        );
    }
    if let Err(refusal) = Model::on(small(ModelKind::Dlrm), DenseDevice::Cuda(0)) {
        let expected =
            matches!(refusal, ModelError::Device { .. }) && refusal.to_string().contains("Cuda(0)");
        assert!(expected, "unexpected refusal: {refusal}");
        println!("SKIPPED the GPU model: {refusal}");
        return;
    }
    for kind in EVERY_KIND {
        let layout = small(kind);
        let cpu = Model::new(layout.clone()).expect("a model of the layout");
        let gpu = match Model::on(layout.clone(), DenseDevice::Cuda(0)) {
            Ok(gpu) => gpu,
            Err(ModelError::NoCudaBuild) if kind == ModelKind::Mtrm => {
                println!("SKIPPED MTRM on the GPU: built without the cuda feature");
                continue;
            }
            Err(e) => panic!("{kind:?} on the GPU: {e}"),
        };
        assert_eq!(gpu.device(), DenseDevice::Cuda(0));
        let params = ParamSet::init(&layout, 7);
        let rows = 64;
        let (dense, embedded, wide, labels) = random_batch(&layout, rows);
        let inputs = Inputs {
            rows,
            dense: &dense,
            embedded: &embedded,
            wide: &wide,
        };
        // burn's CUDA matmuls may run f32 on TF32 tensor cores (10-bit mantissa) on
        // Ampere and newer: an H200 differed from the CPU by 1.7e-4 in a probability.
        let close = |a: &[f32], b: &[f32], what: &str| {
            assert_eq!(a.len(), b.len(), "{kind:?} {what}");
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 2e-3 * (1.0 + x.abs()),
                    "{kind:?} {what}: {x} vs {y}"
                );
            }
        };
        let on_cpu = cpu
            .train_step(&params, &inputs, &[&labels], Tower::Memory)
            .expect("cpu step");
        let on_gpu = gpu
            .train_step(&params, &inputs, &[&labels], Tower::Memory)
            .expect("gpu step");
        close(
            on_cpu.probabilities(),
            on_gpu.probabilities(),
            "probabilities",
        );
        close(
            &on_cpu.embedded_grad,
            &on_gpu.embedded_grad,
            "embedding gradient",
        );
        close(&on_cpu.wide_grad, &on_gpu.wide_grad, "wide gradient");
        assert_eq!(on_cpu.dense_grads.len(), on_gpu.dense_grads.len());
        for (a, b) in on_cpu.dense_grads.iter().zip(&on_gpu.dense_grads) {
            assert_eq!(a.name, b.name);
            close(&a.values, &b.values, &a.name);
        }
        let predicted_cpu = cpu
            .predict(&params, &inputs, Tower::Adapt)
            .expect("cpu predict");
        let predicted_gpu = gpu
            .predict(&params, &inputs, Tower::Adapt)
            .expect("gpu predict");
        close(&predicted_cpu, &predicted_gpu, "predictions");
    }
}
