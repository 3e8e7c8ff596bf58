//! Pod usage from the cluster's metrics API (`metrics.k8s.io`, metrics-server).

use super::reconcile;

/// Each pod's name, CPU cores and memory bytes from `metrics.k8s.io`.
pub(super) async fn pod_metrics(
    client: kube::Client,
    namespace: &str,
    selector: &str,
) -> Result<Vec<(String, f64, u64)>, kube::Error> {
    let url = format!(
        "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods?labelSelector={}",
        selector
            .replace('=', "%3D")
            .replace(',', "%2C")
            .replace('/', "%2F")
    );
    let request = tonic::codegen::http::Request::get(url)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let list: serde_json::Value = client.request(request).await?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    Ok(items
        .iter()
        .filter_map(|item| {
            let name = item["metadata"]["name"].as_str()?.to_owned();
            let usage = &item["containers"].as_array()?.first()?["usage"];
            let cpu = reconcile::cpu_millis(usage["cpu"].as_str()?)? as f64 / 1000.0;
            let memory = primus_spec::job::parse_memory(usage["memory"].as_str()?).ok()?;
            Some((name, cpu, memory))
        })
        .collect())
}
