//! The JSONPath subset external guardrail providers are mapped with: `$`, `.name`, `['name']` /
//! `["name"]` and `[index]`, as in `$.results[0].category_scores['hate']`.

use serde_json::Value;

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// A parsed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPath {
    steps: Vec<Step>,
}

impl JsonPath {
    /// Parses a path; the error says what is wrong where.
    pub fn parse(path: &str) -> Result<Self, String> {
        let path = path.trim();
        let rest = path.strip_prefix('$').ok_or_else(|| format!("`{path}` must start with `$`"))?;
        let characters: Vec<char> = rest.chars().collect();
        let mut steps = Vec::new();
        let mut position = 0;
        while position < characters.len() {
            match characters[position] {
                '.' => {
                    let start = position + 1;
                    let mut end = start;
                    while end < characters.len() && characters[end] != '.' && characters[end] != '[' {
                        end += 1;
                    }
                    if end == start {
                        return Err(format!("`{path}`: empty name after `.`"));
                    }
                    steps.push(Step::Key(characters[start..end].iter().collect()));
                    position = end;
                }
                '[' => {
                    let close = characters[position..]
                        .iter()
                        .position(|character| *character == ']')
                        .map(|offset| position + offset)
                        .ok_or_else(|| format!("`{path}`: `[` without `]`"))?;
                    let inner: String = characters[position + 1..close].iter().collect();
                    let inner = inner.trim();
                    let quoted = (inner.starts_with('\'') && inner.ends_with('\'')) || (inner.starts_with('"') && inner.ends_with('"'));
                    if quoted && inner.len() >= 2 {
                        steps.push(Step::Key(inner[1..inner.len() - 1].to_string()));
                    } else {
                        let index =
                            inner.parse::<usize>().map_err(|_| format!("`{path}`: `[{inner}]` is neither an index nor a quoted name"))?;
                        steps.push(Step::Index(index));
                    }
                    position = close + 1;
                }
                other => return Err(format!("`{path}`: unexpected `{other}`")),
            }
        }
        Ok(JsonPath { steps })
    }

    /// The value at this path, if there is one.
    pub fn select<'a>(&self, document: &'a Value) -> Option<&'a Value> {
        self.steps.iter().try_fold(document, |value, step| match step {
            Step::Key(key) => value.get(key.as_str()),
            Step::Index(index) => value.get(*index),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_indexes_and_quoted_names_select_values() -> Result<(), String> {
        let document = json!({"a": {"b": [{"c": 1}, {"c": 2, "d e": true}]}, "safe": false});
        assert_eq!(JsonPath::parse("$.a.b[1].c")?.select(&document), Some(&json!(2)));
        assert_eq!(JsonPath::parse("$['a'][\"b\"][1]['d e']")?.select(&document), Some(&json!(true)));
        assert_eq!(JsonPath::parse("$.safe")?.select(&document), Some(&json!(false)));
        assert_eq!(JsonPath::parse("$")?.select(&document), Some(&document));
        assert_eq!(JsonPath::parse("$.a.b[5].c")?.select(&document), None);
        assert_eq!(JsonPath::parse("$.missing.deeper")?.select(&document), None);
        Ok(())
    }

    #[test]
    fn malformed_paths_are_refused() {
        for path in ["a.b", "$.", "$.a[", "$.a[x]", "$a"] {
            assert!(JsonPath::parse(path).is_err(), "{path}");
        }
    }
}
