//! The create body, parsed by the service's own rules rather than the framework's, so
//! that a client learns every problem at once, field by field, in plain words: which
//! field is missing, unknown, of the wrong type, or out of bounds. The OpenAPI schema is
//! still the derived [`CreateOrderRequest`], whose rules these mirror.
//!
//! Strings must be JSON strings (a number is not coerced into `"5"`, which would also
//! make `5` and `"5"` the same request to the fingerprint), and text a client stores is
//! refused when it holds control characters or Unicode noncharacters: PostgreSQL cannot
//! store `\u0000`, and the others only ever arrive by mistake or to cause one.

use poem::{FromRequest, Request, RequestBody};
use poem_openapi::{
    ApiExtractor, ApiExtractorType, ExtractParamOptions, Object,
    error::ContentTypeError,
    payload::{ParsePayload, Payload},
    registry::{MetaMediaType, MetaRequest, MetaSchemaRef, Registry},
    types::Type,
};
use serde_json::{Map, Value};

use super::problem::{FieldError, Kind, Problem};
use crate::orders::NewOrder;

/// Longest `sku`.
pub const SKU_MAX: usize = 64;
/// Largest `quantity`.
pub const QUANTITY_MAX: i64 = 10_000;
/// Longest `customer_ref`, in characters.
pub const CUSTOMER_REF_MAX: usize = 128;

/// Body of `POST /v1/orders` (its schema; parsing is [`CreateOrderBody`]'s).
#[derive(Debug, Object)]
#[oai(deny_unknown_fields)]
pub struct CreateOrderRequest {
    /// Stock keeping unit: 1 to 64 of `[A-Za-z0-9._-]`.
    #[oai(validator(min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]+$"))]
    pub sku: String,
    /// 1 to 10000.
    #[oai(validator(minimum(value = "1"), maximum(value = "10000")))]
    pub quantity: i32,
    /// The client's own reference: at most 128 characters, none of them a control
    /// character or a Unicode noncharacter. `null` is the same as leaving it out.
    #[oai(
        nullable,
        validator(
            max_length = 128,
            pattern = r"^[^\u0000-\u001F\u007F-\u009F\uFDD0-\uFDEF\uFFFE\uFFFF]*$"
        )
    )]
    pub customer_ref: Option<String>,
}

/// A parsed, valid create body.
pub struct CreateOrderBody(pub NewOrder);

impl CreateOrderBody {
    /// Parses the raw body, collecting every field error.
    pub fn parse(bytes: &[u8]) -> Result<NewOrder, Problem> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            invalid(vec![FieldError {
                field: "body".into(),
                message: format!("is not valid JSON ({e})"),
            }])
        })?;
        let Value::Object(fields) = value else {
            return Err(invalid(vec![FieldError {
                field: "body".into(),
                message: "must be a JSON object".into(),
            }]));
        };
        parse_fields(&fields)
    }
}

/// Validates the fields of a create body (shared with the MCP tool's arguments).
pub fn parse_fields(fields: &Map<String, Value>) -> Result<NewOrder, Problem> {
    let mut errors = Vec::new();
    for name in fields.keys() {
        if !["sku", "quantity", "customer_ref"].contains(&name.as_str()) {
            errors.push(field(name, "is not a known field"));
        }
    }
    let sku = match fields.get("sku") {
        None | Some(Value::Null) => {
            errors.push(field("sku", "is required"));
            None
        }
        Some(Value::String(sku)) if valid_sku(sku) => Some(sku.clone()),
        Some(Value::String(_)) => {
            errors.push(field(
                "sku",
                "must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-'",
            ));
            None
        }
        Some(_) => {
            errors.push(field("sku", "must be a string"));
            None
        }
    };
    let quantity = match fields.get("quantity") {
        None | Some(Value::Null) => {
            errors.push(field("quantity", "is required"));
            None
        }
        Some(Value::Number(n)) => match n.as_i64() {
            Some(q) if (1..=QUANTITY_MAX).contains(&q) => Some(q as i32),
            Some(_) => {
                errors.push(field("quantity", "must be from 1 to 10000"));
                None
            }
            None => {
                errors.push(field("quantity", "must be a whole number from 1 to 10000"));
                None
            }
        },
        Some(_) => {
            errors.push(field("quantity", "must be a whole number from 1 to 10000"));
            None
        }
    };
    let customer_ref = match fields.get("customer_ref") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => {
            if let Err(why) = check_text(text, CUSTOMER_REF_MAX) {
                errors.push(field("customer_ref", &why));
            }
            Some(text.clone())
        }
        Some(_) => {
            errors.push(field("customer_ref", "must be a string or null"));
            None
        }
    };
    match (sku, quantity) {
        (Some(sku), Some(quantity)) if errors.is_empty() => Ok(NewOrder {
            sku,
            quantity,
            customer_ref,
        }),
        _ => Err(invalid(errors)),
    }
}

fn valid_sku(sku: &str) -> bool {
    (1..=SKU_MAX).contains(&sku.len())
        && sku
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Free text a client stores: at most `max` characters, no control characters
/// (U+0000-U+001F, U+007F-U+009F) and no noncharacters (U+FDD0-U+FDEF, and the last two
/// code points of every plane).
pub fn check_text(text: &str, max: usize) -> Result<(), String> {
    if text.chars().count() > max {
        return Err(format!("must be at most {max} characters"));
    }
    if let Some((at, c)) = text.chars().enumerate().find(|(_, c)| forbidden(*c)) {
        return Err(format!(
            "must not contain control characters or noncharacters (U+{:04X} at position {at})",
            c as u32
        ));
    }
    Ok(())
}

fn forbidden(c: char) -> bool {
    let c = c as u32;
    c <= 0x1F
        || (0x7F..=0x9F).contains(&c)
        || (0xFDD0..=0xFDEF).contains(&c)
        || (c & 0xFFFE) == 0xFFFE
}

fn field(name: &str, message: &str) -> FieldError {
    FieldError {
        field: name.to_string(),
        message: message.to_string(),
    }
}

fn invalid(errors: Vec<FieldError>) -> Problem {
    let detail = errors
        .iter()
        .map(|e| format!("`{}` {}", e.field, e.message))
        .collect::<Vec<_>>()
        .join("; ");
    Problem::new(Kind::ValidationError)
        .with_detail(detail)
        .with_errors(errors)
}

impl Payload for CreateOrderBody {
    const CONTENT_TYPE: &'static str = "application/json";

    /// `application/json` or any `application/...+json`, parameters allowed.
    fn check_content_type(content_type: &str) -> bool {
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub == "json" || sub.ends_with("+json"))
    }

    fn schema_ref() -> MetaSchemaRef {
        CreateOrderRequest::schema_ref()
    }

    fn register(registry: &mut Registry) {
        CreateOrderRequest::register(registry);
    }
}

impl ParsePayload for CreateOrderBody {
    const IS_REQUIRED: bool = true;

    async fn from_request(request: &Request, body: &mut RequestBody) -> poem::Result<Self> {
        let bytes = <Vec<u8> as FromRequest>::from_request(request, body).await?;
        Ok(Self(Self::parse(&bytes)?))
    }
}

impl<'a> ApiExtractor<'a> for CreateOrderBody {
    const TYPES: &'static [ApiExtractorType] = &[ApiExtractorType::RequestObject];

    type ParamType = ();
    type ParamRawType = ();

    fn register(registry: &mut Registry) {
        <Self as Payload>::register(registry);
    }

    fn request_meta() -> Option<MetaRequest> {
        Some(MetaRequest {
            description: None,
            content: vec![MetaMediaType {
                content_type: <Self as Payload>::CONTENT_TYPE,
                schema: <Self as Payload>::schema_ref(),
            }],
            required: true,
        })
    }

    async fn from_request(
        request: &'a Request,
        body: &mut RequestBody,
        _param_opts: ExtractParamOptions<Self::ParamType>,
    ) -> poem::Result<Self> {
        match request.content_type() {
            Some(content_type) if Self::check_content_type(content_type) => {
                <Self as ParsePayload>::from_request(request, body).await
            }
            Some(content_type) => Err(ContentTypeError::NotSupported {
                content_type: content_type.to_string(),
            }
            .into()),
            None => Err(ContentTypeError::ExpectContentType.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(body: &str) -> Vec<(String, String)> {
        CreateOrderBody::parse(body.as_bytes())
            .err()
            .map(|p| {
                p.errors
                    .unwrap_or_default()
                    .into_iter()
                    .map(|e| (e.field, e.message))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn a_valid_body_parses_with_null_the_same_as_absent() {
        let a =
            CreateOrderBody::parse(br#"{"sku":"A-1","quantity":2,"customer_ref":null}"#).unwrap();
        assert_eq!(
            (a.sku.as_str(), a.quantity, a.customer_ref),
            ("A-1", 2, None)
        );
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let found = errors(r#"{"quantiy": 2, "sku": 5}"#);
        let fields: Vec<&str> = found.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(fields, ["quantiy", "sku", "quantity"], "{found:?}");
        assert_eq!(found[0].1, "is not a known field");
        assert_eq!(found[1].1, "must be a string");
        assert_eq!(found[2].1, "is required");
    }

    #[test]
    fn bounds_and_types_are_plain_words() {
        assert_eq!(
            errors(r#"{"sku":"A","quantity":0}"#)[0].1,
            "must be from 1 to 10000"
        );
        assert_eq!(
            errors(r#"{"sku":"A","quantity":1.5}"#)[0].1,
            "must be a whole number from 1 to 10000"
        );
        assert_eq!(errors(r#"{"sku":"","quantity":1}"#)[0].0, "sku");
        assert_eq!(errors("[1]")[0].1, "must be a JSON object");
        assert!(
            errors("{")
                .first()
                .is_some_and(|(f, m)| f == "body" && m.starts_with("is not valid JSON"))
        );
    }

    #[test]
    fn control_characters_and_noncharacters_are_refused() {
        for bad in [
            "a\\u0000b",
            "bell\\u0007",
            "c1\\u009f",
            "\\uffff",
            "\\ufdd0",
            "\\ud83f\\udffe",
        ] {
            let body = format!(r#"{{"sku":"A","quantity":1,"customer_ref":"{bad}"}}"#);
            let found = errors(&body);
            assert_eq!(found.len(), 1, "{bad}: {found:?}");
            assert_eq!(found[0].0, "customer_ref");
        }
        assert!(
            CreateOrderBody::parse(
                "{\"sku\":\"A\",\"quantity\":1,\"customer_ref\":\"caf\\u00e9 \\ud83d\\ude00\"}"
                    .as_bytes()
            )
            .is_ok()
        );
    }
}
