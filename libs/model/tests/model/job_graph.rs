//! A Job's own graph (`model.kind: graph`): its layout, parameters and steps are the
//! compiled graph's, and a graph that does not fit the Dataset is refused when the layout
//! is made, naming the path in the Job's spec.

use primus_batch::{DenseMatrix, Kjt, Minibatch, Sparse, Target};
use primus_model::{
    GraphNet, GraphWorkspace, Inputs, LabelColumn, Model, ModelError, ModelLayout, ParamSet,
};
use primus_spec::dataset::FeatureSchema;
use primus_spec::job::ModelKind;
use primus_spec::job::graph::{GraphSpec, Loss};

use crate::graph::every_block;
use crate::{model, random_batch, schema, shifted, table};

/// `every_block` with its one head on the Dataset's label.
fn one_head() -> GraphSpec {
    let mut spec = every_block();
    spec.heads.remove("time");
    spec.blocks.remove("value");
    spec
}

fn layout_of(graph: Option<GraphSpec>) -> Result<ModelLayout, ModelError> {
    layout_with_targets(graph, &[])
}

/// The layout of `graph` over a Dataset with further label columns `targets`.
fn layout_with_targets(
    graph: Option<GraphSpec>,
    targets: &[&str],
) -> Result<ModelLayout, ModelError> {
    let mut spec = model(ModelKind::Graph, vec![table("t", 4)], &[], &[]);
    spec.dense.graph = graph;
    let features = [("a", "t"), ("b", "t"), ("c", "t")];
    let schema = FeatureSchema {
        targets: targets.iter().map(|t| (*t).to_owned()).collect(),
        ..schema(3, &features)
    };
    ModelLayout::new(&spec, &schema)
}

/// A minibatch of `rows` with the schema's label and `targets`' columns (the sparse
/// features are not read here).
fn labelled(layout: &ModelLayout, rows: usize, targets: &[(&str, Vec<f32>)]) -> Minibatch {
    let (dense, _, _, labels) = random_batch(layout, rows);
    Minibatch {
        labels,
        targets: (targets.iter())
            .map(|(name, values)| Target {
                name: (*name).to_owned(),
                values: values.clone(),
            })
            .collect(),
        dense: DenseMatrix {
            names: layout.dense_names.clone(),
            values: dense,
        },
        sparse: Sparse::Jagged(Kjt::default()),
    }
}

#[test]
fn a_graph_of_two_heads_trains_each_on_its_own_label_column() {
    let layout = layout_with_targets(Some(every_block()), &["watch"]).expect("fits");
    let heads: Vec<(&str, LabelColumn, &str)> = (layout.heads.iter())
        .map(|h| (h.name.as_str(), h.column, h.column_name.as_str()))
        .collect();
    assert_eq!(
        heads,
        [
            ("click", LabelColumn::Label, "label"),
            ("time", LabelColumn::Target(0), "watch")
        ]
    );
    let model = Model::new(layout.clone()).expect("a model of the layout");
    let rows = 32;
    let watch: Vec<f32> = (0..rows).map(|i| i as f32 * 0.25 - 3.0).collect();
    let batch = labelled(&layout, rows, &[("watch", watch.clone())]);
    let labels = model.head_labels(&batch).expect("both columns");
    assert_eq!(labels, [&batch.labels[..], &watch[..]]);

    let params = shifted(&ParamSet::init(&layout, 2));
    let (_, embedded, wide, _) = random_batch(&layout, rows);
    let inputs = Inputs {
        rows,
        dense: &batch.dense.values,
        embedded: &embedded,
        wide: &wide,
    };
    let step =
        (model.train_step(&params, &inputs, &labels, primus_model::Tower::Memory)).expect("a step");
    let net = GraphNet::new(&every_block(), &layout, "g").expect("fits");
    let want = (net.train_step(&params, &inputs, &labels, &mut GraphWorkspace::default()))
        .expect("a step");
    assert_eq!(step.heads, want.heads);
    assert_eq!(step.loss, want.loss);
    let weighted: f32 = (want.heads.iter().zip(&every_block().heads))
        .map(|(head, (_, spec))| head.loss * spec.weight as f32)
        .sum();
    assert!(
        (step.loss - weighted).abs() <= 1e-5 * weighted.abs(),
        "{}",
        step.loss
    );
    assert_ne!(step.heads[0].loss, step.heads[1].loss);

    let without = labelled(&layout, rows, &[]);
    match model.head_labels(&without) {
        Err(ModelError::Inputs(message)) => assert!(
            message.contains("targets [], the model expects [\"watch\"]"),
            "{message}"
        ),
        other => panic!("a minibatch without the target: {other:?}"),
    }
    let mut binary = every_block();
    binary.heads.get_mut("time").expect("a time head").loss = Loss::BinaryCrossEntropy;
    let layout = layout_with_targets(Some(binary), &["watch"]).expect("fits");
    let model = Model::new(layout).expect("a model");
    match model.head_labels(&batch) {
        Err(ModelError::Inputs(message)) => assert!(
            message.contains("head \"time\" is binary, and its label column \"watch\" holds -3"),
            "{message}"
        ),
        other => panic!("a binary head on values out of [0, 1]: {other:?}"),
    }
}

#[test]
fn a_job_s_graph_trains_and_predicts_as_the_compiled_graph() {
    let layout = layout_of(Some(one_head())).expect("the graph fits");
    assert!(
        layout.has_wide(),
        "a first-order input gives every table its wide twin"
    );
    let net = GraphNet::new(&one_head(), &layout, "g").expect("fits");
    assert_eq!(ParamSet::init(&layout, 5), net.init_params(5));
    let params = shifted(&ParamSet::init(&layout, 5));
    let rows = 64;
    let (dense, embedded, wide, labels) = random_batch(&layout, rows);
    let inputs = Inputs {
        rows,
        dense: &dense,
        embedded: &embedded,
        wide: &wide,
    };
    let model = Model::new(layout.clone()).expect("a model of the layout");
    let step = (model.train_step(&params, &inputs, &[&labels], primus_model::Tower::Memory))
        .expect("a step");
    let mut workspace = GraphWorkspace::default();
    let want = (net.train_step(&params, &inputs, &[&labels], &mut workspace)).expect("a step");
    assert_eq!(step.loss, want.loss);
    assert_eq!(step.dense_grads, want.dense_grads);
    assert_eq!(step.embedded_grad, want.embedded_grad);
    assert_eq!(step.wide_grad, want.wide_grad);
    assert!(step.loss.is_finite() && step.loss > 0.0, "{}", step.loss);
    let names: Vec<String> = params.names();
    for block in [
        "bottom.0.weight",
        "cross.1.weight",
        "cross_low.0.v",
        "linear.1.bias",
    ] {
        assert!(names.iter().any(|n| n == block), "{block} in {names:?}");
    }
    #[cfg(feature = "burn")]
    assert!(matches!(
        Model::burn_cpu(layout),
        Err(ModelError::Spec { ref field, .. }) if field == "spec.model.kind"
    ));
}

#[test]
fn a_job_s_graph_that_does_not_fit_its_dataset_is_refused_with_the_spec_s_path() {
    let mut other_label = one_head();
    other_label
        .heads
        .get_mut("click")
        .expect("a click head")
        .label = "watch".into();
    let mut unknown = one_head();
    let Some(primus_spec::job::graph::GraphInput::Embeddings { features }) =
        unknown.inputs.get_mut("ab")
    else {
        panic!("every_block has an `ab` embeddings input");
    };
    features[1] = "z".into();
    let cases = [
        (None, "spec.model.dense.graph", "needs the graph"),
        (
            Some(every_block()),
            "spec.model.dense.graph.heads.time.label",
            "\"watch\" is neither the Dataset's label column (\"label\") nor one of its \
             schema.targets ([])",
        ),
        (
            Some(other_label),
            "spec.model.dense.graph.heads.click.label",
            "\"watch\" is neither the Dataset's label column",
        ),
        (
            Some(unknown),
            "spec.model.dense.graph.inputs.ab.features[1]",
            "no sparse feature \"z\"",
        ),
    ];
    for (graph, path, says) in cases {
        match layout_of(graph) {
            Err(ModelError::Spec { field, message }) => {
                assert_eq!(field, path, "{message}");
                assert!(
                    message.contains(says),
                    "{path}: {message:?} does not say {says:?}"
                );
            }
            other => panic!("{path}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn a_graph_with_gates_trains_on_the_cpu_and_is_refused_for_a_gpu() {
    let graph = crate::graph::mixture_of_experts();
    let layout = layout_with_targets(Some(graph), &["watch"]).expect("the graph fits");
    let model = Model::new(layout.clone()).expect("on the CPU");
    let rows = 16;
    let (dense, embedded, wide, labels) = random_batch(&layout, rows);
    let watch: Vec<f32> = (0..rows).map(|i| i as f32).collect();
    let inputs = Inputs {
        rows,
        dense: &dense,
        embedded: &embedded,
        wide: &wide,
    };
    let step = (model.train_step(
        &ParamSet::init(&layout, 3),
        &inputs,
        &[&labels, &watch],
        primus_model::Tower::Memory,
    ))
    .expect("a step");
    assert!(step.loss.is_finite(), "{}", step.loss);
    match Model::on(layout, primus_model::DenseDevice::Cuda(0)) {
        Err(ModelError::Device { reason, .. }) => assert!(
            reason.contains("\"click_gate\" is a gate, which runs on the CPU only"),
            "{reason}"
        ),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a gate placed on a GPU"),
    }
}

#[test]
fn a_graph_with_a_layer_norm_trains_on_the_cpu_and_is_refused_for_a_gpu() {
    let layout = layout_of(Some(crate::graph::layer_norms())).expect("the graph fits");
    let params = ParamSet::init(&layout, 3);
    let scale = params
        .get("emb_norm.scale")
        .expect("the layer norm's scale");
    assert!(
        scale.values.iter().all(|v| *v == 1.0),
        "scales start at one"
    );
    let model = Model::new(layout.clone()).expect("on the CPU");
    let rows = 16;
    let (dense, embedded, wide, labels) = random_batch(&layout, rows);
    let inputs = Inputs {
        rows,
        dense: &dense,
        embedded: &embedded,
        wide: &wide,
    };
    let step = (model.train_step(&params, &inputs, &[&labels], primus_model::Tower::Memory))
        .expect("a step");
    assert!(step.loss.is_finite(), "{}", step.loss);
    match Model::on(layout, primus_model::DenseDevice::Cuda(0)) {
        Err(ModelError::Device { reason, .. }) => assert!(
            reason.contains("\"emb_norm\" is a layer norm, which runs on the CPU only"),
            "{reason}"
        ),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a layer norm placed on a GPU"),
    }
}
