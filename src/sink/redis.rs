//! The Redis sink: XADD to a stream with the body and the metadata as fields, or LPUSH of
//! the body to a list. A reply from the server is the confirmation; with AOF `appendfsync
//! always` on the server it is also durable (docs/delivery.md).
//!
//! One multiplexed connection per sink (`ConnectionManager`): concurrent attempts share it
//! and it reconnects by itself after the first connect succeeds. The first connect is made
//! by the first attempt, so a server that is down at startup costs retries, not the start.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::RedisError;
use tokio::sync::OnceCell;

use super::io::SinkIo;
use super::{content_type, metadata, Message, Outcome, OutcomeFuture, Sink};
use crate::config::{RedisSink as Config, RedisTarget};

/// Stream field names besides the metadata of [`metadata`].
pub const BODY_FIELD: &str = "body";
pub const CONTENT_TYPE_FIELD: &str = "content_type";

pub struct RedisSink {
    target: Arc<Target>,
    io: Arc<SinkIo>,
    timeout: Duration,
}

impl std::fmt::Debug for RedisSink {
    // By hand: the URL may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("target", &self.target.config.target)
            .finish_non_exhaustive()
    }
}

struct Target {
    config: Config,
    connection: OnceCell<ConnectionManager>,
}

impl RedisSink {
    pub fn new(config: &Config, io: &Arc<SinkIo>) -> RedisSink {
        RedisSink {
            target: Arc::new(Target {
                config: config.clone(),
                connection: OnceCell::new(),
            }),
            io: Arc::clone(io),
            timeout: Duration::from_millis(config.timeout_ms),
        }
    }
}

impl Sink for RedisSink {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn deliver(&self, message: Message) -> OutcomeFuture {
        let target = Arc::clone(&self.target);
        let timeout = self.timeout;
        self.io
            .attempt(timeout, async move { target.send(&message, timeout).await })
    }
}

impl Target {
    async fn send(&self, message: &Message, timeout: Duration) -> Outcome {
        let mut connection = match self
            .connection
            .get_or_try_init(|| connect(&self.config.url, timeout))
            .await
        {
            Ok(connection) => connection.clone(),
            Err(error) => return connect_outcome(&error),
        };
        let command = command(&self.config.target, message);
        match command.query_async::<redis::Value>(&mut connection).await {
            Ok(_) => Outcome::Delivered,
            Err(error) => command_outcome(&error),
        }
    }
}

async fn connect(url: &str, timeout: Duration) -> Result<ConnectionManager, RedisError> {
    let client = redis::Client::open(url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        // The pipeline's own backoff retries a failed attempt; the manager only bridges
        // short drops of an established connection.
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(1));
    client.get_connection_manager_with_config(config).await
}

/// The one command of an attempt.
fn command(target: &RedisTarget, message: &Message) -> redis::Cmd {
    let body = &message.hook.body[..];
    match target {
        RedisTarget::Stream { key, maxlen } => {
            let mut command = redis::cmd("XADD");
            command.arg(key);
            if let Some(maxlen) = maxlen {
                // `~`: trimming whole macro nodes is O(1) amortised; exact trimming is not.
                command.arg("MAXLEN").arg("~").arg(*maxlen);
            }
            command.arg("*").arg(BODY_FIELD).arg(body);
            if let Some(content_type) = content_type(&message.hook) {
                command.arg(CONTENT_TYPE_FIELD).arg(content_type);
            }
            for (name, value) in metadata(&message.context) {
                command.arg(name).arg(value);
            }
            command
        }
        RedisTarget::List { key } => {
            let mut command = redis::cmd("LPUSH");
            command.arg(key).arg(body);
            command
        }
    }
}

/// The first connect failed: the server may come back, so always a retry.
fn connect_outcome(error: &RedisError) -> Outcome {
    Outcome::Retry {
        reason: format!("cannot connect to Redis: {error}"),
        retry_after: None,
    }
}

/// Server replies that say "not now" retry; any other refusal of the command (a key of
/// the wrong type, an ACL that denies it, a command the server lacks) would refuse every
/// later attempt too.
fn command_outcome(error: &RedisError) -> Outcome {
    const TRANSIENT: &[&str] = &[
        "OOM",
        "LOADING",
        "BUSY",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "MASTERDOWN",
        "READONLY",
        "MOVED",
        "ASK",
        "NOREPLICAS",
    ];
    match error.code() {
        Some(code) if !TRANSIENT.contains(&code) => Outcome::Permanent {
            reason: format!("Redis refused the command: {error}"),
        },
        _ => Outcome::Retry {
            reason: format!("Redis: {error}"),
            retry_after: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::SinkContext;
    use crate::store::codec::HookRecord;

    fn message(ordering_key: Option<&str>) -> Message {
        Message {
            hook: Arc::new(HookRecord {
                source_id: "stripe".into(),
                tenant_id: "acme".into(),
                received_at_ms: 1_700_000_000_123,
                dedupe_key: Vec::new(),
                headers: vec![("content-type".into(), b"application/json".to_vec())],
                body: b"{\"id\":1}".to_vec(),
            }),
            context: SinkContext {
                tenant_id: "acme".into(),
                source_id: "stripe".into(),
                sink_id: "redis".into(),
                seq: 42,
                attempt: 2,
                idempotency_key: "node:42:redis".into(),
                received_at_ms: 1_700_000_000_123,
                ordering_key: ordering_key.map(str::to_owned),
                lane: None,
            },
        }
    }

    fn args(command: &redis::Cmd) -> Vec<String> {
        command
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_stream_entry_holds_the_body_content_type_and_metadata_in_order() {
        let target = RedisTarget::Stream {
            key: "hooks".into(),
            maxlen: Some(1000),
        };
        let command = command(&target, &message(Some("cus_1")));
        assert_eq!(
            args(&command),
            [
                "XADD",
                "hooks",
                "MAXLEN",
                "~",
                "1000",
                "*",
                "body",
                "{\"id\":1}",
                "content_type",
                "application/json",
                "ankusa_message_version",
                "1",
                "ankusa_idempotency_key",
                "node:42:redis",
                "ankusa_tenant",
                "acme",
                "ankusa_source",
                "stripe",
                "ankusa_seq",
                "42",
                "ankusa_received_at",
                "1700000000123",
                "ankusa_attempt",
                "2",
                "ankusa_ordering_key",
                "cus_1",
            ]
        );
    }

    #[test]
    fn a_list_gets_the_body_alone() {
        let target = RedisTarget::List { key: "jobs".into() };
        assert_eq!(
            args(&command(&target, &message(None))),
            ["LPUSH", "jobs", "{\"id\":1}"]
        );
    }

    #[test]
    fn not_now_replies_retry_and_refusals_are_permanent() {
        let reply = |code: &str| {
            command_outcome(&redis::make_extension_error(
                code.into(),
                Some("from the server".into()),
            ))
        };
        for code in [
            "OOM",
            "LOADING",
            "BUSY",
            "READONLY",
            "TRYAGAIN",
            "MASTERDOWN",
        ] {
            assert_eq!(reply(code).label(), "retry", "{code}");
        }
        for code in ["WRONGTYPE", "NOPERM", "ERR"] {
            let outcome = reply(code);
            let Outcome::Permanent { reason } = &outcome else {
                panic!("{code}: {outcome:?}")
            };
            assert!(reason.contains(code), "{reason}");
        }
        let dropped =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(command_outcome(&dropped).label(), "retry");
    }
}
