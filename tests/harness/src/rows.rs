//! Every row a training PS shard or a serving replica holds, read whole, so tests compare
//! them bit for bit.

use std::collections::HashMap;

use primus_proto::packed::{decode_f32, decode_keys};
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::{DumpRowsRequest, ExportDeltaRequest, TableDelta};

/// Every row of every table, by (table, key): (version, the row's f32 bits).
pub type Rows = HashMap<(String, u64), (u64, Vec<u32>)>;

/// Adds the rows of `tables` (a delta or a dump) to `into`.
pub fn rows_of(tables: &[TableDelta], into: &mut Rows) {
    for table in tables {
        let dim = table.dim as usize;
        let keys = decode_keys("keys", &table.keys).expect("whole keys");
        let versions = decode_keys("versions", &table.versions).expect("whole versions");
        let floats = decode_f32("rows", &table.rows).expect("whole rows");
        for (i, key) in keys.into_iter().enumerate() {
            let bits = floats[i * dim..(i + 1) * dim]
                .iter()
                .map(|f| f.to_bits())
                .collect();
            into.insert((table.table.clone(), key), (versions[i], bits));
        }
    }
}

/// Every row of the training PS shard at `addr` (host:port), with each row's update count
/// when `update_counts`.
async fn export_all(addr: &str, update_counts: bool) -> Vec<TableDelta> {
    let mut client = ParameterServerClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the PS shard")
        .max_decoding_message_size(usize::MAX);
    client
        .export_delta(ExportDeltaRequest {
            since_version: 0,
            update_counts,
        })
        .await
        .expect("export")
        .into_inner()
        .tables
}

/// Every row of the training PS shard at `addr` (host:port).
pub async fn training_rows(addr: &str) -> Rows {
    let mut rows = Rows::new();
    rows_of(&export_all(addr, false).await, &mut rows);
    rows
}

/// How many pushes each row of the training PS shard at `addr` (host:port) was updated
/// by, by (table, key).
pub async fn update_counts(addr: &str) -> HashMap<(String, u64), u64> {
    let mut counts = HashMap::new();
    for table in export_all(addr, true).await {
        let keys = decode_keys("keys", &table.keys).expect("whole keys");
        let updates = decode_keys("update_counts", &table.update_counts).expect("whole counts");
        for (key, updates) in keys.into_iter().zip(updates) {
            counts.insert((table.table.clone(), key), updates);
        }
    }
    counts
}

/// Every row of the serving replica at `addr` (host:port).
pub async fn replica_rows(addr: &str) -> Rows {
    let mut client = ServingServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the serving replica")
        .max_decoding_message_size(usize::MAX);
    let dump = client
        .dump_rows(DumpRowsRequest {})
        .await
        .expect("dump")
        .into_inner();
    let mut rows = Rows::new();
    rows_of(&dump.tables, &mut rows);
    rows
}
