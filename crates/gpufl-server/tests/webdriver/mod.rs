//! A small W3C WebDriver client for the browser tests: chromedriver started on a free port (and
//! killed on drop), one headless Chromium session, and the commands the tests use — navigate,
//! find elements by CSS selector, click, read text and attributes, run a script, set the window
//! size, take a screenshot. Plain HTTP + JSON (ureq), no async runtime.

#![allow(dead_code)]

use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The key under which W3C WebDriver names an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The Chromium and chromedriver binaries to use: `GPUFL_CHROMIUM` / `GPUFL_CHROMEDRIVER`, else
/// the first of Debian's names found on `PATH` or in /usr/bin.
pub fn find_browser() -> Result<(PathBuf, PathBuf), String> {
    let pick = |var: &str, names: &[&str]| -> Option<PathBuf> {
        if let Ok(p) = std::env::var(var) {
            return Some(PathBuf::from(p)).filter(|p| p.is_file());
        }
        let path = std::env::var("PATH").unwrap_or_default();
        for n in names {
            for d in path.split(':').chain(["/usr/bin", "/usr/lib/chromium"]) {
                let p = Path::new(d).join(n);
                if p.is_file() {
                    return Some(p);
                }
            }
        }
        None
    };
    let browser = pick("GPUFL_CHROMIUM", &["chromium", "chromium-browser"])
        .ok_or("no Chromium (Debian's package chromium; or set GPUFL_CHROMIUM)")?;
    let driver = pick("GPUFL_CHROMEDRIVER", &["chromedriver"])
        .ok_or("no chromedriver (Debian's package chromium-driver; or set GPUFL_CHROMEDRIVER)")?;
    Ok((browser, driver))
}

/// A WebDriver error answer, or a transport failure.
#[derive(Debug)]
pub struct WdError {
    /// The W3C error code ("no such element", …) or "transport".
    pub error: String,
    pub message: String,
}

impl std::fmt::Display for WdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.error, self.message)
    }
}

/// A running chromedriver and one browser session on it.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
}

/// An element of the current page.
#[derive(Clone, Debug)]
pub struct Element {
    id: String,
}

impl Element {
    fn to_json(&self) -> Value {
        json!({ ELEMENT: self.id })
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn call(method: &str, url: &str, body: Option<&Value>) -> Result<Value, WdError> {
    let req = ureq::request(method, url).timeout(Duration::from_secs(60));
    let r = match body {
        Some(b) => req
            .set("Content-Type", "application/json; charset=utf-8")
            .send_string(&b.to_string()),
        None => req.call(),
    };
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => {
            return Err(WdError {
                error: "transport".into(),
                message: e.to_string(),
            })
        }
    };
    let status = resp.status();
    let text = resp.into_string().map_err(|e| WdError {
        error: "transport".into(),
        message: e.to_string(),
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| WdError {
        error: "transport".into(),
        message: format!("{e}: {text}"),
    })?;
    let value = v.get("value").cloned().unwrap_or(Value::Null);
    if status >= 400 || value.get("error").is_some_and(|e| e.is_string()) {
        return Err(WdError {
            error: value["error"]
                .as_str()
                .unwrap_or("unknown error")
                .to_string(),
            message: value["message"].as_str().unwrap_or(&text).to_string(),
        });
    }
    Ok(value)
}

impl Browser {
    /// Start chromedriver on a free port and a headless Chromium session through it.
    pub fn start(browser: &Path, driver: &Path) -> Result<Browser, String> {
        let mut last = String::new();
        // A port found free may be taken before chromedriver binds it: try a few.
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new(driver)
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("{}: {e}", driver.display()))?;
            let base = format!("http://127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(20);
            let ready = loop {
                if let Ok(v) = call("GET", &format!("{base}/status"), None) {
                    if v["ready"] == true {
                        break true;
                    }
                }
                if matches!(child.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            if !ready {
                let _ = child.kill();
                let _ = child.wait();
                last = format!("chromedriver did not answer on port {port}");
                continue;
            }
            let caps = json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": browser.display().to_string(),
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--window-size=1400,1000", "--disable-dev-shm-usage",
                             "--hide-scrollbars", "--force-device-scale-factor=1"],
                },
            }}});
            match call("POST", &format!("{base}/session"), Some(&caps)) {
                Ok(v) => {
                    let session = v["sessionId"].as_str().unwrap_or_default().to_string();
                    return Ok(Browser {
                        driver: child,
                        base,
                        session,
                    });
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("new session: {e}"));
                }
            }
        }
        Err(last)
    }

    fn url(&self, tail: &str) -> String {
        format!("{}/session/{}{tail}", self.base, self.session)
    }

    fn post(&self, tail: &str, body: Value) -> Result<Value, WdError> {
        call("POST", &self.url(tail), Some(&body))
    }

    fn get(&self, tail: &str) -> Result<Value, WdError> {
        call("GET", &self.url(tail), None)
    }

    /// Load `url` (waits for the page to load).
    pub fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url }))
            .unwrap_or_else(|e| panic!("navigate to {url}: {e}"));
    }

    pub fn current_url(&self) -> String {
        self.get("/url")
            .unwrap()
            .as_str()
            .unwrap_or_default()
            .into()
    }

    /// The path (and query) of the current URL.
    pub fn current_path(&self) -> String {
        let u = self.current_url();
        let rest = u.split_once("://").map(|x| x.1).unwrap_or(&u);
        rest.find('/')
            .map(|i| rest[i..].to_string())
            .unwrap_or_else(|| "/".into())
    }

    pub fn title(&self) -> String {
        self.get("/title")
            .unwrap()
            .as_str()
            .unwrap_or_default()
            .into()
    }

    fn element_of(v: &Value) -> Element {
        Element {
            id: v[ELEMENT].as_str().expect("an element reference").into(),
        }
    }

    /// The first element matching `css`, or an error (no such element).
    pub fn try_find(&self, css: &str) -> Result<Element, WdError> {
        self.post("/element", json!({"using": "css selector", "value": css}))
            .map(|v| Self::element_of(&v))
    }

    /// The first element matching `css`; panics (naming the page) when there is none.
    pub fn find(&self, css: &str) -> Element {
        self.try_find(css).unwrap_or_else(|e| {
            panic!(
                "no element {css} on {}: {e}\npage text:\n{}",
                self.current_url(),
                self.page_text()
            )
        })
    }

    /// Every element matching `css`.
    pub fn find_all(&self, css: &str) -> Vec<Element> {
        self.post("/elements", json!({"using": "css selector", "value": css}))
            .map(|v| {
                v.as_array()
                    .map(|a| a.iter().map(Self::element_of).collect())
                    .unwrap_or_default()
            })
            .unwrap_or_else(|e| panic!("find {css}: {e}"))
    }

    /// Elements matching `css` inside `parent`.
    pub fn find_in(&self, parent: &Element, css: &str) -> Vec<Element> {
        self.post(
            &format!("/element/{}/elements", parent.id),
            json!({"using": "css selector", "value": css}),
        )
        .map(|v| {
            v.as_array()
                .map(|a| a.iter().map(Self::element_of).collect())
                .unwrap_or_default()
        })
        .unwrap_or_else(|e| panic!("find {css}: {e}"))
    }

    /// Click `e` (scrolled into view first by the driver) and wait for any page load.
    pub fn click(&self, e: &Element) {
        self.post(&format!("/element/{}/click", e.id), json!({}))
            .unwrap_or_else(|err| panic!("click on {}: {err}", self.current_url()));
    }

    /// Click a link or button that loads another page, and wait (at most 30 s) until the URL has
    /// changed and the new page has loaded: a click does not always wait for a form's POST and
    /// its redirect.
    pub fn click_nav(&self, e: &Element) {
        let before = self.current_url();
        self.click(e);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.current_url() != before
                && self.exec("return document.readyState;", vec![]) == "complete"
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "still on {before} 30 s after the click"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Type `text` into `e`.
    pub fn send_keys(&self, e: &Element, text: &str) {
        self.post(&format!("/element/{}/value", e.id), json!({ "text": text }))
            .unwrap_or_else(|err| panic!("type into an element: {err}"));
    }

    /// The rendered text of `e` (what a person sees).
    pub fn text(&self, e: &Element) -> String {
        self.get(&format!("/element/{}/text", e.id))
            .unwrap()
            .as_str()
            .unwrap_or_default()
            .into()
    }

    /// An attribute of `e`, None when absent.
    pub fn attr(&self, e: &Element, name: &str) -> Option<String> {
        self.get(&format!("/element/{}/attribute/{name}", e.id))
            .unwrap()
            .as_str()
            .map(str::to_string)
    }

    /// Run `script` (a function body; `arguments` holds `args`) in the page; its return value.
    pub fn exec(&self, script: &str, args: Vec<Value>) -> Value {
        self.post("/execute/sync", json!({ "script": script, "args": args }))
            .unwrap_or_else(|e| panic!("script {script}: {e}"))
    }

    /// An element as a script argument.
    pub fn arg(e: &Element) -> Value {
        e.to_json()
    }

    /// `document.body.innerText` of the current page.
    pub fn page_text(&self) -> String {
        self.exec(
            "return document.body ? document.body.innerText : '';",
            vec![],
        )
        .as_str()
        .unwrap_or_default()
        .into()
    }

    pub fn set_window_size(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({"width": width, "height": height}))
            .unwrap_or_else(|e| panic!("window size {width}x{height}: {e}"));
    }

    /// A PNG of the viewport.
    pub fn screenshot(&self) -> Vec<u8> {
        let v = self.get("/screenshot").expect("screenshot");
        base64_decode(v.as_str().unwrap_or_default()).expect("base64 PNG")
    }

    /// A PNG of the whole page: the window made as tall as the document (at most `max_height`)
    /// for the shot, then set back to 1400×1000.
    pub fn screenshot_full(&self, max_height: u32) -> Vec<u8> {
        let h = self
            .exec(
                "return Math.max(document.documentElement.scrollHeight, document.body.scrollHeight) \
                 + Math.max(0, window.outerHeight - window.innerHeight);",
                vec![],
            )
            .as_u64()
            .unwrap_or(1000) as u32;
        self.set_window_size(1400, h.clamp(1000, max_height));
        let png = self.screenshot();
        self.set_window_size(1400, 1000);
        png
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = call("DELETE", &self.url(""), None);
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Decode standard base64 (padding and whitespace allowed).
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        if c == b'=' || c.is_ascii_whitespace() {
            continue;
        }
        acc = (acc << 6) | val(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Read a whole response body (for plain HTTP checks next to the browser).
pub fn read_all(r: ureq::Response) -> Vec<u8> {
    let mut b = Vec::new();
    let _ = r.into_reader().read_to_end(&mut b);
    b
}

#[test]
fn base64_decodes() {
    assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
    assert_eq!(base64_decode("aGVsbG8h").unwrap(), b"hello!");
    assert_eq!(base64_decode("aA==").unwrap(), b"h");
    assert!(base64_decode("a*").is_none());
}
