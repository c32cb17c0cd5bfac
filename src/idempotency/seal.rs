//! Stored responses sealed at rest: AES-256-GCM (aws-lc-rs, the crypto library the TLS
//! stack and the JWT verifier already bring) under the first of
//! `ORDERD_RESPONSE_KEYS`, opened under any of them.
//!
//! A sealed body is the random 96-bit nonce followed by the ciphertext and its tag;
//! the key's id is stored beside it (`idempotency_record.response_key_id`). The
//! record's `(tenant, endpoint, key)` is the associated data, so a sealed body copied
//! into another record does not open: it answers an error, never the other record's
//! response. Without keys, bodies are stored as they are, and a sealed body found then
//! is an error as well.

use aws_lc_rs::aead::{AES_256_GCM, Aad, NONCE_LEN, Nonce, RandomizedNonceKey};
use uuid::Uuid;

use crate::config::ResponseKey;

/// The record a body belongs to, which it is sealed to: `(tenant, endpoint, key)`.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    pub tenant: Uuid,
    pub endpoint: &'a str,
    pub key: &'a str,
}

/// Seals and opens stored responses with the configured keys.
pub struct Sealer {
    /// In configuration order: the first seals, every one opens.
    keys: Vec<(String, RandomizedNonceKey)>,
}

/// A body as it is stored: sealed under `key_id`, or as it is when that is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub bytes: Vec<u8>,
    pub key_id: Option<String>,
}

/// Why a stored body cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Sealed under a key this process does not have.
    #[error("the stored response is sealed under key `{0}`, which is not configured")]
    UnknownKey(String),
    /// The key is there, but the body does not open under this record's scope: it was
    /// altered, or copied from another record.
    #[error("the stored response does not open under key `{0}` for this record")]
    Tampered(String),
    /// The cipher refused to seal (nothing a well-formed body can cause).
    #[error("the response could not be sealed")]
    Seal,
}

impl Sealer {
    /// No keys: bodies are stored as they are.
    pub const PLAIN: Sealer = Sealer { keys: Vec::new() };

    /// The configured keys; they were checked (32 bytes, distinct ids) when the
    /// configuration was read.
    pub fn new(keys: &[ResponseKey]) -> Self {
        Self {
            keys: keys
                .iter()
                .map(|k| {
                    let key = RandomizedNonceKey::new(&AES_256_GCM, k.material())
                        .expect("an AES-256 key is 32 bytes, checked with the configuration");
                    (k.id.clone(), key)
                })
                .collect(),
        }
    }

    /// The id of the key new records are sealed under, if any.
    pub fn sealing_key(&self) -> Option<&str> {
        self.keys.first().map(|(id, _)| id.as_str())
    }

    /// `body` as the record `to` stores it.
    pub fn seal(&self, to: Binding<'_>, body: &[u8]) -> Result<Sealed, SealError> {
        let Some((id, key)) = self.keys.first() else {
            return Ok(Sealed {
                bytes: body.to_vec(),
                key_id: None,
            });
        };
        let mut in_out = body.to_vec();
        let nonce = key
            .seal_in_place_append_tag(Aad::from(associated_data(to)), &mut in_out)
            .map_err(|_| SealError::Seal)?;
        let mut bytes = Vec::with_capacity(NONCE_LEN + in_out.len());
        bytes.extend_from_slice(nonce.as_ref());
        bytes.extend_from_slice(&in_out);
        Ok(Sealed {
            bytes,
            key_id: Some(id.clone()),
        })
    }

    /// The body the record `of` stored as `stored` under `key_id`.
    pub fn open(
        &self,
        of: Binding<'_>,
        stored: Vec<u8>,
        key_id: Option<&str>,
    ) -> Result<Vec<u8>, SealError> {
        let Some(id) = key_id else {
            return Ok(stored);
        };
        let Some((_, key)) = self.keys.iter().find(|(k, _)| k == id) else {
            return Err(SealError::UnknownKey(id.to_string()));
        };
        let tampered = || SealError::Tampered(id.to_string());
        if stored.len() < NONCE_LEN {
            return Err(tampered());
        }
        let (nonce, sealed) = stored.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| tampered())?;
        let mut in_out = sealed.to_vec();
        let opened = key
            .open_in_place(nonce, Aad::from(associated_data(of)), &mut in_out)
            .map_err(|_| tampered())?
            .len();
        in_out.truncate(opened);
        Ok(in_out)
    }
}

/// What binds a sealed body to its record: the tenant, the endpoint and the key, each
/// length-prefixed so that no two scopes share a byte string.
fn associated_data(record: Binding<'_>) -> Vec<u8> {
    let endpoint = record.endpoint.as_bytes();
    let key = record.key.as_bytes();
    let mut aad = Vec::with_capacity(32 + 16 + 4 + endpoint.len() + key.len());
    aad.extend_from_slice(b"orderd idempotency_record v1\0");
    aad.extend_from_slice(record.tenant.as_bytes());
    aad.extend_from_slice(&(endpoint.len() as u16).to_be_bytes());
    aad.extend_from_slice(endpoint);
    aad.extend_from_slice(&(key.len() as u16).to_be_bytes());
    aad.extend_from_slice(key);
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ids: &[(&str, u8)]) -> Sealer {
        let config: Vec<ResponseKey> = ids
            .iter()
            .map(|(id, byte)| ResponseKey::new(id, [*byte; 32]))
            .collect();
        Sealer::new(&config)
    }

    fn record(key: &str) -> Binding<'_> {
        Binding {
            tenant: Uuid::from_u128(7),
            endpoint: "POST /v1/orders",
            key,
        }
    }

    #[test]
    fn a_sealed_body_opens_under_its_own_record_only() {
        let sealer = keys(&[("k1", 1)]);
        let body = br#"{"customer_ref":"alice@example.com"}"#;
        let sealed = sealer.seal(record("key-aaaaaaaaaaaaaaaa"), body).unwrap();
        assert_eq!(sealed.key_id.as_deref(), Some("k1"));
        assert!(!sealed.bytes.windows(5).any(|w| w == b"alice"));
        let opened = sealer.open(
            record("key-aaaaaaaaaaaaaaaa"),
            sealed.bytes.clone(),
            Some("k1"),
        );
        assert_eq!(opened.unwrap(), body);
        // The same bytes in another record, or altered, do not open.
        let moved = sealer.open(
            record("key-bbbbbbbbbbbbbbbb"),
            sealed.bytes.clone(),
            Some("k1"),
        );
        assert_eq!(moved, Err(SealError::Tampered("k1".into())));
        let mut flipped = sealed.bytes.clone();
        flipped[20] ^= 1;
        let altered = sealer.open(record("key-aaaaaaaaaaaaaaaa"), flipped, Some("k1"));
        assert_eq!(altered, Err(SealError::Tampered("k1".into())));
    }

    #[test]
    fn every_seal_draws_a_fresh_nonce() {
        let sealer = keys(&[("k1", 1)]);
        let a = sealer
            .seal(record("key-aaaaaaaaaaaaaaaa"), b"same")
            .unwrap();
        let b = sealer
            .seal(record("key-aaaaaaaaaaaaaaaa"), b"same")
            .unwrap();
        assert_ne!(a.bytes[..NONCE_LEN], b.bytes[..NONCE_LEN]);
        assert_ne!(a.bytes, b.bytes);
    }

    #[test]
    fn the_first_key_seals_every_key_opens_and_an_absent_key_is_named() {
        let old = keys(&[("k1", 1)]);
        let rotated = keys(&[("k2", 2), ("k1", 1)]);
        let under_k1 = old.seal(record("key-aaaaaaaaaaaaaaaa"), b"body").unwrap();
        assert_eq!(rotated.sealing_key(), Some("k2"));
        let opened = rotated.open(
            record("key-aaaaaaaaaaaaaaaa"),
            under_k1.bytes.clone(),
            Some("k1"),
        );
        assert_eq!(opened.unwrap(), b"body");
        let without = keys(&[("k2", 2)]);
        let lost = without.open(record("key-aaaaaaaaaaaaaaaa"), under_k1.bytes, Some("k1"));
        assert_eq!(lost, Err(SealError::UnknownKey("k1".into())));
    }

    #[test]
    fn without_keys_bodies_stay_as_they_are_and_a_sealed_one_does_not_open() {
        let plain = Sealer::PLAIN;
        let stored = plain.seal(record("key-aaaaaaaaaaaaaaaa"), b"body").unwrap();
        assert_eq!(
            stored,
            Sealed {
                bytes: b"body".to_vec(),
                key_id: None
            }
        );
        let opened = plain.open(record("key-aaaaaaaaaaaaaaaa"), b"body".to_vec(), None);
        assert_eq!(opened.unwrap(), b"body");
        let sealed = plain.open(record("key-aaaaaaaaaaaaaaaa"), vec![0; 40], Some("k1"));
        assert_eq!(sealed, Err(SealError::UnknownKey("k1".into())));
    }
}
