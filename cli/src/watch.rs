//! `primus watch KIND [NAME]`: the current state, then every change as it happens.
//!
//! A watched Job ends the command when it reaches a final phase (exit 0 if Succeeded, 1
//! otherwise); a deleted resource ends it with 0. A dropped stream (an API server restart)
//! resumes from the last version seen; a version the server no longer holds re-reads the
//! current state first. On a terminal, a Job with progress is shown as a progress bar.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use primus_api_client::{ApiClient, ClientError};
use primus_proto::v1::{EventType, Resource, ResourceEvent};
use primus_spec::Kind;
use primus_spec::status::{Phase, Status};
use tonic::Code;

use crate::Failure;

/// Reconnection attempts after a dropped stream before giving up.
const RECONNECT_ATTEMPTS: u32 = 30;
const RECONNECT_DELAY: Duration = Duration::from_secs(1);
const BAR_STEPS: u64 = 1000;

pub async fn watch(client: &ApiClient, kind: Kind, name: Option<&str>) -> Result<(), Failure> {
    let mut view = View::new(kind, name);
    let mut since = view.show_current(client).await?;
    let mut failures = 0;
    loop {
        let mut stream = match client.watch(Some(kind), name, since).await {
            Ok(stream) => stream,
            Err(e) => {
                since = recover(client, &mut view, e, since, &mut failures).await?;
                continue;
            }
        };
        loop {
            let next = tokio::select! {
                next = stream.message() => next,
                _ = tokio::signal::ctrl_c() => {
                    view.finish();
                    return Ok(());
                }
            };
            match next {
                Ok(Some(event)) => {
                    failures = 0;
                    since = event
                        .resource
                        .as_ref()
                        .map_or(since, |r| r.resource_version);
                    if let Some(end) = view.show_event(&event) {
                        view.finish();
                        return end;
                    }
                }
                Ok(None) => {
                    since =
                        recover(client, &mut view, stream_ended(), since, &mut failures).await?;
                    break;
                }
                Err(status) => {
                    let error = ClientError::Status(status);
                    since = recover(client, &mut view, error, since, &mut failures).await?;
                    break;
                }
            }
        }
    }
}

fn stream_ended() -> ClientError {
    ClientError::Status(tonic::Status::unavailable("the watch stream ended"))
}

/// Decides how to go on after a failed or ended stream; returns the version to resume from.
async fn recover(
    client: &ApiClient,
    view: &mut View,
    error: ClientError,
    since: u64,
    failures: &mut u32,
) -> Result<u64, Failure> {
    match error.code() {
        Some(Code::OutOfRange) => {
            view.note("history trimmed; reading the current state again");
            view.show_current(client).await
        }
        Some(Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled) | None
            if *failures < RECONNECT_ATTEMPTS =>
        {
            *failures += 1;
            if *failures == 1 {
                view.note(&format!("{error}; reconnecting from version {since}"));
            }
            tokio::time::sleep(RECONNECT_DELAY).await;
            Ok(since)
        }
        _ => {
            view.finish();
            Err(error.into())
        }
    }
}

/// What the watch shows: a line per change, or a progress bar for one Job on a terminal.
struct View {
    kind: Kind,
    name: Option<String>,
    bar: Option<ProgressBar>,
}

impl View {
    fn new(kind: Kind, name: Option<&str>) -> Self {
        let bar =
            (kind == Kind::Job && name.is_some() && std::io::stderr().is_terminal()).then(|| {
                let bar = ProgressBar::new(BAR_STEPS);
                let style = ProgressStyle::with_template("{prefix} [{bar:40}] {percent:>3}% {msg}")
                    .map(|s| s.progress_chars("=> "))
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
                bar.set_style(style);
                bar
            });
        Self {
            kind,
            name: name.map(str::to_owned),
            bar,
        }
    }

    /// Shows the current state; returns the version to watch from.
    async fn show_current(&mut self, client: &ApiClient) -> Result<u64, Failure> {
        match &self.name {
            Some(name) => {
                let resource = client.get(self.kind, name).await?;
                self.show(&resource, "CURRENT");
                Ok(resource.resource_version)
            }
            None => {
                let list = client.list(self.kind, Default::default()).await?;
                for resource in &list.resources {
                    self.show(resource, "CURRENT");
                }
                Ok(list.resource_version)
            }
        }
    }

    /// Shows a change; `Some` ends the watch with that result.
    fn show_event(&mut self, event: &ResourceEvent) -> Option<Result<(), Failure>> {
        let resource = event.resource.as_ref()?;
        let label = match EventType::try_from(event.r#type) {
            Ok(EventType::Added) => "ADDED",
            Ok(EventType::Modified) => "MODIFIED",
            Ok(EventType::Deleted) => "DELETED",
            Ok(EventType::Appended) => "APPENDED",
            _ => "CHANGED",
        };
        self.show(resource, label);
        self.name.as_ref()?;
        if label == "DELETED" {
            return Some(Ok(()));
        }
        if self.kind != Kind::Job {
            return None;
        }
        let status: Status = serde_json::from_str(&resource.status_json).ok()?;
        match status.phase {
            Phase::Succeeded => Some(Ok(())),
            phase if phase.is_terminal() => {
                let reason = status
                    .conditions
                    .last()
                    .map(|c| format!(": {} {}", c.reason, c.message))
                    .unwrap_or_default();
                Some(Err(Failure::server(anyhow::anyhow!(
                    "job {} ended {phase:?}{reason}",
                    resource.name
                ))))
            }
            _ => None,
        }
    }

    fn show(&self, resource: &Resource, label: &str) {
        let status: Status = serde_json::from_str(&resource.status_json).unwrap_or_default();
        let mut summary = format!("{:?}", status.phase);
        if let Some(p) = &status.progress {
            if let Some(f) = p.fraction {
                summary.push_str(&format!(" {:.1}%", f * 100.0));
            }
            summary.push_str(&format!(
                " {} samples {:.0}/s",
                p.samples, p.samples_per_second
            ));
            if let Some(auc) = p.auc {
                summary.push_str(&format!(" AUC {auc:.4}"));
            }
        }
        match &self.bar {
            Some(bar) => {
                bar.set_prefix(format!("job/{}", resource.name));
                let fraction = status.progress.as_ref().and_then(|p| p.fraction);
                if let Some(f) = fraction {
                    bar.set_position((f.clamp(0.0, 1.0) * BAR_STEPS as f64) as u64);
                }
                bar.set_message(summary);
            }
            None => println!(
                "{:<8} {:<9} {}/{}  {summary}",
                resource.resource_version,
                label,
                resource.kind.to_lowercase(),
                resource.name
            ),
        }
    }

    fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}
