//! The request fingerprint: SHA-256 over a canonical JSON form of what changes the effect.
//!
//! Callers pass the *parsed* request (path parameters and body with defaults applied),
//! never the raw bytes, so whitespace, key order and escaping differences vanish before
//! hashing. Keys are sorted here explicitly rather than trusting `serde_json`'s map
//! type, because a dependency switching on `preserve_order` would silently change it.

use std::io;

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
        let mut digest = Hashing(Sha256::new());
        write_canonical(&value, &mut digest);
        Self(digest.0.finalize().into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The canonical form goes straight into the digest, piece by piece, rather than into
/// a string first: a replay fingerprints its request before anything else, and the
/// string and its copied keys were a tenth of the replay's own work in its profile.
struct Hashing(Sha256);

impl io::Write for Hashing {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes `value` with object keys in byte order and no insignificant whitespace.
fn write_canonical(value: &Value, out: &mut Hashing) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out_raw(out, b"{");
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out_raw(out, b",");
                }
                scalar(key, out);
                out_raw(out, b":");
                write_canonical(item, out);
            }
            out_raw(out, b"}");
        }
        Value::Array(items) => {
            out_raw(out, b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out_raw(out, b",");
                }
                write_canonical(item, out);
            }
            out_raw(out, b"]");
        }
        // Scalars have one serde_json spelling each (strings re-escaped uniformly).
        other => scalar(other, out),
    }
}

fn out_raw(out: &mut Hashing, bytes: &[u8]) {
    out.0.update(bytes);
}

/// A string or another scalar in serde_json's compact spelling.
fn scalar(value: &(impl Serialize + ?Sized), out: &mut Hashing) {
    serde_json::to_writer(out, value).expect("writing into a digest cannot fail");
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

    /// Stored records keep the fingerprint of their first request: the canonical form
    /// (and so these digests) must never change.
    #[test]
    fn the_digest_of_a_request_never_changes() {
        let hex = |f: Fingerprint| f.0.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex(of_json(
                r#"{"path":null,"body":{"sku":"ABC-1","quantity":2,"customer_ref":"é \"x\" \u0001"}}"#
            )),
            "ac1d8e2e7b31aa4b32e3cbd2d7ea44609d9641541aa87770f86e95c32e6fb7ac"
        );
        assert_eq!(
            hex(of_json(r#"{"z":[1,{"b":2.5,"a":-3}],"a":true,"m":null}"#)),
            "bf5a7887741a685b5392cae1f274e47fb3fce5dca7f28ffa714827c2d552c2c4"
        );
    }
}
