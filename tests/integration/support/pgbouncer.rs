//! Debian's PgBouncer in transaction pooling mode, in front of the test server, shared by
//! the tests of this binary: started once, on a free port, as the `postgres` user when
//! the tests run as root (PgBouncer refuses root). Strict: it resets a server
//! connection (`DISCARD ALL`) after every transaction, so anything orderd leaves on a
//! server between two transactions (a prepared statement, a setting) is gone, as
//! behind a pooler configured that way in production.

use std::{
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
    url_at(url, &address())
}

/// `url` with `address` (`host:port`) in place of the server's.
fn url_at(url: &str, address: &str) -> String {
    let options = PgConnectOptions::from_str(url).expect("a test URL");
    let database = options.get_database().unwrap_or("postgres");
    format!("postgres://{}@{address}/{database}", options.get_username())
}

/// Writes `dir`'s configuration: transaction mode on `port` in front of the test server,
/// strict, its PID in `dir/pgbouncer.pid`. Says whether it must run as `postgres`.
fn configure(dir: &std::path::Path, port: u16, server: &str) -> bool {
    let server = PgConnectOptions::from_str(server).expect("the server's URL");
    std::fs::create_dir_all(dir).unwrap();
    let ini = format!(
        "[databases]\n* = host={host} port={server_port}\n\
         [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
         auth_type = trust\nauth_file = {dir}/users.txt\npool_mode = transaction\n\
         default_pool_size = 20\nmax_client_conn = 2000\n\
         server_reset_query = DISCARD ALL\nserver_reset_query_always = 1\n\
         ignore_startup_parameters = extra_float_digits\nlogfile = {dir}/pgbouncer.log\n\
         pidfile = {dir}/pgbouncer.pid\n",
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
    let as_postgres = unsafe { libc::geteuid() } == 0;
    if as_postgres {
        let _ = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(dir)
            .status();
    }
    as_postgres
}

/// Waits until something listens on `port`.
fn until_listening(port: u16, dir: &std::path::Path) {
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "pgbouncer did not start; see {}/pgbouncer.log",
        dir.display()
    );
}

fn start() -> String {
    let port = super::free_port();
    let dir: PathBuf =
        std::env::temp_dir().join(format!("orderd-pgbouncer-{}", std::process::id()));
    let as_postgres = configure(&dir, port, &admin_url());
    // Exits with this test process: the watcher loop kills it when the parent is gone.
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
    until_listening(port, &dir);
    format!("127.0.0.1:{port}")
}

/// A PgBouncer of one test's own, which the test may kill (`kill -9`) and start again on
/// the same port; killed when dropped.
pub struct OwnPgBouncer {
    pub port: u16,
    dir: PathBuf,
    as_postgres: bool,
}

impl OwnPgBouncer {
    /// In front of the test server.
    pub fn start() -> Self {
        Self::in_front_of(&admin_url())
    }

    /// In front of the server of `server` (a URL: a Citus worker's, say).
    pub fn in_front_of(server: &str) -> Self {
        let port = super::free_port();
        let dir = std::env::temp_dir().join(format!("orderd-pgbouncer-own-{port}"));
        let as_postgres = configure(&dir, port, server);
        let bouncer = Self {
            port,
            dir,
            as_postgres,
        };
        bouncer.run();
        bouncer
    }

    /// `url` (a database on the test server) through this PgBouncer.
    pub fn url_through(&self, url: &str) -> String {
        url_at(url, &format!("127.0.0.1:{}", self.port))
    }

    fn run(&self) {
        let ini = self.dir.join("pgbouncer.ini");
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(binary());
            c
        } else {
            Command::new(binary())
        };
        // -d: PgBouncer daemonizes once it listens, and writes its PID file.
        let status = command
            .arg("-d")
            .arg(&ini)
            .stdin(Stdio::null())
            .status()
            .expect("pgbouncer (apt-get install pgbouncer)");
        assert!(status.success(), "pgbouncer -d {} failed", ini.display());
        until_listening(self.port, &self.dir);
    }

    /// `kill -9`: every client connection is cut at once, nothing flushed.
    pub fn kill(&self) {
        let pid_file = self.dir.join("pgbouncer.pid");
        if let Ok(pid) = std::fs::read_to_string(&pid_file) {
            let _ = Command::new("kill").args(["-9", pid.trim()]).status();
            let _ = std::fs::remove_file(&pid_file);
        }
        // Gone once nothing listens on its port.
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Started again on the same port, with the same configuration.
    pub fn restart(&self) {
        self.run();
    }
}

impl Drop for OwnPgBouncer {
    fn drop(&mut self) {
        self.kill();
    }
}
