//! How tokens are verified and minted: the JWT settings and their rules.

use std::{path::PathBuf, time::Duration};

use crate::config::{ConfigError, Env, Kind, Secret, Setting, parse, range, settings};

settings! {
    /// How tokens are verified and minted.
    #[derive(Default)]
    pub struct JwtConfig {
        hs256_secret: Option<Secret> = parse::secret [JWT_HS256_SECRET, "ORDERD_JWT_HS256_SECRET", None, Kind::Secret, "HS256 shared secret of at least 32 bytes, or several separated by commas while one is rotated: the first signs what `orderd token` mints, every one verifies (exactly one of the three verifiers)"],
        public_key_file: Option<PathBuf> = path [JWT_PUBLIC_KEY_FILE, "ORDERD_JWT_PUBLIC_KEY_FILE", None, Kind::Text, "PEM public key file: an RSA key allows RS256, an EC key ES256"],
        jwks_url: Option<String> = parse::text [JWT_JWKS_URL, "ORDERD_JWT_JWKS_URL", None, Kind::Text, "JSON Web Key Set URL: `https`, or `http` only to a loopback host; the token's `kid` picks the key; refreshed every 5 minutes; needs `ORDERD_JWT_ISSUER` and `ORDERD_JWT_AUDIENCE`"],
        issuer: Option<String> = parse::text [JWT_ISSUER, "ORDERD_JWT_ISSUER", None, Kind::Text, "when set, a token's `iss` must match; required with a JWKS URL"],
        audience: Option<String> = parse::text [JWT_AUDIENCE, "ORDERD_JWT_AUDIENCE", None, Kind::Text, "when set, a token's `aud` (a string or an array) must contain it; required with a JWKS URL"],
        /// How long after the provider last confirmed the key set a set whose fetches
        /// fail makes `/readyz` answer 503; `None`: never.
        stale_readiness: Option<Duration> = parse::secs_or_off [JWT_STALE_READINESS_SECS, "ORDERD_JWT_STALE_READINESS_SECS", Some("0"), range(0, 31_536_000), "with a JWKS URL: once a fetch of the key set has failed and the provider last confirmed the set longer ago than this, `/readyz` answers 503 (`900` was the behaviour before it was a setting); `0`: never, the cached keys keep verifying and the process stays ready however long the provider is away (the set's age is the `jwks_key_set_age_seconds` metric)"],
    }
    check = JwtConfig::check;
}

fn path(env: &Env<'_>, s: &Setting) -> Result<Option<PathBuf>, ConfigError> {
    Ok(env.text(s).map(PathBuf::from))
}

impl JwtConfig {
    /// The shared secrets, in order: the one tokens are signed with first, then those
    /// that still verify while a rotation is under way (see [`check_hs256_secrets`]).
    pub fn hs256_secrets(&self) -> Vec<Secret> {
        self.hs256_secret
            .as_ref()
            .map(|all| all.expose().split(',').map(Secret::new).collect())
            .unwrap_or_default()
    }

    /// The secret `orderd token` signs with: the first one.
    pub fn signing_secret(&self) -> Option<Secret> {
        self.hs256_secrets().into_iter().next()
    }

    /// The JWT settings alone: `orderd token` needs them without a database.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Env::new(&|name| std::env::var(name).ok()))
    }

    fn check(&self) -> Result<(), ConfigError> {
        if let Some(secret) = &self.hs256_secret {
            check_hs256_secrets(secret)?;
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

/// A rotation lists the new secret first and the old one after a comma, so that tokens
/// signed with either verify until the old one is removed. Each part must be a secret
/// of its own: at least 32 bytes (RFC 7518 asks for a key at least as long as the hash)
/// and nothing around it. A secret that used to contain a comma now reads as several;
/// where a part is then too short or blank the process refuses to start, naming the
/// part, instead of verifying with the pieces.
pub fn check_hs256_secrets(all: &Secret) -> Result<(), ConfigError> {
    let parts: Vec<&str> = all.expose().split(',').collect();
    let count = parts.len();
    let which = |n: usize| {
        if count == 1 {
            JWT_HS256_SECRET.name.to_string()
        } else {
            format!("secret {n} of {count} in {}", JWT_HS256_SECRET.name)
        }
    };
    for (i, part) in parts.iter().enumerate() {
        let n = i + 1;
        if part.is_empty() {
            return Err(ConfigError::new(format!(
                "{} is empty: remove the stray comma",
                which(n)
            )));
        }
        if part.trim() != *part {
            return Err(ConfigError::new(format!(
                "{} starts or ends with whitespace: separate the secrets with a comma alone",
                which(n)
            )));
        }
        if part.len() < 32 {
            return Err(ConfigError::new(format!(
                "{} is too short ({} bytes): use at least 32 bytes{}",
                which(n),
                part.len(),
                if count > 1 {
                    " (commas separate secrets: a secret that contains one must be replaced)"
                } else {
                    ""
                }
            )));
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(value: &str) -> String {
        check_hs256_secrets(&Secret::new(value))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn each_comma_separated_secret_must_be_a_secret_of_its_own() {
        let long = "a-secret-of-thirty-two-bytes-at-least";
        assert!(check_hs256_secrets(&Secret::new(long)).is_ok());
        assert!(check_hs256_secrets(&Secret::new(format!("{long},{long}x"))).is_ok());
        let short = refusal("short");
        assert!(
            short.contains("ORDERD_JWT_HS256_SECRET is too short (5 bytes)"),
            "{short}"
        );
        // A secret that contained a comma is refused, not split into weaker keys.
        let split = refusal("0123456789abcdefghij,0123456789abcdefghijklmnopqrstuvwxyz");
        assert!(split.contains("secret 1 of 2"), "{split}");
        assert!(
            split.contains("a secret that contains one must be replaced"),
            "{split}"
        );
        assert!(refusal(&format!("{long},")).contains("secret 2 of 2"));
        assert!(refusal(&format!("{long}, {long}")).contains("whitespace"));
    }
}
