//! Calls that carry several tables at once: one request per shard however many tables a
//! trainer's step touches, so the per-call cost (HTTP/2 stream, headers, spans, a task on
//! each side) is paid per shard rather than per table and shard.

use futures::future::{join_all, try_join_all};
use primus_proto::packed::{decode_f32, encode_f32, encode_keys};
use primus_proto::v1::{LookupRequest, LookupTablesRequest, PushRequest, PushTablesRequest};
use tonic::Status;

use crate::{PsClient, PsClientError, Refusals, Shards, is_moved, layout};

/// One table's keys in [`PsClient::lookup_tables`].
#[derive(Debug, Clone, Copy)]
pub struct TableKeys<'a> {
    /// The table.
    pub table: &'a str,
    /// Its keys (duplicates allowed).
    pub keys: &'a [u64],
}

/// One table's gradients in [`PsClient::push_tables`]: `dim` floats per key, in key order.
#[derive(Debug, Clone, Copy)]
pub struct TableGrads<'a> {
    /// The table.
    pub table: &'a str,
    /// Its keys.
    pub keys: &'a [u64],
    /// Their gradients.
    pub grads: &'a [f32],
}

/// A table's rows as [`PsClient::lookup_tables`] returns them: `dim` floats per key, in
/// request order (no rows and `dim` 0 for a table asked no keys).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableRows {
    /// Floats per row.
    pub dim: usize,
    /// The rows.
    pub rows: Vec<f32>,
}

/// Gradients of table `.0` (an index into the call's tables) still to push.
type Part = (usize, Vec<u64>, Vec<f32>);

impl PsClient {
    /// Rows of every table's keys, in the order of `tables`: like [`PsClient::lookup`]
    /// per table, with one call per shard for all of them.
    pub async fn lookup_tables(
        &self,
        tables: &[TableKeys<'_>],
    ) -> Result<Vec<TableRows>, PsClientError> {
        self.repeatable(|shards| lookup_tables_on(shards, tables))
            .await
    }

    /// Pushes every table's gradients: like [`PsClient::push`] per table, with one call
    /// per shard for all of them. Returns (applied, dropped) per table, in the order of
    /// `tables`. A shard refuses a call whole when any of its keys moved; that part alone
    /// is pushed again to the new shards, so every gradient is applied once.
    pub async fn push_tables(
        &self,
        tables: &[TableGrads<'_>],
    ) -> Result<Vec<(u64, u64)>, PsClientError> {
        let dims = (tables.iter())
            .map(|t| {
                row_width(t.keys.len(), t.grads.len()).ok_or(PsClientError::GradientWidth {
                    got: t.grads.len(),
                    keys: t.keys.len(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let names: Vec<&str> = tables.iter().map(|t| t.table).collect();
        let mut totals = vec![(0, 0); tables.len()];
        let mut refusals = Refusals::default();
        let mut pending: Option<Vec<Part>> = None;
        loop {
            let shards = self.current();
            let parts: Vec<(usize, &[u64], &[f32])> = match &pending {
                None => (tables.iter().enumerate())
                    .map(|(i, t)| (i, t.keys, t.grads))
                    .collect(),
                Some(left) => (left.iter())
                    .map(|(i, k, g)| (*i, k.as_slice(), g.as_slice()))
                    .collect(),
            };
            let refused = push_tables_on(&shards, &names, &dims, &parts, &mut totals).await;
            match refused {
                None => {
                    self.answered(&refusals);
                    return Ok(totals);
                }
                Some((error, left)) => {
                    self.follow_move(&shards, error, &mut refusals).await?;
                    pending = Some(left);
                }
            }
        }
    }
}

/// Floats per key, when `grads` floats are a whole row for each of `keys` keys.
fn row_width(keys: usize, grads: usize) -> Option<usize> {
    match keys {
        0 => (grads == 0).then_some(0),
        _ => grads.is_multiple_of(keys).then(|| grads / keys),
    }
}

async fn lookup_tables_on(
    shards: std::sync::Arc<Shards>,
    tables: &[TableKeys<'_>],
) -> Result<Vec<TableRows>, PsClientError> {
    let routes: Vec<_> = tables.iter().map(|t| shards.route(t.keys)).collect();
    let calls = (0..shards.clients.len()).filter_map(|shard| {
        let asked: Vec<usize> = (0..tables.len())
            .filter(|&t| !routes[t][shard].keys.is_empty())
            .collect();
        if asked.is_empty() {
            return None;
        }
        let request = LookupTablesRequest {
            tables: (asked.iter())
                .map(|&t| LookupRequest {
                    table: tables[t].table.to_owned(),
                    keys: encode_keys(&routes[t][shard].keys),
                })
                .collect(),
        };
        let mut client = shards.clients[shard].clone();
        Some(async move {
            let call = async {
                let answers = client.lookup_tables(request).await?.into_inner().tables;
                if answers.len() != asked.len() {
                    return Err(Status::internal(format!(
                        "{} tables answered for {} asked",
                        answers.len(),
                        asked.len()
                    )));
                }
                let rows = (answers.iter())
                    .map(|a| Ok((a.dim as usize, decode_f32("rows", &a.rows)?)))
                    .collect::<Result<Vec<_>, Status>>()?;
                Ok((shard, asked, rows))
            };
            call.await
                .map_err(|status| PsClientError::Call { shard, status })
        })
    });
    let mut out = vec![TableRows::default(); tables.len()];
    for (shard, asked, answers) in try_join_all(calls).await? {
        for (t, (dim, rows)) in asked.into_iter().zip(answers) {
            let table = &mut out[t];
            if table.rows.is_empty() {
                *table = TableRows {
                    dim,
                    rows: vec![0.0; tables[t].keys.len() * dim],
                };
            }
            if dim != table.dim || rows.len() != routes[t][shard].keys.len() * dim {
                let status = Status::internal(format!(
                    "table {:?}: {} floats of width {dim} for {} keys (width {} elsewhere)",
                    tables[t].table,
                    rows.len(),
                    routes[t][shard].keys.len(),
                    table.dim
                ));
                return Err(PsClientError::Call { shard, status });
            }
            for &(position, index) in &routes[t][shard].positions {
                table.rows[position * dim..(position + 1) * dim]
                    .copy_from_slice(&rows[index * dim..(index + 1) * dim]);
            }
        }
    }
    Ok(out)
}

/// Pushes `parts` over `shards`, adding what each table's pushes applied and dropped to
/// `totals`; `None` when every part was applied, else the first error and the parts to push
/// again (none unless the error is a move).
async fn push_tables_on(
    shards: &Shards,
    names: &[&str],
    dims: &[usize],
    parts: &[(usize, &[u64], &[f32])],
    totals: &mut [(u64, u64)],
) -> Option<(PsClientError, Vec<Part>)> {
    let n = shards.count();
    let mut per_shard: Vec<Vec<Part>> = (0..n).map(|_| Vec::new()).collect();
    for &(t, keys, grads) in parts {
        let dim = dims[t];
        let mut split: Vec<Part> = (0..n).map(|_| (t, Vec::new(), Vec::new())).collect();
        for (position, key) in keys.iter().enumerate() {
            let (_, shard_keys, shard_grads) = &mut split[layout::key_shard(*key, n) as usize];
            shard_keys.push(*key);
            shard_grads.extend_from_slice(&grads[position * dim..(position + 1) * dim]);
        }
        for (shard, part) in split.into_iter().enumerate() {
            if !part.1.is_empty() {
                per_shard[shard].push(part);
            }
        }
    }
    let calls = (per_shard.into_iter().enumerate())
        .filter(|(_, shard_parts)| !shard_parts.is_empty())
        .map(|(shard, shard_parts)| {
            let request = PushTablesRequest {
                tables: (shard_parts.iter())
                    .map(|(t, keys, grads)| {
                        let mut packed = Vec::with_capacity(grads.len() * 4);
                        encode_f32(grads, &mut packed);
                        PushRequest {
                            table: names[*t].to_owned(),
                            keys: encode_keys(keys),
                            grads: packed,
                        }
                    })
                    .collect(),
            };
            let mut client = shards.clients[shard].clone();
            async move {
                let answer = client.push_tables(request).await;
                (shard, answer.map(tonic::Response::into_inner), shard_parts)
            }
        });
    let mut refused: Option<(PsClientError, Vec<Part>)> = None;
    let mut failed = None;
    for (shard, answer, shard_parts) in join_all(calls).await {
        match answer {
            Ok(response) if response.tables.len() == shard_parts.len() => {
                for ((t, _, _), pushed) in shard_parts.iter().zip(&response.tables) {
                    totals[*t].0 += pushed.applied;
                    totals[*t].1 += pushed.dropped + pushed.refused;
                }
            }
            Ok(response) => {
                let status = Status::internal(format!(
                    "{} tables answered for {} pushed",
                    response.tables.len(),
                    shard_parts.len()
                ));
                failed = failed.or(Some(PsClientError::Call { shard, status }));
            }
            Err(status) if is_moved(&status) => {
                refused
                    .get_or_insert_with(|| (PsClientError::Call { shard, status }, Vec::new()))
                    .1
                    .extend(shard_parts);
            }
            Err(status) => failed = failed.or(Some(PsClientError::Call { shard, status })),
        }
    }
    match failed {
        // Not a move: the caller fails as a whole.
        Some(error) => Some((error, Vec::new())),
        None => refused,
    }
}
