//! The HTTP sink: one POST per attempt with the original body, the `x-ankusa-*` metadata
//! headers of the outbound contract (DESIGN section 3), the configured static and
//! forwarded headers, and an optional Standard Webhooks signature. It owns the mapping
//! from an HTTP exchange to an [`Outcome`].
//!
//! `ureq` is blocking, so every request runs on the [`BlockingPool`]; the pipeline core
//! only awaits the pool's future. A few `ureq::Agent`s per sink keep idle connections for
//! reuse across attempts, each worker always using the same one. Redirects are not followed: a webhook endpoint that moved is a
//! configuration problem, and following a redirect with a POST body is unsafe.

use std::io::Read as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use shards::BlockingPool;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

use super::{Message, Outcome, OutcomeFuture, Sink, MESSAGE_VERSION};
use crate::clock;
use crate::config;

/// At most this much of a response body is read: enough for an error message, and a
/// small body read to the end lets the connection go back to the pool.
const RESPONSE_BODY_MAX_BYTES: u64 = 64 * 1024;
/// At most this much of the response body goes into a permanent failure's reason.
const REASON_BODY_MAX_BYTES: usize = 200;
const DEFAULT_CONTENT_TYPE: &[u8] = b"application/octet-stream";

/// Headers Ankusa sets itself (or the HTTP framing does). A static or forwarded header
/// of one of these names is not sent: a provider's stored `transfer-encoding` would
/// break the request's framing, and a forwarded `x-ankusa-seq` would lie to the consumer.
const FRAMING_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
];
const SIGNING_HEADERS: &[&str] = &["webhook-id", "webhook-timestamp", "webhook-signature"];

pub struct HttpSink {
    /// The sink's id within its source, for logs.
    sink_id: String,
    /// Everything the worker thread needs, shared with every queued attempt.
    endpoint: Arc<Endpoint>,
    pool: Arc<BlockingPool>,
}

impl std::fmt::Debug for HttpSink {
    // By hand: the config holds the signing key and static header values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSink")
            .field("sink_id", &self.sink_id)
            .field("pool", &self.pool.name())
            .finish_non_exhaustive()
    }
}

/// Agents one sink spreads its pool's workers over. ureq keeps an agent's idle
/// connections in one list under one mutex and walks the whole list each time a
/// connection comes back, so with every worker on one agent that walk and that lock
/// were a few percent of all delivery CPU; a worker's connection still goes back to the
/// agent it came from, so reuse is kept.
const AGENTS_PER_SINK: usize = 4;

/// One destination: its clients and its validated config.
struct Endpoint {
    /// Hold the idle connections; pool worker `n` uses agent `n % len`.
    agents: Box<[ureq::Agent]>,
    config: config::HttpSink,
    /// Read errors of an https exchange come from the TLS layer; naming that in the
    /// reason tells an operator to look at certificates, not at the network.
    https: bool,
}

impl HttpSink {
    pub fn new(sink_id: &str, config: &config::HttpSink, pool: Arc<BlockingPool>) -> HttpSink {
        let timeout = Duration::from_millis(config.timeout_ms);
        let agent_count = AGENTS_PER_SINK.min(pool.thread_count());
        // Each worker holds at most one connection at a time, so more idle connections
        // per host than an agent's workers would never be used.
        let idle_per_host = pool.thread_count().div_ceil(agent_count);
        let agents = (0..agent_count)
            .map(|_| {
                let agent_config = ureq::Agent::config_builder()
                    // Statuses are outcomes here, not errors: the body of a 4xx goes in
                    // the reason.
                    .http_status_as_error(false)
                    .max_redirects(0)
                    .timeout_global(Some(timeout))
                    .timeout_connect(Some(Duration::from_millis(config.connect_timeout_ms)))
                    .max_idle_connections_per_host(idle_per_host)
                    .max_idle_connections(idle_per_host.max(10))
                    .build();
                ureq::Agent::with_parts(
                    agent_config,
                    DefaultConnector::default(),
                    SinkResolver::default(),
                )
            })
            .collect();
        HttpSink {
            sink_id: sink_id.to_owned(),
            endpoint: Arc::new(Endpoint {
                agents,
                https: config
                    .url
                    .get(..8)
                    .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://")),
                config: config.clone(),
            }),
            pool,
        }
    }

    pub fn sink_id(&self) -> &str {
        &self.sink_id
    }
}

impl Sink for HttpSink {
    fn kind(&self) -> &'static str {
        "http"
    }

    fn deliver(&self, message: Message) -> OutcomeFuture {
        let endpoint = Arc::clone(&self.endpoint);
        let attempt = self.pool.run(move || endpoint.attempt(&message));
        Box::pin(async move {
            match attempt.await {
                Ok(outcome) => outcome,
                // The pool is closing (shutdown) or the attempt panicked: nothing reached
                // a verdict, so the row stays for a later attempt.
                Err(error) => Outcome::Retry {
                    reason: error.to_string(),
                    retry_after: None,
                },
            }
        })
    }
}

impl Endpoint {
    /// One blocking exchange, on a pool thread.
    fn attempt(&self, message: &Message) -> Outcome {
        let headers = outbound_headers(&self.config, message, clock::now_s());
        let agent = &self.agents[shards::worker_index().unwrap_or(0) % self.agents.len()];
        let mut request = agent.post(self.config.url.as_str());
        for (name, value) in &headers {
            request = request.header_raw(name, value);
        }
        match request.send(&message.hook.body[..]) {
            Ok(mut response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    // A date counts from when the answer came, not from when we asked.
                    .and_then(|value| parse_retry_after(value.as_bytes(), clock::now_ms()));
                let mut body = Vec::new();
                // The status is the verdict; a body that fails halfway only shortens the
                // reason (and the connection is then not reused).
                let _ = response
                    .body_mut()
                    .as_reader()
                    .take(RESPONSE_BODY_MAX_BYTES)
                    .read_to_end(&mut body);
                status_outcome(status, retry_after, &body)
            }
            Err(error) => error_outcome(&error, self.https),
        }
    }
}

/// How long a name's looked-up addresses serve before the next lookup. The system resolver
/// gives no TTL, so this is the longest a DNS change can go unseen by a sink.
pub const NAME_MAX_AGE: Duration = Duration::from_secs(30);

/// Resolves a URL whose host is an IP address in place, and a name through ureq's own
/// resolver at most once per [`NAME_MAX_AGE`]. ureq resolves the URL before every request,
/// pooled connection or not, and with a timeout set its resolver runs each lookup on a
/// thread spawned for it: that was a thread started and stopped, and a `getaddrinfo`,
/// per delivery (measured for an address: a few percent of the sink threads' CPU, and
/// each stack's unmapping interrupts the other cores). A failed lookup is not kept: the
/// next attempt looks up again.
#[derive(Debug, Default)]
struct SinkResolver {
    names: DefaultResolver,
    cache: NameCache,
}

impl Resolver for SinkResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        match literal_address(uri) {
            Some(address) => {
                let mut addresses = self.empty();
                addresses.push(address);
                Ok(addresses)
            }
            None => self.cache.get_or_look_up(uri, Instant::now(), || {
                self.names.resolve(uri, config, timeout)
            }),
        }
    }
}

/// The addresses of the last name looked up (a sink has one URL, so one name) and when.
#[derive(Debug, Default)]
struct NameCache {
    last: Mutex<Option<CachedName>>,
}

#[derive(Debug)]
struct CachedName {
    /// Scheme and authority: the default port depends on the scheme.
    key: String,
    addresses: ResolvedSocketAddrs,
    looked_up_at: Instant,
}

impl NameCache {
    fn get_or_look_up(
        &self,
        uri: &Uri,
        now: Instant,
        look_up: impl FnOnce() -> Result<ResolvedSocketAddrs, ureq::Error>,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let key = format!(
            "{}://{}",
            uri.scheme_str().unwrap_or_default(),
            uri.authority().map_or("", |authority| authority.as_str())
        );
        let fresh = |cached: &CachedName| {
            cached.key.eq_ignore_ascii_case(&key)
                && now.saturating_duration_since(cached.looked_up_at) < NAME_MAX_AGE
        };
        if let Some(cached) = self.lock().as_ref().filter(|cached| fresh(cached)) {
            return Ok(cached.addresses.clone());
        }
        // Looked up outside the lock: a slow lookup holds no other attempt.
        let addresses = look_up()?;
        *self.lock() = Some(CachedName {
            key,
            addresses: addresses.clone(),
            looked_up_at: now,
        });
        Ok(addresses)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<CachedName>> {
        self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The socket address of an `http`/`https` URL whose host is an IPv4 or bracketed IPv6
/// address, with the scheme's default port when none is given.
fn literal_address(uri: &Uri) -> Option<std::net::SocketAddr> {
    let host = uri.host()?;
    let host = host
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host);
    let ip: std::net::IpAddr = host.parse().ok()?;
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(port), _) => port,
        (None, Some(scheme)) if scheme.eq_ignore_ascii_case("http") => 80,
        (None, Some(scheme)) if scheme.eq_ignore_ascii_case("https") => 443,
        _ => return None,
    };
    Some(std::net::SocketAddr::new(ip, port))
}

/// The request's headers in the order sent: content type, the metadata, the static
/// headers, the forwarded ones, then the signature. A later header replaces an earlier
/// one of the same name, except that the metadata, the signature and the framing headers
/// cannot be replaced.
fn outbound_headers(
    config: &config::HttpSink,
    message: &Message,
    now_s: u64,
) -> Vec<(String, Vec<u8>)> {
    let hook = &message.hook;
    let context = &message.context;
    let signing = config.signing_secret.is_some();
    let reserved = |name: &str| {
        let metadata = name
            .get(.."x-ankusa-".len())
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case("x-ankusa-"));
        let framing = FRAMING_HEADERS
            .iter()
            .any(|known| known.eq_ignore_ascii_case(name));
        let signature = signing
            && SIGNING_HEADERS
                .iter()
                .any(|known| known.eq_ignore_ascii_case(name));
        metadata || framing || signature
    };
    let stored = |name| stored_values(hook, name);
    let mut headers: Vec<(String, Vec<u8>)> = Vec::with_capacity(
        10 + config.headers.len() + config.forward_headers.len() + SIGNING_HEADERS.len(),
    );
    let content_type = stored("content-type")
        .next()
        .unwrap_or(DEFAULT_CONTENT_TYPE);
    headers.push(("content-type".into(), content_type.to_vec()));
    let mut metadata = |name: &str, value: &str| {
        headers.push((name.into(), value.as_bytes().to_vec()));
    };
    metadata("x-ankusa-message-version", MESSAGE_VERSION);
    metadata("x-ankusa-idempotency-key", &context.idempotency_key);
    metadata("x-ankusa-tenant", &context.tenant_id);
    metadata("x-ankusa-source", &context.source_id);
    metadata("x-ankusa-seq", &context.seq.to_string());
    metadata("x-ankusa-received-at", &context.received_at_ms.to_string());
    metadata("x-ankusa-attempt", &context.attempt.to_string());
    if let Some(ordering_key) = &context.ordering_key {
        metadata("x-ankusa-ordering-key", ordering_key);
    }
    let replace = |headers: &mut Vec<(String, Vec<u8>)>, name: &str| {
        headers.retain(|(known, _)| !known.eq_ignore_ascii_case(name));
    };
    for (name, value) in &config.headers {
        if reserved(name) {
            continue;
        }
        replace(&mut headers, name);
        headers.push((name.clone(), value.as_bytes().to_vec()));
    }
    for name in &config.forward_headers {
        if reserved(name) || stored(name).next().is_none() {
            continue;
        }
        replace(&mut headers, name);
        // Every stored value, in the order received: a repeated header stays repeated.
        for value in stored(name) {
            headers.push((name.clone(), value.to_vec()));
        }
    }
    if let Some(key) = &config.signing_secret {
        let id = &context.idempotency_key;
        let signature =
            crate::verify::standard_webhooks_signature(key, id, now_s, &message.hook.body);
        headers.push(("webhook-id".into(), id.as_bytes().to_vec()));
        headers.push(("webhook-timestamp".into(), now_s.to_string().into_bytes()));
        headers.push(("webhook-signature".into(), signature.into_bytes()));
    }
    headers
}

/// The values the stored hook holds for `name` (lower-case), in the order received.
fn stored_values<'a>(
    hook: &'a crate::store::codec::HookRecord,
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    hook.headers
        .iter()
        .filter(move |(stored_name, _)| stored_name == name)
        .map(|(_, value)| value.as_slice())
}

/// What a response status means for the row.
fn status_outcome(status: u16, retry_after: Option<Duration>, body: &[u8]) -> Outcome {
    match status {
        200..=299 => Outcome::Delivered,
        // Timeout, too early, rate-limited, server trouble: the destination may take it
        // later.
        408 | 425 | 429 | 500..=599 => Outcome::Retry {
            reason: status_reason(status, body),
            retry_after,
        },
        // 3xx (not followed), other 4xx: sending the same request again will not help.
        _ => Outcome::Permanent {
            reason: status_reason(status, body),
        },
    }
}

/// `http <status>: <start of the body>`, or `http <status>` when the body is empty.
pub(super) fn status_reason(status: u16, body: &[u8]) -> String {
    let mut prefix = &body[..body.len().min(REASON_BODY_MAX_BYTES)];
    // Cut before a character split by the limit rather than end on a U+FFFD.
    if let Err(error) = std::str::from_utf8(prefix) {
        if error.error_len().is_none() {
            prefix = &prefix[..error.valid_up_to()];
        }
    }
    let text = one_line(&String::from_utf8_lossy(prefix));
    if text.is_empty() {
        format!("http {status}")
    } else {
        format!("http {status}: {text}")
    }
}

/// One trimmed line: reasons end up in logs and in the DLQ listing.
pub(super) fn one_line(text: &str) -> String {
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    text.trim().to_owned()
}

/// A request that got no status. Transport trouble is retried; a request that cannot
/// be built (a header value the client refuses) fails the same way every time.
pub(super) fn error_outcome(error: &ureq::Error, https: bool) -> Outcome {
    match transport_error(error, https) {
        (reason, true) => Outcome::Permanent { reason },
        (reason, false) => Outcome::Retry {
            reason,
            retry_after: None,
        },
    }
}

/// The reason of a request that got no status, and whether it is permanent.
pub(super) fn transport_error(error: &ureq::Error, https: bool) -> (String, bool) {
    use ureq::Error;
    let reason = match error {
        Error::Timeout(ureq::Timeout::Connect) => "connect: timeout".into(),
        Error::Timeout(_) => "timeout".into(),
        Error::HostNotFound => "dns: host not found".into(),
        Error::ConnectionFailed => "connect: connection failed".into(),
        Error::Io(io) if https && io.kind() == std::io::ErrorKind::InvalidData => {
            format!("tls: {io}")
        }
        Error::Io(io) => io_reason(io),
        Error::Tls(message) => format!("tls: {message}"),
        Error::Http(_) | Error::BadUri(_) => return (format!("request: {error}"), true),
        other => other.to_string(),
    };
    (reason, false)
}

fn io_reason(error: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::TimedOut | ErrorKind::WouldBlock => "timeout".into(),
        ErrorKind::ConnectionRefused
        | ErrorKind::HostUnreachable
        | ErrorKind::NetworkUnreachable
        | ErrorKind::AddrNotAvailable => format!("connect: {error}"),
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => {
            format!("connection reset: {error}")
        }
        ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof => "connection closed".into(),
        _ => format!("io: {error}"),
    }
}

/// `Retry-After` as delta-seconds or an IMF-fixdate (RFC 9110 §10.2.3). Anything else,
/// and a date already past, gives no hint.
pub(super) fn parse_retry_after(value: &[u8], now_ms: u64) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) {
        // More digits than a u64 holds is not a usable hint either.
        return text.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at_ms = parse_imf_fixdate(text)?.checked_mul(1000)?;
    (at_ms > now_ms).then(|| Duration::from_millis(at_ms - now_ms))
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` → unix seconds. The obsolete RFC 850 and asctime
/// forms are not read: senders must not produce them.
fn parse_imf_fixdate(text: &str) -> Option<u64> {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let mut parts = text.split(' ');
    let (Some(day_name), Some(day), Some(month), Some(year), Some(time), Some("GMT"), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    let day_name = day_name.strip_suffix(',')?;
    if !DAYS.contains(&day_name) {
        return None;
    }
    let number = |text: &str, digits: usize| -> Option<u64> {
        (text.len() == digits && text.bytes().all(|byte| byte.is_ascii_digit()))
            .then(|| text.parse().ok())
            .flatten()
    };
    let day = number(day, 2)?;
    let month = MONTHS.iter().position(|known| *known == month)? as u64 + 1;
    let year = number(year, 4)?;
    let mut clock = time.split(':');
    let (Some(hour), Some(minute), Some(second), None) =
        (clock.next(), clock.next(), clock.next(), clock.next())
    else {
        return None;
    };
    let (hour, minute, second) = (number(hour, 2)?, number(minute, 2)?, number(second, 2)?);
    if !(1..=31).contains(&day) || year < 1970 || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date on or after it (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    //! Unit tests of the pure parts, then the sink against a real receiver on
    //! 127.0.0.1:0: a std listener in a thread that records each request and answers
    //! from a script, driven through `HttpSink` on a glommio executor.

    use super::*;
    use crate::sink::SinkContext;
    use crate::store::codec::HookRecord;
    use std::collections::VecDeque;
    use std::io::Write as _;
    use std::net::{TcpListener, TcpStream};
    use std::rc::Rc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const NOW_MS: u64 = 1_700_000_000_000;

    #[test]
    fn retry_after_forms() {
        let check = |value: &[u8], expected: Option<Duration>| {
            assert_eq!(
                parse_retry_after(value, NOW_MS),
                expected,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        };
        check(b"7", Some(Duration::from_secs(7)));
        check(b" 120 ", Some(Duration::from_secs(120)));
        check(b"0", Some(Duration::ZERO));
        // 1_700_000_000 is Tue, 14 Nov 2023 22:13:20 GMT.
        check(
            b"Tue, 14 Nov 2023 22:13:30 GMT",
            Some(Duration::from_secs(10)),
        );
        check(b"Tue, 14 Nov 2023 22:13:20 GMT", None);
        check(b"Mon, 01 Jan 2001 00:00:00 GMT", None);
        check(
            b"Wed, 29 Feb 2040 00:00:00 GMT",
            Some(Duration::from_millis(2_214_086_400_000 - NOW_MS)),
        );
        for garbage in [
            &b""[..],
            b"-5",
            b"+5",
            b"1.5",
            b"soon",
            b"99999999999999999999999",
            b"Tue, 14 Nov 2023 22:13:30 UTC",
            b"Tuesday, 14-Nov-23 22:13:30 GMT",
            b"Tue Nov 14 22:13:30 2023",
            b"Tue, 14 Foo 2023 22:13:30 GMT",
            b"Tue, 14 Nov 2023 25:13:30 GMT",
            b"Tue, 4 Nov 2023 22:13:30 GMT",
            b"\xff",
        ] {
            check(garbage, None);
        }
    }

    #[test]
    fn literal_hosts_resolve_without_a_lookup() {
        let cases = [
            ("http://127.0.0.1:8080/hooks", Some("127.0.0.1:8080")),
            ("http://10.1.2.3/x", Some("10.1.2.3:80")),
            ("HTTPS://10.1.2.3/x", Some("10.1.2.3:443")),
            ("http://[::1]:9000/", Some("[::1]:9000")),
            ("https://[::1]/", Some("[::1]:443")),
            // Names go to the lookup.
            ("http://localhost:8080/", None),
            ("https://hooks.example.com/in", None),
            ("http://127.0.0.1.example.com/", None),
        ];
        for (url, expected) in cases {
            let expected: Option<std::net::SocketAddr> = expected.map(|a| a.parse().unwrap());
            assert_eq!(
                literal_address(&url.parse::<Uri>().unwrap()),
                expected,
                "{url}"
            );
        }
    }

    #[test]
    fn a_name_is_looked_up_once_per_max_age() {
        let cache = NameCache::default();
        let lookups = AtomicUsize::new(0);
        let look_up = |address: &str| {
            lookups.fetch_add(1, Ordering::SeqCst);
            let mut addresses = SinkResolver::default().empty();
            addresses.push(address.parse().unwrap());
            Ok(addresses)
        };
        let hooks: Uri = "http://hooks.example.com/in".parse().unwrap();
        let start = Instant::now();
        let get = |uri: &Uri, at: Duration, address: &str| {
            let found = cache
                .get_or_look_up(uri, start + at, || look_up(address))
                .unwrap();
            found.iter().map(ToString::to_string).collect::<Vec<_>>()
        };
        assert_eq!(get(&hooks, Duration::ZERO, "10.0.0.1:80"), ["10.0.0.1:80"]);
        // Within the age the first answer serves, whatever DNS says now.
        let almost = NAME_MAX_AGE - Duration::from_millis(1);
        assert_eq!(get(&hooks, almost, "10.0.0.2:80"), ["10.0.0.1:80"]);
        assert_eq!(lookups.load(Ordering::SeqCst), 1);
        // Past it, the name is looked up again.
        assert_eq!(get(&hooks, NAME_MAX_AGE, "10.0.0.2:80"), ["10.0.0.2:80"]);
        assert_eq!(lookups.load(Ordering::SeqCst), 2);
        // Another scheme or port of the same name is another lookup.
        let tls: Uri = "https://hooks.example.com/in".parse().unwrap();
        assert_eq!(get(&tls, NAME_MAX_AGE, "10.0.0.3:443"), ["10.0.0.3:443"]);
        assert_eq!(lookups.load(Ordering::SeqCst), 3);

        // A failed lookup is not kept: the next attempt asks again.
        let failing = NameCache::default();
        let failed = failing.get_or_look_up(&hooks, start, || Err(ureq::Error::HostNotFound));
        assert!(
            matches!(failed, Err(ureq::Error::HostNotFound)),
            "{failed:?}"
        );
        let found = failing
            .get_or_look_up(&hooks, start, || look_up("10.0.0.4:80"))
            .unwrap();
        assert_eq!(
            found.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.0.0.4:80"]
        );
    }

    #[test]
    fn days_from_civil_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2023, 11, 14), 19_675);
    }

    #[test]
    fn statuses_map_to_outcomes() {
        let retry = |reason: &str| Outcome::Retry {
            reason: reason.into(),
            retry_after: None,
        };
        let permanent = |reason: &str| Outcome::Permanent {
            reason: reason.into(),
        };
        let cases = [
            (200, "", Outcome::Delivered),
            (202, "queued", Outcome::Delivered),
            (299, "", Outcome::Delivered),
            (408, "", retry("http 408")),
            (425, "", retry("http 425")),
            (429, "slow down", retry("http 429: slow down")),
            (500, "", retry("http 500")),
            (599, "", retry("http 599")),
            (301, "", permanent("http 301")),
            (
                400,
                " bad\r\npayload \n",
                permanent("http 400: bad  payload"),
            ),
            (404, "", permanent("http 404")),
            (410, "gone", permanent("http 410: gone")),
            (418, "", permanent("http 418")),
        ];
        for (status, body, expected) in cases {
            assert_eq!(
                status_outcome(status, None, body.as_bytes()),
                expected,
                "{status}"
            );
        }
    }

    #[test]
    fn reasons_keep_200_bytes_and_whole_characters() {
        let long = "x".repeat(300);
        assert_eq!(
            status_reason(400, long.as_bytes()),
            format!("http 400: {}", &long[..200])
        );
        // 'é' is two bytes; byte 200 falls inside the 100th one.
        let accented = format!("a{}", "é".repeat(150));
        let reason = status_reason(400, accented.as_bytes());
        assert_eq!(reason, format!("http 400: a{}", "é".repeat(99)));
        assert_eq!(
            status_reason(400, b"\xff\xfeok"),
            "http 400: \u{fffd}\u{fffd}ok"
        );
    }

    // ---- The receiver. ----

    /// One request as the receiver saw it.
    #[derive(Debug, Clone)]
    struct Recorded {
        method: String,
        path: String,
        /// Names lower-cased, in the order received.
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
        /// Which accepted connection carried it, counting from 0.
        connection: usize,
    }

    impl Recorded {
        fn header(&self, name: &str) -> Option<&[u8]> {
            self.headers
                .iter()
                .find(|(known, _)| known == name)
                .map(|(_, value)| value.as_slice())
        }

        fn header_text(&self, name: &str) -> Option<&str> {
            self.header(name)
                .map(|value| std::str::from_utf8(value).unwrap())
        }

        fn count(&self, name: &str) -> usize {
            self.headers
                .iter()
                .filter(|(known, _)| known == name)
                .count()
        }
    }

    impl crate::verify::HeaderLookup for Recorded {
        fn header(&self, lower_name: &str) -> Option<&[u8]> {
            Recorded::header(self, lower_name)
        }
    }

    /// The receiver's answer to the next request.
    #[derive(Debug, Clone)]
    enum Reply {
        Respond {
            status: u16,
            headers: Vec<(&'static str, &'static str)>,
            body: &'static str,
            /// `false` answers with `connection: close` and closes.
            keep_alive: bool,
        },
        /// Read the request, never answer; hold the connection until the client leaves.
        Silent,
    }

    fn reply(status: u16) -> Reply {
        Reply::Respond {
            status,
            headers: Vec::new(),
            body: "",
            keep_alive: true,
        }
    }

    struct Receiver {
        url: String,
        requests: Arc<Mutex<Vec<Recorded>>>,
        connections: Arc<AtomicUsize>,
    }

    impl Receiver {
        /// Listens on 127.0.0.1:0 and answers requests with `script` in order, then 200.
        /// Its threads end with the test process.
        fn start(script: Vec<Reply>) -> Receiver {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}/hooks/in", listener.local_addr().unwrap());
            let requests = Arc::new(Mutex::new(Vec::new()));
            let connections = Arc::new(AtomicUsize::new(0));
            let script = Arc::new(Mutex::new(VecDeque::from(script)));
            let (requests_in, connections_in) = (Arc::clone(&requests), Arc::clone(&connections));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { return };
                    let connection = connections_in.fetch_add(1, Ordering::SeqCst);
                    let (requests, script) = (Arc::clone(&requests_in), Arc::clone(&script));
                    std::thread::spawn(move || serve(stream, connection, &requests, &script));
                }
            });
            Receiver {
                url,
                requests,
                connections,
            }
        }

        fn requests(&self) -> Vec<Recorded> {
            self.requests.lock().unwrap().clone()
        }

        fn only_request(&self) -> Recorded {
            let requests = self.requests();
            assert_eq!(requests.len(), 1, "{requests:#?}");
            requests.into_iter().next().unwrap()
        }
    }

    /// Serves one connection: reads requests (head, then a content-length body) until
    /// the client closes or a reply closes.
    fn serve(
        mut stream: TcpStream,
        connection: usize,
        requests: &Mutex<Vec<Recorded>>,
        script: &Mutex<VecDeque<Reply>>,
    ) {
        let mut buffer: Vec<u8> = Vec::new();
        loop {
            let head_end = loop {
                if let Some(at) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
                    break at + 4;
                }
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
            };
            let mut parsed_headers = [httparse::EMPTY_HEADER; 64];
            let mut request = httparse::Request::new(&mut parsed_headers);
            request.parse(&buffer[..head_end]).unwrap();
            let headers: Vec<(String, Vec<u8>)> = request
                .headers
                .iter()
                .map(|header| (header.name.to_ascii_lowercase(), header.value.to_vec()))
                .collect();
            let method = request.method.unwrap().to_owned();
            let path = request.path.unwrap().to_owned();
            let length: usize = headers
                .iter()
                .find(|(name, _)| name == "content-length")
                .map_or(0, |(_, value)| {
                    std::str::from_utf8(value).unwrap().parse().unwrap()
                });
            while buffer.len() < head_end + length {
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
            }
            let body = buffer[head_end..head_end + length].to_vec();
            buffer.drain(..head_end + length);
            requests.lock().unwrap().push(Recorded {
                method,
                path,
                headers,
                body,
                connection,
            });
            let next = script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or_else(|| reply(200));
            match next {
                Reply::Silent => {
                    // Wait for the client to give up and close.
                    let mut rest = Vec::new();
                    let _ = stream.read_to_end(&mut rest);
                    return;
                }
                Reply::Respond {
                    status,
                    headers,
                    body,
                    keep_alive,
                } => {
                    let mut response = format!("HTTP/1.1 {status} Scripted\r\n");
                    for (name, value) in headers {
                        response.push_str(&format!("{name}: {value}\r\n"));
                    }
                    if status != 204 && status != 304 {
                        response.push_str(&format!("content-length: {}\r\n", body.len()));
                    }
                    if !keep_alive {
                        response.push_str("connection: close\r\n");
                    }
                    response.push_str("\r\n");
                    response.push_str(body);
                    if stream.write_all(response.as_bytes()).is_err() || !keep_alive {
                        return;
                    }
                }
            }
        }
    }

    // ---- The sink under test. ----

    fn sink_config(url: &str) -> config::HttpSink {
        config::HttpSink {
            url: url.to_owned(),
            timeout_ms: 5_000,
            connect_timeout_ms: 2_000,
            headers: Vec::new(),
            forward_headers: Vec::new(),
            signing_secret: None,
        }
    }

    /// A body that is not UTF-8 and holds CR LF, to show it goes through untouched.
    const BODY: &[u8] = b"{\"id\":\"evt_1\"}\r\n\x00\xff\xfe";

    fn message(headers: &[(&str, &[u8])], ordering_key: Option<&str>) -> Message {
        Message {
            hook: Arc::new(HookRecord {
                source_id: "stripe".into(),
                tenant_id: "acme".into(),
                received_at_ms: 1_700_000_000_123,
                dedupe_key: Vec::new(),
                headers: headers
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), value.to_vec()))
                    .collect(),
                body: BODY.to_vec(),
            }),
            context: SinkContext {
                tenant_id: "acme".into(),
                source_id: "stripe".into(),
                sink_id: "http".into(),
                seq: 42,
                attempt: 3,
                idempotency_key: "acme:42:http".into(),
                received_at_ms: 1_700_000_000_123,
                ordering_key: ordering_key.map(str::to_owned),
                lane: None,
            },
        }
    }

    fn sink(config: &config::HttpSink) -> HttpSink {
        let pool = BlockingPool::new("test-http-sink", 2, &[]).unwrap();
        HttpSink::new("http", config, pool)
    }

    /// Delivers each message in turn on one glommio executor, as a pipeline core would.
    fn deliver_all(sink: &HttpSink, messages: Vec<Message>) -> Vec<Outcome> {
        let executor = glommio::LocalExecutorBuilder::default().make().unwrap();
        executor.run(async {
            let mut outcomes = Vec::new();
            for message in messages {
                outcomes.push(sink.deliver(message).await);
            }
            outcomes
        })
    }

    fn deliver(sink: &HttpSink, message: Message) -> Outcome {
        deliver_all(sink, vec![message]).pop().unwrap()
    }

    #[test]
    fn body_content_type_and_metadata_arrive_exactly() {
        let receiver = Receiver::start(vec![reply(200), reply(200)]);
        let sink = sink(&sink_config(&receiver.url));
        let with_type = message(
            &[("content-type", b"application/json; charset=utf-8")],
            None,
        );
        let ordered = message(&[], Some("cus_9"));
        let outcomes = deliver_all(&sink, vec![with_type, ordered]);
        assert_eq!(outcomes, [Outcome::Delivered, Outcome::Delivered]);
        let requests = receiver.requests();
        assert_eq!(requests.len(), 2);
        let expected_metadata = [
            ("x-ankusa-message-version", "1"),
            ("x-ankusa-idempotency-key", "acme:42:http"),
            ("x-ankusa-tenant", "acme"),
            ("x-ankusa-source", "stripe"),
            ("x-ankusa-seq", "42"),
            ("x-ankusa-received-at", "1700000000123"),
            ("x-ankusa-attempt", "3"),
        ];
        for request in &requests {
            assert_eq!(request.method, "POST");
            assert_eq!(request.path, "/hooks/in");
            assert_eq!(request.body, BODY);
            assert_eq!(request.header_text("content-length"), Some("19"));
            for (name, value) in expected_metadata {
                assert_eq!(request.header_text(name), Some(value), "{name}");
                assert_eq!(request.count(name), 1, "{name}");
            }
            assert_eq!(request.header("webhook-signature"), None);
        }
        assert_eq!(
            requests[0].header_text("content-type"),
            Some("application/json; charset=utf-8")
        );
        assert_eq!(requests[0].header("x-ankusa-ordering-key"), None);
        assert_eq!(
            requests[1].header_text("content-type"),
            Some("application/octet-stream")
        );
        assert_eq!(
            requests[1].header_text("x-ankusa-ordering-key"),
            Some("cus_9")
        );
    }

    #[test]
    fn static_and_forwarded_headers() {
        let receiver = Receiver::start(Vec::new());
        let mut config = sink_config(&receiver.url);
        config.headers = vec![
            ("Authorization".into(), "Bearer out-token".into()),
            ("X-Env".into(), "prod".into()),
            // Reserved: the metadata and the framing cannot be set from the config.
            ("X-Ankusa-Tenant".into(), "spoofed".into()),
            ("Content-Length".into(), "1".into()),
        ];
        config.forward_headers = vec![
            "x-request-id".into(),
            "x-binary".into(),
            "x-env".into(),
            "x-absent".into(),
            "x-ankusa-seq".into(),
            "transfer-encoding".into(),
        ];
        let sink = sink(&config);
        let hook_headers: &[(&str, &[u8])] = &[
            ("x-request-id", b"req-1"),
            ("x-binary", b"caf\xe9 \"quoted\""),
            ("x-env", b"from-provider"),
            ("x-ankusa-seq", b"999"),
            ("transfer-encoding", b"chunked"),
            ("x-request-id", b"req-2"),
        ];
        assert_eq!(
            deliver(&sink, message(hook_headers, None)),
            Outcome::Delivered
        );
        let request = receiver.only_request();
        assert_eq!(
            request.header_text("authorization"),
            Some("Bearer out-token")
        );
        let request_ids: Vec<&[u8]> = request
            .headers
            .iter()
            .filter(|(name, _)| name == "x-request-id")
            .map(|(_, value)| value.as_slice())
            .collect();
        assert_eq!(request_ids, [&b"req-1"[..], b"req-2"]);
        assert_eq!(request.header("x-binary"), Some(&b"caf\xe9 \"quoted\""[..]));
        // Forwarded after the static headers, so the provider's value wins.
        assert_eq!(request.header_text("x-env"), Some("from-provider"));
        assert_eq!(request.count("x-env"), 1);
        assert_eq!(request.header("x-absent"), None);
        assert_eq!(request.header_text("x-ankusa-tenant"), Some("acme"));
        assert_eq!(request.header_text("x-ankusa-seq"), Some("42"));
        assert_eq!(request.count("x-ankusa-seq"), 1);
        assert_eq!(request.header("transfer-encoding"), None);
        assert_eq!(request.body, BODY);
    }

    #[test]
    fn signature_verifies_with_the_inbound_verifier() {
        let receiver = Receiver::start(Vec::new());
        let key = b"sink-signing-key-0123456789".to_vec();
        let mut config = sink_config(&receiver.url);
        config.signing_secret = Some(key.clone());
        let sink = sink(&config);
        assert_eq!(deliver(&sink, message(&[], None)), Outcome::Delivered);
        let request = receiver.only_request();
        assert_eq!(request.header_text("webhook-id"), Some("acme:42:http"));
        let timestamp: u64 = request
            .header_text("webhook-timestamp")
            .unwrap()
            .parse()
            .unwrap();
        assert!(timestamp.abs_diff(clock::now_s()) <= 5, "{timestamp}");
        assert!(request
            .header_text("webhook-signature")
            .unwrap()
            .starts_with("v1,"));
        let scheme = config::Verify::StandardWebhooks {
            secret: key,
            tolerance_s: 300,
        };
        let verified = crate::verify::verify(&scheme, &request, &request.body, clock::now_s());
        assert_eq!(verified, Ok(()));
        let other = config::Verify::StandardWebhooks {
            secret: b"another-key".to_vec(),
            tolerance_s: 300,
        };
        assert_eq!(
            crate::verify::verify(&other, &request, &request.body, clock::now_s()),
            Err(crate::verify::VerifyError::BadSignature)
        );
    }

    #[test]
    fn a_host_name_is_looked_up() {
        // `localhost` is no address: it takes ureq's lookup, not the literal path; the
        // second attempt takes the looked-up addresses from the cache.
        let receiver = Receiver::start(vec![reply(200), reply(200)]);
        let url = receiver.url.replace("127.0.0.1", "localhost");
        assert!(url.starts_with("http://localhost:"), "{url}");
        let sink = sink(&sink_config(&url));
        let outcomes = deliver_all(&sink, vec![message(&[], None), message(&[], None)]);
        assert_eq!(outcomes, [Outcome::Delivered, Outcome::Delivered]);
        assert_eq!(receiver.requests().len(), 2);
    }

    #[test]
    fn success_statuses_are_delivered() {
        let receiver = Receiver::start(vec![reply(200), reply(204)]);
        let sink = sink(&sink_config(&receiver.url));
        let outcomes = deliver_all(&sink, vec![message(&[], None), message(&[], None)]);
        assert_eq!(outcomes, [Outcome::Delivered, Outcome::Delivered]);
    }

    #[test]
    fn retryable_statuses_retry_with_the_hint() {
        let with_hint = |status| Reply::Respond {
            status,
            headers: vec![("Retry-After", "7")],
            body: "busy",
            keep_alive: true,
        };
        let receiver = Receiver::start(vec![with_hint(500), with_hint(503), reply(429)]);
        let sink = sink(&sink_config(&receiver.url));
        let outcomes = deliver_all(
            &sink,
            vec![message(&[], None), message(&[], None), message(&[], None)],
        );
        let seven = Some(Duration::from_secs(7));
        assert_eq!(
            outcomes,
            [
                Outcome::Retry {
                    reason: "http 500: busy".into(),
                    retry_after: seven
                },
                Outcome::Retry {
                    reason: "http 503: busy".into(),
                    retry_after: seven
                },
                Outcome::Retry {
                    reason: "http 429".into(),
                    retry_after: None
                },
            ]
        );
    }

    #[test]
    fn refusals_are_permanent_with_status_and_body() {
        let receiver = Receiver::start(vec![
            Reply::Respond {
                status: 400,
                headers: Vec::new(),
                body: "  missing field `type`\n",
                keep_alive: true,
            },
            Reply::Respond {
                status: 301,
                headers: vec![("Location", "/elsewhere")],
                body: "",
                keep_alive: true,
            },
        ]);
        let sink = sink(&sink_config(&receiver.url));
        let outcomes = deliver_all(&sink, vec![message(&[], None), message(&[], None)]);
        assert_eq!(
            outcomes,
            [
                Outcome::Permanent {
                    reason: "http 400: missing field `type`".into()
                },
                Outcome::Permanent {
                    reason: "http 301".into()
                },
            ]
        );
        // The redirect was not followed.
        assert_eq!(receiver.requests().len(), 2);
    }

    #[test]
    fn a_closed_port_retries() {
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let sink = sink(&sink_config(&format!("http://127.0.0.1:{port}/x")));
        let outcome = deliver(&sink, message(&[], None));
        let Outcome::Retry {
            reason,
            retry_after: None,
        } = &outcome
        else {
            panic!("{outcome:?}");
        };
        assert!(reason.starts_with("connect: "), "{reason}");
    }

    #[test]
    fn https_goes_through_rustls() {
        // A server that answers the ClientHello in plain text: the handshake fails inside
        // rustls, which shows TLS is built in (without it ureq refuses https outright),
        // and a failed handshake is retried like any transport failure.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://{}/x", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
            }
        });
        let sink = sink(&sink_config(&url));
        let outcome = deliver(&sink, message(&[], None));
        let Outcome::Retry {
            reason,
            retry_after: None,
        } = &outcome
        else {
            panic!("{outcome:?}");
        };
        assert!(reason.starts_with("tls: "), "{reason}");
    }

    #[test]
    fn a_silent_receiver_times_out() {
        let receiver = Receiver::start(vec![Reply::Silent]);
        let mut config = sink_config(&receiver.url);
        config.timeout_ms = 300;
        let sink = sink(&config);
        let started = Instant::now();
        let outcome = deliver(&sink, message(&[], None));
        let elapsed = started.elapsed();
        assert_eq!(
            outcome,
            Outcome::Retry {
                reason: "timeout".into(),
                retry_after: None
            }
        );
        assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
        assert_eq!(receiver.requests().len(), 1);
    }

    #[test]
    fn keep_alive_reuses_one_connection() {
        let receiver = Receiver::start(Vec::new());
        let pool = BlockingPool::new("test-http-one", 1, &[]).unwrap();
        let sink = HttpSink::new("http", &sink_config(&receiver.url), pool);
        let outcomes = deliver_all(&sink, vec![message(&[], None), message(&[], None)]);
        assert_eq!(outcomes, [Outcome::Delivered, Outcome::Delivered]);
        let connections: Vec<usize> = receiver
            .requests()
            .iter()
            .map(|request| request.connection)
            .collect();
        assert_eq!(connections, [0, 0]);
        assert_eq!(receiver.connections.load(Ordering::SeqCst), 1);
    }

    /// A pool of 8 workers on 4 agents, 2 each: rounds of 8 attempts at once use at most
    /// one connection per worker, and attempts one at a time at most one per agent.
    #[test]
    fn workers_keep_their_connections_across_rounds() {
        let receiver = Receiver::start(Vec::new());
        let pool = BlockingPool::new("test-http-eight", 8, &[]).unwrap();
        let sink = Rc::new(HttpSink::new("http", &sink_config(&receiver.url), pool));
        let executor = glommio::LocalExecutorBuilder::default().make().unwrap();
        let outcomes = executor.run(async {
            let mut outcomes = Vec::new();
            for _ in 0..5 {
                let attempts: Vec<_> = (0..8)
                    .map(|_| {
                        let sink = Rc::clone(&sink);
                        glommio::spawn_local(async move { sink.deliver(message(&[], None)).await })
                    })
                    .collect();
                for attempt in attempts {
                    outcomes.push(attempt.await);
                }
            }
            outcomes
        });
        assert_eq!(outcomes, vec![Outcome::Delivered; 40]);
        assert!(receiver.connections.load(Ordering::SeqCst) <= 8);
        let sequential = deliver_all(&sink, (0..20).map(|_| message(&[], None)).collect());
        assert_eq!(sequential, vec![Outcome::Delivered; 20]);
        assert!(receiver.connections.load(Ordering::SeqCst) <= 8);
        assert_eq!(receiver.requests().len(), 60);
    }

    #[test]
    fn a_closed_connection_is_not_reused() {
        // The receiver closes after each answer: the second attempt must open a new
        // connection rather than fail on the dead one.
        let close = Reply::Respond {
            status: 200,
            headers: Vec::new(),
            body: "ok",
            keep_alive: false,
        };
        let receiver = Receiver::start(vec![close.clone(), close]);
        let sink = sink(&sink_config(&receiver.url));
        let outcomes = deliver_all(&sink, vec![message(&[], None), message(&[], None)]);
        assert_eq!(outcomes, [Outcome::Delivered, Outcome::Delivered]);
        assert_eq!(receiver.connections.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_closed_pool_retries() {
        let receiver = Receiver::start(Vec::new());
        let pool = BlockingPool::new("test-http-closed", 1, &[]).unwrap();
        let sink = HttpSink::new("http", &sink_config(&receiver.url), Arc::clone(&pool));
        pool.close();
        let outcome = deliver(&sink, message(&[], None));
        assert_eq!(
            outcome,
            Outcome::Retry {
                reason: "blocking pool test-http-closed is closed".into(),
                retry_after: None
            }
        );
        assert!(receiver.requests().is_empty());
    }
}
