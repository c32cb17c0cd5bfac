//! Request parameters whose parsing the service decides rather than the framework.

use std::borrow::Cow;

use poem_openapi::{
    registry::{MetaSchema, MetaSchemaRef},
    types::{ParseFromParameter, ParseResult, Type},
};

use super::problem::Problem;
use crate::idempotency::IdempotencyKey;

/// The pattern of the `Idempotency-Key` header: a bare token, or the same token as an
/// RFC 8941 quoted string.
pub const KEY_PATTERN: &str = r#"^(?:[A-Za-z0-9_-]{16,128}|"[A-Za-z0-9_-]{16,128}")$"#;

/// The `Idempotency-Key` header: documented as required (with its pattern), parsed by
/// the idempotency core so that a missing key is `idempotency-key-missing` and a
/// malformed one `idempotency-key-invalid`, never the framework's own 400.
pub struct KeyHeader(Option<String>);

impl KeyHeader {
    pub fn parse(self) -> Result<IdempotencyKey, Problem> {
        IdempotencyKey::parse(self.0.as_deref()).map_err(Problem::from)
    }
}

impl Type for KeyHeader {
    const IS_REQUIRED: bool = true;
    type RawValueType = String;
    type RawElementValueType = String;

    fn name() -> Cow<'static, str> {
        "string".into()
    }

    fn schema_ref() -> MetaSchemaRef {
        MetaSchemaRef::Inline(Box::new(MetaSchema {
            pattern: Some(KEY_PATTERN.to_string()),
            min_length: Some(16),
            max_length: Some(130),
            ..MetaSchema::new("string")
        }))
    }

    fn as_raw_value(&self) -> Option<&String> {
        self.0.as_ref()
    }

    fn raw_element_iter<'a>(&'a self) -> Box<dyn Iterator<Item = &'a String> + 'a> {
        Box::new(self.0.iter())
    }
}

impl ParseFromParameter for KeyHeader {
    fn parse_from_parameter(value: &str) -> ParseResult<Self> {
        Ok(Self(Some(value.to_string())))
    }

    fn parse_from_parameters<I: IntoIterator<Item = A>, A: AsRef<str>>(
        iter: I,
    ) -> ParseResult<Self> {
        Ok(Self(
            iter.into_iter().next().map(|v| v.as_ref().to_string()),
        ))
    }
}
