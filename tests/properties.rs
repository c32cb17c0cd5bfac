//! Properties of the pure parts of the edge, over generated input: key parsing, the
//! fingerprint's canonical form, cursor decoding and body parsing never panic, accept
//! what they should, and treat equal meanings alike.

use orderd::{
    api::body::CreateOrderBody,
    idempotency::{Fingerprint, IdempotencyKey, KeyError},
    service::{decode_cursor, encode_cursor},
};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Arbitrary JSON values, a few levels deep. Numbers are whole: no request field of
/// the API holds a fraction, and serde_json's default float parsing is not exact for
/// every decimal spelling.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `value` written out with object keys in reverse order and extra spacing: the same
/// meaning, other bytes.
fn respelled(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let entries: Vec<String> = map
                .iter()
                .rev()
                .map(|(k, v)| format!(" {} :  {} ", Value::from(k.as_str()), respelled(v)))
                .collect();
            format!("{{ {} }}", entries.join(" , "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(respelled).collect();
            format!("[ {} ]", items.join(" ,\n"))
        }
        Value::String(s) => {
            // Escape every non-ASCII character as \uXXXX.
            let mut out = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
                    c => {
                        let mut units = [0u16; 2];
                        for unit in c.encode_utf16(&mut units) {
                            out.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                }
            }
            out.push('"');
            out
        }
        scalar => scalar.to_string(),
    }
}

proptest! {
    #[test]
    fn key_parsing_never_panics_and_refuses_what_breaks_the_shape(raw in ".{0,200}") {
        match IdempotencyKey::parse(Some(&raw)) {
            Ok(key) => {
                let k = key.as_str();
                prop_assert!((16..=128).contains(&k.len()));
                prop_assert!(k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
            }
            Err(e) => prop_assert_eq!(e, KeyError::Invalid),
        }
    }

    #[test]
    fn a_valid_token_parses_bare_and_quoted_to_the_same_key(token in "[A-Za-z0-9_-]{16,128}") {
        let bare = IdempotencyKey::parse(Some(&token)).unwrap();
        let quoted = IdempotencyKey::parse(Some(&format!("\"{token}\""))).unwrap();
        prop_assert_eq!(bare, quoted);
    }

    #[test]
    fn the_same_meaning_spelled_differently_has_the_same_fingerprint(value in json_value()) {
        let again: Value = serde_json::from_str(&respelled(&value)).unwrap();
        prop_assert_eq!(Fingerprint::of(&value), Fingerprint::of(&again));
    }

    #[test]
    fn a_changed_value_changes_the_fingerprint(value in json_value(), other in json_value()) {
        prop_assume!(value != other);
        prop_assert_ne!(
            Fingerprint::of(&json!({"body": value})),
            Fingerprint::of(&json!({"body": other}))
        );
    }

    #[test]
    fn cursor_decoding_never_panics(raw in ".{0,120}") {
        let _ = decode_cursor(&raw);
    }

    #[test]
    fn every_cursor_the_api_hands_out_decodes_to_its_position(
        micros in -62_135_596_800_000_000i64..253_402_300_799_000_000i64,
        id in any::<u128>(),
    ) {
        let at = chrono::DateTime::from_timestamp_micros(micros).unwrap();
        let id = uuid::Uuid::from_u128(id);
        let position = decode_cursor(&encode_cursor(at, id)).unwrap();
        prop_assert_eq!((position.created_at, position.id), (at, id));
    }

    #[test]
    fn body_parsing_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = CreateOrderBody::parse(&bytes);
    }

    #[test]
    fn body_parsing_never_panics_on_json_and_names_every_problem(value in json_value()) {
        let bytes = serde_json::to_vec(&value).unwrap();
        if let Err(problem) = CreateOrderBody::parse(&bytes) {
            prop_assert!(problem.errors.is_some_and(|e| !e.is_empty()));
        }
    }

    #[test]
    fn valid_bodies_are_accepted_as_sent(
        sku in "[A-Za-z0-9._-]{1,64}",
        quantity in 1i64..=10_000,
        customer_ref in proptest::option::of("[a-zA-Z0-9 éü€😀]{0,128}"),
    ) {
        let mut body = Map::new();
        body.insert("sku".into(), sku.clone().into());
        body.insert("quantity".into(), quantity.into());
        if let Some(r) = &customer_ref {
            body.insert("customer_ref".into(), r.clone().into());
        }
        let parsed = CreateOrderBody::parse(&serde_json::to_vec(&body).unwrap()).unwrap();
        prop_assert_eq!(parsed.sku(), sku.as_str());
        prop_assert_eq!(i64::from(parsed.quantity()), quantity);
        prop_assert_eq!(parsed.customer_ref(), customer_ref.as_deref());
    }
}
