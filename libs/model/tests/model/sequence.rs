//! Sequence features: a feature's last ids, one embedding per position, and DIN's target
//! attention over them: the positions pooled and scattered, the attention's gradients
//! against finite differences, an empty sequence adding nothing, and what does not fit
//! refused naming the path.

use primus_model::{GraphNet, GraphWorkspace, SequencePosition};
use primus_spec::dataset::SequenceSpec;
use primus_spec::job::graph::GraphSpec;
use serde_json::json;

use super::*;
use crate::graph::{gradients_match_finite_differences_over, graph};

/// Positions kept of the `history` feature.
const LENGTH: usize = 3;

/// A schema of 3 dense features, `item` and `genre` (one id each) and `history` (a
/// sequence of `LENGTH` of the items).
fn sequence_schema() -> FeatureSchema {
    let mut schema = schema(
        3,
        &[("item", "items"), ("genre", "t"), ("history", "items")],
    );
    let history = &mut schema.sparse[2];
    history.multi_hot = true;
    history.sequence = Some(SequenceSpec {
        max_length: LENGTH as u32,
    });
    schema
}

/// DIN: the item attends to the history; a tower over the dense features, the pooled
/// embeddings and the attended history, plus first-order weights.
fn din() -> GraphSpec {
    graph(json!({
        "inputs": {
            "dense": {"kind": "dense"},
            "item": {"kind": "embeddings", "features": ["item"]},
            "pooled": {"kind": "embeddings"},
            "history": {"kind": "sequence", "feature": "history"},
            "first": {"kind": "first_order"}
        },
        "blocks": {
            "interest": {"kind": "attention", "query": "item", "sequence": "history", "widths": [6, 5]},
            "joined": {"kind": "concat", "inputs": ["dense", "pooled", "interest"]},
            "tower": {"kind": "mlp", "input": "joined", "widths": [8, 1]},
            "logit": {"kind": "add", "inputs": ["tower", "first"]}
        },
        "heads": {"click": {"input": "logit", "label": "label"}}
    }))
}

fn din_layout(spec: &GraphSpec) -> Result<ModelLayout, ModelError> {
    let mut model = model(
        ModelKind::Graph,
        vec![table("items", 4), table("t", 4)],
        &[],
        &[],
    );
    model.dense.graph = Some(spec.clone());
    ModelLayout::new(&model, &sequence_schema())
}

#[test]
fn a_sequence_feature_takes_one_slot_per_position() {
    let layout = din_layout(&din()).expect("the layout");
    let slots: Vec<_> = (layout.features.iter())
        .map(|f| (f.name.as_str(), f.offset, f.position.map(|p| p.index)))
        .collect();
    assert_eq!(
        slots,
        [
            ("item", 0, None),
            ("genre", 4, None),
            ("history", 8, Some(0)),
            ("history", 12, Some(1)),
            ("history", 16, Some(2)),
        ]
    );
    assert_eq!(layout.embedding_width, 20);
    let position = |index| SequencePosition { index, length: 3 };
    assert_eq!(position(0).in_list(5), Some(2), "the last three of five");
    assert_eq!(position(2).in_list(5), Some(4));
    assert_eq!(
        position(1).in_list(1),
        None,
        "one id: only the first position"
    );
    assert_eq!(position(0).in_list(0), None);
}

/// A list longer than the sequence keeps its last ids; a shorter one leaves the last
/// positions empty (zeros); the gradient of each position goes to its own key only.
#[test]
fn positions_pool_the_last_ids_and_scatter_onto_each_one_s_key() {
    let layout = din_layout(&din()).expect("the layout");
    let mut item = JaggedFeature::new("item");
    let mut genre = JaggedFeature::new("genre");
    let mut history = JaggedFeature::new("history");
    item.push_row(&[1]);
    genre.push_row(&[50]);
    history.push_row(&[9, 2, 3, 4]);
    item.push_row(&[2]);
    genre.push_row(&[50]);
    history.push_row(&[3]);
    item.push_row(&[3]);
    genre.push_row(&[51]);
    history.push_row(&[]);
    let kjt = Kjt {
        rows: 3,
        features: vec![item, genre, history],
    };
    let keys = BatchKeys::collect(&layout, &kjt).expect("keys");
    assert_eq!(
        keys.tables,
        [vec![1, 2, 3, 4], vec![50, 51]],
        "9 is past the last three of its list: not looked up"
    );
    // Item k's row is k repeated; the genres' rows are 100 and 200.
    let rows = vec![
        [[1.0; 4], [2.0; 4], [3.0; 4], [4.0; 4]].concat(),
        [[100.0; 4], [200.0; 4]].concat(),
    ];
    let pooled = keys.pool(&CpuKernels, &layout, &rows).expect("pooling");
    let want = [
        [1.0, 100.0, 2.0, 3.0, 4.0],
        [2.0, 100.0, 3.0, 0.0, 0.0],
        [3.0, 200.0, 0.0, 0.0, 0.0],
    ];
    let want: Vec<f32> = (want.iter().flatten()).flat_map(|v| [*v; 4]).collect();
    assert_eq!(pooled, want);
    // Each slot's gradient is its slot number (of 15).
    let grad: Vec<f32> = (0..15).flat_map(|slot| [slot as f32; 4]).collect();
    let scattered = keys.scatter(&CpuKernels, &layout, &grad).expect("backward");
    // Item 2: sample 0's history[0] (slot 2) and sample 1's item (slot 5). Item 3:
    // sample 0's history[1] (3), sample 1's history[0] (7), sample 2's item (10). Item 4:
    // sample 0's history[2] (4). Item 1: sample 0's item (0).
    let items: Vec<f32> = [0.0, 7.0, 20.0, 4.0].iter().flat_map(|v| [*v; 4]).collect();
    assert_eq!(scattered[0], items);
}

#[test]
fn attention_gradients_match_finite_differences() {
    let spec = din();
    let layout = din_layout(&spec).expect("the layout");
    // Every float of the history's positions, besides the harness's own places.
    let history: Vec<usize> = (8..20).collect();
    gradients_match_finite_differences_over(&spec, &layout, &history);
}

/// An empty sequence (zero embeddings) attends to nothing: the same prediction whatever
/// the attention's parameters, and no gradient to them.
#[test]
fn an_empty_sequence_adds_nothing() {
    let spec = din();
    let layout = din_layout(&spec).expect("the layout");
    let net = GraphNet::new(&spec, &layout, "g").expect("the graph fits");
    let rows = 4;
    let (dense, mut embedded, wide, labels) = random_batch(&layout, rows);
    for row in embedded.chunks_exact_mut(layout.embedding_width) {
        row[8..].fill(0.0);
    }
    let inputs = Inputs {
        rows,
        dense: &dense,
        embedded: &embedded,
        wide: &wide,
    };
    let params = net.init_params(3);
    let mut other = params.clone();
    let tensors = (other.tensors().iter())
        .map(|t| {
            let mut t = t.clone();
            if t.name.starts_with("interest.") {
                t.values.iter_mut().for_each(|v| *v += 0.5);
            }
            t
        })
        .collect();
    other.assign(tensors).expect("assign");
    let mut ws = GraphWorkspace::default();
    let step = (net.train_step(&params, &inputs, &[&labels], &mut ws)).expect("step");
    let predicted = net.predict(&other, &inputs, &mut ws).expect("predict");
    assert_eq!(predicted[0], step.heads[0].predictions);
    for grad in step
        .dense_grads
        .iter()
        .filter(|g| g.name.starts_with("interest."))
    {
        assert!(grad.values.iter().all(|g| *g == 0.0), "{}", grad.name);
    }
}

#[test]
fn a_sequence_where_it_does_not_fit_is_refused_naming_the_path() {
    let attend = |query: &str, sequence: &str| json!({"kind": "attention", "query": query, "sequence": sequence, "widths": [4]});
    let inputs = json!({
        "dense": {"kind": "dense"},
        "item": {"kind": "embeddings", "features": ["item"]},
        "history": {"kind": "sequence", "feature": "history"}
    });
    let head = json!({"h": {"input": "out", "label": "label"}});
    let with = |inputs: &serde_json::Value, blocks: serde_json::Value| {
        graph(json!({"inputs": inputs, "blocks": blocks, "heads": head}))
    };
    let cases = [
        (
            with(
                &inputs,
                json!({"out": {"kind": "mlp", "input": "history", "widths": [1]}}),
            ),
            "spec.model.dense.graph.blocks.out.input",
            "\"history\" is a sequence; only an attention block's sequence reads one",
        ),
        (
            with(
                &inputs,
                json!({"a": attend("item", "item"),
                       "out": {"kind": "mlp", "input": "a", "widths": [1]}}),
            ),
            "spec.model.dense.graph.blocks.a.sequence",
            "\"item\" is not a sequence input",
        ),
        (
            with(
                &inputs,
                json!({"a": attend("dense", "history"),
                       "out": {"kind": "mlp", "input": "a", "widths": [1]}}),
            ),
            "spec.model.dense.graph.blocks.a.query",
            "\"dense\" is 3 wide, the sequence's positions 4",
        ),
        (
            with(
                &json!({"h": {"kind": "embeddings", "features": ["item", "history"]}}),
                json!({"out": {"kind": "mlp", "input": "h", "widths": [1]}}),
            ),
            "spec.model.dense.graph.inputs.h.features[1]",
            "\"history\" is a sequence feature; a sequence input reads it",
        ),
        (
            with(
                &json!({"h": {"kind": "sequence", "feature": "genre"}}),
                json!({"out": {"kind": "mlp", "input": "h", "widths": [1]}}),
            ),
            "spec.model.dense.graph.inputs.h.feature",
            "\"genre\" is not a sequence feature",
        ),
    ];
    for (spec, field, message) in cases {
        match din_layout(&spec) {
            Err(ModelError::Spec {
                field: got,
                message: said,
            }) => {
                assert_eq!(got, field, "{said}");
                assert!(
                    said.contains(message),
                    "{field}: {said:?} lacks {message:?}"
                );
            }
            other => panic!("{field}: expected a refusal, got {other:?}"),
        }
    }
    let preset = model(
        ModelKind::WideDeep,
        vec![table("items", 4), table("t", 4)],
        &[],
        &[8, 1],
    );
    match ModelLayout::new(&preset, &sequence_schema()) {
        Err(ModelError::Mismatch { feature, message }) => {
            assert_eq!(feature, "history");
            assert!(message.contains("only model.kind graph reads"), "{message}");
        }
        other => panic!("a preset over a sequence: {other:?}"),
    }
}
