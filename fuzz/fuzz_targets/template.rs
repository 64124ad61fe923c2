//! Command templates: any text parsed against a scope, and rendered for a shell, as single
//! arguments and as SQL binds.
#![no_main]

use std::collections::BTreeMap;

use ax_bus::spec::template::{Scope, Template};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let params = BTreeMap::from([("table".to_string(), serde_json::json!("orders"))]);
    let scope = Scope::params(&params);
    if let Ok(template) = Template::parse(text, &scope) {
        let _ = template.render_shell();
        let _ = template.render_value(&|p| p.env_name());
        let _ = template.placeholders().count();
        let _ = template.render_bind(&|i| format!("${i}"));
    }
});
