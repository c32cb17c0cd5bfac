//! The route table: every path template the server answers, with the methods it
//! takes. The `route` label of the HTTP metrics, the tenant limits' `route`, the
//! `Allow` header of a 405 and the log's transport all read this one table, so a new
//! route is one row here.

use crate::metrics::label_enum;

label_enum! {
    /// The HTTP routes, as templates: one label value per route, `unmatched` for the rest.
    pub Route {
        Orders => "/v1/orders",
        Order => "/v1/orders/{id}",
        CancelOrder => "/v1/orders/{id}/cancel",
        Healthz => "/healthz",
        Readyz => "/readyz",
        Metrics => "/metrics",
        OpenapiJson => "/openapi.json",
        OpenapiYaml => "/openapi.yaml",
        Docs => "/docs",
        Mcp => "/mcp",
        ProtectedResource => "/.well-known/oauth-protected-resource",
        Unmatched => "unmatched",
    }
}

impl Route {
    /// The route a request path belongs to. Path parameters are single segments, so a
    /// template matches a path when their segments match one for one; everything under
    /// `/docs` is the Swagger UI.
    pub fn of_path(path: &str) -> Route {
        let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        if segments.first() == Some(&"docs") {
            return Route::Docs;
        }
        Route::ALL
            .iter()
            .copied()
            .find(|route| {
                let template: Vec<&str> = route.as_str().split('/').skip(1).collect();
                template.len() == segments.len()
                    && template
                        .iter()
                        .zip(&segments)
                        .all(|(t, s)| t.starts_with('{') || t == s)
            })
            .unwrap_or(Route::Unmatched)
    }

    /// The methods the route answers, as the `Allow` header of a 405 lists them.
    pub fn allowed_methods(self) -> &'static str {
        match self {
            Route::Orders => "GET, HEAD, POST",
            Route::CancelOrder => "POST",
            Route::Mcp => "POST",
            Route::Unmatched => "",
            _ => "GET, HEAD",
        }
    }

    /// Whether the route answers only callers with a valid token: decided from the
    /// request head, before any of its body is read (`api::auth::Gate`).
    pub fn needs_token(self) -> bool {
        matches!(
            self,
            Route::Orders | Route::Order | Route::CancelOrder | Route::Mcp
        )
    }

    /// Whether a request with `method` on this route has a body worth reading; any
    /// other body is never read into memory.
    pub fn takes_body(self, method: &http::Method) -> bool {
        *method == http::Method::POST
            && matches!(self, Route::Orders | Route::CancelOrder | Route::Mcp)
    }

    /// The transport the route belongs to, for the request log line.
    pub fn transport(self) -> &'static str {
        if self == Route::Mcp { "mcp" } else { "rest" }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_a_bounded_set_of_templates() {
        assert_eq!(Route::of_path("/v1/orders"), Route::Orders);
        assert_eq!(
            Route::of_path("/v1/orders/0192f0e4-7c1a-7cc0-8f5e-1d2b3c4d5e6f"),
            Route::Order
        );
        assert_eq!(Route::of_path("/v1/orders/abc/cancel"), Route::CancelOrder);
        assert_eq!(Route::of_path("/docs/swagger-ui.css"), Route::Docs);
        assert_eq!(Route::of_path("/healthz/"), Route::Healthz);
        assert_eq!(
            Route::of_path("/v1/orders/abc/cancel/extra"),
            Route::Unmatched
        );
        assert_eq!(Route::of_path("/wp-admin/install.php"), Route::Unmatched);
        assert_eq!(Route::of_path("/unmatched"), Route::Unmatched);
    }

    #[test]
    fn only_the_tenant_routes_need_a_token_and_only_their_writes_have_bodies() {
        let needing: Vec<Route> = Route::ALL
            .iter()
            .copied()
            .filter(|r| r.needs_token())
            .collect();
        assert_eq!(
            needing,
            [Route::Orders, Route::Order, Route::CancelOrder, Route::Mcp]
        );
        assert!(Route::Orders.takes_body(&http::Method::POST));
        assert!(!Route::Orders.takes_body(&http::Method::GET));
        assert!(!Route::Healthz.takes_body(&http::Method::POST));
        assert!(!Route::Order.takes_body(&http::Method::POST));
    }

    #[test]
    fn every_route_but_the_unmatched_allows_some_method() {
        for route in Route::ALL {
            assert_eq!(
                route.allowed_methods().is_empty(),
                *route == Route::Unmatched,
                "{route}"
            );
        }
    }
}
