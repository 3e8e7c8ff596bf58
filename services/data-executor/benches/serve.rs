//! Serving minibatches out of the buffers: Criteo-shaped rows (13 dense, 26 single-key
//! sparse features) read in chunks of 8,192 rows, served in minibatches of 2,048, beside
//! the baseline of copying each row once (every chunk cloned).
//!
//! `cargo bench -p primus-data-executor --bench serve`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use primus_batch::{DenseMatrix, JaggedFeature, Kjt, Minibatch, Sparse};
use primus_data_executor::buffer::{Buffers, Chunk};
use primus_data_executor::ledger::TaskLedger;
use primus_proto::v1::SourceKind;

const CHUNK_ROWS: usize = 8192;
const CHUNKS: usize = 16;
const MINIBATCH: usize = 2048;
const DENSE: usize = 13;
const SPARSE: usize = 26;

fn chunk_rows(first: usize) -> Minibatch {
    let features = (0..SPARSE)
        .map(|f| JaggedFeature {
            name: format!("c{f}"),
            offsets: (0..=CHUNK_ROWS as u32).collect(),
            values: (0..CHUNK_ROWS)
                .map(|i| ((first + i) * SPARSE + f) as u64)
                .collect(),
        })
        .collect();
    Minibatch {
        labels: (0..CHUNK_ROWS).map(|i| (i % 4 == 0) as u8 as f32).collect(),
        targets: Vec::new(),
        dense: DenseMatrix {
            names: (0..DENSE).map(|d| format!("i{d}")).collect(),
            values: (0..CHUNK_ROWS * DENSE).map(|v| v as f32).collect(),
        },
        sparse: Sparse::Jagged(Kjt {
            rows: CHUNK_ROWS,
            features,
        }),
    }
}

fn filled(chunks: &[Minibatch]) -> Buffers {
    let buffers = Buffers::new(
        vec![("criteo".into(), SourceKind::Batch, 1.0)],
        CHUNK_ROWS * CHUNKS,
    );
    let task = Arc::new(TaskLedger::new("task".into(), 0));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    for (i, batch) in chunks.iter().enumerate() {
        let chunk = Chunk {
            batch: batch.clone(),
            task: task.clone(),
            first_offset: (i * CHUNK_ROWS) as u64,
        };
        runtime.block_on(buffers.push(0, chunk));
    }
    buffers
}

fn serve(c: &mut Criterion) {
    let chunks: Vec<Minibatch> = (0..CHUNKS).map(|i| chunk_rows(i * CHUNK_ROWS)).collect();
    let mut group = c.benchmark_group("serve_criteo_8192_row_chunks");
    group.throughput(Throughput::Elements((CHUNK_ROWS * CHUNKS) as u64));
    group.sample_size(20);
    group.bench_function("minibatches of 2048", |b| {
        b.iter_batched(
            || filled(&chunks),
            |buffers| {
                let mut rows = 0;
                while let Some(served) = buffers.try_pop(MINIBATCH) {
                    rows += served.batch.rows();
                    black_box(&served.batch);
                }
                assert_eq!(rows, CHUNK_ROWS * CHUNKS);
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("baseline: each chunk cloned once", |b| {
        b.iter(|| black_box(chunks.to_vec()))
    });
    group.finish();
}

criterion_group!(benches, serve);
criterion_main!(benches);
