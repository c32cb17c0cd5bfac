//! The machinery of settings read from the environment; the settings themselves are
//! declared by the modules that own them.
//!
//! A module declares its settings with [`settings!`](settings): one row per
//! setting (its field, the parser, the variable, its default, its range and its
//! meaning), from which come a [`Setting`] constant (for start-up errors and the
//! docs/configuration.md's table), the field of a typed struct, and the function that reads and checks
//! it. `app::Config` puts the owners' structs together. A missing, malformed or
//! out-of-range value stops the process at start with one line naming the variable, and
//! so does a secret that the repository's own examples publish ([`published`]);
//! secrets are wrapped in [`Secret`] so no `Debug` output or log line can print them.
//!
//! This module is a leaf: it imports nothing from the rest of the crate.

use std::{fmt, net::SocketAddr, str::FromStr, time::Duration};

#[cfg(test)]
pub(crate) mod examples;
pub mod published;

/// What values a setting takes.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// Free text.
    Text,
    /// Free text that must never be printed.
    Secret,
    /// `on`/`off` (also `true`/`false`, `1`/`0`, `yes`/`no`).
    Switch,
    /// `host:port`, or `:port` for loopback.
    Bind,
    /// A whole number within the bounds (inclusive).
    Number { min: u64, max: u64 },
    /// One of a fixed list of words.
    Choice(&'static [&'static str]),
}

/// One environment variable.
#[derive(Debug)]
pub struct Setting {
    pub name: &'static str,
    /// The value used when the variable is unset or empty; `None`: no value.
    pub default: Option<&'static str>,
    pub kind: Kind,
    pub meaning: &'static str,
}

/// A number setting's bounds, inclusive.
pub const fn range(min: u64, max: u64) -> Kind {
    Kind::Number { min, max }
}

/// Declares a module's settings as a struct, one row per setting:
///
/// ```text
/// settings! {
///     /// Doc of the struct.
///     pub struct LimitsConfig {
///         /// Doc of the field.
///         burst: u32 = number(BURST, "ORDERD_BURST", Some("10"), range(1, 100), "what it means"),
///     }
///     check = LimitsConfig::check;   // optional: rules across fields
/// }
/// ```
///
/// makes `pub const BURST: Setting`, the struct with a `pub burst: u32`, its
/// `SETTINGS` (in row order) and `read(&Env) -> Result<Self, ConfigError>`, which
/// refuses a secret setting that holds a value the repository's examples publish
/// ([`published`]), parses each field with its parser (a function `(&Env, &Setting) ->
/// Result<T, ConfigError>`, such as those of [`parse`]) and then runs the check.
macro_rules! settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                $field:ident: $ty:ty = $parse:path
                    [$id:ident, $var:literal, $default:expr, $kind:expr, $meaning:literal],
            )*
        }
        $(check = $check:path;)?
    ) => {
        $(
            pub const $id: $crate::config::Setting = $crate::config::Setting {
                name: $var,
                default: $default,
                kind: $kind,
                meaning: $meaning,
            };
        )*

        $(#[$meta])*
        #[derive(Clone, Debug)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $name {
            /// This struct's settings, in the order docs/configuration.md lists them.
            pub const SETTINGS: &'static [&'static $crate::config::Setting] = &[$(&$id),*];

            /// Reads and checks every setting of this struct.
            pub fn read(
                env: &$crate::config::Env<'_>,
            ) -> ::std::result::Result<Self, $crate::config::ConfigError> {
                // Before any parser: an example's placeholder is named as published,
                // not as malformed, and no owner can forget the check.
                $( $crate::config::published::refuse(env, &$id)?; )*
                let value = Self { $( $field: $parse(env, &$id)?, )* };
                $( $check(&value)?; )?
                Ok(value)
            }
        }
    };
}

pub(crate) use settings;

/// The configuration table of docs/configuration.md, for `settings` in order.
pub fn markdown_table(settings: &[&Setting]) -> String {
    let mut out = String::from("| variable | default | range | meaning |\n|---|---|---|---|\n");
    for s in settings {
        let default = match s.default {
            Some(d) => format!("`{d}`"),
            None => "none".into(),
        };
        let range = match s.kind {
            Kind::Number { min, max } => format!("{min} to {max}"),
            Kind::Switch => "`on`, `off`".into(),
            Kind::Choice(words) => words
                .iter()
                .map(|w| format!("`{w}`"))
                .collect::<Vec<_>>()
                .join(", "),
            Kind::Bind => "`host:port`".into(),
            Kind::Text | Kind::Secret => String::new(),
        };
        out.push_str(&format!(
            "| `{}` | {default} | {range} | {} |\n",
            s.name, s.meaning
        ));
    }
    out
}

/// A value that must never reach a log line.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The only way to read the value: callers that do so are easy to grep for.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A start-up configuration error; its message names the variable.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ConfigError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// The listen address with the `:PORT` shorthand ("that port on loopback") expanded.
pub fn bind_address(bind: &str) -> String {
    if bind.starts_with(':') {
        format!("127.0.0.1{bind}")
    } else {
        bind.to_string()
    }
}

/// Reads settings through a lookup function (the process environment, or a map in
/// tests), applying each setting's default and kind.
pub struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl<'a> Env<'a> {
    pub fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Self(lookup)
    }

    /// The set, non-empty value, else the default.
    pub fn text(&self, s: &Setting) -> Option<String> {
        (self.0)(s.name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .or_else(|| s.default.map(String::from))
    }

    /// A number within the setting's bounds.
    pub fn number(&self, s: &Setting) -> Result<u64, ConfigError> {
        let Kind::Number { min, max } = s.kind else {
            unreachable!("{} is not a number setting", s.name)
        };
        let raw = self.text(s).unwrap_or_default();
        match raw.parse::<u64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(v),
            _ => Err(ConfigError::new(format!(
                "{} must be a whole number from {min} to {max}, not `{raw}`",
                s.name
            ))),
        }
    }

    pub fn switch(&self, s: &Setting) -> Result<bool, ConfigError> {
        let value = self.text(s).unwrap_or_default().to_ascii_lowercase();
        match value.as_str() {
            "on" | "true" | "1" | "yes" => Ok(true),
            "off" | "false" | "0" | "no" => Ok(false),
            _ => Err(ConfigError::new(format!(
                "{} must be `on` or `off`, not `{value}`",
                s.name
            ))),
        }
    }

    /// One of the setting's words.
    pub fn choice(&self, s: &Setting) -> Result<String, ConfigError> {
        let Kind::Choice(words) = s.kind else {
            unreachable!("{} is not a choice setting", s.name)
        };
        let value = self.text(s).unwrap_or_default();
        if words.contains(&value.as_str()) {
            Ok(value)
        } else {
            Err(ConfigError::new(format!(
                "{} must be one of {}, not `{value}`",
                s.name,
                words.join(", ")
            )))
        }
    }

    pub fn bind(&self, s: &Setting) -> Result<String, ConfigError> {
        let value = self.text(s).unwrap_or_default();
        SocketAddr::from_str(&bind_address(&value))
            .map(|_| value.clone())
            .map_err(|_| ConfigError::new(format!("{} must be host:port, not `{value}`", s.name)))
    }
}

/// The parsers a row of [`settings!`](settings) names; a module with a format of
/// its own writes its parser beside its settings.
pub mod parse {
    use super::*;

    type Parsed<T> = Result<T, ConfigError>;

    /// Standard base64 with or without its padding, as people paste keys: what
    /// `ORDERD_RESPONSE_KEYS` takes, and what the examples' check looks for.
    pub fn base64_any_padding() -> base64::engine::GeneralPurpose {
        use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
        GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
        )
    }

    /// Text, or `None` when unset and without default.
    pub fn text(env: &Env<'_>, s: &Setting) -> Parsed<Option<String>> {
        Ok(env.text(s))
    }

    /// Text that must be set.
    pub fn required_secret(env: &Env<'_>, s: &Setting) -> Parsed<Secret> {
        env.text(s)
            .map(Secret::new)
            .ok_or_else(|| ConfigError::new(format!("{} is required", s.name)))
    }

    /// A secret, or `None`.
    pub fn secret(env: &Env<'_>, s: &Setting) -> Parsed<Option<Secret>> {
        Ok(env.text(s).map(Secret::new))
    }

    /// A comma-separated list; blank items dropped.
    pub fn list(env: &Env<'_>, s: &Setting) -> Parsed<Vec<String>> {
        Ok(env
            .text(s)
            .unwrap_or_default()
            .split(',')
            .map(|item| item.trim().to_string())
            .filter(|item| !item.is_empty())
            .collect())
    }

    /// A number, as the field's type (every bound fits a `u32`: a unit test checks).
    pub fn number<T: TryFrom<u64>>(env: &Env<'_>, s: &Setting) -> Parsed<T> {
        let v = env.number(s)?;
        T::try_from(v).map_err(|_| ConfigError::new(format!("{} is too large", s.name)))
    }

    /// A number of milliseconds.
    pub fn millis(env: &Env<'_>, s: &Setting) -> Parsed<Duration> {
        env.number(s).map(Duration::from_millis)
    }

    /// A number of seconds.
    pub fn secs(env: &Env<'_>, s: &Setting) -> Parsed<Duration> {
        env.number(s).map(Duration::from_secs)
    }

    /// A number of seconds where `0` means "off".
    pub fn secs_or_off(env: &Env<'_>, s: &Setting) -> Parsed<Option<Duration>> {
        Ok(Some(secs(env, s)?).filter(|d| !d.is_zero()))
    }

    pub fn switch(env: &Env<'_>, s: &Setting) -> Parsed<bool> {
        env.switch(s)
    }

    /// Whether a choice setting is its last word (`serve`/`refuse`, `text`/`json`).
    pub fn last_choice(env: &Env<'_>, s: &Setting) -> Parsed<bool> {
        let Kind::Choice(words) = s.kind else {
            unreachable!("{} is not a choice setting", s.name)
        };
        Ok(Some(env.choice(s)?.as_str()) == words.last().copied())
    }

    pub fn bind(env: &Env<'_>, s: &Setting) -> Parsed<String> {
        env.bind(s)
    }

    /// A listen address, or `None` when unset.
    pub fn optional_bind(env: &Env<'_>, s: &Setting) -> Parsed<Option<String>> {
        match env.text(s) {
            Some(_) => env.bind(s).map(Some),
            None => Ok(None),
        }
    }
}
