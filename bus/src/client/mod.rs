//! [`AxClient`]: a connection to NATS with ax's streams and buckets at hand, and the
//! operations shared by the CLI, the actors and business services (control commands, reading
//! jobs and instances, compare-and-swap on instance records).

pub mod auth;
pub mod backup;
pub mod claims;
pub mod datasets;
pub mod dead_letters;
pub mod deps;
pub mod expiry_notes;
pub mod history;
pub mod in_flight;
pub mod instance_buckets;
pub mod kv_view;
pub mod leaders;
pub mod local_server;
pub mod logs;
pub mod provision;
pub mod rebucket;
pub mod record_writes;
pub mod registered;
pub mod reports;
pub mod retention;
pub mod status;

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use serde::Serialize;

use crate::client::kv_view::{FeedError, KvFeed, MergedFeed};
use crate::codec::{self, CodecError};
use crate::error::{BoxError, During, NatsError, Reason};
use crate::ids::{IdError, InstanceId, JobName, NodeId};
use crate::instance::{InstanceRecord, TransitionRefused};
use chrono::{DateTime, Utc};

use crate::client::provision::{Layout, ProvisionError};
use crate::client::record_writes::Created;
use crate::messages::commands::Command;
use crate::messages::typed::{ControlRequest, FromReply};
use crate::messages::{
    ControlReply, JobRecord, NodeStatus, QueueState, StoredRecord, TickRecord, WorkerInfo,
    REPLY_TO_HEADER,
};
use crate::subjects::Subjects;

/// How to connect.
#[derive(Clone, Debug)]
pub struct ConnectConfig {
    /// `nats://host:port` (credentials may be in the URL).
    pub url: String,
    /// Connection name shown by the server (`ax-cli`, `ax-node-<id>`).
    pub name: String,
    /// Subject prefix, `ax` by default.
    pub prefix: String,
    /// Replicas for streams and buckets; `None` keeps what they have (see
    /// [`Layout::replicas`]).
    pub replicas: Option<usize>,
    /// Credentials and TLS.
    pub auth: NatsAuth,
    /// How long what is kept for a while is kept (see [`Layout::retention`]).
    pub retention: crate::client::provision::Retention,
    /// The instance buckets a first node sets (see [`Layout::instance_buckets`]).
    pub instance_buckets: Option<u16>,
}

/// How to authenticate to NATS and secure the connection. A user and password may also be
/// given in the URL (`nats://user:pass@host:4222`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatsAuth {
    /// User (with `password`).
    pub user: Option<String>,
    /// Password of `user`.
    pub password: Option<String>,
    /// An authentication token.
    pub token: Option<String>,
    /// A file holding an NKey seed (`SU...`).
    pub nkey_seed_file: Option<PathBuf>,
    /// A `.creds` file (JWT and NKey seed, as `nsc` writes them).
    pub creds_file: Option<PathBuf>,
    /// PEM file of the CA that signed the server's certificate.
    pub tls_ca: Option<PathBuf>,
    /// PEM file of this client's certificate (with `tls_key`), for mutual TLS.
    pub tls_cert: Option<PathBuf>,
    /// PEM file of this client's private key.
    pub tls_key: Option<PathBuf>,
    /// Refuse a connection without TLS.
    pub tls_required: bool,
    /// Where replies to this client go (`_INBOX.<user>` when a user is given and this is not):
    /// a server that lets each user subscribe to its own prefix only keeps one client from
    /// reading the replies meant for another.
    pub inbox_prefix: Option<String>,
}

impl NatsAuth {
    /// Defaults from the environment: `AX_NATS_USER` / `AX_NATS_PASSWORD`, `AX_NATS_TOKEN`,
    /// `AX_NATS_NKEY_SEED_FILE`, `AX_NATS_CREDS`, `AX_NATS_TLS_CA`, `AX_NATS_TLS_CERT` /
    /// `AX_NATS_TLS_KEY`, `AX_NATS_TLS_REQUIRED=1` — so that the CLI reaches a secured cluster
    /// without flags.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Self {
            user: var("AX_NATS_USER"),
            password: var("AX_NATS_PASSWORD"),
            token: var("AX_NATS_TOKEN"),
            nkey_seed_file: var("AX_NATS_NKEY_SEED_FILE").map(PathBuf::from),
            creds_file: var("AX_NATS_CREDS").map(PathBuf::from),
            tls_ca: var("AX_NATS_TLS_CA").map(PathBuf::from),
            tls_cert: var("AX_NATS_TLS_CERT").map(PathBuf::from),
            tls_key: var("AX_NATS_TLS_KEY").map(PathBuf::from),
            tls_required: var("AX_NATS_TLS_REQUIRED").is_some_and(|v| v == "1" || v == "true"),
            inbox_prefix: var("AX_NATS_INBOX_PREFIX"),
        }
    }

    /// The connect options these settings make; an error names the setting. Credentials in
    /// the URL (`nats://user:password@host`, or `nats://token@host`) count when no other is
    /// set (the client library does not read them itself).
    async fn options(&self, urls: &str) -> Result<async_nats::ConnectOptions, String> {
        let mut options = async_nats::ConnectOptions::new();
        let mut this = self.clone();
        if this.user.is_none() && this.token.is_none() {
            match url_userinfo(urls) {
                Some((user, Some(password))) => {
                    this.user = Some(user);
                    this.password = Some(password);
                }
                Some((token, None)) => this.token = Some(token),
                None => {}
            }
        }
        match (&this.user, &this.password) {
            (Some(user), Some(password)) => {
                options = options.user_and_password(user.clone(), password.clone())
            }
            (None, None) => {}
            _ => return Err("user and password go together".into()),
        }
        if let Some(token) = &this.token {
            options = options.token(token.clone());
        }
        if let Some(file) = &self.nkey_seed_file {
            let seed = std::fs::read_to_string(file)
                .map_err(|e| format!("nkey seed file {}: {e}", file.display()))?;
            options = options.nkey(seed.trim().to_string());
        }
        if let Some(file) = &self.creds_file {
            options = options
                .credentials_file(file)
                .await
                .map_err(|e| format!("creds file {}: {e}", file.display()))?;
        }
        if let Some(ca) = &self.tls_ca {
            options = options.add_root_certificates(ca.clone());
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                options = options.add_client_certificate(cert.clone(), key.clone())
            }
            (None, None) => {}
            _ => return Err("tls_cert and tls_key go together".into()),
        }
        if self.tls_required {
            options = options.require_tls(true);
        }
        if let Some(prefix) = this.inbox(this.user.as_deref())? {
            options = options.custom_inbox_prefix(prefix);
        }
        Ok(options)
    }

    /// The inbox prefix: the one set, which must be `_INBOX` and tokens of letters, digits,
    /// `_` and `-`; else `_INBOX.<user>` for a user whose name is such a token; else the
    /// client library's (`_INBOX`).
    fn inbox(&self, user: Option<&str>) -> Result<Option<String>, String> {
        let token = |t: &str| {
            !t.is_empty()
                && t.len() <= 64
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        match &self.inbox_prefix {
            Some(prefix) => {
                let mut tokens = prefix.split('.');
                if tokens.next() == Some("_INBOX") && tokens.all(token) {
                    Ok(Some(prefix.clone()))
                } else {
                    Err(format!(
                        "inbox_prefix `{prefix}`: give `_INBOX` followed by dot-separated \
                         tokens of letters, digits, `_` and `-` (`_INBOX.app`)"
                    ))
                }
            }
            None => Ok(user.filter(|u| token(u)).map(|u| format!("_INBOX.{u}"))),
        }
    }
}

/// The user and password (or the token) in the first URL of a list that has any.
fn url_userinfo(urls: &str) -> Option<(String, Option<String>)> {
    server_list(urls).iter().find_map(|url| {
        let rest = url.split_once("://")?.1;
        let (userinfo, _) = rest.split_once('@')?;
        match userinfo.split_once(':') {
            Some((user, password)) => Some((user.to_string(), Some(password.to_string()))),
            None => Some((userinfo.to_string(), None)),
        }
    })
}

/// The servers of a URL list: `nats://a:4222,nats://b:4222` (one is enough to reach a
/// cluster, which announces the others; several let the first connection survive one down).
pub fn server_list(urls: &str) -> Vec<String> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect()
}

impl ConnectConfig {
    /// Defaults for `url`: prefix `ax`, 1 replica.
    pub fn new(url: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            name: name.into(),
            prefix: crate::subjects::DEFAULT_PREFIX.to_string(),
            replicas: None,
            auth: NatsAuth::from_env(),
            retention: Default::default(),
            instance_buckets: None,
        }
    }
}

/// What can go wrong talking to ax over NATS.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached or refused us.
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        /// The URL (any password redacted).
        url: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// No server of the URL can be reached (yet): a node waits for one.
    #[error("cannot reach NATS at {url}: {source}")]
    Unreachable {
        /// The URL (any password redacted).
        url: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Streams or buckets could not be set up.
    #[error(transparent)]
    Provision(#[from] ProvisionError),
    /// A stream or bucket of ax does not exist: no node has set up this NATS yet.
    #[error(
        "JetStream {object} does not exist: no ax node has run against this NATS yet (a node \
         creates ax's streams and buckets; a command only reads them)"
    )]
    NotSetUp {
        /// The stream or bucket.
        object: String,
    },
    /// A NATS or JetStream operation failed.
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// A stored or received value did not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A bucket could not be read.
    #[error(transparent)]
    Feed(#[from] FeedError),
    /// A value is not a valid identity (checked before any NATS call).
    #[error(transparent)]
    Id(#[from] IdError),
    /// The command was stored but no Scheduler answered in time.
    #[error(
        "no Scheduler answered within {0:?}; the command is queued (control stream seq {1}) and \
         runs when one starts"
    )]
    NoAnswer(Duration, u64),
    /// The Scheduler refused the command: its reasons, each naming the field (nothing was
    /// changed).
    #[error("{}", .0.join("; "))]
    Refused(Vec<String>),
    /// The Scheduler denied the command to whoever sent it (no token, or a role too low).
    #[error("{0}")]
    Denied(String),
    /// The Scheduler's answer lacks what its command always answers.
    #[error("the answer to the command is malformed: {0}")]
    Malformed(String),
}

/// A URL list with any password replaced, for messages.
pub fn redact(urls: &str) -> String {
    server_list(urls)
        .iter()
        .map(|url| match url.split_once("://") {
            Some((scheme, rest)) => match rest.split_once('@') {
                Some((userinfo, host)) => match userinfo.split_once(':') {
                    Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
                    None => format!("{scheme}://***@{host}"),
                },
                None => url.clone(),
            },
            None => url.clone(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Says in the log what happens to the connection: an outage and the reconnection (which
/// the client retries for ever, with a backoff growing to a few seconds) are worth a warning.
fn log_event(name: &str, event: async_nats::Event) {
    use async_nats::Event;
    match event {
        Event::Connected => tracing::info!(connection = name, "connected to NATS"),
        Event::Disconnected => tracing::warn!(
            connection = name,
            "lost the NATS connection; reconnecting with backoff (work waits, nothing is dropped)"
        ),
        Event::ClientError(e) => {
            tracing::warn!(connection = name, error = %e, "NATS connection trouble; still trying")
        }
        Event::SlowConsumer(sid) => {
            tracing::warn!(
                connection = name,
                subscription = sid,
                "slow consumer: messages dropped"
            )
        }
        Event::ServerError(e) => tracing::warn!(
            connection = name,
            error = %e,
            "the NATS server refused something (a permissions violation names a subject this node's user may not use)"
        ),
        Event::LameDuckMode => tracing::warn!(
            connection = name,
            "the NATS server is shutting down (lame duck mode); moving to another"
        ),
        other => tracing::info!(connection = name, event = %other, "NATS"),
    }
}

/// The result of a compare-and-swap update of an instance record.
#[derive(Debug)]
pub enum Updated {
    /// Written; the new record and its revision.
    Written(Box<InstanceRecord>, u64),
    /// The transition rules refused it (stale or repeated).
    Refused(TransitionRefused),
    /// There is no such instance.
    Missing,
}

/// A connection with ax's JetStream objects. The bucket handles are shared (`Arc`): each is
/// about 1.5 KB, and a client is cloned into many futures — held by value, the fourteen of
/// them made a client 19 KB, every future holding one as large, and a debug build's actor
/// threads overflowed their stacks.
#[derive(Clone)]
pub struct AxClient {
    /// The core connection.
    pub nats: async_nats::Client,
    /// The JetStream context.
    pub js: jetstream::Context,
    /// Names of subjects, streams and buckets.
    pub layout: Layout,
    /// Job registry.
    pub jobs: std::sync::Arc<kv::Store>,
    /// Instance records, in their buckets.
    pub instances: std::sync::Arc<instance_buckets::InstanceBuckets>,
    /// Attempt claims.
    pub claims: std::sync::Arc<kv::Store>,
    /// Worker heartbeats.
    pub workers: std::sync::Arc<kv::Store>,
    /// Node heartbeats.
    pub nodes: std::sync::Arc<kv::Store>,
    /// Instances per business date and job.
    pub deps: std::sync::Arc<kv::Store>,
    /// Instances held for their dependencies.
    pub waiting: std::sync::Arc<kv::Store>,
    /// Each job's latest instance.
    pub latest: std::sync::Arc<kv::Store>,
    /// Leases.
    pub leases: std::sync::Arc<kv::Store>,
    /// Partition owners (see [`crate::partition`]).
    pub partitions: std::sync::Arc<kv::Store>,
    /// Paused queues.
    pub queues: std::sync::Arc<kv::Store>,
    /// Re-dispatches in flight.
    pub in_flight: std::sync::Arc<kv::Store>,
    /// Each day's summary.
    pub summary: std::sync::Arc<kv::Store>,
    /// API tokens' hashes.
    pub tokens: std::sync::Arc<kv::Store>,
    /// Re-runs waiting for a second person.
    pub approvals: std::sync::Arc<kv::Store>,
    /// `ax_answers`: answers to commands sent with a message id, for a repeat of the id.
    pub answers: std::sync::Arc<kv::Store>,
    /// The token this client's commands carry, if any.
    caller: Option<std::sync::Arc<crate::auth::token::Token>>,
    /// The door its commands say they came through.
    via: crate::auth::Via,
    /// Who its commands say sends them ([`crate::auth::CALLER_HEADER`]), if anyone.
    claimed: Option<std::sync::Arc<str>>,
    /// The node this client writes instance records for (stamped on each record it writes as
    /// `written_by`); none for a command.
    writer: Option<NodeId>,
    /// Gathers the notes of records' ends (see [`expiry_notes`]).
    expiry_notes: expiry_notes::ExpiryNotes,
}

impl std::fmt::Debug for AxClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AxClient")
            .field("prefix", &self.layout.subjects.prefix())
            .field("replicas", &self.layout.replicas)
            .finish_non_exhaustive()
    }
}

/// Opens bucket `name`: an error names it, as not set up when it does not exist.
pub(crate) async fn open_bucket(
    js: &jetstream::Context,
    name: &str,
) -> Result<kv::Store, ClientError> {
    js.get_key_value(name).await.map_err(|e| {
        let error = NatsError::new(format!("open bucket {name}"), e);
        if error.server_code() == Some(jetstream::ErrorCode::STREAM_NOT_FOUND) {
            ClientError::NotSetUp {
                object: format!("bucket {name}"),
            }
        } else {
            error.into()
        }
    })
}

/// Whether a connection failed because no server answered (yet) — refused, reset, timed out,
/// not resolved — rather than because it refused us (credentials, TLS): only then is waiting
/// worth it.
fn unreachable(error: &async_nats::ConnectError) -> bool {
    use async_nats::ConnectErrorKind::{Dns, Io, TimedOut};
    use std::io::ErrorKind::{
        AddrNotAvailable, BrokenPipe, ConnectionAborted, ConnectionRefused, ConnectionReset,
        NotConnected, TimedOut as IoTimedOut, UnexpectedEof,
    };
    match error.kind() {
        TimedOut | Dns => true,
        Io => {
            let mut cause = std::error::Error::source(error);
            while let Some(e) = cause {
                if let Some(io) = e.downcast_ref::<std::io::Error>() {
                    return matches!(
                        io.kind(),
                        ConnectionRefused
                            | ConnectionReset
                            | ConnectionAborted
                            | NotConnected
                            | AddrNotAvailable
                            | BrokenPipe
                            | IoTimedOut
                            | UnexpectedEof
                    );
                }
                cause = e.source();
            }
            false
        }
        _ => false,
    }
}

const CAS_ATTEMPTS: usize = 16;
/// The longest wait between two tries to reach NATS or set up JetStream.
const MAX_SETUP_BACKOFF: Duration = Duration::from_secs(10);
/// How long one request of the set-up may take.
const SETUP_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

impl AxClient {
    /// Connects a command (the CLI, a business service) and opens ax's streams and buckets,
    /// which the nodes set up: a command never creates or changes them — not their replicas
    /// either — and a missing one is an error that names it ([`ClientError::NotSetUp`]).
    pub async fn connect(config: &ConnectConfig) -> Result<Self, ClientError> {
        let nats = Self::connect_nats(config).await?;
        Self::from_client(nats, Self::layout_of(config)).await
    }

    /// Connects a node: waits for NATS while it cannot be reached (wrong credentials or TLS
    /// settings fail at once), then creates or updates every stream and bucket, waiting and
    /// trying again with backoff while JetStream cannot (a cluster that has lost a node, a
    /// server starting), each wait said in the log.
    pub async fn connect_node(config: &ConnectConfig) -> Result<Self, ClientError> {
        let mut backoff = Duration::from_millis(500);
        let nats = loop {
            match Self::connect_nats(config).await {
                Ok(nats) => break nats,
                Err(ClientError::Unreachable { url, source }) => {
                    tracing::warn!(%url, error = %source, retry_in = ?backoff, "waiting for NATS");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_SETUP_BACKOFF);
                }
                Err(e) => return Err(e),
            }
        };
        Self::provisioned(nats, Self::layout_of(config)).await
    }

    fn layout_of(config: &ConnectConfig) -> Layout {
        Layout {
            retention: config.retention.clone(),
            instance_buckets: config.instance_buckets,
            ..Layout::new(Subjects::new(&config.prefix), config.replicas)
        }
    }

    /// Connects to NATS without opening anything of ax: for a restore, into a NATS that has
    /// none of it yet.
    pub async fn connect_bare(config: &ConnectConfig) -> Result<async_nats::Client, ClientError> {
        Self::connect_nats(config).await
    }

    async fn connect_nats(config: &ConnectConfig) -> Result<async_nats::Client, ClientError> {
        let url = redact(&config.url);
        let servers = server_list(&config.url);
        let name = config.name.clone();
        let options =
            config
                .auth
                .options(&config.url)
                .await
                .map_err(|reason| ClientError::Connect {
                    url: url.clone(),
                    source: Reason(reason).into(),
                })?;
        options
            .name(&config.name)
            .connection_timeout(Duration::from_secs(5))
            .event_callback(move |event| {
                let name = name.clone();
                async move { log_event(&name, event) }
            })
            .connect(servers.as_slice())
            .await
            .map_err(|e| {
                if unreachable(&e) {
                    ClientError::Unreachable {
                        url,
                        source: e.into(),
                    }
                } else {
                    ClientError::Connect {
                        url,
                        source: e.into(),
                    }
                }
            })
    }

    /// Uses an existing connection, opening the streams and buckets the nodes set up (see
    /// [`AxClient::connect`]).
    pub async fn from_client(
        nats: async_nats::Client,
        layout: Layout,
    ) -> Result<Self, ClientError> {
        let js = jetstream::new(nats.clone());
        let bucket = |name: String| {
            let js = js.clone();
            async move { open_bucket(&js, &name).await }
        };
        let partitions = bucket(layout.partitions_bucket()).await?;
        let count = instance_buckets::stored_count(&partitions)
            .await?
            .unwrap_or(1);
        Ok(Self {
            jobs: std::sync::Arc::new(bucket(layout.jobs_bucket()).await?),
            instances: std::sync::Arc::new(
                instance_buckets::InstanceBuckets::open(&js, &layout, count).await?,
            ),
            claims: std::sync::Arc::new(bucket(layout.claims_bucket()).await?),
            workers: std::sync::Arc::new(bucket(layout.workers_bucket()).await?),
            in_flight: std::sync::Arc::new(bucket(layout.in_flight_bucket()).await?),
            nodes: std::sync::Arc::new(bucket(layout.nodes_bucket()).await?),
            deps: std::sync::Arc::new(bucket(layout.deps_bucket()).await?),
            waiting: std::sync::Arc::new(bucket(layout.waiting_bucket()).await?),
            latest: std::sync::Arc::new(bucket(layout.latest_bucket()).await?),
            leases: std::sync::Arc::new(bucket(layout.leases_bucket()).await?),
            partitions: std::sync::Arc::new(partitions),
            queues: std::sync::Arc::new(bucket(layout.queues_bucket()).await?),
            summary: std::sync::Arc::new(bucket(layout.summary_bucket()).await?),
            tokens: std::sync::Arc::new(bucket(layout.tokens_bucket()).await?),
            approvals: std::sync::Arc::new(bucket(layout.approvals_bucket()).await?),
            answers: std::sync::Arc::new(bucket(layout.answers_bucket()).await?),
            caller: None,
            via: crate::auth::Via::Control,
            claimed: None,
            nats,
            js,
            layout,
            writer: None,
            expiry_notes: expiry_notes::ExpiryNotes::default(),
        })
    }

    /// This client as node `node`'s: the instance records it writes say so (`written_by`).
    pub fn writing_as(mut self, node: NodeId) -> Self {
        self.writer = Some(node);
        self
    }

    /// Whether this client acts for a token (its commands carry one).
    pub fn has_caller(&self) -> bool {
        self.caller.is_some()
    }

    /// This client's commands carry `token` (the caller's credential, checked by the Scheduler
    /// when auth is on) and say they came `via` the CLI, the API or the console.
    pub fn acting_as(
        mut self,
        token: Option<crate::auth::token::Token>,
        via: crate::auth::Via,
    ) -> Self {
        self.caller = token.map(std::sync::Arc::new);
        self.via = via;
        self
    }

    /// This client's commands say `name` sends them ([`crate::auth::CALLER_HEADER`]): the one
    /// name of its caller in the audit and the records while auth is off.
    pub fn claiming(mut self, name: &str) -> Self {
        self.claimed = Some(name.into());
        self
    }

    /// Uses an existing connection as a node does: creates or updates every stream and
    /// bucket, waiting and trying again with backoff while JetStream cannot, then opens them.
    pub async fn provisioned(
        nats: async_nats::Client,
        layout: Layout,
    ) -> Result<Self, ClientError> {
        // A cluster that has just lost or regained a node can take longer than a request's
        // usual 5 s to place a replicated stream; provisioning has time to wait.
        let mut js = jetstream::new(nats.clone());
        js.set_timeout(SETUP_REQUEST_TIMEOUT);
        let mut backoff = Duration::from_millis(500);
        let mut stuck_at = String::new();
        while let Err(e) = layout.ensure(&js).await {
            // Further than last time: the objects before it are done, try again at once.
            if e.object != stuck_at {
                backoff = Duration::from_millis(500);
                stuck_at = e.object.clone();
            }
            tracing::warn!(error = %e, retry_in = ?backoff, "waiting for JetStream to set up ax's streams and buckets");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_SETUP_BACKOFF);
        }
        Self::from_client(nats, layout).await
    }

    /// Subject names.
    pub fn subjects(&self) -> &Subjects {
        &self.layout.subjects
    }

    /// Sends a control command's request and waits up to `timeout` for its reply: the
    /// command's own reply type when it was carried out, [`ClientError::Refused`] (the
    /// Scheduler's reasons) or [`ClientError::Denied`] when it was not.
    pub async fn send<C: ControlRequest>(
        &self,
        request: &C,
        timeout: Duration,
    ) -> Result<C::Reply, ClientError> {
        let reply = self.send_raw(C::COMMAND, request, timeout).await?;
        if reply.denied {
            return Err(ClientError::Denied(reply.errors.join("; ")));
        }
        if !reply.ok {
            return Err(ClientError::Refused(reply.errors));
        }
        C::Reply::from_reply(reply).map_err(ClientError::Malformed)
    }

    /// Publishes a payload as command `command` (MessagePack) and waits up to `timeout` for the
    /// reply as the wire has it, refusal or not: for a payload that is no request type (a test
    /// of the Scheduler's refusals, a relay of documents it did not write). Everyone else
    /// [`send`](Self::send)s.
    pub async fn send_raw<T: Serialize>(
        &self,
        command: Command,
        request: &T,
        timeout: Duration,
    ) -> Result<ControlReply, ClientError> {
        let inbox = self.nats.new_inbox();
        let mut replies = self
            .nats
            .subscribe(inbox.clone())
            .await
            .during(|| "subscribe to reply inbox")?;
        let mut headers = codec::msgpack_headers();
        headers.insert(REPLY_TO_HEADER, inbox.as_str());
        headers.insert(crate::auth::VIA_HEADER, self.via.as_str());
        if let Some(name) = &self.claimed {
            headers.insert(crate::auth::CALLER_HEADER, name.as_ref());
        }
        if let Some(token) = &self.caller {
            headers.insert(crate::auth::TOKEN_HEADER, token.expose());
        }
        let subject = self.subjects().control(command.name());
        let ack = self
            .js
            .publish_with_headers(subject.clone(), headers, codec::encode(request)?)
            .await
            .during(|| format!("publish {subject}"))?
            .await
            .during(|| format!("publish {subject}"))?;
        match tokio::time::timeout(timeout, replies.next()).await {
            Ok(Some(message)) => Ok(codec::decode_by_header(
                message.headers.as_ref(),
                &message.payload,
            )?),
            _ => Err(ClientError::NoAnswer(timeout, ack.sequence)),
        }
    }

    /// One job's record.
    pub async fn job(&self, name: &JobName) -> Result<Option<(JobRecord, u64)>, ClientError> {
        match self
            .jobs
            .entry(name)
            .await
            .during(|| format!("read job {name}"))?
        {
            Some(entry) if entry.operation == kv::Operation::Put => {
                Ok(Some((codec::decode(&entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Whether the registry has an entry named `name`, valid or not (what `delete` removes).
    pub async fn job_exists(&self, name: &JobName) -> Result<bool, ClientError> {
        let entry = self
            .jobs
            .entry(name)
            .await
            .during(|| format!("read job {name}"))?;
        Ok(entry.is_some_and(|e| e.operation == kv::Operation::Put))
    }

    /// Every valid job, by name. An entry that does not decode or breaks the spec's rules is
    /// left out (and logged): it is ignored everywhere (the Schedulers raise an alert about it),
    /// and one bad entry must not stop every listing, apply or delete.
    pub async fn jobs(&self) -> Result<Vec<JobRecord>, ClientError> {
        let feed = KvFeed::open(&self.js, &self.layout.jobs_bucket(), ">").await?;
        Ok(feed
            .snapshot()
            .await?
            .into_iter()
            .filter_map(|(key, value, _)| match JobRecord::from_registry(&value) {
                Ok(record) => Some(record),
                Err(e) => {
                    tracing::warn!(job = %key, error = %e, "registry entry left out");
                    None
                }
            })
            .collect())
    }

    /// Every job's definition, by name.
    pub async fn job_specs(
        &self,
    ) -> Result<std::collections::BTreeMap<JobName, crate::spec::JobSpec>, ClientError> {
        Ok(self
            .jobs()
            .await?
            .into_iter()
            .map(|r| (r.spec.name.clone(), r.spec))
            .collect())
    }

    /// The last `limit` ticks of `job`, oldest first: the ledger's records (caught up,
    /// skipped, de-duplicated) and, for each tick fired on time, what its instance record says.
    pub async fn ticks(&self, job: &JobName, limit: usize) -> Result<Vec<TickRecord>, ClientError> {
        let prefix = format!("{}.", self.subjects().tick_all().trim_end_matches(".>"));
        let feed = KvFeed::open_stream(
            &self.js,
            &self.layout.ticks_stream(),
            &prefix,
            job,
            jetstream::consumer::DeliverPolicy::All,
        )
        .await?;
        let fired: Vec<TickRecord> = self
            .instances(Some(job))
            .await?
            .iter()
            .filter_map(TickRecord::fired)
            .collect();
        let on_time: std::collections::HashSet<DateTime<Utc>> =
            fired.iter().map(|t| t.tick).collect();
        let mut all = fired;
        for (_, value) in feed.history().await? {
            let record: TickRecord = codec::decode(&value)?;
            // Written by Schedulers of earlier versions, which recorded every fire.
            if record.outcome == crate::messages::TickOutcome::Fired
                && on_time.contains(&record.tick)
            {
                continue;
            }
            all.push(record);
        }
        all.sort_by_key(|t| (t.tick, t.at));
        let skip = all.len().saturating_sub(limit);
        Ok(all.split_off(skip))
    }

    /// The last tick record of every job that has one.
    pub async fn last_ticks(&self) -> Result<Vec<TickRecord>, ClientError> {
        let prefix = format!("{}.", self.subjects().tick_all().trim_end_matches(".>"));
        let feed = KvFeed::open_stream(
            &self.js,
            &self.layout.ticks_stream(),
            &prefix,
            ">",
            jetstream::consumer::DeliverPolicy::LastPerSubject,
        )
        .await?;
        feed.snapshot()
            .await?
            .into_iter()
            .map(|(_, value, _)| codec::decode(&value).map_err(ClientError::from))
            .collect()
    }

    /// Every worker's last heartbeat, with when the server stored it.
    pub async fn workers(&self) -> Result<Vec<(WorkerInfo, DateTime<Utc>)>, ClientError> {
        let feed = KvFeed::open(&self.js, &self.layout.workers_bucket(), ">").await?;
        feed.snapshot_timed()
            .await?
            .into_iter()
            .map(|(_, value, _, at)| Ok((codec::decode(&value)?, at)))
            .collect()
    }

    /// Every node's latest heartbeat, by node name.
    pub async fn nodes(&self) -> Result<Vec<NodeStatus>, ClientError> {
        let feed = KvFeed::open(&self.js, &self.layout.nodes_bucket(), ">").await?;
        feed.snapshot()
            .await?
            .into_iter()
            .map(|(_, value, _)| Ok(codec::decode(&value)?))
            .collect()
    }

    /// How the Routers score workers and judge them alive: the policy in the newest heartbeat
    /// of a node running a Router, or the defaults when no Router has written one (a fleet with
    /// no Router yet routes nothing; its workers are shown as a default Router would see them).
    pub async fn routing_policy(&self) -> Result<crate::routing::RoutingPolicy, ClientError> {
        let mut nodes = self.nodes().await?;
        nodes.sort_by_key(|n| n.seen_at);
        Ok(nodes
            .into_iter()
            .rev()
            .find_map(|n| n.router)
            .unwrap_or_default())
    }

    /// The owner of every partition of the cron jobs that has had one (`None`: handed over
    /// and not taken yet), by partition.
    pub async fn partition_owners(
        &self,
    ) -> Result<
        std::collections::BTreeMap<crate::partition::PartitionId, crate::partition::PartitionOwner>,
        ClientError,
    > {
        let feed = KvFeed::open(&self.js, &self.layout.partitions_bucket(), "p.>").await?;
        feed.snapshot()
            .await?
            .into_iter()
            .filter_map(|(key, value, _)| {
                let p = crate::partition::from_key(&key)?;
                Some(
                    codec::decode(&value)
                        .map(|owner| (p, owner))
                        .map_err(Into::into),
                )
            })
            .collect()
    }

    /// Each priority queue's state (paused or not, and by whom), highest priority first.
    pub async fn queue_states(
        &self,
    ) -> Result<Vec<(crate::spec::Priority, QueueState)>, ClientError> {
        let feed = KvFeed::open(&self.js, &self.layout.queues_bucket(), ">").await?;
        let mut states: Vec<(crate::spec::Priority, QueueState)> = crate::spec::Priority::ALL
            .into_iter()
            .map(|p| {
                let running = QueueState {
                    paused: false,
                    by: String::new(),
                };
                (p, running)
            })
            .collect();
        for (key, value, _) in feed.snapshot().await? {
            let state: QueueState = codec::decode(&value)?;
            if let Some(slot) = states.iter_mut().find(|(p, _)| p.as_str() == key) {
                slot.1 = state;
            }
        }
        Ok(states)
    }

    /// Every namespace's stored settings (`ax namespace set`), by namespace; a namespace
    /// without an entry has the defaults (weight 1, no quota).
    pub async fn namespace_settings(
        &self,
    ) -> Result<
        std::collections::BTreeMap<crate::ids::Namespace, crate::messages::NamespaceSettings>,
        ClientError,
    > {
        use crate::messages::NamespaceSettings;
        let filter = format!("{}>", NamespaceSettings::KEY_PREFIX);
        let feed = KvFeed::open(&self.js, &self.layout.queues_bucket(), &filter).await?;
        let mut settings = std::collections::BTreeMap::new();
        for (key, value, _) in feed.snapshot().await? {
            let Some(namespace) = NamespaceSettings::namespace_of(&key) else {
                continue;
            };
            settings.insert(namespace, codec::decode(&value)?);
        }
        Ok(settings)
    }

    /// Stream `name`'s config, state and cluster, as its leader says now.
    pub async fn stream_info(&self, name: &str) -> Result<jetstream::stream::Info, ClientError> {
        let what = || format!("read stream {name}");
        let mut stream = self.js.get_stream(name).await.during(what)?;
        Ok(stream.info().await.during(what)?.clone())
    }

    /// One instance's record and revision.
    pub async fn instance(
        &self,
        id: &InstanceId,
    ) -> Result<Option<(InstanceRecord, u64)>, ClientError> {
        match self
            .instances
            .entry(id)
            .await
            .during(|| format!("read instance {id}"))?
        {
            Some(entry) if entry.operation == kv::Operation::Put => {
                Ok(Some((codec::decode(&entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// A feed over every instance record: the current ones, then every change (how the
    /// console keeps its index of instances without reading them all per page).
    pub async fn instance_feed(&self) -> Result<MergedFeed, ClientError> {
        self.instances.feed(&self.js, None, false).await
    }

    /// A feed over the records of one job's instances (or all), for readers that go through
    /// them one at a time instead of holding them all ([`AxClient::instances`]).
    pub async fn instances_feed(&self, job: Option<&JobName>) -> Result<MergedFeed, ClientError> {
        self.instances
            .feed(&self.js, job.map(JobName::as_str), false)
            .await
    }

    /// The records of one job's instances (or all), oldest first.
    pub async fn instances(
        &self,
        job: Option<&JobName>,
    ) -> Result<Vec<InstanceRecord>, ClientError> {
        let feed = self.instances_feed(job).await?;
        let mut records: Vec<InstanceRecord> = feed
            .snapshot()
            .await?
            .into_iter()
            .map(|(_, value, _)| codec::decode(&value))
            .collect::<Result<_, _>>()?;
        records.sort_by(|a, b| {
            (a.expected_time, &a.instance_id).cmp(&(b.expected_time, &b.instance_id))
        });
        Ok(records)
    }

    /// Writes a new instance record if none exists under its id; true when this call's record
    /// is the one stored. A record already there with the same trace id is this creation's own
    /// earlier write (its ack was lost): true too.
    pub async fn create_instance(&self, record: &InstanceRecord) -> Result<bool, ClientError> {
        let id = &record.instance_id;
        let mut stamped = record.clone();
        stamped.written_by = self.writer.clone();
        match self.create_record(&stamped).await? {
            Created::Written => Ok(true),
            Created::Exists(trace) if trace == record.trace_id => Ok(true),
            Created::Exists(_) => {
                tracing::debug!(instance = %id, "already created elsewhere: deduplicated");
                Ok(false)
            }
        }
    }

    /// Puts `value` under `key` in `bucket` without waiting: the returned future is the
    /// server's ack. Writes published in order on this connection are applied in order.
    pub async fn kv_put_pipelined(
        &self,
        bucket: &str,
        key: &str,
        value: bytes::Bytes,
    ) -> Result<jetstream::context::PublishAckFuture, ClientError> {
        self.js
            .publish(format!("$KV.{bucket}.{key}"), value)
            .await
            .during(|| format!("put {bucket}/{key}"))
            .map_err(ClientError::from)
    }

    /// Deletes `key` from `bucket` without waiting (see [`AxClient::kv_put_pipelined`]).
    pub async fn kv_delete_pipelined(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<jetstream::context::PublishAckFuture, ClientError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("KV-Operation", "DEL");
        self.js
            .publish_with_headers(format!("$KV.{bucket}.{key}"), headers, bytes::Bytes::new())
            .await
            .during(|| format!("delete {bucket}/{key}"))
            .map_err(ClientError::from)
    }

    /// Applies `transition` to an instance record with compare-and-swap, re-reading and
    /// re-applying on a concurrent write, so that every writer's rules see the latest state.
    pub async fn update_instance<F>(
        &self,
        id: &InstanceId,
        transition: F,
    ) -> Result<Updated, ClientError>
    where
        F: Fn(&InstanceRecord) -> Result<InstanceRecord, TransitionRefused>,
    {
        self.update_instance_from(id, None, transition).await
    }

    /// [`AxClient::update_instance`] starting from a record and revision the caller knows
    /// (`known`: its own last write, or the creator's, handed on with the work), which saves
    /// the read when nobody changed the record since. A stale one costs
    /// a refused write, then the read; a transition it refuses is decided again on the record
    /// read fresh.
    pub async fn update_instance_from<F>(
        &self,
        id: &InstanceId,
        known: Option<StoredRecord>,
        transition: F,
    ) -> Result<Updated, ClientError>
    where
        F: Fn(&InstanceRecord) -> Result<InstanceRecord, TransitionRefused>,
    {
        self.update_instance_at(id, known, |record, _| transition(record))
            .await
    }

    /// [`AxClient::update_instance_from`] whose `transition` also sees the revision it is
    /// applied to, the one the write swaps from (an `executing` write records it as its
    /// fence).
    pub async fn update_instance_at<F>(
        &self,
        id: &InstanceId,
        mut known: Option<StoredRecord>,
        transition: F,
    ) -> Result<Updated, ClientError>
    where
        F: Fn(&InstanceRecord, u64) -> Result<InstanceRecord, TransitionRefused>,
    {
        for _ in 0..CAS_ATTEMPTS {
            let (record, revision, unverified) = match known.take() {
                Some(StoredRecord { record, revision }) => (*record, revision, true),
                None => match self.instance(id).await? {
                    Some((record, revision)) => (record, revision, false),
                    None => return Ok(Updated::Missing),
                },
            };
            let mut next = match transition(&record, revision) {
                Ok(next) => next,
                Err(_) if unverified => continue,
                Err(refused) => return Ok(Updated::Refused(refused)),
            };
            next.written_by = self.writer.clone();
            crate::history::prepare_write(&record, revision, &mut next);
            if let Some(revision) = self.write_record(id, &next, revision).await? {
                return Ok(Updated::Written(Box::new(next), revision));
            }
        }
        Err(NatsError::new(
            format!("update instance {id}"),
            Reason(format!("still contended after {CAS_ATTEMPTS} attempts")),
        )
        .into())
    }
}

#[cfg(test)]
mod url_tests {
    use super::*;

    #[test]
    fn credentials_come_from_the_url_and_never_go_back_out() {
        let urls = "nats://10.0.0.1:4222, nats://ax:s3cret@10.0.0.2:4222";
        assert_eq!(server_list(urls).len(), 2);
        assert_eq!(
            url_userinfo(urls),
            Some(("ax".to_string(), Some("s3cret".to_string())))
        );
        assert_eq!(
            url_userinfo("nats://tok@h:4222"),
            Some(("tok".to_string(), None))
        );
        assert_eq!(url_userinfo("nats://h:4222"), None);
        assert_eq!(redact("nats://tok@h:4222"), "nats://***@h:4222");
        assert_eq!(
            redact(urls),
            "nats://10.0.0.1:4222,nats://ax:***@10.0.0.2:4222"
        );
    }
}

#[cfg(test)]
mod inbox_tests {
    use super::NatsAuth;

    #[test]
    fn each_user_gets_its_own_inbox_prefix_unless_one_is_set() {
        let auth = NatsAuth::default();
        assert_eq!(auth.inbox(Some("app")), Ok(Some("_INBOX.app".into())));
        assert_eq!(auth.inbox(None), Ok(None));
        // A name that is not one subject token keeps the library's prefix.
        assert_eq!(auth.inbox(Some("a.b")), Ok(None));
        assert_eq!(auth.inbox(Some("a*")), Ok(None));
        let set = |p: &str| NatsAuth {
            inbox_prefix: Some(p.into()),
            ..NatsAuth::default()
        };
        assert_eq!(
            set("_INBOX.etl.w1").inbox(Some("app")),
            Ok(Some("_INBOX.etl.w1".into()))
        );
        for bad in [
            "INBOX.app",
            "_INBOX.",
            "_INBOX.a.>",
            "_INBOX.a b",
            "_INBOX..a",
        ] {
            let e = set(bad).inbox(None).unwrap_err();
            assert!(e.contains(&format!("inbox_prefix `{bad}`")), "{e}");
        }
    }
}
