//! CPU and memory use of this process (as executors report them in heartbeats) or of
//! another one (as the master's local backend measures its executors): Linux
//! `/proc/<pid>`; elsewhere, or for a process that is gone, both read as 0.

use std::time::Instant;

/// `/proc` reports CPU time in USER_HZ ticks, which Linux fixes at 100 per second.
const TICKS_PER_SECOND: f64 = 100.0;
const PAGE_BYTES: u64 = 4096;

/// Turns successive CPU-time readings of one process into cores in use.
pub struct UsageSampler {
    /// `self` or a pid: the process's folder under `/proc`.
    process: String,
    last: Option<(Instant, u64)>,
}

fn cpu_ticks(process: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{process}/stat")).ok()?;
    // Fields after the command name (which may hold spaces, hence the last ')').
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(user + system)
}

/// Resident memory of this process in bytes.
pub fn resident_bytes() -> u64 {
    resident_bytes_of("self")
}

fn resident_bytes_of(process: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{process}/statm"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * PAGE_BYTES)
}

impl UsageSampler {
    /// Starts measuring this process from now.
    pub fn new() -> Self {
        Self::of("self")
    }

    /// Starts measuring process `pid` from now.
    pub fn of_process(pid: u32) -> Self {
        Self::of(&pid.to_string())
    }

    fn of(process: &str) -> Self {
        Self {
            process: process.to_owned(),
            last: cpu_ticks(process).map(|t| (Instant::now(), t)),
        }
    }

    /// Resident memory of the measured process in bytes.
    pub fn resident_bytes(&self) -> u64 {
        resident_bytes_of(&self.process)
    }

    /// Cores used on average since the previous call (or since the sampler was made).
    pub fn cpu_cores(&mut self) -> f64 {
        let (Some(ticks), now) = (cpu_ticks(&self.process), Instant::now()) else {
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

    #[test]
    fn another_process_is_measured_by_its_pid() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep runs");
        let mut sampler = UsageSampler::of_process(child.id());
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            sampler.resident_bytes() > 0,
            "a running process has resident pages"
        );
        assert!(sampler.cpu_cores() < 0.5, "a sleeping process uses no CPU");
        child.kill().expect("kill");
        child.wait().expect("reaped");
        assert_eq!(
            sampler.resident_bytes(),
            0,
            "a process that is gone reads as 0"
        );
    }
}
