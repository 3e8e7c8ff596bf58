//! The dense network's cost per minibatch (the trainer's compute stage without pooling):
//! the reference DLRM (13 dense + 26 sparse features, dim 16, bottom 512-256-64-16, top
//! 512-256-1) at batch 2048, forward and backward (`train_step`) and the forward alone
//! (`predict`), on the CPU graph engine (the DLRM preset on `GraphNet`) and, as the
//! baseline in the same run, on burn's CPU backend. Where a GPU is present, the same graph's
//! `train_step` on cuBLAS and the dense kernels (`GraphNet::on_ops`), its minibatch copied
//! to the device and its gradients back within each step, and the step alone on a minibatch
//! already there; without a GPU that line says SKIPPED.
//!
//! `cargo bench -p primus-model --bench step`

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use primus_gpu::{CudaKernels, CudaStatus, cuda_status};
use primus_model::presets::model_graph;
use primus_model::{GraphNet, Inputs, Model, ModelLayout, ParamSet, Tower};
use primus_spec::dataset::{DenseFeature, FeatureSchema, SparseFeature};
use primus_spec::job::{DenseSpec, ModelKind, ModelSpec, OptimizerSpec, TableSpec};

const ROWS: usize = 2048;

/// The reference DLRM of the train bench: 13 dense and 26 sparse features, dim 16.
fn reference_dlrm() -> ModelLayout {
    let spec = ModelSpec {
        kind: ModelKind::Dlrm,
        tables: vec![TableSpec::new(
            "categorical",
            16,
            OptimizerSpec::adagrad(0.05),
        )],
        dense: DenseSpec::new(vec![512, 256, 64, 16], vec![512, 256, 1]),
    };
    let schema = FeatureSchema {
        label: "label".into(),
        negative_sample_rate: None,
        targets: Vec::new(),
        dense: (1..=13)
            .map(|i| DenseFeature {
                name: format!("i{i}"),
                transform: Default::default(),
                missing: 0.0,
            })
            .collect(),
        sparse: (1..=26)
            .map(|i| SparseFeature {
                name: format!("c{i}"),
                table: "categorical".into(),
                multi_hot: false,
                dedup_group: None,
                sequence: None,
                same_ids_as: None,
            })
            .collect(),
    };
    ModelLayout::new(&spec, &schema).expect("layout")
}

/// Deterministic values in [-1, 1).
fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 2000) as f32 / 1000.0 - 1.0)
        .collect()
}

fn step(c: &mut Criterion) {
    let layout = reference_dlrm();
    let params = ParamSet::init(&layout, 0);
    let dense = values(ROWS * layout.dense_inputs, 1);
    let embedded = values(ROWS * layout.embedding_width, 2);
    let labels: Vec<f32> = (0..ROWS).map(|i| (i % 3 == 0) as u8 as f32).collect();
    let inputs = Inputs {
        rows: ROWS,
        dense: &dense,
        embedded: &embedded,
        wide: &[],
    };
    let mut group = c.benchmark_group("dlrm_reference_batch_2048");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(20);
    let engines = [
        (
            "cpu graph",
            Model::new(layout.clone()).expect("a model of the layout"),
        ),
        (
            "burn (baseline)",
            Model::burn_cpu(layout.clone()).expect("DLRM runs on burn"),
        ),
    ];
    for (engine, model) in &engines {
        group.bench_function(format!("{engine}: predict"), |b| {
            b.iter(|| {
                black_box(
                    model
                        .predict(&params, &inputs, Tower::Memory)
                        .expect("predict"),
                )
            })
        });
        group.bench_function(format!("{engine}: train_step"), |b| {
            b.iter(|| {
                let out = model.train_step(&params, &inputs, &[&labels], Tower::Memory);
                black_box(out.expect("step"))
            })
        });
    }
    on_gpu(&mut group, &layout, &params, &inputs, &labels);
    group.finish();
}

/// The DLRM graph's `train_step` on cuBLAS and the dense kernels, where a GPU is present.
fn on_gpu(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    layout: &ModelLayout,
    params: &ParamSet,
    inputs: &Inputs<'_>,
    labels: &[f32],
) {
    if !matches!(cuda_status(), CudaStatus::Ready { .. }) {
        println!("graph on cuBLAS: train_step SKIPPED (no CUDA device)");
        return;
    }
    let graph = model_graph(layout).expect("DLRM has a preset graph");
    let net = GraphNet::new(&graph, layout, "model.graph").expect("the graph fits");
    let dense = CudaKernels::new(0)
        .and_then(|kernels| kernels.dense())
        .expect("the dense operations on a present GPU");
    let mut on_gpu = net.on_ops(dense);
    on_gpu.load_params(params).expect("parameters");
    group.bench_function("graph on cuBLAS: train_step", |b| {
        b.iter(|| black_box(on_gpu.train_step(inputs, &[labels]).expect("step")))
    });
    // What the step costs once its minibatch is on the device and its gradients stay
    // there: the copies' share of the line above.
    on_gpu.load_minibatch(inputs, &[labels]).expect("minibatch");
    group.bench_function("graph on cuBLAS: resident step", |b| {
        b.iter(|| on_gpu.step().expect("step"))
    });
}

criterion_group!(benches, step);
criterion_main!(benches);
