//! A loopback TCP forwarder that a test can take down and bring back, to play a broker
//! outage without stopping a server other tests share: `down` cuts every open connection
//! and closes new ones at once, `up` forwards again, at the same address.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
}

struct State {
    up: AtomicBool,
    /// Bumped by `down`: a pump that sees a newer generation than its own closes.
    generation: AtomicU64,
    stopped: AtomicBool,
    /// Both ends of every forwarded connection, so `down` can cut them at once.
    open: Mutex<Vec<TcpStream>>,
}

impl Proxy {
    /// Forwards a new loopback port to `target` (`host:port`), up from the start.
    pub fn start(target: &str) -> Proxy {
        let target: SocketAddr = target.parse().expect("target is host:port");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            up: AtomicBool::new(true),
            generation: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
        });
        let accepting = state.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopped.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                if !accepting.up.load(Ordering::Acquire) {
                    // Down: the peer sees its connection closed at once.
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
                    continue;
                };
                let generation = accepting.generation.load(Ordering::Acquire);
                {
                    let mut open = accepting.open.lock().unwrap();
                    open.push(client.try_clone().unwrap());
                    open.push(server.try_clone().unwrap());
                }
                pump(&client, &server, generation, accepting.clone());
                pump(&server, &client, generation, accepting.clone());
            }
        });
        Proxy { addr, state }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn down(&self) {
        self.state.up.store(false, Ordering::Release);
        self.state.generation.fetch_add(1, Ordering::AcqRel);
        // Cut now: a request already on its way must not slip through.
        for stream in self.state.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    pub fn up(&self) {
        self.state.up.store(true, Ordering::Release);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.down();
        self.state.stopped.store(true, Ordering::Release);
        // Wakes the accept loop so it sees `stopped`.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `from` to `to` on its own thread until either side closes or the proxy goes down.
fn pump(from: &TcpStream, to: &TcpStream, generation: u64, state: Arc<State>) {
    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
    // A short read timeout lets the pump notice `down` on an idle connection.
    from.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            if state.generation.load(Ordering::Acquire) != generation {
                break;
            }
            match from.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
}
