//! A real headless Chromium for the console's tests: Debian's `chromium` driven through its
//! `chromedriver` (both installed by `.ci/run`), on a free port, killed with its browser on
//! drop. Waiting is on conditions with deadlines, as everywhere in the tests.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// A chromedriver of the test's own (in its own process group, with the browsers it starts).
pub(crate) struct Browser {
    driver: Child,
    /// The WebDriver session.
    pub(crate) client: Client,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session with a 1280×900 window.
    pub(crate) async fn start() -> Browser {
        Self::start_with((1280, 900), false).await
    }

    /// [`Browser::start`] with a window of `width`×`height` and, when `dark`, the system's
    /// colour scheme set to dark (`prefers-color-scheme: dark`).
    pub(crate) async fn start_with((width, height): (u32, u32), dark: bool) -> Browser {
        let port = super::free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver (Debian's package `chromium-driver`; .ci/run installs it)");
        let mut args: Vec<String> = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
        ]
        .map(String::from)
        .to_vec();
        args.push(format!("--window-size={width},{height}"));
        if dark {
            args.push("--force-dark-mode".into());
        }
        let mut options = serde_json::json!({ "binary": "/usr/bin/chromium", "args": args });
        if width < 500 {
            // A desktop window is 500 px wide at least: a phone's viewport is emulated.
            options["mobileEmulation"] = serde_json::json!({
                "deviceMetrics": { "width": width, "height": height, "pixelRatio": 3.0 },
            });
        }
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".into(), options);
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            let attempt =
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                    .capabilities(capabilities.clone())
                    .connect(&url)
                    .await;
            match attempt {
                Ok(client) => break client,
                Err(e) if Instant::now() > deadline => panic!("no WebDriver session: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        Browser { driver, client }
    }

    /// Goes to `url`.
    pub(crate) async fn open(&self, url: &str) {
        self.client.goto(url).await.expect("the page loads");
    }

    /// The first element `css` finds, once there is one (30 s at most).
    pub(crate) async fn element(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no `{css}` on the page: {e}"))
    }

    /// The text of the first element `css` finds, once there is one.
    pub(crate) async fn text(&self, css: &str) -> String {
        self.element(css).await.text().await.expect("its text")
    }

    /// What `script` (a function body, `return …`) gives in the page.
    pub(crate) async fn script(&self, script: &str) -> serde_json::Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("`{script}` failed: {e}"))
    }

    /// Clicks the first element `css` finds, once there is one.
    pub(crate) async fn click(&self, css: &str) {
        self.element(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("`{css}` not clickable: {e}"));
    }

    /// Types `text` into the field `css` finds.
    pub(crate) async fn fill(&self, css: &str, text: &str) {
        let field = self.element(css).await;
        field.clear().await.expect("cleared");
        field.send_keys(text).await.expect("typed");
    }

    /// Whether an element `css` finds is on the page now.
    pub(crate) async fn has(&self, css: &str) -> bool {
        self.client.find(Locator::Css(css)).await.is_ok()
    }

    /// Accepts the confirm dialog a button opened.
    pub(crate) async fn accept(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.client.accept_alert().await.is_err() {
            assert!(Instant::now() < deadline, "no dialog to accept");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Reloads the page until `check` finds what it waits for in the text of `css`.
    pub(crate) async fn reload_until(
        &self,
        what: &str,
        css: &str,
        check: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = self.text(css).await;
            if check(&text) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "waited for {what}; `{css}` is `{text}`"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
            self.client.refresh().await.expect("reloaded");
        }
    }

    /// Waits (without reloading: an htmx answer) until the text of `css` passes `check`.
    pub(crate) async fn until(
        &self,
        what: &str,
        css: &str,
        check: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = None;
        loop {
            if let Ok(element) = self.client.find(Locator::Css(css)).await {
                if let Ok(text) = element.text().await {
                    if check(&text) {
                        return text;
                    }
                    last = Some(text);
                }
            }
            assert!(
                Instant::now() < deadline,
                "waited for {what} in `{css}`, which is {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Saves a screenshot of the page as `name`.png in `AX_SCREENSHOTS_DIR` when it is set (how
    /// docs/console/ is made: `AX_SCREENSHOTS_DIR=docs/console cargo nextest run -E
    /// 'test(/^console::/)'`).
    pub(crate) async fn screenshot(&self, name: &str) {
        let Some(dir) = std::env::var_os("AX_SCREENSHOTS_DIR").map(PathBuf::from) else {
            return;
        };
        let png = self.client.screenshot().await.expect("a screenshot");
        std::fs::create_dir_all(&dir).expect("the screenshots' folder");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("the screenshot written");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver and every browser it started share its process group.
        let _ = killpg(Pid::from_raw(self.driver.id() as i32), Signal::SIGKILL);
        let _ = self.driver.wait();
    }
}
