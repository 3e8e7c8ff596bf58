//! Generated data sets: written through primus-storage, read back through the feature
//! pipeline; their statistics match what they promise (best AUC, drift, RecD's session
//! model, clustering).

use futures::TryStreamExt;
use primus_batch::{FeaturePipeline, Minibatch, Sparse};
use primus_datagen::criteo::{CONVERSION, Criteo, CriteoOptions, WATCH};
use primus_datagen::sessions::{RowOrder, SessionLength, SessionOptions, Sessions};
use primus_datagen::write::{Layout, criteo, sessions, write_file};
use primus_metrics::auc;
use primus_spec::dataset::{FeatureSchema, WindowUnit};
use primus_storage::parquet::{ReadOptions, read};

async fn read_all(url: &str, schema: &FeatureSchema) -> Vec<Minibatch> {
    let location = primus_storage::open(url, &Default::default()).expect("test step");
    let pipeline = FeaturePipeline::new(schema);
    let mut batches = Vec::new();
    for file in location.list("").await.expect("test step") {
        let options = ReadOptions {
            columns: Some(pipeline.columns()),
            ..Default::default()
        };
        let stream = read(&location, &file.location, &options)
            .await
            .expect("test step");
        let records: Vec<_> = stream.try_collect().await.expect("test step");
        for record in records {
            batches.push(pipeline.minibatch(&record).expect("test step"));
        }
    }
    batches
}

/// Hourly windows from 2026-11-20T00.
fn hourly_from_2026_11_20(
    windows: usize,
    files_per_window: usize,
    row_group_rows: usize,
) -> Layout {
    Layout {
        unit: WindowUnit::Hourly,
        start_unix_s: primus_spec::time::parse_window_time("2026-11-20T00").expect("test step"),
        windows,
        files_per_window,
        row_group_rows,
    }
}

#[tokio::test]
async fn criteo_like_data_reads_back_with_its_best_auc() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = dir.path().to_str().expect("UTF-8 temp path").to_owned();
    let location = primus_storage::open(&url, &Default::default()).expect("test step");
    let layout = hourly_from_2026_11_20(2, 2, 1000);
    let options = CriteoOptions {
        cardinality_scale: 0.001,
        ..Default::default()
    };
    let summary = criteo(&location, &layout, 5001, options)
        .await
        .expect("test step");
    assert_eq!((summary.rows, summary.files), (10_002, 4));
    let best = summary.best_auc.expect("test step");
    assert!((0.70..0.92).contains(&best), "best AUC {best}");
    let names: Vec<String> = location
        .list("")
        .await
        .expect("test step")
        .iter()
        .map(|m| m.location.to_string())
        .collect();
    assert!(
        names[0].ends_with("date=2026-11-20/hour=00/part-00000.parquet"),
        "{names:?}"
    );
    assert!(
        names[3].ends_with("date=2026-11-20/hour=01/part-00001.parquet"),
        "{names:?}"
    );

    let batches = read_all(&url, &primus_datagen::criteo::feature_schema("categorical")).await;
    let rows: usize = batches.iter().map(Minibatch::rows).sum();
    assert_eq!(rows, 10_002);
    let positives: f32 = batches.iter().flat_map(|b| b.labels.iter()).sum();
    let ctr = positives / rows as f32;
    assert!((0.1..0.45).contains(&ctr), "click rate {ctr}");
    let Sparse::Jagged(kjt) = &batches[0].sparse else {
        panic!("pipeline output is jagged");
    };
    assert_eq!(kjt.features.len(), 26);
    assert!(
        kjt.features.iter().all(|f| f.values.len() == kjt.rows),
        "one id per row"
    );
}

#[test]
fn drift_moves_the_hidden_model() {
    let start = 1_700_000_000;
    let options = CriteoOptions {
        cardinality_scale: 0.0005,
        drift_radians_per_day: 0.6,
        epoch_unix_s: start,
        ..Default::default()
    };
    let mut early = Criteo::new(options.clone()).expect("test step");
    let mut late = Criteo::new(options).expect("test step");
    let day0 = early.generate(20_000, start).expect("test step");
    let day4 = late
        .generate(20_000, start + 4 * 86_400)
        .expect("test step");
    // Same seed, so the same rows; only the hidden model differs.
    assert_eq!(day0.batch.columns()[1..], day4.batch.columns()[1..]);
    let best_late = auc(&day4.probabilities, &day4.labels).expect("test step");
    let stale = auc(&day0.probabilities, &day4.labels).expect("test step");
    assert!(
        best_late - stale > 0.03,
        "day-0 model on day-4 data {stale} vs {best_late}"
    );
    assert!(
        Criteo::new(CriteoOptions {
            cardinality_scale: -1.0,
            ..Default::default()
        })
        .is_err()
    );
}

#[tokio::test]
async fn criteo_like_tasks_are_correlated_labels_read_back_as_targets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = dir.path().to_str().expect("UTF-8 temp path").to_owned();
    let location = primus_storage::open(&url, &Default::default()).expect("test step");
    let layout = hourly_from_2026_11_20(1, 1, 10_000);
    let options = CriteoOptions {
        cardinality_scale: 0.001,
        tasks: true,
        ..Default::default()
    };
    let summary = criteo(&location, &layout, 40_000, options.clone())
        .await
        .expect("test step");
    let bests = summary.tasks.expect("the tasks' best scores");
    let conversion_auc = bests.conversion_auc.expect("both classes");
    assert!(
        conversion_auc > 0.75,
        "best conversion AUC {conversion_auc}"
    );
    assert!(
        (0.45..0.55).contains(&bests.watch_rmse),
        "best watch-time RMSE {}: the noise's 0.5",
        bests.watch_rmse
    );
    assert!(
        bests.watch_deviation > bests.watch_rmse * 1.5,
        "the hidden means explain little: {bests:?}"
    );

    let mut schema = primus_datagen::criteo::feature_schema("categorical");
    schema.targets = vec![CONVERSION.into(), WATCH.into()];
    let batches = read_all(&url, &schema).await;
    let all = Minibatch::concat(&batches).expect("test step");
    let [conversion, watch] = &all.targets[..] else {
        panic!("two targets: {:?}", all.targets.len());
    };
    assert_eq!(
        (conversion.name.as_str(), watch.name.as_str()),
        (CONVERSION, WATCH)
    );
    let clicks: f32 = all.labels.iter().sum();
    let converted: f32 = conversion.values.iter().sum();
    let outside_clicks = (all.labels.iter().zip(&conversion.values))
        .filter(|(click, conversion)| **click == 0.0 && **conversion != 0.0)
        .count();
    assert_eq!(outside_clicks, 0, "a conversion without a click");
    let rate = converted / clicks;
    assert!((0.04..0.15).contains(&rate), "conversions per click {rate}");
    // The click data is the data without tasks: the further labels draw after it.
    let mut plain = Criteo::new(CriteoOptions {
        tasks: false,
        ..options.clone()
    })
    .expect("test step");
    let mut with_tasks = Criteo::new(options).expect("test step");
    let (plain, with_tasks) = (
        plain.generate(1000, 0).expect("test step"),
        with_tasks.generate(1000, 0).expect("test step"),
    );
    assert_eq!(plain.batch.columns(), &with_tasks.batch.columns()[..40]);
    assert_eq!(with_tasks.batch.num_columns(), 42);
}

fn grouped_factor(batches: &[Minibatch], schema: &FeatureSchema) -> f64 {
    let pipeline = FeaturePipeline::new(schema);
    let all = Minibatch::concat(batches).expect("test step");
    let grouped = all.grouped(pipeline.groups()).expect("test step");
    let Sparse::Grouped(ikjt) = &grouped.sparse else {
        panic!("not grouped");
    };
    assert_eq!(
        grouped.to_kjt().expect("test step"),
        all.to_kjt().expect("test step")
    );
    ikjt.groups[0].dedupe_factor()
}

#[tokio::test]
async fn session_dedupe_factor_follows_recd_model() {
    let schema = primus_datagen::sessions::feature_schema("ids");
    for (samples, change) in [(10u32, 0.3), (16, 0.6), (4, 0.0)] {
        let mut generator = Sessions::new(SessionOptions {
            length: SessionLength::Fixed(samples),
            change_probability: change,
            order: RowOrder::Clustered,
            seed: u64::from(samples),
            ..Default::default()
        })
        .expect("test step");
        let batch = generator.generate(4000, 0, 3600).expect("test step");
        let minibatch = FeaturePipeline::new(&schema)
            .minibatch(&batch)
            .expect("test step");
        let measured = grouped_factor(&[minibatch], &schema);
        let s = f64::from(samples);
        let model = 1.0 / (1.0 - (s - 1.0) / s * (1.0 - change));
        let error = (measured - model).abs() / model;
        assert!(
            error < 0.02,
            "S={samples} p={change}: measured {measured}, model {model}"
        );
    }
}

#[tokio::test]
async fn sessions_are_heavy_tailed_and_cluster_smaller() {
    let options = SessionOptions::default();
    let mut generator = Sessions::new(options.clone()).expect("test step");
    let batch = generator.generate(20_000, 0, 3600).expect("test step");
    let mean = batch.num_rows() as f64 / 20_000.0;
    assert!((15.5..17.5).contains(&mean), "mean session length {mean}");

    let dir = tempfile::tempdir().expect("temp dir");
    let location = primus_storage::open(
        dir.path().to_str().expect("UTF-8 temp path"),
        &Default::default(),
    )
    .expect("test step");
    let mut sizes = Vec::new();
    for order in [RowOrder::Time, RowOrder::Clustered] {
        let mut generator = Sessions::new(SessionOptions {
            order,
            ..options.clone()
        })
        .expect("test step");
        let batch = generator.generate(3000, 0, 3600).expect("test step");
        sizes.push(
            write_file(&location, &format!("{order:?}.parquet"), batch, 1 << 20)
                .await
                .expect("test step"),
        );
    }
    assert!(
        sizes[1] < sizes[0],
        "clustered {} bytes vs time-ordered {}",
        sizes[1],
        sizes[0]
    );

    let layout = Layout {
        unit: WindowUnit::Daily,
        start_unix_s: 0,
        windows: 1,
        files_per_window: 3,
        row_group_rows: 4096,
    };
    let summary = sessions(&location, &layout, 100, options)
        .await
        .expect("test step");
    assert_eq!((summary.sessions, summary.files), (100, 3));
    assert!(
        Sessions::new(SessionOptions {
            change_probability: 1.5,
            ..Default::default()
        })
        .is_err()
    );
}
