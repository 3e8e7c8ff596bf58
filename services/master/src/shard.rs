//! Sharded masters (`master.shard = "i/n"`): which Jobs this master drives.

/// This master's shard `(i, n)` of `master.shard`, or why it is not one.
pub(crate) fn parse_shard(text: &str) -> Result<(u32, u32), String> {
    let parsed = text
        .split_once('/')
        .and_then(|(i, n)| Some((i.trim().parse().ok()?, n.trim().parse().ok()?)));
    match parsed {
        Some((i, n)) if n > 0 && i < n => Ok((i, n)),
        _ => Err(format!(
            "master.shard {text:?} must be `i/n` with 0 <= i < n (e.g. 0/1, 2/4)"
        )),
    }
}

/// Whether a job belongs to shard `i` of `n` (CRC-32 of its name, stable across restarts).
pub(crate) fn owns_job(shard: (u32, u32), job: &str) -> bool {
    crc32fast::hash(job.as_bytes()) % shard.1 == shard.0
}
