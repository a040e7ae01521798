//! The web console: a few static files embedded in the binary and served by the admin
//! listener under `/console`, so an operator needs no other server, no CDN and no network
//! beyond the admin port.
//!
//! The files hold no data and no secret, so they are served without a token; every figure
//! and every action of the console is a fetch of the admin API under `/v1/`, with the same
//! bearer token the CLI sends. The console never gets a route of its own to the store.
//!
//! | path | file |
//! |---|---|
//! | `/console`, `/console/` | `console/index.html` |
//! | `/console/app.js` | the shell: the token form, the hash router, the live refresh |
//! | `/console/api.js` | the token and the one fetch helper for `/v1/` |
//! | `/console/pages.js` | one function per page |
//! | `/console/dom.js` | DOM helpers (text only, never markup from data) |
//! | `/console/style.css` | the style sheet |

/// One embedded file and the type it is served with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asset {
    pub body: &'static [u8],
    pub content_type: &'static str,
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every file by its name under `/console/`. The index is also served at `/console`.
const ASSETS: [(&str, Asset); 6] = [
    (
        "index.html",
        Asset {
            body: include_bytes!("console/index.html"),
            content_type: HTML,
        },
    ),
    (
        "app.js",
        Asset {
            body: include_bytes!("console/app.js"),
            content_type: JS,
        },
    ),
    (
        "api.js",
        Asset {
            body: include_bytes!("console/api.js"),
            content_type: JS,
        },
    ),
    (
        "pages.js",
        Asset {
            body: include_bytes!("console/pages.js"),
            content_type: JS,
        },
    ),
    (
        "dom.js",
        Asset {
            body: include_bytes!("console/dom.js"),
            content_type: JS,
        },
    ),
    (
        "style.css",
        Asset {
            body: include_bytes!("console/style.css"),
            content_type: CSS,
        },
    ),
];

/// Headers of every console answer. The policy lets the page load only its own files and
/// talk only to its own origin: no inline script or style, no frame around it, so data
/// the console shows (hook bodies, headers, error text from destinations) cannot run as
/// code even if it slipped past the text-only rendering. `no-cache` makes a browser ask
/// again after an upgrade rather than mix old and new files.
pub const HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'",
    ),
    ("cache-control", "no-cache"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
];

/// Whether `path` belongs to the console (its routes answer 404 or 405 themselves).
pub fn owns(path: &str) -> bool {
    path == "/console" || path.starts_with("/console/")
}

/// The file a console path names; `None` for anything else.
pub fn asset(path: &str) -> Option<Asset> {
    let name = match path {
        "/console" | "/console/" => "index.html",
        _ => path.strip_prefix("/console/")?,
    };
    ASSETS
        .iter()
        .find(|(asset_name, _)| *asset_name == name)
        .map(|(_, asset)| *asset)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn check(path: &str, expected: Option<&str>) {
        assert_eq!(
            asset(path).map(|asset| asset.content_type),
            expected,
            "{path}"
        );
    }

    #[test]
    fn routes() {
        check("/console", Some(HTML));
        check("/console/", Some(HTML));
        check("/console/index.html", Some(HTML));
        check("/console/app.js", Some(JS));
        check("/console/pages.js", Some(JS));
        check("/console/api.js", Some(JS));
        check("/console/dom.js", Some(JS));
        check("/console/style.css", Some(CSS));
        check("/console/nothing.js", None);
        check("/console/../app.js", None);
        check("/consoleapp.js", None);
        check("/v1/console", None);
        assert!(owns("/console") && owns("/console/x") && !owns("/consoles"));
    }

    #[test]
    fn every_script_the_index_loads_is_served() {
        let index = std::str::from_utf8(asset("/console").unwrap().body).unwrap();
        let mut sources = index
            .split("src=\"")
            .skip(1)
            .chain(index.split("href=\"").skip(1))
            .map(|rest| rest.split('"').next().unwrap())
            .filter(|link| link.starts_with("/console/"))
            .peekable();
        assert!(sources.peek().is_some(), "the index loads nothing");
        for source in sources {
            assert!(asset(source).is_some(), "{source} is not served");
        }
        // Modules import each other by relative path; each must be served too.
        for (name, asset) in ASSETS.iter().filter(|(name, _)| name.ends_with(".js")) {
            let text = std::str::from_utf8(asset.body).unwrap();
            for line in text.lines().filter(|line| line.starts_with("import ")) {
                let module = line.rsplit("from \"./").next().unwrap();
                let module = module.split('"').next().unwrap();
                assert!(
                    super::asset(&format!("/console/{module}")).is_some(),
                    "{name} imports {module}, which is not served"
                );
            }
        }
    }

    #[test]
    fn no_inline_script_or_style() {
        // The policy forbids them; the page would silently lose them.
        let index = std::str::from_utf8(asset("/console").unwrap().body).unwrap();
        assert!(!index.contains("<script>") && !index.contains("<style"));
        assert!(!index.contains("style=\""));
        for handler in ["onclick", "onload", "onsubmit", "onerror", "javascript:"] {
            assert!(!index.contains(handler), "{handler}");
        }
    }
}
