//! The master end to end, against real Redis, NATS, an API server, Parquet files on the
//! local file system (and on a real HDFS in `hdfs`) and real executor processes (the `task_reader` example as data
//! executor where a test counts rows read, else the real `primus-data-executor`, and the
//! real `primus-ps` and `primus-trainer`, which `cargo test --workspace` builds), with
//! serving-sync in-process for the serving path. Each module is one topic; `common` holds
//! what they share on top of `primus-harness`.

mod checkpoints;
mod common;
mod executors;
mod hdfs;
mod multitask;
mod planning;
mod scaling;
mod secrets;
mod serving;
mod streams;
mod task_reads;
mod training;
