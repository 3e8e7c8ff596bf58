//! Real servers for tests and for the local playground (`primus up`): NATS, Redis and
//! SeaweedFS (an S3-compatible store), each started on free loopback ports in its own
//! temporary directory, waited on until it answers, and killed (by PID) when dropped;
//! and an OTLP/gRPC trace receiver ([`OtlpReceiver`]) for tests that follow a trace
//! across processes. On machines where `scripts/install-cluster-tools.sh` ran, also a
//! two-node Kubernetes cluster ([`kube::KubeCluster`]) and the container images it runs
//! ([`images`]) and MinIO ([`MinioS3`]); where `scripts/install-hdfs.sh` ran, an HDFS namenode and two datanodes
//! ([`Hdfs`]).
//!
//! Binaries are looked up on `PATH`, then in the repository's `.tools/` (where
//! `scripts/install-deps.sh` puts them). When one is missing, [`Error::MissingBinary`] says
//! how to install it; tests call `.expect(..)` on it, so under CI a missing server is a
//! failure, never a silent skip.

#![warn(missing_docs)]

mod docker;
mod hdfs;
mod host;
pub mod images;
pub mod kube;
mod minio;
mod otlp;
mod process;
mod servers;
pub mod service;

pub use docker::DockerEngine;
pub use hdfs::{Hdfs, Kerberos};
pub use host::run;
pub use minio::MinioS3;
pub use otlp::{OtlpReceiver, ReceivedSpan};
pub use process::{Error, find_binary, free_port, repo_root, restartable_port, run_test_again};
pub use servers::{NatsServer, RedisServer, S3Bucket, SeaweedS3};
