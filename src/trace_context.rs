//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the `traceparent` and
//! `tracestate` a caller sends, kept with the events its write causes so that the
//! consumer of an event continues the caller's trace.
//!
//! As the recommendation says, a `traceparent` that does not parse is ignored (and its
//! `tracestate` with it), never refused: tracing must not break a request. Only the
//! fields of version `00` are kept; a later version is read as far as `00` defines it.

use http::HeaderMap;

/// Longest `tracestate` kept: the recommendation's 32 list members of at most 256
/// characters would be 8 KiB; vendors propagate at least 512 characters, and a longer
/// one is dropped rather than truncated mid-member.
pub const MAX_TRACESTATE_LEN: usize = 512;

/// A caller's trace context, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `00-<trace-id>-<parent-id>-<flags>`, lowercase hex, as received (for version
    /// `00`) or cut to the version-`00` fields (for a later version).
    pub traceparent: String,
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The context of a request's headers, if its `traceparent` is valid.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let mut parents = headers.get_all("traceparent").iter();
        let parent = parents.next()?.to_str().ok()?;
        if parents.next().is_some() {
            return None; // more than one: which would be the caller's?
        }
        let traceparent = parse_traceparent(parent)?;
        let tracestate = tracestate(headers);
        Some(Self {
            traceparent,
            tracestate,
        })
    }

    /// The trace id (32 hex digits).
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The context as OpenTelemetry's remote parent.
    pub fn span_context(&self) -> Option<opentelemetry::trace::SpanContext> {
        use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
        let flags = u8::from_str_radix(&self.traceparent[53..55], 16).ok()?;
        let state = match &self.tracestate {
            Some(state) => state.parse::<TraceState>().ok()?,
            None => TraceState::default(),
        };
        Some(SpanContext::new(
            TraceId::from_hex(self.trace_id()).ok()?,
            SpanId::from_hex(&self.traceparent[36..52]).ok()?,
            TraceFlags::new(flags),
            true,
            state,
        ))
    }

    /// The context of a stored event (its `traceparent` and `tracestate` columns).
    pub fn from_stored(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        Some(Self {
            traceparent: parse_traceparent(traceparent?)?,
            tracestate: tracestate.map(str::to_string),
        })
    }
}

/// A valid `traceparent` in version-`00` form, or `None`.
fn parse_traceparent(value: &str) -> Option<String> {
    let value = value.trim_matches([' ', '\t']);
    let bytes = value.as_bytes();
    let lower_hex = |part: &[u8]| {
        part.iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    if bytes.len() < 55 || !lower_hex(&bytes[..2]) || bytes[2] != b'-' {
        return None;
    }
    let version = &value[..2];
    if version == "ff" || (version == "00" && bytes.len() != 55) {
        return None;
    }
    // A later version may append fields, after a dash.
    if bytes.len() > 55 && bytes[55] != b'-' {
        return None;
    }
    let (trace_id, parent_id, flags) = (&bytes[3..35], &bytes[36..52], &bytes[53..55]);
    let separated = bytes[35] == b'-' && bytes[52] == b'-';
    let all_zero = |part: &[u8]| part.iter().all(|&b| b == b'0');
    if !separated
        || !lower_hex(trace_id)
        || !lower_hex(parent_id)
        || !lower_hex(flags)
        || all_zero(trace_id)
        || all_zero(parent_id)
    {
        return None;
    }
    Some(format!("00-{}", &value[3..55]))
}

/// The `tracestate` header(s), combined as one list, if every member is well-formed and
/// the whole fits [`MAX_TRACESTATE_LEN`].
fn tracestate(headers: &HeaderMap) -> Option<String> {
    let mut members = Vec::new();
    for value in headers.get_all("tracestate") {
        for member in value.to_str().ok()?.split(',') {
            let member = member.trim_matches([' ', '\t']);
            if member.is_empty() {
                continue;
            }
            let (key, value) = member.split_once('=')?;
            let key_ok = tracestate_key(key);
            let value_ok = !value.is_empty()
                && value.len() <= 256
                && value
                    .bytes()
                    .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
                && !value.ends_with(' ');
            if !key_ok || !value_ok {
                return None;
            }
            members.push(member);
        }
    }
    let joined = members.join(",");
    (!joined.is_empty() && joined.len() <= MAX_TRACESTATE_LEN && members.len() <= 32)
        .then_some(joined)
}

/// A `tracestate` key as W3C Trace Context defines it: a simple key (a lowercase
/// letter, then up to 255 of `a-z0-9_-*/`), or a multi-tenant one, `tenant@system`
/// (the tenant a lowercase letter or a digit, then up to 240 of those; the system a
/// lowercase letter, then up to 12: the recommendation allows 13, OpenTelemetry's SDK
/// one fewer). A key either refuses is not passed on: a downstream SDK would drop the
/// whole context over it.
fn tracestate_key(key: &str) -> bool {
    fn part(part: &str, first: fn(u8) -> bool, max: usize) -> bool {
        let rest = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/".contains(&b);
        matches!(part.as_bytes(), [head, tail @ ..] if first(*head) && tail.len() < max && tail.iter().all(|b| rest(*b)))
    }
    let letter = |b: u8| b.is_ascii_lowercase();
    let letter_or_digit = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match key.split_once('@') {
        None => part(key, letter, 256),
        Some((tenant, system)) => part(tenant, letter_or_digit, 241) && part(system, letter, 13),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn tracestate_keys_follow_the_recommendation() {
        for good in [
            "k",
            "vendor",
            "a1_-*/",
            "t@vendor",
            "1t@v",
            "t@abcdefghijklm",
        ] {
            assert!(tracestate_key(good), "{good}");
        }
        // Fuzzing found these kept though the recommendation (or, for a system of 14,
        // OpenTelemetry) refuses them.
        for bad in [
            "",
            "_k",
            "K",
            "t@1vendor",
            "t@abcdefghijklmn",
            "k@",
            "@v",
            "a@b@c",
        ] {
            assert!(!tracestate_key(bad), "{bad}");
        }
        assert!(tracestate_key(&"k".repeat(256)));
        assert!(!tracestate_key(&"k".repeat(257)));
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_valid_traceparent_is_kept_with_its_tracestate() {
        let context = TraceContext::from_headers(&headers(&[
            ("traceparent", VALID),
            ("tracestate", "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"),
        ]))
        .unwrap();
        assert_eq!(context.traceparent, VALID);
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            context.tracestate.as_deref(),
            Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        );
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
        ] {
            let found = TraceContext::from_headers(&headers(&[("traceparent", bad)]));
            assert_eq!(found, None, "{bad:?}");
        }
        let twice = headers(&[("traceparent", VALID), ("traceparent", VALID)]);
        assert_eq!(TraceContext::from_headers(&twice), None);
    }

    #[test]
    fn a_later_version_is_read_as_version_00() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        let context = TraceContext::from_headers(&headers(&[("traceparent", later)])).unwrap();
        assert_eq!(context.traceparent, VALID);
    }

    #[test]
    fn a_malformed_or_oversized_tracestate_is_dropped_and_the_parent_kept() {
        for bad in [
            "no-equals-sign".to_string(),
            "Upper=1".to_string(),
            "k=bad,value".to_string(),
            format!("k={}", "v".repeat(600)),
        ] {
            let context = TraceContext::from_headers(&headers(&[
                ("traceparent", VALID),
                ("tracestate", &bad),
            ]))
            .unwrap();
            assert_eq!(context.tracestate, None, "{bad}");
        }
    }
}
