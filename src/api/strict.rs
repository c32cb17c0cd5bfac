//! A JSON string field that accepts only JSON strings.
//!
//! poem-openapi's `String` also accepts numbers and booleans (`5` becomes `"5"`), which
//! would let a body that does not fit the schema through, and would make `5` and
//! `"5"` the same request to the fingerprint. The contract (docs/contract.md §5) says such a body is a
//! 400, so request bodies use this type instead.

use std::borrow::Cow;

use poem_openapi::{
    registry::{MetaSchema, MetaSchemaRef},
    types::{ParseError, ParseFromJSON, ParseResult, ToJSON, Type},
};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrictString(pub String);

impl Type for StrictString {
    const IS_REQUIRED: bool = true;
    // Validators (length, pattern) run on the inner string.
    type RawValueType = String;
    type RawElementValueType = String;

    fn name() -> Cow<'static, str> {
        "string".into()
    }

    fn schema_ref() -> MetaSchemaRef {
        MetaSchemaRef::Inline(Box::new(MetaSchema::new("string")))
    }

    fn as_raw_value(&self) -> Option<&String> {
        Some(&self.0)
    }

    fn raw_element_iter<'a>(&'a self) -> Box<dyn Iterator<Item = &'a String> + 'a> {
        Box::new(std::iter::once(&self.0))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl ParseFromJSON for StrictString {
    fn parse_from_json(value: Option<Value>) -> ParseResult<Self> {
        match value {
            Some(Value::String(text)) => Ok(Self(text)),
            other => Err(ParseError::expected_type(other.unwrap_or_default())),
        }
    }
}

impl ToJSON for StrictString {
    fn to_json(&self) -> Option<Value> {
        Some(Value::String(self.0.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_strings_parse() {
        assert_eq!(
            StrictString::parse_from_json(Some(Value::from("a"))).unwrap(),
            StrictString("a".into())
        );
        for bad in [
            Value::from(5),
            Value::from(true),
            Value::Null,
            serde_json::json!([]),
        ] {
            assert!(StrictString::parse_from_json(Some(bad)).is_err());
        }
    }
}
