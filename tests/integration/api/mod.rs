mod auth;
mod http_limits;
mod jwks;
mod mcp;
mod openapi;
mod orders;
mod tenant_limits;
mod validation;
