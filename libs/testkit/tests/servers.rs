//! The testkit's servers start, answer, and go away.
use std::io::{Read, Write};
use std::net::TcpStream;

use primus_testkit::{NatsServer, RedisServer, SeaweedS3};

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
