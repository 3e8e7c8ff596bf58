//! A span opened before a gRPC call and a NATS publish is the parent of the spans the
//! receiving side records, as seen by a real OTLP/gRPC receiver running in this test.
//! (One test in this binary: the tracing subscriber is process-global.)
use std::time::Duration;

use opentelemetry::trace::TraceContextExt;
use primus_bus::Bus;
use primus_config::{NatsSettings, TelemetrySettings};
use primus_proto::v1::Heartbeat;
use primus_telemetry::propagation::{TraceInterceptor, grpc_server_span};
use primus_testkit::{NatsServer, OtlpReceiver};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

async fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    (l, addr)
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_spans_are_children_of_the_sender_span() {
    let receiver = OtlpReceiver::start().await.expect("otlp receiver");
    let telemetry = primus_telemetry::init(
        "telemetry-test",
        &TelemetrySettings {
            otlp_endpoint: Some(receiver.endpoint().to_owned()),
            ..Default::default()
        },
    )
    .expect("telemetry");
    assert!(telemetry.exporting());

    // Receiving side 1: a gRPC server whose request spans continue the caller's trace.
    let (_reporter, health) = tonic_health::server::health_reporter();
    let (grpc_listener, grpc_addr) = listener().await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .trace_fn(grpc_server_span)
            .add_service(health)
            .serve_with_incoming(TcpListenerStream::new(grpc_listener)),
    );
    // Receiving side 2: a NATS subscriber handling each message in the publisher's trace.
    let nats = NatsServer::start().expect("nats-server");
    let bus = Bus::connect(&NatsSettings {
        url: nats.url(),
        ..Default::default()
    })
    .await
    .expect("connect");
    let subject = bus
        .subjects()
        .heartbeat("ctr", "trainer", "0")
        .expect("subject");
    let mut sub = bus
        .subscribe::<Heartbeat>(subject.clone())
        .await
        .expect("subscribe");
    let handled = tokio::spawn(async move {
        let received = sub.next().await.expect("open").expect("decodes");
        let _enter = received.span.enter();
        tracing::info!("handled heartbeat");
    });

    // Sending side: one span around a gRPC call and a NATS publish.
    let root = tracing::info_span!("client.operation");
    let root_context = root.context().span().span_context().clone();
    async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        HealthClient::with_interceptor(channel, TraceInterceptor)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health call");
        bus.publish(subject.clone(), &Heartbeat::default())
            .await
            .expect("publish");
    }
    .instrument(root.clone())
    .await;
    drop(root);
    tokio::time::timeout(Duration::from_secs(5), handled)
        .await
        .expect("message handled")
        .expect("task");

    let wanted = [
        "/grpc.health.v1.Health/Check".to_string(),
        format!("receive {subject}"),
    ];
    let mut found = Vec::new();
    for _ in 0..50 {
        telemetry.flush();
        found = receiver
            .spans()
            .into_iter()
            .map(|r| r.span)
            .filter(|s| wanted.contains(&s.name))
            .collect();
        if found.len() == wanted.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names: Vec<&str> = found.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(found.len(), 2, "exported spans of interest: {names:?}");
    for span in &found {
        assert_eq!(
            span.trace_id,
            root_context.trace_id().to_bytes().to_vec(),
            "{} is in the sender's trace",
            span.name
        );
        assert_eq!(
            span.parent_span_id,
            root_context.span_id().to_bytes().to_vec(),
            "{} is a child of the sender's span",
            span.name
        );
    }
    telemetry.shutdown();
}
