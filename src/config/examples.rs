//! Every secret-like value in the repository's examples, for the test that each is
//! refused at start (decision 179). What counts as secret-like:
//!
//! - a literal given to a secret setting, in any syntax the examples use: `NAME=value`
//!   (shell, `.env`, `-e`), `NAME: "value"` (YAML, JSON, JavaScript), `"NAME" =>
//!   Some("value")` (Rust), `NAME || 'value'` (a JavaScript default), and a Kubernetes
//!   `env` entry (`- name: NAME` with `value:` below it). Of the value, the parts that are
//!   secrets: each comma-separated item; a key's material after its `id:`; a URL's
//!   password; the value of a `name=value` property whose name says password, secret or
//!   private key;
//! - a literal of 16 characters or more given the same ways to another name that says
//!   SECRET, PASSWORD, PASSWD or TOKEN (any case), or KEY (an upper-case name such as
//!   `AWS_SECRET_ACCESS_KEY`);
//! - an `id:base64` string whose base64 is 32 bytes, wherever it stands.
//!
//! Not literals, so not gathered: shell and template expansions (`$(...)`, `$VAR`,
//! `${...}`) and ellipses (`...`, `…`), which the docs use for "your value here".

use std::path::Path;

/// One secret-like value and where it stands.
#[derive(Debug)]
pub struct Found {
    /// The file, relative to the repository's root.
    pub file: String,
    pub line: usize,
    /// The name it is given to.
    pub name: String,
    /// The whole value as written.
    pub value: String,
    /// Its parts that are secrets (never empty).
    pub secrets: Vec<String>,
}

/// Where the repository keeps its examples: the manifests and the container files, the
/// README, every document, the k6 scripts, `examples/`, and any `.env` file at the top.
const PLACES: &[&str] = &["deploy", "README.md", "docs", "k6", "examples"];

/// Every secret-like value in the examples under `root`; `secret_settings` are the
/// names of the settings declared [`Kind::Secret`](super::Kind::Secret).
pub fn gather(root: &Path, secret_settings: &[&str]) -> Vec<Found> {
    let mut files = Vec::new();
    for place in PLACES {
        collect(&root.join(place), &mut files);
    }
    for entry in std::fs::read_dir(root).expect("the repository's root is readable") {
        let path = entry.expect("the root lists").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with(".env") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    let mut found = Vec::new();
    for path in files {
        // A file that is not UTF-8 text (an image) holds no example to copy.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let file = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .to_string_lossy()
            .to_string();
        found.extend(scan(&file, &text, secret_settings));
    }
    found
}

fn collect(path: &Path, files: &mut Vec<std::path::PathBuf>) {
    if path.is_file() {
        files.push(path.to_path_buf());
    } else if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            collect(&entry.path(), files);
        }
    }
}

/// The secret-like values in `text`, the content of `file`.
pub fn scan(file: &str, text: &str, secret_settings: &[&str]) -> Vec<Found> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let mut here: Vec<(&str, String, Vec<String>)> = Vec::new();
        for (name, value) in assignments(line, &lines[n + 1..]) {
            if secret_settings.contains(&name) {
                let secrets = secrets_of(&value);
                here.push((name, value, secrets));
            } else if says_secret(name) && value.chars().count() >= 16 && is_literal(&value) {
                here.push((name, value.clone(), vec![value]));
            }
        }
        for key in response_keys(line) {
            if !here
                .iter()
                .any(|(_, _, secrets)| secrets.iter().any(|s| s == key))
            {
                here.push(("an `id:base64` key", key.to_string(), vec![key.to_string()]));
            }
        }
        found.extend(
            here.into_iter()
                .filter(|(_, _, secrets)| !secrets.is_empty())
                .map(|(name, value, secrets)| Found {
                    file: file.to_string(),
                    line: n + 1,
                    name: name.to_string(),
                    value,
                    secrets,
                }),
        );
    }
    found
}

/// `(name, literal)` for each value given to a name on `line` (`rest`: the lines after
/// it, where a Kubernetes `env` entry keeps its `value:`). An unquoted value counts
/// only right after `NAME=` (shell, `.env`) or a key that starts its line (YAML);
/// anywhere else a value in code is quoted, and an unquoted one is an expression.
fn assignments<'a>(line: &'a str, rest: &[&'a str]) -> Vec<(&'a str, String)> {
    let mut out = Vec::new();
    let trimmed = line.trim_start().trim_start_matches("- ").trim_start();
    let key_at = line.len() - trimmed.len();
    if let Some(name) = trimmed.strip_prefix("name:") {
        let name = name.trim().trim_matches(['"', '\'']);
        if is_name(name) {
            let value = rest
                .iter()
                .take_while(|l| !l.trim_start().starts_with('-'))
                .take(3)
                .find_map(|l| l.trim_start().strip_prefix("value:"))
                .and_then(|v| literal(v.trim_start()));
            if let Some(value) = value {
                out.push((name, value));
            }
        }
    }
    let bytes = line.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        if !is_name_byte(bytes[start]) || (start > 0 && continues_a_name(bytes[start - 1])) {
            start += 1;
            continue;
        }
        let end = start
            + bytes[start..]
                .iter()
                .take_while(|&&b| is_name_byte(b))
                .count();
        let name = &line[start..end];
        let after = line[end..]
            .strip_prefix(['"', '\''])
            .unwrap_or(&line[end..]);
        let spaced = after.trim_start();
        let key_of_line =
            start == key_at || (start == key_at + 1 && trimmed.starts_with(['"', '\'']));
        let quoted = |v: &str| {
            let v = v.trim_start();
            literal(v).filter(|_| v.starts_with(['"', '\'', '`']))
        };
        let value = if let Some(v) = spaced.strip_prefix("=>") {
            let v = v.trim_start();
            quoted(v.strip_prefix("Some(").unwrap_or(v))
        } else if let Some(v) = after.strip_prefix('=').filter(|v| !v.starts_with('=')) {
            literal(v)
        } else if let Some(v) = spaced.strip_prefix('=').filter(|v| !v.starts_with('=')) {
            quoted(v)
        } else if let Some(v) = spaced
            .strip_prefix("||")
            .or_else(|| spaced.strip_prefix("??"))
        {
            quoted(v)
        } else if let Some(v) = spaced.strip_prefix(':') {
            if key_of_line {
                literal(v.trim_start())
            } else {
                quoted(v)
            }
        } else {
            None
        };
        if let Some(value) = value {
            out.push((name, value));
        }
        start = end;
    }
    out
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// A name continues across a hyphen (`Idempotency-Key`): what follows one is not a name
/// of its own.
fn continues_a_name(b: u8) -> bool {
    is_name_byte(b) || b == b'-'
}

fn is_name(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(is_name_byte)
}

/// The value at the start of `text`: quoted, or up to the first space or delimiter;
/// `None` when it is empty. Its parts are judged literal or not by the caller.
fn literal(text: &str) -> Option<String> {
    let value = match text.chars().next()? {
        quote @ ('"' | '\'' | '`') => text[1..].split(quote).next()?,
        _ => {
            let end = text
                .find(|c: char| c.is_whitespace() || "`;)|&\"'".contains(c))
                .unwrap_or(text.len());
            &text[..end]
        }
    };
    Some(value.to_string()).filter(|v| !v.is_empty())
}

/// Not empty, not an expansion, not an ellipsis.
fn is_literal(value: &str) -> bool {
    !value.is_empty() && !value.contains('$') && !value.contains("...") && !value.contains('…')
}

/// Whether another name says it holds a secret.
fn says_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["SECRET", "PASSWORD", "PASSWD", "TOKEN"]
        .iter()
        .any(|word| upper.contains(word))
        || (upper == name && upper.contains("KEY"))
}

/// The parts of a secret setting's value that are secrets.
fn secrets_of(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if item.contains("://") {
            out.extend(super::published::url_password(item).map(String::from));
        } else if let Some((name, v)) = item.split_once('=').filter(|(n, _)| is_property(n)) {
            if ["password", "secret", "key.pem", "ssl_key"]
                .iter()
                .any(|word| name.contains(word))
            {
                out.push(v.to_string());
            }
        } else if let Some((_, key)) = item.split_once(':').filter(|(id, _)| is_key_id(id)) {
            out.push(key.trim().to_string());
        } else {
            out.push(item.to_string());
        }
    }
    out.retain(|s| is_literal(s));
    out
}

/// A producer property's name (`sasl.password`, `ssl_key`).
fn is_property(name: &str) -> bool {
    name.contains(['.', '_'])
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

/// A response key's id, as `ORDERD_RESPONSE_KEYS` takes it.
fn is_key_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The key material of each `id:base64-of-32-bytes` on `line`.
fn response_keys(line: &str) -> Vec<&str> {
    use base64::Engine;
    let lenient = crate::config::parse::base64_any_padding();
    line.split(|c: char| !(c.is_ascii_alphanumeric() || "+/=:._-".contains(c)))
        .filter_map(|word| word.split_once(':'))
        .filter(|(id, key)| {
            is_key_id(id) && lenient.decode(key).is_ok_and(|bytes| bytes.len() == 32)
        })
        .map(|(_, key)| key)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: &[&str] = &[
        "ORDERD_JWT_HS256_SECRET",
        "ORDERD_RESPONSE_KEYS",
        "DATABASE_URL",
        "ORDERD_KAFKA_CONFIG",
    ];
    const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn secrets(text: &str) -> Vec<String> {
        scan("x", text, NAMES)
            .into_iter()
            .flat_map(|f| f.secrets)
            .collect()
    }

    #[test]
    fn a_literal_given_to_a_secret_is_found_in_every_syntax_the_examples_use() {
        for (text, expected) in [
            (
                "export ORDERD_JWT_HS256_SECRET=some-new-literal",
                "some-new-literal",
            ),
            (
                "ORDERD_JWT_HS256_SECRET=\"quoted literal\" orderd serve",
                "quoted literal",
            ),
            (
                "podman run -e ORDERD_JWT_HS256_SECRET=abc123 image",
                "abc123",
            ),
            ("`ORDERD_JWT_HS256_SECRET=in-prose`", "in-prose"),
            ("  ORDERD_JWT_HS256_SECRET: \"yaml-value\"", "yaml-value"),
            ("  ORDERD_JWT_HS256_SECRET: plain-yaml", "plain-yaml"),
            (
                "{\"ORDERD_JWT_HS256_SECRET\": \"json-value\"}",
                "json-value",
            ),
            ("  ORDERD_JWT_HS256_SECRET: 'js-value',", "js-value"),
            (
                "__ENV.ORDERD_JWT_HS256_SECRET || 'js-default'",
                "js-default",
            ),
            (
                "\"ORDERD_JWT_HS256_SECRET\" => Some(\"rust-value\".into()),",
                "rust-value",
            ),
            (
                "- name: ORDERD_JWT_HS256_SECRET\n  value: \"env-entry\"",
                "env-entry",
            ),
            ("DATABASE_URL: \"postgres://u:pw-in-url@h/db\"", "pw-in-url"),
            (
                "ORDERD_KAFKA_CONFIG=security.protocol=SASL_SSL,sasl.password=kafka-pw",
                "kafka-pw",
            ),
            (
                "AWS_SECRET_ACCESS_KEY: \"a-long-enough-aws-secret\"",
                "a-long-enough-aws-secret",
            ),
            (
                "const secret = 'a-long-enough-js-secret';",
                "a-long-enough-js-secret",
            ),
        ] {
            assert_eq!(secrets(text), [expected], "{text}");
        }
        assert_eq!(
            secrets(&format!("ORDERD_RESPONSE_KEYS=k2:{KEY},k1:old-key")),
            [KEY, "old-key"]
        );
        assert_eq!(secrets(&format!("a key in prose: `k1:{KEY}`")), [KEY]);
        assert_eq!(secrets("ORDERD_JWT_HS256_SECRET=NEW,OLD"), ["NEW", "OLD"]);
    }

    #[test]
    fn expansions_ellipses_prose_and_values_without_a_secret_are_not_gathered() {
        for text in [
            "export ORDERD_JWT_HS256_SECRET=\"$(head -c 32 /dev/urandom | base64)\"",
            "-e ORDERD_JWT_HS256_SECRET=\"$CONTAINER_SECRET\"",
            "k6 run -e ORDERD_JWT_HS256_SECRET=... k6/race.js",
            "ORDERD_RESPONSE_KEYS=\"k1:$(head -c 32 /dev/urandom | base64)\"",
            "  ORDERD_RESPONSE_KEYS: \"\"",
            "`ORDERD_JWT_HS256_SECRET`: the secret tokens are signed with",
            "set ORDERD_JWT_HS256_SECRET, then restart",
            "export DATABASE_URL=postgres://orderd@pgbouncer:6432/orderd",
            "DATABASE_URL=postgres://...@coordinator/orderd orderd migrate",
            "`10.0.0.5:5432=postgres://orderd:…@worker-1.example:6432/orderd`",
            "ORDERD_KAFKA_CONFIG=security.protocol=SASL_SSL,sasl.mechanism=PLAIN",
            "-H 'Idempotency-Key: readme-example-key-0001'",
            "AWS_SECRET_ACCESS_KEY=test",
            "const secret = (__ENV.ORDERD_JWT_HS256_SECRET || '').split(',')[0];",
            "sha256:4fddb2f202cd27afc7e5aeda6cd753c5fc2e04e93dc4fddb2f202cd27afc7e5ae",
        ] {
            assert_eq!(secrets(text), Vec::<String>::new(), "{text}");
        }
    }
}
