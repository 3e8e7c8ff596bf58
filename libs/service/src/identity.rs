//! Who a job's executor is: the job, its id, and the master that started it. Set in the
//! settings file, or else taken from the environment the master starts executors with.

use anyhow::Context;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorIdentity {
    pub job: String,
    pub executor_id: String,
    pub master_addr: String,
}

impl ExecutorIdentity {
    /// Each empty value falls back to `PRIMUS_JOB`, `PRIMUS_EXECUTOR_ID` or
    /// `PRIMUS_MASTER_ADDR`; `section` names the settings section in the error.
    pub fn resolve(
        section: &str,
        job: &str,
        executor_id: &str,
        master_addr: &str,
    ) -> anyhow::Result<Self> {
        let pick = |set: &str, key: &str, var: &str| -> anyhow::Result<String> {
            if !set.is_empty() {
                return Ok(set.to_owned());
            }
            std::env::var(var).with_context(|| format!("neither {section}.{key} nor {var} is set"))
        };
        Ok(Self {
            job: pick(job, "job", "PRIMUS_JOB")?,
            executor_id: pick(executor_id, "executor_id", "PRIMUS_EXECUTOR_ID")?,
            master_addr: pick(master_addr, "master_addr", "PRIMUS_MASTER_ADDR")?,
        })
    }
}
