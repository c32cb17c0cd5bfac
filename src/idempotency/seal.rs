//! Stored responses sealed at rest: AES-256-GCM (aws-lc-rs, the crypto library the TLS
//! stack and the JWT verifier already bring) under the first of
//! `ORDERD_RESPONSE_KEYS`, opened under any of them.
//!
//! A sealed body is the random 96-bit nonce followed by the ciphertext and its tag;
//! the key's id is stored beside it (`idempotency_record.response_key_id`), and so is
//! the layout of the associated data it was sealed with (`response_seal_version`).
//! The associated data binds the body to the whole stored answer: the record's
//! `(tenant, endpoint, key)` and everything a replay sends or reconciliation reads
//! beside the body (status, `Location`, content type, resource id). So a sealed body
//! copied into another record, or a record whose status or location was changed in the
//! table, does not open: it answers an error, never a changed answer.
//!
//! Versions: 1 bound the scope alone (the first sealing release); 2 bound the whole
//! answer but not its expiry; 3 also binds the instant the key expires, which every
//! replay announces (`Idempotency-Key-Expires`), and is what this release seals with.
//! All three open, so records sealed before stay readable, unless the operator refuses
//! the older layouts ([`OldLayouts::Refuse`], once `orderd keys rewrap` has moved every
//! record to the current one): a record in a layout that binds less could have had
//! what it does not bind changed in the table. A version this release does not know (a
//! newer release's, during a rolling deploy) is an error, never a guess.
//!
//! A body stored in clear (no key id) is served as it is unless the operator refuses
//! clear records ([`ClearRecords::Refuse`], once a rewrap has sealed them all): then a
//! clear body, which anybody who can write the table could have put there, is an
//! error too.

use aws_lc_rs::aead::{AES_256_GCM, Aad, NONCE_LEN, Nonce, RandomizedNonceKey};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::config::ConfigError;
use std::fmt;

/// The layout of associated data new records are sealed with.
pub const SEAL_VERSION: i16 = 3;

/// What a body is sealed to: its record, and the rest of the answer stored with it.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    pub tenant: Uuid,
    pub endpoint: &'a str,
    pub key: &'a str,
    pub status: u16,
    pub location: Option<&'a str>,
    pub content_type: Option<&'a str>,
    pub resource: Option<Uuid>,
    /// When the key is forgotten, as stored and announced with every replay.
    pub expires_at: Option<DateTime<Utc>>,
}

/// One key of `ORDERD_RESPONSE_KEYS`: its id, stored beside what it sealed, and its 32
/// bytes, which no `Debug` output shows.
#[derive(Clone)]
pub struct ResponseKey {
    pub id: String,
    material: [u8; 32],
}

impl ResponseKey {
    /// A key from its parts (tests and tools; the configuration parses its own).
    pub fn new(id: &str, material: [u8; 32]) -> Self {
        Self {
            id: id.to_string(),
            material,
        }
    }

    /// The key's bytes: the only way to read them, easy to grep for.
    pub fn material(&self) -> &[u8; 32] {
        &self.material
    }
}

impl fmt::Debug for ResponseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResponseKey({}: ***)", self.id)
    }
}

/// The longest key id: it is stored with every sealed record.
pub const RESPONSE_KEY_ID_MAX: usize = 64;

/// The keys setting (`name`): `id:base64` items separated by commas. Standard base64 of
/// exactly 32 bytes, with or without padding; distinct ids. No message shows a key.
pub fn parse_response_keys(name: &str, text: &str) -> Result<Vec<ResponseKey>, ConfigError> {
    use base64::{
        Engine,
        alphabet::STANDARD,
        engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
    };
    let lenient = GeneralPurpose::new(
        &STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let mut keys: Vec<ResponseKey> = Vec::new();
    for (i, item) in text.split(',').map(str::trim).enumerate() {
        if item.is_empty() {
            continue;
        }
        let n = i + 1;
        let Some((id, encoded)) = item.split_once(':') else {
            return Err(ConfigError::new(format!(
                "{name}: item {n} is not `id:base64-of-32-bytes`"
            )));
        };
        let id = id.trim();
        let id_ok = (1..=RESPONSE_KEY_ID_MAX).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !id_ok {
            return Err(ConfigError::new(format!(
                "{name}: item {n} needs an id of 1 to {RESPONSE_KEY_ID_MAX} of A-Z, a-z, 0-9, '.', '_' and '-' before its `:`"
            )));
        }
        let material: [u8; 32] = lenient
            .decode(encoded.trim())
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "{name}: key `{id}` is not the base64 of exactly 32 bytes"
                ))
            })?;
        if keys.iter().any(|k| k.id == id) {
            return Err(ConfigError::new(format!(
                "{name}: the id `{id}` is given twice"
            )));
        }
        keys.push(ResponseKey {
            id: id.to_string(),
            material,
        });
    }
    Ok(keys)
}

/// What to do with a body stored in clear while keys are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearRecords {
    /// Serve it (the default: turning keys on needs no downtime, and records stored
    /// before stay readable until a rewrap seals them).
    Serve,
    /// Refuse it: once every record is sealed, a clear body can only have been put
    /// there by whoever wrote the table.
    Refuse,
}

/// What a replay does with a body sealed in a layout older than [`SEAL_VERSION`],
/// which binds less of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldLayouts {
    /// Open it (records sealed before the current layout).
    Serve,
    /// Refuse it: every record was rewrapped into the current layout.
    Refuse,
}

/// Seals and opens stored responses with the configured keys.
pub struct Sealer {
    /// In configuration order: the first seals, every one opens.
    keys: Vec<(String, RandomizedNonceKey)>,
    clear: ClearRecords,
    old_layouts: OldLayouts,
}

/// A body as it is stored: sealed under `key_id` with the associated data of
/// `version`, or as it is when those are `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub bytes: Vec<u8>,
    pub key_id: Option<String>,
    pub version: Option<i16>,
}

/// Why a stored body cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Sealed under a key this process does not have.
    #[error("the stored response is sealed under key `{0}`, which is not configured")]
    UnknownKey(String),
    /// The key is there, but the body does not open for this record's answer: it was
    /// altered, copied from another record, or a part of its answer was changed.
    #[error("the stored response does not open under key `{0}` for this record")]
    Tampered(String),
    /// Sealed with a layout of associated data this release does not know (a newer
    /// release's).
    #[error("the stored response is sealed with layout {0}, which this release does not know")]
    Version(i16),
    /// Stored in clear while clear records are refused.
    #[error("the stored response is in clear, and clear records are refused")]
    Clear,
    /// Sealed with an older layout while older layouts are refused.
    #[error(
        "the stored response is sealed with layout {0}, and layouts before {SEAL_VERSION} are refused"
    )]
    OldLayout(i16),
    /// The cipher refused to seal (nothing a well-formed body can cause).
    #[error("the response could not be sealed")]
    Seal,
}

impl Sealer {
    /// No keys: bodies are stored as they are.
    pub const PLAIN: Sealer = Sealer {
        keys: Vec::new(),
        clear: ClearRecords::Serve,
        old_layouts: OldLayouts::Serve,
    };

    /// The configured keys; they were checked (32 bytes, distinct ids) when the
    /// configuration was read. Without keys, clear bodies are always served.
    pub fn new(keys: &[ResponseKey], clear: ClearRecords) -> Self {
        Self {
            keys: keys
                .iter()
                .map(|k| {
                    let key = RandomizedNonceKey::new(&AES_256_GCM, k.material())
                        .expect("an AES-256 key is 32 bytes, checked with the configuration");
                    (k.id.clone(), key)
                })
                .collect(),
            clear,
            old_layouts: OldLayouts::Serve,
        }
    }

    /// The same keys, with bodies sealed in older layouts served or refused.
    pub fn with_old_layouts(mut self, old_layouts: OldLayouts) -> Self {
        self.old_layouts = old_layouts;
        self
    }

    /// The id of the key new records are sealed under, if any.
    pub fn sealing_key(&self) -> Option<&str> {
        self.keys.first().map(|(id, _)| id.as_str())
    }

    /// `body` as the record `to` stores it.
    pub fn seal(&self, to: Binding<'_>, body: &[u8]) -> Result<Sealed, SealError> {
        self.seal_in_layout(to, body, SEAL_VERSION)
    }

    /// `body` sealed with the associated data of layout `version`: what an earlier
    /// release stored (tests of what a rewrap and a refusal of older layouts do).
    pub fn seal_in_layout(
        &self,
        to: Binding<'_>,
        body: &[u8],
        version: i16,
    ) -> Result<Sealed, SealError> {
        let Some((id, key)) = self.keys.first() else {
            return Ok(Sealed {
                bytes: body.to_vec(),
                key_id: None,
                version: None,
            });
        };
        let mut in_out = body.to_vec();
        let aad = associated_data(to, version)?;
        let nonce = key
            .seal_in_place_append_tag(Aad::from(aad), &mut in_out)
            .map_err(|_| SealError::Seal)?;
        let mut bytes = Vec::with_capacity(NONCE_LEN + in_out.len());
        bytes.extend_from_slice(nonce.as_ref());
        bytes.extend_from_slice(&in_out);
        Ok(Sealed {
            bytes,
            key_id: Some(id.clone()),
            version: Some(version),
        })
    }

    /// The body the record `of` stored as `stored`, sealed under `key_id` with the
    /// layout `version` (`None`: the first one).
    pub fn open(
        &self,
        of: Binding<'_>,
        stored: Vec<u8>,
        key_id: Option<&str>,
        version: Option<i16>,
    ) -> Result<Vec<u8>, SealError> {
        let Some(id) = key_id else {
            if self.clear == ClearRecords::Refuse && !self.keys.is_empty() {
                return Err(SealError::Clear);
            }
            return Ok(stored);
        };
        let Some((_, key)) = self.keys.iter().find(|(k, _)| k == id) else {
            return Err(SealError::UnknownKey(id.to_string()));
        };
        let version = version.unwrap_or(1);
        if version < SEAL_VERSION && self.old_layouts == OldLayouts::Refuse {
            return Err(SealError::OldLayout(version));
        }
        let aad = associated_data(of, version)?;
        let tampered = || SealError::Tampered(id.to_string());
        if stored.len() < NONCE_LEN {
            return Err(tampered());
        }
        let (nonce, sealed) = stored.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| tampered())?;
        let mut in_out = sealed.to_vec();
        let opened = key
            .open_in_place(nonce, Aad::from(aad), &mut in_out)
            .map_err(|_| tampered())?
            .len();
        in_out.truncate(opened);
        Ok(in_out)
    }
}

/// What binds a sealed body, in the layout `version`. Every variable part is
/// length-prefixed (or marked present or absent) so that no two answers share a byte
/// string. Version 1: the tenant, the endpoint and the key. Version 2: those, then the
/// status, the location, the content type and the resource id. Version 3: those, then
/// the expiry in microseconds since the epoch (the database's precision).
fn associated_data(record: Binding<'_>, version: i16) -> Result<Vec<u8>, SealError> {
    let text = |aad: &mut Vec<u8>, part: &str| {
        aad.extend_from_slice(&(part.len() as u32).to_be_bytes());
        aad.extend_from_slice(part.as_bytes());
    };
    let mut aad = Vec::with_capacity(160);
    match version {
        1 => aad.extend_from_slice(b"orderd idempotency_record v1\0"),
        2 => aad.extend_from_slice(b"orderd idempotency_record v2\0"),
        3 => aad.extend_from_slice(b"orderd idempotency_record v3\0"),
        other => return Err(SealError::Version(other)),
    }
    aad.extend_from_slice(record.tenant.as_bytes());
    if version == 1 {
        // As the first release wrote it: two-byte lengths.
        for part in [record.endpoint, record.key] {
            aad.extend_from_slice(&(part.len() as u16).to_be_bytes());
            aad.extend_from_slice(part.as_bytes());
        }
        return Ok(aad);
    }
    text(&mut aad, record.endpoint);
    text(&mut aad, record.key);
    aad.extend_from_slice(&record.status.to_be_bytes());
    for part in [record.location, record.content_type] {
        match part {
            Some(part) => {
                aad.push(1);
                text(&mut aad, part);
            }
            None => aad.push(0),
        }
    }
    match record.resource {
        Some(id) => {
            aad.push(1);
            aad.extend_from_slice(id.as_bytes());
        }
        None => aad.push(0),
    }
    if version >= 3 {
        match record.expires_at {
            Some(at) => {
                aad.push(1);
                aad.extend_from_slice(&at.timestamp_micros().to_be_bytes());
            }
            None => aad.push(0),
        }
    }
    Ok(aad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ids: &[(&str, u8)]) -> Sealer {
        let config: Vec<ResponseKey> = ids
            .iter()
            .map(|(id, byte)| ResponseKey::new(id, [*byte; 32]))
            .collect();
        Sealer::new(&config, ClearRecords::Serve)
    }

    fn record(key: &str) -> Binding<'_> {
        Binding {
            tenant: Uuid::from_u128(7),
            endpoint: "POST /v1/orders",
            key,
            status: 201,
            location: Some("/v1/orders/0192f0e4-7c1a-7cc0-8f5e-1d2b3c4d5e6f"),
            content_type: Some("application/json"),
            resource: Some(Uuid::from_u128(9)),
            expires_at: DateTime::from_timestamp(1_800_000_000, 123_456_000),
        }
    }

    #[test]
    fn a_sealed_body_opens_under_its_own_record_only() {
        let sealer = keys(&[("k1", 1)]);
        let body = br#"{"customer_ref":"alice@example.com"}"#;
        let sealed = sealer.seal(record("key-aaaaaaaaaaaaaaaa"), body).unwrap();
        assert_eq!(sealed.key_id.as_deref(), Some("k1"));
        assert_eq!(sealed.version, Some(SEAL_VERSION));
        assert!(!sealed.bytes.windows(5).any(|w| w == b"alice"));
        let open = |binding, bytes: &Vec<u8>| {
            sealer.open(binding, bytes.clone(), Some("k1"), Some(SEAL_VERSION))
        };
        assert_eq!(
            open(record("key-aaaaaaaaaaaaaaaa"), &sealed.bytes).unwrap(),
            body
        );
        // The same bytes in another record, or altered, do not open.
        let moved = open(record("key-bbbbbbbbbbbbbbbb"), &sealed.bytes);
        assert_eq!(moved, Err(SealError::Tampered("k1".into())));
        let mut flipped = sealed.bytes.clone();
        flipped[20] ^= 1;
        let altered = open(record("key-aaaaaaaaaaaaaaaa"), &flipped);
        assert_eq!(altered, Err(SealError::Tampered("k1".into())));
    }

    #[test]
    fn a_changed_status_location_content_type_resource_or_expiry_does_not_open() {
        let sealer = keys(&[("k1", 1)]);
        let sealed = sealer.seal(record("key-aaaaaaaaaaaaaaaa"), b"{}").unwrap();
        let base = record("key-aaaaaaaaaaaaaaaa");
        let changed = [
            Binding {
                status: 200,
                ..base
            },
            Binding {
                location: Some("/v1/orders/00000000-0000-0000-0000-000000000001"),
                ..base
            },
            Binding {
                location: None,
                ..base
            },
            Binding {
                content_type: Some("text/html"),
                ..base
            },
            Binding {
                resource: Some(Uuid::from_u128(10)),
                ..base
            },
            Binding {
                resource: None,
                ..base
            },
            Binding {
                expires_at: DateTime::from_timestamp(1_800_000_000 + 30 * 86_400, 123_456_000),
                ..base
            },
            Binding {
                expires_at: DateTime::from_timestamp(1_800_000_000, 123_457_000),
                ..base
            },
            Binding {
                expires_at: None,
                ..base
            },
        ];
        for binding in changed {
            let opened = sealer.open(
                binding,
                sealed.bytes.clone(),
                Some("k1"),
                Some(SEAL_VERSION),
            );
            assert_eq!(opened, Err(SealError::Tampered("k1".into())), "{binding:?}");
        }
        // Read as if sealed with the first layout, it does not open either.
        let as_v1 = sealer.open(base, sealed.bytes.clone(), Some("k1"), None);
        assert_eq!(as_v1, Err(SealError::Tampered("k1".into())));
    }

    #[test]
    fn records_sealed_with_the_first_layout_still_open_and_an_unknown_layout_is_named() {
        let sealer = keys(&[("k1", 1)]);
        let (_, key) = &sealer.keys[0];
        let base = record("key-aaaaaaaaaaaaaaaa");
        let mut in_out = b"old".to_vec();
        let nonce = key
            .seal_in_place_append_tag(Aad::from(associated_data(base, 1).unwrap()), &mut in_out)
            .unwrap();
        let stored = [nonce.as_ref(), in_out.as_slice()].concat();
        // Version 1 binds the scope alone: any status reads it (a rewrap then binds all).
        let other = Binding {
            status: 404,
            ..base
        };
        assert_eq!(
            sealer
                .open(other, stored.clone(), Some("k1"), None)
                .unwrap(),
            b"old"
        );
        assert_eq!(
            sealer
                .open(base, stored.clone(), Some("k1"), Some(1))
                .unwrap(),
            b"old"
        );
        assert_eq!(
            sealer.open(base, stored.clone(), Some("k1"), Some(4)),
            Err(SealError::Version(4))
        );
        // Once the operator refuses the layouts before the current one, it is an error.
        let strict = keys(&[("k1", 1)]).with_old_layouts(OldLayouts::Refuse);
        assert_eq!(
            strict.open(base, stored, Some("k1"), None),
            Err(SealError::OldLayout(1))
        );
        let current = strict.seal(base, b"new").unwrap();
        assert_eq!(
            strict
                .open(base, current.bytes, Some("k1"), current.version)
                .unwrap(),
            b"new"
        );
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
            under_k1.version,
        );
        assert_eq!(opened.unwrap(), b"body");
        let without = keys(&[("k2", 2)]);
        let lost = without.open(
            record("key-aaaaaaaaaaaaaaaa"),
            under_k1.bytes,
            Some("k1"),
            under_k1.version,
        );
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
                key_id: None,
                version: None,
            }
        );
        let opened = plain.open(record("key-aaaaaaaaaaaaaaaa"), b"body".to_vec(), None, None);
        assert_eq!(opened.unwrap(), b"body");
        let sealed = plain.open(
            record("key-aaaaaaaaaaaaaaaa"),
            vec![0; 40],
            Some("k1"),
            Some(2),
        );
        assert_eq!(sealed, Err(SealError::UnknownKey("k1".into())));
    }

    #[test]
    fn clear_bodies_are_served_unless_refused() {
        let config = [ResponseKey::new("k1", [1; 32])];
        let serving = Sealer::new(&config, ClearRecords::Serve);
        let refusing = Sealer::new(&config, ClearRecords::Refuse);
        let binding = record("key-aaaaaaaaaaaaaaaa");
        assert_eq!(
            serving
                .open(binding, b"clear".to_vec(), None, None)
                .unwrap(),
            b"clear"
        );
        assert_eq!(
            refusing.open(binding, b"clear".to_vec(), None, None),
            Err(SealError::Clear)
        );
        // Without keys there is nothing to refuse with: clear is how records are kept.
        let keyless = Sealer::new(&[], ClearRecords::Refuse);
        assert_eq!(
            keyless
                .open(binding, b"clear".to_vec(), None, None)
                .unwrap(),
            b"clear"
        );
    }
}
