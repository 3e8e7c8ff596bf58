//! What a dense network takes: a minibatch's inputs, and which tower trains on them.

/// Which tower a minibatch trains (MTRM, Primus Alg. 1); other models ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tower {
    /// Batch data: the memory tower.
    Memory,
    /// Stream data: the adapt tower, reading the memory tower without training it.
    Adapt,
}

/// One minibatch's model inputs, row-major.
pub struct Inputs<'a> {
    /// Samples.
    pub rows: usize,
    /// `rows x layout.dense_inputs`.
    pub dense: &'a [f32],
    /// `rows x layout.embedding_width`: each feature's pooled embedding.
    pub embedded: &'a [f32],
    /// `rows x features`: each feature's pooled first-order weight (wide models only).
    pub wide: &'a [f32],
}
