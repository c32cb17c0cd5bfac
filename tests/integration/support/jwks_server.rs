//! A JSON Web Key Set served over loopback by the test itself, as an identity provider
//! would: the set (and the status) can be changed while orderd runs, and every fetch is
//! counted; answers can be held back, as a slow provider's are.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

pub struct JwksServer {
    pub url: String,
    answer: Arc<Mutex<(u16, String)>>,
    fetches: Arc<AtomicUsize>,
    delay_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    /// Serves `body` with status 200 on a free loopback port.
    pub async fn start(body: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, body)
    }

    /// Serves `body` on a given listener (a port chosen before the server existed).
    pub fn serve(listener: TcpListener, body: &str) -> Self {
        let url = format!(
            "http://{}/.well-known/jwks.json",
            listener.local_addr().unwrap()
        );
        let answer = Arc::new(Mutex::new((200, body.to_string())));
        let fetches = Arc::new(AtomicUsize::new(0));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (answer, fetches, delay_ms) = (answer.clone(), fetches.clone(), delay_ms.clone());
            async move {
                while let Ok((mut socket, _)) = listener.accept().await {
                    let (answer, fetches) = (answer.clone(), fetches.clone());
                    let delay = Duration::from_millis(delay_ms.load(Ordering::SeqCst));
                    tokio::spawn(async move {
                        let mut head = Vec::new();
                        let mut buf = [0u8; 1024];
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match socket.read(&mut buf).await {
                                Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                                _ => return,
                            }
                        }
                        fetches.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(delay).await;
                        let (status, body) = answer.lock().unwrap().clone();
                        let response = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = socket.write_all(response.as_bytes()).await;
                    });
                }
            }
        });
        Self {
            url,
            answer,
            fetches,
            delay_ms,
            task,
        }
    }

    pub fn set(&self, status: u16, body: &str) {
        *self.answer.lock().unwrap() = (status, body.to_string());
    }

    /// Holds every later answer back this long.
    pub fn delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
