//! Debian's PgBouncer in transaction pooling mode, in front of the test server, shared by
//! the tests of this binary: started once, on a free port, as the `postgres` user when
//! the tests run as root (PgBouncer refuses root). Strict: it resets a server
//! connection (`DISCARD ALL`) after every transaction, so anything orderd leaves on a
//! server between two transactions (a prepared statement, a setting) is gone, as
//! behind a pooler configured that way in production.

use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Command, Stdio},
    str::FromStr,
    sync::OnceLock,
    time::Duration,
};

use sqlx::postgres::PgConnectOptions;

use super::db::admin_url;

/// The PgBouncer binary: `ORDERD_TEST_PGBOUNCER` (set by `.ci/test`), or Debian's path.
fn binary() -> String {
    std::env::var("ORDERD_TEST_PGBOUNCER").unwrap_or_else(|_| "/usr/sbin/pgbouncer".into())
}

/// `host:port` of the running PgBouncer, started on first use.
pub fn address() -> String {
    static ADDRESS: OnceLock<String> = OnceLock::new();
    ADDRESS.get_or_init(start).clone()
}

/// `url` (a database on the test server) with PgBouncer's address instead.
pub fn url_through(url: &str) -> String {
    let options = PgConnectOptions::from_str(url).expect("a test URL");
    let database = options.get_database().unwrap_or("postgres");
    format!(
        "postgres://{}@{}/{database}",
        options.get_username(),
        address()
    )
}

fn start() -> String {
    let server = PgConnectOptions::from_str(&admin_url()).expect("the test server URL");
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir: PathBuf =
        std::env::temp_dir().join(format!("orderd-pgbouncer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ini = format!(
        "[databases]\n* = host={host} port={server_port}\n\
         [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
         auth_type = trust\nauth_file = {dir}/users.txt\npool_mode = transaction\n\
         default_pool_size = 20\nmax_client_conn = 2000\n\
         server_reset_query = DISCARD ALL\nserver_reset_query_always = 1\n\
         ignore_startup_parameters = extra_float_digits\nlogfile = {dir}/pgbouncer.log\n",
        host = server.get_host(),
        server_port = server.get_port(),
        dir = dir.display(),
    );
    std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
    std::fs::write(
        dir.join("users.txt"),
        format!("\"{}\" \"\"\n", server.get_username()),
    )
    .unwrap();
    // Exits with this test process: the watcher loop kills it when the parent is gone.
    let as_postgres = unsafe { libc::geteuid() } == 0;
    if as_postgres {
        let _ = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(&dir)
            .status();
    }
    let run = format!(
        "{runner} {bin} {dir}/pgbouncer.ini & p=$!; while kill -0 {parent} 2>/dev/null; do sleep 1; done; kill $p",
        runner = if as_postgres {
            "runuser -u postgres --"
        } else {
            ""
        },
        bin = binary(),
        dir = dir.display(),
        parent = std::process::id()
    );
    #[allow(clippy::zombie_processes)]
    Command::new("sh")
        .args(["-c", &run])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("pgbouncer (apt-get install pgbouncer)");
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "pgbouncer did not start; see {}/pgbouncer.log",
        dir.display()
    );
}
