//! A model graph placed on dense operations (`GraphNet::on_ops`) against the same graph on
//! the CPU: the DLRM and DeepFM presets and a graph of every block, on the host reference
//! everywhere, on cuBLAS and the dense kernels where a GPU is present.

use primus_gpu::dense::{DenseOps, HostDense};
use primus_gpu::{CudaKernels, CudaStatus, cuda_status};
use primus_model::presets::model_graph;
use primus_model::{GraphNet, GraphStep, GraphWorkspace, Inputs, ModelError, ModelLayout};
use primus_spec::job::ModelKind;

use crate::graph::{self, wide_layout};
use crate::{model, noise, random_batch, relative_difference, schema, shifted, table};

/// A DLRM of the reference's shape, smaller: 4 dense features, 5 sparse of dim 8.
fn dlrm() -> (ModelLayout, GraphNet) {
    let spec = model(
        ModelKind::Dlrm,
        vec![table("t", 8)],
        &[32, 16, 8],
        &[64, 32, 1],
    );
    let features = [("a", "t"), ("b", "t"), ("c", "t"), ("d", "t"), ("e", "t")];
    let layout = ModelLayout::new(&spec, &schema(4, &features)).expect("layout");
    let graph = model_graph(&layout).expect("DLRM has a preset graph");
    let net = GraphNet::new(&graph, &layout, "model.graph").expect("the graph fits");
    (layout, net)
}

fn assert_close(got: &GraphStep, want: &GraphStep, tolerance: f64, what: &str) {
    assert!(
        ((got.loss - want.loss) / want.loss).abs() < tolerance as f32,
        "{what}: loss {} against {}",
        got.loss,
        want.loss
    );
    assert_eq!(got.heads.len(), want.heads.len(), "{what}: heads");
    let mut pairs = vec![
        ("embedded_grad", &got.embedded_grad, &want.embedded_grad),
        ("wide_grad", &got.wide_grad, &want.wide_grad),
    ];
    for (g, w) in got.heads.iter().zip(&want.heads) {
        pairs.push(("predictions", &g.predictions, &w.predictions));
    }
    for (name, g, w) in pairs {
        let d = relative_difference(g, w);
        assert!(d < tolerance, "{what}: {name} differs by {d:.2e}");
    }
    let names = |s: &GraphStep| {
        s.dense_grads
            .iter()
            .map(|t| t.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(got), names(want), "{what}: gradient tensors");
    for (g, w) in got.dense_grads.iter().zip(&want.dense_grads) {
        let d = relative_difference(&g.values, &w.values);
        assert!(d < tolerance, "{what}: {} differs by {d:.2e}", g.name);
    }
}

/// Every block, inputs of some of the columns, both losses, two heads (the CPU graph's
/// finite-difference test's graph).
fn every_block() -> (ModelLayout, GraphNet) {
    let layout = wide_layout();
    let net = GraphNet::new(&graph::every_block(), &layout, "model.graph").expect("the graph fits");
    (layout, net)
}

/// The DeepFM preset: first-order weights, FM, a deep MLP over the embeddings, a sum.
fn deepfm() -> (ModelLayout, GraphNet) {
    let spec = model(ModelKind::Deepfm, vec![table("t", 8)], &[], &[16, 1]);
    let layout = ModelLayout::new(&spec, &schema(2, &[("a", "t"), ("b", "t")])).expect("layout");
    let graph = model_graph(&layout).expect("DeepFM has a preset graph");
    let net = GraphNet::new(&graph, &layout, "model.graph").expect("the graph fits");
    (layout, net)
}

/// The graphs every comparison here runs.
fn every_graph() -> [(&'static str, (ModelLayout, GraphNet)); 3] {
    [
        ("DLRM", dlrm()),
        ("DeepFM", deepfm()),
        ("every block", every_block()),
    ]
}

/// Steps of two minibatch sizes (buffers made again), the second size twice (reused), each
/// with parameters and values of its own, so that a reused buffer holding the previous
/// step's values would show.
fn steps_match<O: DenseOps>(
    ops: O,
    (layout, net): (ModelLayout, GraphNet),
    tolerance: f64,
    what: &str,
) {
    let mut on_ops = net.on_ops(ops);
    let mut ws = GraphWorkspace::default();
    for (step, rows) in [300, 77, 77].into_iter().enumerate() {
        let params = shifted(&net.init_params(5 + step as u64));
        on_ops.load_params(&params).expect("parameters");
        let scale = 1.0 + 0.5 * step as f32;
        let scaled = |values: Vec<f32>| -> Vec<f32> { values.iter().map(|v| v * scale).collect() };
        let (dense, embedded, wide, clicks) = random_batch(&layout, rows);
        let (dense, embedded, wide) = (scaled(dense), scaled(embedded), scaled(wide));
        let clicks: Vec<f32> = match step {
            2 => clicks.iter().map(|c| 1.0 - c).collect(),
            _ => clicks,
        };
        let watch = scaled(noise(9, rows));
        let labels: Vec<&[f32]> = [&clicks[..], &watch[..]][..net.heads().len()].to_vec();
        let inputs = Inputs {
            rows,
            dense: &dense,
            embedded: &embedded,
            wide: &wide,
        };
        let want = net
            .train_step(&params, &inputs, &labels, &mut ws)
            .expect("CPU step");
        let got = on_ops.train_step(&inputs, &labels).expect("device step");
        assert_close(
            &got,
            &want,
            tolerance,
            &format!("{what}, step {step}, {rows} rows"),
        );
    }
}

#[test]
fn a_graph_on_the_host_reference_operations_trains_like_the_cpu_graph() {
    for (name, graph) in every_graph() {
        steps_match(
            HostDense,
            graph,
            1e-5,
            &format!("{name} on the host reference"),
        );
    }
}

#[test]
fn a_step_before_its_parameters_or_minibatch_are_loaded_is_refused() {
    let (_, dlrm) = dlrm();
    let mut on_ops = dlrm.on_ops(HostDense);
    assert!(
        matches!(on_ops.step(), Err(ModelError::Params(_))),
        "a step before parameters are loaded"
    );
    on_ops
        .load_params(&dlrm.init_params(1))
        .expect("parameters");
    assert!(
        matches!(on_ops.step(), Err(ModelError::Inputs(_))),
        "a step before a minibatch is loaded"
    );
    let (dense, embedded) = (vec![0.0; 4], vec![0.0; 39]);
    let inputs = Inputs {
        rows: 1,
        dense: &dense,
        embedded: &embedded,
        wide: &[],
    };
    assert!(
        matches!(
            on_ops.train_step(&inputs, &[&[1.0]]),
            Err(ModelError::Inputs(_))
        ),
        "a minibatch one value short"
    );
}

#[test]
fn a_graph_on_a_gpu_trains_like_the_cpu_graph_or_says_why_it_cannot() {
    if !matches!(cuda_status(), CudaStatus::Ready { .. }) {
        println!("SKIPPED (no CUDA device): a model graph on cuBLAS and the dense kernels");
        return;
    }
    // cuBLAS orders its sums as it likes; the tolerance is the dense launches' own.
    for (name, graph) in every_graph() {
        let dense = CudaKernels::new(0)
            .and_then(|kernels| kernels.dense())
            .expect("the dense operations on a present GPU");
        steps_match(dense, graph, 1e-4, &format!("{name} on cuBLAS"));
    }
}

/// A step whose pooled values are written where the operations run (the GPU trainer's
/// path, on the host reference here): the same losses, predictions and dense gradients as
/// the CPU graph, and the embeddings' gradients left in the device's buffers.
#[test]
fn a_minibatch_pooled_in_place_steps_like_one_copied_in() {
    for (name, (layout, net)) in every_graph() {
        let mut on_ops = net.on_ops(HostDense);
        let mut ws = GraphWorkspace::default();
        for (step, rows) in [40, 40, 9].into_iter().enumerate() {
            let params = shifted(&net.init_params(3 + step as u64));
            on_ops.load_params(&params).expect("parameters");
            let (dense, embedded, wide, clicks) = random_batch(&layout, rows);
            let watch = noise(4, rows);
            let labels: Vec<&[f32]> = [&clicks[..], &watch[..]][..net.heads().len()].to_vec();
            let inputs = Inputs {
                rows,
                dense: &dense,
                embedded: &embedded,
                wide: &wide,
            };
            let want = net
                .train_step(&params, &inputs, &labels, &mut ws)
                .expect("CPU step");
            on_ops
                .load_pooled_minibatch(rows, &dense, &labels, |ops, into, wide_into| {
                    ops.write(into, &embedded)?;
                    if let Some(wide_into) = wide_into {
                        ops.write(wide_into, &wide)?;
                    }
                    Ok(())
                })
                .expect("a pooled minibatch");
            on_ops.step().expect("step");
            let grads = on_ops.embedding_grads().expect("the embeddings' gradients");
            let on_device = |buffer: Option<&Vec<f32>>, len: usize| match buffer {
                Some(values) => values[..len].to_vec(),
                None => vec![0.0; len],
            };
            let embedded_grad = on_device(grads.embedded, embedded.len());
            let wide_grad = match grads.wide {
                Some(values) => values[..wide.len()].to_vec(),
                None => Vec::new(),
            };
            let mut got = on_ops.dense_results().expect("results");
            assert!(got.embedded_grad.is_empty() && got.wide_grad.is_empty());
            (got.embedded_grad, got.wide_grad) = (embedded_grad, wide_grad);
            assert_close(
                &got,
                &want,
                1e-5,
                &format!("{name}, step {step}, pooled in place"),
            );
        }
    }
}

#[test]
fn a_pooled_minibatch_of_the_wrong_size_is_refused() {
    let (_, net) = dlrm();
    let mut on_ops = net.on_ops(HostDense);
    let untouched = |_: &mut HostDense, _: &mut Vec<f32>, _: Option<&mut Vec<f32>>| Ok(());
    let refused = on_ops.load_pooled_minibatch(2, &[0.0; 7], &[&[1.0, 0.0]], untouched);
    assert!(matches!(refused, Err(ModelError::Inputs(m)) if m.contains("dense holds 7 values")));
    let refused = on_ops.load_pooled_minibatch(2, &[0.0; 8], &[&[1.0]], untouched);
    assert!(matches!(refused, Err(ModelError::Inputs(m)) if m.contains("label column of 2 rows")));
    let refused = on_ops.load_pooled_minibatch(0, &[], &[&[]], untouched);
    assert!(matches!(refused, Err(ModelError::Inputs(_))), "no rows");
}
