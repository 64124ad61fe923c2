//! Every state-changing route of the console, declared once with what it does.
//!
//! A module declares its change routes with [`changes!`]: each line is a method, a path as the
//! router takes it and what the route does — send a control command, decide an approval, or
//! change nothing anywhere. The server mounts the routes from these lines ([`mount`]) and the
//! access check finds the role a request needs in the same lines ([`does`]), so no change
//! route exists without its line. A route that sends a command needs that command's role
//! ([`ax_bus::auth::role_of`], an exhaustive match over the commands), as the Scheduler checks
//! again; a request no line matches needs an admin.
//!
//! A route that takes one of a few actions in its last segment has a line per action, its
//! segment held to that word (`{action:pause}`), so each action needs its own command's role.

use actix_web::web;

use ax_bus::auth::Role;
use ax_bus::messages::commands::Command;

/// What a state-changing route does, for the role it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Does {
    /// Sends this control command: it needs the command's role.
    Command(Command),
    /// Decides an approval: an admin's.
    Decide,
    /// Changes nothing anywhere (a check, signing in or out): needs `role`.
    Nothing(Role),
}

/// One change route.
#[derive(Debug)]
pub(crate) struct Line {
    /// `POST`, `DELETE`, ….
    pub(crate) method: &'static str,
    /// Its path as the router takes it: `{name}` one segment, `{name:word}` only that word.
    pub(crate) path: &'static str,
    /// What it does.
    pub(crate) does: Does,
}

/// A module's change routes: the lines, and what mounts them.
pub(crate) struct Changes {
    pub(crate) lines: &'static [Line],
    pub(crate) mount: fn(&mut web::ServiceConfig),
}

/// Declares a module's change routes as `METHOD "path" => handler, does;`: a `CHANGES` of
/// the lines and of the function that mounts exactly them.
macro_rules! changes {
    ($($method:ident $path:literal => $handler:path, $does:expr;)+) => {
        /// This module's state-changing routes, and what each does.
        pub(crate) const CHANGES: $crate::changes::Changes = $crate::changes::Changes {
            lines: &[$($crate::changes::Line {
                method: stringify!($method),
                path: $path,
                does: $does,
            },)+],
            mount: |config: &mut actix_web::web::ServiceConfig| {
                $(config.route(
                    $path,
                    actix_web::web::method(actix_web::http::Method::$method).to($handler),
                );)+
            },
        };
    };
}
pub(crate) use changes;

/// Every module's change routes: what the server mounts and the check reads.
const TABLES: &[Changes] = &[
    crate::api::CHANGES,
    crate::pages::editor::CHANGES,
    crate::pages::jobs::CHANGES,
    crate::pages::fleet::CHANGES,
    crate::pages::dead_letters::CHANGES,
    crate::pages::instances::CHANGES,
    crate::pages::trail::CHANGES,
    crate::pages::login::CHANGES,
];

/// Every change route's line.
fn lines() -> impl Iterator<Item = &'static Line> {
    TABLES.iter().flat_map(|table| table.lines)
}

/// Mounts every change route.
pub(crate) fn mount(config: &mut web::ServiceConfig) {
    for table in TABLES {
        (table.mount)(config);
    }
}

/// What the change route `method path` does, if a line has it.
pub(crate) fn does(method: &str, path: &str) -> Option<Does> {
    lines()
        .find(|line| line.method == method && shaped(line.path, path))
        .map(|line| line.does)
}

/// Whether `path` has `pattern`'s shape: `{name}` stands for one non-empty segment,
/// `{name:word}` for that word only, anything else for itself.
fn shaped(pattern: &str, path: &str) -> bool {
    let (mut want, mut have) = (pattern.split('/'), path.split('/'));
    loop {
        match (want.next(), have.next()) {
            (None, None) => return true,
            (Some(w), Some(h)) if w.starts_with('{') && w.ends_with('}') => {
                let held = w[1..w.len() - 1].split_once(':').map(|(_, word)| word);
                match held {
                    Some(word) if h != word => return false,
                    _ if h.is_empty() => return false,
                    _ => {}
                }
            }
            (Some(w), Some(h)) if w == h => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_stands_for_any_one_or_for_its_word() {
        assert!(shaped(
            "/ui/jobs/{name}/{action:pause}",
            "/ui/jobs/etl/pause"
        ));
        assert!(!shaped(
            "/ui/jobs/{name}/{action:pause}",
            "/ui/jobs/etl/resume"
        ));
        assert!(!shaped("/ui/jobs/{name}/{action:pause}", "/ui/jobs//pause"));
        assert!(!shaped("/ui/jobs/{name}", "/ui/jobs/etl/pause"));
        assert!(shaped("/api/v1/rerun", "/api/v1/rerun"));
    }

    /// A word held in a segment is a plain word: the router reads it as a regular expression,
    /// and [`shaped`] as a word, so the two agree only on words.
    #[test]
    fn every_line_is_one_route_whose_held_segments_are_plain_words() {
        let mut seen = std::collections::BTreeSet::new();
        for line in lines() {
            assert!(
                seen.insert((line.method, line.path)),
                "{} {} is declared twice",
                line.method,
                line.path
            );
            for segment in line.path.split('/') {
                if let Some((_, word)) = segment
                    .strip_prefix('{')
                    .and_then(|s| s.strip_suffix('}'))
                    .and_then(|s| s.split_once(':'))
                {
                    assert!(
                        !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase()),
                        "{}: `{word}` is not a plain word",
                        line.path
                    );
                }
            }
        }
        assert!(seen.len() > 25, "{seen:?}");
    }

    /// Change routes are declared with [`changes!`] only: none is mounted past the table.
    #[test]
    fn no_change_route_is_mounted_but_from_the_table() {
        fn walk(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, String)>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    out.push((path, text));
                }
            }
        }
        let mut sources = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut sources,
        );
        for (path, text) in &sources {
            for method in ["post", "put", "delete", "patch"] {
                let call = format!("web::{method}()");
                assert!(
                    !text.contains(&call),
                    "{}: mounts a change route with {call}; declare it with changes! instead",
                    path.display()
                );
            }
        }
    }
}
