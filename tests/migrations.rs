//! Migrations stay safe for rolling deploys (docs/contract.md §7, §11): a released
//! migration never changes, and a new one only expands the schema, so that the release
//! before it keeps working against the migrated database while processes are replaced
//! one at a time.
//!
//! The checks read the SQL files; the integration tests apply them to a real server.

use std::{fs, path::Path};

use sha2::{Digest, Sha256};

/// Every released migration and the SHA-256 of its file. sqlx refuses to start against
/// a database whose applied migration differs from the binary's, so editing a released
/// file would stop every process at its next start: add a new migration instead, and
/// its line here.
const RELEASED: &[(&str, &str)] = &[
    (
        "20261129000001_orders.sql",
        "2b3956dec1811354dfc193ea8bb3771723792cc6197e8d04a583aaa745866dae",
    ),
    (
        "20261129000002_idempotency_record.sql",
        "b7c1a3b0e49c68113fb5f83426bec6666b05961a39ffcbc54d663a564195f355",
    ),
    (
        "20261129000003_outbox_event.sql",
        "cb480553b64c199a5c161a48feb32f189a50ea3ad25c9a3490cc8434af7d543a",
    ),
    (
        "20261129000004_outbox_relay.sql",
        "91230c32119ee198beb2fd69083b84a44d97ea9c8036123c314c5381d926bd13",
    ),
    (
        "20261130000005_outbox_claimed_by.sql",
        "5e0eacad62b8f75f6f7e4927b2530c8649d36275bbe3e18334c63d0cc70c4dc1",
    ),
    (
        "20261130000006_orders_updated_index.sql",
        "8ea1eaa09943e9d9d5cad5245690305bb11cef8bd1ffe70287ba9d4f33be701c",
    ),
    (
        "20261202000007_outbox_trace_context.sql",
        "31ec1ff92f724514c2b73e971fe31d7638e2a687d741643c6a12a8aa01103967",
    ),
    (
        "20261202000008_sealed_responses.sql",
        "4c98eebb65b1e9af7c648f62241747f3a965590b8d3ffce1dada4e7b65c174d5",
    ),
    (
        "20261202000009_outbox_pending_by_tenant.sql",
        "f82375540e36b80fe6f826d3413cb76fb29e98635e2b514286726401a99ce7c3",
    ),
    (
        "20261202000010_purged_tables_autovacuum.sql",
        "f04bf5b60f6b33fdedf620974a9be6b9e1b7ac56c5fdf33cf782cc5001af4cb6",
    ),
    (
        "20261202000011_seal_version.sql",
        "8a7192d0f2cb1ac3509d7a1a9142c217d96ec151c874ecba18fd2f4068c9f35a",
    ),
    (
        "20261202000012_tenant_erasure.sql",
        "f15479ae9f57e60017bedfcce6fd70bf42f1098ba84bdf314ca7b0e99f53a40a",
    ),
    (
        "20261204000013_citus_distribution.sql",
        "f830dd3d5977c5f95831db953ebea31c6db3acaa27e57c3b4d49cbe0ded1aece",
    ),
    (
        "20261206000014_outbox_notify_tenants.sql",
        "eb17b2e8d1557542dc7d0d94a2d4db9a73b55f3ca44263f35ad81eb85157b747",
    ),
    (
        "20261207000015_outbox_notify_per_row.sql",
        "923f34c6c02aeac7d6bd3ee02219e9a729162d92015d09c2a4aed4f85125c62a",
    ),
    (
        "20261207000016_routed_write_functions.sql",
        "ffda3f7804ec6161ead9224e6bc792ed3dce64ea72f7fb77b5475bc7ded499e5",
    ),
];

/// Migrations up to this one made the first schema on an empty database, where an
/// index built without `CONCURRENTLY` blocks nobody.
const FIRST_SCHEMA: &str = "20261129000004";

/// A file that deliberately contracts the schema says so on a line of its own, with
/// the release that stopped using what it removes.
const CONTRACT_MARKER: &str = "-- contract step:";

fn migrations() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> =
        fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations"))
            .unwrap()
            .map(|entry| {
                let path = entry.unwrap().path();
                (
                    path.file_name().unwrap().to_string_lossy().into_owned(),
                    fs::read_to_string(&path).unwrap(),
                )
            })
            .collect();
    files.sort();
    files
}

/// The statements of `sql` in upper case with comments removed, whitespace collapsed.
fn statements(sql: &str) -> Vec<String> {
    let code: String = sql
        .lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ");
    code.split(';')
        .map(|s| {
            s.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_uppercase()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// What keeps the previous release from working against the schema after `sql`, one
/// line per problem; empty when the migration only expands.
fn expand_only_violations(sql: &str, first_schema: bool) -> Vec<String> {
    if sql
        .lines()
        .any(|line| line.trim_start().starts_with(CONTRACT_MARKER))
    {
        return Vec::new();
    }
    let created: Vec<String> = statements(sql)
        .iter()
        .filter_map(|s| s.strip_prefix("CREATE TABLE "))
        .map(|rest| rest.split([' ', '(']).next().unwrap_or("").to_string())
        .collect();
    let mut problems = Vec::new();
    for statement in statements(sql) {
        let has = |word: &str| statement.contains(word);
        for (word, why) in [
            ("DROP TABLE", "drops a table"),
            ("DROP COLUMN", "drops a column"),
            ("RENAME", "renames something the running release names"),
            (
                "SET NOT NULL",
                "makes a column required that the running release may not fill",
            ),
            (
                "DROP DEFAULT",
                "removes a default the running release relies on",
            ),
            ("TRUNCATE", "empties a table"),
        ] {
            if has(word) {
                problems.push(format!("{why}: {statement}"));
            }
        }
        if has("ALTER COLUMN") && has(" TYPE ") {
            problems.push(format!(
                "changes a column's type (a rewrite under lock): {statement}"
            ));
        }
        if has("ADD COLUMN") && has("NOT NULL") && !has("DEFAULT") {
            problems.push(format!(
                "adds a required column without a default, which the running release does not fill: {statement}"
            ));
        }
        let builds_index =
            statement.starts_with("CREATE INDEX") || statement.starts_with("CREATE UNIQUE INDEX");
        if builds_index && !has("CONCURRENTLY") && !first_schema {
            let table = statement
                .split(" ON ")
                .nth(1)
                .and_then(|rest| rest.split([' ', '(']).next())
                .unwrap_or("");
            if !created.iter().any(|t| t == table) {
                problems.push(format!(
                    "builds an index without CONCURRENTLY, blocking writes for the whole build: {statement}"
                ));
            }
        }
        if has("CONCURRENTLY") && !sql.starts_with("-- no-transaction") {
            problems.push(format!(
                "CONCURRENTLY cannot run in the migration's transaction: begin the file with `-- no-transaction`: {statement}"
            ));
        }
    }
    problems
}

#[test]
fn released_migrations_never_change_and_new_ones_are_listed() {
    let on_disk = migrations();
    for (name, sql) in &on_disk {
        let digest: String = Sha256::digest(sql.as_bytes())
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        match RELEASED.iter().find(|(released, _)| released == name) {
            Some((_, pinned)) => assert_eq!(
                &digest, pinned,
                "{name} was released and must not change; write a new migration instead"
            ),
            None => panic!(
                "{name} is new: add (\"{name}\", \"{digest}\") to RELEASED in tests/migrations.rs"
            ),
        }
    }
    for (released, _) in RELEASED {
        assert!(
            on_disk.iter().any(|(name, _)| name == released),
            "{released} was released and must stay"
        );
    }
}

#[test]
fn every_migration_only_expands_the_schema() {
    for (name, sql) in migrations() {
        let first_schema = name[..FIRST_SCHEMA.len()] <= *FIRST_SCHEMA;
        let problems = expand_only_violations(&sql, first_schema);
        assert!(problems.is_empty(), "{name}:\n{}", problems.join("\n"));
        // One statement per file without a transaction: PostgreSQL runs several
        // statements sent at once in one implicit transaction, which CONCURRENTLY refuses.
        if sql.starts_with("-- no-transaction") {
            assert_eq!(
                statements(&sql).len(),
                1,
                "{name}: one statement per no-transaction file"
            );
        }
    }
}

#[test]
fn the_check_refuses_what_would_break_the_running_release() {
    let refused = [
        "ALTER TABLE orders DROP COLUMN customer_ref;",
        "ALTER TABLE orders RENAME COLUMN sku TO product;",
        "ALTER TABLE orders ALTER COLUMN quantity TYPE bigint;",
        "ALTER TABLE orders ALTER COLUMN customer_ref SET NOT NULL;",
        "ALTER TABLE orders ADD COLUMN channel text NOT NULL;",
        "CREATE INDEX orders_sku ON orders (sku);",
        "DROP TABLE outbox_event;",
        "CREATE INDEX CONCURRENTLY orders_sku ON orders (sku);",
    ];
    for sql in refused {
        assert!(
            !expand_only_violations(sql, false).is_empty(),
            "{sql} passed"
        );
    }
    let allowed = [
        "ALTER TABLE orders ADD COLUMN channel text;",
        "ALTER TABLE orders ADD COLUMN channel text NOT NULL DEFAULT 'api';",
        "-- no-transaction\nCREATE INDEX CONCURRENTLY orders_sku ON orders (sku);",
        "CREATE TABLE order_note (id uuid PRIMARY KEY, body text);\nCREATE INDEX order_note_body ON order_note (body);",
        "-- contract step: release 2027.1 stopped reading customer_ref\nALTER TABLE orders DROP COLUMN customer_ref;",
        "-- a comment that says DROP TABLE is only a comment\nALTER TABLE orders ADD COLUMN channel text;",
    ];
    for sql in allowed {
        assert_eq!(
            expand_only_violations(sql, false),
            Vec::<String>::new(),
            "{sql}"
        );
    }
}
