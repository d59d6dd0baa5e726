//! The `pii` scanner: personal data (emails, phone numbers, payment cards checked with Luhn, US social
//! security numbers, IBANs checked with mod-97) and secrets (provider and cloud API keys, tokens,
//! private key blocks). A `RegexSet` tells which detectors can match (one pass on a clean text); only
//! those search for spans, which the firewall needs to redact.

use std::ops::Range;
use std::sync::LazyLock;

use regex::{Regex, RegexSet};

use super::{Finding, MatchType};

/// What a candidate must also satisfy beyond its pattern.
#[derive(Debug, Clone, Copy)]
enum Check {
    None,
    Luhn,
    Iban,
    Ssn,
    Phone,
}

struct Detector {
    match_type: MatchType,
    subtype: &'static str,
    confidence: f64,
    regex: &'static str,
    check: Check,
}

/// Most specific first: a span claimed by an earlier detector is not reported again by a later one
/// (an Anthropic key is not also an OpenAI key, a card number is not also a phone number).
const DETECTORS: &[Detector] = &[
    Detector {
        match_type: MatchType::Secret,
        subtype: "private_key",
        confidence: 0.99,
        regex: r"(?s)-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----.*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|\z)",
        check: Check::None,
    },
    Detector {
        match_type: MatchType::Secret,
        subtype: "anthropic_api_key",
        confidence: 0.99,
        regex: r"\bsk-ant-[A-Za-z0-9_-]{20,}",
        check: Check::None,
    },
    Detector {
        match_type: MatchType::Secret,
        subtype: "openai_api_key",
        confidence: 0.99,
        regex: r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}",
        check: Check::None,
    },
    Detector {
        match_type: MatchType::Secret,
        subtype: "stripe_secret_key",
        confidence: 0.99,
        regex: r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}",
        check: Check::None,
    },
    Detector {
        match_type: MatchType::Secret,
        subtype: "aws_access_key_id",
        confidence: 0.99,
        regex: r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}\b",
        check: Check::None,
    },
    Detector {
        match_type: MatchType::Secret,
        subtype: "github_token",
        confidence: 0.99,
        regex: r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,}\b|\bgithub_pat_[A-Za-z0-9_]{22,}",
        check: Check::None,
    },
    Detector {
        match_type: MatchType::Secret,
        subtype: "slack_token",
        confidence: 0.99,
        regex: r"\bxox[abposre]-[A-Za-z0-9-]{10,}",
        check: Check::None,
    },
    Detector {
        match_type: MatchType::Secret,
        subtype: "google_api_key",
        confidence: 0.99,
        regex: r"\bAIza[0-9A-Za-z_-]{35}",
        check: Check::None,
    },
    Detector {
        match_type: MatchType::Secret,
        subtype: "brainstorm_api_key",
        confidence: 0.99,
        regex: r"\bbr_(?:live|test)_[A-Za-z0-9]{20,}",
        check: Check::None,
    },
    Detector {
        match_type: MatchType::Pii,
        subtype: "iban",
        confidence: 0.95,
        regex: r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b",
        check: Check::Iban,
    },
    Detector {
        match_type: MatchType::Pii,
        subtype: "credit_card",
        confidence: 0.95,
        regex: r"\b(?:\d[ -]?){12,18}\d\b",
        check: Check::Luhn,
    },
    Detector { match_type: MatchType::Pii, subtype: "us_ssn", confidence: 0.85, regex: r"\b\d{3}-\d{2}-\d{4}\b", check: Check::Ssn },
    Detector {
        match_type: MatchType::Pii,
        subtype: "email",
        confidence: 0.9,
        regex: r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b",
        check: Check::None,
    },
    Detector {
        match_type: MatchType::Pii,
        subtype: "phone",
        confidence: 0.75,
        regex: r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}\b|(?:\(\d{3}\) ?|\b\d{3}[ .-])\d{3}[ .-]\d{4}\b",
        check: Check::Phone,
    },
];

struct Compiled {
    set: RegexSet,
    regexes: Vec<Regex>,
}

static COMPILED: LazyLock<Option<Compiled>> = LazyLock::new(|| {
    let set = RegexSet::new(DETECTORS.iter().map(|detector| detector.regex)).ok()?;
    let regexes = DETECTORS.iter().map(|detector| Regex::new(detector.regex)).collect::<Result<Vec<_>, _>>().ok()?;
    Some(Compiled { set, regexes })
});

/// Every PII and secret finding in `text`, with spans.
pub fn scan(text: &str, findings: &mut Vec<Finding>) {
    detect(text, findings, |_| true);
}

/// Secret findings only (the firewall's redaction step), with spans.
pub fn secrets(text: &str) -> Vec<Finding> {
    let mut findings = Vec::new();
    detect(text, &mut findings, |detector| detector.match_type == MatchType::Secret);
    findings
}

fn detect(text: &str, findings: &mut Vec<Finding>, wanted: impl Fn(&Detector) -> bool) {
    let Some(compiled) = COMPILED.as_ref() else {
        tracing::error!("built-in pii detectors failed to compile");
        return;
    };
    let mut claimed: Vec<Range<usize>> = Vec::new();
    for index in super::matching_patterns(&compiled.set, text) {
        let (Some(detector), Some(regex)) = (DETECTORS.get(index), compiled.regexes.get(index)) else { continue };
        for candidate in regex.find_iter(text) {
            let span = candidate.range();
            if claimed.iter().any(|taken| taken.start < span.end && span.start < taken.end) {
                continue;
            }
            if !passes(detector.check, candidate.as_str()) {
                continue;
            }
            claimed.push(span.clone());
            if wanted(detector) {
                findings.push(Finding::new(detector.match_type, detector.subtype, super::PII, detector.confidence).with_span(span));
            }
        }
    }
}

fn passes(check: Check, candidate: &str) -> bool {
    match check {
        Check::None => true,
        Check::Luhn => {
            let digits: Vec<u32> = candidate.chars().filter_map(|character| character.to_digit(10)).collect();
            (13..=19).contains(&digits.len()) && digits.iter().any(|digit| *digit != digits[0]) && luhn_valid(&digits)
        }
        Check::Iban => iban_valid(candidate),
        Check::Ssn => ssn_valid(candidate),
        Check::Phone => {
            let digits = candidate.chars().filter(char::is_ascii_digit).count();
            if candidate.starts_with('+') { (8..=15).contains(&digits) } else { digits == 10 }
        }
    }
}

/// The Luhn checksum over decimal digits (most significant first).
pub fn luhn_valid(digits: &[u32]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(position, &digit)| {
            if position % 2 == 1 {
                let doubled = digit * 2;
                if doubled > 9 { doubled - 9 } else { doubled }
            } else {
                digit
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// ISO 13616: the country code and check digits moved to the end, letters as numbers, mod 97 is 1.
pub fn iban_valid(candidate: &str) -> bool {
    let compact: Vec<char> = candidate.chars().filter(|character| !character.is_whitespace()).collect();
    if !(15..=34).contains(&compact.len()) {
        return false;
    }
    let rearranged = compact[4..].iter().chain(compact[..4].iter());
    let mut remainder: u64 = 0;
    for character in rearranged {
        let value = match character {
            '0'..='9' => u64::from(*character as u8 - b'0'),
            'A'..='Z' => u64::from(*character as u8 - b'A') + 10,
            _ => return false,
        };
        remainder = if value >= 10 { (remainder * 100 + value) % 97 } else { (remainder * 10 + value) % 97 };
    }
    remainder == 1
}

/// Area not 000, 666 or 9xx; group not 00; serial not 0000.
fn ssn_valid(candidate: &str) -> bool {
    let parts: Vec<&str> = candidate.split('-').collect();
    let [area, group, serial] = parts.as_slice() else { return false };
    *area != "000" && *area != "666" && !area.starts_with('9') && *group != "00" && *serial != "0000"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str) -> Vec<(String, String)> {
        let mut findings = Vec::new();
        scan(text, &mut findings);
        findings.into_iter().map(|finding| (finding.match_type.as_str().to_string(), finding.subtype.to_string())).collect()
    }

    fn subtypes(text: &str) -> Vec<String> {
        found(text).into_iter().map(|(_, subtype)| subtype).collect()
    }

    #[test]
    fn every_detector_compiles() {
        assert!(COMPILED.is_some());
    }

    #[test]
    fn emails_and_phone_numbers_are_found() {
        assert_eq!(found("write to jane.doe+news@example.co.uk today"), vec![("pii".to_string(), "email".to_string())]);
        assert_eq!(subtypes("call (555) 123-4567 or 555.987.6543"), vec!["phone", "phone"]);
        assert_eq!(subtypes("international: +44 20 7946 0958"), vec!["phone"]);
    }

    #[test]
    fn payment_cards_need_a_valid_luhn_checksum() {
        assert_eq!(subtypes("card 4111 1111 1111 1111 exp 12/29"), vec!["credit_card"]);
        assert_eq!(subtypes("card 5500-0000-0000-0004"), vec!["credit_card"]);
        assert!(subtypes("card 4111 1111 1111 1112").is_empty(), "Luhn-invalid");
        assert!(subtypes("order 0000 0000 0000 0000").is_empty(), "a run of one digit is not a card");
    }

    #[test]
    fn ibans_need_a_valid_mod_97_checksum() {
        assert_eq!(subtypes("pay to GB82 WEST 1234 5698 7654 32 please"), vec!["iban"]);
        assert_eq!(subtypes("IBAN DE89370400440532013000"), vec!["iban"]);
        assert!(subtypes("pay to GB82 WEST 1234 5698 7654 33 please").is_empty(), "wrong check digits");
        assert!(subtypes("IBAN DE00370400440532013000").is_empty());
    }

    #[test]
    fn social_security_numbers_are_found_unless_impossible() {
        assert_eq!(subtypes("my ssn is 123-45-6789"), vec!["us_ssn"]);
        assert!(subtypes("ssn 000-12-3456 or 666-12-3456 or 900-12-3456 or 123-00-4567").is_empty());
    }

    #[test]
    fn secrets_and_keys_are_found() {
        let cases = [
            ("sk-proj-abcdefghijklmnopqrstuvwxyz123456", "openai_api_key"),
            ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "anthropic_api_key"),
            ("AKIAIOSFODNN7EXAMPLE", "aws_access_key_id"),
            ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "github_token"),
            ("xoxb-123456789012-abcdefghij", "slack_token"),
            ("sk_live_abcdefghijklmnop1234", "stripe_secret_key"),
            ("AIzaSyA-abcdefghijklmnopqrstuvwxyz01234", "google_api_key"),
            ("br_live_abcdefghijklmnopqrstuvwxyz0123", "brainstorm_api_key"),
        ];
        for (secret, subtype) in cases {
            assert_eq!(found(&format!("token={secret} end")), vec![("secret".to_string(), subtype.to_string())], "{secret}");
        }
        let key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----";
        let findings = secrets(&format!("here: {key} done"));
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].span.clone().map(|span| span.len()), Some(key.len()), "the whole block is one span");
        let unterminated = "-----BEGIN PRIVATE KEY-----\nMIIEv";
        let truncated = secrets(unterminated);
        assert_eq!(truncated.len(), 1);
        assert_eq!(truncated[0].span.clone().map(|span| span.end), Some(unterminated.len()), "an unterminated block runs to the end");
    }

    #[test]
    fn ordinary_text_has_no_pii() {
        for text in [
            "The meeting moved to 3pm on 2024-01-15; bring the 12-page report.",
            "Order number 1234567890 ships tomorrow.",
            "Version 1.2.3 fixed issue #4567 in module sk-learn.",
            "The ratio was 12-34-5678 in the spreadsheet? No, that is not a number format we use.",
        ] {
            assert!(found(text).is_empty(), "{text}: {:?}", found(text));
        }
    }

    #[test]
    fn the_checksums_are_right() {
        assert!(luhn_valid(&[7, 9, 9, 2, 7, 3, 9, 8, 7, 1, 3]));
        assert!(!luhn_valid(&[7, 9, 9, 2, 7, 3, 9, 8, 7, 1, 4]));
        assert!(iban_valid("FR1420041010050500013M02606"));
        assert!(!iban_valid("FR1420041010050500013M02607"));
        assert!(!iban_valid("GB82"));
    }
}
