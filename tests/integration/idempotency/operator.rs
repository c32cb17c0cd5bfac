//! Looking one record up and forgetting it (docs/contract.md §4), as an operator does
//! it, with the real binary beside `orderd serve` processes whose replay caches are
//! warm: `show` prints the record (the body only when asked), `forget` refuses a live
//! claim and an unforced success, and once it has forgotten a key every process runs
//! the next retry afresh, also one that lost its listening session meanwhile.

use std::process::Command;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{
    Reply, ServeProcess, TestDb, create_fingerprint, new_key, order_body, post_order,
    proxy::{Mode, in_front_of_db},
    sample,
};

const BIN: &str = env!("CARGO_BIN_EXE_orderd");
const CREATE: &str = "POST /v1/orders";
const CANCEL: &str = "POST /v1/orders/{id}/cancel";
/// 32 bytes of 0x07.
const KEY: &str = "k7:BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";

/// What `orderd idempotency ...` printed and how it exited.
struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// `orderd idempotency <args>` on `db`, with `env` added.
fn idempotency(db: &TestDb, args: &[&str], env: &[(&str, &str)]) -> Out {
    let out = Command::new(BIN)
        .arg("idempotency")
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The arguments naming one record.
fn named<'a>(tenant: &'a str, endpoint: &'a str, key: &'a str) -> Vec<&'a str> {
    vec!["--tenant", tenant, "--endpoint", endpoint, "--key", key]
}

/// `orderd idempotency <verb...>` naming one record.
fn on_record(db: &TestDb, verb: &[&str], tenant: &str, endpoint: &str, key: &str) -> Out {
    idempotency(db, &[verb, &named(tenant, endpoint, key)].concat(), &[])
}

/// `show --json` of a record that exists.
fn show_json(db: &TestDb, tenant: &str, endpoint: &str, key: &str, more: &[&str]) -> Value {
    let mut args = vec!["show", "--json"];
    args.extend(named(tenant, endpoint, key));
    args.extend(more);
    let out = idempotency(db, &args, &[]);
    assert!(out.ok, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

/// One create on `serve`, read whole.
async fn create(serve: &ServeProcess, token: &str, key: &str, body: &Value) -> Reply {
    Reply::read(post_order(&serve.base, token, key, body, None).await).await
}

fn replayed(reply: &Reply) -> bool {
    reply.header("idempotent-replayed").as_deref() == Some("true")
}

/// What a process's replay cache has dropped in all by the time it listens for
/// forgettings: everything once as the erasures' follower first loads, and once as the
/// forgettings' session is established (until then the cache is suspended).
const LISTENING: f64 = 2.0;

/// `idempotency_replay_cache_drops_total{what}` of `serve`, once it reached `at_least`.
async fn drops_reach(serve: &ServeProcess, what: &str, at_least: f64) -> f64 {
    let series = format!("idempotency_replay_cache_drops_total{{what=\"{what}\"}}");
    let text = serve
        .metrics_until(|text| sample(text, &series).is_some_and(|n| n >= at_least))
        .await;
    sample(&text, &series).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_key_runs_afresh_in_every_process_whose_cache_held_it() {
    let db = TestDb::new().await;
    let (a, b) = (ServeProcess::start(&db, &[]), ServeProcess::start(&db, &[]));
    // Both listen before anything is cached (a process starts with its cache suspended).
    drops_reach(&a, "all", LISTENING).await;
    drops_reach(&b, "all", LISTENING).await;
    let tenant = Uuid::new_v4();
    let token = a.token(tenant);
    let (key, control) = (new_key(), new_key());
    let body = order_body("FORGET-1", 2);
    let first = create(&a, &token, &key, &body).await;
    assert_eq!(first.status, 201);
    assert_eq!(create(&a, &token, &control, &body).await.status, 201);
    // Each process replays both keys twice: once from the database, once from memory.
    for serve in [&a, &b] {
        for key in [&key, &control] {
            for _ in 0..2 {
                let again = create(serve, &token, key, &body).await;
                assert!(replayed(&again) && again.status == 201);
            }
        }
    }
    assert_eq!(
        create(&b, &token, &key, &body).await.body,
        first.body,
        "byte-exact replays"
    );

    // show: the record, without its body.
    let t = tenant.to_string();
    let shown = show_json(&db, &t, CREATE, &key, &[]);
    let order_id = first.json()["id"].as_str().unwrap().to_string();
    assert_eq!(shown["state"], "COMPLETED");
    assert_eq!(shown["status"], 201);
    assert_eq!(shown["resource_id"], order_id.as_str());
    assert_eq!(shown["location"], format!("/v1/orders/{order_id}"));
    assert_eq!(
        shown["fingerprint"],
        hex::encode(create_fingerprint(&body)),
        "the fingerprint as stored"
    );
    assert!(
        shown["sealed_with"].is_null(),
        "no keys configured: in clear"
    );
    assert!(shown.get("body").is_none(), "never the body unless asked");
    let expires = first.header("idempotency-key-expires").unwrap();
    let stored: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(shown["expires_at"].clone()).unwrap();
    assert_eq!(httpdate::fmt_http_date(stored.into()), expires);
    let text = on_record(&db, &["show"], &t, CREATE, &key);
    assert!(
        text.ok && text.stdout.contains("state         COMPLETED"),
        "{}",
        text.stdout
    );
    assert!(!text.stdout.contains("FORGET-1"), "{}", text.stdout);

    // Without --force a stored success is kept, and nothing changes.
    let refused = on_record(&db, &["forget"], &t, CREATE, &key);
    assert!(
        !refused.ok && refused.stderr.contains("--force"),
        "{}",
        refused.stderr
    );
    assert!(replayed(&create(&b, &token, &key, &body).await));

    // The control key is deleted behind orderd's back (no notification): the warm
    // caches still replay it, which is what forgetting must prevent.
    sqlx::query("DELETE FROM idempotency_record WHERE idem_key = $1")
        .bind(&control)
        .execute(&db.pool)
        .await
        .unwrap();
    for serve in [&a, &b] {
        assert!(replayed(&create(serve, &token, &control, &body).await));
    }

    let forget = ["forget", "--force", "--actor", "alice@ops"];
    let forgot = on_record(&db, &forget, &t, CREATE, &key);
    assert!(forgot.ok, "{}", forgot.stderr);
    assert!(forgot.stdout.contains("runs afresh"), "{}", forgot.stdout);
    let audit = forgot
        .stderr
        .lines()
        .find(|l| l.contains("idempotency record forgotten"))
        .unwrap_or_else(|| panic!("an audit line: {}", forgot.stderr));
    assert!(audit.contains("alice@ops") && audit.contains(&key) && audit.contains(&order_id));
    assert!(
        !forgot.stderr.contains("FORGET-1"),
        "never the body: {}",
        forgot.stderr
    );
    assert_eq!(db.count("idempotency_record").await, 0);

    // Every process heard it; the next retry, wherever it lands, runs afresh once.
    drops_reach(&a, "key", 1.0).await;
    drops_reach(&b, "key", 1.0).await;
    let fresh = create(&b, &token, &key, &body).await;
    assert_eq!(fresh.status, 201);
    assert!(!replayed(&fresh), "the retry ran again");
    assert_ne!(fresh.json()["id"], first.json()["id"]);
    let after = create(&a, &token, &key, &body).await;
    assert!(replayed(&after));
    assert_eq!(
        after.body, fresh.body,
        "the new answer, not the forgotten one"
    );
    assert_eq!(db.count("orders").await, 3);

    let missing = on_record(&db, &["show"], &t, CREATE, &new_key());
    assert!(
        !missing.ok && missing.stderr.contains("no idempotency record"),
        "{}",
        missing.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_cannot_hear_forgettings_replays_nothing_from_memory() {
    let db = TestDb::new().await;
    // The listening session goes through a proxy the test can cut; requests do not.
    let (proxy, direct) = in_front_of_db(&db.url).await;
    let serve = ServeProcess::start(&db, &[("ORDERD_DATABASE_DIRECT_URL", direct)]);
    let heard = drops_reach(&serve, "all", LISTENING).await;
    let token = serve.token(Uuid::new_v4());
    let (key, body) = (new_key(), order_body("FORGET-2", 1));
    let delete_behind_its_back = async |key: &str| {
        sqlx::query("DELETE FROM idempotency_record WHERE idem_key = $1")
            .bind(key)
            .execute(&db.pool)
            .await
            .unwrap();
    };
    assert_eq!(create(&serve, &token, &key, &body).await.status, 201);
    for _ in 0..2 {
        assert!(replayed(&create(&serve, &token, &key, &body).await));
    }
    // While it hears, the warm cache answers even a row deleted by hand (the control).
    delete_behind_its_back(&key).await;
    assert!(replayed(&create(&serve, &token, &key, &body).await));

    // Deaf: the session is cut and cannot come back. What it had is gone... (Both
    // listening sessions go through the proxy, the erasures' and the forgettings':
    // each loss and each return empties the cache once for each.)
    proxy.set(Mode::Refuse);
    drops_reach(&serve, "all", heard + 2.0).await;
    let fresh = create(&serve, &token, &key, &body).await;
    assert!(
        fresh.status == 201 && !replayed(&fresh),
        "nothing from before the loss"
    );
    // ... and what it reads meanwhile is not kept: a forgetting now would go unheard.
    for _ in 0..2 {
        assert!(replayed(&create(&serve, &token, &key, &body).await));
    }
    delete_behind_its_back(&key).await;
    let again = create(&serve, &token, &key, &body).await;
    assert!(
        again.status == 201 && !replayed(&again),
        "nothing kept while deaf"
    );

    // Hearing again, it caches again (the deleted-by-hand control replays once more).
    proxy.set(Mode::Forward);
    drops_reach(&serve, "all", heard + 4.0).await;
    for _ in 0..2 {
        assert!(replayed(&create(&serve, &token, &key, &body).await));
    }
    delete_behind_its_back(&key).await;
    assert!(replayed(&create(&serve, &token, &key, &body).await));
    assert_eq!(db.count("orders").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_refuses_a_live_claim_and_takes_a_passed_one_or_a_stored_refusal() {
    let db = TestDb::new().await;
    let serve = ServeProcess::start(&db, &[]);
    let tenant = Uuid::new_v4();
    let t = tenant.to_string();
    let fingerprint = create_fingerprint(&order_body("FORGET-3", 1));
    let (live, passed) = (new_key(), new_key());
    db.insert_processing(tenant, &live, &fingerprint, "30 seconds", Uuid::new_v4())
        .await;
    db.insert_processing(tenant, &passed, &fingerprint, "-1 second", Uuid::new_v4())
        .await;

    let shown = show_json(&db, &t, CREATE, &live, &[]);
    assert_eq!(shown["state"], "PROCESSING");
    assert!(shown["lease_until"].is_string() && shown["status"].is_null());
    let refused = on_record(&db, &["forget", "--force"], &t, CREATE, &live);
    assert!(
        !refused.ok && refused.stderr.contains("live claim"),
        "{}",
        refused.stderr
    );
    let taken = on_record(&db, &["forget"], &t, CREATE, &passed);
    assert!(taken.ok, "{}", taken.stderr);
    assert_eq!(db.count("idempotency_record").await, 1);

    // A cancel's stored 404 is no success: forgotten without --force. A UUID key is
    // found in any case, as the API normalises it.
    let token = serve.token(tenant);
    let cancel_key = Uuid::new_v4().to_string();
    let refusal = Reply::read(
        reqwest::Client::new()
            .post(format!(
                "{}/v1/orders/{}/cancel",
                serve.base,
                Uuid::new_v4()
            ))
            .bearer_auth(&token)
            .header("Idempotency-Key", &cancel_key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(refusal.status, 404);
    let upper = cancel_key.to_uppercase();
    assert_eq!(show_json(&db, &t, CANCEL, &upper, &[])["status"], 404);
    let forgot = on_record(&db, &["forget"], &t, CANCEL, &upper);
    assert!(forgot.ok, "{}", forgot.stderr);
    let missing = on_record(&db, &["forget"], &t, CANCEL, &upper);
    assert!(
        !missing.ok && missing.stderr.contains("nothing to forget"),
        "{}",
        missing.stderr
    );

    // A name that cannot be a record says why, touching nothing.
    let bad = on_record(&db, &["show"], &t, "GET /v1/orders", &live);
    assert!(
        !bad.ok && bad.stderr.contains("POST /v1/orders/{id}/cancel"),
        "{}",
        bad.stderr
    );
    let short = on_record(&db, &["forget"], &t, CREATE, "short");
    assert!(
        !short.ok && short.stderr.contains("--key"),
        "{}",
        short.stderr
    );
    assert_eq!(db.count("idempotency_record").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_body_opens_a_sealed_answer_byte_for_byte() {
    let db = TestDb::new().await;
    let serve = ServeProcess::start(&db, &[("ORDERD_RESPONSE_KEYS", KEY.to_string())]);
    let tenant = Uuid::new_v4();
    let key = new_key();
    let body = json!({"sku": "FORGET-4", "quantity": 3, "customer_ref": "Ada Lovelace"});
    let first = create(&serve, &serve.token(tenant), &key, &body).await;
    assert_eq!(first.status, 201);
    let t = tenant.to_string();

    let sealed = show_json(&db, &t, CREATE, &key, &[]);
    assert_eq!(sealed["sealed_with"], "k7");
    let mut args = vec!["show", "--json", "--body"];
    args.extend(named(&t, CREATE, &key));
    let opened = idempotency(&db, &args, &[("ORDERD_RESPONSE_KEYS", KEY)]);
    assert!(opened.ok, "{}", opened.stderr);
    let opened: Value = serde_json::from_str(&opened.stdout).unwrap();
    assert_eq!(
        opened["body"].as_str().unwrap().as_bytes(),
        first.body.as_slice()
    );
    // Without the key it is not opened, and says so.
    let closed = idempotency(&db, &args, &[]);
    assert!(
        !closed.ok && closed.stderr.contains("k7"),
        "{}",
        closed.stderr
    );
}
