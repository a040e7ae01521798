//! A real HTTP receiver on loopback for delivery tests: records every request with its
//! arrival time, tracks how many run at once per (tenant, path), and answers as the test
//! scripts it.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn seq(&self) -> u64 {
        self.header("x-ankusa-seq").unwrap().parse().unwrap()
    }
    pub fn attempt(&self) -> u32 {
        self.header("x-ankusa-attempt").unwrap().parse().unwrap()
    }
    pub fn ordering_key(&self) -> Option<&str> {
        self.header("x-ankusa-ordering-key")
    }
    /// A field of the JSON body, as text.
    pub fn field(&self, name: &str) -> String {
        let body: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        match &body[name] {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        }
    }
}

/// What the receiver answers: status, extra headers, and how long it waits first.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
        }
    }
    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }
    pub fn with_body(mut self, body: &str) -> Reply {
        self.body = body.into();
        self
    }
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

type Script = dyn Fn(&Received, usize) -> Reply + Send + Sync;

/// Joins a (tenant, path) to an ordering key in the concurrency maps.
const LANE_SEPARATOR: char = '\u{1f}';

struct State {
    received: Mutex<Vec<Received>>,
    /// Requests received per `x-ankusa-idempotency-key` (None: without one), so a script's
    /// count of earlier attempts costs a lookup, not a pass over every request so far.
    attempts: Mutex<HashMap<Option<String>, usize>>,
    changed: Condvar,
    running: Mutex<HashMap<String, usize>>,
    max_running: Mutex<HashMap<String, usize>>,
    script: Mutex<Arc<Script>>,
    /// Requests of a held path wait here until released.
    held: Mutex<bool>,
    released: Condvar,
    stop: AtomicBool,
}

pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl Receiver {
    /// Starts a receiver answering 200 to everything.
    pub fn start() -> Receiver {
        Receiver::scripted(|_, _| Reply::status(200))
    }

    /// `script(request, n)` decides each answer; `n` counts earlier requests with the same
    /// `x-ankusa-idempotency-key` (0 for a hook's first attempt).
    pub fn scripted(
        script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static,
    ) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            received: Mutex::new(Vec::new()),
            attempts: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            running: Mutex::new(HashMap::new()),
            max_running: Mutex::new(HashMap::new()),
            script: Mutex::new(Arc::new(script)),
            held: Mutex::new(false),
            released: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let accept_state = state.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                if accept_state.stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let state = accept_state.clone();
                thread::spawn(move || serve(stream, state));
            }
        });
        Receiver { addr, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn set_script(&self, script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static) {
        *self.state.script.lock().unwrap() = Arc::new(script);
    }

    /// Every request from now on waits (unanswered) until [`Receiver::release`].
    pub fn hold(&self) {
        *self.state.held.lock().unwrap() = true;
    }

    pub fn release(&self) {
        *self.state.held.lock().unwrap() = false;
        self.state.released.notify_all();
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// Waits until `done(received)` holds; panics with what arrived after `timeout`.
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        let mut received = self.state.received.lock().unwrap();
        loop {
            if done(&received) {
                return received.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                let count = received.len();
                // Unlock first so the connection threads do not see a poisoned lock.
                drop(received);
                panic!("receiver: condition not met after {timeout:?}; {count} requests arrived");
            }
            received = self
                .state
                .changed
                .wait_timeout(received, deadline - now)
                .unwrap()
                .0;
        }
    }

    /// Waits for requests carrying `count` distinct idempotency keys.
    pub fn wait_for_hooks(&self, count: usize, timeout: Duration) -> Vec<Received> {
        // Counted from the per-key tally: a pass over every request at each arrival would
        // hold the lock the connection threads need for longer as the test goes on.
        self.wait_for(timeout, |_| {
            let attempts = self.state.attempts.lock().unwrap();
            attempts.len() - usize::from(attempts.contains_key(&None)) >= count
        })
    }

    /// The most requests that ran at once for one (tenant, path).
    pub fn max_concurrency(&self) -> usize {
        self.state
            .max_running
            .lock()
            .unwrap()
            .iter()
            .filter(|(key, _)| !key.contains(LANE_SEPARATOR))
            .map(|(_, count)| *count)
            .max()
            .unwrap_or(0)
    }

    /// The most requests that ran at once for one (tenant, path, ordering key).
    pub fn max_concurrency_per_ordering_key(&self) -> usize {
        self.state
            .max_running
            .lock()
            .unwrap()
            .iter()
            .filter(|(key, _)| key.contains(LANE_SEPARATOR))
            .map(|(_, count)| *count)
            .max()
            .unwrap_or(0)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        self.release();
        let _ = TcpStream::connect(self.addr);
    }
}

pub fn distinct_keys(received: &[Received]) -> usize {
    let mut keys: Vec<&str> = received
        .iter()
        .filter_map(|r| r.header("x-ankusa-idempotency-key"))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys.len()
}

fn serve(stream: TcpStream, state: Arc<State>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map(|(_, v)| v.parse().unwrap())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let request = Received {
            path,
            headers,
            body,
            at: Instant::now(),
        };
        let key = format!(
            "{}{}",
            request.header("x-ankusa-tenant").unwrap_or(""),
            request.path
        );
        // Per ordering lane too: (tenant, path, ordering key).
        let lane_key = request
            .ordering_key()
            .map(|ordering_key| format!("{key}{LANE_SEPARATOR}{ordering_key}"));
        for key in std::iter::once(&key).chain(lane_key.as_ref()) {
            let mut running = state.running.lock().unwrap();
            let count = running.entry(key.clone()).or_default();
            *count += 1;
            let mut max = state.max_running.lock().unwrap();
            let top = max.entry(key.clone()).or_default();
            *top = (*top).max(*count);
        }
        let earlier = {
            let mut received = state.received.lock().unwrap();
            let id = request
                .header("x-ankusa-idempotency-key")
                .map(str::to_owned);
            let mut attempts = state.attempts.lock().unwrap();
            let seen = attempts.entry(id).or_default();
            let earlier = *seen;
            *seen += 1;
            received.push(request.clone());
            state.changed.notify_all();
            earlier
        };
        {
            let mut held = state.held.lock().unwrap();
            while *held && !state.stop.load(Ordering::Acquire) {
                held = state.released.wait(held).unwrap();
            }
        }
        let script = state.script.lock().unwrap().clone();
        let reply = script(&request, earlier);
        thread::sleep(reply.delay);
        for key in std::iter::once(&key).chain(lane_key.as_ref()) {
            *state.running.lock().unwrap().get_mut(key).unwrap() -= 1;
        }
        let mut response = format!(
            "HTTP/1.1 {} X\r\ncontent-length: {}\r\n",
            reply.status,
            reply.body.len()
        );
        for (name, value) in &reply.headers {
            response.push_str(&format!("{name}: {value}\r\n"));
        }
        response.push_str("\r\n");
        response.push_str(&reply.body);
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}
