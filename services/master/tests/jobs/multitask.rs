//! Several tasks on data whose labels are planted: examples/criteo-multitask.yaml (MMoE over
//! a click, a conversion among clicks and a watch time) against its best achievable scores
//! and against the same network trained on each label alone.

use primus_config::StorageSettings;
use primus_datagen::criteo::CriteoOptions;
use primus_datagen::write::{Layout, TaskBests, criteo};
use primus_harness::Sandbox;
use primus_spec::Resource;
use primus_spec::dataset::WindowUnit;

use crate::common::train_in_window_order_to_the_end;

const HOURS: usize = 4;
const ROWS_PER_HOUR: usize = 100_000;
/// Each head is scored on the last hour: enough conversions for a steady AUC.
const EVAL_WINDOW: u32 = ROWS_PER_HOUR as u32;
/// The tasks: each head's name, the Metric series scoring it among the three, and alone (a
/// model whose one head is binary on the Dataset's label reports the Job's own AUC).
const TASKS: [(&str, &str, &str); 3] = [
    ("click", "head.click.auc", "auc"),
    ("conversion", "head.conversion.auc", "head.conversion.auc"),
    ("watch", "head.watch.rmse", "head.watch.rmse"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mmoe_learns_each_planted_task_near_its_best_and_beats_one_model_per_task() {
    let sandbox = Sandbox::start().await;
    let data = sandbox.dir().join("criteo-tasks");
    let (best_click, bests) = write_rows(&data).await;
    let best_conversion = bests.conversion_auc.expect("conversions and none");
    let example =
        std::fs::read_to_string(primus_testkit::repo_root().join("examples/criteo-multitask.yaml"))
            .expect("the example")
            .replace(
                "file://./.primus/data/criteo-tasks",
                data.to_str().expect("utf-8"),
            );
    let mut resources = primus_spec::parse_documents("criteo-multitask.yaml", &example)
        .expect("the example parses");
    for resource in &mut resources {
        if let Resource::Job(job) = resource {
            job.spec.training.eval_window = EVAL_WINDOW;
        }
    }
    sandbox.apply(resources.clone()).await;
    let rows = (HOURS * ROWS_PER_HOUR) as u64;
    train_in_window_order_to_the_end(&sandbox, "criteo-mmoe", rows).await;
    let names = TASKS.map(|(_, series, _)| series);
    let together = (sandbox.latest_metrics("criteo-mmoe", &names).await)
        .expect("each head's scores in the Metric resource");

    let mut alone = Vec::new();
    for (task, _, series) in TASKS {
        let job = format!("criteo-{task}-alone");
        sandbox.apply([single_task(&resources, task, &job)]).await;
        train_in_window_order_to_the_end(&sandbox, &job, rows).await;
        let score = (sandbox.latest_metrics(&job, &[series]).await).expect("the head's score");
        alone.push(score[0]);
    }
    eprintln!(
        "criteo-mmoe: click AUC {:.4} (alone {:.4}, best {best_click:.4}); conversion AUC {:.4} \
         (alone {:.4}, best {best_conversion:.4}); watch RMSE {:.4} (alone {:.4}, best {:.4}, \
         best constant {:.4})",
        together[0],
        alone[0],
        together[1],
        alone[1],
        together[2],
        alone[2],
        bests.watch_rmse,
        bests.watch_deviation
    );
    for (i, best) in [(0, best_click), (1, best_conversion)] {
        assert!(
            together[i] > best - 0.02,
            "{} AUC {:.4} is not within 0.02 of the best achievable {best:.4}",
            TASKS[i].0,
            together[i]
        );
    }
    assert!(
        together[2] < bests.watch_deviation,
        "watch RMSE {:.4} is no better than the best constant's {:.4}",
        together[2],
        bests.watch_deviation
    );
    // Conversions are rare: trained beside the click, whose logit they share, they learn
    // more than alone. The click and the watch time have data enough of their own; sharing
    // the experts must not cost them more than noise.
    assert!(
        together[1] > alone[1],
        "the conversion head learns no more with the click's data: AUC {:.4} together, {:.4} alone",
        together[1],
        alone[1]
    );
    assert!(
        together[0] > alone[0] - 0.002,
        "click AUC {:.4} together, {:.4} alone",
        together[0],
        alone[0]
    );
    assert!(
        together[2] < alone[2] * 1.01,
        "watch RMSE {:.4} together, {:.4} alone",
        together[2],
        alone[2]
    );
}

/// Writes the example's four hours of rows with every task under `dir`; the click's best
/// achievable AUC and the further tasks' best scores.
async fn write_rows(dir: &std::path::Path) -> (f64, TaskBests) {
    let location = primus_storage::open(dir.to_str().expect("utf-8"), &StorageSettings::default())
        .expect("location");
    let layout = Layout {
        unit: WindowUnit::Hourly,
        start_unix_s: primus_spec::time::parse_window_time("2026-11-20T00").expect("a time"),
        windows: HOURS,
        files_per_window: 1,
        row_group_rows: 16_384,
    };
    let options = CriteoOptions {
        cardinality_scale: 0.00005,
        tasks: true,
        ..Default::default()
    };
    let summary = criteo(&location, &layout, ROWS_PER_HOUR, options)
        .await
        .expect("generate");
    let best_click = summary.best_auc.expect("clicks and none");
    (best_click, summary.tasks.expect("the tasks' best scores"))
}

/// The example's Job named `job`, keeping of its graph the experts and `task`'s gate, tower
/// and head: the same network trained on one label.
fn single_task(resources: &[Resource], task: &str, job: &str) -> Resource {
    let Some(Resource::Job(example)) = (resources.iter()).find(|r| matches!(r, Resource::Job(_)))
    else {
        panic!("the example has a Job");
    };
    let mut alone = example.clone();
    alone.metadata.name = job.to_owned();
    let graph = (alone.spec.model.dense.graph.as_mut()).expect("the example's graph");
    let others: Vec<&str> = (TASKS.iter())
        .map(|(name, _, _)| *name)
        .filter(|name| *name != task)
        .collect();
    graph.heads.retain(|name, _| name == task);
    graph.blocks.retain(|name, _| {
        !others
            .iter()
            .any(|other| name.starts_with(&format!("{other}_")))
    });
    Resource::Job(alone)
}
