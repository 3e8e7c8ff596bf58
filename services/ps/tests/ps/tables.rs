//! Several tables in one call: answers and effects equal one call per table, and a push
//! with one bad table applies nothing.

use primus_embedding::Table;
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{LookupRequest, PushRequest, PushTablesRequest, StatsRequest};
use primus_ps_client::{TableGrads, TableKeys, TableRows};
use primus_testkit::NatsServer;
use tonic::Code;

use super::{
    DIM, batch, floats, grads_for, raw_client, reference_table, start_shard, table_spec,
    three_shards,
};

fn expected_rows(table: &Table, keys: &[u64]) -> TableRows {
    let mut rows = vec![0.0; keys.len() * DIM];
    table.lookup(keys, &mut rows).expect("reference lookup");
    let dim = if keys.is_empty() { 0 } else { DIM };
    TableRows { dim, rows }
}

#[tokio::test(flavor = "multi_thread")]
async fn several_tables_in_one_call_answer_like_one_call_each() {
    let nats = NatsServer::start().expect("nats-server");
    let (shards, client) = three_shards(&nats).await;
    let (items, users) = (reference_table("items"), reference_table("users"));

    for step in 0..20 {
        let (item_keys, user_keys) = (batch(step, 211), batch(step + 500, 97));
        let (item_grads, user_grads) = (
            grads_for(step, item_keys.len()),
            grads_for(step + 1, user_keys.len()),
        );
        // The same table twice in one call: its parts apply in order; the rows read after
        // (some pushed in this call, some not) see every part.
        let (first, second) = item_keys.split_at(100);
        let read_after: Vec<u64> = (item_keys.iter().step_by(3).copied())
            .chain(batch(step + 3_000, 40))
            .collect();
        let (pushed, read) = client
            .push_tables_then_lookup(
                &[
                    TableGrads {
                        table: "items",
                        keys: first,
                        grads: &item_grads[..100 * DIM],
                    },
                    TableGrads {
                        table: "users",
                        keys: &user_keys,
                        grads: &user_grads,
                    },
                    TableGrads {
                        table: "items",
                        keys: second,
                        grads: &item_grads[100 * DIM..],
                    },
                ],
                &[
                    TableKeys {
                        table: "items",
                        keys: &read_after,
                    },
                    TableKeys {
                        table: "users",
                        keys: &[],
                    },
                ],
                step + 1,
            )
            .await
            .expect("push tables");
        assert_eq!(
            pushed,
            vec![(100, 0), (user_keys.len() as u64, 0), (111, 0)],
            "applied per table, in request order"
        );
        items.push(&item_keys, &item_grads, 1).expect("reference");
        users.push(&user_keys, &user_grads, 1).expect("reference");
        let expected = vec![
            expected_rows(&items, &read_after),
            expected_rows(&users, &[]),
        ];
        assert_eq!(read, expected, "rows read after the push of step {step}");

        let (item_probe, user_probe) = (batch(step + 1_000, 300), batch(step + 2_000, 50));
        let looked_up = client
            .lookup_tables(&[
                TableKeys {
                    table: "users",
                    keys: &user_probe,
                },
                TableKeys {
                    table: "items",
                    keys: &[],
                },
                TableKeys {
                    table: "items",
                    keys: &item_probe,
                },
            ])
            .await
            .expect("lookup tables");
        let expected = vec![
            expected_rows(&users, &user_probe),
            expected_rows(&items, &[]),
            expected_rows(&items, &item_probe),
        ];
        assert_eq!(looked_up, expected, "step {step}");
        let (single, _) = client.lookup("items", &item_probe).await.expect("lookup");
        assert_eq!(single, expected[2].rows);
    }
    assert!(client.lookup_tables(&[]).await.expect("nothing").is_empty());
    let ragged = client
        .push_tables(&[TableGrads {
            table: "items",
            keys: &[1, 2],
            grads: &[0.1; 5],
        }])
        .await
        .expect_err("not a whole row per key");
    assert!(
        ragged.to_string().contains("5 gradient floats for 2 keys"),
        "{ragged}"
    );
    for shard in shards {
        shard.shutdown.trigger();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_push_of_several_tables_with_one_bad_table_applies_none() {
    let nats = NatsServer::start().expect("nats-server");
    let shard = start_shard(&nats, vec![table_spec("items"), table_spec("users")]).await;
    let mut raw = ParameterServerClient::connect(format!("http://{}", shard.addr))
        .await
        .expect("connect");
    let keys: Vec<u8> = [1u64, 2].iter().flat_map(|k| k.to_le_bytes()).collect();
    let good = PushRequest {
        table: "items".into(),
        keys: keys.clone().into(),
        grads: floats(&[0.1; 2 * DIM]).into(),
    };
    let mut nan = vec![0.1f32; 2 * DIM];
    nan[DIM] = f32::NAN;
    let cases = [
        (
            PushRequest {
                table: "users".into(),
                keys: keys.clone().into(),
                grads: floats(&nan).into(),
            },
            "tables[1]",
        ),
        (
            PushRequest {
                table: "users".into(),
                keys: keys.clone().into(),
                grads: floats(&[0.1; DIM]).into(),
            },
            "tables[1]",
        ),
        (
            PushRequest {
                table: "nope".into(),
                keys: keys.clone().into(),
                grads: floats(&[0.1; 2 * DIM]).into(),
            },
            "\"nope\" is not held",
        ),
        (
            PushRequest {
                table: "users".into(),
                keys: vec![1u8, 2, 3].into(),
                grads: floats(&[0.1; 2 * DIM]).into(),
            },
            "tables[1].keys",
        ),
    ];
    for (bad, names) in cases {
        let request = PushTablesRequest {
            tables: vec![good.clone(), bad],
            then_lookup: Vec::new(),
            minibatch: 0,
        };
        let status = raw.push_tables(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(names), "{status:?}");
    }
    // A bad read after the push refuses the push too.
    let bad_reads = [
        (vec![1, 2, 3], "users", "then_lookup[0].keys"),
        (keys.clone(), "nope", "\"nope\" is not held"),
    ];
    for (read_keys, table, names) in bad_reads {
        let request = PushTablesRequest {
            tables: vec![good.clone()],
            then_lookup: vec![LookupRequest {
                table: table.into(),
                keys: read_keys.into(),
            }],
            minibatch: 0,
        };
        let status = raw.push_tables(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(names), "{status:?}");
    }
    let stats = raw
        .stats(StatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    for table in stats.tables {
        assert_eq!(table.rows, 0, "table {} changed", table.table);
    }
    // The good part alone is applied.
    let request = PushTablesRequest {
        tables: vec![good],
        then_lookup: Vec::new(),
        minibatch: 0,
    };
    let pushed = raw.push_tables(request).await.expect("push").into_inner();
    assert_eq!(pushed.tables.len(), 1);
    assert_eq!(pushed.tables[0].applied, 2);
    assert!(pushed.looked_up.is_empty());
    shard.shutdown.trigger();
}

/// A minibatch pushed again under the same identity (served again after its trainer
/// died, or retried after its answer was lost) changes the rows once, still reads the
/// rows asked for, and is answered `repeated`; a failed push leaves its identity free.
#[tokio::test(flavor = "multi_thread")]
async fn a_minibatch_pushed_twice_is_applied_once() {
    let nats = NatsServer::start().expect("nats-server");
    let shard = start_shard(&nats, vec![table_spec("items")]).await;
    let mut raw = raw_client(&shard.addr).await;
    let keys: Vec<u8> = [1u64, 2].iter().flat_map(|k| k.to_le_bytes()).collect();
    let push = |grads: Vec<u8>, minibatch| PushTablesRequest {
        tables: vec![PushRequest {
            table: "items".into(),
            keys: keys.clone().into(),
            grads: grads.into(),
        }],
        then_lookup: vec![LookupRequest {
            table: "items".into(),
            keys: keys.clone().into(),
        }],
        minibatch,
    };
    let mut nan = vec![0.1f32; 2 * DIM];
    nan[0] = f32::NAN;
    let refused = raw.push_tables(push(floats(&nan), 7)).await;
    assert_eq!(refused.expect_err("NaN").code(), Code::InvalidArgument);

    let first = (raw.push_tables(push(floats(&[0.1; 2 * DIM]), 7)).await)
        .expect("first push")
        .into_inner();
    assert!(!first.repeated, "the refused push left the identity free");
    assert_eq!(first.tables[0].applied, 2);
    let again = (raw.push_tables(push(floats(&[0.1; 2 * DIM]), 7)).await)
        .expect("the push again")
        .into_inner();
    assert!(again.repeated);
    assert_eq!(again.tables[0].applied, 0);
    assert_eq!(again.looked_up, first.looked_up, "the rows, changed once");
    let other = (raw.push_tables(push(floats(&[0.1; 2 * DIM]), 8)).await)
        .expect("another minibatch")
        .into_inner();
    assert!(!other.repeated);
    assert_ne!(other.looked_up, first.looked_up);
    let unnamed = (raw.push_tables(push(floats(&[0.1; 2 * DIM]), 0)).await)
        .expect("no identity")
        .into_inner();
    let again = (raw.push_tables(push(floats(&[0.1; 2 * DIM]), 0)).await)
        .expect("no identity again")
        .into_inner();
    assert!(!unnamed.repeated && !again.repeated && unnamed.looked_up != again.looked_up);
    shard.shutdown.trigger();
}
