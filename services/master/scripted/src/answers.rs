//! The one gRPC server that answers for every scripted executor. A call's local address
//! says which executor it was made to; one that does not run (released, gave up) answers
//! UNAVAILABLE, as a stopped process's address would refuse it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use primus_backend::ExecutorRole;
use primus_proto::v1::dataset_service_server::{DatasetService, DatasetServiceServer};
use primus_proto::v1::parameter_server_server::{ParameterServer, ParameterServerServer};
use primus_proto::v1::*;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::{Call, Key, Shared};

/// Serves every connection in `accepted` until the backend is dropped.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    accepted: mpsc::Receiver<std::io::Result<TcpStream>>,
) {
    let answers = Answers { shared };
    let served = tonic::transport::Server::builder()
        .add_service(HealthServer::new(answers.clone()))
        .add_service(ParameterServerServer::new(answers.clone()))
        .add_service(DatasetServiceServer::new(answers))
        .serve_with_incoming(ReceiverStream::new(accepted))
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "the scripted executors' gRPC server stopped");
    }
}

#[derive(Clone)]
struct Answers {
    shared: Arc<Shared>,
}

impl Answers {
    /// The running executor `request` was made to, and its role.
    fn executor<T>(&self, request: &Request<T>) -> Result<(Key, ExecutorRole), Status> {
        let gone = || Status::unavailable("no scripted executor runs at this address");
        let addr = request.local_addr().ok_or_else(gone)?;
        let state = self.shared.lock();
        let key = state.by_addr.get(&addr).ok_or_else(gone)?;
        let running = state.executors.get(key).ok_or_else(gone)?;
        Ok((key.clone(), running.role))
    }

    fn of_role<T>(&self, request: &Request<T>, role: ExecutorRole) -> Result<Key, Status> {
        match self.executor(request)? {
            (key, actual) if actual == role => Ok(key),
            (key, actual) => Err(Status::unimplemented(format!(
                "{} is a scripted {}, not a {}",
                key.1,
                actual.as_str(),
                role.as_str()
            ))),
        }
    }
}

fn unplayed(what: &str) -> Status {
    Status::unimplemented(format!(
        "{what}: scripted executors do not play it (the real-process suites cover it)"
    ))
}

/// Methods a scripted executor does not play, in the form `#[tonic::async_trait]` gives
/// trait methods (it does not see inside a macro's expansion).
macro_rules! unplayed {
    ($($method:ident: $request:ty => $response:ty;)*) => {
        $(
            fn $method<'life0, 'async_trait>(
                &'life0 self,
                _: Request<$request>,
            ) -> Pin<Box<dyn Future<Output = Result<Response<$response>, Status>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async { Err(unplayed(stringify!($method))) })
            }
        )*
    };
}

#[tonic::async_trait]
impl Health for Answers {
    type WatchStream =
        Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send + 'static>>;

    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.executor(&request)?;
        Ok(Response::new(HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        }))
    }

    async fn watch(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(unplayed("health watch"))
    }
}

#[tonic::async_trait]
impl ParameterServer for Answers {
    async fn open(&self, request: Request<OpenRequest>) -> Result<Response<OpenResponse>, Status> {
        let (job, id) = self.of_role(&request, ExecutorRole::Ps)?;
        self.shared.record(Call::Opened { job, id });
        Ok(Response::new(OpenResponse {}))
    }

    async fn stats(
        &self,
        request: Request<StatsRequest>,
    ) -> Result<Response<StatsResponse>, Status> {
        let key = self.of_role(&request, ExecutorRole::Ps)?;
        let state = self.shared.lock();
        let limit = state.executors.get(&key).map_or(0, |r| r.memory_bytes);
        Ok(Response::new(StatsResponse {
            tables: Vec::new(),
            memory_bytes: state.script.ps_table_bytes,
            memory_limit_bytes: limit,
        }))
    }

    async fn set_memory_limit(
        &self,
        request: Request<SetMemoryLimitRequest>,
    ) -> Result<Response<SetMemoryLimitResponse>, Status> {
        self.of_role(&request, ExecutorRole::Ps)?;
        Ok(Response::new(SetMemoryLimitResponse {}))
    }

    unplayed! {
        lookup: LookupRequest => LookupResponse;
        push: PushRequest => PushResponse;
        lookup_tables: LookupTablesRequest => LookupTablesResponse;
        push_tables: PushTablesRequest => PushTablesResponse;
        read_rows: ReadRowsRequest => ReadRowsResponse;
        init_dense: InitDenseRequest => InitDenseResponse;
        pull_dense: PullDenseRequest => PullDenseResponse;
        push_dense: PushDenseRequest => PushDenseResponse;
        snapshot: SnapshotRequest => SnapshotResponse;
        await_snapshot: AwaitSnapshotRequest => SnapshotResponse;
        restore: RestoreRequest => RestoreResponse;
        export_delta: ExportDeltaRequest => ExportDeltaResponse;
        export_moved: ExportMovedRequest => ExportMovedResponse;
        import_rows: ImportRowsRequest => ImportRowsResponse;
        fence: FenceRequest => FenceResponse;
        import_dense: ImportDenseRequest => ImportDenseResponse;
        drop_moved: DropMovedRequest => DropMovedResponse;
    }
}

#[tonic::async_trait]
impl DatasetService for Answers {
    type StreamMinibatchesStream =
        Pin<Box<dyn Stream<Item = Result<Minibatch, Status>> + Send + 'static>>;

    async fn stream_minibatches(
        &self,
        _: Request<Streaming<MinibatchStreamRequest>>,
    ) -> Result<Response<Self::StreamMinibatchesStream>, Status> {
        Err(unplayed("stream_minibatches"))
    }

    /// A scripted data executor serves nothing while paused but its held task's rows.
    async fn pause(
        &self,
        request: Request<PauseRequest>,
    ) -> Result<Response<PauseResponse>, Status> {
        let key = self.of_role(&request, ExecutorRole::DataExecutor)?;
        let state = self.shared.lock();
        let held = state.executors.get(&key).and_then(|r| r.held.clone());
        Ok(Response::new(PauseResponse {
            served_offsets: held.into_iter().collect(),
            stream_positions: Default::default(),
        }))
    }

    async fn resume(
        &self,
        request: Request<ResumeRequest>,
    ) -> Result<Response<ResumeResponse>, Status> {
        self.of_role(&request, ExecutorRole::DataExecutor)?;
        Ok(Response::new(ResumeResponse {}))
    }

    /// Gives the task back: the executor serves nothing more of it.
    async fn yield_task(
        &self,
        request: Request<YieldTaskRequest>,
    ) -> Result<Response<YieldTaskResponse>, Status> {
        let key = self.of_role(&request, ExecutorRole::DataExecutor)?;
        let task = &request.get_ref().task_id;
        let mut state = self.shared.lock();
        let running = state.executors.get_mut(&key);
        let held = running.and_then(|r| r.held.take_if(|(held, _)| held == task));
        let (_, served_offset) = held.ok_or_else(|| {
            Status::failed_precondition(format!("{} holds no task {task}", key.1))
        })?;
        Ok(Response::new(YieldTaskResponse { served_offset }))
    }

    unplayed! {
        end_minibatches: EndMinibatchesRequest => EndMinibatchesResponse;
        confirmed_totals: ConfirmedTotalsRequest => ConfirmedTotalsResponse;
    }
}
