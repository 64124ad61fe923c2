//! Spec durations written either as whole seconds (`60`) or with a unit (`60s`, `5m`, `2h`,
//! `1d`): `lease: 60s` reads as it is meant. Stored and sent as whole seconds, so that readers
//! of the JSON form see one type.

use serde::{Deserialize, Deserializer};

/// Seconds in `text`: a whole number followed by an optional unit (`s`, `m`, `h`, `d`).
pub fn parse(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (a whole number, then s, m, h or d)"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => {
            return Err(format!(
                "`{other}` in `{text}` is not a unit (s, m, h or d)"
            ))
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is too long"))
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
            Written::Seconds(seconds) => Ok(Self(seconds)),
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
        assert!(parse("1.5m").unwrap_err().contains("not a unit"));
        assert!(parse("m").unwrap_err().contains("not a duration"));
        assert!(parse("10 minutes").is_err());
        assert!(parse("99999999999999999999d").is_err());
    }
}
