//! The testkit's Docker engine runs containers from the testkit's images, and a port a
//! container publishes is reached from the host at the engine's address.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use primus_testkit::DockerEngine;
use primus_testkit::images::redis_image;

#[test]
fn a_published_container_port_answers_from_the_host() {
    let engine = DockerEngine::shared().expect("dockerd");
    let (tag, archive) = redis_image().expect("the redis image");
    engine.load(&archive).expect("docker load");
    let id = engine
        .docker_run(&["run", "-d", "--rm", "-p", "16379:6379", &tag])
        .expect("docker run");
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        match ping(engine.ip()) {
            Ok(answer) => break answer,
            Err(e) => {
                assert!(Instant::now() < deadline, "redis in a container: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    assert_eq!(answer, "+PONG\r\n");
    engine
        .docker_run(&["stop", "--time", "1", id.trim()])
        .expect("docker stop");
}

fn ping(ip: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect((ip, 16379))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"PING\r\n")?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}
