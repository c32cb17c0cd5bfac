//! Fuzzing targets: one function per parser of bytes that orderd does not choose (a
//! request's token, create body, list cursor, trace headers and MCP message, and the
//! settings that take lists), each driving the real parser through the nearest public
//! door and asserting what must hold of every input, so that a wrong answer fails as
//! loudly as a panic. `fuzz/` runs them under libFuzzer (`cargo fuzz`, decision 180);
//! the unit test at the bottom replays every committed input under plain `cargo test`,
//! so CI needs no nightly compiler and no fuzzer to keep what the fuzzer found.

use std::{
    collections::{BTreeSet, HashSet},
    future::Future,
    sync::{Arc, LazyLock},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use base64::{
    Engine,
    engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD},
};
use chrono::{DateTime, Datelike};
use http::{HeaderMap, HeaderValue, Method, header};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use poem::Endpoint;
use poem_openapi::types::ParseFromParameter;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::{
    api::{
        self, TenantLimits,
        body::CreateOrderBody,
        mcp::Mcp,
        params::KeyHeader,
        problem::{AppKind, Kind},
    },
    auth::{JwtConfig, LEEWAY_SECS, Principal, SCOPE_READ, SCOPE_WRITE, Verifier},
    config::{Env, Secret, Setting, parse::base64_any_padding, published},
    db::{self, Db, DbConfig},
    erasure::Erasures,
    idempotency::{
        Fingerprint, Guard, IdempotencyConfig, IdempotencyKey, KeyError, seal::RESPONSE_KEY_ID_MAX,
        settings::RESPONSE_KEYS,
    },
    orders::rules::{CUSTOMER_REF_MAX, FIELDS, QUANTITY_MAX, QUANTITY_MIN, SKU_MAX, check_text},
    outbox::sink::kafka::settings::{
        KAFKA_BROKERS, KAFKA_CONFIG, KAFKA_TOPIC, KafkaSettings, kafka_property_refusal,
        kafka_value_refusal,
    },
    service::{self, Caller, Service, decode_cursor, encode_cursor},
    supervisor::Supervisor,
    tenant::TenantId,
    trace_context::{MAX_TRACESTATE_LEN, TraceContext},
};

/// A target: any bytes in, a panic (with what broke) when a property does not hold.
pub type Target = fn(&[u8]);

/// Every target by name: the name of its `fuzz/fuzz_targets/<name>.rs`, of its corpus
/// folder `fuzz/corpus/<name>/` and of its regressions `fuzz/regressions/<name>/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("jwt", jwt),
    ("create_body", create_body),
    ("list_cursor", list_cursor),
    ("trace_context", trace_context),
    ("mcp_request", mcp_request),
    ("idempotency_key", idempotency_key),
    ("kafka_config", kafka_config),
    ("response_keys", response_keys),
    ("citus_node_urls", citus_node_urls),
];

/// Runs an async parser to its end. One current-thread runtime for every input: no
/// thread of its own, so a run is as repeatable as libFuzzer needs, and the timers the
/// tenant limiter and the MCP transport set work as in the server.
fn block_on<F: Future>(future: F) -> F::Output {
    static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds")
    });
    RUNTIME.block_on(future)
}

// ---------------------------------------------------------------------------------------
// The bearer token.

/// The secret tokens are signed with; at least 32 bytes, as the settings require.
const SECRET: &str = "fuzzing-secret-0123456789abcdefghijklmnop";
/// A second secret, the one a rotation puts first: only the strict verifier holds it.
const ROTATED: &str = "fuzzing-rotated-0123456789abcdefghijklmno";
/// A secret no verifier holds.
const FOREIGN: &str = "fuzzing-foreign-0123456789abcdefghijklmno";
/// What the strict verifier requires of `iss` and `aud`.
const ISSUER: &str = "https://issuer.example";
const AUDIENCE: &str = "orderd";

/// Three verifiers, as an operator configures them: `plain` with [`SECRET`] alone;
/// `strict` in the middle of a rotation ([`ROTATED`] first, then [`SECRET`]) that also
/// checks the issuer and the audience; and `keyless`, a JSON Web Key Set whose provider
/// never answers (a loopback port nothing listens on), which picks a key by the
/// token's `kid` and has none to pick. `/mcp`'s shared state holds `plain` too: it
/// never verifies (the gate did), so any configured verifier will do.
struct Verifiers {
    plain: Arc<Verifier>,
    strict: Verifier,
    keyless: Verifier,
}

fn verifiers() -> &'static Verifiers {
    static VERIFIERS: LazyLock<Verifiers> = LazyLock::new(|| Verifiers {
        plain: Arc::new(
            Verifier::new(&JwtConfig {
                hs256_secret: Some(Secret::new(SECRET)),
                ..Default::default()
            })
            .expect("an HS256 verifier builds"),
        ),
        strict: Verifier::new(&JwtConfig {
            hs256_secret: Some(Secret::new(format!("{ROTATED},{SECRET}"))),
            issuer: Some(ISSUER.into()),
            audience: Some(AUDIENCE.into()),
            ..Default::default()
        })
        .expect("an HS256 verifier with an issuer and an audience builds"),
        keyless: Verifier::new(&JwtConfig {
            jwks_url: Some("http://127.0.0.1:0/.well-known/jwks.json".into()),
            issuer: Some(ISSUER.into()),
            audience: Some(AUDIENCE.into()),
            ..Default::default()
        })
        .expect("a JWKS verifier builds without fetching"),
    });
    &VERIFIERS
}

/// The token up to and through verification: its head (`alg`, `kid`), its claims and
/// its signature, as the gate reads it from an `Authorization` header.
///
/// The input is used twice. As it is: the header value (or the token, without the
/// `Bearer ` prefix). And, when it holds a line break, as a head and claims of JSON
/// (before and after the first `\n`) that are signed here with the verifiers' secret,
/// so that the claims parsing behind the signature check is reached at all; the same
/// head and claims signed with a secret no verifier holds must then be refused.
///
/// Asserts: a token is accepted only with `alg` HS256 and a signature of a configured
/// secret, and never by a key set that holds no key, whatever its `kid`; an accepted token's principal is what its claims say (tenant, subject,
/// scopes) and its `exp` has not passed; the strict verifier accepts nothing the plain
/// one refuses, bar tokens of the secret only it holds; and a token verified again
/// (answered from memory) gets the same answer.
pub fn jwt(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let token = api::auth::bearer_token(Some(&text)).unwrap_or(&text);
    check_token(token);
    if let Some(at) = data.iter().position(|&b| b == b'\n') {
        let (head, claims) = (&data[..at], &data[at + 1..]);
        check_token(&signed(head, claims, SECRET));
        let foreign = signed(head, claims, FOREIGN);
        let v = verifiers();
        assert!(
            verify(&v.plain, &foreign).is_none() && verify(&v.strict, &foreign).is_none(),
            "a token signed with a secret no verifier holds was accepted: {foreign}"
        );
    }
}

/// `head.claims.signature`, each part as a JWT spells it, signed HS256 with `secret`.
fn signed(head: &[u8], claims: &[u8], secret: &str) -> String {
    let message = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(head),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let key = EncodingKey::from_secret(secret.as_bytes()).expect("any secret is an HMAC key");
    let signature = jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::HS256)
        .expect("HS256 signs any message");
    format!("{message}.{signature}")
}

/// The principal `verifier` answers for `token`, if it accepts it.
fn verify(verifier: &Verifier, token: &str) -> Option<Arc<Principal>> {
    block_on(verifier.verify(token)).ok()
}

fn check_token(token: &str) {
    let v = verifiers();
    let plain = verify(&v.plain, token);
    let strict = verify(&v.strict, token);
    for (verifier, first) in [(&*v.plain, &plain), (&v.strict, &strict)] {
        let again = verify(verifier, token);
        assert_eq!(
            again.as_deref().map(summary),
            first.as_deref().map(summary),
            "the same token verified twice got two answers: {token}"
        );
        if let Some(principal) = first {
            agrees_with_claims(token, principal);
        }
    }
    assert!(
        verify(&v.keyless, token).is_none(),
        "a token verified without any key: {token}"
    );
    if strict.is_some() && !signed_by(token, ROTATED) {
        assert!(
            plain.is_some(),
            "a token the strict verifier accepts with the shared secret was refused by the plain one: {token}"
        );
    }
}

/// What a principal says, comparably.
fn summary(principal: &Principal) -> (Uuid, String, BTreeSet<String>) {
    (
        principal.tenant.0,
        principal.subject.clone(),
        principal.scopes.iter().cloned().collect(),
    )
}

/// Whether `token`'s signature is the HS256 one of `secret`.
fn signed_by(token: &str, secret: &str) -> bool {
    let Some((message, signature)) = token.rsplit_once('.') else {
        return false;
    };
    let key = DecodingKey::from_secret(secret.as_bytes()).expect("any secret is an HMAC key");
    jsonwebtoken::crypto::verify(signature, message.as_bytes(), &key, Algorithm::HS256)
        .unwrap_or(false)
}

/// An accepted token's head says HS256, and its principal is what its claims say.
fn agrees_with_claims(token: &str, principal: &Principal) {
    let head = jsonwebtoken::decode_header(token).expect("an accepted token has a head");
    assert_eq!(
        head.alg,
        Algorithm::HS256,
        "a token of another algorithm was accepted: {token}"
    );
    let payload = token
        .split('.')
        .nth(1)
        .expect("an accepted token has claims");
    // Read leniently: the verifier skips the members it does not know without looking
    // inside their strings, so a signed token whose unknown member holds bytes that are
    // not UTF-8 verifies (harmless: only the key's holder can sign one).
    let claims: Value = URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|bytes| serde_json::from_str(&String::from_utf8_lossy(&bytes)).ok())
        .expect("an accepted token's claims are base64url JSON");
    let tenant: Uuid = serde_json::from_value(claims["tenant_id"].clone())
        .expect("an accepted token's tenant_id is a UUID");
    assert_eq!(principal.tenant, TenantId(tenant), "tenant of {token}");
    assert_eq!(
        Some(principal.subject.as_str()),
        claims["sub"].as_str(),
        "subject of {token}"
    );
    let scopes: HashSet<String> = claims["scope"]
        .as_str()
        .expect("an accepted token's scope is a string")
        .split_ascii_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(principal.scopes, scopes, "scopes of {token}");
    let exp = claims["exp"]
        .as_u64()
        .expect("an accepted token's exp is a whole number");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    assert!(
        exp.saturating_add(LEEWAY_SECS) >= now,
        "an expired token was accepted: {token}"
    );
}

// ---------------------------------------------------------------------------------------
// The create body and its fingerprint.

/// `POST /v1/orders`'s body to a new order (`CreateOrderBody::parse`, which applies the
/// create rules), and the fingerprint the idempotency guard keys the request by.
///
/// Asserts: an accepted body keeps every rule (the sku's alphabet and length, the
/// quantity's bounds, a clean `customer_ref`); the body spelled otherwise (parsed as
/// JSON and written again compact, pretty, its members in reverse order, `null` for an
/// absent `customer_ref`) parses to the same order with the same fingerprint, or is
/// refused for the same fields; the order written out as JSON parses back to itself;
/// a refusal is a validation error naming only fields the body has or needs; and the
/// canonical fingerprint of any JSON value without floats survives its own
/// re-serialisation.
pub fn create_body(data: &[u8]) {
    let parsed = CreateOrderBody::parse(data);
    match &parsed {
        Ok(order) => {
            let sku = order.sku();
            assert!(
                (1..=SKU_MAX).contains(&sku.len())
                    && sku
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
                "an accepted sku breaks its rule: {sku:?}"
            );
            assert!(
                (QUANTITY_MIN..=QUANTITY_MAX).contains(&i64::from(order.quantity())),
                "an accepted quantity is out of bounds: {}",
                order.quantity()
            );
            if let Some(text) = order.customer_ref() {
                assert!(
                    check_text(text, CUSTOMER_REF_MAX).is_ok(),
                    "an accepted customer_ref breaks its rule: {text:?}"
                );
            }
            let written = serde_json::to_vec(order).expect("an order serialises");
            let back = CreateOrderBody::parse(&written).expect("an order's own JSON parses");
            assert_eq!(&back, order, "an order's own JSON parsed to another order");
            assert_eq!(
                service::create_fingerprint(&back),
                service::create_fingerprint(order)
            );
        }
        Err(problem) => {
            assert_eq!(problem.kind, Kind::App(AppKind::ValidationError));
            let errors = problem.errors.as_deref().unwrap_or_default();
            assert!(!errors.is_empty(), "a refused body names no field");
            let members: Vec<String> = serde_json::from_slice::<Map<String, Value>>(data)
                .map(|fields| fields.keys().cloned().collect())
                .unwrap_or_default();
            for error in errors {
                assert!(
                    error.field == "body"
                        || FIELDS.contains(&error.field.as_str())
                        || members.contains(&error.field),
                    "a refusal names a field the body neither has nor needs: {:?}",
                    error.field
                );
            }
        }
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let fingerprint = Fingerprint::of(&value);
    // serde_json's default float parser is not correctly rounded, so a float it wrote
    // can read back one bit apart (`5e+24` reads as 4.999999999999999e24): the canonical
    // form is stable for values without one. No request orderd fingerprints holds a
    // float (a quantity is a whole number, an id a UUID), and the order's own
    // fingerprint is checked below whatever the body held.
    let canonical_is_stable = !has_float(&value);
    for (respelled, same_value) in respellings(&value) {
        let reread: Value = serde_json::from_slice(&respelled).expect("written JSON parses");
        assert!(
            !(same_value && canonical_is_stable) || Fingerprint::of(&reread) == fingerprint,
            "the canonical form changed when the value was written again: {}",
            String::from_utf8_lossy(&respelled)
        );
        match (&parsed, CreateOrderBody::parse(&respelled)) {
            (Ok(order), Ok(again)) => {
                assert_eq!(&again, order);
                assert_eq!(
                    service::create_fingerprint(&again),
                    service::create_fingerprint(order),
                    "a body written otherwise has another fingerprint"
                );
            }
            (Err(first), Err(again)) => assert_eq!(
                faults(first),
                faults(&again),
                "a body written otherwise is refused otherwise"
            ),
            (first, again) => panic!(
                "a body written otherwise parsed otherwise: {:?} then {:?}",
                first.as_ref().err().map(faults),
                again.err().as_ref().map(faults)
            ),
        }
    }
}

/// The same JSON value, spelled in the ways a client might (compact, pretty, members
/// in reverse order), each with `true`; and, for an object without `customer_ref`, the
/// same request with `"customer_ref": null`, another value, with `false`.
fn respellings(value: &Value) -> Vec<(Vec<u8>, bool)> {
    let mut out = vec![
        (serde_json::to_vec(value).expect("a value serialises"), true),
        (
            serde_json::to_vec_pretty(value).expect("a value serialises"),
            true,
        ),
    ];
    if let Value::Object(fields) = value {
        let reversed: Vec<String> = fields
            .iter()
            .rev()
            .map(|(name, item)| {
                format!(
                    "{}:{}",
                    Value::String(name.clone()),
                    serde_json::to_string(item).expect("a value serialises")
                )
            })
            .collect();
        out.push((format!("{{{}}}", reversed.join(",")).into_bytes(), true));
        if !fields.contains_key("customer_ref") {
            let mut with_null = fields.clone();
            with_null.insert("customer_ref".into(), Value::Null);
            out.push((
                serde_json::to_vec(&with_null).expect("a value serialises"),
                false,
            ));
        }
    }
    out
}

/// Whether `value` holds a number that is not a whole number within 64 bits.
fn has_float(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_f64(),
        Value::Array(items) => items.iter().any(has_float),
        Value::Object(fields) => fields.values().any(has_float),
        _ => false,
    }
}

/// The fields a refusal names, with what it says of each.
fn faults(problem: &api::problem::Problem) -> BTreeSet<(String, String)> {
    problem
        .errors
        .iter()
        .flatten()
        .map(|e| (e.field.clone(), e.message.clone()))
        .collect()
}

// ---------------------------------------------------------------------------------------
// The list cursor.

/// `GET /v1/orders?after=` (and `list_orders`'s `after`): a cursor to the position it
/// names (`service::decode_cursor`), the way back (`encode_cursor`).
///
/// Asserts: an accepted cursor names a position PostgreSQL can compare (years 1 to
/// 9999) and the cursor written for that position names it again; a refused one is a
/// validation error on `after`; and a position made from the input's first 24 bytes
/// (microseconds and an id) comes back from its own cursor exactly when its year is in
/// that range.
pub fn list_cursor(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match decode_cursor(&text) {
        Ok(after) => {
            assert!(
                (1..=9999).contains(&after.created_at.year()),
                "a cursor named a position outside PostgreSQL's range: {text:?}"
            );
            let again = decode_cursor(&encode_cursor(after.created_at, after.id))
                .expect("a cursor written for an accepted position parses");
            assert_eq!(again, after, "a position did not survive its own cursor");
        }
        Err(problem) => {
            assert_eq!(problem.kind, service::problem::Kind::ValidationError);
            let fields: Vec<&str> = problem
                .errors
                .iter()
                .flatten()
                .map(|e| e.field.as_str())
                .collect();
            assert_eq!(
                fields,
                ["after"],
                "a bad cursor is refused on `after` alone"
            );
        }
    }
    if let (Some(micros), Some(id)) = (data.get(..8), data.get(8..24)) {
        let micros = i64::from_le_bytes(micros.try_into().expect("eight bytes"));
        let id = Uuid::from_slice(id).expect("sixteen bytes");
        if let Some(at) = DateTime::from_timestamp_micros(micros) {
            match decode_cursor(&encode_cursor(at, id)) {
                Ok(after) => assert_eq!((after.created_at, after.id), (at, id)),
                Err(_) => assert!(
                    !(1..=9999).contains(&at.year()),
                    "the cursor of {at} {id} was refused"
                ),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// W3C trace context.

/// `traceparent` and `tracestate` (`TraceContext::from_headers`), and the pair as an
/// event stores it (`TraceContext::from_stored`). The input's first line is the
/// `traceparent` header, each further line a `tracestate` header (a line no request
/// could carry as a header value is left out).
///
/// Asserts: a kept context is in version-00 form (lower-case hex, the dashes in place,
/// neither id all zeros); its `tracestate` is non-empty, at most
/// [`MAX_TRACESTATE_LEN`] bytes of at most 32 members, each a key and a value as the
/// recommendation spells them (a malformed one is dropped, never passed on to the
/// event's consumers); the context sent again, or read back from storage, is the same
/// context; and OpenTelemetry takes it as a remote parent, so the spans of the request
/// continue the caller's trace whatever OpenTelemetry thinks of its `tracestate`.
pub fn trace_context(data: &[u8]) {
    let mut lines = data.split(|&b| b == b'\n');
    let mut headers = HeaderMap::new();
    if let Some(Ok(parent)) = lines.next().map(HeaderValue::from_bytes) {
        headers.append("traceparent", parent);
    }
    for state in lines.filter_map(|line| HeaderValue::from_bytes(line).ok()) {
        headers.append("tracestate", state);
    }
    if let Some(context) = TraceContext::from_headers(&headers) {
        well_formed(&context);
        let mut again = HeaderMap::new();
        again.append(
            "traceparent",
            HeaderValue::from_str(&context.traceparent).expect("a kept traceparent is a value"),
        );
        if let Some(state) = &context.tracestate {
            again.append(
                "tracestate",
                HeaderValue::from_str(state).expect("a kept tracestate is a value"),
            );
        }
        assert_eq!(
            TraceContext::from_headers(&again).as_ref(),
            Some(&context),
            "a kept context sent again reads otherwise"
        );
        assert_eq!(
            TraceContext::from_stored(Some(&context.traceparent), context.tracestate.as_deref())
                .as_ref(),
            Some(&context),
            "a kept context read back from storage reads otherwise"
        );
        assert!(
            context.span_context().is_some(),
            "a kept context is no OpenTelemetry parent: {context:?}"
        );
    }
    // What a row holds is any text (a column another writer might have filled).
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(2, '\n');
    let (parent, state) = (parts.next(), parts.next());
    if let Some(context) = TraceContext::from_stored(parent, state) {
        assert_eq!(context.traceparent.len(), 55);
        assert!(context.traceparent.starts_with("00-"));
        let _ = context.span_context();
    }
}

fn well_formed(context: &TraceContext) {
    let parent = context.traceparent.as_bytes();
    let hex = |part: &[u8]| {
        part.iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    let zero = |part: &[u8]| part.iter().all(|&b| b == b'0');
    assert!(
        parent.len() == 55
            && parent.starts_with(b"00-")
            && parent[35] == b'-'
            && parent[52] == b'-'
            && hex(&parent[3..35])
            && hex(&parent[36..52])
            && hex(&parent[53..55])
            && !zero(&parent[3..35])
            && !zero(&parent[36..52]),
        "a kept traceparent is not in version-00 form: {:?}",
        context.traceparent
    );
    assert_eq!(context.trace_id(), &context.traceparent[3..35]);
    if let Some(state) = &context.tracestate {
        let members: Vec<&str> = state.split(',').collect();
        assert!(
            !state.is_empty() && state.len() <= MAX_TRACESTATE_LEN && members.len() <= 32,
            "a kept tracestate is empty or too long: {state:?}"
        );
        for member in members {
            assert!(
                member
                    .split_once('=')
                    .is_some_and(|(key, value)| w3c_key(key) && w3c_value(value)),
                "a kept tracestate has a member the recommendation does not allow: {member:?}"
            );
        }
    }
}

/// A `tracestate` key as W3C Trace Context spells it: a simple key (a lower-case
/// letter, then at most 255 of `[a-z0-9_*/-]`), or `tenant@system` (a lower-case letter
/// or a digit, then at most 240 of those; a lower-case letter, then at most 13).
fn w3c_key(key: &str) -> bool {
    let part = |text: &str, first: fn(&u8) -> bool, longest: usize| {
        text.as_bytes().first().is_some_and(first)
            && text.len() <= longest
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/".contains(&b))
    };
    match key.split_once('@') {
        None => part(key, u8::is_ascii_lowercase, 256),
        Some((tenant, system)) => {
            part(
                tenant,
                |b| b.is_ascii_lowercase() || b.is_ascii_digit(),
                241,
            ) && part(system, u8::is_ascii_lowercase, 14)
        }
    }
}

/// A `tracestate` value as W3C Trace Context spells it: 1 to 256 printable ASCII
/// characters but `,` and `=`, the last one not a space.
fn w3c_value(value: &str) -> bool {
    (1..=256).contains(&value.len())
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
        && !value.ends_with(' ')
}

// ---------------------------------------------------------------------------------------
// The MCP request.

/// The headers MCP requests are sent with here: as a client should, then with a wrong
/// `Accept` and a wrong `Content-Type`, which the protocol layer refuses (the tenant's
/// limits count those requests too).
const MCP_HEADS: [(&str, &str); 3] = [
    ("application/json, text/event-stream", "application/json"),
    ("application/json", "application/json"),
    ("application/json, text/event-stream", "text/plain"),
];

/// The application layer `/mcp` is served with here: no database behind it, and no
/// room for an operation (`ORDERD_HTTP_MAX_IN_FLIGHT` 0), so that every tool call whose
/// arguments parse is refused 503 by the service at the point where it would begin its
/// work, after the tool and the service checked everything else.
fn mcp_service() -> &'static Service {
    static SERVICE: LazyLock<Service> = LazyLock::new(|| {
        let db = Db::direct(
            sqlx::postgres::PgConnectOptions::new(),
            1,
            Duration::from_secs(1),
        );
        let idempotency = with_vars(&[], IdempotencyConfig::read).expect("the defaults are valid");
        let guard = Guard::new(db.clone(), idempotency, Supervisor::new().jobs());
        Service::new(db, guard, 0, Arc::new(Erasures::default()), &api::FRAMING)
    });
    &SERVICE
}

/// The caller the gate would have let through: a tenant's token with both scopes.
fn mcp_caller() -> Caller {
    Caller::new(Arc::new(Principal {
        tenant: TenantId(Uuid::from_u128(0x0f0f_0f0f)),
        subject: "fuzzing".into(),
        scopes: [SCOPE_READ, SCOPE_WRITE].map(String::from).into(),
    }))
}

/// The body of `POST /mcp`: the SDK's own reading of a JSON-RPC message
/// (`rmcp::model::ClientJsonRpcMessage`), then the whole endpoint (`api::mcp::Mcp`: the
/// count against the tenant's limits, the transport, the tools' argument parsing and
/// the application layer's checks), with each of [`MCP_HEADS`].
///
/// Asserts: a message the SDK reads it writes back and reads again to the same
/// message; the endpoint never answers 5xx and no tool call is refused as an internal
/// error; and every request counts against its tenant's limits, whatever its method
/// and whether or not the protocol layer refuses it: under a burst of one, the same
/// request sent a second time is refused as rate-limited (HTTP 429, or a tool result
/// saying so).
pub fn mcp_request(data: &[u8]) {
    if let Ok(message) = serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(data) {
        let written = serde_json::to_value(&message).expect("an MCP message serialises");
        let again: rmcp::model::ClientJsonRpcMessage = serde_json::from_value(written.clone())
            .unwrap_or_else(|e| panic!("the SDK cannot read what it wrote ({e}): {written}"));
        assert_eq!(
            serde_json::to_value(&again).expect("an MCP message serialises"),
            written,
            "an MCP message changed on its way through the SDK"
        );
    }
    for (accept, content_type) in MCP_HEADS {
        block_on(every_request_counts(data, accept, content_type));
    }
}

/// `/mcp` over [`mcp_service`], its tenants limited to a burst of one request.
fn mcp_endpoint(rate_per_sec: Option<u32>) -> Mcp {
    let limits = TenantLimits {
        rate_per_sec,
        burst: 1,
        max_in_flight: 8,
    };
    Mcp::new(
        mcp_service().clone(),
        &api::Shared::new(verifiers().plain.clone(), &limits),
    )
}

async fn every_request_counts(body: &[u8], accept: &str, content_type: &str) {
    let mcp = mcp_endpoint(Some(1));
    let (status, answer) = mcp_answer(&mcp, body, accept, content_type).await;
    let shown = || {
        format!(
            "{status} {} (Accept {accept}, Content-Type {content_type})",
            String::from_utf8_lossy(&answer)
        )
    };
    assert!(status < 500, "/mcp failed: {}", shown());
    assert!(
        !tool_problems(&answer).any(|p| p["status"].as_u64().is_some_and(|s| s >= 500 && s != 503)),
        "a tool call failed: {}",
        shown()
    );
    let (second_status, second) = mcp_answer(&mcp, body, accept, content_type).await;
    let rate_limited = second_status == 429
        || tool_problems(&second).any(|p| p["type"] == "/problems/rate-limited");
    assert!(
        rate_limited,
        "an MCP request did not count against its tenant's limits: the first was answered {}, \
         the same request again {second_status} {}",
        shown(),
        String::from_utf8_lossy(&second)
    );
}

/// The status and body `/mcp` answers `body` with, for the caller the gate admitted.
async fn mcp_answer(mcp: &Mcp, body: &[u8], accept: &str, content_type: &str) -> (u16, Vec<u8>) {
    let mut request = poem::Request::builder()
        .method(Method::POST)
        .uri(http::Uri::from_static("/mcp"))
        .header(header::HOST, "orderd.example")
        .header(header::ACCEPT, accept)
        .header(header::CONTENT_TYPE, content_type)
        .body(body.to_vec());
    request.extensions_mut().insert(mcp_caller());
    let response = mcp.call(request).await.expect("/mcp answers every request");
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .into_vec()
        .await
        .expect("an answer's body arrives");
    (status, bytes)
}

/// The problems of the tool results in an answer: a JSON body, or the `data:` lines
/// of an event stream.
fn tool_problems(answer: &[u8]) -> impl Iterator<Item = Value> {
    let messages: Vec<Value> = match serde_json::from_slice(answer) {
        Ok(message) => vec![message],
        Err(_) => String::from_utf8_lossy(answer)
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str(data.trim()).ok())
            .collect(),
    };
    messages
        .into_iter()
        .filter(|message| message["result"]["isError"] == true)
        .flat_map(|message| match &message["result"]["content"] {
            Value::Array(items) => items.clone(),
            _ => Vec::new(),
        })
        .filter_map(|item| serde_json::from_str(item["text"].as_str()?).ok())
}

// ---------------------------------------------------------------------------------------
// The Idempotency-Key header.

/// The `Idempotency-Key` header as the REST API takes it (`api::params::KeyHeader`)
/// and the key it names (`IdempotencyKey::parse`).
///
/// Asserts: both doors agree; an accepted key is 16 to 128 characters of
/// `[A-Za-z0-9_-]`, a fixed point of the parse, the same key in its quoted form, and a
/// UUID in lower case; a present header is refused only as invalid, never as missing.
pub fn idempotency_key(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let direct = IdempotencyKey::parse(Some(&text));
    let header = KeyHeader::parse_from_parameter(&text)
        .unwrap_or_else(|_| panic!("a header value is always taken: {text:?}"))
        .parse();
    match (&direct, &header) {
        (Ok(key), Ok(through_header)) => assert_eq!(key, through_header),
        (Err(KeyError::Invalid), Err(problem)) => {
            assert_eq!(problem.kind, Kind::App(AppKind::IdempotencyKeyInvalid))
        }
        _ => panic!("the header and the key disagree on {text:?}: {direct:?}, {header:?}"),
    }
    if let Ok(key) = direct {
        let k = key.as_str();
        assert!(
            (16..=128).contains(&k.len())
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "an accepted key is malformed: {k:?}"
        );
        assert_eq!(IdempotencyKey::parse(Some(k)).as_ref(), Ok(&key));
        assert_eq!(
            IdempotencyKey::parse(Some(&format!("\"{k}\""))).as_ref(),
            Ok(&key)
        );
        if k.len() == 36 && Uuid::try_parse(k).is_ok() {
            assert_eq!(k, k.to_ascii_lowercase(), "a UUID key kept its capitals");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The settings that take lists.

/// Text no value of a list setting is, put in place of the values to find out whether
/// a refusal shows them (every one of these settings may hold credentials).
const CANARY: &str = "CANARY-SECRET-7Qx";

/// `read` of an environment that sets `vars` and nothing else.
fn with_vars<T>(vars: &[(&Setting, &str)], read: impl FnOnce(&Env<'_>) -> T) -> T {
    let lookup = |name: &str| {
        vars.iter()
            .find(|(setting, _)| setting.name == name)
            .map(|(_, value)| value.to_string())
    };
    read(&Env::new(&lookup))
}

/// `text` read by `read` as the value of `setting`; `None` when it is refused for
/// holding a value orderd's own examples publish (decision 179), before its parser
/// runs: then the parser's properties do not apply, and the refusal must name the
/// setting without the value.
fn read_unless_published<T>(
    setting: &Setting,
    text: &str,
    read: fn(&str) -> Result<T, String>,
) -> Option<Result<T, String>> {
    let read = read(text);
    if with_vars(&[(setting, text)], |env| published::refuse(env, setting)).is_ok() {
        return Some(read);
    }
    let Err(message) = read else {
        panic!("a published value is refused: {text:?}")
    };
    assert!(
        message.starts_with(setting.name),
        "a refusal of a published value names no setting: {message}"
    );
    None
}

/// `text` with the value of every `,`-separated item (after its first `separator`)
/// replaced by [`CANARY`], except where `keep(name, value)` says the value itself
/// decides the outcome.
fn values_replaced(text: &str, separator: char, keep: impl Fn(&str, &str) -> bool) -> String {
    text.split(',')
        .map(|item| match item.split_once(separator) {
            Some((name, value)) if !keep(name.trim(), value.trim()) => {
                format!("{name}{separator}{CANARY}")
            }
            _ => item.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `ORDERD_KAFKA_CONFIG`, read as the relay reads its settings (with the brokers and
/// the topic set).
fn kafka_settings(config: &str) -> Result<KafkaSettings, String> {
    let vars = [
        (&KAFKA_CONFIG, config),
        (&KAFKA_BROKERS, "localhost:9092"),
        (&KAFKA_TOPIC, "orders"),
    ];
    with_vars(&vars, KafkaSettings::read).map_err(|e| e.to_string())
}

/// `ORDERD_KAFKA_CONFIG`: `name=value` producer properties.
///
/// Asserts: every accepted property has a well-formed name that orderd neither sets
/// itself nor refuses, a value without a comma or surrounding blanks that does not
/// turn TLS verification off, and no name twice; the accepted list written out again
/// reads the same; the values (which may hold passwords) decide nothing but the TLS
/// switches, so replacing them changes no outcome, and no refusal shows one.
pub fn kafka_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Some(read) = read_unless_published(&KAFKA_CONFIG, &text, kafka_settings) else {
        return;
    };
    if let Ok(settings) = &read {
        let mut names = HashSet::new();
        for (name, value) in &settings.properties {
            let value = value.expose();
            assert!(
                !name.is_empty()
                    && name.bytes().all(|b| b.is_ascii_lowercase()
                        || b.is_ascii_digit()
                        || b == b'.'
                        || b == b'_'),
                "an accepted property name is malformed: {name:?}"
            );
            assert!(
                kafka_property_refusal(name).is_none(),
                "{name} was accepted"
            );
            assert!(
                kafka_value_refusal(name, value).is_none(),
                "{name}={value} was accepted"
            );
            assert!(!value.contains(',') && value.trim() == value);
            assert!(names.insert(name.clone()), "{name} was accepted twice");
        }
        let written: Vec<String> = settings
            .properties
            .iter()
            .map(|(name, value)| format!("{name}={}", value.expose()))
            .collect();
        let again = kafka_settings(&written.join(",")).expect("accepted properties read again");
        assert_eq!(exposed(&again.properties), exposed(&settings.properties));
    }
    let masked = values_replaced(&text, '=', |name, value| {
        kafka_value_refusal(name, value).is_some()
    });
    match (&read, kafka_settings(&masked)) {
        (Ok(_), Ok(_)) => {}
        (Err(_), Err(message)) => assert!(
            !message.contains(CANARY),
            "a refusal of ORDERD_KAFKA_CONFIG shows a value: {message}"
        ),
        (first, masked_read) => panic!(
            "a property's value decided the outcome: {:?} then {:?}",
            first.as_ref().err(),
            masked_read.err()
        ),
    }
}

fn exposed(properties: &[(String, Secret)]) -> Vec<(String, String)> {
    properties
        .iter()
        .map(|(name, value)| (name.clone(), value.expose().to_string()))
        .collect()
}

/// `ORDERD_RESPONSE_KEYS`, read as the idempotency settings read it.
fn response_key_settings(keys: &str) -> Result<IdempotencyConfig, String> {
    with_vars(&[(&RESPONSE_KEYS, keys)], IdempotencyConfig::read).map_err(|e| e.to_string())
}

/// `ORDERD_RESPONSE_KEYS`: `id:base64` keys that seal stored responses.
///
/// Asserts: accepted ids are distinct, 1 to 64 of `[A-Za-z0-9._-]`; the accepted keys
/// written out again (padded or not) read as the same ids and bytes; and no refusal
/// shows a key, neither one of the input's (where the input holds the base64 of 32
/// bytes) nor text put in place of them.
pub fn response_keys(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Some(read) = read_unless_published(&RESPONSE_KEYS, &text, response_key_settings) else {
        return;
    };
    match &read {
        Ok(config) => {
            let keys = &config.response_keys;
            let mut ids = HashSet::new();
            for key in keys {
                assert!(
                    (1..=RESPONSE_KEY_ID_MAX).contains(&key.id.len())
                        && key
                            .id
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
                    "an accepted key id is malformed: {:?}",
                    key.id
                );
                assert!(
                    ids.insert(key.id.clone()),
                    "the id {} was accepted twice",
                    key.id
                );
            }
            for engine in [&STANDARD, &STANDARD_NO_PAD] {
                let written: Vec<String> = keys
                    .iter()
                    .map(|key| format!("{}:{}", key.id, engine.encode(key.material())))
                    .collect();
                let again = response_key_settings(&written.join(","))
                    .expect("accepted keys read again")
                    .response_keys;
                assert_eq!(
                    again
                        .iter()
                        .map(|k| (&k.id, k.material()))
                        .collect::<Vec<_>>(),
                    keys.iter()
                        .map(|k| (&k.id, k.material()))
                        .collect::<Vec<_>>()
                );
            }
        }
        Err(message) => {
            let items: Vec<(&str, &str)> = text
                .split(',')
                .filter_map(|item| item.split_once(':'))
                .map(|(id, key)| (id.trim(), key.trim()))
                .collect();
            for (_, key) in &items {
                let is_a_key = base64_any_padding()
                    .decode(key)
                    .is_ok_and(|bytes| bytes.len() == 32);
                let named_otherwise = items.iter().any(|(id, _)| id.contains(key));
                assert!(
                    !is_a_key || named_otherwise || !message.contains(key),
                    "a refusal of ORDERD_RESPONSE_KEYS shows a key: {message}"
                );
            }
        }
    }
    let masked = values_replaced(&text, ':', |_, _| false);
    if let Err(message) = response_key_settings(&masked) {
        assert!(
            !message.contains(CANARY),
            "a refusal of ORDERD_RESPONSE_KEYS shows what stands for a key: {message}"
        );
    }
}

/// `ORDERD_CITUS_NODE_URLS`, read as a distributed database's pools read it.
fn node_urls(urls: &str) -> Result<Vec<String>, String> {
    let vars = [
        (
            &db::DATABASE_URL,
            "postgres://fuzzing@fuzzing.invalid:5432/fuzzing",
        ),
        (&db::CITUS_NODE_URLS, urls),
    ];
    let config = with_vars(&vars, DbConfig::read).map_err(|e| e.to_string())?;
    let nodes = db::citus_node_urls(&config).map_err(|e| e.to_string())?;
    Ok(nodes.into_keys().collect())
}

/// `ORDERD_CITUS_NODE_URLS`: `host:port=postgres://…` pairs.
///
/// Asserts: every node named is the trimmed name of one of the input's pairs, at most
/// one per pair; a refusal says which shape was expected or which node's URL is not a
/// PostgreSQL one, and never shows a URL (they carry passwords), neither one of the
/// input's nor text put in place of them.
pub fn citus_node_urls(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let trimmed = text.trim();
    let names: Vec<&str> = trimmed
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, _)| name.trim())
        .collect();
    let Some(read) = read_unless_published(&db::CITUS_NODE_URLS, &text, node_urls) else {
        return;
    };
    match read {
        Ok(nodes) => {
            assert!(nodes.len() <= names.len(), "more nodes than pairs");
            for node in &nodes {
                assert!(
                    names.contains(&node.as_str()),
                    "a node no pair names: {node:?}"
                );
            }
        }
        Err(message) => {
            let shape =
                "ORDERD_CITUS_NODE_URLS: each entry is host:port=postgres://…, one of them is not";
            let bad_url = |name: &str| {
                format!("ORDERD_CITUS_NODE_URLS: the URL for {name} is not a PostgreSQL URL")
            };
            assert!(
                message == shape || names.iter().any(|name| message == bad_url(name)),
                "a refusal of ORDERD_CITUS_NODE_URLS says more than it should: {message}"
            );
        }
    }
    let masked = values_replaced(&text, '=', |_, _| false);
    if let Err(message) = node_urls(&masked) {
        assert!(
            !message.contains(CANARY),
            "a refusal of ORDERD_CITUS_NODE_URLS shows what stands for a URL: {message}"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::{
        fs,
        panic::{AssertUnwindSafe, catch_unwind},
        path::{Path, PathBuf},
    };

    use super::*;

    const FUZZ: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz");

    /// The files of `dir`, in name order; none when it does not exist.
    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .map(|entries| {
                entries
                    .map(|e| e.expect("a readable folder entry").path())
                    .filter(|p| p.is_file())
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files
    }

    /// Every committed input of every target, its corpus and its regressions, runs
    /// through the target without a failed assertion; a target without a corpus fails.
    #[test]
    fn every_committed_input_replays() {
        let mut failures = Vec::new();
        for &(name, target) in TARGETS {
            let corpus = files(&Path::new(FUZZ).join("corpus").join(name));
            assert!(
                !corpus.is_empty(),
                "fuzz/corpus/{name}/ is missing or empty: seed it (decision 180)"
            );
            let regressions = files(&Path::new(FUZZ).join("regressions").join(name));
            for file in corpus.iter().chain(&regressions) {
                let input = fs::read(file).expect("a readable input");
                if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
                    failures.push(file.display().to_string());
                }
            }
        }
        assert!(
            failures.is_empty(),
            "inputs that fail their target:\n{}",
            failures.join("\n")
        );
    }

    /// A target is what `fuzz/fuzz_targets/` runs and what the replay reads: the two
    /// lists are the same, so no target goes without its replay.
    #[test]
    fn every_fuzz_target_is_listed() {
        let mut on_disk: Vec<String> = files(&Path::new(FUZZ).join("fuzz_targets"))
            .iter()
            .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(on_disk, listed);
    }

    /// The MCP target reaches the tools and the application layer: a valid create is
    /// refused only where the service would begin its work (503, no room), a malformed
    /// one as a validation error of the tool's arguments.
    #[test]
    fn the_mcp_target_reaches_the_tools() {
        let mcp = mcp_endpoint(None);
        let refused_as = |arguments: Value| {
            let body = serde_json::json!({
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "create_order", "arguments": arguments},
            });
            let (accept, content_type) = MCP_HEADS[0];
            let body = serde_json::to_vec(&body).expect("a message serialises");
            let (_, answer) = block_on(mcp_answer(&mcp, &body, accept, content_type));
            tool_problems(&answer)
                .map(|problem| problem["type"].clone())
                .collect::<Vec<_>>()
        };
        let request_id = "0190a5c3-7b2e-7c4d-8e9f-a0b1c2d3e4f5";
        assert_eq!(
            refused_as(serde_json::json!({"requestId": request_id, "sku": "A", "quantity": 1})),
            ["/problems/service-unavailable"]
        );
        assert_eq!(
            refused_as(serde_json::json!({"requestId": request_id, "sku": 5, "quantity": 1})),
            ["/problems/validation-error"]
        );
    }

    /// The properties are not vacuous: inputs that must pass do, and a body that must
    /// be accepted is.
    #[test]
    fn known_good_inputs_are_accepted_where_they_must_be() {
        let body = br#"{"sku":"ABC-1","quantity":2,"customer_ref":"r-1"}"#;
        assert!(CreateOrderBody::parse(body).is_ok());
        create_body(body);
        let key = "3F2B8C1E-9A4D-4E5F-8A6B-7C8D9E0F1A2B";
        assert!(IdempotencyKey::parse(Some(key)).is_ok());
        idempotency_key(key.as_bytes());
        let head = br#"{"alg":"HS256","typ":"JWT"}"#;
        let claims = format!(
            r#"{{"tenant_id":"{}","sub":"app","scope":"orders:read","exp":4102444800}}"#,
            Uuid::nil()
        );
        let token = signed(head, claims.as_bytes(), SECRET);
        assert!(verify(&verifiers().plain, &token).is_some());
        assert!(
            verify(&verifiers().strict, &token).is_none(),
            "no iss or aud"
        );
        jwt(format!("Bearer {token}").as_bytes());
        let placeholder = "sasl.password=REPLACE-ME";
        assert!(read_unless_published(&KAFKA_CONFIG, placeholder, kafka_settings).is_none());
    }
}
