//! Settings checked by the client library that will use them, so a typo fails at load
//! rather than at the first delivery. Each check answers the reason a value is refused;
//! the caller adds the YAML path and what was expected.
//!
//! Without the `server` feature (the fuzz build) the client libraries are not linked and
//! every check passes: the rest of validation is the same code either way.

pub use linked::*;

#[cfg(feature = "server")]
mod linked {
    use std::path::Path;

    /// The reason never echoes the URL, which may hold a password.
    pub fn redis_url(url: &str) -> Result<(), String> {
        redis::IntoConnectionInfo::into_connection_info(url)
            .map(drop)
            .map_err(|error| {
                error
                    .detail()
                    .unwrap_or("not a redis:// or rediss:// URL")
                    .to_owned()
            })
    }

    pub fn nats_server(address: &str) -> Result<(), String> {
        address
            .parse::<async_nats::ServerAddr>()
            .map(drop)
            .map_err(|error| error.to_string())
    }

    pub fn amqp_url(url: &str) -> Result<(), String> {
        url.parse::<lapin::uri::AMQPUri>()
            .map(drop)
            .map_err(|error| error.to_string())
    }

    /// One librdkafka property, set on a scratch client config.
    pub fn kafka_property(name: &str, value: &str) -> Result<(), String> {
        let mut probe = rdkafka::ClientConfig::new();
        probe.set(name, value);
        probe
            .create_native_config()
            .map(drop)
            .map_err(|error| match error {
                rdkafka::error::KafkaError::ClientConfig(_, description, _, _) => description,
                other => other.to_string(),
            })
    }

    pub fn pubsub_credentials_file(path: &Path) -> Result<(), String> {
        crate::sink::pubsub::check_credentials_file(path)
    }
}

#[cfg(not(feature = "server"))]
mod linked {
    use std::path::Path;

    pub fn redis_url(_: &str) -> Result<(), String> {
        Ok(())
    }

    pub fn nats_server(_: &str) -> Result<(), String> {
        Ok(())
    }

    pub fn amqp_url(_: &str) -> Result<(), String> {
        Ok(())
    }

    pub fn kafka_property(_: &str, _: &str) -> Result<(), String> {
        Ok(())
    }

    pub fn pubsub_credentials_file(_: &Path) -> Result<(), String> {
        Ok(())
    }
}
