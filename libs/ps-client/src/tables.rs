//! Calls that carry several tables at once: one request per shard however many tables a
//! trainer's step touches, so the per-call cost (HTTP/2 stream, headers, spans, a task on
//! each side) is paid per shard rather than per table and shard.

use futures::future::{join_all, try_join_all};
use primus_proto::packed::{decode_f32, encode_f32, encode_keys};
use primus_proto::v1::{
    LookupRequest, LookupResponse, LookupTablesRequest, PushRequest, PushTablesRequest,
};
use tonic::Status;

use crate::{PsClient, PsClientError, Refusals, Route, Shards, is_moved, is_unreachable, layout};

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

/// A [`Part`] borrowed.
type PartRef<'a> = (usize, &'a [u64], &'a [f32]);

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
        Ok(self.push_tables_then_lookup(tables, &[], 0).await?.0)
    }

    /// [`PsClient::push_tables`], then the rows of `then_lookup` as
    /// [`PsClient::lookup_tables`] would give them once the push is applied, read by the
    /// same calls. After a move the rows are looked up by a call of their own. A nonzero
    /// `minibatch` identity is applied once per shard (see `PushTablesRequest`): a shard
    /// that applied it already answers without applying it again.
    pub async fn push_tables_then_lookup(
        &self,
        tables: &[TableGrads<'_>],
        then_lookup: &[TableKeys<'_>],
        minibatch: u64,
    ) -> Result<(Vec<(u64, u64)>, Vec<TableRows>), PsClientError> {
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
            let (parts, reads): (Vec<PartRef<'_>>, &[TableKeys<'_>]) = match &pending {
                None => (
                    (tables.iter().enumerate())
                        .map(|(i, t)| (i, t.keys, t.grads))
                        .collect(),
                    then_lookup,
                ),
                Some(left) => (
                    (left.iter())
                        .map(|(i, k, g)| (*i, k.as_slice(), g.as_slice()))
                        .collect(),
                    &[],
                ),
            };
            let pushes = Pushes {
                names: &names,
                dims: &dims,
                parts: &parts,
                minibatch,
            };
            match push_tables_on(&shards, &pushes, reads, &mut totals).await {
                Ok(rows) => {
                    self.answered(&refusals);
                    let rows = match pending {
                        None => rows,
                        // Read after the part pushed again, by a call of its own.
                        Some(_) => self.lookup_tables(then_lookup).await?,
                    };
                    return Ok((totals, rows));
                }
                Err((error, left)) => {
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
    let reads = Reads::route(&shards, tables);
    let calls = (0..shards.clients.len()).filter_map(|shard| {
        let (asked, lookups) = reads.on_shard(shard);
        if asked.is_empty() {
            return None;
        }
        let request = LookupTablesRequest { tables: lookups };
        let mut client = shards.clients[shard].clone();
        Some(async move {
            let call = async {
                let answers = client.lookup_tables(request).await?.into_inner().tables;
                let rows = decode_rows(&answers, asked.len())?;
                Ok((shard, asked, rows))
            };
            call.await
                .map_err(|status| PsClientError::Call { shard, status })
        })
    });
    let mut out = vec![TableRows::default(); tables.len()];
    for (shard, asked, answers) in try_join_all(calls).await? {
        reads.place(&mut out, shard, asked, answers)?;
    }
    Ok(out)
}

/// Several tables' keys routed to the shards that hold them.
struct Reads<'a, 'b> {
    tables: &'a [TableKeys<'b>],
    routes: Vec<Vec<Route>>,
}

impl<'a, 'b> Reads<'a, 'b> {
    fn route(shards: &Shards, tables: &'a [TableKeys<'b>]) -> Self {
        let routes = tables.iter().map(|t| shards.route(t.keys)).collect();
        Self { tables, routes }
    }

    /// The tables that ask `shard` for keys (indices into the call's tables), with their
    /// requests.
    fn on_shard(&self, shard: usize) -> (Vec<usize>, Vec<LookupRequest>) {
        let asked: Vec<usize> = (0..self.tables.len())
            .filter(|&t| !self.routes[t][shard].keys.is_empty())
            .collect();
        let requests = (asked.iter())
            .map(|&t| LookupRequest {
                table: self.tables[t].table.to_owned(),
                keys: encode_keys(&self.routes[t][shard].keys).into(),
            })
            .collect();
        (asked, requests)
    }

    /// Copies `shard`'s answers for the tables `asked` into their request positions.
    fn place(
        &self,
        out: &mut [TableRows],
        shard: usize,
        asked: Vec<usize>,
        answers: Vec<(usize, Vec<f32>)>,
    ) -> Result<(), PsClientError> {
        for (t, (dim, rows)) in asked.into_iter().zip(answers) {
            let route = &self.routes[t][shard];
            let table = &mut out[t];
            if table.rows.is_empty() {
                *table = TableRows {
                    dim,
                    rows: vec![0.0; self.tables[t].keys.len() * dim],
                };
            }
            if dim != table.dim || rows.len() != route.keys.len() * dim {
                let status = Status::internal(format!(
                    "table {:?}: {} floats of width {dim} for {} keys (width {} elsewhere)",
                    self.tables[t].table,
                    rows.len(),
                    route.keys.len(),
                    table.dim
                ));
                return Err(PsClientError::Call { shard, status });
            }
            for &(position, index) in &route.positions {
                table.rows[position * dim..(position + 1) * dim]
                    .copy_from_slice(&rows[index * dim..(index + 1) * dim]);
            }
        }
        Ok(())
    }
}

/// Each answered table's width and rows, when a shard answered each of `asked` tables.
fn decode_rows(answers: &[LookupResponse], asked: usize) -> Result<Vec<(usize, Vec<f32>)>, Status> {
    if answers.len() != asked {
        return Err(Status::internal(format!(
            "{} tables answered for {asked} asked",
            answers.len()
        )));
    }
    (answers.iter())
        .map(|a| Ok((a.dim as usize, decode_f32("rows", &a.rows)?)))
        .collect()
}

/// Gradients to push: table `names` and row widths (`dims`) by the call's table index, and
/// the parts still to push.
struct Pushes<'a> {
    names: &'a [&'a str],
    dims: &'a [usize],
    parts: &'a [PartRef<'a>],
    minibatch: u64,
}

impl Pushes<'_> {
    /// The parts split by the shard that holds each key, over `n` shards.
    fn per_shard(&self, n: u32) -> Vec<Vec<Part>> {
        let mut per_shard: Vec<Vec<Part>> = (0..n).map(|_| Vec::new()).collect();
        for &(t, keys, grads) in self.parts {
            let dim = self.dims[t];
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
        per_shard
    }

    fn requests(&self, parts: &[Part]) -> Vec<PushRequest> {
        (parts.iter())
            .map(|(t, keys, grads)| {
                let mut packed = Vec::with_capacity(grads.len() * 4);
                encode_f32(grads, &mut packed);
                PushRequest {
                    table: self.names[*t].to_owned(),
                    keys: encode_keys(keys).into(),
                    grads: packed.into(),
                }
            })
            .collect()
    }
}

/// Pushes `pushes` over `shards`, adding what each table's pushes applied and dropped to
/// `totals`, and reads `then_lookup` after them in the same calls. Fails with the first
/// error and the parts to push again (none unless the error is a move).
async fn push_tables_on(
    shards: &Shards,
    pushes: &Pushes<'_>,
    then_lookup: &[TableKeys<'_>],
    totals: &mut [(u64, u64)],
) -> Result<Vec<TableRows>, (PsClientError, Vec<Part>)> {
    let reads = Reads::route(shards, then_lookup);
    let calls = (pushes.per_shard(shards.count()).into_iter().enumerate())
        .map(|(shard, shard_parts)| (shard, shard_parts, reads.on_shard(shard)))
        .filter(|(_, shard_parts, (asked, _))| !shard_parts.is_empty() || !asked.is_empty())
        .map(|(shard, shard_parts, (asked, lookups))| {
            let request = PushTablesRequest {
                tables: pushes.requests(&shard_parts),
                then_lookup: lookups,
                minibatch: pushes.minibatch,
            };
            let mut client = shards.clients[shard].clone();
            async move {
                let answer = client.push_tables(request).await;
                (
                    shard,
                    answer.map(tonic::Response::into_inner),
                    shard_parts,
                    asked,
                )
            }
        });
    let mut out = vec![TableRows::default(); then_lookup.len()];
    let mut refused: Option<(PsClientError, Vec<Part>)> = None;
    let mut failed = None;
    for (shard, answer, shard_parts, asked) in join_all(calls).await {
        match answer {
            Ok(response) if response.tables.len() == shard_parts.len() => {
                for ((t, _, _), pushed) in shard_parts.iter().zip(&response.tables) {
                    totals[*t].0 += pushed.applied;
                    totals[*t].1 += pushed.dropped + pushed.refused;
                }
                let placed = decode_rows(&response.looked_up, asked.len())
                    .map_err(|status| PsClientError::Call { shard, status })
                    .and_then(|rows| reads.place(&mut out, shard, asked, rows));
                if let Err(e) = placed {
                    failed = failed.or(Some(e));
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
            Err(status) if is_moved(&status) || is_unreachable(&status) => {
                refused
                    .get_or_insert_with(|| (PsClientError::Call { shard, status }, Vec::new()))
                    .1
                    .extend(shard_parts);
            }
            Err(status) => failed = failed.or(Some(PsClientError::Call { shard, status })),
        }
    }
    match (failed, refused) {
        // Not a move: the caller fails as a whole.
        (Some(error), _) => Err((error, Vec::new())),
        (None, Some(refused)) => Err(refused),
        (None, None) => Ok(out),
    }
}
