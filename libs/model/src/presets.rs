//! DLRM, DeepFM and Wide&Deep (`model.kind`) as model graphs: what those kinds compute,
//! block for block, with the parameter names their checkpoints hold (`bottom.0.weight`,
//! `deep.1.bias`, ...); `kind: graph` runs the Job's own.

use std::collections::BTreeMap;

use primus_spec::job::ModelKind;
use primus_spec::job::graph::{Activation, Block, GraphInput, GraphSpec, Head, Loss};

use crate::layout::ModelLayout;

/// The graph `layout`'s model runs: the Job's own for `kind: graph`, else its kind's with
/// one binary head on its label; `None` for MTRM, whose two towers train on different
/// data and run on burn.
pub fn model_graph(layout: &ModelLayout) -> Option<GraphSpec> {
    let spec = &layout.dense_spec;
    let mut inputs = BTreeMap::new();
    let mut blocks = BTreeMap::new();
    let dense = layout.dense_inputs > 0;
    if dense {
        inputs.insert("dense".into(), GraphInput::Dense { features: vec![] });
    }
    inputs.insert("emb".into(), GraphInput::Embeddings { features: vec![] });
    let logit = match layout.kind {
        ModelKind::Dlrm => {
            blocks.insert("bottom".into(), mlp("dense", &spec.bottom, true));
            blocks.insert(
                "dots".into(),
                Block::Dot {
                    inputs: names(&["bottom", "emb"]),
                },
            );
            blocks.insert("top".into(), mlp("dots", &spec.top, false));
            "top"
        }
        ModelKind::Deepfm | ModelKind::WideDeep => {
            let joined = if dense {
                &["dense", "emb"][..]
            } else {
                &["emb"]
            };
            blocks.insert(
                "joined".into(),
                Block::Concat {
                    inputs: names(joined),
                },
            );
            blocks.insert("deep".into(), mlp("joined", &spec.top, false));
            // The terms in the order the logit adds them.
            let mut terms = vec!["deep"];
            if layout.has_wide() {
                inputs.insert("first".into(), GraphInput::FirstOrder);
                terms.push("first");
            }
            if dense {
                blocks.insert("wide_dense".into(), mlp("dense", &[1], false));
                terms.push("wide_dense");
            }
            if layout.kind == ModelKind::Deepfm {
                blocks.insert(
                    "fm".into(),
                    Block::Fm {
                        input: "emb".into(),
                    },
                );
                terms.push("fm");
            }
            blocks.insert(
                "logit".into(),
                Block::Add {
                    inputs: names(&terms),
                },
            );
            "logit"
        }
        ModelKind::Mtrm => return None,
        ModelKind::Graph => return spec.graph.clone(),
    };
    let head = Head {
        input: logit.into(),
        label: layout.label.clone(),
        loss: Loss::BinaryCrossEntropy,
        weight: 1.0,
    };
    Some(GraphSpec {
        inputs,
        blocks,
        heads: BTreeMap::from([("label".into(), head)]),
    })
}

fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// ReLU MLP over `input`; ReLU after its last layer too with `activate_last`.
fn mlp(input: &str, widths: &[u32], activate_last: bool) -> Block {
    Block::Mlp {
        input: input.into(),
        widths: widths.to_vec(),
        activation: Activation::Relu,
        activate_last,
    }
}
