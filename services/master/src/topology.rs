//! The job topology service (gRPC `TopologyService`): where each job's executors listen.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use primus_proto::v1::topology_service_server::TopologyService;
use primus_proto::v1::{Endpoint, GetTopologyRequest, GetTopologyResponse, Role};
use tonic::{Request, Response, Status};

/// A job's endpoints and the version of that list.
type Versioned = (u64, Vec<Endpoint>);

/// Endpoints per job, with a version bumped on every change.
#[derive(Clone, Default)]
pub struct Topologies {
    inner: Arc<RwLock<HashMap<String, Versioned>>>,
}

impl Topologies {
    pub fn add(&self, job: &str, endpoint: Endpoint) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let (version, endpoints) = inner.entry(job.to_owned()).or_default();
        endpoints.retain(|e| e.id != endpoint.id);
        endpoints.push(endpoint);
        *version += 1;
    }

    /// Gives executor `id` of `job` a new address (its replacement serves elsewhere).
    pub fn readdress(&self, job: &str, id: &str, grpc_addr: String) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let Some((version, endpoints)) = inner.get_mut(job) else {
            return;
        };
        if let Some(endpoint) = endpoints.iter_mut().find(|e| e.id == id) {
            endpoint.grpc_addr = grpc_addr;
            *version += 1;
        }
    }

    /// Replaces `job`'s endpoints of `role` with `endpoints` in one change: clients see the
    /// old set or the new one, never a mix.
    pub fn replace_role(&self, job: &str, role: Role, endpoints: Vec<Endpoint>) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let (version, listed) = inner.entry(job.to_owned()).or_default();
        listed.retain(|e| e.role != role as i32);
        listed.extend(endpoints);
        *version += 1;
    }

    /// Takes executor `id` out of `job`'s endpoints.
    pub fn remove(&self, job: &str, id: &str) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        if let Some((version, endpoints)) = inner.get_mut(job) {
            endpoints.retain(|e| e.id != id);
            *version += 1;
        }
    }

    pub fn remove_job(&self, job: &str) {
        self.inner
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(job);
    }

    pub fn get(&self, job: &str) -> Option<(u64, Vec<Endpoint>)> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(job)
            .cloned()
    }
}

#[tonic::async_trait]
impl TopologyService for Topologies {
    async fn get_topology(
        &self,
        request: Request<GetTopologyRequest>,
    ) -> Result<Response<GetTopologyResponse>, Status> {
        let job = request.into_inner().job;
        let (version, endpoints) = self.get(&job).ok_or_else(|| {
            Status::not_found(format!("job {job:?} has no topology on this master"))
        })?;
        Ok(Response::new(GetTopologyResponse { endpoints, version }))
    }
}
