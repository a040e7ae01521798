//! Provider presets: `provider: NAME` on a source stands for the provider's verification
//! scheme, its dedupe key with a window at least as long as the provider's redelivery
//! horizon, and a store_headers policy that keeps what re-verification, replay and
//! inspection need while dropping credentials. The source's own `dedupe`,
//! `dedupe_window_ms` and `store_headers` replace the preset's; its `verify` block gives
//! the scheme's other keys (the secret, at least) and may not name a scheme.
//!
//! The windows, and why (docs/configuration.md cites the providers' pages):
//!
//! | provider | provider's horizon | window |
//! |---|---|---|
//! | stripe | live-mode retries for up to 3 days | 96 h |
//! | github | deliveries of the past 3 days can be redelivered | 96 h |
//! | shopify | 8 retries over 4 h; deliveries may also arrive up to a day late | 48 h |
//! | standard-webhooks | the Svix schedule ends about 27.6 h after the first attempt | 72 h |
//! | slack | 3 retries: at once, after 1 min, after 5 min | 24 h |
//! | twilio | retries within one 15 s callback budget | 24 h |

use super::model::{Dedupe, HeaderAction, HeaderPolicy};

/// One provider's preset.
#[derive(Debug)]
pub(crate) struct Preset {
    pub name: &'static str,
    /// The `verify` scheme (a row of `verify_keys`); the source's `verify` block gives
    /// its other keys.
    pub scheme: &'static str,
    pub dedupe: PresetKey,
    pub dedupe_window_ms: u64,
    /// Headers stored as received: signatures, timestamps, ids and event types, so a stored
    /// hook can be re-verified, keyed again and inspected. Listed so that an instance
    /// policy dropping or hashing one of them does not take it from this source.
    pub keep: &'static [&'static str],
}

/// Where a preset's dedupe key comes from (names lower-case).
#[derive(Debug, Clone, Copy)]
pub(crate) enum PresetKey {
    Header(&'static str),
    Json(&'static str),
    /// A JSON key of a source whose bodies are not all JSON: those have no key.
    JsonOrKeyless(&'static str),
}

/// Credentials a provider never needs stored, dropped by every preset: a proxy's or
/// Twilio's basic-auth `authorization`, cookies.
pub(crate) const PRESET_DROP: &[&str] = &["authorization", "cookie", "proxy-authorization"];

const HOUR_MS: u64 = 3_600_000;

pub(crate) const PRESETS: &[Preset] = &[
    Preset {
        name: "stripe",
        scheme: "stripe",
        // The event id: a retry carries the same event.
        dedupe: PresetKey::Json("id"),
        dedupe_window_ms: 96 * HOUR_MS,
        keep: &["stripe-signature", "content-type", "user-agent"],
    },
    Preset {
        name: "github",
        scheme: "github",
        // A redelivery keeps the delivery's GUID.
        dedupe: PresetKey::Header("x-github-delivery"),
        dedupe_window_ms: 96 * HOUR_MS,
        keep: &[
            "x-hub-signature-256",
            "x-github-delivery",
            "x-github-event",
            "x-github-hook-id",
            "x-github-hook-installation-target-id",
            "x-github-hook-installation-target-type",
            "content-type",
            "user-agent",
        ],
    },
    Preset {
        name: "shopify",
        scheme: "shopify",
        // Shopify's idempotency key: the same on every retry of one delivery.
        dedupe: PresetKey::Header("x-shopify-webhook-id"),
        dedupe_window_ms: 48 * HOUR_MS,
        keep: &[
            "x-shopify-hmac-sha256",
            "x-shopify-webhook-id",
            "x-shopify-event-id",
            "x-shopify-topic",
            "x-shopify-shop-domain",
            "x-shopify-api-version",
            "x-shopify-triggered-at",
            "content-type",
        ],
    },
    Preset {
        name: "standard-webhooks",
        scheme: "standard-webhooks",
        dedupe: PresetKey::Header("webhook-id"),
        dedupe_window_ms: 72 * HOUR_MS,
        keep: &[
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
            "content-type",
        ],
    },
    Preset {
        name: "slack",
        scheme: "slack",
        // Events API callbacks carry `event_id`; interactions and slash commands are
        // form-encoded and have none, so they are taken without dedupe, not refused.
        dedupe: PresetKey::JsonOrKeyless("event_id"),
        dedupe_window_ms: 24 * HOUR_MS,
        keep: &[
            "x-slack-signature",
            "x-slack-request-timestamp",
            "x-slack-retry-num",
            "x-slack-retry-reason",
            "content-type",
        ],
    },
    Preset {
        name: "twilio",
        scheme: "twilio",
        dedupe: PresetKey::Header("i-twilio-idempotency-token"),
        dedupe_window_ms: 24 * HOUR_MS,
        keep: &[
            "x-twilio-signature",
            "i-twilio-idempotency-token",
            "content-type",
        ],
    },
];

/// The preset named `name`.
pub(crate) fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|preset| preset.name == name)
}

/// Every provider name, for messages.
pub(crate) fn names() -> String {
    let names: Vec<&str> = PRESETS.iter().map(|preset| preset.name).collect();
    names.join(", ")
}

impl Preset {
    pub(crate) fn dedupe(&self) -> Dedupe {
        let path = |dotted: &str| dotted.split('.').map(str::to_owned).collect();
        match self.dedupe {
            PresetKey::Header(name) => Dedupe::Header(name.to_owned()),
            PresetKey::Json(dotted) => Dedupe::Json(path(dotted)),
            PresetKey::JsonOrKeyless(dotted) => Dedupe::JsonOrKeyless(path(dotted)),
        }
    }

    /// The preset's rules first (keep its headers, drop credentials), then the instance
    /// policy's rules for every other header, so an instance-wide drop still applies.
    pub(crate) fn store_headers(&self, instance: &HeaderPolicy) -> HeaderPolicy {
        let mut rules: Vec<(String, HeaderAction)> = self
            .keep
            .iter()
            .map(|name| (name.to_string(), HeaderAction::Keep))
            .chain(
                PRESET_DROP
                    .iter()
                    .map(|name| (name.to_string(), HeaderAction::Drop)),
            )
            .collect();
        for (name, action) in &instance.rules {
            if !rules.iter().any(|(known, _)| known == name) {
                rules.push((name.clone(), *action));
            }
        }
        HeaderPolicy { rules }
    }
}
