//! Without a GPU: every kernel compiles to PTX (NVRTC must be installed: a kernel that does
//! not compile fails here, in CI), and the CPU references behave as pooling must.

mod common;

use common::random_case;
use primus_gpu::{
    Accumulation, CpuKernels, EmbeddingKernels, FeatureBags, GpuError, HostRows, KERNEL_NAMES,
    Pooling, PoolingInput, RowOptimizer, RowStore, TableShape, compile_ptx, update_row,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

#[test]
fn every_kernel_compiles_to_ptx_for_volta_ampere_and_hopper() {
    for arch in ["compute_70", "compute_80", "compute_90"] {
        let ptx = compile_ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        for name in KERNEL_NAMES {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{arch}: no entry for {name}"
            );
        }
    }
}

fn small() -> (Vec<TableShape>, Vec<Vec<f32>>) {
    // Table 0: 3 rows of dim 2; table 1: 2 rows of dim 1 with one float of state each.
    let tables = vec![
        TableShape::dense(3, 2),
        TableShape {
            rows: 2,
            dim: 1,
            stride: 2,
        },
    ];
    let weights = vec![
        vec![1.0, 2.0, 10.0, 20.0, 100.0, 200.0],
        vec![5.0, -1.0, 7.0, -1.0],
    ];
    (tables, weights)
}

#[test]
fn sum_and_mean_pooling_of_known_bags_including_an_empty_one_and_an_inverse() {
    let (tables, weights) = small();
    let weights: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
    let input = PoolingInput {
        samples: 2,
        features: vec![
            FeatureBags {
                table: 0,
                offsets: vec![0, 3, 3],
                rows: vec![0, 2, 2],
                inverse: None,
            },
            FeatureBags {
                table: 1,
                offsets: vec![0, 2],
                rows: vec![0, 1],
                inverse: Some(vec![0, 0]),
            },
        ],
    };
    let sum = CpuKernels
        .gather_pool(&tables, &weights, &input, Pooling::Sum)
        .expect("sum pooling");
    assert_eq!(sum, vec![201.0, 402.0, 12.0, 0.0, 0.0, 12.0]);
    let mean = CpuKernels
        .gather_pool(&tables, &weights, &input, Pooling::Mean)
        .expect("mean pooling");
    assert_eq!(mean, vec![67.0, 134.0, 6.0, 0.0, 0.0, 6.0]);
}

/// Pooling is linear, so its backward is its adjoint: <pool(W), G> = <W, backward(G)>.
#[test]
fn the_backward_is_the_adjoint_of_pooling_on_random_input() {
    let mut rng = StdRng::seed_from_u64(7);
    for (ikjt, pooling) in [(false, Pooling::Sum), (true, Pooling::Mean)] {
        // More samples than the CPU pools in one block, the last block partly full.
        let case = random_case(&mut rng, &[4, 3], 50, 200, 5, ikjt);
        // Weights without state (the backward's gradients have stride = dim).
        let tables: Vec<TableShape> = case
            .tables
            .iter()
            .map(|t| TableShape::dense(t.rows, t.dim))
            .collect();
        let weights: Vec<Vec<f32>> = tables
            .iter()
            .map(|t| common::random_floats(&mut rng, (t.rows * t.dim) as usize))
            .collect();
        let slices: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
        let pooled = CpuKernels
            .gather_pool(&tables, &slices, &case.input, pooling)
            .expect("pooling");
        let g = common::random_floats(&mut rng, pooled.len());
        let grads = CpuKernels
            .pool_backward(
                &tables,
                &case.input,
                pooling,
                &g,
                Accumulation::Deterministic,
            )
            .expect("backward");
        let lhs: f64 = pooled
            .iter()
            .zip(&g)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let rhs: f64 = weights
            .iter()
            .flatten()
            .zip(grads.iter().flatten())
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        assert!(
            (lhs - rhs).abs() <= 1e-4 * lhs.abs().max(1.0),
            "{lhs} vs {rhs}"
        );
    }
}

#[test]
fn adam_on_a_fresh_row_moves_each_weight_by_about_the_learning_rate() {
    let adam = RowOptimizer::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
    };
    let shape = TableShape {
        rows: 1,
        dim: 2,
        stride: 2 + 6,
    };
    let mut table = vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0];
    CpuKernels
        .update_rows(shape, adam, &mut table, &[0], &[3.0, -0.5])
        .expect("adam update");
    assert!(
        (table[0] - 0.99).abs() < 1e-6 && (table[1] - 1.01).abs() < 1e-6,
        "{table:?}"
    );
    assert_eq!(&table[6..], &[0.9, 0.999]);
}

fn invalid_field(result: Result<impl std::fmt::Debug, GpuError>) -> String {
    match result {
        Err(GpuError::Invalid { field, .. }) => field,
        other => panic!("expected an invalid-input error, got {other:?}"),
    }
}

#[test]
fn bad_input_is_refused_naming_the_field() {
    let (tables, weights) = small();
    let weights: Vec<&[f32]> = weights.iter().map(Vec::as_slice).collect();
    let feature = |rows: Vec<u32>, offsets: Vec<u32>, inverse| PoolingInput {
        samples: 1,
        features: vec![FeatureBags {
            table: 0,
            offsets,
            rows,
            inverse,
        }],
    };
    let pool =
        |input: &PoolingInput| CpuKernels.gather_pool(&tables, &weights, input, Pooling::Sum);
    assert_eq!(
        invalid_field(pool(&feature(vec![3], vec![0, 1], None))),
        "features[0].rows[0]"
    );
    assert_eq!(
        invalid_field(pool(&feature(vec![0], vec![0, 2], None))),
        "features[0].offsets"
    );
    assert_eq!(
        invalid_field(pool(&feature(vec![0], vec![0, 1], Some(vec![1])))),
        "features[0].inverse[0]"
    );
    assert_eq!(
        invalid_field(pool(&feature(vec![0, 0], vec![0, 1, 2], None))),
        "features[0].offsets"
    );
    let short = [&weights[0][..4], weights[1]];
    assert_eq!(
        invalid_field(CpuKernels.gather_pool(
            &tables,
            &short,
            &feature(vec![0], vec![0, 1], None),
            Pooling::Sum
        )),
        "weights[0]"
    );
    let adagrad = RowOptimizer::Adagrad {
        lr: 0.1,
        epsilon: 1e-8,
    };
    let shape = TableShape {
        rows: 2,
        dim: 1,
        stride: 2,
    };
    let mut table = vec![0.0; 4];
    assert_eq!(
        invalid_field(CpuKernels.update_rows(shape, adagrad, &mut table, &[1, 1], &[1.0, 1.0])),
        "ids[1]"
    );
    assert_eq!(
        invalid_field(CpuKernels.update_rows(shape, adagrad, &mut table, &[2], &[1.0])),
        "ids[0]"
    );
    assert_eq!(
        invalid_field(CpuKernels.update_rows(shape, adagrad, &mut table, &[0], &[])),
        "grads"
    );
    let no_room = TableShape {
        rows: 2,
        dim: 2,
        stride: 2,
    };
    assert_eq!(
        invalid_field(CpuKernels.update_rows(no_room, adagrad, &mut table, &[0], &[1.0, 1.0])),
        "table.stride"
    );
    assert_eq!(table, vec![0.0; 4], "refused updates change nothing");
}

#[test]
fn a_host_row_store_keeps_rows_through_growth_and_updates_them_like_update_row() {
    let optimizer = RowOptimizer::Adagrad {
        lr: 0.1,
        epsilon: 1e-8,
    };
    let mut store = HostRows::new(2, 4);
    store.resize(2).expect("resize");
    store
        .write(&[1, 0], &[1.0, 2.0, 0.5, 0.5, 3.0, 4.0, 0.25, 0.25])
        .expect("write");
    store.resize(5).expect("grow");
    assert_eq!(store.shape().rows, 5);
    assert_eq!(store.bytes(), 5 * 4 * 4);
    store
        .update(optimizer, &[0, 4], &[1.0, -1.0, 2.0, 2.0])
        .expect("update");
    let mut want = [3.0f32, 4.0, 0.25, 0.25];
    let (weights, state) = want.split_at_mut(2);
    update_row(optimizer, weights, state, &[1.0, -1.0]);
    assert_eq!(store.read(&[0], 4).expect("read"), want);
    // Repeats are allowed in reads; new rows start at zero before their first write.
    assert_eq!(
        store.read(&[1, 1, 2], 2).expect("read"),
        [1.0, 2.0, 1.0, 2.0, 0.0, 0.0]
    );
}

#[test]
fn a_host_row_store_refuses_bad_ids_and_widths_naming_the_field() {
    let optimizer = RowOptimizer::Adagrad {
        lr: 0.1,
        epsilon: 1e-8,
    };
    let mut store = HostRows::new(2, 4);
    store.resize(3).expect("resize");
    assert_eq!(invalid_field(store.read(&[0, 3], 2)), "ids[1]");
    assert_eq!(invalid_field(store.read(&[0], 5)), "floats");
    assert_eq!(invalid_field(store.write(&[1, 1], &[0.0; 8])), "ids[1]");
    assert_eq!(invalid_field(store.write(&[1], &[0.0; 2])), "values");
    assert_eq!(
        invalid_field(store.update(optimizer, &[2, 2], &[0.0; 4])),
        "ids[1]"
    );
    assert_eq!(
        invalid_field(store.update(optimizer, &[2], &[0.0; 3])),
        "grads"
    );
}

/// The deterministic backward's plan, by a stable sort of every entry by its row: what
/// the counting sort must give.
fn contributions_by_sorting(input: &PoolingInput) -> Vec<(u32, u32, u32)> {
    let mut entries = Vec::new();
    for (f, feature) in input.features.iter().enumerate() {
        for b in 0..input.samples {
            let item = (f * input.samples + b) as u32;
            for &row in feature.bag(feature.bag_of(b)) {
                entries.push((feature.table as u32, row, item));
            }
        }
    }
    entries.sort_by_key(|&(table, row, _)| (table, row));
    entries
}

#[test]
fn the_backward_plan_groups_every_entry_by_row_in_the_references_order() {
    let mut rng = StdRng::seed_from_u64(11);
    for (samples, ikjt) in [(1, false), (37, false), (64, true), (0, false)] {
        let case = random_case(&mut rng, &[4, 3, 8], 50, samples, 5, ikjt);
        let plan = case.input.contributions_by_row(&case.tables);
        let sorted = contributions_by_sorting(&case.input);
        let mut flat = Vec::new();
        for r in 0..plan.row_id.len() {
            let (start, end) = (
                plan.row_offsets[r] as usize,
                plan.row_offsets[r + 1] as usize,
            );
            assert!(start < end, "row {r} has no contribution");
            let first = plan.contrib_item[start];
            assert_eq!(
                plan.row_feature[r],
                first / samples as u32,
                "row {r}'s feature"
            );
            for &item in &plan.contrib_item[start..end] {
                flat.push((plan.row_table[r], plan.row_id[r], item));
            }
        }
        assert_eq!(flat, sorted, "{samples} samples, ikjt {ikjt}");
        assert_eq!(plan.row_offsets.len(), plan.row_id.len() + 1);
    }
}
