use std::fmt;

/// One problem in a resource, located by its field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path (`spec.model.tables[2].dim`).
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Semantic checks beyond what the types enforce; every problem is collected.
pub trait Validate {
    /// Adds every problem of `self`, located under `path`, to `errors`.
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>);

    /// All problems, each with its path under `path`.
    fn problems(&self, path: &str) -> Vec<FieldError> {
        let mut errors = Vec::new();
        self.validate(path, &mut errors);
        errors
    }
}

pub(crate) fn field(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

pub(crate) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

pub(crate) fn fail(errors: &mut Vec<FieldError>, path: String, message: impl Into<String>) {
    errors.push(FieldError {
        path,
        message: message.into(),
    });
}

/// Checks a resource name given on its own (a Get or Delete by name).
pub fn check_resource_name(path: &str, name: &str) -> Result<(), FieldError> {
    let mut errors = Vec::new();
    check_name(&mut errors, path.to_owned(), name, false);
    errors.pop().map_or(Ok(()), Err)
}

/// Names of resources, tables, features and sources: they end up in NATS subjects, Redis
/// keys and file names, so they are DNS-label-like: 1-63 of `a-z 0-9 -`, starting with a
/// letter, not ending with `-` (underscores allowed for feature and table names).
pub(crate) fn check_name(
    errors: &mut Vec<FieldError>,
    path: String,
    name: &str,
    underscores: bool,
) {
    let allowed = |c: char| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (underscores && c == '_')
    };
    let ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.chars().all(allowed);
    if !ok {
        let chars = if underscores {
            "a-z, 0-9, '-', '_'"
        } else {
            "a-z, 0-9, '-'"
        };
        fail(
            errors,
            path,
            format!("{name:?} is not a valid name (1-63 of {chars}; starts with a letter)"),
        );
    }
}

pub(crate) fn check_unique<'a>(
    errors: &mut Vec<FieldError>,
    path: &str,
    what: &str,
    names: impl IntoIterator<Item = &'a str>,
) {
    let mut seen = std::collections::BTreeSet::new();
    for (i, name) in names.into_iter().enumerate() {
        if !seen.insert(name) {
            fail(
                errors,
                field(&index(path, i), "name"),
                format!("duplicate {what} {name:?}"),
            );
        }
    }
}

pub(crate) fn check_positive(errors: &mut Vec<FieldError>, path: String, value: f64) {
    if !(value.is_finite() && value > 0.0) {
        fail(errors, path, format!("must be > 0 (got {value})"));
    }
}

pub(crate) fn check_non_negative(errors: &mut Vec<FieldError>, path: String, value: f64) {
    if !(value.is_finite() && value >= 0.0) {
        fail(errors, path, format!("must be >= 0 (got {value})"));
    }
}

pub(crate) fn check_probability(errors: &mut Vec<FieldError>, path: String, value: f64) {
    if !(0.0..=1.0).contains(&value) {
        fail(errors, path, format!("must be within 0..=1 (got {value})"));
    }
}
