//! A member's share of a round: the gradients of hot rows one step produced, how it
//! travels (in parts below the NATS message limit) and how the members' shares are summed
//! (in member order, so every member gets bitwise the same sum).

use std::collections::HashMap;

use anyhow::Context;
use primus_proto::packed::{decode_f32, decode_keys, encode_f32, encode_keys};
use primus_proto::v1::{HotRound, HotTableRows};
use primus_spec::job::TableSpec;

/// A NATS message stays below the server's default 1 MiB limit.
const MAX_MESSAGE_BYTES: usize = 512 << 10;
/// Keys and `dim` floats per key.
pub type Rows = (Vec<u64>, Vec<f32>);

/// One step's gradients of hot rows, per layout table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Share {
    pub tables: Vec<Rows>,
}

impl Share {
    pub(super) fn empty(tables: usize) -> Self {
        Self {
            tables: vec![(Vec::new(), Vec::new()); tables],
        }
    }

    /// No table has a row.
    pub(super) fn is_empty(&self) -> bool {
        self.tables.iter().all(|(keys, _)| keys.is_empty())
    }
}

/// Members' shares summed in the order given, keys in first-seen order: the same inputs
/// give bitwise the same sum on every member.
pub(super) fn sum_shares<'a>(
    tables: usize,
    shares: impl Iterator<Item = &'a Share> + Clone,
) -> Share {
    let mut summed = Share::empty(tables);
    for (t, (keys, grads)) in summed.tables.iter_mut().enumerate() {
        let mut slots: HashMap<u64, usize> = HashMap::new();
        for share in shares.clone() {
            let Some((share_keys, share_grads)) = share.tables.get(t) else {
                continue;
            };
            if share_keys.is_empty() {
                continue;
            }
            let dim = share_grads.len() / share_keys.len();
            for (key, grad) in share_keys.iter().zip(share_grads.chunks_exact(dim)) {
                match slots.get(key) {
                    Some(&slot) => {
                        for (sum, g) in grads[slot * dim..][..dim].iter_mut().zip(grad) {
                            *sum += g;
                        }
                    }
                    None => {
                        slots.insert(*key, keys.len());
                        keys.push(*key);
                        grads.extend_from_slice(grad);
                    }
                }
            }
        }
    }
    summed
}

pub(super) fn share_rows(share: &Share) -> Vec<HotTableRows> {
    share
        .tables
        .iter()
        .enumerate()
        .filter(|(_, (keys, _))| !keys.is_empty())
        .map(|(t, (keys, grads))| {
            let mut packed = Vec::new();
            encode_f32(grads, &mut packed);
            HotTableRows {
                table: t as u32,
                keys: encode_keys(keys),
                grads: packed,
            }
        })
        .collect()
}

/// Splits rows into messages of at most [`MAX_MESSAGE_BYTES`]; always at least one.
pub(super) fn chunk(rows: Vec<HotTableRows>, specs: &[TableSpec]) -> Vec<Vec<HotTableRows>> {
    let mut messages = vec![Vec::new()];
    let mut size = 0;
    for table in rows {
        let keys = table.keys.len() / 8;
        if keys == 0 {
            if let Some(message) = messages.last_mut() {
                message.push(table);
            }
            continue;
        }
        let dim = if table.grads.is_empty() {
            0
        } else {
            specs
                .get(table.table as usize)
                .map_or(0, |s| s.dim as usize)
        };
        let per_key = 8 + 4 * dim;
        let mut start = 0;
        while start < keys {
            let mut room = MAX_MESSAGE_BYTES.saturating_sub(size) / per_key;
            if room == 0 {
                messages.push(Vec::new());
                size = 0;
                room = (MAX_MESSAGE_BYTES / per_key).max(1);
            }
            let end = keys.min(start + room);
            let piece = HotTableRows {
                table: table.table,
                keys: table.keys[start * 8..end * 8].to_vec(),
                grads: if dim == 0 {
                    Vec::new()
                } else {
                    table.grads[start * dim * 4..end * dim * 4].to_vec()
                },
            };
            size += (end - start) * per_key;
            if let Some(message) = messages.last_mut() {
                message.push(piece);
            }
            start = end;
        }
    }
    messages
}

/// A member's share from its parts, checked against the model's tables.
pub(super) fn parse_share(parts: &[HotRound], specs: &[TableSpec]) -> anyhow::Result<Share> {
    parse_rows(parts.iter().flat_map(|p| &p.grads), specs)
}

/// A share from its tables' rows, checked against the model's tables.
pub(super) fn parse_rows<'a>(
    tables: impl IntoIterator<Item = &'a HotTableRows>,
    specs: &[TableSpec],
) -> anyhow::Result<Share> {
    let mut share = Share::empty(specs.len());
    for rows in tables {
        let t = rows.table as usize;
        let spec = specs
            .get(t)
            .with_context(|| format!("table {t} is not in the model"))?;
        let keys = decode_keys("hot-set keys", &rows.keys)?;
        let grads = decode_f32("hot-set gradients", &rows.grads)?;
        anyhow::ensure!(
            grads.len() == keys.len() * spec.dim as usize,
            "table {:?}: {} gradient floats for {} keys of dim {}",
            spec.name,
            grads.len(),
            keys.len(),
            spec.dim
        );
        share.tables[t].0.extend(keys);
        share.tables[t].1.extend(grads);
    }
    Ok(share)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use primus_embedding::HotRows;
    use primus_spec::job::OptimizerSpec;

    /// One table of dim 2: each key's gradient is (g, -g).
    pub(in crate::hot) fn share(rows: &[(u64, f32)]) -> Share {
        Share {
            tables: vec![(
                rows.iter().map(|r| r.0).collect(),
                rows.iter().flat_map(|r| [r.1, -r.1]).collect(),
            )],
        }
    }

    #[test]
    fn shares_sum_per_key_in_member_order() {
        let a = share(&[(1, 0.5), (2, 1.0)]);
        let b = share(&[(2, 0.25), (3, 2.0)]);
        let summed = sum_shares(1, [&a, &b].into_iter());
        assert_eq!(summed.tables[0].0, vec![1, 2, 3]);
        assert_eq!(summed.tables[0].1, vec![0.5, -0.5, 1.25, -1.25, 2.0, -2.0]);
    }

    /// Two members' replicas, each applying the sum of both shares every round, stay
    /// bitwise equal and within float rounding of Adagrad computed in f64.
    #[test]
    fn summed_rounds_match_an_fp64_adagrad_reference() {
        let (lr, initial, epsilon) = (0.05f64, 0.1f64, 1e-8f64);
        let spec = TableSpec::new(
            "t",
            2,
            OptimizerSpec::Adagrad {
                learning_rate: lr,
                initial_accumulator: initial,
                epsilon,
            },
        );
        let keys: Vec<u64> = (0..50).collect();
        let mut replicas = [
            HotRows::new(&spec).expect("replica"),
            HotRows::new(&spec).expect("replica"),
        ];
        let mut reference: HashMap<u64, ([f64; 2], [f64; 2])> = HashMap::new();
        for &key in &keys {
            let start = [key as f32 * 0.01, -(key as f32) * 0.02];
            for replica in &mut replicas {
                replica
                    .insert(key, &[start[0], start[1], initial as f32, initial as f32])
                    .expect("insert");
            }
            let w = [f64::from(start[0]), f64::from(start[1])];
            reference.insert(key, (w, [initial; 2]));
        }
        let mut state = 7u64;
        let mut draw = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for _ in 0..200 {
            let member = |draw: &mut dyn FnMut() -> f32| {
                let mut rows: Vec<(u64, f32)> = Vec::new();
                for &key in &keys {
                    if draw() > 0.0 {
                        rows.push((key, draw()));
                    }
                }
                share(&rows)
            };
            let shares = [member(&mut draw), member(&mut draw)];
            let summed = sum_shares(1, shares.iter());
            for replica in &mut replicas {
                replica
                    .apply(&summed.tables[0].0, &summed.tables[0].1)
                    .expect("apply");
            }
            let mut sums: HashMap<u64, [f64; 2]> = HashMap::new();
            for share in &shares {
                let (share_keys, grads) = &share.tables[0];
                for (key, g) in share_keys.iter().zip(grads.chunks_exact(2)) {
                    let sum = sums.entry(*key).or_default();
                    sum[0] += f64::from(g[0]);
                    sum[1] += f64::from(g[1]);
                }
            }
            for (key, g) in sums {
                let (w, acc) = reference.get_mut(&key).expect("reference row");
                for i in 0..2 {
                    acc[i] += g[i] * g[i];
                    w[i] -= lr * g[i] / (acc[i].sqrt() + epsilon);
                }
            }
        }
        for &key in &keys {
            let values = replicas[0].values(key).expect("read").expect("row");
            let other = replicas[1].values(key).expect("read").expect("row");
            assert_eq!(values, other, "key {key}");
            let (w, acc) = reference[&key];
            for i in 0..2 {
                let close = |got: f32, want: f64| {
                    (f64::from(got) - want).abs() <= 1e-4 * want.abs().max(1.0)
                };
                assert!(
                    close(values[i], w[i]),
                    "key {key} weight {i}: {} vs {}",
                    values[i],
                    w[i]
                );
                assert!(
                    close(values[2 + i], acc[i]),
                    "key {key} accumulator {i}: {} vs {}",
                    values[2 + i],
                    acc[i]
                );
            }
        }
    }

    #[test]
    fn a_large_share_travels_in_parts_that_reassemble_exactly() {
        let specs = vec![TableSpec::new("t", 16, OptimizerSpec::adagrad(0.1))];
        let keys: Vec<u64> = (0..30_000).collect();
        let grads: Vec<f32> = (0..30_000 * 16).map(|i| i as f32).collect();
        let original = Share {
            tables: vec![(keys, grads)],
        };
        let parts = chunk(share_rows(&original), &specs);
        assert!(parts.len() > 1, "{} parts", parts.len());
        let rounds: Vec<HotRound> = parts
            .into_iter()
            .map(|grads| {
                let size: usize = grads.iter().map(|g| g.keys.len() + g.grads.len()).sum();
                assert!(size <= MAX_MESSAGE_BYTES, "{size} bytes");
                HotRound {
                    grads,
                    ..HotRound::default()
                }
            })
            .collect();
        assert_eq!(parse_share(&rounds, &specs).expect("parse"), original);
    }

    #[test]
    fn a_share_with_the_wrong_width_is_refused() {
        let specs = vec![TableSpec::new("t", 4, OptimizerSpec::adagrad(0.1))];
        let round = HotRound {
            grads: vec![HotTableRows {
                table: 0,
                keys: encode_keys(&[1, 2]),
                grads: vec![0; 4 * 4],
            }],
            ..HotRound::default()
        };
        let error = parse_share(&[round], &specs).expect_err("refused");
        assert!(
            error.to_string().contains("4 gradient floats for 2 keys"),
            "{error}"
        );
    }
}
