//! A queued PrimusJob's Kueue Workload (`kueue.x-k8s.io/v1beta2`), the way Kueue's own
//! Job integrations make one: a Job created with `spec.suspend: true` and the label
//! `kueue.x-k8s.io/queue-name` gets a Workload in that LocalQueue whose pod sets are its
//! executors (count and requests per role), owned by the Job; once Kueue admits it the
//! master sets `spec.suspend: false`, and once the Job ends it marks the Workload
//! Finished, which gives the quota back.

use kube::api::ApiResource;
use primus_spec::job::{JobSpec, RoleSpec};
use serde_json::{Value, json};

/// The label naming a Job's LocalQueue (Kueue's).
pub(crate) const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// Kueue's Workload API.
pub(crate) fn workload_api() -> ApiResource {
    ApiResource {
        group: "kueue.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "kueue.x-k8s.io/v1beta2".into(),
        kind: "Workload".into(),
        plural: "workloads".into(),
    }
}

/// The Workload of Job `job`.
pub(crate) fn workload_name(job: &str) -> String {
    format!("primusjob-{job}")
}

/// The Workload of Job `job` (uid `uid`) in LocalQueue `queue`: one pod set per role with
/// executors, each pod requesting the role's CPU and memory.
pub(crate) fn workload(job: &str, uid: &str, queue: &str, spec: &JobSpec) -> Value {
    let topology = &spec.topology;
    let roles = [
        ("ps", Some(&topology.ps)),
        ("data-executor", Some(&topology.data_executors)),
        ("trainer", Some(&topology.trainers)),
        ("serving", topology.serving.as_ref()),
    ];
    let pod_sets: Vec<Value> = (roles.into_iter())
        .filter_map(|(name, role)| role.filter(|r| r.replicas > 0).map(|r| pod_set(name, r)))
        .collect();
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job),
            "labels": {"kueue.x-k8s.io/job-uid": uid},
            "ownerReferences": [{
                "apiVersion": primus_kube_resources::API_VERSION,
                "kind": "PrimusJob",
                "name": job,
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {"queueName": queue, "podSets": pod_sets},
    })
}

fn pod_set(name: &str, role: &RoleSpec) -> Value {
    let millicores = (role.cpu * 1000.0).ceil().max(1.0) as u64;
    json!({
        "name": name,
        "count": role.replicas,
        "template": {"spec": {"containers": [{
            "name": "executor",
            "resources": {"requests": {"cpu": format!("{millicores}m"), "memory": role.memory}},
        }]}},
    })
}

/// Whether Kueue admitted `workload` (its `Admitted` condition is true).
pub(crate) fn admitted(workload: &Value) -> bool {
    (workload["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten())
    .any(|c| c["type"] == "Admitted" && c["status"] == "True")
}

/// What the master does about a Job's Workload as Kueue left it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WorkloadStep {
    /// Admitted: the Job runs (`spec.suspend: false`).
    Resume,
    /// Evicted (preempted, deactivated, its pods not ready in time) while it holds quota:
    /// the Job stops (`spec.suspend: true`), then gives the quota back.
    Stop { reason: String, message: String },
    /// Nothing to do: queued, or evicted and its quota already given back.
    Wait,
}

/// The step for `workload`. A Workload deactivated (`spec.active: false`) and not yet
/// evicted waits: Kueue evicts it next.
pub(crate) fn decide(workload: &Value) -> WorkloadStep {
    let evicted = condition(workload, "Evicted").filter(|c| c["status"] == "True");
    let holds_quota = !workload["status"]["admission"].is_null()
        || condition(workload, "QuotaReserved").is_some_and(|c| c["status"] == "True");
    let active = workload["spec"]["active"].as_bool().unwrap_or(true);
    match evicted {
        Some(evicted) if holds_quota => WorkloadStep::Stop {
            reason: evicted["reason"].as_str().unwrap_or("Evicted").to_owned(),
            message: evicted["message"].as_str().unwrap_or_default().to_owned(),
        },
        Some(_) => WorkloadStep::Wait,
        None if active && admitted(workload) => WorkloadStep::Resume,
        None => WorkloadStep::Wait,
    }
}

fn condition<'a>(workload: &'a Value, kind: &str) -> Option<&'a Value> {
    (workload["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten())
    .find(|c| c["type"] == kind)
}

/// The status (a merge patch) that gives an evicted Workload's quota back once its Job
/// stopped, as Kueue's own job integrations do: no admission, `QuotaReserved` and
/// `Admitted` false, and `Requeued` (true after a preemption or a node failure, when Kueue
/// queues it again by itself).
pub(crate) fn quota_released(workload: &Value, reason: &str, message: &str, now: &str) -> Value {
    let requeued = matches!(reason, "Preempted" | "NodeFailures");
    let set = [
        ("QuotaReserved", false, "Pending", message),
        (
            "Admitted",
            false,
            "NoReservation",
            "The workload has no reservation",
        ),
        ("Requeued", requeued, reason, message),
    ];
    let mut conditions: Vec<Value> = (workload["status"]["conditions"].as_array())
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !set.iter().any(|(kind, ..)| c["type"] == *kind))
        .collect();
    let generation = workload["metadata"]["generation"].as_i64().unwrap_or(0);
    conditions.extend(set.iter().map(|(kind, holds, reason, message)| {
        json!({
            "type": kind,
            "status": if *holds { "True" } else { "False" },
            "reason": reason,
            "message": message,
            "lastTransitionTime": now,
            "observedGeneration": generation,
        })
    }));
    json!({"status": {"admission": null, "conditions": conditions}})
}

/// The status a job controller applies to a Workload whose Job ended.
pub(crate) fn finished(job: &str, succeeded: bool, message: &str, now_rfc3339: &str) -> Value {
    let reason = if succeeded { "Succeeded" } else { "Failed" };
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": workload_name(job)},
        "status": {"conditions": [{
            "type": "Finished",
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_rfc3339,
        }]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        let example = include_str!("../../../../examples/criteo-like.yaml");
        (primus_spec::parse_documents("criteo-like.yaml", example).expect("the example"))
            .into_iter()
            .find_map(|r| match r {
                primus_spec::Resource::Job(job) => Some(job.spec),
                _ => None,
            })
            .expect("its Job")
    }

    #[test]
    fn a_workload_asks_for_every_executor_of_the_job_with_its_requests() {
        let workload = workload("ctr", "uid-1", "team-queue", &spec());
        assert_eq!(workload["metadata"]["name"], "primusjob-ctr");
        assert_eq!(workload["spec"]["queueName"], "team-queue");
        assert_eq!(workload["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        let sets: Vec<(String, u64, String, String)> = (workload["spec"]["podSets"].as_array())
            .expect("pod sets")
            .iter()
            .map(|set| {
                let requests = &set["template"]["spec"]["containers"][0]["resources"]["requests"];
                (
                    set["name"].as_str().unwrap_or_default().to_owned(),
                    set["count"].as_u64().unwrap_or_default(),
                    requests["cpu"].as_str().unwrap_or_default().to_owned(),
                    requests["memory"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let expected = [
            ("ps", 2, "500m", "2Gi"),
            ("data-executor", 1, "1000m", "1Gi"),
            ("trainer", 1, "1000m", "2Gi"),
            ("serving", 1, "500m", "1Gi"),
        ];
        let expected: Vec<(String, u64, String, String)> = (expected.iter())
            .map(|(n, c, cpu, m)| ((*n).into(), *c, (*cpu).into(), (*m).into()))
            .collect();
        assert_eq!(sets, expected);
    }

    #[test]
    fn an_evicted_workload_stops_its_job_until_its_quota_is_given_back() {
        let admitted_then = |evicted: Option<&str>, admission: Value| {
            let mut conditions = vec![
                json!({"type": "QuotaReserved", "status": "True"}),
                json!({"type": "Admitted", "status": "True"}),
            ];
            if let Some(reason) = evicted {
                conditions.push(json!({"type": "Evicted", "status": "True", "reason": reason, "message": "by a higher priority"}));
            }
            json!({"metadata": {"generation": 2}, "status": {"conditions": conditions, "admission": admission}})
        };
        let admission = json!({"clusterQueue": "cq"});
        assert_eq!(
            decide(&admitted_then(None, admission.clone())),
            WorkloadStep::Resume
        );
        let mut deactivated = admitted_then(None, admission.clone());
        deactivated["spec"] = json!({"active": false});
        assert_eq!(
            decide(&deactivated),
            WorkloadStep::Wait,
            "Kueue evicts it next"
        );
        let evicted = admitted_then(Some("Preempted"), admission);
        let stop = WorkloadStep::Stop {
            reason: "Preempted".into(),
            message: "by a higher priority".into(),
        };
        assert_eq!(decide(&evicted), stop);
        let released = quota_released(
            &evicted,
            "Preempted",
            "by a higher priority",
            "2026-11-29T00:00:00Z",
        );
        assert!(released["status"]["admission"].is_null());
        let mut given_back = evicted.clone();
        given_back["status"]["admission"] = Value::Null;
        given_back["status"]["conditions"] = released["status"]["conditions"].clone();
        assert_eq!(
            condition(&given_back, "QuotaReserved").map(|c| &c["status"]),
            Some(&json!("False"))
        );
        assert_eq!(
            condition(&given_back, "Requeued").map(|c| &c["status"]),
            Some(&json!("True"))
        );
        assert!(
            condition(&given_back, "Evicted").is_some(),
            "Kueue's own conditions stay"
        );
        assert_eq!(decide(&given_back), WorkloadStep::Wait);
        let deactivated = quota_released(&evicted, "Deactivated", "", "2026-11-29T00:00:00Z");
        let requeued = (deactivated["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten())
        .find(|c| c["type"] == "Requeued");
        assert_eq!(requeued.map(|c| &c["status"]), Some(&json!("False")));
    }

    #[test]
    fn only_a_true_admitted_condition_admits() {
        let with = |status: &str| {
            json!({"status": {"conditions": [
                {"type": "QuotaReserved", "status": "True"},
                {"type": "Admitted", "status": status},
            ]}})
        };
        assert!(admitted(&with("True")));
        assert!(!admitted(&with("False")));
        assert!(!admitted(&json!({"status": {}})));
    }
}
