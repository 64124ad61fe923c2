//! The wire encoding: MessagePack with named fields (`rmp_serde::to_vec_named`), marked with
//! `Content-Type: application/msgpack`. Control subjects also accept JSON
//! (`Content-Type: application/json`) so that any service can publish a job with any client.

use async_nats::HeaderMap;
use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};

/// The header that names the encoding.
pub const CONTENT_TYPE: &str = "Content-Type";
/// MessagePack, the default.
pub const MSGPACK: &str = "application/msgpack";
/// JSON, accepted on control subjects.
pub const JSON: &str = "application/json";

/// Why a payload could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The value could not be written as MessagePack.
    #[error("cannot encode message: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    /// The value could not be written as JSON.
    #[error("cannot encode message as json: {0}")]
    EncodeJson(serde_json::Error),
    /// The bytes are not valid MessagePack for the expected type.
    #[error("malformed msgpack payload: {0}")]
    DecodeMsgpack(#[from] rmp_serde::decode::Error),
    /// The bytes are not valid JSON for the expected type.
    #[error("malformed json payload: {0}")]
    DecodeJson(#[from] serde_json::Error),
    /// The Content-Type header names an encoding ax does not speak.
    #[error("unsupported Content-Type `{0}` (use application/msgpack or application/json)")]
    UnsupportedContentType(String),
    /// A request is not a map (a JSON object) at the top.
    #[error("malformed {encoding} payload: a request is a map (a JSON object), not {found}")]
    NotAMap {
        /// `json` or `msgpack`.
        encoding: &'static str,
        /// What it is instead.
        found: &'static str,
    },
    /// A request's field does not decode.
    #[error("malformed {encoding} payload: {}{message}", field_prefix(path))]
    Field {
        /// `json` or `msgpack`.
        encoding: &'static str,
        /// Where, as `jobs[0].job.name` (`.` for the whole request).
        path: String,
        /// Why.
        message: String,
    },
}

/// `` `path`: `` for a field, nothing for the whole request.
fn field_prefix(path: &str) -> String {
    if path == "." || path.is_empty() {
        String::new()
    } else {
        format!("`{path}`: ")
    }
}

/// Encodes `value` as MessagePack with named fields.
pub fn encode<T: Serialize>(value: &T) -> Result<Bytes, CodecError> {
    Ok(Bytes::from(rmp_serde::to_vec_named(value)?))
}

/// Headers announcing MessagePack.
pub fn msgpack_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, MSGPACK);
    headers
}

/// Decodes MessagePack.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
    Ok(rmp_serde::from_slice(payload)?)
}

/// The two encodings ax speaks, told apart by a message's Content-Type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// MessagePack with named fields: the default, and what no Content-Type means.
    MsgPack,
    /// JSON, taken on the control and request subjects and answered in kind.
    Json,
}

impl Encoding {
    /// The encoding `headers` announce. Compared by media type: parameters such as
    /// `; charset=utf-8` do not change the codec.
    pub fn of(headers: Option<&HeaderMap>) -> Result<Self, CodecError> {
        let content_type = headers.and_then(|h| h.get(CONTENT_TYPE)).map(|v| {
            let media = v.as_str().split(';').next().unwrap_or_default();
            media.trim().to_ascii_lowercase()
        });
        match content_type.as_deref() {
            None | Some(MSGPACK) | Some("application/x-msgpack") => Ok(Self::MsgPack),
            Some(JSON) => Ok(Self::Json),
            Some(other) => Err(CodecError::UnsupportedContentType(other.to_string())),
        }
    }

    /// The answer's encoding for a request with `headers`: the request's own, MessagePack when
    /// it named one ax does not speak.
    pub fn answering(headers: Option<&HeaderMap>) -> Self {
        Self::of(headers).unwrap_or(Self::MsgPack)
    }

    /// Its media type.
    pub fn media_type(self) -> &'static str {
        match self {
            Self::MsgPack => MSGPACK,
            Self::Json => JSON,
        }
    }

    /// `value` in this encoding, with the headers that say so.
    pub fn encode<T: Serialize>(self, value: &T) -> Result<(HeaderMap, Bytes), CodecError> {
        let payload = match self {
            Self::MsgPack => encode(value)?,
            Self::Json => Bytes::from(serde_json::to_vec(value).map_err(CodecError::EncodeJson)?),
        };
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, self.media_type());
        Ok((headers, payload))
    }

    /// Decodes `payload` written in this encoding.
    pub fn decode<T: DeserializeOwned>(self, payload: &[u8]) -> Result<T, CodecError> {
        match self {
            Self::MsgPack => decode(payload),
            Self::Json => Ok(serde_json::from_slice(payload)?),
        }
    }
}

/// Decodes by the message's Content-Type: JSON when it says so, MessagePack otherwise.
pub fn decode_by_header<T: DeserializeOwned>(
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<T, CodecError> {
    Encoding::of(headers)?.decode(payload)
}

/// A request (a control command) decoded by its Content-Type: a map at the top — serde would
/// also read a struct from an array of its fields in order — and a problem named with the
/// field it is in (`` `name`: invalid type: integer `5`, expected a string ``).
pub fn decode_request<T: DeserializeOwned>(
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<T, CodecError> {
    match Encoding::of(headers)? {
        Encoding::Json => {
            let found = match payload.iter().find(|b| !b.is_ascii_whitespace()) {
                None | Some(b'{') => None,
                Some(b'[') => Some("an array"),
                Some(b'"') => Some("a string"),
                Some(b'n') => Some("null"),
                Some(b't' | b'f') => Some("a boolean"),
                Some(b'-' | b'0'..=b'9') => Some("a number"),
                // Not JSON at all: the parser says where.
                Some(_) => None,
            };
            if let Some(found) = found {
                return Err(CodecError::NotAMap {
                    encoding: "json",
                    found,
                });
            }
            let mut de = serde_json::Deserializer::from_slice(payload);
            let value =
                serde_path_to_error::deserialize(&mut de).map_err(|e| CodecError::Field {
                    encoding: "json",
                    path: e.path().to_string(),
                    message: e.into_inner().to_string(),
                })?;
            de.end()?;
            Ok(value)
        }
        Encoding::MsgPack => {
            let found = match payload.first() {
                None | Some(0x80..=0x8f | 0xde | 0xdf) => None,
                Some(0x90..=0x9f | 0xdc | 0xdd) => Some("an array"),
                Some(0xa0..=0xbf | 0xd9..=0xdb) => Some("a string"),
                Some(0xc0) => Some("nil"),
                Some(_) => Some("a single value"),
            };
            if let Some(found) = found {
                return Err(CodecError::NotAMap {
                    encoding: "msgpack",
                    found,
                });
            }
            let mut de = rmp_serde::Deserializer::from_read_ref(payload);
            serde_path_to_error::deserialize(&mut de).map_err(|e| CodecError::Field {
                encoding: "msgpack",
                path: e.path().to_string(),
                message: e.into_inner().to_string(),
            })
        }
    }
}

/// An optional value that the wire writes as an empty string when absent (as results write
/// the worker of an instance that no worker ran).
pub mod empty_as_none {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes `None` as `""`.
    pub fn serialize<T: Serialize, S: Serializer>(
        value: &Option<T>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => value.serialize(serializer),
            None => serializer.serialize_str(""),
        }
    }

    /// Reads `""` as `None`.
    pub fn deserialize<'de, T, D>(deserializer: D) -> Result<Option<T>, D::Error>
    where
        T: TryFrom<String>,
        T::Error: std::fmt::Display,
        D: Deserializer<'de>,
    {
        let text = String::deserialize(deserializer)?;
        if text.is_empty() {
            return Ok(None);
        }
        T::try_from(text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn requests_are_maps_and_their_problems_name_the_field() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Request {
            name: String,
            #[serde(default)]
            params: Vec<u32>,
        }
        let mut json = HeaderMap::new();
        json.insert(CONTENT_TYPE, JSON);
        let err = |headers: Option<&HeaderMap>, payload: &[u8]| {
            decode_request::<Request>(headers, payload)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(Some(&json), b" []"),
            "malformed json payload: a request is a map (a JSON object), not an array"
        );
        assert!(err(Some(&json), br#"{"name": 5}"#)
            .starts_with("malformed json payload: `name`: invalid type: integer `5`"));
        assert!(err(Some(&json), br#"{"name": "a", "params": [1, "x"]}"#)
            .starts_with("malformed json payload: `params[1]`: invalid type"));
        assert!(err(Some(&json), br#"{"name": "a"} {}"#).contains("trailing characters"));
        assert!(err(Some(&json), br#"{}"#).contains("missing field `name`"));
        let array = encode(&("a", [1u32])).unwrap();
        assert_eq!(
            err(None, &array),
            "malformed msgpack payload: a request is a map (a JSON object), not an array"
        );
        let wrong = encode(&serde_json::json!({"name": 5})).unwrap();
        assert!(err(None, &wrong).starts_with("malformed msgpack payload: `name`: invalid type"));
        let right = encode(&serde_json::json!({"name": "a", "params": [2]})).unwrap();
        assert_eq!(decode_request::<Request>(None, &right).unwrap().params, [2]);
    }

    #[test]
    fn content_types_compare_by_media_type() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, "Application/JSON; charset=utf-8");
        let value: serde_json::Value =
            decode_by_header(Some(&headers), br#"{"a": 1}"#).expect("JSON with a charset");
        assert_eq!(value["a"], 1);
        headers.insert(CONTENT_TYPE, "text/plain; charset=utf-8");
        assert!(matches!(
            decode_by_header::<serde_json::Value>(Some(&headers), b"{}"),
            Err(CodecError::UnsupportedContentType(t)) if t == "text/plain"
        ));
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Probe {
        name: String,
        n: u32,
    }

    #[test]
    fn msgpack_uses_named_fields_and_round_trips() {
        let bytes = encode(&Probe {
            name: "a".into(),
            n: 3,
        })
        .unwrap();
        // A map with the field names in it, not a positional array.
        assert!(bytes.windows(4).any(|w| w == b"name"));
        assert_eq!(
            decode::<Probe>(&bytes).unwrap(),
            Probe {
                name: "a".into(),
                n: 3
            }
        );
    }

    #[test]
    fn json_is_accepted_when_announced() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, JSON);
        let p: Probe = decode_by_header(Some(&h), br#"{"name":"x","n":1}"#).unwrap();
        assert_eq!(p.n, 1);
        h.insert(CONTENT_TYPE, "text/plain");
        assert!(matches!(
            decode_by_header::<Probe>(Some(&h), b"x"),
            Err(CodecError::UnsupportedContentType(_))
        ));
        assert!(decode::<Probe>(b"\xc1garbage").is_err());
    }
}
