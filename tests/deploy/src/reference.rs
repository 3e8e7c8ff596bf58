//! The reference pages under `docs/reference/`: every field of the Job and Dataset specs and
//! every setting of each service, rendered from the types' JSON schemas (their doc comments,
//! serde names and defaults), so the pages cannot drift from the code.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use schemars::{JsonSchema, Schema};
use serde_json::{Map, Value};

/// One generated page: where it goes and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Path under `docs/reference/`.
    pub file: String,
    /// The page's Markdown.
    pub text: String,
}

/// Every reference page.
pub fn pages() -> Vec<Page> {
    use primus_config as config;
    let mut pages = vec![
        page::<primus_spec::job::JobSpec>(
            "job.md",
            "Job",
            "The `spec` of a `kind: Job` resource.",
            "spec",
        ),
        page::<primus_spec::dataset::DatasetSpec>(
            "dataset.md",
            "Dataset",
            "The `spec` of a `kind: Dataset` resource.",
            "spec",
        ),
    ];
    pages.extend([
        settings_page::<config::ApiServerSettings>(
            "settings/api-server.md",
            "primus-api-server settings",
        ),
        settings_page::<config::MasterSettings>("settings/master.md", "primus-master settings"),
        settings_page::<config::PsSettings>("settings/ps.md", "primus-ps settings"),
        settings_page::<config::DataExecutorSettings>(
            "settings/data-executor.md",
            "primus-data-executor settings",
        ),
        settings_page::<config::TrainerSettings>("settings/trainer.md", "primus-trainer settings"),
        settings_page::<config::ServingSyncSettings>(
            "settings/serving-sync.md",
            "primus-serving-sync settings",
        ),
    ]);
    pages
}

const SETTINGS: &str = "Loaded from built-in defaults (the column below), then the \
                        `--config` file (YAML, TOML or JSON), then `PRIMUS_<SECTION>__<KEY>` \
                        environment variables (`server.grpc_addr` is \
                        `PRIMUS_SERVER__GRPC_ADDR`). `--print-settings` prints the result.";

/// The command that writes the pages again.
pub const BLESS: &str = "PRIMUS_BLESS=1 cargo test -p primus-deploy-check --test reference";

/// Definitions a settings page does not spell out: they are the Job's and Dataset's own,
/// on the other two pages.
const SPEC_TYPES: &[(&str, &str)] = &[
    ("ModelSpec", "the Job's `spec.model` ([job.md](../job.md))"),
    (
        "TableSpec",
        "a Job's `spec.model.tables[]` ([job.md](../job.md))",
    ),
    ("OptimizerSpec", "a Job's optimizer ([job.md](../job.md))"),
    (
        "HotSetSpec",
        "the Job's `spec.training.hot_set` ([job.md](../job.md))",
    ),
    (
        "DatasetSpec",
        "a Dataset's `spec` ([dataset.md](../dataset.md))",
    ),
    (
        "FeatureSchema",
        "a Dataset's `spec.schema` ([dataset.md](../dataset.md))",
    ),
];

/// A settings page: the defaults column shows the service's own defaults.
fn settings_page<T: JsonSchema + Default + serde::Serialize>(file: &str, title: &str) -> Page {
    let defaults = serde_json::to_value(T::default()).unwrap_or(Value::Null);
    render::<T>(file, title, SETTINGS, "", Some(&defaults))
}

/// A resource spec page: the defaults column shows what an absent field means.
fn page<T: JsonSchema>(file: &str, title: &str, intro: &str, root: &str) -> Page {
    render::<T>(file, title, intro, root, None)
}

fn render<T: JsonSchema>(
    file: &str,
    title: &str,
    intro: &str,
    root: &str,
    defaults: Option<&Value>,
) -> Page {
    let schema: Schema = schemars::schema_for!(T);
    let value = schema.to_value();
    let definitions = value
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut rows = Vec::new();
    let walker = Walker {
        definitions: &definitions,
        stop: if defaults.is_some() { SPEC_TYPES } else { &[] },
    };
    walker.object(&value, root, &mut rows);
    let mut text = format!("# {title}\n\n");
    text.push_str(&format!(
        "<!-- Generated from the types by `{BLESS}`; do not edit. -->\n\n"
    ));
    if let Some(description) = value.get("description").and_then(Value::as_str) {
        text.push_str(&one_line(description));
        text.push_str("\n\n");
    }
    text.push_str(intro);
    text.push_str("\n\n| field | type | default | meaning |\n| --- | --- | --- | --- |\n");
    for mut row in rows {
        if let Some(value) = defaults.and_then(|d| lookup(d, &row.path)) {
            row.default = match value {
                Value::Null => "unset".to_owned(),
                Value::Object(_) if row.expanded => String::new(),
                other => format!("`{}`", inline(other)),
            };
        }
        let _ = writeln!(
            text,
            "| `{}` | {} | {} | {} |",
            row.path,
            row.kind,
            row.default,
            escape(&row.meaning)
        );
    }
    Page {
        file: file.to_owned(),
        text,
    }
}

struct Row {
    path: String,
    kind: String,
    default: String,
    meaning: String,
    /// Its fields have rows of their own.
    expanded: bool,
}

struct Walker<'a> {
    definitions: &'a Map<String, Value>,
    /// Definitions described elsewhere: named, not expanded.
    stop: &'a [(&'a str, &'a str)],
}

impl Walker<'_> {
    /// The schema `schema` points at (following `$ref`).
    fn resolve<'s>(&'s self, schema: &'s Value) -> &'s Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let name = reference.rsplit('/').next().unwrap_or(reference);
                self.definitions.get(name).unwrap_or(schema)
            }
            None => schema,
        }
    }

    /// The rows of an object schema's properties, under `prefix`.
    fn object(&self, schema: &Value, prefix: &str, rows: &mut Vec<Row>) {
        let schema = self.resolve(schema);
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
            return;
        };
        let required = required_names(schema);
        let ordered: BTreeMap<&String, &Value> = properties.iter().collect();
        for (name, property) in ordered {
            let path = join(prefix, name);
            self.property(property, &path, required.contains(&name.as_str()), rows);
        }
    }

    fn property(&self, property: &Value, path: &str, required: bool, rows: &mut Vec<Row>) {
        let target = self.inner(property);
        if let Some(elsewhere) = self.described_elsewhere(target) {
            rows.push(Row {
                path: path.to_owned(),
                kind: self.kind(property),
                default: "unset".to_owned(),
                expanded: false,
                meaning: format!(
                    "{} As {elsewhere}.",
                    description(property).unwrap_or_default()
                ),
            });
            return;
        }
        let default = match property.get("default") {
            Some(Value::Null) => "unset".to_owned(),
            // A section's default is its fields' defaults, in the rows below it.
            Some(Value::Object(_)) => String::new(),
            Some(value) => format!("`{}`", inline(value)),
            None if required => "required".to_owned(),
            None => "unset".to_owned(),
        };
        let meaning = description(property)
            .or_else(|| description(target))
            .unwrap_or_default();
        let kind = self.kind(property);
        rows.push(Row {
            path: path.to_owned(),
            kind,
            default,
            meaning,
            expanded: true,
        });
        let resolved = self.resolve(target);
        if resolved.get("properties").is_some() {
            self.object(resolved, path, rows);
        } else if let Some(items) = resolved.get("items") {
            let item = self.resolve(self.inner(items));
            if item.get("properties").is_some() {
                self.object(item, &format!("{path}[]"), rows);
            } else if let Some(variants) = item.get("oneOf").and_then(Value::as_array) {
                self.variants(variants, &format!("{path}[]"), rows);
            }
        } else if let Some(variants) = resolved.get("oneOf").and_then(Value::as_array) {
            self.variants(variants, path, rows);
        }
    }

    /// The fields of each variant of a tagged enum (`kind: adagrad` and its fields).
    fn variants(&self, variants: &[Value], path: &str, rows: &mut Vec<Row>) {
        for variant in variants {
            let variant = self.resolve(variant);
            let Some(properties) = variant.get("properties").and_then(Value::as_object) else {
                continue;
            };
            let Some((tag, value)) = properties
                .iter()
                .find_map(|(name, p)| Some((name, p.get("const")?.as_str()?)))
            else {
                continue;
            };
            let prefix = format!("{path} ({tag}: {value})");
            let required = required_names(variant);
            let ordered: BTreeMap<&String, &Value> = properties.iter().collect();
            for (name, property) in ordered {
                if name == tag {
                    continue;
                }
                let field = join(&prefix, name);
                self.property(property, &field, required.contains(&name.as_str()), rows);
            }
        }
    }

    /// Where a definition this page does not expand is described.
    fn described_elsewhere(&self, schema: &Value) -> Option<&str> {
        let mut schema = schema;
        if let Some(items) = schema.get("items") {
            schema = self.inner(items);
        }
        let name = schema.get("$ref")?.as_str()?.rsplit('/').next()?;
        self.stop
            .iter()
            .find(|(stopped, _)| *stopped == name)
            .map(|(_, elsewhere)| *elsewhere)
    }

    /// The schema under an `Option` (`anyOf: [T, null]`), or the schema itself.
    fn inner<'s>(&'s self, schema: &'s Value) -> &'s Value {
        match schema.get("anyOf").and_then(Value::as_array) {
            Some(options) => options
                .iter()
                .find(|o| o.get("type").and_then(Value::as_str) != Some("null"))
                .unwrap_or(schema),
            None => schema,
        }
    }

    /// A short name of a property's type.
    fn kind(&self, schema: &Value) -> String {
        let inner = self.inner(schema);
        let resolved = self.resolve(inner);
        if let Some(values) = resolved.get("enum").and_then(Value::as_array) {
            return values.iter().map(inline).collect::<Vec<_>>().join(" \\| ");
        }
        if let Some(variants) = resolved.get("oneOf").and_then(Value::as_array) {
            let names: Vec<String> = variants
                .iter()
                .filter_map(|v| {
                    let v = self.resolve(v);
                    if let Some(value) = v.get("const") {
                        return Some(inline(value));
                    }
                    if let Some(values) = v.get("enum").and_then(Value::as_array) {
                        return Some(values.iter().map(inline).collect::<Vec<_>>().join(" \\| "));
                    }
                    v.get("properties")?
                        .as_object()?
                        .values()
                        .find_map(|p| Some(format!("kind {}", inline(p.get("const")?))))
                })
                .collect();
            return names.join(" \\| ");
        }
        let types = match resolved.get("type") {
            Some(Value::String(kind)) => vec![kind.clone()],
            Some(Value::Array(kinds)) => kinds
                .iter()
                .filter_map(Value::as_str)
                .filter(|k| *k != "null")
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        match types.first().map(String::as_str) {
            Some("array") => {
                let item = resolved
                    .get("items")
                    .map(|i| self.kind(i))
                    .unwrap_or_default();
                format!("list of {item}")
            }
            Some("object") if resolved.get("properties").is_some() => "section".to_owned(),
            Some("object") => "map".to_owned(),
            Some(kind) => kind.to_owned(),
            None => "value".to_owned(),
        }
    }
}

/// The value at a dotted settings path (`server.grpc_addr`) in `defaults`.
fn lookup<'v>(defaults: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.')
        .try_fold(defaults, |value, key| value.as_object()?.get(key))
}

fn description(schema: &Value) -> Option<String> {
    schema
        .get("description")
        .and_then(Value::as_str)
        .map(one_line)
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}.{name}")
    }
}

/// A JSON value as it would be written in a YAML file.
fn inline(value: &Value) -> String {
    match value {
        Value::String(text) if text.is_empty() => "\"\"".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Doc comment paragraphs joined into one table cell.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn escape(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The names a JSON schema object lists as `required`.
fn required_names(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}
