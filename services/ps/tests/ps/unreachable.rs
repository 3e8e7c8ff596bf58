//! A shard down for a moment (restarting): a push holds that shard's part until it is back
//! and applies it there once; the other shard's part is applied once, not again.

use std::sync::Arc;
use std::time::Duration;

use primus_ps_client::{PsClient, ShardSource, TableGrads, TableKeys, layout};
use primus_testkit::NatsServer;
use tokio::net::TcpStream;

use super::{DIM, batch, grads_for, reference_table, shard_settings, start, table_spec};

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

    shards[1].shutdown.trigger();
    while TcpStream::connect(&addrs[1]).await.is_ok() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
            client.push_tables_then_lookup(&pushed, &read).await
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
