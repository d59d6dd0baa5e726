//! Prompt templates: `{{variable}}` placeholders resolved from a JSON object of variables
//! (`{{memory.<block>}}` ones from agent memory, filled by the service when nothing else does).

use serde_json::{Map, Value};

/// A template resolved: its text, and the placeholders no variable filled (left as written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub text: String,
    pub missing: Vec<String>,
}

/// The placeholder names of a template, in order of first appearance.
pub fn placeholders(template: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        let name = after[..end].trim();
        if is_name(name) && !names.iter().any(|known| known == name) {
            names.push(name.to_string());
        }
        rest = &after[end + 2..];
    }
    names
}

/// A variable name: a letter or `_`, then letters, digits, `_`, `-` or `.` (`memory.human`).
fn is_name(name: &str) -> bool {
    let mut characters = name.chars();
    characters.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && characters.all(|character| character.is_ascii_alphanumeric() || matches!(character, '_' | '-' | '.'))
}

/// Whether `variables` hold a value for `name`.
pub fn resolves(name: &str, variables: &Map<String, Value>) -> bool {
    lookup(variables, name).is_some()
}

/// The value of `name`: its own key, else the path its dots name (`memory.human` in `{"memory": {"human": ...}}`).
fn lookup<'a>(variables: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    if let Some(value) = variables.get(name) {
        return Some(value);
    }
    let mut parts = name.split('.');
    let mut value = variables.get(parts.next()?)?;
    for part in parts {
        value = value.get(part)?;
    }
    Some(value)
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Resolves `template` with `variables` (given values over `defaults`).
pub fn render(template: &str, defaults: &Map<String, Value>, variables: &Map<String, Value>) -> Resolved {
    let mut text = String::with_capacity(template.len());
    let mut missing: Vec<String> = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        let name = after[..end].trim();
        text.push_str(&rest[..start]);
        let placeholder = &rest[start..start + 2 + end + 2];
        match (is_name(name), lookup(variables, name).or_else(|| lookup(defaults, name))) {
            (true, Some(value)) => text.push_str(&text_of(value)),
            (true, None) => {
                if !missing.iter().any(|known| known == name) {
                    missing.push(name.to_string());
                }
                text.push_str(placeholder);
            }
            (false, _) => text.push_str(placeholder),
        }
        rest = &after[end + 2..];
    }
    text.push_str(rest);
    Resolved { text, missing }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn placeholders_resolve_from_variables_over_defaults() {
        let defaults = object(json!({"name": "world", "tone": "kind"}));
        let resolved = render(
            "Hello {{ name }}, be {{tone}}. {{count}} items, {{missing}} and {{missing}}.",
            &defaults,
            &object(json!({"name": "Ada", "count": 3})),
        );
        assert_eq!(resolved.text, "Hello Ada, be kind. 3 items, {{missing}} and {{missing}}.");
        assert_eq!(resolved.missing, ["missing"]);
    }

    #[test]
    fn dotted_names_read_nested_values_and_odd_braces_stay() {
        let resolved =
            render("{{memory.human}} | {{ not a name }} | {{unclosed", &Map::new(), &object(json!({"memory": {"human": "likes tea"}})));
        assert_eq!(resolved.text, "likes tea | {{ not a name }} | {{unclosed");
        assert!(resolved.missing.is_empty());
        assert_eq!(placeholders("{{a}} {{b.c}} {{a}} {{ 1x }}"), ["a", "b.c"]);
    }
}
