//! What the checkpoint coordinator asks of a Job's PS shards: copy a snapshot and write it
//! in the background, say when it is written, restore from a checkpoint, open without one.

use std::collections::BTreeMap;

use futures::future::join_all;
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{
    AwaitSnapshotRequest, Endpoint, OpenRequest, RestoreRequest, SnapshotRequest,
};

use super::{CheckpointError, CheckpointRecord};

/// Has every shard copy its snapshot under `<uri>/<shard id>` in memory (incremental to its
/// manifest in `bases` when given) and write it in the background (DLRover-RM's flash
/// checkpoint); answers once every shard has copied.
pub(super) async fn copy_snapshots(
    uri: &str,
    shards: &[Endpoint],
    bases: Option<&BTreeMap<String, String>>,
) -> Result<(), CheckpointError> {
    let copied = join_all(shards.iter().map(|shard| async move {
        let mut client = ParameterServerClient::new(channel(&shard.grpc_addr)?);
        let base = bases.and_then(|b| b.get(&shard.id)).cloned();
        let request = SnapshotRequest {
            uri: format!("{uri}/{}", shard.id),
            base_manifest_uri: base.unwrap_or_default(),
            in_background: true,
        };
        client
            .snapshot(request)
            .await
            .map(drop)
            .map_err(|status| status.message().to_owned())
    }))
    .await;
    for (shard, result) in shards.iter().zip(copied) {
        result.map_err(|message| shard_error(shard, message))?;
    }
    Ok(())
}

/// Waits until every shard wrote the snapshot [`copy_snapshots`] had it copy under `uri`;
/// shard id -> manifest URI.
pub(super) async fn written_snapshots(
    uri: &str,
    shards: &[Endpoint],
) -> Result<BTreeMap<String, String>, CheckpointError> {
    let written = join_all(shards.iter().map(|shard| async move {
        let mut client = ParameterServerClient::new(channel(&shard.grpc_addr)?);
        let request = AwaitSnapshotRequest {
            uri: format!("{uri}/{}", shard.id),
        };
        client
            .await_snapshot(request)
            .await
            .map(|r| r.into_inner().manifest_uri)
            .map_err(|status| status.message().to_owned())
    }))
    .await;
    shards
        .iter()
        .zip(written)
        .map(|(shard, result)| {
            let manifest = result.map_err(|message| shard_error(shard, message))?;
            Ok((shard.id.clone(), manifest))
        })
        .collect()
}

fn shard_error(shard: &Endpoint, message: String) -> CheckpointError {
    CheckpointError::Ps {
        id: shard.id.clone(),
        addr: shard.grpc_addr.clone(),
        message,
    }
}

/// Restores every PS shard of `shards` (the Job's, in shard order) from `record`; the rows
/// each wrote, as `<shard> <rows>` in shard order.
pub async fn restore_ps(
    record: &CheckpointRecord,
    shards: &[&Endpoint],
) -> Result<String, CheckpointError> {
    let restores = shards
        .iter()
        .map(|shard| restore_shard(record, shard, shards));
    let mut rows = Vec::with_capacity(shards.len());
    for (shard, restored) in shards.iter().zip(join_all(restores).await) {
        rows.push(format!("{} {}", shard.id, restored?));
    }
    Ok(rows.join(", "))
}

/// Restores `shard`, one of `shards` (the Job's, in shard order), from `record`; returns
/// the rows it wrote. A checkpoint of the same shards restores each from its own snapshot;
/// one taken with other shards (the Job was resharded since) restores each shard from
/// every snapshot, keeping what the Job's layout places on it.
pub async fn restore_shard(
    record: &CheckpointRecord,
    shard: &Endpoint,
    shards: &[&Endpoint],
) -> Result<u64, CheckpointError> {
    let failed = |message: String| CheckpointError::Ps {
        id: shard.id.clone(),
        addr: shard.grpc_addr.clone(),
        message,
    };
    let mut running: Vec<&str> = shards.iter().map(|s| s.id.as_str()).collect();
    running.sort_unstable();
    let same_shards = record.ps.keys().map(String::as_str).eq(running);
    let request = if same_shards {
        let manifest_uri = record
            .ps
            .get(&shard.id)
            .cloned()
            .ok_or_else(|| failed(format!("checkpoint {} has no snapshot of it", record.id)))?;
        RestoreRequest {
            manifest_uri,
            ..RestoreRequest::default()
        }
    } else {
        let index = shards
            .iter()
            .position(|s| s.id == shard.id)
            .ok_or_else(|| failed("not one of the Job's PS shards".to_owned()))?;
        let mut manifests = record.ps.values().cloned();
        RestoreRequest {
            manifest_uri: manifests
                .next()
                .ok_or_else(|| failed(format!("checkpoint {} has no PS snapshot", record.id)))?,
            more_manifest_uris: manifests.collect(),
            layout: Some(primus_proto::v1::Layout {
                shard_count: shards.len() as u32,
                index: Some(index as u32),
            }),
        }
    };
    let mut client = ParameterServerClient::new(channel(&shard.grpc_addr).map_err(failed)?);
    client
        .restore(request)
        .await
        .map(|response| response.into_inner().rows)
        .map_err(|status| failed(status.message().to_owned()))
}

/// Lets `shard` (started with `ps.await_restore`) serve training calls: the Job has no
/// checkpoint to restore. With `empty` it drops what it holds first.
pub async fn open_shard(shard: &Endpoint, empty: bool) -> Result<(), CheckpointError> {
    let failed = |message: String| CheckpointError::Ps {
        id: shard.id.clone(),
        addr: shard.grpc_addr.clone(),
        message,
    };
    let mut client = ParameterServerClient::new(channel(&shard.grpc_addr).map_err(failed)?);
    client
        .open(OpenRequest { empty })
        .await
        .map(drop)
        .map_err(|status| failed(status.message().to_owned()))
}

/// A lazily connected channel to a job executor.
pub(super) fn channel(addr: &str) -> Result<tonic::transport::Channel, String> {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map(|endpoint| endpoint.connect_lazy())
        .map_err(|e| format!("address {addr:?}: {e}"))
}
