//! What the integration tests stand on: databases, orderd in process and as a child
//! process, moto as SNS, tansu as Kafka, and a switchable proxy in front of SNS.

pub mod app;
pub mod db;
pub mod jwks_server;
pub mod kafka;
pub mod pgbouncer;
pub mod process;
pub mod proxy;
pub mod sns;

pub use app::{
    Reply, SECRET, TestApp, create_fingerprint, new_key, order_body, post_mcp, post_order, sealer,
    settings, spawn_app, spawn_app_on, spawn_app_publishing_through, spawn_app_with,
    spawn_publishing_app, spawn_publishing_app_on, token,
};
pub use db::{TestDb, admin_url, citus_workers, create_order_in, on_citus, one_server_only};
pub use process::{KillOnDrop, ServeProcess, failures, sample, until_failures};

/// A loopback port nothing listens on right now, for a server a test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
