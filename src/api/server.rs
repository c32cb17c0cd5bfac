//! The HTTP/1.1 server under the routes, on hyper's connection driver: the accept loop,
//! the connection cap, the read, idle and write deadlines, and problem+json for what the
//! protocol layer refuses by itself. Every listener of the process (the API and the
//! metrics one) is served by [`serve`], so they all stop the same way.
//!
//! Stock parts do what they can: hyper parses and writes HTTP/1.1, hyper-util's
//! [`GracefulShutdown`] drains connections at shutdown, poem's boxed endpoint is shared
//! by every connection, and `rlimit` raises the descriptor limit. What is left here is
//! what none of them offers (decision 110 in docs/adr):
//!
//! - at most `max_connections` connections are open (also kept below the process's
//!   file-descriptor limit). When all are open, the next client is accepted and the
//!   connection idle longest between requests is closed to make room ([`Open`]), so
//!   that connections nobody uses (anonymous ones included) never keep a tenant out;
//!   when none is idle, the client waits for one to be, or for one to close (the
//!   others stay bounded by their read and write deadlines). An `accept` that fails
//!   (descriptors exhausted) is retried after a pause, not in a loop;
//! - every connection has one deadline at a time, tracked by [`Conn`]: a new connection
//!   must deliver a whole request (head and body) within the read timeout, a request must
//!   arrive whole within the read timeout of its first byte, and a keep-alive connection
//!   may idle for the idle timeout; a response must be taken by the client within the
//!   write timeout of its first byte. A head that misses its deadline is answered 408
//!   and the connection closed; a late body is answered 408 by `middleware::limit_body`;
//!   a response not taken in time is abandoned and the connection closed;
//! - HTTP/1.1 only: HTTP/2 belongs behind a TLS-terminating proxy;
//! - hyper answers a malformed or oversized head (400, 414, 431) itself, with an empty
//!   body; [`Watched`] replaces that answer with a problem+json body.

use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, combinators::BoxBody};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
};
use poem::{
    Endpoint, EndpointExt, IntoEndpoint,
    endpoint::BoxEndpoint,
    web::{LocalAddr, RemoteAddr},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{Notify, OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use super::problem::{AppKind, Kind, Problem};

/// Largest request head hyper buffers; a longer one is refused with 431.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest total size of the header fields; more is refused with 431.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;
/// Most header fields in one request; more is refused with 431.
pub const MAX_HEADERS: usize = 128;
/// Descriptors kept free for everything that is not a client connection (database
/// pool, listeners, files).
const RESERVED_FDS: u64 = 256;

/// How the server treats connections.
#[derive(Debug, Clone)]
pub struct Limits {
    pub read_timeout: Duration,
    pub idle_timeout: Duration,
    /// How long a response may take to be taken by the client, from its first byte.
    pub write_timeout: Duration,
    pub max_connections: usize,
}

/// Serves `endpoint` on `listener` until `shutdown` resolves, then stops accepting, lets
/// requests in progress finish within `grace`, and leaves what remains to the end of
/// the process.
pub async fn serve<E>(
    listener: TcpListener,
    endpoint: E,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> io::Result<()>
where
    E: IntoEndpoint,
    E::Endpoint: 'static,
{
    let endpoint: Arc<BoxEndpoint<'static>> =
        Arc::new(endpoint.into_endpoint().map_to_response().boxed());
    let local = listener.local_addr()?;
    let max_connections = limits.max_connections.min(descriptor_budget());
    let slots = Arc::new(Semaphore::new(max_connections));
    let open = Arc::new(Open::default());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    let mut accept_errors_logged_at: Option<Instant> = None;
    loop {
        let (socket, remote) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors (or memory): pause instead of spinning, and
                    // say so at most every ten seconds.
                    let now = Instant::now();
                    if accept_errors_logged_at.is_none_or(|t| now - t > Duration::from_secs(10)) {
                        tracing::warn!(error = %e, "cannot accept connections; pausing");
                        accept_errors_logged_at = Some(now);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let slot = tokio::select! {
            _ = &mut shutdown => break,
            slot = open.slot_for_new(&slots) => slot,
        };
        let _ = socket.set_nodelay(true);
        let conn = Arc::new(Conn::new(limits.read_timeout, open.clone()));
        let registered = open.register(conn.clone());
        let connection = serve_connection(
            socket,
            local,
            remote,
            conn,
            endpoint.clone(),
            &limits,
            &graceful,
        );
        tokio::spawn(async move {
            connection.await;
            drop(registered);
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace period; leaving them");
    }
    Ok(())
}

/// How many connections the file-descriptor limit allows, after raising the soft
/// limit to the hard one.
fn descriptor_budget() -> usize {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => {
            usize::try_from(limit.saturating_sub(RESERVED_FDS).max(16)).unwrap_or(usize::MAX)
        }
        Err(_) => usize::MAX,
    }
}

/// Drives one accepted connection to its end on hyper's driver, enforcing its deadlines;
/// `graceful` winds it down (the request in progress is finished) at shutdown.
fn serve_connection(
    socket: TcpStream,
    local: SocketAddr,
    remote: SocketAddr,
    conn: Arc<Conn>,
    endpoint: Arc<BoxEndpoint<'static>>,
    limits: &Limits,
    graceful: &GracefulShutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let service = {
        let conn = conn.clone();
        hyper::service::service_fn(move |req: http::Request<Incoming>| {
            let (endpoint, conn) = (endpoint.clone(), conn.clone());
            async move {
                conn.set(Phase::Body);
                let mut req: poem::Request = (
                    req,
                    LocalAddr(local.into()),
                    RemoteAddr(remote.into()),
                    http::uri::Scheme::HTTP,
                )
                    .into();
                req.extensions_mut().insert(conn.clone());
                let response: http::Response<BoxBody<Bytes, io::Error>> =
                    endpoint.get_response(req).await.into();
                // The connection is idle again once hyper has taken the whole body (or
                // dropped it unread, as for HEAD).
                let idle = IdleOnDrop(conn);
                let response = response.map(|body| {
                    BoxBody::new(body.with_trailers(async move {
                        drop(idle);
                        None
                    }))
                });
                Ok::<_, Infallible>(response)
            }
        })
    };
    let io = TokioIo::new(Watched {
        inner: socket,
        conn: conn.clone(),
        replacement: None,
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // hyper's own head deadline (30 s unless told otherwise, once a timer is set)
        // also runs while a kept-alive connection waits for its next head, so it would
        // silently cap `ORDERD_HTTP_IDLE_TIMEOUT_MS`, and it cannot give a new
        // connection a shorter deadline than an idle one; [`Conn`] decides both.
        .header_read_timeout(None)
        .keep_alive(true)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_header_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS);
    let driver = graceful.watch(builder.serve_connection(io, service));
    let limits = limits.clone();
    async move {
        tokio::pin!(driver);
        loop {
            let deadline = conn.deadline(&limits);
            tokio::select! {
                // A phase change first: an eviction must be seen before the driver
                // reads a request that arrived meanwhile.
                biased;
                _ = conn.changed.notified() => {
                    // Closed to make room for a new connection: dropping the driver
                    // closes the socket.
                    if conn.evicted() {
                        return;
                    }
                }
                _ = &mut driver => return,
                _ = tokio::time::sleep_until(deadline) => {
                    if conn.deadline(&limits) > Instant::now() {
                        continue; // the phase moved on meanwhile
                    }
                    match conn.phase() {
                        // A late head: answer 408 and close (through the read side,
                        // see `Watched`), giving hyper a moment to write it.
                        Phase::Head => {
                            conn.time_out();
                            let _ = tokio::time::timeout(Duration::from_secs(1), &mut driver).await;
                        }
                        // A late body is answered by the body middleware, so this is
                        // the backstop; an idle connection has nothing to finish; a
                        // client that does not take its response is abandoned, so
                        // that it holds its connection slot no longer. Dropping the
                        // driver closes the socket.
                        Phase::Body | Phase::Idle { .. } | Phase::Handling => {}
                    }
                    return;
                }
            }
        }
    }
}

/// The open connections of one listener, so that when all slots are taken the one idle
/// longest can be closed to admit a new client.
///
/// Idle connections are found by a scan, which happens only when every slot is taken
/// (a few microseconds per thousand connections); keeping them ordered by idleness
/// instead would cost every request on every connection a shared lock.
#[derive(Default)]
struct Open {
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    /// Signalled whenever a connection turns idle, for a client waiting for a slot.
    turned_idle: Notify,
}

/// A connection's entry in [`Open`], removed when dropped.
struct Registered {
    open: Arc<Open>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.lock().remove(&self.id);
    }
}

impl Open {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(self: &Arc<Self>, conn: Arc<Conn>) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, conn);
        Registered {
            open: self.clone(),
            id,
        }
    }

    /// A slot for a client just accepted: a free one, else the one the connection
    /// idle longest gives back when it is closed for it, else the first to come free
    /// (or to turn idle).
    async fn slot_for_new(&self, slots: &Arc<Semaphore>) -> OwnedSemaphorePermit {
        loop {
            if let Ok(slot) = slots.clone().try_acquire_owned() {
                return slot;
            }
            // Armed before looking, so that a connection turning idle meanwhile is
            // not missed.
            let turned_idle = self.turned_idle.notified();
            if self.evict_longest_idle() {
                // Its task ends at once and hands its slot back.
                return slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed");
            }
            tokio::select! {
                slot = slots.clone().acquire_owned() => {
                    return slot.expect("the semaphore is never closed");
                }
                _ = turned_idle => {}
            }
        }
    }

    /// Closes the connection idle longest between requests, if any is idle.
    fn evict_longest_idle(&self) -> bool {
        loop {
            let longest = self
                .lock()
                .values()
                .filter_map(|conn| conn.idle_since().map(|since| (since, conn.clone())))
                .min_by_key(|(since, _)| *since);
            let Some((_, conn)) = longest else {
                return false;
            };
            // It may have started a request since the scan: then look again.
            if conn.evict() {
                tracing::debug!("all connection slots taken: closed the connection idle longest");
                return true;
            }
        }
    }
}

/// Marks the connection idle when dropped: after the last frame of a response body.
struct IdleOnDrop(Arc<Conn>);

impl Drop for IdleOnDrop {
    fn drop(&mut self) {
        self.0.set_idle();
    }
}

/// Where a connection is in its life, which decides its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A head is due, or arriving: on a new connection since it opened, on a kept-alive
    /// one since the first byte of the request.
    Head,
    /// The head is parsed; the body is being read by the middleware.
    Body,
    /// The request is complete; the handler runs or the response is being written.
    Handling,
    /// Between requests on a keep-alive connection, since `since`.
    Idle { since: Instant },
}

/// The state of one connection, shared by the socket wrapper, the request (as request
/// data, so the body middleware can keep the deadline) and the connection's task.
pub struct Conn {
    state: Mutex<State>,
    /// Signalled on every phase change, so the connection task re-arms its timer.
    changed: Notify,
    /// The listener's connections, told when this one turns idle.
    open: Arc<Open>,
}

struct State {
    phase: Phase,
    /// When the current request's first byte arrived (or the connection opened).
    request_started: Instant,
    read_timeout: Duration,
    timed_out: bool,
    read_waker: Option<Waker>,
    /// When the current response's first byte was handed to the socket.
    response_started: Option<Instant>,
    /// Closed while idle to make room for a new connection.
    evicted: bool,
}

impl Conn {
    fn new(read_timeout: Duration, open: Arc<Open>) -> Self {
        let now = Instant::now();
        Self {
            state: Mutex::new(State {
                phase: Phase::Head,
                request_started: now,
                read_timeout,
                timed_out: false,
                read_waker: None,
                response_started: None,
                evicted: false,
            }),
            changed: Notify::new(),
            open,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn phase(&self) -> Phase {
        self.lock().phase
    }

    fn set(&self, phase: Phase) {
        let mut state = self.lock();
        state.phase = phase;
        state.response_started = None;
        drop(state);
        self.changed.notify_one();
    }

    /// A response's bytes are being written: its write deadline starts with the first.
    fn on_write(&self) {
        let mut state = self.lock();
        if state.phase == Phase::Handling && state.response_started.is_none() {
            state.response_started = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    fn set_idle(&self) {
        self.set(Phase::Idle {
            since: Instant::now(),
        });
        self.open.turned_idle.notify_waiters();
    }

    /// Since when the connection has been idle between requests, if it is.
    fn idle_since(&self) -> Option<Instant> {
        match self.lock().phase {
            Phase::Idle { since } => Some(since),
            _ => None,
        }
    }

    /// Closes the connection if it is still idle (and not closed already); whether it
    /// did. A request that begins afterwards finds the connection gone, as after an
    /// idle timeout.
    fn evict(&self) -> bool {
        let mut state = self.lock();
        if !matches!(state.phase, Phase::Idle { .. }) || state.evicted {
            return false;
        }
        state.evicted = true;
        drop(state);
        self.changed.notify_one();
        true
    }

    fn evicted(&self) -> bool {
        self.lock().evicted
    }

    /// The whole body of the current request is in: the read deadline no longer applies.
    pub fn body_received(&self) {
        self.set(Phase::Handling);
    }

    /// When the current request must have arrived whole.
    pub fn request_deadline(&self) -> Instant {
        let state = self.lock();
        state.request_started + state.read_timeout
    }

    fn deadline(&self, limits: &Limits) -> Instant {
        let state = self.lock();
        match state.phase {
            Phase::Head => state.request_started + limits.read_timeout,
            // The middleware answers 408 at the read deadline; this backstop is later.
            Phase::Body => state.request_started + limits.read_timeout + Duration::from_secs(2),
            // The handler's own work is bounded by the statement timeout; once the
            // response is being written, the client has the write timeout to take it.
            Phase::Handling => match state.response_started {
                Some(started) => started + limits.write_timeout,
                None => Instant::now() + Duration::from_secs(3600),
            },
            Phase::Idle { since } => since + limits.idle_timeout,
        }
    }

    /// Bytes arrived: on an idle connection, a new request starts (unless it was
    /// closed to make room, when the bytes are dropped with it).
    fn on_read(&self) {
        let mut state = self.lock();
        if let Phase::Idle { .. } = state.phase
            && !state.evicted
        {
            state.phase = Phase::Head;
            state.request_started = Instant::now();
            drop(state);
            self.changed.notify_one();
        }
    }

    /// The head is late: the read side answers 408 and ends the connection.
    fn time_out(&self) {
        let mut state = self.lock();
        state.timed_out = true;
        if let Some(waker) = state.read_waker.take() {
            waker.wake();
        }
    }
}

/// The socket as hyper sees it: notes when requests start, answers 408 for a late head,
/// and turns hyper's empty automatic refusals into problem+json.
struct Watched {
    inner: TcpStream,
    conn: Arc<Conn>,
    /// Our answer in place of hyper's, and how much of it is written.
    replacement: Option<(Vec<u8>, usize)>,
}

impl Watched {
    /// Writes what is left of the replacement answer; ready when all of it is out.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.replacement {
            if *written == bytes.len() {
                return Poll::Ready(Ok(()));
            }
            let n =
                std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.conn.lock().timed_out {
            if this.replacement.is_none() {
                let problem = Problem::new(Kind::RequestTimeout)
                    .with_detail("the request did not arrive in time");
                this.replacement = Some((raw_response(&problem), 0));
            }
            std::task::ready!(this.poll_replacement(cx))?;
            // End of input: hyper closes the connection without answering itself.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.conn.on_read();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                this.conn.lock().read_waker = Some(cx.waker().clone());
                Poll::Pending
            }
            other => other,
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.replacement.is_some() {
            // hyper's own answer is being replaced: swallow the rest of it.
            std::task::ready!(this.poll_replacement(cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        if this.conn.phase() == Phase::Head
            && let Some(problem) = automatic_refusal(buf)
        {
            this.replacement = Some((raw_response(&problem), 0));
            std::task::ready!(this.poll_replacement(cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        this.conn.on_write();
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    /// Vectored, as the socket is: hyper then queues a response's head and body
    /// buffers and writes them as they are; without it, it copies every body into one
    /// buffer first (the 1.5 MB docs page, or the metrics page, once per request).
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // A replacement under way, or a head that may be hyper's automatic refusal, is
        // looked at one buffer at a time, as `poll_write` does.
        if self.replacement.is_some() || self.conn.phase() == Phase::Head {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return self.poll_write(cx, first);
        }
        self.conn.on_write();
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_replacement(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_replacement(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The problem for hyper's automatic answer to a head it could not parse: a status line
/// of 400, 414 or 431 with no `content-type`. Every answer of the service carries a
/// content type, so none is mistaken for one of these.
fn automatic_refusal(buf: &[u8]) -> Option<Problem> {
    let head = std::str::from_utf8(buf.get(..buf.len().min(512))?).ok()?;
    let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    if head.to_ascii_lowercase().contains("\r\ncontent-type:") {
        return None;
    }
    Some(match status {
        "400" => Problem::app(AppKind::ValidationError)
            .with_detail("the request is not valid HTTP/1.1 (HTTP/2 is not served here)"),
        "414" => Problem::new(Kind::UriTooLong),
        "431" => Problem::new(Kind::HeadersTooLarge).with_detail(format!(
            "request heads are limited to {MAX_HEADERS} fields and {MAX_HEADER_BYTES} bytes"
        )),
        _ => return None,
    })
}

/// A complete HTTP/1.1 response carrying `problem`, after which the connection closes.
fn raw_response(problem: &Problem) -> Vec<u8> {
    let status = problem.kind.status();
    let body = serde_json::to_vec(&problem.details()).unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        super::problem::PROBLEM_JSON,
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_empty_refusals_are_recognised_and_service_answers_are_not() {
        let bare =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(automatic_refusal(bare).unwrap().kind, Kind::HeadersTooLarge);
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 2\r\n\r\n{}";
        assert!(automatic_refusal(ours).is_none());
        assert!(automatic_refusal(b"HTTP/1.1 201 Created\r\n\r\n").is_none());
    }

    #[test]
    fn a_raw_problem_response_is_complete_http() {
        let raw = raw_response(&Problem::new(Kind::RequestTimeout));
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{head}"
        );
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(body.contains("/problems/request-timeout"));
    }
}
