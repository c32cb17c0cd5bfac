//! The create rules, once: [`NewOrder`] has private fields and one constructor,
//! [`NewOrder::parse`], which checks every field and names every problem at once. The
//! bounds are the constants below; the REST schema (`api::body`) and the MCP tool's
//! input schema (derived from that same schema) are built from them, so changing a
//! rule is one edit here and every description of it follows.
//!
//! Strings must be JSON strings (a number is not coerced into `"5"`, which would also
//! make `5` and `"5"` the same request to the fingerprint), and text a client stores is
//! refused when it holds control characters or Unicode noncharacters: PostgreSQL cannot
//! store `\u0000`, and the others only ever arrive by mistake or to cause one.

use serde::Serialize;
use serde_json::{Map, Value};

/// Longest `sku`.
pub const SKU_MAX: usize = 64;
/// The characters of a `sku`, as a JSON Schema pattern.
pub const SKU_PATTERN: &str = "^[A-Za-z0-9._-]+$";
/// Smallest `quantity`.
pub const QUANTITY_MIN: i64 = 1;
/// Largest `quantity`.
pub const QUANTITY_MAX: i64 = 10_000;
/// Longest `customer_ref`, in characters.
pub const CUSTOMER_REF_MAX: usize = 128;
/// What `customer_ref` may not contain, as a JSON Schema pattern (what
/// [`check_text`] refuses).
pub const CUSTOMER_REF_PATTERN: &str = r"^[^\u0000-\u001F\u007F-\u009F\uFDD0-\uFDEF\uFFFE\uFFFF]*$";
/// The fields a create takes; any other is refused.
pub const FIELDS: [&str; 3] = ["sku", "quantity", "customer_ref"];

/// One field that breaks a rule, in plain words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The field's name (`body` for the request as a whole).
    pub field: String,
    pub message: String,
}

impl Invalid {
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

/// A valid create request: only [`NewOrder::parse`] makes one. Serialised to
/// fingerprint the request: it is the create's effect, with defaults applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewOrder {
    sku: String,
    quantity: i32,
    customer_ref: Option<String>,
}

impl NewOrder {
    /// Checks the fields of a create (a JSON object's members), collecting every
    /// problem: unknown fields, missing ones, wrong types, broken bounds. `null` is the
    /// same as an absent `customer_ref`.
    pub fn parse(fields: &Map<String, Value>) -> Result<Self, Vec<Invalid>> {
        let mut errors = Vec::new();
        for name in fields.keys() {
            if !FIELDS.contains(&name.as_str()) {
                errors.push(Invalid::new(name, "is not a known field"));
            }
        }
        let sku = match fields.get("sku") {
            None | Some(Value::Null) => {
                errors.push(Invalid::new("sku", "is required"));
                None
            }
            Some(Value::String(sku)) if valid_sku(sku) => Some(sku.clone()),
            Some(Value::String(_)) => {
                errors.push(Invalid::new(
                    "sku",
                    format!("must be 1 to {SKU_MAX} characters of A-Z, a-z, 0-9, '.', '_' and '-'"),
                ));
                None
            }
            Some(_) => {
                errors.push(Invalid::new("sku", "must be a string"));
                None
            }
        };
        let whole = || format!("must be a whole number from {QUANTITY_MIN} to {QUANTITY_MAX}");
        let quantity = match fields.get("quantity") {
            None | Some(Value::Null) => {
                errors.push(Invalid::new("quantity", "is required"));
                None
            }
            Some(Value::Number(n)) => match n.as_i64() {
                Some(q) if (QUANTITY_MIN..=QUANTITY_MAX).contains(&q) => i32::try_from(q).ok(),
                Some(_) => {
                    errors.push(Invalid::new(
                        "quantity",
                        format!("must be from {QUANTITY_MIN} to {QUANTITY_MAX}"),
                    ));
                    None
                }
                None => {
                    errors.push(Invalid::new("quantity", whole()));
                    None
                }
            },
            Some(_) => {
                errors.push(Invalid::new("quantity", whole()));
                None
            }
        };
        let customer_ref = match fields.get("customer_ref") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => {
                if let Err(why) = check_text(text, CUSTOMER_REF_MAX) {
                    errors.push(Invalid::new("customer_ref", why));
                }
                Some(text.clone())
            }
            Some(_) => {
                errors.push(Invalid::new("customer_ref", "must be a string or null"));
                None
            }
        };
        match (sku, quantity) {
            (Some(sku), Some(quantity)) if errors.is_empty() => Ok(Self {
                sku,
                quantity,
                customer_ref,
            }),
            _ => Err(errors),
        }
    }

    pub fn sku(&self) -> &str {
        &self.sku
    }

    pub fn quantity(&self) -> i32 {
        self.quantity
    }

    pub fn customer_ref(&self) -> Option<&str> {
        self.customer_ref.as_deref()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(body: &str) -> Vec<(String, String)> {
        let Value::Object(fields) = serde_json::from_str(body).unwrap() else {
            panic!("not an object: {body}")
        };
        NewOrder::parse(&fields)
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.field, e.message))
            .collect()
    }

    fn parse(body: &str) -> NewOrder {
        let Value::Object(fields) = serde_json::from_str(body).unwrap() else {
            panic!("not an object: {body}")
        };
        NewOrder::parse(&fields).unwrap()
    }

    #[test]
    fn a_valid_body_parses_with_null_the_same_as_absent() {
        let a = parse(r#"{"sku":"A-1","quantity":2,"customer_ref":null}"#);
        assert_eq!((a.sku(), a.quantity(), a.customer_ref()), ("A-1", 2, None));
        assert_eq!(a, parse(r#"{"quantity":2,"sku":"A-1"}"#));
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
    fn bounds_and_types_are_plain_words_naming_the_bounds() {
        assert_eq!(
            errors(r#"{"sku":"A","quantity":0}"#)[0].1,
            format!("must be from 1 to {QUANTITY_MAX}")
        );
        assert_eq!(
            errors(r#"{"sku":"A","quantity":1.5}"#)[0].1,
            format!("must be a whole number from 1 to {QUANTITY_MAX}")
        );
        let over = format!(r#"{{"sku":"A","quantity":{}}}"#, QUANTITY_MAX + 1);
        assert_eq!(errors(&over)[0].0, "quantity");
        assert_eq!(errors(r#"{"sku":"","quantity":1}"#)[0].0, "sku");
        let long = format!(r#"{{"sku":"{}","quantity":1}}"#, "A".repeat(SKU_MAX + 1));
        assert_eq!(errors(&long)[0].0, "sku");
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
        let ok =
            parse("{\"sku\":\"A\",\"quantity\":1,\"customer_ref\":\"caf\\u00e9 \\ud83d\\ude00\"}");
        assert_eq!(ok.customer_ref(), Some("café 😀"));
    }
}
