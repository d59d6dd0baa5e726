//! Tenant plans: what each plan caps per UTC day.

use brainstorm_common::money::Usd;

/// A plan's daily caps; `None` is uncapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub name: &'static str,
    /// The tier the plan is reported as.
    pub tier: &'static str,
    pub daily_spend_limit: Option<Usd>,
    pub daily_request_cap: Option<i64>,
    pub daily_token_cap: Option<i64>,
    /// Whether `auto` routes cheapest first rather than weighing quality (the sandbox's cost-first routing).
    pub cost_first: bool,
}

/// Every new tenant's plan: 100 requests, 100K tokens and USD 2 a day.
pub const SANDBOX: Plan = Plan {
    name: "sandbox",
    tier: "community",
    daily_spend_limit: Some(Usd::from_nanos(2_000_000_000)),
    daily_request_cap: Some(100),
    daily_token_cap: Some(100_000),
    cost_first: true,
};

/// After graduation: USD 5 a day, no request or token caps.
pub const STANDARD: Plan = Plan {
    name: "standard",
    tier: "standard",
    daily_spend_limit: Some(Usd::from_nanos(5_000_000_000)),
    daily_request_cap: None,
    daily_token_cap: None,
    cost_first: false,
};

/// The plan table.
pub static PLANS: [Plan; 2] = [SANDBOX, STANDARD];

impl Plan {
    /// The plan of this name, if known.
    pub fn by_name(name: &str) -> Option<&'static Plan> {
        PLANS.iter().find(|plan| plan.name == name)
    }

    /// The plan of this name; an unknown name gets the most restrictive plan (sandbox), so a typo
    /// can never lift a cap.
    pub fn resolve(name: &str) -> &'static Plan {
        Self::by_name(name).unwrap_or_else(|| {
            tracing::warn!(plan = name, "unknown plan: applying the sandbox caps");
            &SANDBOX
        })
    }

    /// The daily limit that applies: the lower of the plan's cap and the tenant's own daily limit.
    pub fn effective_daily_limit(&self, tenant_daily_limit: Option<Usd>) -> Option<Usd> {
        match (self.daily_spend_limit, tenant_daily_limit) {
            (Some(plan), Some(tenant)) => Some(plan.min(tenant)),
            (plan, tenant) => plan.or(tenant),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_and_standard_caps_follow_the_spec() {
        let sandbox = Plan::resolve("sandbox");
        assert_eq!((sandbox.tier, sandbox.daily_request_cap, sandbox.daily_token_cap), ("community", Some(100), Some(100_000)));
        assert_eq!(sandbox.daily_spend_limit.map(|limit| limit.to_string()), Some("2".to_string()));
        let standard = Plan::resolve("standard");
        assert_eq!((standard.daily_request_cap, standard.daily_token_cap), (None, None));
        assert_eq!(standard.daily_spend_limit.map(|limit| limit.to_string()), Some("5".to_string()));
        assert_eq!(Plan::resolve("enterprise-typo").name, "sandbox");
    }

    #[test]
    fn the_lower_of_plan_and_tenant_limits_applies() {
        let one = Usd::from_nanos(1_000_000_000);
        let ten = Usd::from_nanos(10_000_000_000);
        assert_eq!(STANDARD.effective_daily_limit(Some(one)), Some(one));
        assert_eq!(STANDARD.effective_daily_limit(Some(ten)), STANDARD.daily_spend_limit);
        assert_eq!(STANDARD.effective_daily_limit(None), STANDARD.daily_spend_limit);
        let uncapped = Plan { daily_spend_limit: None, ..STANDARD };
        assert_eq!(uncapped.effective_daily_limit(Some(ten)), Some(ten));
        assert_eq!(uncapped.effective_daily_limit(None), None);
    }
}
