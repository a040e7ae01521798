//! Service-account auth: an RS256 JWT signed with the key file's private key, exchanged at
//! the file's `token_uri` for an access token (OAuth 2.0 JWT bearer grant, RFC 7523), which
//! is cached until shortly before it expires.
//!
//! The key file is read at each token fetch (about once an hour), not at startup: a
//! rotated key file is picked up without a reload, and a sink whose file went missing
//! costs retries, not the start. Nothing here puts a key or a token in an error.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};

use crate::clock;

/// The one scope the sink needs: publish (and nothing else Google offers).
pub const SCOPE: &str = "https://www.googleapis.com/auth/pubsub";
/// The longest lifetime Google takes for a self-signed assertion.
const ASSERTION_LIFETIME_S: u64 = 3600;
/// A token is replaced this long before it expires, so no publish carries one that lapses
/// in flight.
const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// Google's access tokens live an hour; used when an answer leaves `expires_in` out.
const DEFAULT_EXPIRES_IN_S: u64 = 3600;
const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Enough of a token endpoint's answer for the token or its error.
const TOKEN_RESPONSE_MAX_BYTES: u64 = 64 * 1024;

/// The parts of a service account key file the sink uses.
pub struct ServiceAccountKey {
    pub client_email: String,
    pub token_uri: String,
    /// The JWT's `kid`: tells Google which of the account's keys signed it.
    pub private_key_id: Option<String>,
    key_pair: RsaKeyPair,
}

impl std::fmt::Debug for ServiceAccountKey {
    // By hand: the key pair is secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .finish_non_exhaustive()
    }
}

/// Checks a service account key file at load: readable JSON of `type: service_account`
/// with `client_email`, `token_uri` and a PEM PKCS#8 RSA `private_key` that ring accepts
/// and signs with. The error is one line without the file's secrets and without the path
/// (the caller names the setting and the file).
pub fn check_credentials_file(path: &Path) -> Result<(), String> {
    let key = ServiceAccountKey::load(path)?;
    key.assertion(clock::now_s()).map(drop)
}

impl ServiceAccountKey {
    pub fn load(path: &Path) -> Result<ServiceAccountKey, String> {
        let text = std::fs::read(path).map_err(|error| format!("cannot read it: {error}"))?;
        ServiceAccountKey::parse(&text)
    }

    pub fn parse(text: &[u8]) -> Result<ServiceAccountKey, String> {
        // Into a `Value`, not a struct: serde's type errors quote the offending value,
        // which could be the key; syntax errors give only a position.
        let json: serde_json::Value = serde_json::from_slice(text)
            .map_err(|error| format!("not a JSON key file ({error})"))?;
        let field = |name: &str| -> Result<String, String> {
            match json.get(name) {
                Some(serde_json::Value::String(value)) if !value.trim().is_empty() => {
                    Ok(value.clone())
                }
                Some(_) => Err(format!("{name} is not a non-empty string")),
                None => Err(format!("no {name}")),
            }
        };
        if !json.is_object() {
            return Err("not a JSON key file (not an object)".into());
        }
        let kind = field("type")?;
        if kind != "service_account" {
            // The type names the kind of credential and holds nothing secret.
            let kind: String = kind.chars().take(40).collect();
            return Err(format!(
                "type is {kind:?}, not \"service_account\" (a service account key file is needed)"
            ));
        }
        let client_email = field("client_email")?;
        let token_uri = field("token_uri")?;
        let private_key_id = field("private_key_id").ok();
        let pkcs8 = pem_pkcs8(&field("private_key")?)?;
        let key_pair = RsaKeyPair::from_pkcs8(&pkcs8)
            .map_err(|error| format!("private_key is not an RSA key ring takes ({error})"))?;
        Ok(ServiceAccountKey {
            client_email,
            token_uri,
            private_key_id,
            key_pair,
        })
    }

    /// The signed JWT (`header.claims.signature`, each base64url) asking `token_uri` for a
    /// Pub/Sub token, issued at `now_s`.
    pub fn assertion(&self, now_s: u64) -> Result<String, String> {
        let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
        if let Some(kid) = &self.private_key_id {
            header["kid"] = kid.as_str().into();
        }
        let claims = serde_json::json!({
            "iss": self.client_email,
            "sub": self.client_email,
            "aud": self.token_uri,
            "scope": SCOPE,
            "iat": now_s,
            "exp": now_s + ASSERTION_LIFETIME_S,
        });
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0u8; self.key_pair.public().modulus_len()];
        self.key_pair
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signed.as_bytes(),
                &mut signature,
            )
            .map_err(|_| "private_key cannot sign".to_owned())?;
        Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }

    /// The public key (DER RSAPublicKey), to verify an assertion.
    #[cfg(test)]
    pub fn public_key(&self) -> Vec<u8> {
        self.key_pair.public().as_ref().to_vec()
    }
}

/// The DER of the one `PRIVATE KEY` PEM block: PKCS#8, which is what Google's key files
/// hold.
fn pem_pkcs8(pem: &str) -> Result<Vec<u8>, String> {
    const BEGIN: &str = "-----BEGIN PRIVATE KEY-----";
    const END: &str = "-----END PRIVATE KEY-----";
    let Some(start) = pem.find(BEGIN) else {
        if pem.contains("-----BEGIN RSA PRIVATE KEY-----") {
            return Err(
                "private_key is PKCS#1 (BEGIN RSA PRIVATE KEY); a PKCS#8 key (BEGIN PRIVATE \
                 KEY), as Google issues, is needed"
                    .into(),
            );
        }
        return Err("private_key has no PEM block BEGIN PRIVATE KEY".into());
    };
    let body = &pem[start + BEGIN.len()..];
    let Some(end) = body.find(END) else {
        return Err("private_key's PEM block has no END PRIVATE KEY line".into());
    };
    let base64: String = body[..end]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    STANDARD
        .decode(base64)
        .map_err(|_| "private_key's PEM block is not base64".into())
}

/// Access tokens of one key file, shared by every attempt of the sink.
pub struct TokenSource {
    path: PathBuf,
    /// Held across a fetch, so concurrent attempts wait for the one refresh rather than
    /// each asking the token endpoint: a lock on pool threads, never on a pipeline core.
    cached: Mutex<Option<Token>>,
}

impl std::fmt::Debug for TokenSource {
    // By hand: the cached token is a credential.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

struct Token {
    /// The whole `Authorization` value, `Bearer <token>`.
    authorization: Arc<str>,
    refresh_at: Instant,
}

impl TokenSource {
    pub fn new(path: &Path) -> TokenSource {
        TokenSource {
            path: path.to_owned(),
            cached: Mutex::new(None),
        }
    }

    /// The `Authorization` value for a publish: the cached token, or a new one when none is
    /// cached or it is due for refresh. `Err` is a retry's reason: the endpoint may answer
    /// later, and refused credentials may be fixed by a new key file or a reload.
    pub fn authorization(
        &self,
        agent: &ureq::Agent,
        deadline: Instant,
    ) -> Result<Arc<str>, String> {
        let mut cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if let Some(token) = cached.as_ref().filter(|token| now < token.refresh_at) {
            return Ok(Arc::clone(&token.authorization));
        }
        let key = ServiceAccountKey::load(&self.path)
            .map_err(|reason| format!("credentials_file {}: {reason}", self.path.display()))?;
        let (access_token, expires_in) = fetch(agent, &key, deadline)?;
        let authorization: Arc<str> = format!("Bearer {access_token}").into();
        *cached = Some(Token {
            authorization: Arc::clone(&authorization),
            refresh_at: Instant::now() + refresh_after(expires_in),
        });
        Ok(authorization)
    }

    /// Forgets the token a publish was refused with (401), unless a newer one replaced it
    /// meanwhile, so the next attempt fetches a fresh one.
    pub fn invalidate(&self, authorization: &str) {
        let mut cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if cached
            .as_ref()
            .is_some_and(|token| &*token.authorization == authorization)
        {
            *cached = None;
        }
    }
}

/// How long a token that lives `expires_in` is used: until [`REFRESH_MARGIN`] before it
/// expires, or half its life when that is shorter than twice the margin.
fn refresh_after(expires_in: Duration) -> Duration {
    if expires_in >= 2 * REFRESH_MARGIN {
        expires_in - REFRESH_MARGIN
    } else {
        expires_in / 2
    }
}

/// One exchange with the token endpoint: the access token and its lifetime.
fn fetch(
    agent: &ureq::Agent,
    key: &ServiceAccountKey,
    deadline: Instant,
) -> Result<(String, Duration), String> {
    let assertion = key
        .assertion(clock::now_s())
        .map_err(|reason| format!("token: {reason}"))?;
    // The assertion is base64url and dots, which a form carries as they are.
    let form = format!(
        "grant_type={}&assertion={assertion}",
        GRANT_TYPE.replace(':', "%3A")
    );
    let Some(remaining) = super::remaining(deadline) else {
        return Err("token endpoint: timeout".into());
    };
    let response = agent
        .post(key.token_uri.as_str())
        .header("content-type", "application/x-www-form-urlencoded")
        .config()
        .timeout_global(Some(remaining))
        .build()
        .send(form.as_bytes());
    let mut response = match response {
        Ok(response) => response,
        Err(error) => {
            return Err(format!(
                "token endpoint: {}",
                super::super::http::transport_error(&error, key.token_uri.starts_with("https:")).0
            ))
        }
    };
    let status = response.status().as_u16();
    let body = super::read_limited(&mut response, TOKEN_RESPONSE_MAX_BYTES);
    let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    if status != 200 {
        // RFC 6749 §5.2: `{"error": "invalid_grant", "error_description": "…"}`.
        let described = json.as_ref().and_then(|json| {
            let error = json.get("error")?.as_str()?;
            let description = json
                .get("error_description")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("");
            Some(super::one_line(&format!("{error}: {description}")))
        });
        return Err(match described {
            Some(text) => format!("token endpoint: http {status}: {text}"),
            None => format!("token endpoint: {}", super::status_reason(status, &body)),
        });
    }
    let json = json.ok_or("token endpoint: http 200 without a JSON answer")?;
    let access_token = json
        .get("access_token")
        .and_then(serde_json::Value::as_str)
        .filter(|token| !token.is_empty())
        .ok_or("token endpoint: http 200 without an access_token")?;
    let expires_in = json
        .get("expires_in")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(DEFAULT_EXPIRES_IN_S);
    Ok((access_token.to_owned(), Duration::from_secs(expires_in)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(super) mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

    pub const RSA_KEY: &str = include_str!("../../../fixtures/pubsub/test-rsa-key.pem");
    const EC_KEY: &str = include_str!("../../../fixtures/pubsub/test-ec-key.pem");

    /// A key file's JSON as Google writes one, with this token_uri.
    pub fn key_file(token_uri: &str) -> serde_json::Value {
        serde_json::json!({
            "type": "service_account",
            "project_id": "proj",
            "private_key_id": "kid-0123",
            "private_key": RSA_KEY,
            "client_email": "ankusa@proj.iam.gserviceaccount.com",
            "client_id": "1234567890",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": token_uri,
        })
    }

    fn decode_part(part: &str) -> serde_json::Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    /// The header and claims of an assertion whose signature verifies with `public_key`.
    pub fn verified_claims(
        assertion: &str,
        public_key: &[u8],
    ) -> Result<(serde_json::Value, serde_json::Value), String> {
        let parts: Vec<&str> = assertion.split('.').collect();
        let [header, claims, signature] = parts[..] else {
            return Err(format!("{} parts", parts.len()));
        };
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|e| e.to_string())?;
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, public_key)
            .verify(format!("{header}.{claims}").as_bytes(), &signature)
            .map_err(|_| "bad signature".to_owned())?;
        Ok((decode_part(header), decode_part(claims)))
    }

    #[test]
    fn the_assertion_is_an_rs256_jwt_that_verifies() {
        let text = key_file("https://oauth2.googleapis.com/token").to_string();
        let key = ServiceAccountKey::parse(text.as_bytes()).unwrap();
        let assertion = key.assertion(1_700_000_000).unwrap();
        let (header, claims) = verified_claims(&assertion, &key.public_key()).unwrap();
        assert_eq!(
            header,
            serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": "kid-0123"})
        );
        assert_eq!(
            claims,
            serde_json::json!({
                "iss": "ankusa@proj.iam.gserviceaccount.com",
                "sub": "ankusa@proj.iam.gserviceaccount.com",
                "aud": "https://oauth2.googleapis.com/token",
                "scope": "https://www.googleapis.com/auth/pubsub",
                "iat": 1_700_000_000,
                "exp": 1_700_003_600,
            })
        );
        // A changed claim no longer verifies.
        let parts: Vec<&str> = assertion.split('.').collect();
        let forged_claims =
            URL_SAFE_NO_PAD.encode(claims.to_string().replace("1700003600", "1800003600"));
        let forged = format!("{}.{forged_claims}.{}", parts[0], parts[2]);
        assert_eq!(
            verified_claims(&forged, &key.public_key()),
            Err("bad signature".into())
        );
    }

    #[test]
    fn a_good_key_file_passes_the_load_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.json");
        std::fs::write(
            &path,
            key_file("https://oauth2.googleapis.com/token").to_string(),
        )
        .unwrap();
        assert_eq!(check_credentials_file(&path), Ok(()));
    }

    #[test]
    fn key_file_refusals_name_the_problem_without_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let check = |contents: &str| {
            let path = dir.path().join("key.json");
            std::fs::write(&path, contents).unwrap();
            check_credentials_file(&path).unwrap_err()
        };
        let with = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut json = key_file("https://oauth2.googleapis.com/token");
            edit(&mut json);
            check(&json.to_string())
        };
        let pkcs1_label = RSA_KEY.replace("PRIVATE KEY", "RSA PRIVATE KEY");
        let cases: Vec<(String, &str)> = vec![
            (
                check_credentials_file(&dir.path().join("absent.json")).unwrap_err(),
                "cannot read it: ",
            ),
            (
                check("{\"type\": "),
                "not a JSON key file (EOF while parsing",
            ),
            (check("[1, 2]"), "not a JSON key file (not an object)"),
            (
                with(&|json| json["type"] = "authorized_user".into()),
                "type is \"authorized_user\", not \"service_account\"",
            ),
            (
                with(&|json| {
                    json.as_object_mut().unwrap().remove("client_email");
                }),
                "no client_email",
            ),
            (
                with(&|json| {
                    json.as_object_mut().unwrap().remove("token_uri");
                }),
                "no token_uri",
            ),
            (
                with(&|json| json["private_key"] = 12.into()),
                "private_key is not a non-empty string",
            ),
            (
                with(&|json| json["private_key"] = pkcs1_label.as_str().into()),
                "private_key is PKCS#1 (BEGIN RSA PRIVATE KEY)",
            ),
            (
                with(&|json| json["private_key"] = "MIIEvQIBADANBgkqhkiG9w0B".into()),
                "private_key has no PEM block BEGIN PRIVATE KEY",
            ),
            (
                with(&|json| {
                    json["private_key"] =
                        "-----BEGIN PRIVATE KEY-----\n!!!\n-----END PRIVATE KEY-----\n".into()
                }),
                "private_key's PEM block is not base64",
            ),
            (
                with(&|json| json["private_key"] = EC_KEY.into()),
                "private_key is not an RSA key ring takes",
            ),
        ];
        let key_body = RSA_KEY.lines().nth(1).unwrap();
        for (error, expected) in cases {
            assert!(error.starts_with(expected), "{error:?} vs {expected:?}");
            assert!(!error.contains('\n'), "one line: {error:?}");
            assert!(
                !error.contains(&key_body[..16]),
                "no key material: {error:?}"
            );
        }
    }

    #[test]
    fn a_token_is_refreshed_five_minutes_before_it_expires() {
        let secs = Duration::from_secs;
        assert_eq!(refresh_after(secs(3600)), secs(3300));
        assert_eq!(refresh_after(secs(600)), secs(300));
        // Too short for the margin: half its life.
        assert_eq!(refresh_after(secs(400)), secs(200));
        assert_eq!(refresh_after(secs(0)), secs(0));
    }
}
