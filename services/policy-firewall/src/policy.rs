//! Security policies: rulesets of prioritised rules whose conditions test fields of a context (such as
//! `tool.name`, `tool.arguments`, `agent.role`, `action`), compiled once and evaluated in memory.
//!
//! Evaluation: among enabled rules whose conditions all hold, the highest priority wins; on equal
//! priority `deny` beats `require_approval` beats `allow`, then the earlier rule. No match allows.

use std::cmp::Reverse;

use brainstorm_proto::policy as proto;
use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::glob::glob_matches;

const MAX_RULES: usize = 500;
const MAX_CONDITIONS: usize = 32;
const MAX_ID_CHARS: usize = 128;
/// Compiled regexes are bounded, so a tenant's pattern cannot exhaust memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// What a matching rule decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    Deny,
    Allow,
    RequireApproval,
}

impl RuleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleAction::Deny => "deny",
            RuleAction::Allow => "allow",
            RuleAction::RequireApproval => "require_approval",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "deny" => Some(RuleAction::Deny),
            "allow" => Some(RuleAction::Allow),
            "require_approval" => Some(RuleAction::RequireApproval),
            _ => None,
        }
    }

    /// Tie-break rank among rules of equal priority: lower wins.
    fn tie_rank(self) -> u8 {
        match self {
            RuleAction::Deny => 0,
            RuleAction::RequireApproval => 1,
            RuleAction::Allow => 2,
        }
    }
}

/// A condition operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConditionOp {
    Eq,
    Neq,
    In,
    NotIn,
    Contains,
    Matches,
    Gt,
    Gte,
    Lt,
    Lte,
    Exists,
}

impl ConditionOp {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionOp::Eq => "eq",
            ConditionOp::Neq => "neq",
            ConditionOp::In => "in",
            ConditionOp::NotIn => "not_in",
            ConditionOp::Contains => "contains",
            ConditionOp::Matches => "matches",
            ConditionOp::Gt => "gt",
            ConditionOp::Gte => "gte",
            ConditionOp::Lt => "lt",
            ConditionOp::Lte => "lte",
            ConditionOp::Exists => "exists",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_value(Value::String(text.to_string())).ok()
    }
}

/// One condition: `{field, op, value}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    pub field: String,
    pub op: ConditionOp,
    #[serde(default)]
    pub value: Value,
}

/// One rule, in the spec's JSON shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub id: String,
    #[serde(default)]
    pub description: String,
    pub action: RuleAction,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub priority: i64,
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
}

fn enabled_by_default() -> bool {
    true
}

impl Rule {
    /// From the contract; the error names the rule and field.
    pub fn from_proto(rule: &proto::PolicyRule) -> Result<Self, String> {
        let action =
            RuleAction::parse(&rule.action).ok_or_else(|| format!("rule `{}`: action must be deny, allow or require_approval", rule.id))?;
        let conditions = rule
            .conditions
            .iter()
            .map(|condition| {
                let op = ConditionOp::parse(&condition.op).ok_or_else(|| format!("rule `{}`: unknown op `{}`", rule.id, condition.op))?;
                let value = if condition.value_json.trim().is_empty() {
                    Value::Null
                } else {
                    serde_json::from_str(&condition.value_json).map_err(|_| format!("rule `{}`: a condition value is not JSON", rule.id))?
                };
                Ok(Condition { field: condition.field.clone(), op, value })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Rule {
            id: rule.id.clone(),
            description: rule.description.clone(),
            action,
            conditions,
            priority: rule.priority,
            enabled: rule.enabled,
        })
    }

    pub fn to_proto(&self) -> proto::PolicyRule {
        proto::PolicyRule {
            id: self.id.clone(),
            description: self.description.clone(),
            action: self.action.as_str().to_string(),
            conditions: self
                .conditions
                .iter()
                .map(|condition| proto::PolicyCondition {
                    field: condition.field.clone(),
                    op: condition.op.as_str().to_string(),
                    value_json: condition.value.to_string(),
                })
                .collect(),
            priority: self.priority,
            enabled: self.enabled,
        }
    }

    /// The rule as `matchedRule` shows it.
    pub fn matched(&self) -> MatchedRule {
        MatchedRule { id: self.id.clone(), description: self.description.clone(), action: self.action, priority: self.priority }
    }
}

/// Rules from the contract.
pub fn rules_from_proto(rules: &[proto::PolicyRule]) -> Result<Vec<Rule>, String> {
    rules.iter().map(Rule::from_proto).collect()
}

/// The rule a decision came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchedRule {
    pub id: String,
    pub description: String,
    pub action: RuleAction,
    pub priority: i64,
}

impl MatchedRule {
    pub fn to_proto(&self) -> proto::MatchedRule {
        proto::MatchedRule {
            id: self.id.clone(),
            description: self.description.clone(),
            action: self.action.as_str().to_string(),
            priority: self.priority,
        }
    }
}

/// A decision and how it was reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyDecision {
    /// `Allow` when no rule matched.
    pub decision: RuleAction,
    /// Rules evaluated until the decision (all enabled rules when none matched).
    pub evaluated_count: u32,
    pub matched_rule: Option<MatchedRule>,
}

enum Matcher {
    Glob(String),
    Regex(Regex),
}

struct CompiledCondition {
    field: String,
    op: ConditionOp,
    value: Value,
    matcher: Option<Matcher>,
}

struct CompiledRule {
    rule: Rule,
    conditions: Vec<CompiledCondition>,
}

/// Rules validated, compiled (regexes built once) and ordered for evaluation.
pub struct CompiledRuleset {
    version: i64,
    rule_count: usize,
    /// Enabled rules by priority (highest first), then tie rank, then position.
    ordered: Vec<CompiledRule>,
}

impl std::fmt::Debug for CompiledRuleset {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("CompiledRuleset").field("version", &self.version).field("rules", &self.rule_count).finish()
    }
}

impl CompiledRuleset {
    /// Validates and compiles rules; the error names the rule and what is wrong.
    pub fn compile(version: i64, rules: &[Rule]) -> Result<Self, String> {
        validate_rules(rules)?;
        let mut ordered = Vec::new();
        for rule in rules.iter().filter(|rule| rule.enabled) {
            let conditions = rule
                .conditions
                .iter()
                .map(|condition| compile_condition(condition).map_err(|error| format!("rule `{}`: {error}", rule.id)))
                .collect::<Result<Vec<_>, String>>()?;
            ordered.push(CompiledRule { rule: rule.clone(), conditions });
        }
        // A stable sort keeps the listed order among equals.
        ordered.sort_by_key(|compiled| (Reverse(compiled.rule.priority), compiled.rule.action.tie_rank()));
        Ok(CompiledRuleset { version, rule_count: rules.len(), ordered })
    }

    pub fn version(&self) -> i64 {
        self.version
    }

    /// Every rule, enabled or not.
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }

    /// The decision for a context (a JSON object).
    pub fn evaluate(&self, context: &Value) -> PolicyDecision {
        let mut evaluated = 0u32;
        for compiled in &self.ordered {
            evaluated += 1;
            if compiled.conditions.iter().all(|condition| holds(condition, context)) {
                return PolicyDecision {
                    decision: compiled.rule.action,
                    evaluated_count: evaluated,
                    matched_rule: Some(compiled.rule.matched()),
                };
            }
        }
        PolicyDecision { decision: RuleAction::Allow, evaluated_count: evaluated, matched_rule: None }
    }
}

/// Checks ids, sizes and values (regexes compile, list ops have lists, comparisons have numbers).
pub fn validate_rules(rules: &[Rule]) -> Result<(), String> {
    if rules.len() > MAX_RULES {
        return Err(format!("at most {MAX_RULES} rules"));
    }
    let mut ids = std::collections::HashSet::new();
    for rule in rules {
        if rule.id.trim().is_empty() || rule.id.chars().count() > MAX_ID_CHARS {
            return Err(format!("rule ids must be 1 to {MAX_ID_CHARS} characters"));
        }
        if !ids.insert(rule.id.as_str()) {
            return Err(format!("rule id `{}` is used twice", rule.id));
        }
        if rule.conditions.len() > MAX_CONDITIONS {
            return Err(format!("rule `{}` has more than {MAX_CONDITIONS} conditions", rule.id));
        }
        for condition in &rule.conditions {
            if condition.field.trim().is_empty() {
                return Err(format!("rule `{}`: a condition has no field", rule.id));
            }
            compile_condition(condition).map_err(|error| format!("rule `{}`: {error}", rule.id))?;
        }
    }
    Ok(())
}

fn compile_condition(condition: &Condition) -> Result<CompiledCondition, String> {
    let field = &condition.field;
    let matcher = match condition.op {
        ConditionOp::Matches => {
            let pattern = condition.value.as_str().ok_or_else(|| format!("`{field} matches` needs a string pattern"))?;
            Some(compile_matcher(pattern)?)
        }
        ConditionOp::In | ConditionOp::NotIn if !condition.value.is_array() => {
            return Err(format!("`{field} {}` needs an array value", condition.op.as_str()));
        }
        ConditionOp::Gt | ConditionOp::Gte | ConditionOp::Lt | ConditionOp::Lte if number_of(&condition.value).is_none() => {
            return Err(format!("`{field} {}` needs a numeric value", condition.op.as_str()));
        }
        ConditionOp::Exists if !(condition.value.is_null() || condition.value.is_boolean()) => {
            return Err(format!("`{field} exists` takes true, false or no value"));
        }
        ConditionOp::Contains if condition.value.is_null() => return Err(format!("`{field} contains` needs a value")),
        _ => None,
    };
    Ok(CompiledCondition { field: field.clone(), op: condition.op, value: condition.value.clone(), matcher })
}

/// `/regex/` or `/regex/i` is a regular expression; anything else a glob (`*`, `?`, ignoring case).
fn compile_matcher(pattern: &str) -> Result<Matcher, String> {
    let regex_body = pattern
        .strip_prefix('/')
        .and_then(|rest| rest.strip_suffix("/i").map(|body| (body, true)).or_else(|| rest.strip_suffix('/').map(|body| (body, false))));
    match regex_body {
        Some((body, case_insensitive)) if !body.is_empty() => RegexBuilder::new(body)
            .case_insensitive(case_insensitive)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map(Matcher::Regex)
            .map_err(|error| format!("invalid regex `{pattern}`: {error}")),
        _ => Ok(Matcher::Glob(pattern.to_string())),
    }
}

/// A context field: a literal key (`"tool.name"`) first, then a dotted path into nested objects.
pub fn field_value<'a>(context: &'a Value, field: &str) -> Option<&'a Value> {
    if let Some(value) = context.get(field) {
        return Some(value);
    }
    field.split('.').try_fold(context, |value, segment| value.get(segment))
}

fn holds(condition: &CompiledCondition, context: &Value) -> bool {
    let actual = field_value(context, &condition.field).filter(|value| !value.is_null());
    match condition.op {
        ConditionOp::Exists => actual.is_some() == condition.value.as_bool().unwrap_or(true),
        ConditionOp::Eq => actual.is_some_and(|actual| loosely_equal(actual, &condition.value)),
        ConditionOp::Neq => !actual.is_some_and(|actual| loosely_equal(actual, &condition.value)),
        ConditionOp::In => actual.is_some_and(|actual| in_list(actual, &condition.value)),
        ConditionOp::NotIn => !actual.is_some_and(|actual| in_list(actual, &condition.value)),
        ConditionOp::Contains => actual.is_some_and(|actual| contains(actual, &condition.value)),
        ConditionOp::Matches => match (actual, &condition.matcher) {
            (Some(actual), Some(matcher)) => {
                let text = text_of(actual);
                match matcher {
                    Matcher::Glob(pattern) => glob_matches(pattern, &text),
                    Matcher::Regex(regex) => regex.is_match(&text),
                }
            }
            _ => false,
        },
        ConditionOp::Gt => compare(actual, &condition.value, |left, right| left > right),
        ConditionOp::Gte => compare(actual, &condition.value, |left, right| left >= right),
        ConditionOp::Lt => compare(actual, &condition.value, |left, right| left < right),
        ConditionOp::Lte => compare(actual, &condition.value, |left, right| left <= right),
    }
}

/// A numeric comparison; false unless both sides are numbers (or numeric strings).
fn compare(actual: Option<&Value>, expected: &Value, ordered: fn(f64, f64) -> bool) -> bool {
    match (actual.and_then(number_of), number_of(expected)) {
        (Some(left), Some(right)) => ordered(left, right),
        _ => false,
    }
}

/// Strings as themselves, anything else as its JSON text (so `tool.arguments` objects can be searched).
fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn number_of(value: &Value) -> Option<f64> {
    match value {
        Value::Number(number) => number.as_f64(),
        Value::String(text) => text.trim().parse::<f64>().ok(),
        _ => None,
    }
    .filter(|number| number.is_finite())
}

/// JSON equality, with strings compared to numbers and booleans by their text (`"5"` equals `5`).
fn loosely_equal(actual: &Value, expected: &Value) -> bool {
    if actual == expected {
        return true;
    }
    match (actual, expected) {
        (Value::Number(_), Value::Number(_)) => number_of(actual) == number_of(expected),
        (Value::String(text), Value::Number(_)) | (Value::Number(_), Value::String(text)) => {
            let number = if actual.is_number() { actual } else { expected };
            text.trim().parse::<f64>().ok().is_some_and(|parsed| Some(parsed) == number_of(number))
        }
        (Value::String(text), Value::Bool(flag)) | (Value::Bool(flag), Value::String(text)) => {
            text.trim().parse::<bool>().ok() == Some(*flag)
        }
        _ => false,
    }
}

fn in_list(actual: &Value, list: &Value) -> bool {
    list.as_array().is_some_and(|items| items.iter().any(|item| loosely_equal(actual, item)))
}

/// Strings contain substrings (ignoring case); arrays contain elements; objects contain keys or, as
/// JSON text, substrings.
fn contains(actual: &Value, needle: &Value) -> bool {
    match actual {
        Value::Array(items) => items.iter().any(|item| loosely_equal(item, needle)),
        Value::Object(map) => {
            needle.as_str().is_some_and(|key| map.contains_key(key)) || text_contains(&actual.to_string(), &text_of(needle))
        }
        other => text_contains(&text_of(other), &text_of(needle)),
    }
}

fn text_contains(haystack: &str, needle: &str) -> bool {
    haystack.to_lowercase().contains(&needle.to_lowercase())
}

/// A named ruleset to start from.
pub struct Preset {
    pub name: &'static str,
    pub description: &'static str,
    pub rules: fn() -> Vec<Rule>,
}

/// The presets `GET /v1/security/policies/presets` lists.
pub const PRESETS: [Preset; 1] = [Preset {
    name: "l3-baseline",
    description: "deny shell, exec, eval and destructive SQL or file operations; require approval for payments and deployments",
    rules: l3_baseline,
}];

fn condition(field: &str, op: ConditionOp, value: Value) -> Condition {
    Condition { field: field.to_string(), op, value }
}

fn rule(id: &str, description: &str, action: RuleAction, priority: i64, conditions: Vec<Condition>) -> Rule {
    Rule { id: id.to_string(), description: description.to_string(), action, conditions, priority, enabled: true }
}

fn l3_baseline() -> Vec<Rule> {
    vec![
        rule(
            "l3-deny-shell-exec",
            "deny shell, command execution and code evaluation tools",
            RuleAction::Deny,
            100,
            vec![condition(
                "tool.name",
                ConditionOp::Matches,
                json!(
                    "/(^|[^a-z])(shell|bash|zsh|sh|powershell|pwsh|cmd|terminal|exec|execute|execute_command|run_command|eval|subprocess)([^a-z]|$)/i"
                ),
            )],
        ),
        rule(
            "l3-deny-sql-drop",
            "deny destructive SQL (DROP, TRUNCATE, DELETE without WHERE) in tool arguments",
            RuleAction::Deny,
            100,
            vec![condition(
                "tool.arguments",
                ConditionOp::Matches,
                json!(r"/\b(drop\s+(table|database|schema|index)|truncate\s+table|delete\s+from\s+[a-z0-9_.]+\s*(;|$|\x22))/i"),
            )],
        ),
        rule(
            "l3-deny-destructive-files",
            "deny recursive deletion and disk formatting in tool arguments",
            RuleAction::Deny,
            100,
            vec![condition(
                "tool.arguments",
                ConditionOp::Matches,
                json!(r"/\b(rm\s+-[a-z]*r[a-z]*f|rm\s+-[a-z]*f[a-z]*r|mkfs|dd\s+if=)/i"),
            )],
        ),
        rule(
            "l3-approve-payments",
            "require human approval for payments, transfers and refunds",
            RuleAction::RequireApproval,
            50,
            vec![condition("tool.name", ConditionOp::Matches, json!("/(pay|payment|transfer|refund|charge|payout|invoice|wire)/i"))],
        ),
        rule(
            "l3-approve-deploys",
            "require human approval for deployments and releases",
            RuleAction::RequireApproval,
            50,
            vec![condition("tool.name", ConditionOp::Matches, json!("/(deploy|release|rollout|publish|promote)/i"))],
        ),
    ]
}

/// The context a tool call is evaluated in: `tool.name`, `tool.arguments` (the parsed object),
/// `agent.role`, `agent.id` and `action: "tool_call"`.
pub fn tool_call_context(tool_name: &str, arguments: &Value, role: &str, agent_id: Option<&str>) -> Value {
    let mut context = Map::new();
    context.insert("tool.name".to_string(), json!(tool_name));
    context.insert("tool.arguments".to_string(), arguments.clone());
    context.insert("agent.role".to_string(), json!(role));
    if let Some(agent_id) = agent_id {
        context.insert("agent.id".to_string(), json!(agent_id));
    }
    context.insert("action".to_string(), json!("tool_call"));
    Value::Object(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_rule(op: ConditionOp, field: &str, value: Value) -> Result<CompiledRuleset, String> {
        CompiledRuleset::compile(1, &[rule("r", "", RuleAction::Deny, 1, vec![condition(field, op, value)])])
    }

    fn denies(ruleset: &CompiledRuleset, context: Value) -> bool {
        ruleset.evaluate(&context).decision == RuleAction::Deny
    }

    #[test]
    fn equality_and_lists() -> Result<(), String> {
        let eq = one_rule(ConditionOp::Eq, "agent.role", json!("agent"))?;
        assert!(denies(&eq, json!({"agent.role": "agent"})));
        assert!(denies(&eq, json!({"agent": {"role": "agent"}})), "dotted paths reach nested objects");
        assert!(!denies(&eq, json!({"agent.role": "admin"})));
        assert!(!denies(&eq, json!({})));
        let number = one_rule(ConditionOp::Eq, "n", json!(5))?;
        assert!(denies(&number, json!({"n": "5"})) && denies(&number, json!({"n": 5.0})));
        let neq = one_rule(ConditionOp::Neq, "agent.role", json!("admin"))?;
        assert!(denies(&neq, json!({"agent.role": "agent"})) && denies(&neq, json!({})));
        assert!(!denies(&neq, json!({"agent.role": "admin"})));
        let listed = one_rule(ConditionOp::In, "tool.name", json!(["a", "b"]))?;
        assert!(denies(&listed, json!({"tool.name": "b"})) && !denies(&listed, json!({"tool.name": "c"})));
        let unlisted = one_rule(ConditionOp::NotIn, "tool.name", json!(["a", "b"]))?;
        assert!(denies(&unlisted, json!({"tool.name": "c"})) && !denies(&unlisted, json!({"tool.name": "a"})));
        Ok(())
    }

    #[test]
    fn contains_matches_and_exists() -> Result<(), String> {
        let contains = one_rule(ConditionOp::Contains, "tool.arguments", json!("drop table"))?;
        assert!(denies(&contains, json!({"tool.arguments": {"query": "DROP TABLE users"}})));
        assert!(!denies(&contains, json!({"tool.arguments": {"query": "select 1"}})));
        let has_key = one_rule(ConditionOp::Contains, "tool.arguments", json!("password"))?;
        assert!(denies(&has_key, json!({"tool.arguments": {"password": "x"}})));
        let tags = one_rule(ConditionOp::Contains, "tags", json!("pii"))?;
        assert!(denies(&tags, json!({"tags": ["pii", "eu"]})) && !denies(&tags, json!({"tags": ["eu"]})));
        let glob = one_rule(ConditionOp::Matches, "tool.name", json!("shell*"))?;
        assert!(denies(&glob, json!({"tool.name": "Shell_Run"})) && !denies(&glob, json!({"tool.name": "my_shell"})));
        let regex = one_rule(ConditionOp::Matches, "tool.name", json!("/^db_(drop|delete)$/"))?;
        assert!(denies(&regex, json!({"tool.name": "db_drop"})) && !denies(&regex, json!({"tool.name": "DB_DROP"})));
        let insensitive = one_rule(ConditionOp::Matches, "tool.name", json!("/^db_drop$/i"))?;
        assert!(denies(&insensitive, json!({"tool.name": "DB_DROP"})));
        let exists = one_rule(ConditionOp::Exists, "agent.id", Value::Null)?;
        assert!(denies(&exists, json!({"agent.id": "a"})) && !denies(&exists, json!({"agent.id": null})));
        let absent = one_rule(ConditionOp::Exists, "agent.id", json!(false))?;
        assert!(denies(&absent, json!({})) && !denies(&absent, json!({"agent.id": "a"})));
        Ok(())
    }

    #[test]
    fn numeric_comparisons() -> Result<(), String> {
        let cases = [
            (ConditionOp::Gt, 10.0, [false, false, true]),
            (ConditionOp::Gte, 10.0, [false, true, true]),
            (ConditionOp::Lt, 10.0, [true, false, false]),
            (ConditionOp::Lte, 10.0, [true, true, false]),
        ];
        for (op, threshold, expected) in cases {
            let ruleset = one_rule(op, "cost", json!(threshold))?;
            for (value, expect) in [9.5, 10.0, 10.5].into_iter().zip(expected) {
                assert_eq!(denies(&ruleset, json!({"cost": value})), expect, "{} {value}", op.as_str());
            }
            assert!(!denies(&ruleset, json!({"cost": "lots"})), "non-numbers never compare");
        }
        Ok(())
    }

    #[test]
    fn the_highest_priority_wins_and_deny_breaks_ties() -> Result<(), String> {
        let always = |id: &str, action: RuleAction, priority: i64| rule(id, id, action, priority, Vec::new());
        let ruleset = CompiledRuleset::compile(
            3,
            &[
                always("allow-high", RuleAction::Allow, 10),
                always("deny-low", RuleAction::Deny, 1),
                always("approve-high", RuleAction::RequireApproval, 10),
            ],
        )?;
        let decision = ruleset.evaluate(&json!({}));
        assert_eq!(decision.decision, RuleAction::RequireApproval);
        assert_eq!(decision.matched_rule.map(|matched| matched.id), Some("approve-high".to_string()));
        assert_eq!(decision.evaluated_count, 1);
        let tie = CompiledRuleset::compile(1, &[always("allow", RuleAction::Allow, 5), always("deny", RuleAction::Deny, 5)])?;
        assert_eq!(tie.evaluate(&json!({})).decision, RuleAction::Deny);
        let mut disabled = always("deny", RuleAction::Deny, 100);
        disabled.enabled = false;
        let ruleset =
            CompiledRuleset::compile(1, &[disabled, rule("x", "", RuleAction::Deny, 1, vec![condition("a", ConditionOp::Eq, json!(1))])])?;
        let decision = ruleset.evaluate(&json!({"a": 2}));
        assert_eq!((decision.decision, decision.evaluated_count, decision.matched_rule), (RuleAction::Allow, 1, None), "no match allows");
        assert_eq!(ruleset.rule_count(), 2);
        Ok(())
    }

    #[test]
    fn invalid_rules_are_refused_with_a_reason() {
        let bad = |conditions: Vec<Condition>| CompiledRuleset::compile(1, &[rule("r", "", RuleAction::Deny, 1, conditions)]).err();
        assert!(bad(vec![condition("a", ConditionOp::Matches, json!("/(unclosed/"))]).is_some_and(|error| error.contains("invalid regex")));
        assert!(bad(vec![condition("a", ConditionOp::In, json!("x"))]).is_some_and(|error| error.contains("array")));
        assert!(bad(vec![condition("a", ConditionOp::Gt, json!("many"))]).is_some_and(|error| error.contains("numeric")));
        assert!(bad(vec![condition("", ConditionOp::Eq, json!(1))]).is_some());
        let twice =
            CompiledRuleset::compile(1, &[rule("r", "", RuleAction::Deny, 1, Vec::new()), rule("r", "", RuleAction::Allow, 1, Vec::new())]);
        assert!(twice.is_err_and(|error| error.contains("twice")));
        let parsed: Result<Rule, _> = serde_json::from_value(json!({"id": "r", "action": "explode"}));
        assert!(parsed.is_err());
    }

    #[test]
    fn the_l3_baseline_denies_shells_and_drops_and_holds_payments() -> Result<(), String> {
        let rules = (PRESETS[0].rules)();
        let ruleset = CompiledRuleset::compile(1, &rules)?;
        let decide = |tool: &str, arguments: Value| ruleset.evaluate(&tool_call_context(tool, &arguments, "agent", None)).decision;
        assert_eq!(decide("shell", json!({"command": "ls"})), RuleAction::Deny);
        assert_eq!(decide("run_shell_command", json!({})), RuleAction::Deny);
        assert_eq!(decide("sql_query", json!({"query": "DROP TABLE users"})), RuleAction::Deny);
        assert_eq!(decide("files", json!({"cmd": "rm -rf /"})), RuleAction::Deny);
        assert_eq!(decide("create_payment", json!({"amount": 10})), RuleAction::RequireApproval);
        assert_eq!(decide("deploy_service", json!({"env": "prod"})), RuleAction::RequireApproval);
        assert_eq!(decide("search_web", json!({"query": "weather in Paris"})), RuleAction::Allow);
        assert_eq!(decide("sql_query", json!({"query": "SELECT name FROM users WHERE id = 1"})), RuleAction::Allow);
        assert_eq!(decide("get_system_status", json!({})), RuleAction::Allow);
        assert_eq!(decide("publish_ssh_key_docs", json!({})), RuleAction::RequireApproval, "`sh` inside words is not a shell");
        Ok(())
    }

    #[test]
    fn rules_round_trip_through_the_contract() -> Result<(), String> {
        let rules = (PRESETS[0].rules)();
        let back = rules_from_proto(&rules.iter().map(Rule::to_proto).collect::<Vec<_>>())?;
        assert_eq!(back, rules);
        Ok(())
    }
}
