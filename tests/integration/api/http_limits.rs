//! The HTTP layer against hostile clients, over raw TCP: read and idle timeouts, the
//! caps on connections and requests in flight, and problem+json for everything the
//! protocol layer refuses (docs/contract.md §1, §5).

use std::time::Duration;

use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use uuid::Uuid;

use crate::support::{KillOnDrop, SECRET, TestApp, TestDb, new_key, spawn_app_with};

/// Short timeouts so the tests see them act.
const FAST: &[(&str, &str)] = &[
    ("ORDERD_HTTP_READ_TIMEOUT_MS", "600"),
    ("ORDERD_HTTP_IDLE_TIMEOUT_MS", "1500"),
];

/// Everything the server sends until it closes the connection (or 30 s pass, which
/// would mean it never closed it).
async fn read_until_closed(stream: &mut TcpStream) -> Option<String> {
    let mut all = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut all)).await;
    match read {
        Ok(_) => Some(String::from_utf8_lossy(&all).to_string()),
        Err(_) => None,
    }
}

/// The status and the problem body of one raw response.
fn problem(raw: &str) -> (u16, Value) {
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
    let status = head[9..12].parse().unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{head}"
    );
    (status, serde_json::from_str(body).expect("a JSON body"))
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.address).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_nothing_is_answered_408_and_closed() {
    let app = spawn_app_with(FAST).await;
    let mut silent = connect(&app).await;
    let raw = read_until_closed(&mut silent)
        .await
        .expect("the server closed it");
    let (status, body) = problem(&raw);
    assert_eq!(status, 408);
    assert_eq!(body["type"], "/problems/request-timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_trickling_in_is_cut_off_at_the_read_timeout() {
    let app = spawn_app_with(FAST).await;
    let mut slow = connect(&app).await;
    let head = b"GET /healthz HTTP/1.1\r\nHost: orderd\r\nX-Slow: ";
    let writer = async {
        for byte in head
            .iter()
            .chain(b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter())
        {
            if slow.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), writer).await;
    let raw = read_until_closed(&mut slow)
        .await
        .expect("the server closed it");
    assert_eq!(problem(&raw).0, 408, "{raw}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickling_in_is_answered_408_and_the_connection_closed() {
    let app = spawn_app_with(FAST).await;
    let token = app.token(Uuid::new_v4());
    let mut slow = connect(&app).await;
    let head = format!(
        "POST /v1/orders HTTP/1.1\r\nHost: orderd\r\nAuthorization: Bearer {token}\r\n\
         Idempotency-Key: slow-body-key-0000001\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"sku\":"
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let raw = read_until_closed(&mut slow)
        .await
        .expect("the server closed it");
    let (status, body) = problem(&raw);
    assert_eq!(status, 408, "{raw}");
    assert_eq!(body["type"], "/problems/request-timeout");
    assert!(raw.to_ascii_lowercase().contains("connection: close"));
    assert_eq!(
        app.count("idempotency_record").await,
        0,
        "nothing was claimed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_serves_again_and_is_closed_once_idle_too_long() {
    let app = spawn_app_with(FAST).await;
    let mut conn = connect(&app).await;
    let request = b"GET /healthz HTTP/1.1\r\nHost: orderd\r\n\r\n";
    for _ in 0..2 {
        conn.write_all(request).await.unwrap();
        let mut buf = [0u8; 512];
        let n = conn.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        // Idle for longer than the read timeout but less than the idle timeout.
        tokio::time::sleep(Duration::from_millis(900)).await;
    }
    let rest = read_until_closed(&mut conn)
        .await
        .expect("closed after the idle timeout");
    assert!(
        rest.is_empty(),
        "an idle connection is closed without an answer: {rest}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_timeout_above_thirty_seconds_is_honoured_as_set() {
    // A library default once closed idle connections at 30 s whatever was configured.
    let app = spawn_app_with(&[("ORDERD_HTTP_IDLE_TIMEOUT_MS", "45000")]).await;
    let mut conn = connect(&app).await;
    let request = b"GET /healthz HTTP/1.1\r\nHost: orderd\r\n\r\n";
    for pause in [Duration::ZERO, Duration::from_secs(33)] {
        tokio::time::sleep(pause).await;
        conn.write_all(request).await.unwrap();
        let mut buf = [0u8; 512];
        let n = conn.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "after {pause:?} idle the same connection still answers: {}",
            String::from_utf8_lossy(&buf[..n])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_their_responses_lose_their_connections_at_the_write_timeout() {
    let app = spawn_app_with(&[
        ("ORDERD_HTTP_WRITE_TIMEOUT_MS", "1000"),
        ("ORDERD_HTTP_MAX_CONNECTIONS", "4"),
    ])
    .await;
    // Every connection slot is taken by a client that asks for the docs page over and
    // over, with a small receive buffer, and never reads.
    let mut stuck = Vec::new();
    for _ in 0..4 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut conn = socket.connect(app.address).await.unwrap();
        let requests = "GET /docs HTTP/1.1\r\nHost: o\r\n\r\n".repeat(20);
        conn.write_all(requests.as_bytes()).await.unwrap();
        stuck.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A new client is served once the server abandons the responses nobody takes.
    let health = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
        .get(format!("{}/healthz", app.base))
        .send()
        .await
        .expect("served once the slots are freed");
    assert_eq!(health.status(), 200);
    // The new client needed one freed slot; give the others (whose writes stalled a
    // little later on a loaded machine) a few write timeouts more. Reading a connection
    // the server has not given up on would let its writes progress and keep it open.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Each stuck connection was closed by the server: reading it now ends.
    for mut conn in stuck {
        let rest = read_until_closed(&mut conn).await;
        assert!(rest.is_some(), "the server closed the connection");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_protocol_layer_refuses_is_problem_json() {
    let app = spawn_app_with(&[]).await;
    let long_target = format!("/v1/orders?after={}", "a".repeat(9000));
    let many_headers: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let huge_header = format!("X-Big: {}\r\n", "b".repeat(40 * 1024));
    let cases = [
        (
            format!("GET {long_target} HTTP/1.1\r\nHost: o\r\n\r\n"),
            414,
            "uri-too-long",
        ),
        (
            format!("GET /healthz HTTP/1.1\r\nHost: o\r\n{many_headers}\r\n"),
            431,
            "headers-too-large",
        ),
        (
            format!("GET /healthz HTTP/1.1\r\nHost: o\r\n{huge_header}\r\n"),
            431,
            "headers-too-large",
        ),
        ("BLAH\r\n\r\n".to_string(), 400, "validation-error"),
    ];
    for (request, status, slug) in cases {
        let mut conn = connect(&app).await;
        let _ = conn.write_all(request.as_bytes()).await;
        let raw = read_until_closed(&mut conn)
            .await
            .expect("an answer, then close");
        let (got, body) = problem(&raw);
        assert_eq!(
            (got, body["type"].as_str().unwrap()),
            (status, format!("/problems/{slug}").as_str()),
            "{raw}"
        );
    }
    // HTTP/2 with prior knowledge is not served: the connection is closed (an HTTP/2
    // client could not read an HTTP/1.1 answer anyway).
    let mut h2c = connect(&app).await;
    h2c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_until_closed(&mut h2c).await.as_deref(), Some(""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_token_or_with_a_body_still_arriving_hold_no_capacity() {
    let app = spawn_app_with(&[("ORDERD_HTTP_MAX_IN_FLIGHT", "2")]).await;
    let token = app.token(Uuid::new_v4());
    // Thirty clients without a token announce a 60,000-byte body and trickle it; two
    // with a token do the same.
    let mut tricklers = Vec::new();
    for i in 0..32 {
        let mut conn = connect(&app).await;
        let auth = if i < 2 {
            format!("Authorization: Bearer {token}\r\n")
        } else {
            String::new()
        };
        let head = format!(
            "POST /v1/orders HTTP/1.1\r\nHost: o\r\n{auth}\
             Idempotency-Key: trickle-key-00000{i:03}\r\nContent-Type: application/json\r\n\
             Content-Length: 60000\r\n\r\n{{"
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        tricklers.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Twenty authenticated requests, two at a time, all served.
    let body = crate::support::order_body("CAP-1", 1);
    for round in 0..10 {
        let key = format!("served-key-{round:06}-a");
        let (a, b) = tokio::join!(
            app.create(&token, &key, &body),
            app.get(&token, "/v1/orders")
        );
        assert_eq!((a.status, b.status), (201, 200), "round {round}");
    }
    drop(tricklers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_in_flight_cap_authenticated_work_is_shed_with_503() {
    let app = spawn_app_with(&[("ORDERD_HTTP_MAX_IN_FLIGHT", "2")]).await;
    let tenant = Uuid::new_v4();
    let token = app.token(tenant);
    let created = app
        .create(&token, &new_key(), &crate::support::order_body("CAP-2", 1))
        .await;
    let id = created.json()["id"].as_str().unwrap().to_string();
    // Two cancels of an order whose row another transaction holds: they hold both places.
    let mut lock = app.db.pool.begin().await.unwrap();
    // Named by its tenant too: on Citus a row lock is taken only on one shard.
    sqlx::query("SELECT 1 FROM orders WHERE tenant_id = $2 AND id = $1::uuid FOR UPDATE")
        .bind(&id)
        .bind(tenant)
        .execute(&mut *lock)
        .await
        .unwrap();
    let stalled: Vec<_> = (0..2)
        .map(|_| {
            let (client, base, token, id) = (
                app.client.clone(),
                app.base.clone(),
                token.clone(),
                id.clone(),
            );
            tokio::spawn(async move {
                client
                    .post(format!("{base}/v1/orders/{id}/cancel"))
                    .bearer_auth(token)
                    .header("Idempotency-Key", new_key())
                    .send()
                    .await
                    .unwrap()
            })
        })
        .collect();
    // Both wait on the row lock: both places are held.
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(app.db.lock_waiters()))
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
        if waiting == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let shed = app.get(&token, "/v1/orders").await;
    shed.assert_problem(503, "service-unavailable");
    assert_eq!(shed.header("retry-after").as_deref(), Some("1"));
    // Probes still answer.
    let health = app
        .client
        .get(format!("{}/healthz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    lock.rollback().await.unwrap();
    for cancel in stalled {
        assert_eq!(cancel.await.unwrap().status(), 200);
    }
    assert_eq!(app.get(&token, "/v1/orders").await.status, 200);
    assert_eq!(app.event_types().await, ["OrderCreated", "OrderCancelled"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_off_the_api_port_when_a_metrics_address_is_set() {
    let mut settings = FAST.to_vec();
    settings.push(("ORDERD_METRICS_BIND", "127.0.0.1:0"));
    let app = spawn_app_with(&settings).await;
    let on_api = app
        .client
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(on_api.status(), 404);
    let metrics_base = app.metrics_base.clone().expect("a metrics listener");
    let text = reqwest::get(format!("{metrics_base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("idempotency_requests_total"), "{text}");
    // The metrics listener is the same server as the API's: a silent client is answered
    // 408 at the read timeout there too, instead of holding its connection.
    let address = metrics_base.trim_start_matches("http://");
    let mut silent = TcpStream::connect(address).await.unwrap();
    let raw = read_until_closed(&mut silent)
        .await
        .expect("the server closed it");
    assert_eq!(problem(&raw).0, 408);
}

/// CPU time (user + system) of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_server_neither_spins_nor_stays_down() {
    let db = TestDb::new().await;
    let log = std::env::temp_dir().join(format!("orderd-fd-test-{}.log", Uuid::new_v4()));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"));
    command
        .arg("serve")
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_BIND", format!("127.0.0.1:{port}"))
        .env("ORDERD_JWT_HS256_SECRET", SECRET)
        .env("ORDERD_RELAY", "off")
        .env("ORDERD_DB_POOL_SIZE", "2")
        .env("ORDERD_HTTP_READ_TIMEOUT_MS", "500")
        .stderr(std::fs::File::create(&log).unwrap());
    // SAFETY: only async-signal-safe setrlimit between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            Ok(())
        });
    }
    let child = KillOnDrop(command.spawn().unwrap());
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..200 {
        if reqwest::get(format!("{base}/healthz")).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Far more silent connections than descriptors.
    let mut silent = Vec::new();
    for _ in 0..150 {
        if let Ok(conn) = TcpStream::connect(("127.0.0.1", port)).await {
            silent.push(conn);
        }
    }
    let pid = child.0.id();
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let used = cpu_ticks(pid) - before;
    // A busy accept loop would burn about 300 ticks (one core for 3 s).
    assert!(
        used < 100,
        "{used} ticks of CPU in 3 s while out of descriptors"
    );
    drop(silent);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut healthy = false;
    for _ in 0..100 {
        if let Ok(r) = client.get(format!("{base}/healthz")).send().await
            && r.status() == 200
        {
            healthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(
        healthy,
        "the server serves again once the crowd is gone; its log:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_valid_token_is_answered_401_from_its_head_and_its_body_is_never_read()
{
    let app = spawn_app_with(&[]).await;
    let head = |path: &str, auth: &str, extra: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: o\r\n{auth}Idempotency-Key: anonymous-key-000001\r\n\
             Content-Type: application/json\r\nContent-Length: 65536\r\n{extra}\r\n"
        )
    };
    // A body announced and partly sent, then the client stalls: answered at once, not
    // after the read timeout (10 s here), and the connection closed.
    for (path, auth) in [
        ("/v1/orders", ""),
        ("/v1/orders", "Authorization: Bearer not-a-token\r\n"),
        ("/mcp", ""),
    ] {
        let mut conn = connect(&app).await;
        let mut request = head(path, auth, "").into_bytes();
        request.extend(std::iter::repeat_n(b' ', 60_000));
        conn.write_all(&request).await.unwrap();
        let started = std::time::Instant::now();
        let raw = read_until_closed(&mut conn)
            .await
            .expect("answered and closed");
        let (status, body) = problem(&raw);
        assert_eq!(
            (status, body["type"].as_str()),
            (401, Some("/problems/unauthorized")),
            "{path}"
        );
        let head = raw.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
        assert!(head.contains("connection: close"), "{head}");
        assert!(head.contains("www-authenticate: bearer"), "{head}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "answered from the head"
        );
    }
    // `Expect: 100-continue` without a token: the 401, never a 100.
    let mut conn = connect(&app).await;
    conn.write_all(head("/v1/orders", "", "Expect: 100-continue\r\n").as_bytes())
        .await
        .unwrap();
    let raw = read_until_closed(&mut conn)
        .await
        .expect("answered and closed");
    assert!(raw.starts_with("HTTP/1.1 401 "), "{raw}");
    assert!(!raw.contains("100 Continue"), "{raw}");
    // With a valid token the same head is told to continue and the body is read.
    let token = app.token(Uuid::new_v4());
    let body = br#"{"sku":"EXPECT-1","quantity":1}"#;
    let mut conn = connect(&app).await;
    let request = format!(
        "POST /v1/orders HTTP/1.1\r\nHost: o\r\nAuthorization: Bearer {token}\r\n\
         Idempotency-Key: expect-key-0000000001\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut first = [0u8; 25];
    conn.read_exact(&mut first).await.unwrap();
    assert!(
        first.starts_with(b"HTTP/1.1 100 Continue"),
        "{}",
        String::from_utf8_lossy(&first)
    );
    conn.write_all(body).await.unwrap();
    let raw = read_until_closed(&mut conn)
        .await
        .expect("answered and closed");
    assert!(raw.contains("HTTP/1.1 201 "), "{raw}");
    // Nothing of the refused requests was stored.
    assert_eq!(app.count("idempotency_record").await, 1);
    assert_eq!(app.count("orders").await, 1);
}

/// One response on a kept-alive connection: its status.
async fn status_of(conn: &mut TcpStream, request: &[u8]) -> u16 {
    conn.write_all(request).await.unwrap();
    let mut buf = [0u8; 1024];
    let n = conn.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    head.get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a response: {head}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_in_every_slot_give_way_to_a_tenant_the_longest_idle_first() {
    let app = spawn_app_with(&[("ORDERD_HTTP_MAX_CONNECTIONS", "8")]).await;
    let probe = b"GET /healthz HTTP/1.1\r\nHost: o\r\n\r\n";
    // Eight anonymous clients ask once, in turn, and go idle: the first one has been
    // idle longest.
    let mut idle = Vec::new();
    for _ in 0..8 {
        let mut conn = connect(&app).await;
        assert_eq!(status_of(&mut conn, probe).await, 200);
        idle.push(conn);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A tenant's create on a new connection is served (before the idle timeout of 60 s
    // would have freed any slot).
    let token = app.token(Uuid::new_v4());
    let started = std::time::Instant::now();
    let created = tokio::time::timeout(
        Duration::from_secs(30),
        app.create(&token, &new_key(), &crate::support::order_body("IDLE-1", 1)),
    )
    .await
    .expect("the create is answered while idle clients hold every slot");
    assert_eq!(created.status, 201);
    eprintln!(
        "a create behind eight idle connections answered in {:?}",
        started.elapsed()
    );
    // Exactly the longest idle was closed: it reads the end of the stream, and each of
    // the others is served again.
    let mut first = idle.remove(0);
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), first.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0))),
        "the longest idle connection was closed without an answer: {closed:?}"
    );
    for (i, conn) in idle.iter_mut().enumerate() {
        assert_eq!(status_of(conn, probe).await, 200, "connection {}", i + 1);
    }
    assert_eq!(app.count("orders").await, 1);
}

/// A chunked body of `total` bytes, streamed to `path` with `method` by a client with a
/// valid token, until the server answers and closes (or everything is sent); the status
/// of the answer.
async fn stream_body(address: &str, method: &str, path: &str, token: &str, total: usize) -> u16 {
    let conn = TcpStream::connect(address).await.unwrap();
    let (mut read, mut write) = conn.into_split();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: o\r\nAuthorization: Bearer {token}\r\n\
         Idempotency-Key: {}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        new_key()
    );
    let writer = tokio::spawn(async move {
        write.write_all(head.as_bytes()).await?;
        let chunk = [b' '; 64 * 1024];
        let mut sent = 0;
        while sent < total {
            write.write_all(b"10000\r\n").await?;
            write.write_all(&chunk).await?;
            write.write_all(b"\r\n").await?;
            sent += chunk.len();
        }
        write.write_all(b"0\r\n\r\n").await?;
        // The write side stays open until the answer is read: hyper drops a request
        // whose client half-closed.
        std::future::pending::<std::io::Result<()>>().await
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The status line is all this needs; the server closes what it does not read.
    while !answer.windows(2).any(|w| w == b"\r\n") {
        match read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    writer.abort();
    let head = String::from_utf8_lossy(&answer);
    head.get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no answer: {head:?}"))
}

/// The most resident memory a process has had so far (its high-water mark), in KiB:
/// a body held for a moment and freed shows in it.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Every path `server` mounts, with the address it is served on: every route of the
/// table on the API address (a path parameter filled in), one path that matches none,
/// and the metrics listener's paths.
fn every_path(server: &crate::support::ServeProcess) -> Vec<(String, String)> {
    let api = server.base.trim_start_matches("http://").to_string();
    let metrics = server
        .logged_address("metrics listening")
        .expect("the metrics listener logs its address");
    let id = Uuid::new_v4().to_string();
    let mut targets: Vec<(String, String)> = orderd::api::routes::Route::ALL
        .iter()
        .map(|route| match *route {
            orderd::api::routes::Route::Unmatched => "/no/such/path".to_string(),
            route => route.as_str().replace("{id}", &id),
        })
        .map(|path| (api.clone(), path))
        .collect();
    targets.push((api, "/docs/".to_string()));
    for path in ["/metrics", "/healthz", "/readyz"] {
        targets.push((metrics.clone(), path.to_string()));
    }
    targets
}

const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// What a 256 MiB body to `path` with `method` costs `server`: the request is sent
/// with an empty chunked body twice, then with a 256 MiB one, and what the process's
/// peak rose by while the last was answered is the body's cost. The empty ones pay for
/// what the first answers of their kind need (each thread's allocator pages, the
/// metrics page's new label sets, and what a second list still allocates: about
/// 0.9 MiB in the debug build), which a body does not change. Returns the answers and
/// the cost in KiB.
async fn body_cost(
    server: &crate::support::ServeProcess,
    (address, path): &(String, String),
    method: &str,
) -> (String, u64) {
    let token = server.token(Uuid::new_v4());
    let pid = server.child.id();
    let mut empty = 0;
    for _ in 0..2 {
        empty = stream_body(address, method, path, &token, 0).await;
    }
    let before = peak_rss_kib(pid);
    let streamed = stream_body(address, method, path, &token, 256 << 20).await;
    let cost = peak_rss_kib(pid).saturating_sub(before);
    (format!("{method} {path}: {empty}, then {streamed}"), cost)
}

/// Every path and method, from ready, with no walk first. A body that cost 1 MiB or
/// more is measured once more in a process of its own, started for it: a body read
/// whole costs 256 MiB there too, where something the first process allocated once,
/// on a clock, while that body was sent (a cache's first housekeeping, a background
/// pass) does not recur. A second try in the same process would not do: its peak
/// already holds whatever the first try touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_path_and_no_method_buffers_a_body_it_does_not_take() {
    let db = TestDb::new().await;
    let settings = [("ORDERD_METRICS_BIND", "127.0.0.1:0".to_string())];
    let server = crate::support::ServeProcess::start(&db, &settings);
    let targets = every_path(&server);
    let mut costs = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        for method in METHODS {
            let (answer, cost) = body_cost(&server, target, method).await;
            if cost < 1024 {
                costs.push((answer, cost));
                continue;
            }
            let fresh = crate::support::ServeProcess::start(&db, &settings);
            let again = body_cost(&fresh, &every_path(&fresh)[i], method).await;
            eprintln!(
                "{answer}: +{cost} KiB; in a process of its own: +{} KiB",
                again.1
            );
            costs.push(again);
        }
    }
    let (most, all) = costs
        .iter()
        .fold((0, 0), |(most, all), (_, kib)| (most.max(*kib), all + kib));
    eprintln!("256 MiB bodies to every path and method: +{most} KiB at most, +{all} KiB in all");
    // A body read whole would add at least 256 MiB.
    assert!(
        most < 1024,
        "a 256 MiB body grew the process by 1 MiB or more: {costs:#?}"
    );
    assert_eq!(db.count("orders").await, 0, "{costs:#?}");
}
