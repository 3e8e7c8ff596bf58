//! Pooling and its scatter, alone and inside a whole training step.

use primus_batch::{DenseMatrix, Minibatch};
use primus_model::{LookedUp, SparseGrads};

use super::*;

#[test]
fn pooling_sums_rows_and_scatter_adds_back_to_unique_keys() {
    let layout = small(ModelKind::Dlrm);
    let mut a = JaggedFeature::new("a");
    a.push_row(&[10, 11]);
    a.push_row(&[10]);
    let mut b = JaggedFeature::new("b");
    b.push_row(&[]);
    b.push_row(&[11, 11]);
    let kjt = Kjt {
        rows: 2,
        features: vec![a, b],
    };
    let keys = BatchKeys::collect(&layout, &kjt).expect("keys");
    assert_eq!(keys.tables, vec![vec![10, 11]]);
    let rows = vec![vec![1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]];
    let pooled = keys.pool(&CpuKernels, &layout, &rows).expect("pooling");
    assert_eq!(
        pooled,
        [[3.0; 4], [0.0; 4], [1.0; 4], [4.0; 4]].concat(),
        "row 0: a=10+11, b empty; row 1: a=10, b=11+11"
    );
    let grad: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let scattered = keys.scatter(&CpuKernels, &layout, &grad).expect("backward");
    // Key 10: row 0 feature a (0..4) + row 1 feature a (8..12).
    // Key 11: row 0 feature a (0..4) + twice row 1 feature b (12..16).
    assert_eq!(
        scattered[0],
        vec![8.0, 10.0, 12.0, 14.0, 24.0, 27.0, 30.0, 33.0]
    );
    let missing = Kjt {
        rows: 2,
        features: vec![kjt.features[0].clone()],
    };
    assert!(matches!(
        BatchKeys::collect(&layout, &missing),
        Err(ModelError::Mismatch { feature, .. }) if feature == "b"
    ));
}

/// A minibatch whose rows repeat a user's features (RecD), as an IKJT, pooled once per
/// unique row of the group: the same unique keys, access counts and pooled rows (bit for
/// bit) as its KJT, and the same gradients within float rounding (summed per unique row
/// first).
#[test]
fn a_grouped_minibatch_pools_and_scatters_as_its_jagged_one() {
    let spec = model(ModelKind::Dlrm, vec![table("t", 4)], &[6, 4], &[8, 1]);
    let layout = ModelLayout::new(
        &spec,
        &schema(3, &[("user", "t"), ("history", "t"), ("item", "t")]),
    )
    .expect("layout");
    let keys = noise(5, 400);
    let key = |i: usize| (keys[i].abs() * 50.0) as u64;
    let (mut user, mut history, mut item) = (
        JaggedFeature::new("user"),
        JaggedFeature::new("history"),
        JaggedFeature::new("item"),
    );
    let samples = 40;
    for sample in 0..samples {
        // Sessions of 4 samples share the user's features.
        let session = sample / 4;
        user.push_row(&[1000 + session as u64]);
        let len = session % 3;
        history.push_row(&(0..len).map(|j| key(session * 3 + j)).collect::<Vec<_>>());
        item.push_row(&[key(200 + sample)]);
    }
    let kjt = Kjt {
        rows: samples,
        features: vec![user, history, item],
    };
    let ikjt = Ikjt::from_kjt(&kjt, &[("user".to_owned(), vec![0, 1])]).expect("ikjt");
    assert_eq!(ikjt.groups[0].unique_rows(), 10);
    let jagged = BatchKeys::collect(&layout, &kjt).expect("keys");
    let grouped = BatchKeys::of(&layout, &Sparse::Grouped(ikjt)).expect("keys");
    assert_eq!(grouped.tables, jagged.tables);
    assert_eq!(grouped.access_counts(), jagged.access_counts());
    let rows: Vec<Vec<f32>> = (jagged.tables.iter().enumerate())
        .map(|(t, keys)| noise(t as u64 + 9, keys.len() * 4))
        .collect();
    let pooled = jagged.pool(&CpuKernels, &layout, &rows).expect("pool");
    assert_eq!(
        grouped.pool(&CpuKernels, &layout, &rows).expect("pool"),
        pooled
    );
    let wide: Vec<Vec<f32>> = (jagged.tables.iter().enumerate())
        .map(|(t, keys)| noise(t as u64 + 19, keys.len()))
        .collect();
    let pooled_wide = jagged.pool_wide(&CpuKernels, &wide).expect("pool");
    assert_eq!(
        grouped.pool_wide(&CpuKernels, &wide).expect("pool"),
        pooled_wide
    );
    let close = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        a.len() == b.len()
            && (a.iter().flatten().zip(b.iter().flatten()))
                .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
    };
    let grad = noise(11, pooled.len());
    let (by_group, by_sample) = (
        grouped
            .scatter(&CpuKernels, &layout, &grad)
            .expect("scatter"),
        jagged
            .scatter(&CpuKernels, &layout, &grad)
            .expect("scatter"),
    );
    assert!(close(&by_group, &by_sample), "{by_group:?}\n{by_sample:?}");
    let grad = noise(13, pooled_wide.len());
    let (by_group, by_sample) = (
        grouped.scatter_wide(&CpuKernels, &grad).expect("scatter"),
        jagged.scatter_wide(&CpuKernels, &grad).expect("scatter"),
    );
    assert!(close(&by_group, &by_sample), "{by_group:?}\n{by_sample:?}");
    assert!(
        grouped.scatter(&CpuKernels, &layout, &grad).is_err(),
        "a gradient of the wrong width"
    );
}

/// A minibatch of `rows` samples of the small layout, its keys, and rows looked up for them.
fn looked_up_batch(
    layout: &ModelLayout,
    rows: usize,
) -> (Minibatch, BatchKeys, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut kjt = Kjt {
        rows,
        features: vec![JaggedFeature::new("a"), JaggedFeature::new("b")],
    };
    for r in 0..rows as u64 {
        kjt.features[0].push_row(&[r % 3]);
        kjt.features[1].push_row(&[100 + r % 5, 7]);
    }
    let keys = BatchKeys::collect(layout, &kjt).expect("keys");
    let batch = Minibatch {
        labels: (0..rows).map(|i| (i % 2) as f32).collect(),
        targets: Vec::new(),
        dense: DenseMatrix {
            names: layout.dense_names.clone(),
            values: noise(4, rows * layout.dense_names.len()),
        },
        sparse: Sparse::Jagged(kjt),
    };
    let table_rows = (keys.tables.iter())
        .map(|t| noise(5 + t.len() as u64, t.len() * 4))
        .collect();
    let wide = keys.tables.iter().map(|t| noise(6, t.len())).collect();
    (batch, keys, table_rows, wide)
}

#[test]
fn one_call_trains_a_minibatch_as_pooling_the_network_and_the_scatter_do() {
    for kind in EVERY_KIND {
        let layout = small(kind);
        let model = Model::new(layout.clone()).expect("a model of the layout");
        let params = ParamSet::init(&layout, 11);
        let rows = 8;
        let (batch, keys, table_rows, wide) = looked_up_batch(&layout, rows);

        let embedded = keys.pool(&CpuKernels, &layout, &table_rows).expect("pool");
        let pooled_wide = match layout.has_wide() {
            true => keys.pool_wide(&CpuKernels, &wide).expect("wide pool"),
            false => Vec::new(),
        };
        let inputs = Inputs {
            rows,
            dense: &batch.dense.values,
            embedded: &embedded,
            wide: &pooled_wide,
        };
        let parts = (model.train_step(&params, &inputs, &[&batch.labels], Tower::Memory))
            .expect("step in parts");
        let scattered = SparseGrads {
            grads: (keys.scatter(&CpuKernels, &layout, &parts.embedded_grad)).expect("scatter"),
            wide_grads: match layout.has_wide() {
                true => (keys.scatter_wide(&CpuKernels, &parts.wide_grad)).expect("wide scatter"),
                false => Vec::new(),
            },
        };

        let mut handed_out = None;
        let looked_up = LookedUp {
            keys: &keys,
            rows: &table_rows,
            wide: &wide,
        };
        let whole = model
            .train_minibatch(
                &params,
                &CpuKernels,
                &batch,
                looked_up,
                Tower::Memory,
                |g| handed_out = Some(g),
            )
            .expect("step in one call");
        assert_eq!(whole.loss, parts.loss, "{kind:?}");
        assert_eq!(whole.probabilities(), parts.probabilities(), "{kind:?}");
        assert_eq!(whole.dense_grads, parts.dense_grads, "{kind:?}");
        let sparse = handed_out.expect("the sparse gradients handed out");
        assert_eq!(sparse, Ok(scattered), "{kind:?}");

        // Rows of the wrong width fail the step, naming them, before the network runs.
        let short: Vec<Vec<f32>> = table_rows.iter().map(|r| r[1..].to_vec()).collect();
        let looked_up = LookedUp {
            rows: &short,
            ..looked_up
        };
        let mut called = false;
        let refused = model.train_minibatch(
            &params,
            &CpuKernels,
            &batch,
            looked_up,
            Tower::Memory,
            |_| called = true,
        );
        assert!(
            matches!(&refused, Err(ModelError::Inputs(m)) if m.starts_with("embedding rows")),
            "{kind:?}: {:?}",
            refused.err()
        );
        assert!(!called, "no gradients from a step that did not run");
    }
}

#[test]
fn a_model_on_a_gpu_trains_a_looked_up_minibatch_like_the_cpu_or_says_why_it_cannot() {
    let layouts = [
        ("DLRM", small(ModelKind::Dlrm)),
        ("DeepFM", small(ModelKind::Deepfm)),
        ("Wide&Deep", small(ModelKind::WideDeep)),
        ("DLRM, mean pooling", mean_pooled(false)),
    ];
    for (kind, layout) in layouts {
        let gpu = match Model::on(layout.clone(), DenseDevice::Cuda(0)) {
            Ok(gpu) => gpu,
            Err(refusal) => {
                assert!(matches!(refusal, ModelError::Device { .. }), "{refusal}");
                println!("SKIPPED a looked-up minibatch on the GPU: {refusal}");
                return;
            }
        };
        let cpu = Model::new(layout.clone()).expect("a model of the layout");
        let params = ParamSet::init(&layout, 13);
        for rows in [8, 300] {
            let (batch, keys, table_rows, wide) = looked_up_batch(&layout, rows);
            let looked_up = LookedUp {
                keys: &keys,
                rows: &table_rows,
                wide: &wide,
            };
            let step = |model: &Model| {
                let mut handed_out = None;
                let output = (model.train_minibatch(
                    &params,
                    &CpuKernels,
                    &batch,
                    looked_up,
                    Tower::Memory,
                    |g| handed_out = Some(g),
                ))
                .expect("a step");
                let sparse = handed_out.expect("sparse gradients").expect("scattered");
                (output, sparse)
            };
            let ((want, want_sparse), (got, got_sparse)) = (step(&cpu), step(&gpu));
            let what = format!("{kind}, {rows} rows");
            // cuBLAS orders its sums as it likes: the dense launches' tolerance.
            let mut pairs = vec![("probabilities", got.probabilities(), want.probabilities())];
            for (g, w) in got.dense_grads.iter().zip(&want.dense_grads) {
                pairs.push((g.name.as_str(), &g.values[..], &w.values[..]));
            }
            let sparse = (got_sparse.grads.iter().zip(&want_sparse.grads))
                .chain(got_sparse.wide_grads.iter().zip(&want_sparse.wide_grads));
            for (g, w) in sparse {
                pairs.push(("a table's gradient rows", &g[..], &w[..]));
            }
            for (name, g, w) in pairs {
                let d = relative_difference(g, w);
                assert!(d < 1e-4, "{what}: {name} differs by {d:.2e}");
            }
            assert_eq!(got.dense_grads.len(), want.dense_grads.len(), "{what}");
            assert_eq!(got_sparse.wide_grads.len(), want_sparse.wide_grads.len());
            assert!(
                (got.loss - want.loss).abs() < 1e-4 * want.loss.abs(),
                "{what}: loss"
            );
            assert!(
                got.embedded_grad.is_empty(),
                "{what}: the pooled gradients stayed"
            );
            assert!(!got.times.dense.is_zero() && !got.times.scatter.is_zero());

            let short: Vec<Vec<f32>> = table_rows.iter().map(|r| r[1..].to_vec()).collect();
            let looked_up = LookedUp {
                rows: &short,
                ..looked_up
            };
            let refused = gpu.train_minibatch(
                &params,
                &CpuKernels,
                &batch,
                looked_up,
                Tower::Memory,
                |_| panic!("no gradients from a step that did not run"),
            );
            assert!(
                matches!(&refused, Err(ModelError::Inputs(m)) if m.starts_with("embedding rows")),
                "{what}: {:?}",
                refused.err()
            );
        }
    }
    println!("ok      a looked-up minibatch on the GPU: pooling, graph and scatter as on the CPU");
}

/// DLRM over a mean-pooled table `t` (features `a`, one key, and `b`, two) and, with
/// `with_sum`, a sum-pooled table `u` (feature `c`, three keys).
fn mean_pooled(with_sum: bool) -> ModelLayout {
    let mean = TableSpec {
        pooling: TablePooling::Mean,
        ..table("t", 4)
    };
    let (tables, features) = match with_sum {
        true => (
            vec![mean, table("u", 4)],
            vec![("a", "t"), ("b", "t"), ("c", "u")],
        ),
        false => (vec![mean], vec![("a", "t"), ("b", "t")]),
    };
    let spec = model(ModelKind::Dlrm, tables, &[6, 4], &[8, 1]);
    ModelLayout::new(&spec, &schema(3, &features)).expect("layout")
}

/// Each sample's keys per feature of [`mean_pooled`], and the minibatch's keys.
fn mean_pooled_keys(layout: &ModelLayout, rows: usize) -> (Kjt, BatchKeys) {
    let mut kjt = Kjt {
        rows,
        features: (layout.features.iter())
            .map(|f| JaggedFeature::new(&f.name))
            .collect(),
    };
    for r in 0..rows as u64 {
        kjt.features[0].push_row(&[r % 3]);
        kjt.features[1].push_row(&[100 + r % 5, 7]);
        if let Some(c) = kjt.features.get_mut(2) {
            c.push_row(&[200, 201 + r % 2, 203]);
        }
    }
    let keys = BatchKeys::collect(layout, &kjt).expect("keys");
    (kjt, keys)
}

#[test]
fn a_mean_pooled_table_averages_each_features_keys_and_shares_their_gradient() {
    for with_sum in [false, true] {
        let layout = mean_pooled(with_sum);
        let rows = 7;
        let (kjt, keys) = mean_pooled_keys(&layout, rows);
        let table_rows: Vec<Vec<f32>> = (keys.tables.iter().enumerate())
            .map(|(t, k)| noise(30 + t as u64, k.len() * 4))
            .collect();
        let width = layout.embedding_width;
        let pooled = keys.pool(&CpuKernels, &layout, &table_rows).expect("pool");
        let grad = noise(40, rows * width);
        let scattered = keys.scatter(&CpuKernels, &layout, &grad).expect("scatter");
        let mut want_grads: Vec<Vec<f32>> = table_rows.iter().map(|r| vec![0.0; r.len()]).collect();
        for (f, feature) in layout.features.iter().enumerate() {
            let (t, offset) = (feature.table, feature.offset);
            let scale = match layout.tables[t].pooling {
                TablePooling::Mean => 1.0 / (kjt.features[f].row(0).len() as f32),
                TablePooling::Sum => 1.0,
            };
            for r in 0..rows {
                let bag = kjt.features[f].row(r);
                for c in 0..4 {
                    let mut sum = 0.0f32;
                    for key in bag {
                        let at = keys.tables[t].iter().position(|k| k == key).expect("key");
                        sum += table_rows[t][at * 4 + c];
                        want_grads[t][at * 4 + c] += grad[r * width + offset + c] * scale;
                    }
                    let got = pooled[r * width + offset + c];
                    let want = sum * scale;
                    assert!(
                        (got - want).abs() < 1e-6,
                        "{}: sample {r}, {got} vs {want}",
                        feature.name
                    );
                }
            }
        }
        for (t, (got, want)) in scattered.iter().zip(&want_grads).enumerate() {
            let close = got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-5);
            assert!(
                close,
                "table {t} (with a sum table: {with_sum}): {got:?}\n{want:?}"
            );
        }
    }
}
