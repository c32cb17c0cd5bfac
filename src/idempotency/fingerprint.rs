//! The request fingerprint: SHA-256 over a canonical JSON form of what changes the effect.
//!
//! Callers pass the *parsed* request (path parameters and body with defaults applied),
//! never the raw bytes, so whitespace, key order and escaping differences vanish before
//! hashing. Keys are sorted here explicitly rather than trusting `serde_json`'s map
//! type, because a dependency switching on `preserve_order` would silently change it.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A SHA-256 digest identifying one request's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Fingerprints any serialisable request description.
    pub fn of(request: &impl Serialize) -> Self {
        let value = serde_json::to_value(request).expect("request descriptions serialise to JSON");
        let mut canonical = String::new();
        write_canonical(&value, &mut canonical);
        Self(Sha256::digest(canonical.as_bytes()).into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Writes `value` with object keys in byte order and no insignificant whitespace.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        // Scalars have one serde_json spelling each (strings re-escaped uniformly).
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of_json(text: &str) -> Fingerprint {
        Fingerprint::of(&serde_json::from_str::<Value>(text).unwrap())
    }

    #[test]
    fn whitespace_key_order_and_escapes_do_not_matter() {
        let a = of_json(r#"{"sku":"ABC-1","quantity":2,"nested":{"b":1,"a":2}}"#);
        let b = of_json(
            "{ \"nested\" : {\"a\":2, \"b\":1},\n \"quantity\": 2, \"sku\": \"\\u0041BC-1\" }",
        );
        assert_eq!(a, b);
    }

    #[test]
    fn a_changed_value_is_a_different_request() {
        assert_ne!(
            of_json(r#"{"sku":"ABC-1","quantity":2}"#),
            of_json(r#"{"sku":"ABC-1","quantity":3}"#)
        );
        assert_ne!(of_json(r#"{"a":[1,2]}"#), of_json(r#"{"a":[2,1]}"#));
        assert_ne!(of_json(r#"{"a":null}"#), of_json(r#"{"a":"null"}"#));
    }
}
