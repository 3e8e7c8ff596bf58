//! Who a job's executor is: the job, its id, and the master that started it. Set in the
//! settings file, or else taken from the environment the master starts executors with.

use anyhow::Context;

/// Who a Job's executor is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorIdentity {
    /// The Job.
    pub job: String,
    /// This executor's id (`trainer-0`).
    pub executor_id: String,
    /// The master's gRPC address.
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
            setting_or_env(set, var)
                .with_context(|| format!("neither {section}.{key} nor {var} is set"))
        };
        Ok(Self {
            job: pick(job, "job", "PRIMUS_JOB")?,
            executor_id: pick(executor_id, "executor_id", "PRIMUS_EXECUTOR_ID")?,
            master_addr: pick(master_addr, "master_addr", "PRIMUS_MASTER_ADDR")?,
        })
    }
}

/// `setting` when it is set (not empty), else the environment variable `var` the master
/// starts executors with (`PRIMUS_JOB`, `PRIMUS_EXECUTOR_ID`, `PRIMUS_MASTER_ADDR`).
#[expect(
    clippy::disallowed_methods,
    reason = "the identity variables the master starts executors with"
)]
pub fn setting_or_env(setting: &str, var: &str) -> Option<String> {
    Some(setting.to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var(var).ok())
}
