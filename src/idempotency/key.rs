//! Parsing of the `Idempotency-Key` header (docs/contract.md, "Idempotency").
//!
//! Accepts the bare token and the RFC 8941 quoted-string form used by
//! draft-ietf-httpapi-idempotency-key-header. A UUID is normalised to lower case so
//! that a client formatting the same UUID differently still names the same operation;
//! any other token is kept exactly.

use std::fmt;

/// Shortest accepted key: short keys collide too easily between retries of unrelated calls.
pub const MIN_LEN: usize = 16;
/// Longest accepted key: bounds the size of the primary key.
pub const MAX_LEN: usize = 128;

/// Why a key was refused; the API turns each into its own 400 problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("send an Idempotency-Key header with a unique token per operation")]
    Missing,
    #[error(
        "Idempotency-Key must be 16 to 128 characters of [A-Za-z0-9_-], bare or as a quoted string"
    )]
    Invalid,
}

/// A validated idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Parses the raw header value; `None` means the header was absent.
    pub fn parse(raw: Option<&str>) -> Result<Self, KeyError> {
        let raw = raw.ok_or(KeyError::Missing)?;
        let raw = raw.trim_matches([' ', '\t']);
        let token = match raw.strip_prefix('"') {
            Some(rest) => rest
                .strip_suffix('"')
                .filter(|inner| !inner.contains(['"', '\\']))
                .ok_or(KeyError::Invalid)?,
            None => raw,
        };
        let shape_ok = (MIN_LEN..=MAX_LEN).contains(&token.len())
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !shape_ok {
            return Err(KeyError::Invalid);
        }
        let normalised = match uuid::Uuid::try_parse(token) {
            // Only the hyphenated form is re-spelled: a 32-hex "simple" UUID is kept as sent.
            Ok(uuid) if token.len() == 36 => uuid.hyphenated().to_string(),
            _ => token.to_string(),
        };
        Ok(Self(normalised))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(raw: Option<&str>) -> KeyError {
        IdempotencyKey::parse(raw).unwrap_err()
    }

    #[test]
    fn a_missing_header_is_its_own_error() {
        assert_eq!(kind(None), KeyError::Missing);
    }

    #[test]
    fn bare_and_quoted_forms_name_the_same_key() {
        let bare = IdempotencyKey::parse(Some("order-2026-11-29_abc")).unwrap();
        let quoted = IdempotencyKey::parse(Some("\"order-2026-11-29_abc\"")).unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(bare.as_str(), "order-2026-11-29_abc");
    }

    #[test]
    fn lengths_outside_16_to_128_are_invalid() {
        assert_eq!(kind(Some("fifteen-chars15")), KeyError::Invalid);
        assert!(IdempotencyKey::parse(Some(&"a".repeat(16))).is_ok());
        assert!(IdempotencyKey::parse(Some(&"a".repeat(128))).is_ok());
        assert_eq!(kind(Some(&"a".repeat(129))), KeyError::Invalid);
        assert_eq!(kind(Some("")), KeyError::Invalid);
    }

    #[test]
    fn characters_outside_the_alphabet_are_invalid() {
        for bad in [
            "key with spaces in it",
            "key/with/slashes/ok",
            "kéy-with-accent-x",
            "\"unterminated-quote-x",
            "\"esc\\\"aped-quote-xx\"",
        ] {
            assert_eq!(kind(Some(bad)), KeyError::Invalid, "{bad}");
        }
    }

    #[test]
    fn uuids_are_lower_cased_other_tokens_kept_exactly() {
        let upper = IdempotencyKey::parse(Some("3F2B8C1E-9A4D-4E5F-8A6B-7C8D9E0F1A2B")).unwrap();
        assert_eq!(upper.as_str(), "3f2b8c1e-9a4d-4e5f-8a6b-7c8d9e0f1a2b");
        let mixed = IdempotencyKey::parse(Some("MixedCase_Token_ABC")).unwrap();
        assert_eq!(mixed.as_str(), "MixedCase_Token_ABC");
    }
}
