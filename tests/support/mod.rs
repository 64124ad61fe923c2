//! What every integration test needs: its own nats-server (free port, temporary store, stopped
//! on drop), `ax` processes that die with the test, and waiting on conditions with deadlines
//! rather than bare sleeps.

pub(crate) mod browser;
pub(crate) mod ledger;
pub(crate) mod netns;
pub(crate) mod python;
pub(crate) mod up;
pub(crate) mod verdict;
pub(crate) mod webhook;

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ax_bus::client::local_server::{find_binary, LocalServer, ServerOptions};
use ax_bus::client::{AxClient, ConnectConfig};
use ax_bus::InstanceRecord;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A nats-server of the test's own.
pub(crate) struct TestNats {
    pub server: LocalServer,
    pub dir: tempfile::TempDir,
    /// `user:password` that `url()` carries, for a server with authorization.
    pub userinfo: Option<String>,
}

impl TestNats {
    pub(crate) fn start() -> Self {
        Self::start_with_config(None, None)
    }

    /// A server with this config file text (`-c`), and the `user:password` its URL carries.
    pub(crate) fn start_with_config(config: Option<&str>, userinfo: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut extra_args = Vec::new();
        if let Some(text) = config {
            let file = dir.path().join("nats-server.conf");
            std::fs::write(&file, text).expect("write the server config");
            extra_args = vec!["-c".to_string(), file.display().to_string()];
        }
        let server = start_on_a_free_port(|| {
            LocalServer::start(ServerOptions {
                binary: find_binary().expect("nats-server (run scripts/install-nats-server)"),
                port: Some(free_port()),
                store_dir: dir.path().join("store"),
                log_file: None,
                extra_args: extra_args.clone(),
            })
        });
        Self {
            server,
            dir,
            userinfo: userinfo.map(str::to_string),
        }
    }

    pub(crate) fn url(&self) -> String {
        match &self.userinfo {
            Some(userinfo) => self
                .server
                .url
                .replacen("://", &format!("://{userinfo}@"), 1),
            None => self.server.url.clone(),
        }
    }

    pub(crate) async fn client(&self) -> AxClient {
        AxClient::connect_node(&ConnectConfig::new(self.url(), "ax-test"))
            .await
            .expect("connect to the test server")
    }

    /// An outage of `length`: the server stopped, and restarted on its port and store after
    /// that long (the length is what is tested, not a wait for something).
    pub(crate) async fn outage(&mut self, length: Duration) {
        self.server.stop();
        tokio::time::sleep(length).await;
        self.server
            .restart()
            .expect("nats-server restarts on its store");
    }

    /// A fresh directory inside the test's temp dir.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::create_dir_all(&path).expect("create test dir");
        path
    }
}

/// A port for a test's server: a random one below Linux's ephemeral range (32768 and up), so
/// that no outgoing connection of the tests running at the same time can be holding it, and
/// free when looked at.
pub(crate) fn free_port() -> u16 {
    loop {
        let port = rand::random_range(20_000..32_768);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Starts what `start` starts on ports it picks free, again on others while one was taken
/// first ([`on_free_ports`]).
pub(crate) fn start_on_a_free_port<T>(
    start: impl FnMut() -> Result<T, ax_bus::client::local_server::LocalServerError>,
) -> T {
    ax_bus::client::local_server::on_free_ports(start)
        .unwrap_or_else(|e| panic!("nats-server starts: {e}"))
}

/// Three clustered nats-servers on loopback, each with its own store.
pub(crate) struct TestCluster {
    pub servers: Vec<LocalServer>,
    pub dir: tempfile::TempDir,
}

impl TestCluster {
    pub(crate) fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let servers = start_on_a_free_port(|| Self::start_servers(dir.path()));
        Self { servers, dir }
    }

    /// The three servers, on new ports; none left running if one fails.
    fn start_servers(
        dir: &Path,
    ) -> Result<Vec<LocalServer>, ax_bus::client::local_server::LocalServerError> {
        let cluster_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let routes = cluster_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        cluster_ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let store_dir = dir.join(format!("s{i}"));
                // A try before this one may have left a store behind.
                let _ = std::fs::remove_dir_all(&store_dir);
                LocalServer::start(ServerOptions {
                    binary: find_binary().unwrap(),
                    port: Some(free_port()),
                    store_dir,
                    log_file: None,
                    extra_args: vec![
                        "-n".into(),
                        format!("s{i}"),
                        "--cluster_name".into(),
                        "ax-test".into(),
                        "--cluster".into(),
                        format!("nats://127.0.0.1:{port}"),
                        "--routes".into(),
                        routes.clone(),
                    ],
                })
            })
            .collect()
    }

    pub(crate) fn url(&self) -> String {
        self.servers
            .iter()
            .map(|s| s.url.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A client with streams and buckets at 3 replicas, once the cluster has its JetStream
    /// leader (stream creation is refused until then).
    pub(crate) async fn client(&self) -> AxClient {
        let mut config = ConnectConfig::new(self.url(), "ax-test");
        config.replicas = Some(3);
        wait_for(
            Duration::from_secs(60),
            "the cluster's JetStream",
            || async { AxClient::connect_node(&config).await.ok() },
        )
        .await
    }

    /// Waits until every stream and every durable consumer has a leader and both other
    /// replicas current: a replica still catching up could not take over, so losing a node
    /// before then is two failures at once, not one.
    pub(crate) async fn wait_replicated(&self, client: &AxClient) {
        use futures::StreamExt;
        let healthy = |cluster: Option<async_nats::jetstream::stream::ClusterInfo>| {
            cluster.is_some_and(|c| {
                c.leader.is_some() && c.replicas.len() == 2 && c.replicas.iter().all(|r| r.current)
            })
        };
        wait_for(
            Duration::from_secs(60),
            "every stream and consumer replicated",
            || async {
                let mut names = client.js.stream_names();
                while let Some(name) = names.next().await {
                    let mut stream = client.js.get_stream(name.ok()?).await.ok()?;
                    let info = stream.info().await.ok()?.clone();
                    if !healthy(info.cluster.clone()) {
                        println!(
                            "not replicated yet: stream {} {:?}",
                            info.config.name, info.cluster
                        );
                        return None;
                    }
                    let mut consumers = stream.consumers();
                    while let Some(info) = consumers.next().await {
                        let info = info.ok()?;
                        // Ephemeral consumers (watchers) live on one server by design.
                        if info.config.durable_name.is_some() && !healthy(info.cluster) {
                            println!("not replicated yet: consumer {:?}", info.name);
                            return None;
                        }
                    }
                }
                Some(())
            },
        )
        .await
    }
}

/// The `ax` binary under test.
pub(crate) fn ax_binary() -> &'static str {
    env!("CARGO_BIN_EXE_ax")
}

/// Runs an `ax` command to its end.
pub(crate) fn ax(nats: &str, args: &[&str]) -> Output {
    ax_in(nats, args, None)
}

/// Runs an `ax` command in `dir`.
pub(crate) fn ax_in(nats: &str, args: &[&str], dir: Option<&Path>) -> Output {
    let mut command = Command::new(ax_binary());
    command
        .args(args)
        .env("AX_NATS_URL", nats)
        .env_remove("RUST_LOG");
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    command.output().expect("run ax")
}

/// Stdout as text.
pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Stderr as text.
pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A long-running `ax` process (node, up, tail), killed when dropped.
pub(crate) struct AxProcess {
    pub child: Child,
    pub log: PathBuf,
}

impl AxProcess {
    /// Starts `ax <args>` with `AX_NATS_URL` set (when given) and its stderr in `log`.
    pub(crate) fn spawn(nats: Option<&str>, args: &[&str], dir: &Path, log: &Path) -> Self {
        Self::spawn_with_env(nats, args, dir, log, &[])
    }

    /// [`AxProcess::spawn`] with extra environment variables.
    pub(crate) fn spawn_with_env(
        nats: Option<&str>,
        args: &[&str],
        dir: &Path,
        log: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn_command(Command::new(ax_binary()), nats, args, dir, log, env)
    }

    /// [`AxProcess::spawn_with_env`] with `command` as the start of the command line (`ax`
    /// itself, or `ip netns exec <ns> ax`).
    pub(crate) fn spawn_command(
        mut command: Command,
        nats: Option<&str>,
        args: &[&str],
        dir: &Path,
        log: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        command
            .args(args)
            .current_dir(dir)
            .env_remove("AX_NATS_URL")
            // The whole log on stderr, for a failing test's output, unless `env` says otherwise.
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).expect("log file"));
        if let Some(nats) = nats {
            command.env("AX_NATS_URL", nats);
        }
        // SAFETY: one prctl call, async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        Self {
            child: command.spawn().expect("spawn ax"),
            log: log.to_path_buf(),
        }
    }

    /// `ax node` with the given roles and extra arguments.
    pub(crate) fn node(nats: &TestNats, name: &str, roles: &str, extra: &[&str]) -> Self {
        Self::node_at(&nats.url(), nats, name, roles, extra)
    }

    /// [`AxProcess::node`] with `config` (TOML) as its config file, `<name>/node.toml`.
    pub(crate) fn configured(nats: &TestNats, name: &str, roles: &str, config: &str) -> Self {
        let file = nats.path(name).join("node.toml");
        std::fs::write(&file, config).expect("write the node config");
        Self::node(
            nats,
            name,
            roles,
            &["--config", file.to_str().expect("utf-8 path")],
        )
    }

    /// [`AxProcess::node`] reaching `nats` by `url` (another user's credentials, say).
    pub(crate) fn node_at(
        url: &str,
        nats: &TestNats,
        name: &str,
        roles: &str,
        extra: &[&str],
    ) -> Self {
        Self::node_with_env(url, nats, name, roles, extra, &[])
    }

    /// [`AxProcess::node_at`] with extra environment variables.
    pub(crate) fn node_with_env(
        url: &str,
        nats: &TestNats,
        name: &str,
        roles: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let dir = nats.path(name);
        let data = dir.join("data");
        let mut args = vec![
            "node",
            "--roles",
            roles,
            "--id",
            name,
            "--data-dir",
            data.to_str().expect("utf-8 path"),
        ];
        args.extend_from_slice(extra);
        Self::spawn_with_env(Some(url), &args, &dir, &dir.join("node.log"), env)
    }

    pub(crate) fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// SIGKILL, as a crash.
    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait (up to `timeout`) for the exit status.
    pub(crate) fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let _ = kill(self.pid(), Signal::SIGTERM);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The process's log so far (for assertion messages).
    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (30 s at most) for this process, started with `AX_FAILPOINT=point`, to have
    /// killed itself there, and checks that its log says so.
    pub(crate) async fn died_at(&self, point: &str) {
        wait_for_logged(
            Duration::from_secs(30),
            &format!("the process to die at failpoint {point}"),
            &[self],
            || async { (!alive(self.pid().as_raw())).then_some(()) },
        )
        .await;
        let log = self.log_text();
        assert!(log.contains(&format!("failpoint {point} reached")), "{log}");
    }

    /// Lines of stdout, read on a thread and sent through a channel.
    pub(crate) fn stdout_lines(&mut self) -> std::sync::mpsc::Receiver<String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = self.child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        rx
    }
}

impl Drop for AxProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it returns `Some`, failing the test after `timeout` with `what`.
pub(crate) async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`wait_for`], printing the logs of `processes` when it times out.
pub(crate) async fn wait_for_logged<T, F, Fut>(
    timeout: Duration,
    what: &str,
    processes: &[&AxProcess],
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() >= deadline {
            for process in processes {
                eprintln!(
                    "---- {} ----\n{}",
                    process.log.display(),
                    process.log_text()
                );
            }
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The job's instance records.
pub(crate) async fn instances(client: &AxClient, job: &str) -> Vec<InstanceRecord> {
    let job = job.parse().expect("a job name");
    client.instances(Some(&job)).await.expect("list instances")
}

/// `Some` once an instance of `job` expected at or after `after` has succeeded (`None` while
/// reads fail too: a cluster electing leaders answers nothing for a moment).
pub(crate) async fn succeeded_since(
    client: &AxClient,
    job: &str,
    after: chrono::DateTime<chrono::Utc>,
) -> Option<()> {
    let job = job.parse().expect("a job name");
    client
        .instances(Some(&job))
        .await
        .ok()?
        .into_iter()
        .any(|r| r.state == ax_bus::State::Success && r.expected_time >= after)
        .then_some(())
}

/// A shell job's spec: `extra` (lines indented by two spaces, each ending in a newline) goes
/// between the name and `exec`.
pub(crate) fn shell_job(name: &str, extra: &str, command: &str) -> String {
    format!("version: v1\njob:\n  name: {name}\n{extra}  exec: {{ type: shell, command: '{command}' }}\n")
}

/// The lines of a file the jobs' commands append to, in order (none while it does not exist).
pub(crate) fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// [`lines_of`], sorted (for commands that ran in parallel).
pub(crate) fn sorted_lines_of(path: &Path) -> Vec<String> {
    let mut lines = lines_of(path);
    lines.sort();
    lines
}

/// Writes a job file in `dir` and returns its path.
pub(crate) fn job_file(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, yaml).expect("write job file");
    path
}

/// Whether a process runs (a zombie counts as gone).
pub(crate) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// Pids of processes whose command line contains `needle`.
pub(crate) fn pids_with(needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(needle) && alive(pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// Waits until a node has set up ax's streams and buckets at `url` (a command only reads
/// them: run before the first node has, it fails saying so); a client connected once it has.
pub(crate) async fn set_up(url: &str) -> AxClient {
    let config = ConnectConfig::new(url, "ax-test-probe");
    wait_for(
        Duration::from_secs(30),
        "a node to set up JetStream",
        || async { AxClient::connect(&config).await.ok() },
    )
    .await
}

/// Waits until a node has set up JetStream and a Scheduler runs at `url`: a command sent
/// before waits for its answer only the CLI's 30 s, which a loaded machine's start of the
/// nodes can outlast.
pub(crate) async fn scheduler_running(url: &str) {
    let client = set_up(url).await;
    wait_for(Duration::from_secs(60), "a Scheduler to run", || async {
        client
            .nodes()
            .await
            .ok()?
            .iter()
            .any(|n| n.scheduler.is_some())
            .then_some(())
    })
    .await;
}

/// Writes a job file and applies it with the CLI, once a Scheduler runs.
pub(crate) async fn apply_job(nats: &TestNats, name: &str, yaml: &str) {
    scheduler_running(&nats.url()).await;
    let file = job_file(&nats.path("jobs"), &format!("{name}.yaml"), yaml);
    let out = ax(
        &nats.url(),
        &["job", "apply", "-f", file.to_str().expect("utf-8 path")],
    );
    assert!(out.status.success(), "apply {name}: {}", stderr(&out));
}

/// Applies `up` and `down` (both no-ops; `down` depends on `up` of the same business date).
pub(crate) async fn apply_noop_chain(nats: &TestNats) {
    apply_job(
        nats,
        "up",
        "version: v1\njob: { name: up, exec: { type: noop } }\n",
    )
    .await;
    apply_job(
        nats,
        "down",
        "version: v1\njob:\n  name: down\n  deps: [{ name: up, biz_date: current }]\n  exec: { type: noop }\n",
    )
    .await;
}

/// `ax job trigger <args>`; returns the instance id it printed.
pub(crate) fn trigger(nats: &TestNats, args: &[&str]) -> String {
    let mut full = vec!["job", "trigger"];
    full.extend_from_slice(args);
    let out = ax(&nats.url(), &full);
    assert!(out.status.success(), "trigger {args:?}: {}", stderr(&out));
    stdout(&out)
        .split_whitespace()
        .next()
        .expect("an instance id")
        .to_string()
}

/// `worker`'s entry in `ax worker list --json` (its heartbeat), once listed.
pub(crate) fn worker_listed(nats: &TestNats, worker: &str) -> Option<serde_json::Value> {
    let out = ax(&nats.url(), &["worker", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    list.as_array()?
        .iter()
        .find(|w| w["worker"]["id"] == worker)
        .map(|w| w["worker"].clone())
}

/// Waits for an instance to reach a final state and returns its record.
pub(crate) async fn final_record(client: &AxClient, id: &str, within: Duration) -> InstanceRecord {
    let id: ax_bus::ids::InstanceId = id.parse().expect("an instance id");
    let id = &id;
    wait_for(within, &format!("{id} to end"), || async {
        client
            .instance(id)
            .await
            .expect("read instance")
            .map(|(r, _)| r)
            .filter(|r| r.state.is_final())
    })
    .await
}

/// Waits for an instance's attempt to be executing and returns its record.
pub(crate) async fn executing(client: &AxClient, id: &str, within: Duration) -> InstanceRecord {
    let id: ax_bus::ids::InstanceId = id.parse().expect("an instance id");
    let id = &id;
    wait_for(within, &format!("{id} to execute"), || async {
        let (record, _) = client.instance(id).await.ok()??;
        (record.tag == ax_bus::Tag::Executing).then_some(record)
    })
    .await
}

/// Reads one HTTP/1.1 request with a content-length body from a test server's socket:
/// (request line and headers, body).
pub(crate) async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::io::AsyncReadExt::read(socket, &mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&data).to_string();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let length: usize = text[..end]
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        if data.len() >= end + 4 + length {
            return Some((
                text[..end].to_string(),
                data[end + 4..end + 4 + length].to_vec(),
            ));
        }
    }
}

/// A job name the test writes as text.
pub(crate) fn job(name: &str) -> ax_bus::ids::JobName {
    name.parse().expect("a job name")
}

/// An instance id the test has as text (from the CLI's output, say).
pub(crate) fn id(text: &str) -> ax_bus::ids::InstanceId {
    text.parse().expect("an instance id")
}

/// A node (or worker) id the test writes as text.
pub(crate) fn node(name: &str) -> ax_bus::ids::NodeId {
    name.parse().expect("a node id")
}

/// Every result message in `AX_RESULTS`, oldest first.
pub(crate) async fn all_results(client: &AxClient) -> Vec<ax_bus::messages::ResultMessage> {
    let mut stream = client.js.get_stream("AX_RESULTS").await.unwrap();
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut all = Vec::new();
    for seq in 1..=last {
        if let Ok(message) = stream.get_raw_message(seq).await {
            all.push(ax_bus::codec::decode(&message.payload).unwrap());
        }
    }
    all
}

/// The results of `job`'s attempts, oldest first.
pub(crate) async fn results_of(
    client: &AxClient,
    job: &str,
) -> Vec<ax_bus::messages::ResultMessage> {
    all_results(client)
        .await
        .into_iter()
        .filter(|r| r.job == job)
        .collect()
}

/// Every alert of `kind` in `AX_ALERTS`, oldest first.
pub(crate) async fn alerts_of(client: &AxClient, kind: &str) -> Vec<ax_bus::messages::Alert> {
    let mut stream = client.js.get_stream("AX_ALERTS").await.unwrap();
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut all = Vec::new();
    for seq in 1..=last {
        if let Ok(message) = stream.get_raw_message(seq).await {
            let alert: ax_bus::messages::Alert = ax_bus::codec::decode(&message.payload).unwrap();
            if alert.kind.as_str() == kind {
                all.push(alert);
            }
        }
    }
    all
}
