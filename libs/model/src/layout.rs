//! What a Job's model and its Dataset's schema imply together: which table each sparse
//! feature reads, where its pooled embedding sits in a sample's embedding row, the tables
//! the PS must hold, and the checks that the two fit.

use primus_spec::dataset::FeatureSchema;
use primus_spec::job::graph::{GraphInput, Loss};
use primus_spec::job::{DenseSpec, Initializer, ModelKind, ModelSpec, TablePooling, TableSpec};

use crate::ModelError;
use crate::cpu::blocks::{GraphNet, ParamShape};

/// Suffix of the one-wide companion table holding first-order (wide) weights of a table's
/// keys, for Wide&Deep, DeepFM and graphs with a first-order input.
pub const WIDE_SUFFIX: &str = "_wide";

/// Where a Job's graph is in its spec (what its errors name).
pub const GRAPH_PATH: &str = "spec.model.dense.graph";

/// A sparse feature of the schema as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureSlot {
    /// The feature's name.
    pub name: String,
    /// Index into [`ModelLayout::tables`].
    pub table: usize,
    /// Floats per key.
    pub dim: usize,
    /// First column of this feature's pooled embedding in a sample's embedding row.
    pub offset: usize,
    /// A sequence feature's slot: one position of its kept ids.
    pub position: Option<SequencePosition>,
}

/// One position of a sequence feature's slots: the `index`-th of the last `length` ids
/// of its list (oldest first), empty when the list is shorter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequencePosition {
    /// Which position.
    pub index: usize,
    /// How many positions the feature keeps (`sequence.max_length`).
    pub length: usize,
}

impl SequencePosition {
    /// Where this position's id is in a list of `ids` ids, if it has one.
    pub fn in_list(self, ids: usize) -> Option<usize> {
        let kept = ids.min(self.length);
        (self.index < kept).then(|| ids - kept + self.index)
    }
}

/// An embedding table the trainer looks keys up in.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSlot {
    /// The table's name.
    pub name: String,
    /// Floats per row.
    pub dim: usize,
    /// Name of the companion table of first-order weights, when the model has a wide part.
    pub wide: Option<String>,
    /// How its features' keys pool.
    pub pooling: TablePooling,
}

/// Which of a minibatch's label columns a head trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelColumn {
    /// The Dataset's label (`schema.label`).
    Label,
    /// One of its further label columns (`schema.targets`), by index.
    Target(usize),
}

/// A head of the dense network: what it predicts and from which column it learns.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadSlot {
    /// The head's name (`label` for the four kinds' one head).
    pub name: String,
    /// The column holding its label.
    pub column: LabelColumn,
    /// The column's name.
    pub column_name: String,
    /// What it minimises.
    pub loss: Loss,
}

/// A Job's model over its Dataset's schema: the features and tables the dense network sees.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelLayout {
    /// The dense network's kind.
    pub kind: ModelKind,
    /// Its layers and optimizer.
    pub dense_spec: DenseSpec,
    /// Dense features per sample, in schema order.
    pub dense_inputs: usize,
    /// The dense features, in column order.
    pub dense_names: Vec<String>,
    /// The Dataset's label column.
    pub label: String,
    /// The Dataset's further label columns, in its order.
    pub targets: Vec<String>,
    /// The dense network's heads, in the order its steps report them.
    pub heads: Vec<HeadSlot>,
    /// Tables the schema's sparse features read, in first-use order.
    pub tables: Vec<TableSlot>,
    /// Sparse features in schema order.
    pub features: Vec<FeatureSlot>,
    /// Width of a sample's embedding row (sum of the features' dims).
    pub embedding_width: usize,
    /// The share of negatives training saw (`schema.negative_sample_rate`): the served
    /// model's logit is shifted by its log.
    pub negative_sample_rate: Option<f64>,
    table_specs: Vec<TableSpec>,
    /// `kind: graph`: the graph's parameters (compiled and checked against the schema
    /// when the layout was made); empty for the other kinds.
    pub(crate) graph_params: Vec<ParamShape>,
}

impl ModelLayout {
    /// The layout of `model` over `schema`, or the feature that does not fit.
    pub fn new(model: &ModelSpec, schema: &FeatureSchema) -> Result<Self, ModelError> {
        let wide = match (model.kind, &model.dense.graph) {
            (ModelKind::Graph, Some(graph)) => {
                (graph.inputs.values()).any(|input| matches!(input, GraphInput::FirstOrder))
            }
            (ModelKind::Graph, None) => {
                return Err(ModelError::Spec {
                    field: "spec.model.dense.graph".into(),
                    message: "kind graph needs the graph of its blocks".into(),
                });
            }
            (kind, _) => {
                check_output_layer(model)?;
                matches!(kind, ModelKind::WideDeep | ModelKind::Deepfm)
            }
        };
        let mut tables: Vec<TableSlot> = Vec::new();
        let mut features = Vec::with_capacity(schema.sparse.len());
        let mut offset = 0;
        for feature in &schema.sparse {
            let spec = model
                .tables
                .iter()
                .find(|t| t.name == feature.table)
                .ok_or_else(|| ModelError::Mismatch {
                    feature: feature.name.clone(),
                    message: format!(
                        "reads table {:?}, which is not in spec.model.tables ({})",
                        feature.table,
                        names(&model.tables)
                    ),
                })?;
            let table = match tables.iter().position(|t| t.name == spec.name) {
                Some(index) => index,
                None => {
                    tables.push(TableSlot {
                        name: spec.name.clone(),
                        dim: spec.dim as usize,
                        wide: wide.then(|| format!("{}{WIDE_SUFFIX}", spec.name)),
                        pooling: spec.pooling,
                    });
                    tables.len() - 1
                }
            };
            let dim = spec.dim as usize;
            let positions = match feature.sequence {
                None => vec![None],
                Some(_) if model.kind != ModelKind::Graph => {
                    return Err(ModelError::Mismatch {
                        feature: feature.name.clone(),
                        message: "is a sequence, which only model.kind graph reads (a \
                                  sequence input and an attention block)"
                            .into(),
                    });
                }
                Some(sequence) => {
                    let length = sequence.max_length as usize;
                    (0..length)
                        .map(|index| Some(SequencePosition { index, length }))
                        .collect()
                }
            };
            for position in positions {
                features.push(FeatureSlot {
                    name: feature.name.clone(),
                    table,
                    dim,
                    offset,
                    position,
                });
                offset += dim;
            }
        }
        if features.is_empty() {
            return Err(ModelError::Spec {
                field: "schema.sparse".into(),
                message: "the model needs at least one sparse feature".into(),
            });
        }
        let mut layout = Self {
            kind: model.kind,
            dense_spec: model.dense.clone(),
            dense_inputs: schema.dense.len(),
            dense_names: schema.dense.iter().map(|d| d.name.clone()).collect(),
            label: schema.label.clone(),
            targets: schema.targets.clone(),
            heads: vec![HeadSlot {
                name: "label".into(),
                column: LabelColumn::Label,
                column_name: schema.label.clone(),
                loss: Loss::BinaryCrossEntropy,
            }],
            tables,
            features,
            embedding_width: offset,
            negative_sample_rate: schema.negative_sample_rate,
            table_specs: model.tables.clone(),
            graph_params: Vec::new(),
        };
        layout.check_dims()?;
        if let (ModelKind::Graph, Some(graph)) = (model.kind, &model.dense.graph) {
            let net = GraphNet::new(graph, &layout, GRAPH_PATH)?;
            layout.heads = layout.head_slots(&net)?;
            layout.graph_params = net.param_shapes().to_vec();
        }
        Ok(layout)
    }

    /// Each head of a graph and the label column it trains on: the Dataset's label or one
    /// of its targets.
    fn head_slots(&self, net: &GraphNet) -> Result<Vec<HeadSlot>, ModelError> {
        let slot = |(name, label, loss): (&str, &str, Loss)| {
            let column = match self.targets.iter().position(|t| t == label) {
                _ if label == self.label => LabelColumn::Label,
                Some(index) => LabelColumn::Target(index),
                None => {
                    return Err(ModelError::Spec {
                        field: format!("{GRAPH_PATH}.heads.{name}.label"),
                        message: format!(
                            "{label:?} is neither the Dataset's label column ({:?}) nor one of \
                             its schema.targets ({:?})",
                            self.label, self.targets
                        ),
                    });
                }
            };
            Ok(HeadSlot {
                name: name.to_owned(),
                column,
                column_name: label.to_owned(),
                loss,
            })
        };
        net.heads().into_iter().map(slot).collect()
    }

    /// DLRM and MTRM dot or concatenate embeddings with the bottom MLP's output; DeepFM's
    /// factorisation machine needs one dim for all features.
    fn check_dims(&self) -> Result<(), ModelError> {
        let first = &self.features[0];
        let needed = match self.kind {
            ModelKind::Dlrm => {
                if self.dense_inputs == 0 {
                    return Err(ModelError::Spec {
                        field: "schema.dense".into(),
                        message: "dlrm's bottom MLP needs at least one dense feature".into(),
                    });
                }
                let width = self.dense_spec.bottom.last().copied().unwrap_or(0) as usize;
                Some((width, "the width of dlrm's last bottom layer"))
            }
            ModelKind::Deepfm => Some((first.dim, "the dim of every other feature (deepfm)")),
            // A graph's blocks check the widths they read.
            ModelKind::WideDeep | ModelKind::Mtrm | ModelKind::Graph => None,
        };
        if let Some((width, what)) = needed
            && let Some(feature) = self.features.iter().find(|f| f.dim != width)
        {
            return Err(ModelError::Mismatch {
                feature: feature.name.clone(),
                message: format!(
                    "its table {:?} has dim {}, but it must equal {what}, {width}",
                    self.tables[feature.table].name, feature.dim
                ),
            });
        }
        Ok(())
    }

    /// Every table the PS shards must hold: the model's tables plus one-wide companions
    /// for first-order weights (zero-initialised, same optimizer, admission and TTL).
    pub fn ps_tables(&self) -> Vec<TableSpec> {
        let mut specs = self.table_specs.clone();
        for slot in &self.tables {
            let (Some(wide), Some(base)) = (
                &slot.wide,
                self.table_specs.iter().find(|t| t.name == slot.name),
            ) else {
                continue;
            };
            specs.push(TableSpec {
                name: wide.clone(),
                dim: 1,
                initializer: Initializer::Zeros,
                ..base.clone()
            });
        }
        specs
    }

    /// Whether the model has first-order (wide) weights.
    pub fn has_wide(&self) -> bool {
        self.tables.iter().any(|t| t.wide.is_some())
    }
}

fn names(tables: &[TableSpec]) -> String {
    if tables.is_empty() {
        return "none".into();
    }
    tables
        .iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn check_output_layer(model: &ModelSpec) -> Result<(), ModelError> {
    match model.dense.top.last() {
        Some(1) => Ok(()),
        last => Err(ModelError::Spec {
            field: "spec.model.dense.top".into(),
            message: format!(
                "the last layer is the logit and must have width 1, got {}",
                last.map_or("no layer".to_string(), |w| w.to_string())
            ),
        }),
    }
}
