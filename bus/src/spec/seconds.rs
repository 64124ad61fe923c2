//! Spec durations written either as whole seconds (`60`) or with a unit (`60s`, `5m`, `2h`,
//! `1d`): `lease: 60s` reads as it is meant. Stored and sent as whole seconds, so that readers
//! of the JSON form see one type. The text is read by [`crate::duration`], ax's one reader of
//! durations.

use serde::{Deserialize, Deserializer};

/// Seconds in `text`: a whole number followed by an optional unit (`ms`, `s`, `m`, `h`, `d`),
/// read by the one duration reader ([`crate::duration`]) with its ceiling.
pub fn parse(text: &str) -> Result<u64, String> {
    crate::duration::parse_seconds(text.trim()).map_err(|e| e.to_string())
}

/// A duration as written: whole seconds or text with a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seconds(pub u64);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Seconds(u64),
            Text(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Seconds(seconds) => crate::duration::within_ceiling(seconds)
                .map(Self)
                .map_err(serde::de::Error::custom),
            Written::Text(text) => parse(&text).map(Self).map_err(serde::de::Error::custom),
        }
    }
}

/// Deserializes a map whose values are durations given as seconds or as text with a unit.
pub fn map<'de, D: Deserializer<'de>, K: Deserialize<'de> + Ord>(
    deserializer: D,
) -> Result<std::collections::BTreeMap<K, u64>, D::Error> {
    Ok(
        std::collections::BTreeMap::<K, Seconds>::deserialize(deserializer)?
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect(),
    )
}

/// Deserializes an optional duration given as seconds or as text with a unit.
pub fn optional<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    Ok(Option::<Seconds>::deserialize(deserializer)?.map(|s| s.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_units() {
        assert_eq!(parse("60"), Ok(60));
        assert_eq!(parse("60s"), Ok(60));
        assert_eq!(parse("5m"), Ok(300));
        assert_eq!(parse("2h"), Ok(7200));
        assert_eq!(parse("1d"), Ok(86_400));
        assert!(parse("1.5m").unwrap_err().contains("not a duration"));
        assert!(parse("m").unwrap_err().contains("not a duration"));
        assert!(parse("213504d").unwrap_err().contains("longer than 36500d"));
        assert!(parse("10 minutes").is_err());
        assert!(parse("99999999999999999999d").is_err());
    }
}
