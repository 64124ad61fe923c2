//! Real network partitions: every participant (a NATS server, an ax node) runs in a network
//! namespace of its own, joined to a bridge in the test's namespace by a veth pair, with an
//! address of its own on the bridge's subnet. Cutting a participant off sets its link down (it
//! loses everyone, and everyone loses it, as with a pulled cable); separating two drops their
//! packets to each other with blackhole routes in both namespaces, leaving every other path up.
//! Needs root (or CAP_NET_ADMIN) and `ip` (iproute2). Everything is removed on drop.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NETS: AtomicU32 = AtomicU32::new(0);

/// Runs `ip` with `args`; panics with the command and its error if it fails.
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs it, ignoring failure (clean-up of what may not exist).
fn run_quietly(program: &str, args: &[&str]) {
    let _ = Command::new(program).args(args).output();
}

/// One participant.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    /// The namespace.
    pub ns: String,
    /// The veth end on the bridge.
    host_veth: String,
    /// Its address.
    pub ip: Ipv4Addr,
}

/// A bridge and its members.
#[derive(Debug)]
pub(crate) struct Net {
    tag: String,
    bridge: String,
    subnet: u8,
    members: BTreeMap<String, Member>,
    /// Pairs whose packets are dropped.
    separated: BTreeSet<(String, String)>,
}

impl Net {
    /// A new bridge with an address of its own (the test reaches the members through it).
    pub(crate) fn create() -> Self {
        let n = NETS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}{n}", std::process::id() % 100_000);
        // 10.<200 + pid % 50>.<n>.0/24: distinct per test process and per net.
        let subnet = (n % 250) as u8;
        let bridge = format!("axb{tag}");
        run("ip", &["link", "add", &bridge, "type", "bridge"]);
        let net = Self {
            tag,
            bridge,
            subnet,
            members: BTreeMap::new(),
            separated: BTreeSet::new(),
        };
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", net.address(1)),
                "dev",
                &net.bridge,
            ],
        );
        run("ip", &["link", "set", &net.bridge, "up"]);
        net
    }

    fn address(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 200 + (std::process::id() % 50) as u8, self.subnet, host)
    }

    /// Adds a member named `name` (a short name: it goes into interface names).
    pub(crate) fn add(&mut self, name: &str) -> Member {
        let index = self.members.len() as u8 + 2;
        let ns = format!("ax{}-{name}", self.tag);
        let host_veth = format!("axh{}{index}", self.tag);
        let inner = format!("axi{}{index}", self.tag);
        run("ip", &["netns", "add", &ns]);
        run(
            "ip",
            &[
                "link", "add", &host_veth, "type", "veth", "peer", "name", &inner,
            ],
        );
        run("ip", &["link", "set", &inner, "netns", &ns]);
        run("ip", &["link", "set", &host_veth, "master", &self.bridge]);
        run("ip", &["link", "set", &host_veth, "up"]);
        let ip = self.address(index);
        let exec = |args: &[&str]| {
            let mut full = vec!["netns", "exec", &ns];
            full.extend_from_slice(args);
            run("ip", &full);
        };
        exec(&["ip", "link", "set", "lo", "up"]);
        exec(&["ip", "link", "set", &inner, "name", "eth0"]);
        exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        exec(&["ip", "link", "set", "eth0", "up"]);
        let member = Member { ns, host_veth, ip };
        self.members.insert(name.to_string(), member.clone());
        member
    }

    /// The member named `name`.
    pub(crate) fn member(&self, name: &str) -> &Member {
        &self.members[name]
    }

    /// `program` to run inside `name`'s namespace (`ip netns exec` execs it: the pid is its).
    pub(crate) fn command(&self, name: &str, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.members[name].ns, program]);
        command
    }

    /// Cuts `name` off from everyone.
    pub(crate) fn cut(&self, name: &str) {
        run(
            "ip",
            &["link", "set", &self.members[name].host_veth, "down"],
        );
    }

    /// Joins `name` back.
    pub(crate) fn heal(&self, name: &str) {
        run("ip", &["link", "set", &self.members[name].host_veth, "up"]);
    }

    /// Drops every packet between `a` and `b`, both ways (a blackhole route to the other in
    /// each namespace); their other paths stay up.
    pub(crate) fn separate(&mut self, a: &str, b: &str) {
        if self.separated.insert(pair(a, b)) {
            self.blackhole("add", a, b);
            self.blackhole("add", b, a);
        }
    }

    /// Undoes [`Net::separate`].
    pub(crate) fn join(&mut self, a: &str, b: &str) {
        if self.separated.remove(&pair(a, b)) {
            self.blackhole("del", a, b);
            self.blackhole("del", b, a);
        }
    }

    /// Adds or deletes, in `from`'s namespace, the blackhole route to `to`.
    fn blackhole(&self, verb: &str, from: &str, to: &str) {
        let dst = format!("{}/32", self.members[to].ip);
        run(
            "ip",
            &[
                "netns",
                "exec",
                &self.members[from].ns,
                "ip",
                "route",
                verb,
                "blackhole",
                &dst,
            ],
        );
    }
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a < b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for member in self.members.values() {
            // Killing what still runs inside first: a namespace with processes stays.
            if let Ok(out) = Command::new("ip")
                .args(["netns", "pids", &member.ns])
                .output()
            {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    run_quietly("kill", &["-9", pid]);
                }
            }
            run_quietly("ip", &["link", "del", &member.host_veth]);
            run_quietly("ip", &["netns", "del", &member.ns]);
        }
        run_quietly("ip", &["link", "del", &self.bridge]);
    }
}
