//! A TCP proxy between orderd and the SNS endpoint that a test can switch: forward,
//! refuse (SNS "down": every connection cut at once), or hold responses (SNS received
//! and processed the request, but the answer does not reach orderd yet).

use std::net::SocketAddr;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Refuse,
    HoldResponses,
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
    if *mode.borrow() == Mode::Refuse {
        return; // dropping the socket closes it
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match client_read.read(&mut buf).await {
                Ok(n) if n > 0 => {
                    if server_write.write_all(&buf[..n]).await.is_err() {
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
            // While holding, the answer waits here; a switch to Refuse drops it.
            while *watcher.borrow() == Mode::HoldResponses {
                watcher.changed().await.ok()?;
            }
            if *watcher.borrow() == Mode::Refuse {
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
