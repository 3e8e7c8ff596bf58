//! The process's own CPU and memory use, as executors report them in heartbeats (Linux
//! `/proc/self`; elsewhere both read as 0).

use std::time::Instant;

/// `/proc` reports CPU time in USER_HZ ticks, which Linux fixes at 100 per second.
const TICKS_PER_SECOND: f64 = 100.0;
const PAGE_BYTES: u64 = 4096;

/// Turns successive CPU-time readings into cores in use.
pub struct UsageSampler {
    last: Option<(Instant, u64)>,
}

fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces, hence the last ')').
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(user + system)
}

/// Resident memory of this process in bytes.
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * PAGE_BYTES)
}

impl UsageSampler {
    /// Starts measuring from now.
    pub fn new() -> Self {
        Self {
            last: cpu_ticks().map(|t| (Instant::now(), t)),
        }
    }

    /// Cores used on average since the previous call (or since `new`).
    pub fn cpu_cores(&mut self) -> f64 {
        let (Some(ticks), now) = (cpu_ticks(), Instant::now()) else {
            return 0.0;
        };
        let cores = match self.last {
            Some((then, before)) => {
                let wall = now.duration_since(then).as_secs_f64();
                if wall > 0.0 {
                    ticks.saturating_sub(before) as f64 / TICKS_PER_SECOND / wall
                } else {
                    0.0
                }
            }
            None => 0.0,
        };
        self.last = Some((now, ticks));
        cores
    }
}

impl Default for UsageSampler {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_loop_shows_up_as_cpu_and_memory_is_resident() {
        let mut sampler = UsageSampler::new();
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed().as_millis() < 300 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let cores = sampler.cpu_cores();
        assert!(cores > 0.3, "busy loop measured as {cores} cores");
        assert!(resident_bytes() > 1 << 20);
    }
}
