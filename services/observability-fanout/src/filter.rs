//! Filter rules (`{include: glob[], exclude: glob[], min_severity: 1..5}`) and event-type
//! subscriptions. A glob's `*` matches one dot-delimited segment (`[^.]+`); an empty or absent
//! include admits every event; exclude applies after include; min_severity after both.

use serde_json::{Map, Value};

use crate::events::{EVENT_TYPES, Event};

/// Compiled filter rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FilterRules {
    include: Vec<String>,
    exclude: Vec<String>,
    min_severity: u8,
}

/// Whether `name` matches `glob`, segment by segment (`*` one whole segment; none spans a dot).
pub fn glob_matches(glob: &str, name: &str) -> bool {
    let globs: Vec<&str> = glob.split('.').collect();
    let names: Vec<&str> = name.split('.').collect();
    globs.len() == names.len() && globs.iter().zip(&names).all(|(glob, segment)| *glob == "*" && !segment.is_empty() || glob == segment)
}

impl FilterRules {
    /// Reads `{include, exclude, min_severity}` (a null or empty text: no rules).
    pub fn parse(text: &str) -> Result<FilterRules, String> {
        let value: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(text).map_err(|_| "filter_rules must be JSON".to_string())?
        };
        let members = match value {
            Value::Null => return Ok(FilterRules::default()),
            Value::Object(members) => members,
            _ => return Err("filter_rules must be an object {include, exclude, min_severity}".to_string()),
        };
        let globs = |members: &Map<String, Value>, name: &str| -> Result<Vec<String>, String> {
            match members.get(name) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Array(globs)) => globs
                    .iter()
                    .map(|glob| {
                        glob.as_str()
                            .filter(|glob| !glob.is_empty())
                            .map(str::to_string)
                            .ok_or_else(|| format!("filter_rules.{name} holds non-empty strings"))
                    })
                    .collect(),
                Some(_) => Err(format!("filter_rules.{name} must be an array of globs")),
            }
        };
        if let Some(unknown) = members.keys().find(|name| !matches!(name.as_str(), "include" | "exclude" | "min_severity")) {
            return Err(format!("filter_rules has no member `{unknown}` (include, exclude, min_severity)"));
        }
        let min_severity = match members.get("min_severity") {
            None | Some(Value::Null) => 0,
            Some(value) => value.as_u64().filter(|severity| (1..=5).contains(severity)).ok_or("filter_rules.min_severity is 1 to 5")? as u8,
        };
        Ok(FilterRules { include: globs(&members, "include")?, exclude: globs(&members, "exclude")?, min_severity })
    }

    /// Whether the rules let the event through.
    pub fn admits(&self, event: &Event) -> bool {
        (self.include.is_empty() || self.include.iter().any(|glob| glob_matches(glob, &event.name)))
            && !self.exclude.iter().any(|glob| glob_matches(glob, &event.name))
            && event.severity >= self.min_severity
    }
}

/// Checks a subscription's event types.
pub fn validate_event_types(types: &[String]) -> Result<(), String> {
    match types.iter().find(|kind| !EVENT_TYPES.contains(&kind.as_str())) {
        Some(unknown) => Err(format!("event type `{unknown}` is not one of {}", EVENT_TYPES.join(", "))),
        None => Ok(()),
    }
}

/// Whether a destination subscribed to the event's type (no subscription: every type).
pub fn subscribed(types: &[String], event: &Event) -> bool {
    types.is_empty() || types.iter().any(|kind| kind == event.event_type)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(name: &str, severity: u8) -> Event {
        Event {
            tenant_id: "t".into(),
            event_type: "audit",
            name: name.into(),
            severity,
            timestamp: String::new(),
            request_id: String::new(),
            data: json!({}),
        }
    }

    #[test]
    fn a_star_matches_one_segment() {
        assert!(glob_matches("audit.*", "audit.allowed"));
        assert!(!glob_matches("audit.*", "audit.denied.budget_exceeded"));
        assert!(glob_matches("audit.*.*", "audit.denied.budget_exceeded"));
        assert!(glob_matches("*.denied.*", "audit.denied.kill_switch_active"));
        assert!(!glob_matches("audit", "audit.allowed"));
    }

    #[test]
    fn include_then_exclude_then_severity() {
        let rules =
            FilterRules::parse(r#"{"include": ["audit.*.*", "guardrail.*"], "exclude": ["audit.denied.rate_limited"], "min_severity": 3}"#)
                .unwrap_or_default();
        assert!(rules.admits(&event("audit.denied.budget_exceeded", 3)));
        assert!(!rules.admits(&event("audit.denied.rate_limited", 3)));
        assert!(!rules.admits(&event("audit.allowed", 1)));
        assert!(rules.admits(&event("guardrail.pii_detected", 4)));
        assert!(!rules.admits(&event("guardrail.pii_detected", 2)));
        assert!(FilterRules::parse("null").unwrap_or_default().admits(&event("anything.at.all", 1)));
        assert!(FilterRules::parse(r#"{"min_severity": 9}"#).is_err());
        assert!(FilterRules::parse(r#"{"includes": []}"#).is_err());
    }
}
