//! The JSON Schema of every role's report, generated from the report types themselves
//! (`schemars`), so a schema cannot drift from what `--json` prints. `docs/<name>.schema.json`
//! holds each; a test fails when one differs from what the types say (regenerate them with
//! `FLOWLANE_WRITE_SCHEMAS=1 cargo test -p flowlane-tools --lib schema`), and the CLI's tests
//! validate real reports against them. (`bench`'s `report.json` and `rfc2544`'s report keep
//! their hand-written schemas, `docs/report.schema.json` and `docs/rfc2544.schema.json`.)

use schemars::{schema_for, Schema};

/// (name, schema) of each generated report schema: `docs/<name>.schema.json`.
pub fn all() -> Vec<(&'static str, Schema)> {
    vec![
        ("blast", schema_for!(crate::blast::BlastJson)),
        ("sink", schema_for!(crate::sink::SinkReport)),
        ("serve", schema_for!(crate::serve::ServeReport)),
        ("forward", schema_for!(crate::forward::ForwardReport)),
        ("http-load", schema_for!(crate::http::HttpLoadReport)),
        ("http-serve", schema_for!(crate::http::HttpServeReport)),
        ("route-bench", schema_for!(crate::route::RouteBenchReport)),
        ("route-lookup", schema_for!(crate::route::LookupReport)),
        ("hash", schema_for!(crate::rss::HashReport)),
        ("pick", schema_for!(crate::rss::PickReport)),
        ("rss-show", schema_for!(crate::rss::ShowReport)),
        ("top", schema_for!(crate::top::TopReport)),
        ("rss-verify", schema_for!(crate::verify::VerifyReport)),
        ("doctor", schema_for!(crate::doctor::DoctorReport)),
        ("latency", schema_for!(crate::latency::LatencyReport)),
        ("isolate", schema_for!(crate::isolate::IsolateReport)),
        (
            "lab-status",
            schema_for!(flowlane_lab::setup::LabStatusReport),
        ),
    ]
}

/// A schema as the file holds it: pretty JSON and a final newline.
pub fn text(s: &Schema) -> String {
    let mut t = serde_json::to_string_pretty(s).unwrap_or_default();
    t.push('\n');
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every generated schema is the one in docs/ (or, with `FLOWLANE_WRITE_SCHEMAS` set, is
    /// written there).
    #[test]
    fn the_schemas_in_docs_are_the_report_types() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        let write = std::env::var_os("FLOWLANE_WRITE_SCHEMAS").is_some();
        for (name, schema) in all() {
            let path = docs.join(format!("{name}.schema.json"));
            let want = text(&schema);
            if write {
                std::fs::write(&path, &want).expect("write the schema");
                continue;
            }
            let have = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                have == want,
                "{} is not what the report type says: regenerate it with \
                 FLOWLANE_WRITE_SCHEMAS=1 cargo test -p flowlane-tools --lib schema",
                path.display()
            );
        }
    }
}
