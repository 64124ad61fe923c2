//! Command templates against a real `sh -c`: a command made of fuzz-chosen fragments (lines
//! whose quotes, comments, here-documents and substitutions a naive reader would misread, then
//! a placeholder in one of the places a user puts one) and a fuzz-chosen value. The rendered
//! command runs with the value in the environment only, as a worker runs it; the value must
//! come out whole — unsplit, unglobbed, never executed. The shell text is only ever the fixed
//! fragments: the fuzzer's bytes never reach the shell as code.
#![no_main]

use std::collections::BTreeMap;

use ax_bus::spec::template::{param_env_name, Scope, Template};
use libfuzzer_sys::fuzz_target;

const PREFIXES: &[&str] = &[
    "# say \"hi",
    "# don't",
    "true # it's",
    ": \"it's\"",
    ": 'say \"hi'",
    ": \"$(echo \"it's\")\"",
    ": `echo \"'\"`",
    ": $(: ')')",
    ": <<EOF\nit's \"x\nEOF",
    ": <<'EOF'\n\"it's\nEOF",
    ": <<-EOF\n\tit's\n\tEOF",
    "x='a \"b' y=\"c 'd\"",
    ": \\' \\\"",
    "case x in (x) : \"'\" ;; esac",
];

/// What the shell prints for a value at a spot.
type Printed = fn(&str) -> String;

const SPOTS: &[(&str, Printed)] = &[
    ("printf '[%s]' {{params.p}}", |v| format!("[{v}]")),
    ("printf '[%s]' \"x{{params.p}}y\"", |v| format!("[x{v}y]")),
    ("printf '[%s]' 'x{{params.p}}y'", |v| format!("[x{v}y]")),
    ("printf '[%s]' \"$(printf %s {{params.p}})\"", |v| {
        format!("[{}]", v.trim_end_matches('\n'))
    }),
    ("printf '[%s]' \"`printf %s {{params.p}}`\"", |v| {
        format!("[{}]", v.trim_end_matches('\n'))
    }),
    ("cat <<EOF\n[{{params.p}}]\nEOF", |v| format!("[{v}]\n")),
    ("for a in {{params.p}}; do printf '[%s]' \"$a\"; done", |v| format!("[{v}]")),
];

fuzz_target!(|input: (Vec<u8>, u8, String)| {
    let (prefixes, spot, value) = input;
    if value.is_empty() || value.contains('\0') || value.len() > 256 || prefixes.len() > 6 {
        return;
    }
    let (text, expected) = SPOTS[usize::from(spot) % SPOTS.len()];
    let mut command: Vec<&str> = prefixes
        .iter()
        .map(|i| PREFIXES[usize::from(*i) % PREFIXES.len()])
        .collect();
    command.push(text);
    let command = command.join("\n");
    let declared = BTreeMap::from([("p".to_string(), serde_json::Value::Null)]);
    let rendered = Template::parse(&command, &Scope::params(&declared))
        .expect("the fragments parse")
        .render_shell();
    let dir = std::env::temp_dir().join(format!("ax-fuzz-shell-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    for name in ["g1", "g2"] {
        std::fs::write(dir.join(name), "").expect("a file to glob");
    }
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&rendered)
        .env(param_env_name("p"), &value)
        .current_dir(&dir)
        .output()
        .expect("sh runs");
    assert!(out.status.success(), "{rendered}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected(&value), "{rendered}");
});
