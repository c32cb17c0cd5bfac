//! A TCP proxy between orderd and a server it talks to (SNS, PostgreSQL) that a test can
//! switch: forward, refuse (the server "down": every connection cut at once), hold
//! responses (the server received and processed the request, but the answer does not
//! reach orderd yet), or go silent (packets dropped by a firewall that forgot the flow:
//! nothing passes either way, no connection is closed, a new one never completes;
//! once healed, what was held goes through, as TCP's retransmissions would), or cut a
//! connection just after a request carrying given bytes went out (a statement that
//! commits on its own, or a `COMMIT`: the server commits, the answer never arrives, an
//! ambiguous commit), or hold a connection's answers once such a request went out (a
//! process stopped right after its statement committed).

use std::{net::SocketAddr, str::FromStr};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
};

use super::db::{TestDb, citus_workers, node_address, on_citus};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Refuse,
    HoldResponses,
    Silent,
    /// Cut each connection just after it sends a request holding these bytes.
    CutAfter(&'static str),
    /// Hold each connection's answers, from just after it sends a request holding these
    /// bytes (a bound value: a statement's text goes out in its own round trip when it
    /// is prepared), until the mode changes (the request itself reaches the server).
    HoldAfter(&'static [u8]),
    /// The same from the first `COMMIT` sent once such a request went out.
    HoldAtCommitAfter(&'static [u8]),
}

/// Waits while `mode` is one of `held`; says whether the connection may go on (not
/// refused, and the proxy still there).
async fn pass(mode: &mut watch::Receiver<Mode>, held: &[Mode]) -> bool {
    while held.contains(&*mode.borrow_and_update()) {
        if mode.changed().await.is_err() {
            return false;
        }
    }
    *mode.borrow() != Mode::Refuse
}

pub struct Proxy {
    pub address: SocketAddr,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (mode, watcher) = watch::channel(Mode::Forward);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watcher = watcher.clone();
                tokio::spawn(serve(client, upstream, watcher));
            }
        });
        Self {
            address,
            mode,
            task,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<Mode>) {
    // A connection made while silent hangs until healed (or refused: dropping the
    // socket closes it).
    if !pass(&mut mode, &[Mode::Silent]).await {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut sending = mode.clone();
    let cut = std::sync::atomic::AtomicBool::new(false);
    let hold = std::sync::atomic::AtomicBool::new(false);
    let requests = async {
        let mut buf = vec![0u8; 16 * 1024];
        // Whether the marker of `HoldAtCommitAfter` went out on this connection.
        let mut marked = false;
        loop {
            match client_read.read(&mut buf).await {
                Ok(n) if n > 0 => {
                    if !pass(&mut sending, &[Mode::Silent]).await {
                        return;
                    }
                    let holds = |bytes: &[u8]| buf[..n].windows(bytes.len()).any(|w| w == bytes);
                    let mode_now = *sending.borrow();
                    let (cutting, holding) = match mode_now {
                        Mode::CutAfter(marker) => (holds(marker.as_bytes()), false),
                        Mode::HoldAfter(marker) => (false, holds(marker)),
                        Mode::HoldAtCommitAfter(marker) => {
                            marked |= holds(marker);
                            (false, marked && holds(b"COMMIT"))
                        }
                        _ => (false, false),
                    };
                    if holding {
                        hold.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    if cutting {
                        // No answer goes back from here on.
                        cut.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    if cutting {
                        // The server has the request; give it a moment to read it,
                        // then cut the connection.
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        return;
                    }
                }
                _ => return,
            }
        }
    };
    let mut watcher = mode.clone();
    let responses = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = server_read.read(&mut buf).await.ok().filter(|&n| n > 0)?;
            // A connection whose answers are held waits for the mode to change.
            if hold.load(std::sync::atomic::Ordering::SeqCst) {
                while matches!(
                    *watcher.borrow_and_update(),
                    Mode::HoldAfter(_) | Mode::HoldAtCommitAfter(_)
                ) {
                    watcher.changed().await.ok()?;
                }
                hold.store(false, std::sync::atomic::Ordering::SeqCst);
            }
            // While holding or silent, the answer waits here; a switch to Refuse drops it.
            if !pass(&mut watcher, &[Mode::HoldResponses, Mode::Silent]).await
                || cut.load(std::sync::atomic::Ordering::SeqCst)
            {
                return None::<()>;
            }
            client_write.write_all(&buf[..n]).await.ok()?;
        }
    };
    let refused = async {
        loop {
            if *mode.borrow_and_update() == Mode::Refuse {
                return;
            }
            if mode.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        _ = responses => {}
        _ = refused => {}
    }
}

/// A proxy in front of the PostgreSQL server of `url` (a test database's URL), and the
/// same URL through it.
pub async fn in_front_of_db(url: &str) -> (Proxy, String) {
    let (scheme_user, rest) = url.split_once('@').expect("a URL with a user");
    let (address, path) = rest.split_once('/').expect("a URL with a database");
    let upstream: SocketAddr = address.parse().expect("a database at an IP address");
    let proxy = Proxy::start(upstream).await;
    let through = format!("{scheme_user}@{}/{path}", proxy.address);
    (proxy, through)
}

/// A proxy in front of every server of a test database, set as one: the network
/// between orderd and its database, whichever node a statement goes to.
pub struct Network {
    proxies: Vec<Proxy>,
}

impl Network {
    pub fn set(&self, mode: Mode) {
        for proxy in &self.proxies {
            proxy.set(mode);
        }
    }
}

/// A test database behind a [`Network`], and its URL through it. On one server, a
/// proxy in front of it. On Citus, one in front of the coordinator and one in front of
/// each worker: the database knows each worker at its proxy's address, so the
/// coordinator reaches it there, and so does orderd, whose routes to a tenant's node
/// take that address (`DATABASE_URL`'s host with the node's port). A fault set on the
/// network is then met by every statement, routed or not.
pub async fn database_behind_network() -> (TestDb, Network, String) {
    let mut proxies = Vec::new();
    let db = if on_citus() {
        for worker in citus_workers() {
            let upstream =
                SocketAddr::from_str(&node_address(&worker)).expect("a worker at an IP address");
            proxies.push(Proxy::start(upstream).await);
        }
        let addresses: Vec<String> = proxies.iter().map(|p| p.address.to_string()).collect();
        TestDb::on_citus_reaching(|i, _| addresses[i].clone()).await
    } else {
        TestDb::new().await
    };
    let (coordinator, through) = in_front_of_db(&db.url).await;
    proxies.push(coordinator);
    (db, Network { proxies }, through)
}
