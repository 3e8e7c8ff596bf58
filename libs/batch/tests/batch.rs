//! Minibatch format: IKJT round trips (RecD grouping), the Arrow IPC encoding, and the
//! feature pipeline's transforms and errors.

use std::sync::Arc;

use arrow_array::builder::{ListBuilder, UInt64Builder};
use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use primus_batch::{
    BatchError, DenseMatrix, FeaturePipeline, Ikjt, JaggedFeature, Kjt, Minibatch, Sparse, Target,
    hash, ipc,
};
use primus_spec::dataset::{DenseFeature, DenseTransform, FeatureSchema, SparseFeature};
use proptest::prelude::*;

/// Rows of `features` features, lists of 0-3 keys from a tiny alphabet so duplicates (also
/// non-adjacent ones) are common.
fn kjt_strategy() -> impl Strategy<Value = Kjt> {
    (0usize..40, 1usize..5).prop_flat_map(|(rows, features)| {
        proptest::collection::vec(
            proptest::collection::vec(proptest::collection::vec(0u64..3, 0..3), rows),
            features,
        )
        .prop_map(move |columns| Kjt {
            rows,
            features: columns
                .into_iter()
                .enumerate()
                .map(|(i, column)| {
                    let mut feature = JaggedFeature::new(format!("f{i}"));
                    for row in column {
                        feature.push_row(&row);
                    }
                    feature
                })
                .collect(),
        })
    })
}

/// A random partition of some features into groups (others stay jagged).
fn groups_for(features: usize, assignment: &[u8]) -> Vec<(String, Vec<usize>)> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for f in 0..features {
        let g = assignment[f % assignment.len()] % 3;
        if g == 0 {
            continue;
        }
        let name = format!("g{g}");
        match groups.iter_mut().find(|(n, _)| *n == name) {
            Some((_, members)) => members.push(f),
            None => groups.push((name, vec![f])),
        }
    }
    groups
}

fn batch_of(kjt: Kjt) -> Minibatch {
    let rows = kjt.rows;
    Minibatch {
        labels: (0..rows).map(|r| (r % 2) as f32).collect(),
        targets: vec![Target {
            name: "watch_time".into(),
            values: (0..rows).map(|r| r as f32 * 1.5).collect(),
        }],
        dense: DenseMatrix {
            names: vec!["x".into(), "y".into()],
            values: (0..rows * 2).map(|v| v as f32 * 0.5).collect(),
        },
        sparse: Sparse::Jagged(kjt),
    }
}

fn colliding(_: &[&[u64]]) -> u64 {
    7
}

proptest! {
    #[test]
    fn ikjt_round_trips(kjt in kjt_strategy(), assignment in proptest::collection::vec(any::<u8>(), 1..6)) {
        let groups = groups_for(kjt.features.len(), &assignment);
        for hasher in [primus_batch::row_hash as primus_batch::RowHasher, colliding] {
            let ikjt = Ikjt::from_kjt_with_hasher(&kjt, &groups, hasher).expect("test step");
            prop_assert_eq!(&ikjt.to_kjt().expect("test step"), &kjt);
            for group in &ikjt.groups {
                // Unique rows are pairwise different in at least one feature.
                for a in 0..group.unique_rows() {
                    for b in 0..a {
                        prop_assert!(group.features.iter().any(|f| f.row(a) != f.row(b)));
                    }
                }
            }
            let batch = Minibatch { sparse: Sparse::Grouped(ikjt), ..batch_of(kjt.clone()) };
            let decoded = ipc::decode(&ipc::encode(&batch).expect("test step")).expect("test step");
            prop_assert_eq!(&decoded, &batch);
            prop_assert_eq!(decoded.to_kjt().expect("test step"), kjt.clone());
        }
        let jagged = batch_of(kjt.clone());
        prop_assert_eq!(ipc::decode(&ipc::encode(&jagged).expect("test step")).expect("test step"), jagged);
    }

    #[test]
    fn slices_concatenate_back(kjt in kjt_strategy(), cut in 0usize..40) {
        let batch = batch_of(kjt);
        let cut = cut.min(batch.rows());
        let parts = [batch.slice(0..cut).expect("test step"), batch.slice(cut..batch.rows()).expect("test step")];
        prop_assert_eq!(Minibatch::concat(&parts).expect("test step"), batch);
    }
}

fn feature(name: &str, rows: &[&[u64]]) -> JaggedFeature {
    let mut f = JaggedFeature::new(name);
    for row in rows {
        f.push_row(row);
    }
    f
}

#[test]
fn rows_merge_only_when_every_group_feature_matches() {
    // Row 2 matches row 0 in `a` only, row 3 matches row 0 in `b` only, row 4 matches row 0
    // in both (non-adjacent), row 5 splits row 0's keys differently across the features.
    let kjt = Kjt {
        rows: 6,
        features: vec![
            feature("a", &[&[1, 2], &[9], &[1, 2], &[5], &[1, 2], &[1]]),
            feature("b", &[&[3], &[9], &[4], &[3], &[3], &[2, 3]]),
        ],
    };
    let groups = vec![("user".to_owned(), vec![0, 1])];
    for hasher in [primus_batch::row_hash as primus_batch::RowHasher, colliding] {
        let ikjt = Ikjt::from_kjt_with_hasher(&kjt, &groups, hasher).expect("test step");
        let group = &ikjt.groups[0];
        assert_eq!(group.inverse, vec![0, 1, 2, 3, 0, 4]);
        assert_eq!(group.unique_rows(), 5);
        assert_eq!(ikjt.to_kjt().expect("test step"), kjt);
    }
}

#[test]
fn bad_groups_are_refused() {
    let kjt = Kjt {
        rows: 1,
        features: vec![feature("a", &[&[1]])],
    };
    let twice = vec![("g".to_owned(), vec![0]), ("h".to_owned(), vec![0])];
    assert!(
        matches!(Ikjt::from_kjt(&kjt, &twice), Err(BatchError::Groups(m)) if m.contains("two groups"))
    );
    let past = vec![("g".to_owned(), vec![3])];
    assert!(Ikjt::from_kjt(&kjt, &past).is_err());
}

#[test]
fn garbage_bytes_are_an_error_not_a_panic() {
    assert!(ipc::decode(b"not arrow").is_err());
    assert!(ipc::decode(&[]).is_err());
}

fn schema() -> FeatureSchema {
    FeatureSchema {
        label: "label".into(),
        negative_sample_rate: None,
        targets: Vec::new(),
        dense: vec![
            DenseFeature {
                name: "count".into(),
                transform: DenseTransform::Log1p,
                missing: 0.0,
            },
            DenseFeature {
                name: "age".into(),
                transform: DenseTransform::Standardize {
                    mean: 40.0,
                    std: 10.0,
                },
                missing: 40.0,
            },
            DenseFeature {
                name: "hours".into(),
                transform: DenseTransform::Clip {
                    min: 0.0,
                    max: 60.0,
                },
                missing: 0.0,
            },
        ],
        sparse: vec![
            SparseFeature {
                name: "user".into(),
                table: "users".into(),
                multi_hot: false,
                dedup_group: Some("session".into()),
                sequence: None,
                same_ids_as: None,
            },
            SparseFeature {
                name: "history".into(),
                table: "items".into(),
                multi_hot: true,
                dedup_group: Some("session".into()),
                sequence: None,
                same_ids_as: None,
            },
            SparseFeature {
                name: "item".into(),
                table: "items".into(),
                multi_hot: false,
                dedup_group: None,
                sequence: None,
                same_ids_as: None,
            },
        ],
    }
}

fn rows() -> RecordBatch {
    let mut history = ListBuilder::new(UInt64Builder::new());
    history.values().append_slice(&[10, 11]);
    history.append(true);
    history.append(false);
    history.values().append_slice(&[12]);
    history.append(true);
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("label", Arc::new(Int64Array::from(vec![1, 0, 1]))),
        (
            "count",
            Arc::new(Float64Array::from(vec![Some(0.0), None, Some(-3.0)])),
        ),
        (
            "age",
            Arc::new(Int64Array::from(vec![Some(50), None, Some(20)])),
        ),
        (
            "hours",
            Arc::new(Float64Array::from(vec![80.0, 30.0, -1.0])),
        ),
        (
            "user",
            Arc::new(StringArray::from(vec![Some("u1"), Some("u1"), None])),
        ),
        ("history", Arc::new(history.finish())),
        ("item", Arc::new(Int64Array::from(vec![-5, 7, 7]))),
        ("unused", Arc::new(Int64Array::from(vec![0, 0, 0]))),
    ];
    RecordBatch::try_from_iter(columns).expect("test step")
}

#[test]
fn pipeline_transforms_rows() {
    let pipeline = FeaturePipeline::new(&schema());
    assert_eq!(
        pipeline.columns(),
        ["label", "count", "age", "hours", "user", "history", "item"]
    );
    let batch = pipeline.minibatch(&rows()).expect("test step");
    assert_eq!(batch.labels, vec![1.0, 0.0, 1.0]);
    let expected_dense = [0.0, 1.0, 60.0, 0.0, 0.0, 30.0, 0.0, -2.0, 0.0];
    assert_eq!(batch.dense.values, expected_dense);
    let kjt = batch.to_kjt().expect("test step");
    let seed = |name| hash::feature_seed(name);
    let user = kjt.feature("user").expect("test step");
    assert_eq!(user.row(0), [hash::str_key(seed("user"), "u1")]);
    assert_eq!(user.row(1), user.row(0));
    assert!(user.row(2).is_empty(), "a null id is an empty row");
    let history = kjt.feature("history").expect("test step");
    assert_eq!(
        history.row(0),
        [
            hash::int_key(seed("history"), 10),
            hash::int_key(seed("history"), 11)
        ]
    );
    assert!(history.row(1).is_empty(), "a null list is an empty row");
    let item = kjt.feature("item").expect("test step");
    assert_eq!(item.row(0), [hash::int_key(seed("item"), -5i64 as u64)]);
    assert_ne!(
        item.row(1),
        history.row(2),
        "same id, other feature, other key"
    );

    let grouped = batch.grouped(pipeline.groups()).expect("test step");
    let Sparse::Grouped(ikjt) = &grouped.sparse else {
        panic!("grouped batch is not grouped");
    };
    assert_eq!(ikjt.groups.len(), 1);
    assert_eq!(ikjt.groups[0].unique_rows(), 3, "rows differ in `history`");
    assert_eq!(grouped.to_kjt().expect("test step"), kjt);
}

#[test]
fn targets_are_read_beside_the_label_and_a_bad_one_is_named() {
    let schema = FeatureSchema {
        targets: vec!["watch".into(), "bought".into()],
        ..schema()
    };
    let pipeline = FeaturePipeline::new(&schema);
    assert_eq!(pipeline.columns()[..3], ["label", "watch", "bought"]);
    let with = |watch: ArrayRef| {
        let bought: ArrayRef = Arc::new(Int64Array::from(vec![0, 0, 1]));
        let mut columns: Vec<(String, ArrayRef)> = (rows().schema().fields().iter())
            .map(|f| f.name().clone())
            .zip(rows().columns().iter().cloned())
            .collect();
        columns.push(("watch".into(), watch));
        columns.push(("bought".into(), bought));
        RecordBatch::try_from_iter(columns).expect("test step")
    };
    let batch = (pipeline.minibatch(&with(Arc::new(Float64Array::from(vec![2.5, 0.0, 40.0])))))
        .expect("test step");
    let targets: Vec<(&str, &[f32])> = (batch.targets.iter())
        .map(|t| (t.name.as_str(), &t.values[..]))
        .collect();
    assert_eq!(
        targets,
        [
            ("watch", &[2.5, 0.0, 40.0][..]),
            ("bought", &[0.0, 0.0, 1.0])
        ]
    );
    assert_eq!(batch.labels, [1.0, 0.0, 1.0]);
    let sliced = batch.slice(1..3).expect("test step");
    assert_eq!(sliced.targets[0].values, [0.0, 40.0]);

    for (watch, row, message) in [
        (
            Float64Array::from(vec![Some(1.0), Some(2.0), None]),
            2,
            "null",
        ),
        (
            Float64Array::from(vec![1.0, f64::INFINITY, 0.0]),
            1,
            "finite",
        ),
    ] {
        let error = pipeline
            .minibatch(&with(Arc::new(watch)))
            .expect_err("refused");
        assert!(
            matches!(&error, BatchError::BadValue { column, row: r, message: m }
                if column == "watch" && *r == row && m.contains(message)),
            "{error}"
        );
    }
    let text: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c"]));
    let error = pipeline.minibatch(&with(text)).expect_err("refused");
    assert!(
        matches!(&error, BatchError::ColumnType { column, .. } if column == "watch"),
        "{error}"
    );
}

#[test]
fn pipeline_names_the_bad_column() {
    let pipeline = FeaturePipeline::new(&schema());
    let without_item = rows().project(&[0, 1, 2, 3, 4, 5]).expect("test step");
    let error = pipeline
        .minibatch(&without_item)
        .expect_err("must be refused");
    assert!(
        matches!(&error, BatchError::MissingColumn { column, .. } if column == "item"),
        "{error}"
    );

    let mut columns: Vec<(String, ArrayRef)> = rows()
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .zip(rows().columns().iter().cloned())
        .collect();
    columns[6].1 = Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0]));
    let wrong_type = RecordBatch::try_from_iter(columns.clone()).expect("test step");
    let error = pipeline
        .minibatch(&wrong_type)
        .expect_err("must be refused");
    assert!(
        matches!(&error, BatchError::ColumnType { column, .. } if column == "item"),
        "{error}"
    );

    columns[0].1 = Arc::new(Float64Array::from(vec![Some(1.0), None, Some(0.0)]));
    let null_label = RecordBatch::try_from_iter(columns).expect("test step");
    let error = pipeline
        .minibatch(&null_label)
        .expect_err("must be refused");
    assert!(
        matches!(&error, BatchError::BadValue { column, row: 1, .. } if column == "label"),
        "{error}"
    );

    let schema = Arc::new(Schema::new(vec![Field::new(
        "history",
        DataType::Utf8,
        false,
    )]));
    let scalar_history = RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(vec!["a"]))])
        .expect("test step");
    let multi_hot = FeaturePipeline::new(&FeatureSchema {
        label: "history".into(),
        negative_sample_rate: None,
        targets: Vec::new(),
        dense: vec![],
        sparse: vec![],
    });
    assert!(
        multi_hot.minibatch(&scalar_history).is_err(),
        "a string label is refused"
    );
}
