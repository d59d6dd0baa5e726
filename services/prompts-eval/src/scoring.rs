//! Evaluation scorers: each gives a case a score from 0 to 1 (in millionths) and a pass.
//!
//! - `exact_match`: the answer equals the expected output once runs of whitespace are one space and
//!   the ends trimmed (1 or 0).
//! - `contains`: the answer contains the expected output, trimmed (1 or 0).
//! - `validity`: a structural score: the mean of checks that the answer is not empty, that it holds
//!   no unresolved `{{placeholder}}`, and, when the expected output is a JSON object or array, that
//!   the answer (a surrounding Markdown code fence allowed) is JSON of the same kind and, for an
//!   object, the share of the expected top-level keys it has.
//! - `llm_judge`: the score a judging model gave (the edge asks it).
//!
//! Graded scorers (`validity`, `llm_judge`) pass at half marks or more.

use serde_json::Value;

/// The scorers, by name.
pub const SCORERS: [&str; 4] = ["exact_match", "contains", "validity", "llm_judge"];
/// A whole score.
pub const FULL: u32 = 1_000_000;
/// Where graded scorers pass.
pub const PASS_AT: u32 = FULL / 2;

/// The scorer an evaluation uses when it names none: exact match without a model (the rendered
/// prompt is the answer), validity with one.
pub fn default_scorer(has_model: bool) -> &'static str {
    if has_model { "validity" } else { "exact_match" }
}

/// Whether the scorer compares with an expected output (which every case must then have).
pub fn needs_expected(scorer: &str) -> bool {
    matches!(scorer, "exact_match" | "contains")
}

fn normalized(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Scores one answer; `judged` is the judging model's score for `llm_judge`.
pub fn score(scorer: &str, expected: &str, actual: &str, judged: Option<u32>) -> (u32, bool) {
    let whole = |passed: bool| if passed { (FULL, true) } else { (0, false) };
    match scorer {
        "exact_match" => whole(normalized(expected) == normalized(actual)),
        "contains" => whole(actual.contains(expected.trim())),
        "validity" => {
            let score = validity(expected, actual);
            (score, score >= PASS_AT)
        }
        _ => {
            let score = judged.unwrap_or(0).min(FULL);
            (score, score >= PASS_AT)
        }
    }
}

/// The JSON an answer holds, inside a Markdown code fence or not.
fn answer_json(actual: &str) -> Option<Value> {
    let trimmed = actual.trim();
    let unfenced = trimmed
        .strip_prefix("```")
        .map(|rest| rest.trim_start_matches(|character: char| character.is_ascii_alphabetic()))
        .and_then(|rest| rest.trim_end().strip_suffix("```"))
        .unwrap_or(trimmed);
    serde_json::from_str(unfenced.trim()).ok()
}

fn validity(expected: &str, actual: &str) -> u32 {
    let mut checks: Vec<f64> =
        vec![if actual.trim().is_empty() { 0.0 } else { 1.0 }, if actual.contains("{{") && actual.contains("}}") { 0.0 } else { 1.0 }];
    match serde_json::from_str::<Value>(expected.trim()) {
        Ok(Value::Object(expected)) => match answer_json(actual) {
            Some(Value::Object(answer)) => {
                checks.push(1.0);
                if !expected.is_empty() {
                    let present = expected.keys().filter(|key| answer.contains_key(*key)).count();
                    checks.push(present as f64 / expected.len() as f64);
                }
            }
            _ => checks.extend([0.0, 0.0]),
        },
        Ok(Value::Array(_)) => checks.push(if matches!(answer_json(actual), Some(Value::Array(_))) { 1.0 } else { 0.0 }),
        _ => {}
    }
    let mean = checks.iter().sum::<f64>() / checks.len() as f64;
    (mean * f64::from(FULL)).round() as u32
}

/// A judging model's answer read as a score: the first number in it, from 0 to 1 (a number above 1
/// and at most 10 or 100 is read on that scale); None when it holds none.
pub fn judge_score(answer: &str) -> Option<u32> {
    let start = answer.find(|character: char| character.is_ascii_digit())?;
    let number: String = answer[start..].chars().take_while(|character| character.is_ascii_digit() || *character == '.').collect();
    let value: f64 = number.trim_end_matches('.').parse().ok()?;
    let unit = if value <= 1.0 {
        value
    } else if value <= 10.0 {
        value / 10.0
    } else if value <= 100.0 {
        value / 100.0
    } else {
        return None;
    };
    Some((unit * f64::from(FULL)).round() as u32)
}

/// The instruction the judging model gets for one case.
pub fn judge_prompt(rendered: &str, expected: Option<&str>, actual: &str) -> String {
    let reference = expected.map(|expected| format!("\nReference answer:\n{expected}\n")).unwrap_or_default();
    format!(
        "You grade answers. Reply with only a number from 0 to 1: how well the answer fulfils the prompt{}.\n\nPrompt:\n{rendered}\n{reference}\nAnswer:\n{actual}\n",
        if expected.is_some() { " and agrees with the reference answer" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_match_ignores_runs_of_whitespace_only() {
        assert_eq!(score("exact_match", " Hello   world\n", "Hello world", None), (FULL, true));
        assert_eq!(score("exact_match", "Hello world", "hello world", None), (0, false));
        assert_eq!(score("contains", " Paris ", "The capital is Paris.", None), (FULL, true));
        assert_eq!(score("contains", "Paris", "Lyon", None), (0, false));
    }

    #[test]
    fn validity_scores_structure() {
        assert_eq!(score("validity", "", "an answer", None), (FULL, true));
        assert_eq!(score("validity", "", "   ", None), (FULL / 2, true));
        assert_eq!(score("validity", "", "", None).0, FULL / 2, "empty: one of two checks");
        let expected = r#"{"city": "Paris", "country": "France"}"#;
        assert_eq!(score("validity", expected, "```json\n{\"city\": \"Lyon\", \"country\": \"France\"}\n```", None), (FULL, true));
        assert_eq!(score("validity", expected, r#"{"city": "Paris"}"#, None).0, 875_000);
        assert_eq!(score("validity", expected, "Paris, France", None), (FULL / 2, true));
        assert_eq!(score("validity", expected, "Hello {{name}}", None), (250_000, false));
        assert_eq!(score("validity", "[1, 2]", "[3]", None), (FULL, true));
    }

    #[test]
    fn judged_scores_are_read_on_their_scale() {
        assert_eq!(judge_score("0.8"), Some(800_000));
        assert_eq!(judge_score("Score: 7/10"), Some(700_000));
        assert_eq!(judge_score("85"), Some(850_000));
        assert_eq!(judge_score("1."), Some(FULL));
        assert_eq!(judge_score("no idea"), None);
        assert_eq!(judge_score("1000"), None);
        assert_eq!(score("llm_judge", "", "x", Some(700_000)), (700_000, true));
        assert_eq!(score("llm_judge", "", "x", None), (0, false));
    }

    #[test]
    fn the_default_scorer_depends_on_a_model() {
        assert_eq!(default_scorer(false), "exact_match");
        assert_eq!(default_scorer(true), "validity");
        assert!(needs_expected("contains") && !needs_expected("validity"));
    }
}
