//! The testkit's servers start, answer, and go away.
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use primus_testkit::{Error, NatsServer, RedisServer, SeaweedS3, restartable_port};

fn roundtrip(port: u16, send: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(send).expect("write");
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).expect("read");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn nats_starts_answers_and_dies_on_drop() {
    let nats = NatsServer::start().expect("nats-server");
    assert!(roundtrip(nats.port(), b"").starts_with("INFO"));
    let port = nats.port();
    drop(nats);
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "still listening after drop"
    );
}

#[test]
fn redis_starts_and_answers() {
    let redis = RedisServer::start().expect("redis-server");
    assert!(roundtrip(redis.port(), b"PING\r\n").starts_with("+PONG"));
}

#[test]
fn seaweed_buckets_are_distinct() {
    let s3 = SeaweedS3::shared().expect("seaweedfs");
    let a = s3.bucket("Some Test").expect("bucket");
    let b = s3.bucket("Some Test").expect("bucket");
    assert_ne!(a.name, b.name);
    assert!(a.name.starts_with("some-test-"), "{}", a.name);
}

#[test]
fn a_server_that_exits_while_starting_fails_at_once_with_its_log() {
    let port = restartable_port().expect("port");
    let _taken = TcpListener::bind(("127.0.0.1", port)).expect("bind the port first");
    match NatsServer::start_with(port, None) {
        Err(Error::Exited { what, log, .. }) => {
            assert_eq!(what, "nats-server");
            assert!(log.contains("address already in use"), "{log}");
        }
        Err(other) => panic!("expected an early exit with its log, got: {other}"),
        Ok(_) => panic!("nats-server started on a port that was taken"),
    }
}

#[test]
fn a_port_is_handed_out_once_per_process() {
    // None of these is bound: each still looks free when the next is picked.
    let ports: Vec<u16> = (0..500)
        .map(|_| restartable_port().expect("port"))
        .collect();
    let distinct: BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
}
