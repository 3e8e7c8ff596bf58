//! Random kernel inputs shared by the tests and the benchmark: repeated ids, empty bags,
//! ids at the end of large tables, tables read by two features, inverse (IKJT) bags.
#![allow(dead_code)]

use primus_gpu::{FeatureBags, PoolingInput, RowOptimizer, TableShape};
use rand::Rng;
use rand::rngs::StdRng;

pub(crate) struct Case {
    pub tables: Vec<TableShape>,
    pub weights: Vec<Vec<f32>>,
    pub input: PoolingInput,
}

impl Case {
    pub(crate) fn weight_slices(&self) -> Vec<&[f32]> {
        self.weights.iter().map(Vec::as_slice).collect()
    }
}

pub(crate) fn random_floats(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Tables of `dims` (odd tables carry as many floats of state after the weights), one
/// feature per table plus one more reading table 0; with `ikjt`, every other feature's
/// samples share deduplicated bags.
pub(crate) fn random_case(
    rng: &mut StdRng,
    dims: &[u32],
    rows: u32,
    samples: usize,
    max_bag: usize,
    ikjt: bool,
) -> Case {
    let tables: Vec<TableShape> = dims
        .iter()
        .enumerate()
        .map(|(t, &dim)| TableShape {
            rows,
            dim,
            stride: if t % 2 == 1 { 2 * dim } else { dim },
        })
        .collect();
    let weights = tables
        .iter()
        .map(|t| random_floats(rng, t.rows as usize * t.stride as usize))
        .collect();
    let mut features = Vec::new();
    for table in (0..tables.len()).chain([0]) {
        let with_inverse = ikjt && features.len() % 2 == 1;
        let bags = if with_inverse {
            samples / 3 + 1
        } else {
            samples
        };
        let hot: Vec<u32> = (0..4).map(|_| rng.random_range(0..rows)).collect();
        let mut offsets = vec![0u32];
        let mut ids = Vec::new();
        for _ in 0..bags {
            for _ in 0..rng.random_range(0..=max_bag) {
                let id = match rng.random_range(0..4) {
                    0 => hot[rng.random_range(0..hot.len())],
                    1 => rows - 1 - rng.random_range(0..rows.min(3)),
                    _ => rng.random_range(0..rows),
                };
                ids.push(id);
            }
            offsets.push(ids.len() as u32);
        }
        let inverse = with_inverse.then(|| {
            (0..samples)
                .map(|_| rng.random_range(0..bags as u32))
                .collect()
        });
        features.push(FeatureBags {
            table,
            offsets,
            rows: ids,
            inverse,
        });
    }
    Case {
        tables,
        weights,
        input: PoolingInput { samples, features },
    }
}

/// A table whose rows hold weights and `optimizer`'s state (valid starting state).
pub(crate) fn random_optimizer_table(
    rng: &mut StdRng,
    rows: u32,
    dim: u32,
    optimizer: RowOptimizer,
) -> (TableShape, Vec<f32>) {
    let stride = dim + optimizer.state_len(dim);
    let shape = TableShape { rows, dim, stride };
    let mut table = Vec::with_capacity(shape.rows as usize * stride as usize);
    for _ in 0..rows {
        table.extend(random_floats(rng, dim as usize));
        match optimizer {
            RowOptimizer::Adagrad { .. } => {
                table.extend((0..dim).map(|_| rng.random_range(0.0f32..1.0)));
            }
            RowOptimizer::Adam { beta1, beta2, .. } => {
                table.extend(random_floats(rng, dim as usize));
                table.extend((0..dim).map(|_| rng.random_range(0.0f32..1.0)));
                let steps = rng.random_range(0..5);
                table.extend([beta1.powi(steps), beta2.powi(steps)]);
            }
        }
    }
    (shape, table)
}

/// `n` distinct rows of `rows`, always including the last one.
pub(crate) fn distinct_ids(rng: &mut StdRng, rows: u32, n: usize) -> Vec<u32> {
    let mut ids = rand::seq::index::sample(rng, rows as usize, n.min(rows as usize))
        .into_iter()
        .map(|i| i as u32)
        .collect::<Vec<_>>();
    if !ids.contains(&(rows - 1)) && !ids.is_empty() {
        ids[0] = rows - 1;
    }
    ids
}
