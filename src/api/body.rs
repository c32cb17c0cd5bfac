//! The create body over HTTP: JSON bytes to the domain's [`NewOrder`], whose one
//! constructor holds the create rules, and the OpenAPI schema of the body, built from
//! those same rules' bounds (the MCP tool's input schema is derived from this schema in
//! turn, so the three cannot drift apart).
//!
//! The body is parsed by the service's own rules rather than the framework's, so that a
//! client learns every problem at once, field by field, in plain words: which field is
//! missing, unknown, of the wrong type, or out of bounds.

use std::sync::LazyLock;

use poem::{FromRequest, Request, RequestBody};
use poem_openapi::{
    ApiExtractor, ApiExtractorType, ExtractParamOptions,
    error::ContentTypeError,
    payload::{ParsePayload, Payload},
    registry::{MetaMediaType, MetaRequest, MetaSchema, MetaSchemaRef, Registry},
};
use serde_json::Value;

use super::problem::Problem;
use crate::orders::{
    NewOrder,
    rules::{
        CUSTOMER_REF_MAX, CUSTOMER_REF_PATTERN, QUANTITY_MAX, QUANTITY_MIN, SKU_MAX, SKU_PATTERN,
    },
};

/// The name of the body's schema in the spec.
pub const SCHEMA_NAME: &str = "CreateOrderRequest";

/// A parsed, valid create body.
pub struct CreateOrderBody(pub NewOrder);

impl CreateOrderBody {
    /// Parses the raw body, collecting every field error.
    pub fn parse(bytes: &[u8]) -> Result<NewOrder, Problem> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| Problem::invalid_field("body", &format!("is not valid JSON ({e})")))?;
        let Value::Object(fields) = value else {
            return Err(Problem::invalid_field("body", "must be a JSON object"));
        };
        Ok(NewOrder::parse(&fields)?)
    }
}

/// The schema of the create body, from the create rules' bounds. The descriptions say
/// the bounds too, so they are built once and kept for the process's life.
pub fn create_order_schema() -> MetaSchema {
    static SKU: LazyLock<String> =
        LazyLock::new(|| format!("Stock keeping unit: 1 to {SKU_MAX} of `[A-Za-z0-9._-]`."));
    static QUANTITY: LazyLock<String> =
        LazyLock::new(|| format!("{QUANTITY_MIN} to {QUANTITY_MAX}."));
    static CUSTOMER_REF: LazyLock<String> = LazyLock::new(|| {
        format!(
            "The client's own reference: at most {CUSTOMER_REF_MAX} characters, none of them a \
             control character or a Unicode noncharacter. `null` is the same as leaving it out."
        )
    });
    let property = |schema: MetaSchema| MetaSchemaRef::Inline(Box::new(schema));
    MetaSchema {
        title: Some(SCHEMA_NAME.to_string()),
        description: Some("Body of `POST /v1/orders`."),
        required: vec!["sku", "quantity"],
        properties: vec![
            (
                "sku",
                property(MetaSchema {
                    description: Some(SKU.as_str()),
                    min_length: Some(1),
                    max_length: Some(SKU_MAX),
                    pattern: Some(SKU_PATTERN.to_string()),
                    ..MetaSchema::new("string")
                }),
            ),
            (
                "quantity",
                property(MetaSchema {
                    description: Some(QUANTITY.as_str()),
                    minimum: Some(QUANTITY_MIN as f64),
                    maximum: Some(QUANTITY_MAX as f64),
                    ..MetaSchema::new_with_format("integer", "int32")
                }),
            ),
            (
                "customer_ref",
                property(MetaSchema {
                    description: Some(CUSTOMER_REF.as_str()),
                    max_length: Some(CUSTOMER_REF_MAX),
                    pattern: Some(CUSTOMER_REF_PATTERN.to_string()),
                    nullable: true,
                    ..MetaSchema::new("string")
                }),
            ),
        ],
        ..MetaSchema::new("object")
    }
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
        MetaSchemaRef::Reference(SCHEMA_NAME.to_string())
    }

    fn register(registry: &mut Registry) {
        registry.create_schema::<Self, _>(SCHEMA_NAME.to_string(), |_| create_order_schema());
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
    use crate::api::problem::{AppKind, Kind};

    #[test]
    fn a_body_that_is_not_a_json_object_is_a_validation_error_on_body() {
        for (body, message) in [("[1]", "must be a JSON object"), ("{", "is not valid JSON")] {
            let problem = CreateOrderBody::parse(body.as_bytes()).unwrap_err();
            assert_eq!(problem.kind, Kind::App(AppKind::ValidationError));
            let errors = problem.errors.unwrap();
            assert_eq!(errors[0].field, "body");
            assert!(errors[0].message.starts_with(message), "{errors:?}");
        }
    }

    #[test]
    fn the_schema_states_the_rules_bounds() {
        let schema = serde_json::to_value(create_order_schema()).unwrap();
        let properties = &schema["properties"];
        assert_eq!(properties["sku"]["maxLength"], SKU_MAX);
        assert_eq!(properties["quantity"]["maximum"], QUANTITY_MAX as f64);
        assert_eq!(properties["customer_ref"]["maxLength"], CUSTOMER_REF_MAX);
        assert_eq!(schema["required"], serde_json::json!(["sku", "quantity"]));
    }
}
