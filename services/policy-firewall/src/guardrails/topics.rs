//! The `topic-restriction` scanner: topics a tenant refuses, each a list of keywords matched as whole
//! words, case-insensitively. A configuration compiles into one regex per topic.

use regex::Regex;

use super::{DeniedTopic, Finding, MatchType};

/// Confidence of a keyword match.
const TOPIC_CONFIDENCE: f64 = 0.85;

/// Compiled topics.
#[derive(Debug, Clone, Default)]
pub struct TopicMatcher {
    topics: Vec<(String, Regex)>,
}

impl TopicMatcher {
    /// Compiles the denied topics; topics without keywords are skipped.
    pub fn compile(topics: &[DeniedTopic]) -> Result<Self, regex::Error> {
        let mut compiled = Vec::with_capacity(topics.len());
        for topic in topics {
            let keywords: Vec<String> =
                topic.keywords.iter().map(|keyword| keyword.trim()).filter(|keyword| !keyword.is_empty()).map(whole_word).collect();
            if keywords.is_empty() {
                continue;
            }
            let pattern = format!("(?i){}", keywords.join("|"));
            compiled.push((topic.name.clone(), Regex::new(&pattern)?));
        }
        Ok(TopicMatcher { topics: compiled })
    }

    /// One finding per denied topic the text mentions.
    pub fn scan(&self, text: &str, findings: &mut Vec<Finding>) {
        for (name, regex) in &self.topics {
            if let Some(found) = regex.find(text) {
                findings.push(
                    Finding::new(MatchType::Topic, name.clone(), super::TOPIC_RESTRICTION, TOPIC_CONFIDENCE).with_span(found.range()),
                );
            }
        }
    }
}

/// The keyword as literal text, with word boundaries on the sides that are word characters (a
/// boundary next to punctuation would never match).
fn whole_word(keyword: &str) -> String {
    let is_word = |character: Option<char>| character.is_some_and(|character| character.is_alphanumeric() || character == '_');
    let start = if is_word(keyword.chars().next()) { r"\b" } else { "" };
    let end = if is_word(keyword.chars().last()) { r"\b" } else { "" };
    format!("(?:{start}{}{end})", regex::escape(keyword))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str, keywords: &[&str]) -> DeniedTopic {
        DeniedTopic { name: name.to_string(), keywords: keywords.iter().map(|keyword| keyword.to_string()).collect() }
    }

    #[test]
    fn keywords_match_whole_words_ignoring_case() -> Result<(), regex::Error> {
        let matcher = TopicMatcher::compile(&[topic("gambling", &["casino", "sports betting"]), topic("empty", &["  "])])?;
        let mut findings = Vec::new();
        matcher.scan("Which CASINO has the best odds for Sports Betting?", &mut findings);
        assert_eq!(findings.len(), 1, "one finding per topic");
        assert_eq!(findings[0].subtype, "gambling");
        let mut none = Vec::new();
        matcher.scan("The casinos of Monaco are architecture; alphabetting is not a word.", &mut none);
        assert!(none.is_empty(), "plurals and substrings are not the keyword: {none:?}");
        Ok(())
    }

    #[test]
    fn keywords_are_literal_text() -> Result<(), regex::Error> {
        let matcher = TopicMatcher::compile(&[topic("c", &["c++ (lang)"])])?;
        let mut findings = Vec::new();
        matcher.scan("I write c++ (lang) daily", &mut findings);
        assert_eq!(findings.len(), 1, "a keyword ending in punctuation still matches");
        let mut dots = Vec::new();
        TopicMatcher::compile(&[topic("ip", &["a.b"])])?.scan("axb", &mut dots);
        assert!(dots.is_empty(), "a dot is a dot, not any character");
        Ok(())
    }
}
