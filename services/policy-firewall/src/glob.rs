//! Wildcard patterns (`*` any run of characters, `?` one character), compared case-insensitively: tool
//! names in deny lists, allowlists and policy conditions.

/// Whether `text` matches `pattern` in full, ignoring ASCII case.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().map(|character| character.to_ascii_lowercase()).collect();
    let text: Vec<char> = text.chars().map(|character| character.to_ascii_lowercase()).collect();
    // Iterative matching with one backtrack point (the last `*`): linear in practice, never exponential.
    let (mut pattern_index, mut text_index) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while text_index < text.len() {
        match pattern.get(pattern_index) {
            Some('*') => {
                star = Some((pattern_index, text_index));
                pattern_index += 1;
            }
            Some(&expected) if expected == '?' || expected == text[text_index] => {
                pattern_index += 1;
                text_index += 1;
            }
            _ => match star {
                Some((star_pattern, star_text)) => {
                    pattern_index = star_pattern + 1;
                    text_index = star_text + 1;
                    star = Some((star_pattern, star_text + 1));
                }
                None => return false,
            },
        }
    }
    pattern[pattern_index..].iter().all(|&character| character == '*')
}

/// Whether any of `patterns` matches `text`.
pub fn any_glob_matches<'a>(patterns: impl IntoIterator<Item = &'a String>, text: &str) -> bool {
    patterns.into_iter().any(|pattern| glob_matches(pattern, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_and_question_marks_match_whole_names_ignoring_case() {
        assert!(glob_matches("shell*", "shell_exec"));
        assert!(glob_matches("*exec*", "Remote_EXEC_tool"));
        assert!(glob_matches("get_?ser", "get_user"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("a*b*c", "aXXbYYc"));
        assert!(!glob_matches("shell*", "my_shell"));
        assert!(!glob_matches("get_?ser", "get_usser"));
        assert!(!glob_matches("a*b*c", "aXXbYY"));
        assert!(!glob_matches("exact", "exactly"));
    }
}
