//! Model graphs on the CPU: every block's gradients against finite differences, the
//! presets' graphs written out as specs computing exactly what `Model` computes, and a
//! graph that does not fit its layout refused with the path of what does not fit.

use primus_model::presets::model_graph;
use primus_model::{GraphNet, GraphWorkspace, Inputs, Model, ModelError, ModelLayout, ParamSet};
use primus_spec::job::ModelKind;
use primus_spec::job::graph::{GraphSpec, Loss};
use serde_json::json;

use crate::{model, noise, random_batch, schema, shifted, table};

pub(crate) fn graph(spec: serde_json::Value) -> GraphSpec {
    serde_json::from_value(spec).expect("a graph spec")
}

/// A wide layout (first-order weights) of 3 dense features and 3 sparse ones of 4 floats.
pub(crate) fn wide_layout() -> ModelLayout {
    let spec = model(ModelKind::WideDeep, vec![table("t", 4)], &[], &[8, 1]);
    let features = [("a", "t"), ("b", "t"), ("c", "t")];
    ModelLayout::new(&spec, &schema(3, &features)).expect("layout")
}

/// Every block and both losses in one graph, two heads.
pub(crate) fn every_block() -> GraphSpec {
    graph(json!({
        "inputs": {
            "dense": {"kind": "dense"},
            "emb": {"kind": "embeddings"},
            "ab": {"kind": "embeddings", "features": ["a", "b"]},
            "first": {"kind": "first_order"}
        },
        "blocks": {
            "bottom": {"kind": "mlp", "input": "dense", "widths": [6, 4], "activate_last": true},
            "dots": {"kind": "dot", "inputs": ["bottom", "emb", "ab"]},
            "joined": {"kind": "concat", "inputs": ["dense", "emb"]},
            "cross": {"kind": "cross", "input": "joined", "layers": 2},
            "cross_low": {"kind": "cross", "input": "joined", "layers": 2, "rank": 3},
            "fm": {"kind": "fm", "input": "emb"},
            "top": {"kind": "mlp", "input": "deep_in", "widths": [8, 1]},
            "deep_in": {"kind": "concat", "inputs": ["dots", "cross", "cross_low"]},
            "linear": {"kind": "mlp", "input": "dense", "widths": [5, 1], "activation": "none"},
            "logit": {"kind": "add", "inputs": ["top", "fm", "first", "linear"]},
            "value": {"kind": "mlp", "input": "cross_low", "widths": [4, 1]}
        },
        "heads": {
            "click": {"input": "logit", "label": "label"},
            "time": {"input": "value", "label": "watch", "loss": "squared_error", "weight": 0.5}
        }
    }))
}

#[test]
fn every_block_s_gradients_match_finite_differences() {
    let net = GraphNet::new(&every_block(), &wide_layout(), "model.graph").expect("fits");
    let heads = [
        ("click", "label", Loss::BinaryCrossEntropy),
        ("time", "watch", Loss::SquaredError),
    ];
    assert_eq!(net.heads(), heads);
    gradients_match_finite_differences(&every_block());
}

/// Layer norms with and without a ReLU, over an MLP's output and over the embeddings.
pub(crate) fn layer_norms() -> GraphSpec {
    graph(json!({
        "inputs": {
            "dense": {"kind": "dense"},
            "emb": {"kind": "embeddings"},
            "first": {"kind": "first_order"}
        },
        "blocks": {
            "hidden": {"kind": "mlp", "input": "dense", "widths": [6], "activation": "none"},
            "hidden_norm": {"kind": "layer_norm", "input": "hidden", "activation": "relu"},
            "emb_norm": {"kind": "layer_norm", "input": "emb"},
            "joined": {"kind": "concat", "inputs": ["hidden_norm", "emb_norm"]},
            "top": {"kind": "mlp", "input": "joined", "widths": [4, 1]},
            "logit": {"kind": "add", "inputs": ["top", "first"]}
        },
        "heads": {"click": {"input": "logit", "label": "label"}}
    }))
}

#[test]
fn layer_norm_gradients_match_finite_differences() {
    gradients_match_finite_differences(&layer_norms());
}

/// MMoE: three experts over the dense features and embeddings, a gate per task, a tower
/// per task over its gate (the click's with first-order weights).
pub(crate) fn mixture_of_experts() -> GraphSpec {
    graph(json!({
        "inputs": {
            "dense": {"kind": "dense"},
            "emb": {"kind": "embeddings"},
            "first": {"kind": "first_order"}
        },
        "blocks": {
            "joined": {"kind": "concat", "inputs": ["dense", "emb"]},
            "expert_a": {"kind": "mlp", "input": "joined", "widths": [5], "activate_last": true},
            "expert_b": {"kind": "mlp", "input": "joined", "widths": [5]},
            "expert_c": {"kind": "mlp", "input": "emb", "widths": [5]},
            "click_gate": {"kind": "gate", "input": "joined", "experts": ["expert_a", "expert_b", "expert_c"]},
            "time_gate": {"kind": "gate", "input": "dense", "experts": ["expert_a", "expert_b", "expert_c"]},
            "click_tower": {"kind": "mlp", "input": "click_gate", "widths": [4, 1]},
            "time_tower": {"kind": "mlp", "input": "time_gate", "widths": [1]},
            "click_logit": {"kind": "add", "inputs": ["click_tower", "first"]}
        },
        "heads": {
            "click": {"input": "click_logit", "label": "label"},
            "time": {"input": "time_tower", "label": "watch", "loss": "squared_error"}
        }
    }))
}

#[test]
fn gate_gradients_match_finite_differences() {
    gradients_match_finite_differences(&mixture_of_experts());
}

#[test]
fn a_gate_of_experts_of_different_widths_is_refused_naming_the_expert() {
    let mut spec = mixture_of_experts();
    spec.blocks.insert(
        "expert_c".into(),
        graph(json!({
            "inputs": {},
            "blocks": {"x": {"kind": "mlp", "input": "emb", "widths": [6]}},
            "heads": {}
        }))
        .blocks
        .remove("x")
        .expect("a block"),
    );
    match GraphNet::new(&spec, &wide_layout(), "g") {
        Err(ModelError::Spec { field, message }) => {
            assert_eq!(field, "g.blocks.click_gate.experts[2]", "{message}");
            assert!(
                message.contains("a gate mixes experts of one width"),
                "{message}"
            );
        }
        other => panic!("experts of 5 and 6 mixed: {other:?}"),
    }
}

/// [`gradients_match_finite_differences_over`] `wide_layout`.
fn gradients_match_finite_differences(spec: &GraphSpec) {
    gradients_match_finite_differences_over(spec, &wide_layout(), &[]);
}

/// Every parameter's gradient (at three of its values) and the sparse inputs' (at four
/// places and at `embedded_at`) against central differences of the loss over `layout`
/// (a wide one), each head on a label of its own.
pub(crate) fn gradients_match_finite_differences_over(
    spec: &GraphSpec,
    layout: &ModelLayout,
    embedded_at: &[usize],
) {
    let layout = layout.clone();
    let net = GraphNet::new(spec, &layout, "model.graph").expect("the graph fits");
    let rows = 5;
    let (dense, mut embedded, mut wide, clicks) = random_batch(&layout, rows);
    let watch = noise(9, rows);
    let labels = &[&clicks[..], &watch[..]][..spec.heads.len()];
    let mut params = shifted(&net.init_params(7));
    let mut ws = GraphWorkspace::default();
    let loss = |params: &ParamSet, embedded: &[f32], wide: &[f32], ws: &mut GraphWorkspace| {
        let inputs = Inputs {
            rows,
            dense: &dense,
            embedded,
            wide,
        };
        f64::from(
            net.train_step(params, &inputs, labels, ws)
                .expect("step")
                .loss,
        )
    };
    let inputs = Inputs {
        rows,
        dense: &dense,
        embedded: &embedded,
        wide: &wide,
    };
    let step = net
        .train_step(&params, &inputs, labels, &mut ws)
        .expect("step");
    let weighted: f32 = (step.heads.iter().zip(spec.heads.values()))
        .map(|(head, declared)| head.loss * declared.weight as f32)
        .sum();
    assert!((step.loss - weighted).abs() < 1e-6, "{step:?}");
    let eps = 1e-3f32;
    let close = |numeric: f64, analytic: f32, what: &str| {
        let analytic = f64::from(analytic);
        assert!(
            (numeric - analytic).abs() < 2e-3 + 2e-2 * analytic.abs(),
            "{what}: numeric {numeric} analytic {analytic}"
        );
    };
    assert_eq!(
        step.dense_grads.iter().map(|g| &g.name).collect::<Vec<_>>(),
        params.tensors().iter().map(|t| &t.name).collect::<Vec<_>>(),
        "a gradient for every parameter, in the set's order"
    );
    for grad in &step.dense_grads {
        for index in [0, grad.values.len() / 2, grad.values.len() - 1] {
            let original = params.get(&grad.name).expect("param").values[index];
            let mut at = |delta: f32| {
                let mut tensors = params.tensors().to_vec();
                let t = tensors.iter_mut().find(|t| t.name == grad.name).expect("t");
                t.values[index] = original + delta;
                params.assign(tensors).expect("assign");
                loss(&params, &embedded, &wide, &mut ws)
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * f64::from(eps));
            at(0.0);
            close(
                numeric,
                grad.values[index],
                &format!("{}[{index}]", grad.name),
            );
        }
    }
    let places = [0, 5, embedded.len() / 2, embedded.len() - 1];
    for &index in places.iter().chain(embedded_at) {
        let original = embedded[index];
        embedded[index] = original + eps;
        let up = loss(&params, &embedded, &wide, &mut ws);
        embedded[index] = original - eps;
        let down = loss(&params, &embedded, &wide, &mut ws);
        embedded[index] = original;
        let numeric = (up - down) / (2.0 * f64::from(eps));
        close(
            numeric,
            step.embedded_grad[index],
            &format!("embedded[{index}]"),
        );
    }
    for index in [0, wide.len() - 1] {
        let original = wide[index];
        wide[index] = original + eps;
        let up = loss(&params, &embedded, &wide, &mut ws);
        wide[index] = original - eps;
        let down = loss(&params, &embedded, &wide, &mut ws);
        wide[index] = original;
        let numeric = (up - down) / (2.0 * f64::from(eps));
        close(numeric, step.wide_grad[index], &format!("wide[{index}]"));
    }
}

/// The graphs the hand-written networks are, by their parameters' names.
fn network_as_graph(kind: ModelKind, top: &[u32]) -> GraphSpec {
    match kind {
        ModelKind::Dlrm => graph(json!({
            "inputs": {"dense": {"kind": "dense"}, "emb": {"kind": "embeddings"}},
            "blocks": {
                "bottom": {"kind": "mlp", "input": "dense", "widths": [64, 8], "activate_last": true},
                "dots": {"kind": "dot", "inputs": ["bottom", "emb"]},
                "top": {"kind": "mlp", "input": "dots", "widths": top}
            },
            "heads": {"label": {"input": "top", "label": "label"}}
        })),
        ModelKind::Deepfm | ModelKind::WideDeep => {
            let mut logit = vec!["deep", "first"];
            let mut blocks = json!({
                "joined": {"kind": "concat", "inputs": ["dense", "emb"]},
                "deep": {"kind": "mlp", "input": "joined", "widths": top},
                "wide_dense": {"kind": "mlp", "input": "dense", "widths": [1]},
                "fm": {"kind": "fm", "input": "emb"}
            });
            logit.push("wide_dense");
            if kind == ModelKind::Deepfm {
                logit.push("fm");
            } else {
                blocks.as_object_mut().expect("blocks").remove("fm");
            }
            blocks["logit"] = json!({"kind": "add", "inputs": logit});
            graph(json!({
                "inputs": {
                    "dense": {"kind": "dense"},
                    "emb": {"kind": "embeddings"},
                    "first": {"kind": "first_order"}
                },
                "blocks": blocks,
                "heads": {"label": {"input": "logit", "label": "label"}}
            }))
        }
        ModelKind::Mtrm | ModelKind::Graph => unreachable!("not a preset of one graph"),
    }
}

#[test]
fn graphs_written_as_the_presets_compute_exactly_what_the_model_computes() {
    let top = [128, 64, 1];
    for kind in [ModelKind::Dlrm, ModelKind::Deepfm, ModelKind::WideDeep] {
        let bottom: &[u32] = if kind == ModelKind::Dlrm {
            &[64, 8]
        } else {
            &[]
        };
        let spec = model(kind, vec![table("t", 8)], bottom, &top);
        let features = [("a", "t"), ("b", "t"), ("c", "t")];
        let layout = ModelLayout::new(&spec, &schema(5, &features)).expect("layout");
        let spec = network_as_graph(kind, &top);
        assert_eq!(
            model_graph(&layout).as_ref(),
            Some(&spec),
            "{kind:?}: the preset"
        );
        let net = GraphNet::new(&spec, &layout, "model.graph").expect("the graph fits");
        let params = net.init_params(11);
        assert_eq!(
            params,
            ParamSet::init(&layout, 11),
            "{kind:?}: the same parameters"
        );
        let rows = 1000;
        let (dense, embedded, wide, labels) = random_batch(&layout, rows);
        let inputs = Inputs {
            rows,
            dense: &dense,
            embedded: &embedded,
            wide: &wide,
        };
        let want = Model::new(layout.clone())
            .expect("model")
            .train_step(&params, &inputs, &[&labels], primus_model::Tower::Memory)
            .expect("network step");
        let mut early = Vec::new();
        let got = net
            .train_step_with(
                &params,
                &inputs,
                &[&labels],
                &mut GraphWorkspace::default(),
                |grads| early.push(grads.embedded.to_vec()),
            )
            .expect("graph step");
        assert_eq!(got.loss, want.loss, "{kind:?}");
        assert_eq!(got.heads[0].predictions, want.probabilities(), "{kind:?}");
        assert_eq!(got.dense_grads, want.dense_grads, "{kind:?}");
        assert_eq!(got.embedded_grad, want.embedded_grad, "{kind:?}");
        assert_eq!(got.wide_grad, want.wide_grad, "{kind:?}");
        assert_eq!(
            early,
            std::slice::from_ref(&got.embedded_grad),
            "{kind:?}: handed out once, whole"
        );
        let predicted = net
            .predict(&params, &inputs, &mut GraphWorkspace::default())
            .expect("predict");
        assert_eq!(predicted, [want.probabilities()], "{kind:?}");
    }
}

fn refusal(spec: serde_json::Value) -> (String, String) {
    match GraphNet::new(&graph(spec), &wide_layout(), "model.graph") {
        Err(ModelError::Spec { field, message }) => (field, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_graph_that_does_not_fit_is_refused_naming_the_path() {
    let emb = json!({"kind": "embeddings"});
    let dense = json!({"kind": "dense"});
    let head = json!({"h": {"input": "out", "label": "label"}});
    let cases = [
        (
            json!({"inputs": {"emb": emb}, "blocks": {
                "a": {"kind": "concat", "inputs": ["emb", "b"]},
                "b": {"kind": "concat", "inputs": ["a"]},
                "out": {"kind": "mlp", "input": "a", "widths": [1]}}, "heads": head}),
            "model.graph.blocks.a",
            "cycle: a -> b -> a",
        ),
        (
            json!({"inputs": {"emb": emb}, "blocks": {
                "out": {"kind": "mlp", "input": "embs", "widths": [1]}}, "heads": head}),
            "model.graph.blocks.out.input",
            "\"embs\" is neither an input nor a block",
        ),
        (
            json!({"inputs": {"emb": emb, "dense": dense}, "blocks": {
                "out": {"kind": "add", "inputs": ["emb", "dense"]}}, "heads": head}),
            "model.graph.blocks.out.inputs[1]",
            "\"dense\" is 3 wide, \"emb\" 12",
        ),
        (
            json!({"inputs": {"emb": emb}, "blocks": {
                "out": {"kind": "mlp", "input": "emb", "widths": [4]}}, "heads": head}),
            "model.graph.heads.h.input",
            "\"out\" is 4 wide; a head reads a value of width 1",
        ),
        (
            json!({"inputs": {"emb": emb, "dense": dense}, "blocks": {
                "d": {"kind": "dot", "inputs": ["emb", "dense"]},
                "out": {"kind": "mlp", "input": "d", "widths": [1]}}, "heads": head}),
            "model.graph.blocks.d.inputs[0]",
            "\"emb\" holds 3 vectors; the first input is one vector",
        ),
        (
            json!({"inputs": {"dense": {"kind": "dense", "features": ["i0", "i9"]}}, "blocks": {
                "out": {"kind": "mlp", "input": "dense", "widths": [1]}}, "heads": head}),
            "model.graph.inputs.dense.features[1]",
            "the Dataset has no dense feature \"i9\"",
        ),
        (
            json!({"inputs": {"dense": dense}, "blocks": {
                "out": {"kind": "fm", "input": "dense"}}, "heads": head}),
            "model.graph.blocks.out.input",
            "\"dense\" is one vector of 3; a factorisation machine crosses two or more",
        ),
        (
            json!({"inputs": {"dense": dense}, "blocks": {
                "one": {"kind": "mlp", "input": "dense", "widths": [1]},
                "out": {"kind": "layer_norm", "input": "one"}}, "heads": head}),
            "model.graph.blocks.out.input",
            "\"one\" is 1 wide; normalising a row needs 2 or more values",
        ),
    ];
    for (spec, field, message) in cases {
        let (got_field, got_message) = refusal(spec);
        assert_eq!(got_field, field, "{got_message}");
        assert!(
            got_message.contains(message),
            "{field}: {got_message:?} does not say {message:?}"
        );
    }
}

#[test]
fn parameters_of_another_graph_and_wrong_inputs_are_errors_not_panics() {
    let layout = wide_layout();
    let net = GraphNet::new(&every_block(), &layout, "model.graph").expect("fits");
    let other = GraphNet::new(
        &network_as_graph(ModelKind::WideDeep, &[8, 1]),
        &layout,
        "g",
    )
    .expect("fits");
    let rows = 4;
    let (dense, embedded, wide, labels) = random_batch(&layout, rows);
    let inputs = Inputs {
        rows,
        dense: &dense,
        embedded: &embedded,
        wide: &wide,
    };
    let mut ws = GraphWorkspace::default();
    let labels = [&labels[..], &labels[..]];
    let foreign = other.init_params(1);
    assert!(matches!(
        net.train_step(&foreign, &inputs, &labels, &mut ws),
        Err(ModelError::Params(_))
    ));
    let params = net.init_params(1);
    assert!(matches!(
        net.train_step(&params, &inputs, &labels[..1], &mut ws),
        Err(ModelError::Inputs(_))
    ));
    let short = Inputs {
        embedded: &embedded[1..],
        ..inputs
    };
    assert!(matches!(
        net.train_step(&params, &short, &labels, &mut ws),
        Err(ModelError::Inputs(_))
    ));
}
