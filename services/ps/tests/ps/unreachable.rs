//! A shard down for a moment (restarting): a push holds that shard's part until it is back
//! and applies it there once; the other shard's part is applied once, not again. A shard
//! that awaits its restore holds pushes the same way until it has its checkpoint, and so
//! does a push whose shard process is killed under it.

use std::sync::Arc;
use std::time::Duration;

use primus_proto::v1::{
    ExportDeltaRequest, LookupRequest, OpenRequest, PushRequest, RestoreRequest, SnapshotRequest,
};
use primus_ps_client::{PsClient, ShardSource, TableGrads, TableKeys, layout};
use primus_testkit::service::{ServiceProcess, signal};
use primus_testkit::{NatsServer, restartable_port};
use tokio::net::TcpStream;
use tonic::Code;

use super::{
    DIM, batch, grads_for, raw_client, reference_table, shard_settings, start, table_spec,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_holds_the_part_of_a_restarting_shard_and_applies_it_once_it_is_back() {
    let nats = NatsServer::start().expect("nats-server");
    let settings: Vec<_> = (0..2)
        .map(|_| shard_settings(&nats, vec![table_spec("items")]))
        .collect();
    let mut shards = Vec::new();
    for shard in &settings {
        shards.push(start(shard.clone()).await);
    }
    let addrs: Vec<String> = shards.iter().map(|s| s.addr.clone()).collect();
    // The shard list does not change: the restarted shard comes back at its address.
    let listed = addrs.clone();
    let source: ShardSource = Arc::new(move || {
        let addrs = listed.clone();
        Box::pin(async move { Ok(addrs) })
    });
    let client = PsClient::connect(&addrs)
        .await
        .expect("connect")
        .following(source);
    let (keys0, grads0) = (batch(0, 300), grads_for(0, 300));
    client.push("items", &keys0, &grads0).await.expect("push 0");

    // Stopped, not only closed to new connections: the client's open connection to it
    // must not serve the push below.
    shards.pop().expect("shard 1").stop().await;
    let (keys1, grads1) = (batch(1, 300), grads_for(1, 300));
    let pushing = {
        let (client, keys, grads) = (client.clone(), keys1.clone(), grads1.clone());
        tokio::spawn(async move {
            let pushed = [TableGrads {
                table: "items",
                keys: &keys,
                grads: &grads,
            }];
            let read = [TableKeys {
                table: "items",
                keys: &keys,
            }];
            client.push_tables_then_lookup(&pushed, &read, 1).await
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    if pushing.is_finished() {
        let early = pushing
            .await
            .expect("push task")
            .map(|(applied, _)| applied);
        panic!("the push did not wait for the shard: {early:?}");
    }
    let _back = start(settings[1].clone()).await;
    let (applied, read) = pushing
        .await
        .expect("push task")
        .expect("the push lands once the shard is back");
    assert_eq!(applied, vec![(keys1.len() as u64, 0)]);

    // Shard 0 kept both pushes, each once; shard 1 came back empty and has the second.
    let (both, second_only) = (reference_table("items"), reference_table("items"));
    both.push(&keys0, &grads0, 1).expect("reference");
    both.push(&keys1, &grads1, 1).expect("reference");
    second_only.push(&keys1, &grads1, 1).expect("reference");
    let mut expected = vec![0.0; DIM];
    for (i, key) in keys1.iter().enumerate() {
        let reference = match layout::key_shard(*key, 2) {
            0 => &both,
            _ => &second_only,
        };
        reference
            .lookup(&[*key], &mut expected)
            .expect("reference lookup");
        assert_eq!(
            &read[0].rows[i * DIM..(i + 1) * DIM],
            &expected[..],
            "key {key} (shard {})",
            layout::key_shard(*key, 2)
        );
    }
}

/// A shard started with `ps.await_restore` (as the master starts a Job's shards) refuses
/// training calls, snapshots and delta exports as UNAVAILABLE; a push waits, and lands on
/// the restored rows once the shard is restored, so the checkpoint does not overwrite it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_awaiting_its_restore_holds_pushes_until_the_restore_then_applies_them() {
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let uri = format!("file://{}/checkpoint", dir.path().display());
    let settings = shard_settings(&nats, vec![table_spec("items")]);
    let first = start(settings.clone()).await;
    let addrs = vec![first.addr.clone()];
    let listed = addrs.clone();
    let source: ShardSource = Arc::new(move || {
        let addrs = listed.clone();
        Box::pin(async move { Ok(addrs) })
    });
    let client = PsClient::connect(&addrs)
        .await
        .expect("connect")
        .following(source);
    let (keys0, grads0) = (batch(0, 300), grads_for(0, 300));
    client.push("items", &keys0, &grads0).await.expect("push 0");
    let manifest_uri = raw_client(&first.addr)
        .await
        .snapshot(SnapshotRequest {
            uri: uri.clone(),
            base_manifest_uri: String::new(),
            in_background: false,
        })
        .await
        .expect("snapshot")
        .into_inner()
        .manifest_uri;
    first.shutdown.trigger();
    while TcpStream::connect(&addrs[0]).await.is_ok() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut awaiting = settings.clone();
    awaiting.ps.await_restore = true;
    let restarted = start(awaiting).await;
    let mut raw = raw_client(&restarted.addr).await;
    let refused = raw
        .lookup(LookupRequest {
            table: "items".into(),
            keys: primus_proto::packed::encode_keys(&keys0).into(),
        })
        .await
        .expect_err("a lookup before the restore");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let snapshot = raw
        .snapshot(SnapshotRequest {
            uri: format!("{uri}-early"),
            base_manifest_uri: String::new(),
            in_background: false,
        })
        .await
        .expect_err("a snapshot before the restore");
    assert_eq!(snapshot.code(), Code::Unavailable, "{snapshot:?}");
    let export = raw
        .export_delta(ExportDeltaRequest::default())
        .await
        .expect_err("a delta export before the restore");
    assert_eq!(export.code(), Code::Unavailable, "{export:?}");

    let (keys1, grads1) = (batch(1, 300), grads_for(1, 300));
    let pushing = {
        let (client, keys, grads) = (client.clone(), keys1.clone(), grads1.clone());
        tokio::spawn(async move { client.push("items", &keys, &grads).await })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !pushing.is_finished(),
        "the push did not wait for the restore"
    );
    raw.restore(RestoreRequest {
        manifest_uri,
        ..RestoreRequest::default()
    })
    .await
    .expect("restore");
    let (applied, _) = pushing
        .await
        .expect("push task")
        .expect("the push lands after the restore");
    assert_eq!(applied, keys1.len() as u64);

    let reference = reference_table("items");
    reference.push(&keys0, &grads0, 1).expect("reference");
    reference.push(&keys1, &grads1, 1).expect("reference");
    let keys: Vec<u64> = keys0.iter().chain(&keys1).copied().collect();
    let mut expected = vec![0.0; keys.len() * DIM];
    reference.lookup(&keys, &mut expected).expect("reference");
    let (rows, _) = client.lookup("items", &keys).await.expect("lookup");
    assert_eq!(
        rows, expected,
        "the checkpoint's rows with the held push on them"
    );
}

/// Open lets a shard awaiting its restore train on the rows it has (no checkpoint yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_lets_a_shard_awaiting_its_restore_train_without_one() {
    let nats = NatsServer::start().expect("nats-server");
    let mut settings = shard_settings(&nats, vec![table_spec("items")]);
    settings.ps.await_restore = true;
    let shard = start(settings).await;
    let mut raw = raw_client(&shard.addr).await;
    let push = |keys: &[u64]| {
        let mut grads = Vec::new();
        primus_proto::packed::encode_f32(&grads_for(0, keys.len()), &mut grads);
        PushRequest {
            table: "items".into(),
            keys: primus_proto::packed::encode_keys(keys).into(),
            grads: grads.into(),
        }
    };
    let keys = batch(0, 50);
    let refused = raw.push(push(&keys)).await.expect_err("a push before Open");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    raw.open(OpenRequest { empty: false }).await.expect("open");
    let pushed = raw.push(push(&keys)).await.expect("a push after Open");
    assert_eq!(pushed.into_inner().applied, keys.len() as u64);
}

/// A shard process SIGKILLed while pushes stream to it: a call it dies under fails with a
/// reset connection rather than UNAVAILABLE, and the client holds it like any unreachable
/// shard's part, so every push completes once the shard is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_to_a_shard_killed_under_them_wait_for_it_and_complete() {
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_primus-ps"));
    let port = restartable_port().expect("port");
    let ps = shard_settings(&nats, vec![table_spec("items")]).ps;
    let settings = format!(
        "nats: {{\"url\": \"{}\"}}\nps: {}\n",
        nats.url(),
        serde_json::to_string(&ps).expect("ps settings as JSON")
    );
    let start = || {
        let mut process =
            ServiceProcess::start_on(exe, dir.path(), port, &settings).expect("start primus-ps");
        async move {
            process
                .wait_healthy(Duration::from_secs(30))
                .await
                .expect("serving");
            process
        }
    };
    let shard = start().await;
    let addrs = vec![shard.addr().to_owned()];
    let listed = addrs.clone();
    let source: ShardSource = Arc::new(move || {
        let addrs = listed.clone();
        Box::pin(async move { Ok(addrs) })
    });
    let client = PsClient::connect(&addrs)
        .await
        .expect("connect")
        .following(source);
    // Back to back, so a call is in flight when the kill comes; on until the shard is back.
    let back = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pushing = {
        let back = back.clone();
        tokio::spawn(async move {
            let mut step = 0u64;
            while !back.load(std::sync::atomic::Ordering::Acquire) {
                let (keys, grads) = (batch(step, 20_000), grads_for(step, 20_000));
                client
                    .push("items", &keys, &grads)
                    .await
                    .map_err(|e| format!("push {step}: {e}"))?;
                step += 1;
            }
            Ok::<_, String>(step)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(shard.pid(), "KILL").expect("SIGKILL the shard");
    drop(shard);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _back = start().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    back.store(true, std::sync::atomic::Ordering::Release);
    let pushed = pushing
        .await
        .expect("push task")
        .expect("every push completes once the shard is back");
    assert!(pushed > 1, "{pushed} pushes");
}
