//! Identities, each a type of its own, checked where it enters (spec, command line, wire).
//!
//! - [`Namespace`]: a team's part of ax, `[a-z0-9_-]{1,64}`; `default` holds what names none.
//! - [`JobName`]: `[a-z0-9_-]{1,64}` in `default`, `<namespace>.<name>` in any other namespace
//!   (`payments.settle`; written `payments/settle` too): the namespace is a token of its own in
//!   every subject, record key and instance id, so that NATS permissions confine a namespace
//!   by wildcards (`ax.result.payments.*`), which match whole tokens only; a `default` job's
//!   name is the one token it always was.
//! - [`InstanceId`]: job name + expected fire time (`hello.20261129T183700123Z`; a manual
//!   trigger's: its command's publication time and sequence, `hello.20261129T183700123Z-42`), or a
//!   sub-instance of one (`<parent>.s3`, `<parent>.w-<worker>`): stable across retries and
//!   re-runs, the idempotency key business code de-duplicates on, and the key under which the
//!   instance record is created exactly once. KV-key characters only, at most 320 bytes.
//! - [`TraceId`]: one attempt of one instance, 32 hex digits, carried by every dispatch, claim,
//!   report and log line of that attempt; random, except for a first attempt (derived from the
//!   instance id, see [`TraceId::first_of`]).
//! - [`DispatchId`]: one dispatch of an attempt to a worker (the record names the one that
//!   started it).
//! - [`TriggerKey`]: a business's idempotency key for a trigger, `[A-Za-z0-9_.-]{1,128}`
//!   without empty dot-separated parts; the instance of a keyed trigger is `<job>.key-<key>`,
//!   so the same trigger sent twice (or retried after a lost reply) creates one instance.
//! - [`NodeId`]: a node's `--id`, `[A-Za-z0-9_-]{1,64}`; a worker is named by its node's id
//!   ([`WorkerId`]), which names its dispatch queue.
//!
//! Every type derefs to `str` and serializes as a plain string, so the wire format is the one
//! of a `String`; decoding a value that breaks its rule fails (the message is then undecodable,
//! which the consumers set aside as a dead letter).

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use chrono::{DateTime, NaiveDateTime, Utc};
use rand::Rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const INSTANCE_TIME_FORMAT: &str = "%Y%m%dT%H%M%S%3fZ";
/// The longest instance id (a KV key, and a token-separated subject tail).
pub const MAX_INSTANCE_ID: usize = 320;

/// Which identity a value failed to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKind {
    /// A job name.
    Job,
    /// A namespace.
    Namespace,
    /// An instance id.
    Instance,
    /// A trace id.
    Trace,
    /// A dispatch id.
    Dispatch,
    /// A node (or worker) id.
    Node,
    /// A trigger's idempotency key.
    Key,
    /// An API token's name.
    Token,
    /// An approval request's id.
    Approval,
}

impl IdKind {
    fn as_str(self) -> &'static str {
        match self {
            IdKind::Job => "job name",
            IdKind::Namespace => "namespace",
            IdKind::Instance => "instance id",
            IdKind::Trace => "trace id",
            IdKind::Dispatch => "dispatch id",
            IdKind::Node => "node id",
            IdKind::Key => "trigger key",
            IdKind::Token => "token name",
            IdKind::Approval => "approval id",
        }
    }
}

/// A value that is not a valid identity: which kind, the value (cut to 80 characters) and
/// the rule it breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a valid {}: {rule}", kind.as_str())]
pub struct IdError {
    /// The identity it should have been.
    pub kind: IdKind,
    /// The value, cut to 80 characters.
    pub value: String,
    /// The rule it breaks.
    pub rule: &'static str,
}

impl IdError {
    fn new(kind: IdKind, value: &str, rule: &'static str) -> Self {
        let mut cut: String = value.chars().take(80).collect();
        if cut.len() < value.len() {
            cut.push('…');
        }
        Self {
            kind,
            value: cut,
            rule,
        }
    }
}

fn token_chars(text: &str, extra: &[u8]) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || extra.contains(&b))
}

/// The namespace of every job that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

fn short_name(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn check_job(text: &str) -> Result<(), &'static str> {
    let ok = match text.split_once('.') {
        None => short_name(text),
        Some((namespace, name)) => {
            short_name(namespace) && namespace != DEFAULT_NAMESPACE && short_name(name)
        }
    };
    ok.then_some(()).ok_or(
        "must match [a-z0-9_-]{1,64}, after its namespace and `.` or `/` outside `default` (`payments.settle`)",
    )
}

/// A job name as ax writes it: `payments/settle` as `payments.settle`, `default.x` as `x`.
fn canonical_job(text: &str) -> std::borrow::Cow<'_, str> {
    let dotted = match text.split_once('/') {
        Some((namespace, name)) => std::borrow::Cow::Owned(format!("{namespace}.{name}")),
        None => std::borrow::Cow::Borrowed(text),
    };
    match dotted.strip_prefix("default.") {
        Some(name) if short_name(name) => std::borrow::Cow::Owned(name.to_string()),
        _ => dotted,
    }
}

fn check_namespace(text: &str) -> Result<(), &'static str> {
    short_name(text)
        .then_some(())
        .ok_or("must match [a-z0-9_-]{1,64}")
}

fn check_instance(text: &str) -> Result<(), &'static str> {
    if text.is_empty() || text.len() > MAX_INSTANCE_ID {
        return Err("must be 1 to 320 characters");
    }
    // What a JetStream KV key may hold (the id is the record's key): no `:`, which the
    // server would store but the client refuses to read, leaving such an instance stranded.
    if !token_chars(text, b".") {
        return Err("may hold only letters, digits and `_ - .`");
    }
    if text.split('.').any(str::is_empty) {
        return Err("must not start or end with `.` nor hold `..`");
    }
    Ok(())
}

fn check_key(text: &str) -> Result<(), &'static str> {
    let ok = (1..=128).contains(&text.len())
        && token_chars(text, b".")
        && !text.split('.').any(str::is_empty);
    ok.then_some(())
        .ok_or("must match [A-Za-z0-9_.-]{1,128} and not start or end with `.` nor hold `..`")
}

fn check_hex32(text: &str) -> Result<(), &'static str> {
    let ok = text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    ok.then_some(()).ok_or("must be 32 lowercase hex digits")
}

fn check_token_name(text: &str) -> Result<(), &'static str> {
    let ok = (1..=64).contains(&text.len())
        && text.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then_some(()).ok_or("must match [a-z0-9][a-z0-9-]{0,63}")
}

fn check_hex16(text: &str) -> Result<(), &'static str> {
    let ok = text.len() == 16 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    ok.then_some(()).ok_or("must be 16 lowercase hex digits")
}

fn check_node(text: &str) -> Result<(), &'static str> {
    let ok = (1..=64).contains(&text.len()) && token_chars(text, b"");
    ok.then_some(()).ok_or("must match [A-Za-z0-9_-]{1,64}")
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:expr, $check:path) => {
        string_id!($(#[$doc])* $name, $kind, $check, std::borrow::Cow::Borrowed);
    };
    ($(#[$doc:meta])* $name:ident, $kind:expr, $check:path, $canonical:path) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Checks `text` against the rule of this identity (after writing it as ax writes
            /// it, where it has two spellings).
            pub fn parse(text: &str) -> Result<Self, IdError> {
                let canonical = $canonical(text);
                $check(&canonical).map_err(|rule| IdError::new($kind, text, rule))?;
                Ok(Self(canonical.into_owned()))
            }

            /// The text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(text: &str) -> Result<Self, IdError> {
                Self::parse(text)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;

            fn try_from(text: String) -> Result<Self, IdError> {
                if $check(&text).is_ok() {
                    return Ok(Self(text));
                }
                Self::parse(&text)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl From<&$name> for String {
            fn from(id: &$name) -> String {
                id.0.clone()
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<&$name> for $name {
            fn eq(&self, other: &&$name) -> bool {
                self.0 == other.0
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Self::try_from(text).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// A job's name: `[a-z0-9_-]{1,64}`, after its namespace outside `default` (see the
    /// module docs).
    JobName,
    IdKind::Job,
    check_job,
    canonical_job
);

string_id!(
    /// A namespace: `[a-z0-9_-]{1,64}` (see the module docs).
    Namespace,
    IdKind::Namespace,
    check_namespace
);

impl Namespace {
    /// `default`, the namespace of every job that names none.
    pub fn default_namespace() -> Self {
        Self(DEFAULT_NAMESPACE.to_string())
    }

    /// Whether this is `default`.
    pub fn is_default(&self) -> bool {
        self.0 == DEFAULT_NAMESPACE
    }
}

string_id!(
    /// An instance's id: job name + expected time, or a sub-instance of one (see the module
    /// docs).
    InstanceId,
    IdKind::Instance,
    check_instance
);

string_id!(
    /// One attempt of one instance: 32 lowercase hex digits.
    TraceId,
    IdKind::Trace,
    check_hex32
);

string_id!(
    /// One dispatch of an attempt: 32 lowercase hex digits.
    DispatchId,
    IdKind::Dispatch,
    check_hex32
);

string_id!(
    /// A trigger's idempotency key (see the module docs).
    TriggerKey,
    IdKind::Key,
    check_key
);

string_id!(
    /// A node's id: `[A-Za-z0-9_-]{1,64}`.
    NodeId,
    IdKind::Node,
    check_node
);

string_id!(
    /// An API token's name: `[a-z0-9][a-z0-9-]{0,63}` (the key of its hash in the tokens
    /// bucket, and the caller's name in the audit).
    TokenName,
    IdKind::Token,
    check_token_name
);

string_id!(
    /// An approval request's id: 16 lowercase hex digits, random.
    ApprovalId,
    IdKind::Approval,
    check_hex16
);

impl ApprovalId {
    /// A new random id.
    pub fn random() -> Self {
        Self(format!("{:016x}", rand::rng().random::<u64>()))
    }
}

/// A worker is named by the id of its node: the name of its dispatch queue.
pub type WorkerId = NodeId;

impl JobName {
    /// Job `name` of namespace `namespace` (`name` alone in `default`); `name` must be a
    /// name without a namespace.
    pub fn in_namespace(namespace: &Namespace, name: &str) -> Result<Self, IdError> {
        if namespace.is_default() {
            return Self::parse(name);
        }
        if name.contains(['.', '/']) {
            return Err(IdError::new(
                IdKind::Job,
                name,
                "must be a name within its namespace, without `.` or `/`",
            ));
        }
        Self::parse(&format!("{namespace}.{name}"))
    }

    /// The namespace of the job (`default` for a name without one).
    pub fn namespace(&self) -> &str {
        self.0
            .split_once('.')
            .map_or(DEFAULT_NAMESPACE, |(namespace, _)| namespace)
    }

    /// The name within its namespace.
    pub fn short(&self) -> &str {
        self.0.split_once('.').map_or(&self.0, |(_, name)| name)
    }

    /// Whether the job is in `default`.
    pub fn in_default(&self) -> bool {
        !self.0.contains('.')
    }

    /// A job name taken as it is, not checked: only for a spec's own `name`, which
    /// [`crate::spec::validate`] checks together with every other rule (so that all problems of
    /// a spec are told at once).
    pub(crate) fn unchecked(text: String) -> Self {
        Self(text)
    }
}

fn random_hex32() -> String {
    let n: u128 = rand::rng().random();
    format!("{n:032x}")
}

impl InstanceId {
    /// The instance of `job` expected at `expected`.
    pub fn for_fire(job: &JobName, expected: DateTime<Utc>) -> Self {
        Self(format!("{job}.{}", expected.format(INSTANCE_TIME_FORMAT)))
    }

    /// The instance of the fire of one-off job `job` at `at` for its incarnation created at
    /// `defined_at`, when an earlier incarnation's instance holds [`InstanceId::for_fire`]'s id:
    /// `<job>.<at>-i<defined_at>`. A job deleted and applied again is another job, as its
    /// delayed triggers are: its one fire is an instance of its own.
    pub fn for_incarnation(job: &JobName, at: DateTime<Utc>, defined_at: DateTime<Utc>) -> Self {
        Self(format!(
            "{job}.{}-i{}",
            at.format(INSTANCE_TIME_FORMAT),
            defined_at.format(INSTANCE_TIME_FORMAT)
        ))
    }

    /// The instance of a manual trigger of `job`: its command's publication time and stream
    /// sequence, so a redelivered command means the same instance and two commands published
    /// within one millisecond mean two.
    pub fn for_command(job: &JobName, published: DateTime<Utc>, sequence: u64) -> Self {
        Self(format!(
            "{job}.{}-{sequence}",
            published.format(INSTANCE_TIME_FORMAT)
        ))
    }

    /// The one instance of `job` triggered with idempotency key `key`.
    pub fn for_key(job: &JobName, key: &TriggerKey) -> Self {
        Self(format!("{job}.key-{key}"))
    }

    /// A sub-instance of this one (`suffix` is a token such as `s3` or `w-<worker>`).
    pub fn child(&self, suffix: &str) -> Result<Self, IdError> {
        Self::parse(&format!("{self}.{suffix}"))
    }

    /// The job name and expected time of a fire's instance; `None` for any other id.
    pub fn fire(&self) -> Option<(&str, DateTime<Utc>)> {
        let (job, stamp) = self.0.rsplit_once('.')?;
        let naive = NaiveDateTime::parse_from_str(stamp, INSTANCE_TIME_FORMAT).ok()?;
        check_job(job).ok()?;
        Some((job, naive.and_utc()))
    }
}

impl TraceId {
    /// A fresh trace id (retries, re-runs).
    pub fn random() -> Self {
        Self(random_hex32())
    }

    /// The trace id of an instance's first attempt: derived from the instance id, so that every
    /// Scheduler creating the same fire (they race for it) holds the same attempt — whichever
    /// record is stored, any of them can hand it on, and the hand-off's message id (the trace)
    /// makes the copies one. A creator that dies between the record and the hand-off leaves no
    /// orphan while another one races with it.
    pub fn first_of(instance: &InstanceId) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(format!("ax/first-attempt/{instance}").as_bytes());
        Self(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
    }
}

impl TraceId {
    /// The trace id of sub-instance `index` of this attempt: the same every time the attempt
    /// is split, so that a split done again after a crash names the same attempts.
    pub fn child(&self, index: u32) -> Self {
        Self(format!("{}{index:08x}", &self.0[..24]))
    }
}

impl DispatchId {
    /// A fresh dispatch id.
    pub fn random() -> Self {
        Self(random_hex32())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_one_off_of_another_incarnation_is_an_instance_of_its_own() {
        let at = Utc.with_ymd_and_hms(2026, 12, 24, 18, 0, 0).unwrap();
        let defined = Utc.with_ymd_and_hms(2026, 12, 7, 0, 11, 22).unwrap();
        let job = JobName::parse("again").unwrap();
        let id = InstanceId::for_incarnation(&job, at, defined);
        assert_eq!(
            id.as_str(),
            "again.20261224T180000000Z-i20261207T001122000Z"
        );
        assert_ne!(id, InstanceId::for_fire(&job, at));
        assert_eq!(InstanceId::parse(id.as_str()), Ok(id));
    }

    #[test]
    fn instance_ids_round_trip_and_sort_by_time() {
        let t = Utc.with_ymd_and_hms(2026, 11, 29, 18, 37, 0).unwrap()
            + chrono::Duration::milliseconds(123);
        let job = JobName::parse("order_stat-daily").unwrap();
        let id = InstanceId::for_fire(&job, t);
        assert_eq!(id, "order_stat-daily.20261129T183700123Z");
        assert_eq!(id.fire(), Some(("order_stat-daily", t)));
        let later = InstanceId::for_fire(&job, t + chrono::Duration::milliseconds(1));
        assert!(id < later);
        assert_eq!(InstanceId::parse("nodot").unwrap().fire(), None);
        assert_eq!(InstanceId::parse("a.notatime").unwrap().fire(), None);
        assert_eq!(id.child("s3").unwrap(), format!("{id}.s3").as_str());
    }

    #[test]
    fn a_job_outside_default_is_named_after_its_namespace_in_one_spelling() {
        let settle = JobName::parse("payments/settle").unwrap();
        assert_eq!(settle, "payments.settle");
        assert_eq!(JobName::parse("payments.settle").unwrap(), settle);
        assert_eq!((settle.namespace(), settle.short()), ("payments", "settle"));
        assert!(!settle.in_default());
        // `default` is never written.
        let hello = JobName::parse("default/hello").unwrap();
        assert_eq!(hello, "hello");
        assert_eq!((hello.namespace(), hello.short()), ("default", "hello"));
        assert_eq!(JobName::parse("default").unwrap(), "default");
        // On the wire too.
        let decoded: JobName = serde_json::from_str("\"payments/settle\"").unwrap();
        assert_eq!(decoded, settle);
        for bad in ["a.b.c", "a/b/c", ".x", "x.", "A.x", "a.X", "a/"] {
            assert!(JobName::parse(bad).is_err(), "{bad}");
        }
        let payments = Namespace::parse("payments").unwrap();
        assert_eq!(JobName::in_namespace(&payments, "settle").unwrap(), settle);
        assert!(JobName::in_namespace(&payments, "other.settle").is_err());
        let default = Namespace::default_namespace();
        assert_eq!(JobName::in_namespace(&default, "x").unwrap(), "x");
        // The instance of a fire names its job whole.
        let at = chrono::Utc::now();
        let id = InstanceId::for_fire(&settle, at);
        assert!(id.starts_with("payments.settle."));
        assert_eq!(id.fire().map(|(job, _)| job), Some("payments.settle"));
    }

    #[test]
    fn trace_ids_are_unique_hex() {
        let a = TraceId::random();
        assert_eq!(a.len(), 32);
        assert!(TraceId::parse(&a).is_ok());
        assert_ne!(a, TraceId::random());
        let id = InstanceId::parse("hello.20261129T183700123Z").unwrap();
        let first = TraceId::first_of(&id);
        assert_eq!(first, TraceId::first_of(&id));
        let other = InstanceId::parse("hello.20261129T183701123Z").unwrap();
        assert_ne!(first, TraceId::first_of(&other));
        assert!(TraceId::parse(&first).is_ok());
    }

    #[test]
    fn child_traces_are_stable_and_distinct() {
        let parent = TraceId::random();
        assert_eq!(parent.child(3), parent.child(3));
        assert_ne!(parent.child(3), parent.child(4));
        assert!(TraceId::parse(&parent.child(3)).is_ok());
    }

    /// What no dotted id or key takes: empty, empty or dangling parts, spaces, wildcards.
    const BROKEN: [&str; 7] = ["", "a..b", ".a", "a.", "a b", "a*", "a>"];

    #[test]
    fn each_identity_refuses_what_breaks_its_rule_and_says_which_rule() {
        assert!(JobName::parse("Upper").is_err());
        assert!(JobName::parse(&"a".repeat(65)).is_err());
        assert!(JobName::parse("ok_name-1").is_ok());
        for bad in BROKEN.iter().chain(&["a/b", "a.key-x:y"]) {
            let e = InstanceId::parse(bad).unwrap_err();
            assert_eq!(e.kind, IdKind::Instance, "{bad}");
        }
        let long = "x".repeat(10_000);
        let e = InstanceId::parse(&long).unwrap_err();
        assert!(e.to_string().contains("1 to 320"), "{e}");
        assert!(e.value.chars().count() <= 81, "the value is cut");
        assert!(TraceId::parse("t1").is_err());
        assert!(TraceId::parse(&"A".repeat(32)).is_err());
        assert!(NodeId::parse("etl-1").is_ok());
        assert!(NodeId::parse("etl.1").is_err());
    }

    #[test]
    fn ids_travel_as_plain_strings_and_are_checked_when_decoded() {
        let id = InstanceId::parse("j.20260101T000000000Z").unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"j.20260101T000000000Z\"");
        assert_eq!(serde_json::from_str::<InstanceId>(&json).unwrap(), id);
        let refused = serde_json::from_str::<InstanceId>("\"a b\"").unwrap_err();
        assert!(refused.to_string().contains("not a valid instance id"));
    }

    #[test]
    fn a_keyed_instance_is_one_valid_id_per_job_and_key() {
        let job = JobName::parse("send_reminder").unwrap();
        let key = TriggerKey::parse("order-42.v1_2").unwrap();
        let id = InstanceId::for_key(&job, &key);
        assert_eq!(id, "send_reminder.key-order-42.v1_2");
        assert!(InstanceId::parse(&id).is_ok());
        assert_eq!(id.fire(), None, "not taken for a fire");
        let longest = TriggerKey::parse(&"k".repeat(128)).unwrap();
        let long_job = JobName::parse(&"j".repeat(64)).unwrap();
        assert!(InstanceId::parse(&InstanceId::for_key(&long_job, &longest)).is_ok());
        // `:` is refused: a KV key cannot hold it, and the record could not be read back.
        let long = "k".repeat(129);
        for bad in BROKEN.iter().chain(&["order:42", long.as_str()]) {
            let e = TriggerKey::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains("not a valid trigger key"),
                "{bad}: {e}"
            );
        }
    }
}
