//! primus-bus against a real NATS server with JetStream.
use std::time::Duration;

use primus_bus::jetstream::Fetched;
use primus_bus::subjects::ANY;
use primus_bus::{Bus, BusError};
use primus_config::NatsSettings;
use primus_proto::v1::{Endpoint, Heartbeat, Role};
use primus_testkit::{NatsServer, free_port};

fn settings(url: String) -> NatsSettings {
    NatsSettings {
        url,
        ..Default::default()
    }
}

fn heartbeat(id: &str, unix_ms: i64) -> Heartbeat {
    Heartbeat {
        job: "ctr".into(),
        endpoint: Some(Endpoint {
            role: Role::Trainer as i32,
            id: id.into(),
            grpc_addr: "127.0.0.1:7073".into(),
        }),
        unix_ms,
        cpu_cores: 1.5,
        memory_bytes: 1 << 30,
    }
}

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn typed_publish_reaches_a_wildcard_subscriber() {
    let nats = NatsServer::start().expect("nats-server");
    let bus = Bus::connect(&settings(nats.url())).await.expect("connect");
    let subjects = bus.subjects().clone();
    let mut sub = bus
        .subscribe::<Heartbeat>(subjects.heartbeat("ctr", ANY, ANY).expect("subject"))
        .await
        .expect("subscribe");
    let sent = heartbeat("0", 42);
    let subject = subjects.heartbeat("ctr", "trainer", "0").expect("subject");
    bus.publish(subject.clone(), &sent).await.expect("publish");
    let got = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("in time")
        .expect("open")
        .expect("decodes");
    assert_eq!(got.subject, subject);
    assert_eq!(got.message, sent);
}

#[tokio::test]
async fn undecodable_message_is_an_error_and_the_stream_goes_on() {
    let nats = NatsServer::start().expect("nats-server");
    let bus = Bus::connect(&settings(nats.url())).await.expect("connect");
    let subject = bus.subjects().hot("ctr").expect("subject");
    let mut sub = bus
        .subscribe::<Heartbeat>(subject.clone())
        .await
        .expect("subscribe");
    #[expect(
        clippy::disallowed_methods,
        reason = "a raw publish sends what the bus never would: bytes that do not decode"
    )]
    let () = bus
        .client()
        .publish(subject.clone(), vec![0xff, 0xff, 0xff].into())
        .await
        .expect("raw publish");
    bus.publish(subject.clone(), &heartbeat("1", 7))
        .await
        .expect("publish");
    let first = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("in time")
        .expect("open");
    match first {
        Err(BusError::Decode {
            subject: s,
            type_name,
            ..
        }) => {
            assert_eq!(s, subject);
            assert!(type_name.contains("Heartbeat"), "{type_name}");
        }
        Err(other) => panic!("expected a decode error, got {other}"),
        Ok(_) => panic!("garbage decoded"),
    }
    let second = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("in time")
        .expect("open")
        .expect("decodes");
    assert_eq!(second.message.unix_ms, 7);
}

#[tokio::test]
async fn connect_to_nothing_fails_naming_url_and_setting() {
    let url = format!("nats://127.0.0.1:{}", free_port().expect("port"));
    let mut s = settings(url.clone());
    s.connect_attempts = 2;
    s.connect_timeout_ms = 200;
    let err = Bus::connect(&s).await.err().expect("nothing listens there");
    let text = err.to_string();
    assert!(
        text.contains(&url) && text.contains("nats.url") && text.contains("2 attempts"),
        "{text}"
    );
}

#[tokio::test]
async fn jetstream_durable_consumer_redelivers_what_was_not_acked() {
    let nats = NatsServer::start().expect("nats-server");
    let bus = Bus::connect(&settings(nats.url())).await.expect("connect");
    let js = bus.jetstream();
    let subjects = vec!["clicks.>".to_string()];
    js.ensure_stream("CLICKS", subjects.clone())
        .await
        .expect("stream");
    js.ensure_stream("CLICKS", subjects)
        .await
        .expect("ensure is idempotent");
    for i in 0..3 {
        let seq = js
            .publish(format!("clicks.p{i}"), &heartbeat(&i.to_string(), i))
            .await
            .expect("publish");
        assert_eq!(seq, i as u64 + 1);
    }
    let ack_wait = Duration::from_secs(1);
    let consumer = js
        .durable_consumer::<Heartbeat>("CLICKS", "executor", None, ack_wait)
        .await
        .expect("consumer");
    let Fetched {
        deliveries,
        rejected,
    } = consumer
        .fetch(10, Duration::from_secs(2))
        .await
        .expect("fetch");
    assert!(rejected.is_empty());
    let got: Vec<i64> = deliveries
        .iter()
        .map(|d| d.received.message.unix_ms)
        .collect();
    assert_eq!(got, vec![0, 1, 2]);
    for d in &deliveries[..2] {
        d.ack().await.expect("ack");
    }

    // The third was not acked: after ack_wait it comes back, also to a new handle on the
    // same durable consumer (as after an executor restart).
    tokio::time::sleep(ack_wait + Duration::from_millis(500)).await;
    let again = js
        .durable_consumer::<Heartbeat>("CLICKS", "executor", None, ack_wait)
        .await
        .expect("same durable");
    let redelivered = again
        .fetch(10, Duration::from_secs(2))
        .await
        .expect("fetch");
    let got: Vec<i64> = redelivered
        .deliveries
        .iter()
        .map(|d| d.received.message.unix_ms)
        .collect();
    assert_eq!(got, vec![2]);
    assert_eq!(redelivered.deliveries[0].sequence().expect("info"), 3);
    let stored = redelivered.deliveries[0].stored_unix_ms().expect("info");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    assert!(
        (0..60_000).contains(&(now - stored)),
        "stored {stored}, now {now}"
    );
    redelivered.deliveries[0].ack().await.expect("ack");
    let rest = again
        .fetch(10, Duration::from_millis(500))
        .await
        .expect("fetch");
    assert!(rest.deliveries.is_empty());
}

#[tokio::test]
async fn jetstream_terminates_undecodable_messages() {
    let nats = NatsServer::start().expect("nats-server");
    let bus = Bus::connect(&settings(nats.url())).await.expect("connect");
    let js = bus.jetstream();
    js.ensure_stream("RAW", vec!["raw.>".into()])
        .await
        .expect("stream");
    #[expect(
        clippy::disallowed_methods,
        reason = "a raw publish sends what the bus never would: bytes that do not decode"
    )]
    let _ack = async_nats::jetstream::new(bus.client().clone())
        .publish("raw.x", vec![0xff, 0x01].into())
        .await
        .expect("publish")
        .await
        .expect("ack");
    let consumer = js
        .durable_consumer::<Heartbeat>("RAW", "reader", None, Duration::from_secs(1))
        .await
        .expect("consumer");
    let fetched = consumer
        .fetch(10, Duration::from_secs(1))
        .await
        .expect("fetch");
    assert!(fetched.deliveries.is_empty());
    assert_eq!(fetched.rejected.len(), 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = consumer
        .fetch(10, Duration::from_millis(500))
        .await
        .expect("fetch");
    assert!(
        later.rejected.is_empty() && later.deliveries.is_empty(),
        "not redelivered"
    );
}

#[tokio::test]
async fn jetstream_in_progress_holds_a_message_rejected_ones_stay_gone_and_backlog_counts() {
    let nats = NatsServer::start().expect("nats-server");
    let bus = Bus::connect(&settings(nats.url())).await.expect("connect");
    let js = bus.jetstream();
    js.ensure_stream("HOLD", vec!["hold.>".into()])
        .await
        .expect("stream");
    for i in 0..3 {
        js.publish("hold.a".into(), &heartbeat("h", i))
            .await
            .expect("publish");
    }
    let ack_wait = Duration::from_secs(1);
    let consumer = js
        .durable_consumer::<Heartbeat>("HOLD", "holder", None, ack_wait)
        .await
        .expect("consumer");
    let first = consumer
        .fetch(2, Duration::from_secs(1))
        .await
        .expect("fetch");
    assert_eq!(first.deliveries.len(), 2);
    assert_eq!(
        consumer.backlog().await.expect("backlog"),
        primus_bus::jetstream::Backlog {
            pending: 1,
            ack_pending: 2
        }
    );
    first.deliveries[1].reject().await.expect("reject");
    // Held for twice the ack wait, with in-progress acks: never redelivered meanwhile.
    for _ in 0..4 {
        tokio::time::sleep(ack_wait / 2).await;
        first.deliveries[0].in_progress().await.expect("progress");
    }
    let rest = consumer
        .fetch(10, Duration::from_millis(400))
        .await
        .expect("fetch");
    let got: Vec<i64> = rest
        .deliveries
        .iter()
        .map(|d| d.received.message.unix_ms)
        .collect();
    assert_eq!(
        got,
        vec![2],
        "only the undelivered one; the held one stayed held"
    );
    first.deliveries[0].ack().await.expect("ack");
    rest.deliveries[0].ack().await.expect("ack");
    assert_eq!(
        consumer.backlog().await.expect("backlog"),
        primus_bus::jetstream::Backlog {
            pending: 0,
            ack_pending: 0
        }
    );
}
