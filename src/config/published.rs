//! Secrets that orderd's own examples publish (the manifests, the README, the docs, the
//! k6 scripts and `examples/`): whoever has read them can use them, so a process given
//! one for any [`Kind::Secret`] setting stops at start, naming the setting (decision 179).
//!
//! The list holds SHA-256 digests, not the values: the binary carries no list of
//! credentials for a scanner to flag, and a secret that reached the docs by mistake
//! can be refused without being printed a second time, here or in the binary. A
//! value is refused once published, even after the example stops showing it: it stays
//! in the repository's history. A unit test in `app::config` gathers every secret-like
//! value of the examples and fails, with the digest to add, until each is refused.

use sha2::{Digest, Sha256};

use super::{ConfigError, Env, Kind, Setting};

/// SHA-256 (hex) of every published value, without base64 padding (see [`digest`]).
/// Append only: a value leaves the examples, not this list.
const PUBLISHED: &[&str] = &[
    // deploy/kubernetes/secret.yaml before decision 179: its HS256 secret.
    "84a68500bcc87c580043216b0f0a61505d51bd5169e69a5e0142555f8e7a28c0",
    // deploy/kubernetes/secret.yaml before decision 179: its database password (and
    // AWS keys).
    "e2186dbdb1bb4193608605e84f33208765b5693b55edd4f730a719a100eeea6f",
    // deploy/kubernetes/secret.yaml since decision 179: the placeholder of every value.
    "8f40e201fb42ef15350e408d21c92642e918cc538feaf4044709c2a3ecdd5d6d",
];

/// The digest a value is listed under. Trailing `=` go first: a base64 key decodes to
/// the same bytes with or without its padding, and `ORDERD_RESPONSE_KEYS` takes both.
pub fn digest(value: &str) -> String {
    hex::encode(Sha256::digest(value.trim_end_matches('=').as_bytes()))
}

/// Whether `value` is one of the published values.
pub fn is_published(value: &str) -> bool {
    !value.is_empty() && PUBLISHED.contains(&digest(value).as_str())
}

/// Stops a process whose secret setting `s` holds a published value anywhere in it.
/// Settings of any other kind, and unset ones, pass.
pub fn refuse(env: &Env<'_>, s: &Setting) -> Result<(), ConfigError> {
    if !matches!(s.kind, Kind::Secret) {
        return Ok(());
    }
    let Some(value) = env.text(s) else {
        return Ok(());
    };
    let Some(item) = published_item(&value) else {
        return Ok(());
    };
    let which = match item {
        Some(n) => format!("{}: item {n}", s.name),
        None => s.name.to_string(),
    };
    Err(ConfigError::new(format!(
        "{which} holds a value published in orderd's own examples (the manifests, the README, \
         the docs), which anyone can use: make one of your own (docs/operations.md, \
         \"Making secrets\")"
    )))
}

/// Where `value` holds a published value: `Some(None)` for the whole of it (or its one
/// item), `Some(Some(n))` for its comma-separated item `n` (from 1), `None` nowhere.
fn published_item(value: &str) -> Option<Option<usize>> {
    if is_published(value.trim()) {
        return Some(None);
    }
    let items: Vec<&str> = value.split(',').collect();
    let many = items.len() > 1;
    items.iter().enumerate().find_map(|(i, item)| {
        pieces(item)
            .any(is_published)
            .then_some(many.then_some(i + 1))
    })
}

/// What in one comma-separated item may be a secret of its own, whatever the setting's
/// format: the item, what follows its first `:` (`id:key`) and its first `=`
/// (`name=value`, `host:port=URL`), and a URL's password (`scheme://user:password@`).
/// Pieces that are not secrets (a key id, a property name) can only match a digest of
/// a secret, so reading every format the same way costs no false refusal.
fn pieces(item: &str) -> impl Iterator<Item = &str> {
    let item = item.trim();
    let after = |sep: char| item.split_once(sep).map(|(_, rest)| rest.trim());
    [Some(item), after(':'), after('='), url_password(item)]
        .into_iter()
        .flatten()
}

/// The password of the URL in `text` (`scheme://user:password@host...`), if it has one.
pub fn url_password(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once("://")?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let (user_info, _) = authority.rsplit_once('@')?;
    let (_, password) = user_info.split_once(':')?;
    Some(password).filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const SECRET: Setting = Setting {
        name: "ORDERD_EXAMPLE_SECRET",
        default: None,
        kind: Kind::Secret,
        meaning: "",
    };

    fn refusal(setting: &Setting, value: &str) -> Option<String> {
        let vars = HashMap::from([(setting.name.to_string(), value.to_string())]);
        let lookup = |name: &str| vars.get(name).cloned();
        refuse(&Env::new(&lookup), setting)
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn a_published_value_is_refused_wherever_it_sits_in_the_setting() {
        for value in [
            "REPLACE-ME",
            "  REPLACE-ME ",
            "k1:REPLACE-ME",
            "k1:REPLACE-ME==",
            "sasl.username=orderd,sasl.password=REPLACE-ME",
            "postgres://orderd:REPLACE-ME@db.example:5432/orderd?sslmode=verify-full",
            "10.0.0.5:5432=postgres://orderd:REPLACE-ME@worker-1:6432/orderd",
        ] {
            let err = refusal(&SECRET, value).unwrap_or_else(|| panic!("{value} started"));
            assert!(err.starts_with("ORDERD_EXAMPLE_SECRET"), "{err}");
            assert!(err.contains("docs/operations.md"), "{err}");
            assert!(!err.contains("REPLACE-ME"), "{err}");
        }
    }

    #[test]
    fn the_refusal_names_the_item_of_a_list() {
        let own = "an-hs256-secret-of-our-own-32-bytes-long";
        let err = refusal(&SECRET, &format!("{own},REPLACE-ME")).unwrap();
        assert!(
            err.starts_with("ORDERD_EXAMPLE_SECRET: item 2 holds"),
            "{err}"
        );
        assert_eq!(refusal(&SECRET, own), None);
    }

    #[test]
    fn values_of_ones_own_and_settings_that_are_not_secret_pass() {
        for value in [
            "postgres://orderd@db.example/orderd",
            "postgres://orderd:a-password-of-our-own@db.example/orderd",
            "security.protocol=SASL_SSL,sasl.mechanism=PLAIN",
            // A published value inside a longer one is another value.
            "REPLACE-ME-with-something-else",
        ] {
            assert_eq!(refusal(&SECRET, value), None, "{value}");
        }
        let text = Setting {
            kind: Kind::Text,
            ..SECRET
        };
        assert_eq!(refusal(&text, "REPLACE-ME"), None);
    }

    #[test]
    fn a_url_password_is_read_as_a_client_would() {
        assert_eq!(url_password("postgres://u:p@h/db"), Some("p"));
        assert_eq!(url_password("postgres://u:p:q@h:5432"), Some("p:q"));
        assert_eq!(url_password("postgres://u@h/db"), None);
        assert_eq!(url_password("postgres://h/db?user=u@x"), None);
        assert_eq!(url_password("postgres://u:@h/db"), None);
        assert_eq!(url_password("not a url"), None);
    }
}
