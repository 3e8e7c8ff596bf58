//! The peer: TorchRec's DLRM trained on the same minibatches as the in-process trainer
//! (`benches/peer/torchrec_dlrm.py`), where `benches/peer/install-torchrec.sh` has installed
//! it into `.tools/torchrec`. The minibatches go over as the trainer sees them (after its
//! feature transforms), with each feature's keys renumbered into its own table.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use primus_batch::Minibatch;
use primus_spec::job::{Initializer, ModelSpec, OptimizerSpec};
use serde_json::{Value, json};

/// Rows of each of the peer's tables unless a feature has more distinct keys (TorchRec
/// needs a size; ours grow with their keys).
const TABLE_ROWS: usize = 100_000;

/// What the peer measured.
#[derive(Clone)]
pub(crate) struct PeerFigures {
    pub(crate) samples_per_second: f64,
    pub(crate) auc: f64,
    /// The dense network alone, milliseconds per minibatch (median).
    pub(crate) dense_forward_ms: f64,
    pub(crate) dense_step_ms: f64,
    /// torch, TorchRec and fbgemm-gpu versions and the thread count.
    pub(crate) describe: String,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The peer's Python, where it is installed.
fn python() -> Option<PathBuf> {
    let python = root().join(".tools/torchrec/bin/python");
    python.exists().then_some(python)
}

/// Trains the peer on `batches` with `spec`'s shape and optimizers on `threads` threads;
/// None where it is not installed.
pub(crate) fn run(
    spec: &ModelSpec,
    batches: &[Minibatch],
    eval_window: u32,
    threads: usize,
) -> Option<PeerFigures> {
    let python = python()?;
    let dir = tempfile::tempdir().expect("tempdir");
    export(dir.path(), spec, batches, eval_window, threads);
    let script = root().join("benches/peer/torchrec_dlrm.py");
    let output = std::process::Command::new(&python)
        .arg(&script)
        .arg(dir.path())
        .output()
        .expect("run the peer");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the peer failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout.lines().last().unwrap_or_default();
    let figures: Value = serde_json::from_str(line).expect("the peer's JSON line");
    let number = |name: &str| figures[name].as_f64().expect(name);
    let versions = &figures["versions"];
    Some(PeerFigures {
        samples_per_second: number("samples_per_second"),
        auc: number("auc"),
        dense_forward_ms: number("dense_forward_ms"),
        dense_step_ms: number("dense_step_ms"),
        describe: format!(
            "torch {}, TorchRec {}, fbgemm-gpu-cpu {}, {} threads",
            versions["torch"], versions["torchrec"], versions["fbgemm_gpu"], figures["threads"]
        ),
    })
}

/// `meta.json` (shape, optimizers, initialisation) and `batches.bin`: per minibatch, the
/// row count (u32), labels and dense features (f32, row-major), each feature's lengths
/// (i32, feature-major, as a KJT's) and the renumbered keys (i64).
fn export(dir: &Path, spec: &ModelSpec, batches: &[Minibatch], eval_window: u32, threads: usize) {
    let table = &spec.tables[0];
    let OptimizerSpec::Adagrad {
        learning_rate,
        initial_accumulator,
        epsilon,
    } = table.optimizer
    else {
        panic!("the peer trains embeddings with Adagrad only");
    };
    let OptimizerSpec::Adam {
        learning_rate: dense_lr,
        epsilon: dense_epsilon,
        ..
    } = spec.dense.optimizer
    else {
        panic!("the peer trains the dense network with Adam only");
    };
    let Initializer::Uniform { scale } = table.initializer else {
        panic!("the peer initialises embeddings uniformly only");
    };
    let first = batches.first().expect("minibatches").to_kjt().expect("kjt");
    let names: Vec<String> = first.features.iter().map(|f| f.name.clone()).collect();
    let mut ids: Vec<HashMap<u64, i64>> = vec![HashMap::new(); names.len()];
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(dir.join("batches.bin")).expect("batches.bin"),
    );
    for batch in batches {
        let kjt = batch.to_kjt().expect("kjt");
        let rows = batch.rows();
        let mut bytes = Vec::new();
        bytes.extend((rows as u32).to_le_bytes());
        bytes.extend(batch.labels.iter().flat_map(|v| v.to_le_bytes()));
        bytes.extend(batch.dense.values.iter().flat_map(|v| v.to_le_bytes()));
        for feature in &kjt.features {
            let lengths = feature.offsets.windows(2).map(|w| (w[1] - w[0]) as i32);
            bytes.extend(lengths.flat_map(i32::to_le_bytes));
        }
        for (feature, ids) in kjt.features.iter().zip(&mut ids) {
            for key in &feature.values {
                let next = ids.len() as i64;
                bytes.extend(ids.entry(*key).or_insert(next).to_le_bytes());
            }
        }
        out.write_all(&bytes).expect("write batches.bin");
    }
    out.flush().expect("write batches.bin");
    let meta = json!({
        "names": names,
        "features": names.len(),
        "dense": batches[0].dense.names.len(),
        "dim": table.dim,
        "table_rows": ids.iter().map(|ids| ids.len().max(TABLE_ROWS)).collect::<Vec<_>>(),
        "embedding_lr": learning_rate,
        "initial_accumulator": initial_accumulator,
        "epsilon": epsilon,
        "embedding_init_scale": scale,
        "dense_lr": dense_lr,
        "dense_epsilon": dense_epsilon,
        "bottom": spec.dense.bottom,
        "top": spec.dense.top,
        "eval_window": eval_window,
        "threads": threads,
        "dense_runs": 20,
    });
    std::fs::write(dir.join("meta.json"), meta.to_string()).expect("meta.json");
}
