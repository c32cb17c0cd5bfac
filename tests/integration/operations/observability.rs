//! docs/contract.md §8: exact metric counts, promtool, a real Prometheus
//! evaluating every dashboard and alert expression, gauges that follow reality,
//! structured request logs. orderd runs as a child process here, so its metrics are its
//! own and not shared with the other tests of this binary.

use std::{path::Path, process::Command, time::Duration};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::{
    support::proxy::{Mode, Proxy},
    support::sns::{Topic, aws_env, moto_address},
    support::{ServeProcess, TestDb, create_fingerprint, new_key, order_body, post_order, sample},
};

const CREATE: &str = r#"{endpoint="POST /v1/orders",outcome="#;
const GRAFANA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/grafana");

/// Leaves a PROCESSING claim for `body` whose lease ends `lease` from now.
async fn insert_processing(db: &TestDb, tenant: Uuid, key: &str, body: &Value, lease: &str) {
    db.insert_processing(
        tenant,
        key,
        &create_fingerprint(body),
        lease,
        Uuid::new_v4(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_each_idempotency_outcome_once_and_logs_say_who_and_how() {
    let db = TestDb::new().await;
    let serve = ServeProcess::start(&db, &[("ORDERD_INFLIGHT_WAIT_MS", "0".into())]);
    let before = serve.metrics().await;
    for outcome in [
        "created",
        "replayed",
        "payload_conflict",
        "in_flight",
        "lease_takeover",
    ] {
        assert_eq!(
            sample(
                &before,
                &format!("idempotency_requests_total{CREATE}\"{outcome}\"}}")
            ),
            Some(0.0),
            "{outcome} exported at zero"
        );
    }
    let tenant = Uuid::new_v4();
    let token = serve.token(tenant);
    let body = order_body("MET-1", 1);
    let key = new_key();
    assert_eq!(
        post_order(&serve.base, &token, &key, &body, Some("trace-me-123"))
            .await
            .status(),
        201
    ); // created
    assert_eq!(
        post_order(&serve.base, &token, &key, &body, None)
            .await
            .status(),
        201
    ); // replayed
    assert_eq!(
        post_order(&serve.base, &token, &key, &order_body("MET-1", 2), None)
            .await
            .status(),
        422
    ); // payload_conflict
    let busy = new_key();
    insert_processing(&db, tenant, &busy, &body, "30 seconds").await;
    assert_eq!(
        post_order(&serve.base, &token, &busy, &body, None)
            .await
            .status(),
        409
    ); // in_flight
    let abandoned = new_key();
    insert_processing(&db, tenant, &abandoned, &body, "-1 second").await;
    assert_eq!(
        post_order(&serve.base, &token, &abandoned, &body, None)
            .await
            .status(),
        201
    ); // lease_takeover
    reqwest::get(format!("{}/no/such/{}", serve.base, Uuid::new_v4()))
        .await
        .unwrap();

    let after = serve.metrics().await;
    for (outcome, count) in [
        ("created", 1.0),
        ("replayed", 1.0),
        ("payload_conflict", 1.0),
        ("in_flight", 1.0),
        ("lease_takeover", 1.0),
    ] {
        assert_eq!(
            sample(
                &after,
                &format!("idempotency_requests_total{CREATE}\"{outcome}\"}}")
            ),
            Some(count),
            "{outcome}"
        );
    }
    assert_eq!(
        sample(
            &after,
            r#"idempotency_requests_total{endpoint="POST /v1/orders/{id}/cancel",outcome="created"}"#
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &after,
            r#"http_requests_total{method="POST",route="/v1/orders",status="201"}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &after,
            r#"http_requests_total{method="POST",route="/v1/orders",status="422"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &after,
            r#"http_requests_total{method="GET",route="unmatched",status="404"}"#
        ),
        Some(1.0)
    );
    assert!(
        after.contains(
            r#"http_request_duration_seconds_bucket{method="POST",route="/v1/orders",le="0.005"}"#
        ),
        "{after}"
    );
    // No key, token, tenant or order id ever becomes a label value.
    let uuid_like = after.lines().filter(|l| !l.starts_with('#')).any(|l| {
        l.split(['"', '/', '{', '}', ','])
            .any(|part| Uuid::try_parse(part).is_ok())
    });
    assert!(
        !uuid_like && !after.contains(&key) && !after.contains(&token),
        "{after}"
    );

    // One structured line per request, with the caller, the outcome and the request id.
    let logs = serve.logs.lock().unwrap().clone();
    let line = logs
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["fields"]["request_id"] == "trace-me-123")
        .expect("a request log line with the caller's request id");
    let fields = &line["fields"];
    assert_eq!(
        (
            fields["method"].as_str(),
            fields["route"].as_str(),
            fields["status"].as_u64()
        ),
        (Some("POST"), Some("/v1/orders"), Some(201))
    );
    assert_eq!(fields["tenant"], tenant.to_string());
    assert_eq!(fields["idempotency"], "created");
    assert!(fields["latency_ms"].as_f64().is_some());
}

/// The exporter keeps each raw latency observation until something folds it into the
/// buckets; a process must do that on its own, scraped or not, or its memory grows with
/// every request. The job runs on its own schedule, and no observation is lost by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_upkeep_runs_unscraped_and_keeps_every_observation() {
    let db = TestDb::new().await;
    let serve = ServeProcess::start(&db, &[]);
    let client = reqwest::Client::new();
    for _ in 0..50 {
        let response = client
            .get(format!("{}/healthz", serve.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    const UPKEEP: &str = r#"background_job_runs_total{job="metrics upkeep",outcome="ok"}"#;
    let metrics = serve
        .metrics_until(|m| sample(m, UPKEEP).is_some_and(|runs| runs >= 1.0))
        .await;
    assert!(
        sample(&metrics, UPKEEP).is_some_and(|runs| runs >= 1.0),
        "{metrics}"
    );
    let observed = sample(
        &metrics,
        r#"http_request_duration_seconds_count{method="GET",route="/healthz"}"#,
    );
    assert!(observed.is_some_and(|n| n >= 50.0), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_is_echoed_or_generated() {
    let db = TestDb::new().await;
    let serve = ServeProcess::start(&db, &[]);
    let client = reqwest::Client::new();
    let echoed = client
        .get(format!("{}/healthz", serve.base))
        .header("X-Request-Id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(echoed.headers()["x-request-id"], "abc-123");
    let generated = client
        .get(format!("{}/healthz", serve.base))
        .send()
        .await
        .unwrap();
    assert!(Uuid::try_parse(generated.headers()["x-request-id"].to_str().unwrap()).is_ok());
    let forged = client
        .get(format!("{}/healthz", serve.base))
        .header("X-Request-Id", "a b\"c")
        .send()
        .await
        .unwrap();
    assert_ne!(forged.headers()["x-request-id"], "a b\"c");
}

/// The `name=value` fields of a text log line, in order: a value is a run of characters
/// up to the next space, or a quoted string (with `\` escapes) when it starts with `"`.
/// What is not a field (the time, the level, the target, the message) is skipped.
fn text_fields(line: &str) -> Vec<(String, String)> {
    let mut chars = line.chars().peekable();
    let mut fields = Vec::new();
    while chars.peek().is_some() {
        let mut name = String::new();
        while let Some(c) = chars.next_if(|c| c.is_alphanumeric() || matches!(c, '_' | '.')) {
            name.push(c);
        }
        if name.is_empty() || chars.next_if_eq(&'=').is_none() {
            while chars.next_if(|c| *c != ' ').is_some() {}
        } else {
            let mut value = String::new();
            if chars.next_if_eq(&'"').is_some() {
                while let Some(c) = chars.next().filter(|c| *c != '"') {
                    value.push(match c {
                        '\\' => match chars.next() {
                            Some('n') => '\n',
                            Some(c) => c,
                            None => break,
                        },
                        c => c,
                    });
                }
            } else {
                while let Some(c) = chars.next_if(|c| *c != ' ') {
                    value.push(c);
                }
            }
            fields.push((name, value));
        }
        while chars.next_if_eq(&' ').is_some() {}
    }
    fields
}

/// The values of the fields named `name` on a text log line.
fn field_values<'a>(fields: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    fields
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// A tool name and a token's subject are the client's text: on a text log line each is
/// one field, quoted, however many spaces, `=` and quotes it holds, so neither can add a
/// field of its own (a tenant, a status) to the line (docs/contract.md §8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_name_or_a_subject_holding_fields_of_its_own_is_one_quoted_field_of_a_text_line() {
    let db = TestDb::new().await;
    let serve = ServeProcess::start(&db, &[("ORDERD_LOG_FORMAT", "text".to_string())]);
    let (tenant, forged) = (Uuid::new_v4(), Uuid::new_v4());
    let subject = format!("app tenant={forged} status=200");
    let token = orderd::auth::mint_hs256(
        &orderd::config::Secret::new(crate::support::SECRET),
        tenant,
        &subject,
        "orders:read orders:write",
        Duration::from_secs(600),
        None,
        None,
    )
    .unwrap();
    let tool = format!("x tenant={forged} status=200 \"quoted\" end");
    let client = reqwest::Client::new();
    let call = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": {}},
    });
    let answered = crate::support::post_mcp(&serve.base, &token, &call).await;
    assert_eq!(answered.status(), 200);
    let listed = client
        .get(format!("{}/v1/orders", serve.base))
        .bearer_auth(&token)
        .header("x-request-id", "quoted-fields-1")
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    let line_with = |needle: &str| {
        serve
            .logs
            .lock()
            .unwrap()
            .iter()
            .find(|line| line.contains(needle))
            .cloned()
    };
    for _ in 0..100 {
        if line_with("quoted-fields-1").is_some() && line_with("tool call").is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tool_call = line_with("tool call").expect("the tool call is logged");
    assert_eq!(
        field_values(&text_fields(&tool_call), "tool"),
        [tool.as_str()],
        "{tool_call}"
    );
    let request = line_with("quoted-fields-1").expect("the request is logged");
    let real = tenant.to_string();
    for (line, status) in [(&tool_call, "404"), (&request, "200")] {
        let fields = text_fields(line);
        assert_eq!(field_values(&fields, "sub"), [subject.as_str()], "{line}");
        assert_eq!(field_values(&fields, "tenant"), [real.as_str()], "{line}");
        assert_eq!(field_values(&fields, "status"), [status], "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_live_metrics_and_the_alert_rules_and_their_unit_tests_pass() {
    let db = TestDb::new().await;
    let serve = ServeProcess::start(&db, &[]);
    let token = serve.token(Uuid::new_v4());
    post_order(
        &serve.base,
        &token,
        &new_key(),
        &order_body("PROM-1", 1),
        None,
    )
    .await;
    let metrics = serve.metrics().await;
    promtool(&["check", "metrics"], Some(metrics.as_bytes()));
    promtool(&["check", "rules", "alerts.yml"], None);
    promtool(&["test", "rules", "alerts_test.yml"], None);
    promtool(&["check", "config", "prometheus.yml"], None);
}

/// Runs promtool in `grafana/prometheus` (with `input` on stdin) and asserts success.
fn promtool(args: &[&str], input: Option<&[u8]>) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(format!("{GRAFANA}/prometheus"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    let mut stdin = child.stdin.take().unwrap();
    if let Some(input) = input {
        stdin.write_all(input).unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every PromQL expression of the dashboards, with Grafana's interval variable filled in.
fn dashboard_expressions() -> Vec<(String, String)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(format!("{GRAFANA}/dashboards")).unwrap() {
        let path = entry.unwrap().path();
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$__rate_interval", "10s");
                // k6's own series exist only while k6 writes them: `.ci/test` checks
                // those panels against a Prometheus that k6 writes to.
                if expr.contains("k6_") {
                    continue;
                }
                all.push((
                    format!(
                        "{} / {}",
                        path.file_name().unwrap().to_string_lossy(),
                        panel["title"]
                    ),
                    expr,
                ));
            }
        }
    }
    all
}

fn alert_expressions() -> Vec<(String, String)> {
    let rules: Value = serde_yaml::from_str(
        &std::fs::read_to_string(format!("{GRAFANA}/prometheus/alerts.yml")).unwrap(),
    )
    .unwrap();
    rules["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_string(),
                r["expr"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Evaluates `expr` through Prometheus' HTTP API.
async fn prom_query(client: &reqwest::Client, api: &str, expr: &str) -> Value {
    client
        .get(query_url(api, expr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `GET /api/v1/query?query=EXPR`, encoded.
fn query_url(api: &str, expr: &str) -> reqwest::Url {
    reqwest::Url::parse_with_params(&format!("{api}/query"), &[("query", expr)]).unwrap()
}

async fn scrapes_in_last_10s(client: &reqwest::Client, api: &str) -> f64 {
    let Ok(response) = client
        .get(query_url(api, "count_over_time(up[10s])"))
        .send()
        .await
    else {
        return 0.0;
    };
    let answer: Value = response.json().await.unwrap_or(json!({}));
    answer["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_orderd_and_every_dashboard_and_alert_expression_evaluates() {
    let db = TestDb::new().await;
    let serve = ServeProcess::start(&db, &[]);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("prometheus-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        format!("{GRAFANA}/prometheus/alerts.yml"),
        dir.join("alerts.yml"),
    )
    .unwrap();
    let target = serve.base.trim_start_matches("http://").to_string();
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [alerts.yml]\nscrape_configs:\n  - job_name: orderd\n    static_configs: [{{targets: ['{target}']}}]\n"
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _prometheus = crate::support::KillOnDrop(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("prometheus (apt-get install prometheus)"),
    );
    // A short load while Prometheus scrapes: creates, replays, a conflict, reads.
    let token = serve.token(Uuid::new_v4());
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let client = reqwest::Client::new();
    for round in 0..40 {
        let key = new_key();
        post_order(&serve.base, &token, &key, &order_body("LOAD-1", 1), None).await;
        post_order(&serve.base, &token, &key, &order_body("LOAD-1", 1), None).await;
        if round % 10 == 0 {
            post_order(&serve.base, &token, &key, &order_body("LOAD-1", 2), None).await;
        }
        client
            .get(format!("{}/v1/orders", serve.base))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Until Prometheus has enough samples for a 10 s rate.
    for _ in 0..120 {
        if scrapes_in_last_10s(&client, &api).await >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (name, expr) in dashboard_expressions() {
        let answer = prom_query(&client, &api, &expr).await;
        assert_eq!(answer["status"], "success", "{name}: {expr}: {answer}");
        assert!(
            !answer["data"]["result"].as_array().unwrap().is_empty(),
            "{name} returns no data: {expr}"
        );
    }
    for (name, expr) in alert_expressions() {
        let answer = prom_query(&client, &api, &expr).await;
        assert_eq!(answer["status"], "success", "{name}: {expr}: {answer}");
    }
    let rules: Value = client
        .get(format!("{api}/rules"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let loaded = rules["data"]["groups"][0]["rules"].as_array().unwrap();
    let defined = std::fs::read_to_string(Path::new(GRAFANA).join("prometheus/alerts.yml"))
        .unwrap()
        .matches("- alert:")
        .count();
    assert_eq!(loaded.len(), defined, "every rule of alerts.yml is loaded");
    assert!(loaded.iter().all(|r| r["health"] == "ok"), "{rules}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_gauges_rise_while_sns_is_down_and_fall_to_zero_when_it_returns() {
    let topic = Topic::create(false).await;
    let proxy = Proxy::start(moto_address()).await;
    let db = TestDb::new().await;
    let mut env = aws_env(&proxy.endpoint());
    env.extend([
        ("ORDERD_RELAY", "on".to_string()),
        ("ORDERD_SNS_TOPIC_ARN", topic.arn.clone()),
        ("ORDERD_OUTBOX_POLL_MS", "200".into()),
        ("ORDERD_OUTBOX_BACKOFF_INITIAL_MS", "100".into()),
        ("ORDERD_OUTBOX_BACKOFF_MAX_MS", "300".into()),
    ]);
    let serve = ServeProcess::start(&db, &env);
    proxy.set(Mode::Refuse);
    let token = serve.token(Uuid::new_v4());
    for _ in 0..3 {
        assert_eq!(
            post_order(
                &serve.base,
                &token,
                &new_key(),
                &order_body("GAUGE-1", 1),
                None
            )
            .await
            .status(),
            201
        );
    }
    let gauges = |m: &str| {
        (
            sample(m, "outbox_pending_events").unwrap_or(-1.0),
            sample(m, "outbox_oldest_pending_age_seconds").unwrap_or(-1.0),
        )
    };
    let network_failures =
        |m: &str| sample(m, r#"outbox_publish_failures_total{reason="network"}"#).unwrap_or(0.0);
    // The SDK retries a cut connection itself before the relay records a failure, so
    // wait for both the gauges and the counter.
    let down = serve
        .metrics_until(|m| {
            let (pending, age) = gauges(m);
            pending == 3.0 && age >= 1.0 && network_failures(m) > 0.0
        })
        .await;
    let seen = gauges(&down);
    assert!(
        seen.0 == 3.0 && seen.1 >= 1.0,
        "pending and age rose: {seen:?}"
    );
    assert!(network_failures(&down) > 0.0, "{down}");

    proxy.set(Mode::Forward);
    let up = serve.metrics_until(|m| gauges(m) == (0.0, 0.0)).await;
    let seen = gauges(&up);
    assert_eq!(seen, (0.0, 0.0), "the gauges fell back to zero");
    let published = serve.metrics().await;
    assert_eq!(
        sample(
            &published,
            r#"outbox_published_total{event_type="OrderCreated"}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(&published, "outbox_publish_lag_seconds_count"),
        Some(3.0)
    );
    assert_eq!(topic.collect(3).await.len(), 3);
    db.until_count(
        "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
        3,
    )
    .await;
}

#[test]
fn the_dashboards_are_valid_grafana_json_using_the_datasource_variable_everywhere() {
    for entry in std::fs::read_dir(format!("{GRAFANA}/dashboards")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.display().to_string();
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36, "{name}");
        assert!(
            dashboard["uid"].as_str().is_some_and(|u| !u.is_empty()),
            "{name}"
        );
        let variables = dashboard["templating"]["list"].as_array().unwrap();
        assert!(
            variables.iter().any(|v| v["type"] == "datasource"
                && v["name"] == "datasource"
                && v["query"] == "prometheus"),
            "{name}"
        );
        let panels = dashboard["panels"].as_array().unwrap();
        let ids: std::collections::HashSet<u64> =
            panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
        assert_eq!(ids.len(), panels.len(), "{name}: panel ids are unique");
        for panel in panels {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{name}: {}",
                panel["title"]
            );
            for target in panel["targets"].as_array().unwrap() {
                assert_eq!(
                    target["datasource"]["uid"], "${datasource}",
                    "{name}: {}",
                    panel["title"]
                );
                assert!(target["expr"].as_str().is_some_and(|e| !e.is_empty()));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_relay_serves_its_own_metrics_and_stops_cleanly_on_sigterm() {
    let topic = Topic::create(false).await;
    let db = TestDb::new().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let relay = crate::support::KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_orderd"))
            .arg("relay")
            .envs(aws_env(&crate::support::sns::moto_endpoint()))
            .env("DATABASE_URL", &db.url)
            .env("ORDERD_SNS_TOPIC_ARN", &topic.arn)
            .env("ORDERD_METRICS_BIND", format!("127.0.0.1:{port}"))
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut metrics = String::new();
    for _ in 0..200 {
        if let Ok(response) = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await {
            metrics = response.text().await.unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        sample(&metrics, "outbox_pending_events"),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"outbox_published_total{event_type="OrderCreated"}"#
        ),
        Some(0.0),
        "{metrics}"
    );
    assert!(
        Command::new("kill")
            .args(["-TERM", &relay.0.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::task::spawn_blocking(move || {
        let mut relay = relay;
        relay.0.wait()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(status.success(), "relay exits cleanly on SIGTERM: {status}");
}
