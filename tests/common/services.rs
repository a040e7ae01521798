//! Real services the broker-sink tests talk to on loopback. A test whose service is absent
//! is skipped with a message naming it, except under CI (CI=true), where absence fails.
//!
//! `.ci/services` starts them (`.ci/run` calls it before the tests); on this machine kind
//! they are normally already running.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a probe waits for the TCP connect.
#[allow(dead_code)]
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Redis,
    Rabbitmq,
    Nats,
    /// moto's server speaking the SQS API.
    Sqs,
    /// The Google Pub/Sub emulator (REST).
    Pubsub,
}

#[allow(dead_code)]
impl Service {
    pub fn name(&self) -> &'static str {
        match self {
            Service::Redis => "redis",
            Service::Rabbitmq => "rabbitmq",
            Service::Nats => "nats",
            Service::Sqs => "sqs (moto_server)",
            Service::Pubsub => "pubsub emulator",
        }
    }

    pub fn addr(&self) -> &'static str {
        match self {
            Service::Redis => "127.0.0.1:6379",
            Service::Rabbitmq => "127.0.0.1:5672",
            Service::Nats => "127.0.0.1:4222",
            Service::Sqs => "127.0.0.1:5000",
            Service::Pubsub => "127.0.0.1:8085",
        }
    }

    /// RabbitMQ: the broker's default user guest/guest (allowed from loopback only) on the
    /// default vhost `/`, which is `%2f` in an AMQP URI.
    pub fn url(&self) -> &'static str {
        match self {
            Service::Redis => "redis://127.0.0.1:6379/",
            Service::Rabbitmq => "amqp://guest:guest@127.0.0.1:5672/%2f",
            Service::Nats => "nats://127.0.0.1:4222",
            Service::Sqs => "http://127.0.0.1:5000",
            Service::Pubsub => "http://127.0.0.1:8085",
        }
    }

    fn port(&self) -> u16 {
        match self {
            Service::Redis => 6379,
            Service::Rabbitmq => 5672,
            Service::Nats => 4222,
            Service::Sqs => 5000,
            Service::Pubsub => 8085,
        }
    }

    fn socket_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port()))
    }
}

/// Whether this runs under CI, read as `.ci/services` reads it.
#[allow(dead_code)]
fn under_ci() -> bool {
    match std::env::var("CI") {
        Ok(value) => value.eq_ignore_ascii_case("true") || value == "1",
        Err(_) => false,
    }
}

/// true when the service answers a TCP connect within 2 s; otherwise under CI panics with a
/// message naming the service and `.ci/services`, outside CI prints a loud
/// `SKIPPED: <test>: <service> is not reachable at <addr>` line and returns false.
///
/// The line is written to the process's stderr directly rather than with `eprintln!`: the
/// test harness captures `eprintln!` of a passing test and would hide the skip.
#[allow(dead_code)]
pub fn available(service: Service, test: &str) -> bool {
    let error = match TcpStream::connect_timeout(&service.socket_addr(), CONNECT_TIMEOUT) {
        Ok(_) => return true,
        Err(error) => error,
    };
    let (name, addr) = (service.name(), service.addr());
    if under_ci() {
        panic!(
            "{test}: {name} is not reachable at {addr} ({error}), and CI requires it: \
             `.ci/services` (run by `.ci/run`) should have started it"
        );
    }
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED: {test}: {name} is not reachable at {addr} ({error}); \
         `bash .ci/services` starts it"
    );
    false
}

/// Counter behind `unique_name`, so two calls in the same nanosecond still differ.
#[allow(dead_code)]
static NAME_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name unique to this process and call, for streams, queues and subjects shared with
/// other tests on the same server: `ankusa-test-<prefix>-<pid>-<nanos>-<counter>` with only
/// [a-z0-9-] characters (the prefix is lowercased, any other character becomes `-`).
#[allow(dead_code)]
pub fn unique_name(prefix: &str) -> String {
    let prefix: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    let counter = NAME_COUNTER.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    format!("ankusa-test-{prefix}-{pid}-{nanos}-{counter}")
}
