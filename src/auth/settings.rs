//! How tokens are verified and minted: the JWT settings and their rules.

use std::path::PathBuf;

use crate::config::{ConfigError, Env, Kind, Secret, Setting, parse, settings};

settings! {
    /// How tokens are verified and minted.
    #[derive(Default)]
    pub struct JwtConfig {
        hs256_secret: Option<Secret> = parse::secret [JWT_HS256_SECRET, "ORDERD_JWT_HS256_SECRET", None, Kind::Secret, "HS256 shared secret, at least 32 bytes (exactly one of the three verifiers)"],
        public_key_file: Option<PathBuf> = path [JWT_PUBLIC_KEY_FILE, "ORDERD_JWT_PUBLIC_KEY_FILE", None, Kind::Text, "PEM public key file: an RSA key allows RS256, an EC key ES256"],
        jwks_url: Option<String> = parse::text [JWT_JWKS_URL, "ORDERD_JWT_JWKS_URL", None, Kind::Text, "JSON Web Key Set URL: `https`, or `http` only to a loopback host; the token's `kid` picks the key; refreshed every 5 minutes; needs `ORDERD_JWT_ISSUER` and `ORDERD_JWT_AUDIENCE`"],
        issuer: Option<String> = parse::text [JWT_ISSUER, "ORDERD_JWT_ISSUER", None, Kind::Text, "when set, a token's `iss` must match; required with a JWKS URL"],
        audience: Option<String> = parse::text [JWT_AUDIENCE, "ORDERD_JWT_AUDIENCE", None, Kind::Text, "when set, a token's `aud` (a string or an array) must contain it; required with a JWKS URL"],
    }
    check = JwtConfig::check;
}

fn path(env: &Env<'_>, s: &Setting) -> Result<Option<PathBuf>, ConfigError> {
    Ok(env.text(s).map(PathBuf::from))
}

impl JwtConfig {
    /// The JWT settings alone: `orderd token` needs them without a database.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Env::new(&|name| std::env::var(name).ok()))
    }

    fn check(&self) -> Result<(), ConfigError> {
        // RFC 7518 asks for a key at least as long as the hash: 32 bytes for HS256.
        if let Some(secret) = &self.hs256_secret
            && secret.expose().len() < 32
        {
            return Err(ConfigError::new(format!(
                "{} is too short: use at least 32 bytes",
                JWT_HS256_SECRET.name
            )));
        }
        let configured = [
            self.hs256_secret.is_some(),
            self.public_key_file.is_some(),
            self.jwks_url.is_some(),
        ];
        if configured.iter().filter(|&&set| set).count() > 1 {
            return Err(ConfigError::new(format!(
                "set exactly one of {}, {} and {}",
                JWT_HS256_SECRET.name, JWT_PUBLIC_KEY_FILE.name, JWT_JWKS_URL.name
            )));
        }
        if let Some(url) = &self.jwks_url {
            if !jwks_url_is_safe(url) {
                return Err(ConfigError::new(format!(
                    "{} must be an https:// URL (or http:// to a loopback host), not `{url}`: \
                     whoever can change the key set can mint tokens for every tenant",
                    JWT_JWKS_URL.name
                )));
            }
            // A shared identity provider signs tokens for other services too: only the
            // audience and the issuer tell this service's tokens from theirs.
            for (setting, value) in [(&JWT_AUDIENCE, &self.audience), (&JWT_ISSUER, &self.issuer)] {
                if value.is_none() {
                    return Err(ConfigError::new(format!(
                        "{} is required with {}: without it a token the same provider minted \
                         for another service would be accepted",
                        setting.name, JWT_JWKS_URL.name
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Whether a key set may be fetched from `url`: over TLS, or in the clear only from this
/// host (a provider or a sidecar on loopback).
fn jwks_url_is_safe(url: &str) -> bool {
    // `http::Uri` parses the authority (user info, brackets, port) as the HTTP client
    // will, so `http://127.0.0.1@idp.example.com` is judged by `idp.example.com`.
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    match (uri.scheme_str(), uri.host()) {
        (Some("https"), Some(_)) => true,
        (Some("http"), Some(host)) => {
            host.eq_ignore_ascii_case("localhost")
                || host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        _ => false,
    }
}
