"""The web UI in a real browser (Debian's headless Chromium driven by Selenium) against real
runs on the local fleet: every page opened and read as a user reads it, a run's status going
from running to done and its log lines arriving without a reload, the pages readable without
JavaScript and on a phone-sized screen, every page's HTML valid, no secret value in any page,
and the token cookie off loopback. Screenshots go to artifacts/screenshots/."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO_ROOT, require
from tests.e2e.conftest import Dstack
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.e2e.test_web_api import SECRET, secretive_project, serving

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = REPO_ROOT / "artifacts" / "screenshots"
REQUIRE = "DSTACK_PLAN_REQUIRE_BROWSER"
PAGES = ("/", "/runs/task.slow", "/runs/task.secretive", "/fleets", "/metrics", "/events", "/plan")
SLOW = (
    "type: task\nname: slow\ncommands:\n"
    "  - 'for i in 1 2 3 4 5 6 7 8; do echo line $i; sleep 1; done'\n" + RESOURCES
)

Browser = Callable[..., Any]


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists():
            return f"no {path} (Debian package {package}: scripts/test-deps.sh installs it)"
    return None


@pytest.fixture
def browser() -> Iterator[Browser]:
    """`browser(javascript=True, width=1280, height=900)`: a headless Chromium, closed after
    the test. Missing, it skips; under CI (or DSTACK_PLAN_REQUIRE_BROWSER=1) it fails."""
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (and CI is set)")
        require(REQUIRE, reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    drivers: list[Any] = []

    def open_browser(javascript: bool = True, width: int = 1280, height: int = 900) -> Any:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--disable-gpu", f"--window-size={width},{height}"):  # fmt: skip
            options.add_argument(arg)
        if not javascript:
            options.add_experimental_option(
                "prefs", {"profile.managed_default_content_settings.javascript": 2}
            )
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
        drivers.append(driver)
        return driver

    yield open_browser
    for driver in drivers:
        driver.quit()


def screenshot(driver: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def until(check: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except Exception:  # noqa: BLE001 - an element replaced while read: try again
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def valid_html(text: str, path: str) -> None:
    """Strict HTML5 parsing (html5lib, the WHATWG algorithm): any parse error fails."""
    import html5lib

    parser = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False)
    try:
        parser.parse(text)
    except html5lib.html5parser.ParseError as e:
        raise AssertionError(f"{path}: invalid HTML: {e}") from None


def text_of(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def test_pages_in_a_browser_live_valid_and_without_secrets(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str], browser: Browser
) -> None:
    from selenium.webdriver.common.by import By

    project = secretive_project(dstack, tmp_path / "project")
    watch = ["watch", "--ui", "--bind", "127.0.0.1:0", "--interval", "0.5s"]
    with serving(watch, project, cli_env) as (url, _):
        base = url.rstrip("/")
        seen: list[str] = []
        driver = browser()

        # the runs page: the secretive run is there; a new run appears without a reload
        driver.get(base + "/")
        until(lambda: "task.secretive" in text_of(driver, "#runs"), "the runs table")
        driver.execute_script("window.notReloaded = true")
        (project / "slow.dstack.yml").write_text(SLOW)
        applied = dstack("apply", "-y", "--target", "task.slow")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        row = '#runs tr[data-run="task.slow"]'
        until(lambda: "running" in text_of(driver, row), "task.slow running in the table")
        assert driver.execute_script("return window.notReloaded") is True
        screenshot(driver, "runs")

        # a run: its log lines arrive and its status turns done, all without a reload
        driver.get(base + "/runs/task.slow")
        assert text_of(driver, "#run-status") == "running"
        driver.execute_script("window.notReloaded = true")
        log = until(lambda: "line 2" in text_of(driver, "#log"), "the first log lines")
        assert log
        until(lambda: text_of(driver, "#run-status") == "done", "task.slow done", timeout=40)
        until(lambda: "line 8" in text_of(driver, "#log"), "the last log line")
        lines = text_of(driver, "#log").splitlines()
        assert lines == [f"line {i}" for i in range(1, 9)], lines  # each once, in order
        assert driver.execute_script("return window.notReloaded") is True
        assert "done" in text_of(driver, "#log-state")
        screenshot(driver, "run")

        # every page: what it says, valid HTML, no secret; its live fragment too
        for path in PAGES:
            driver.get(base + path)
            assert "Error" not in driver.title, (path, text_of(driver, "main"))
            seen.append(driver.page_source)
            served = httpx.get(base + path, timeout=60)
            assert served.status_code == 200, (path, served.text)
            assert served.headers["Content-Type"].startswith("text/html")
            valid_html(served.text, path)
            seen.append(served.text)
            live = httpx.get(base + path, headers={"HX-Request": "true"}, timeout=60)
            seen.append(live.text)
        driver.get(base + "/runs/task.secretive")
        until(lambda: "token=(sensitive)" in text_of(driver, "#log"), "the redacted log line")
        seen.append(driver.page_source)
        screenshot(driver, "run-secretive")
        driver.get(base + "/fleets")
        assert "agent ok" in text_of(driver, ".host")
        screenshot(driver, "fleets")
        driver.get(base + "/metrics")
        until(lambda: driver.find_elements(By.CSS_SELECTOR, "#chart-gpu canvas"), "a chart")
        until(lambda: "No samples" not in text_of(driver, "#samples"), "samples listed")
        screenshot(driver, "metrics")
        driver.get(base + "/events")
        assert "task.slow" in text_of(driver, ".events")
        screenshot(driver, "events")
        driver.get(base + "/plan")
        plan = text_of(driver, "#plan")
        assert "task.slow: no changes" in plan or "task.slow" in plan, plan
        screenshot(driver, "plan")
        driver.get(base + "/?status=done")
        assert "task.slow" in text_of(driver, "#runs")
        assert "task.secretive" not in text_of(driver, "#runs")
        driver.get(base + "/?namespace=nope")
        assert "No runs match" in text_of(driver, "#runs")
        driver.get(base + "/runs/nope")
        assert "no run 'nope'" in text_of(driver, "#error")
        seen.append(driver.page_source)

        # without JavaScript: everything is in the page as served
        plain = browser(javascript=False)
        plain.get(base + "/runs/task.slow")
        assert text_of(plain, "#run-status") == "done"
        assert "line 8" in text_of(plain, "#log")
        plain.get(base + "/")
        assert "task.secretive" in text_of(plain, "#runs")
        screenshot(plain, "runs-no-js")

        # a phone: nothing wider than the screen but the tables, which scroll inside
        phone = browser(width=390, height=844)
        for path, name in (("/", "phone-runs"), ("/fleets", "phone-fleets")):
            phone.get(base + path)
            wide = phone.execute_script(
                "return document.documentElement.scrollWidth > window.innerWidth + 1"
            )
            assert not wide, f"{path} is wider than a phone screen"
            screenshot(phone, name)

    assert all(SECRET not in text for text in seen)
    assert dstack("destroy", "-y").returncode == 0


def test_off_loopback_a_browser_gets_in_with_the_token_once(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str], browser: Browser
) -> None:
    project = tmp_path / "project"
    (project / "slow.dstack.yml").write_text(SLOW)
    assert dstack("apply", "-y").returncode == 0
    with serving(["ui", "--bind", "127.0.0.2:0"], project, cli_env) as (url, _):
        base = url.rstrip("/")
        token = (project / ".dstack" / "ui-token").read_text().strip()
        refused = httpx.get(base + "/", timeout=30)
        assert refused.status_code == 401 and "?token=" in refused.text
        valid_html(refused.text, "/ (401)")
        wrong = httpx.get(base + "/?token=wrong", timeout=30)
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        given = httpx.get(f"{base}/runs/task.slow?replica=0&token={token}", timeout=30)
        assert given.status_code == 302
        assert given.headers["Location"] == "/runs/task.slow?replica=0"
        cookie = given.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie

        driver = browser()
        driver.get(f"{base}/runs/task.slow?token={token}")
        assert driver.current_url == base + "/runs/task.slow"  # the token left the URL
        assert text_of(driver, "#run-status") in {"running", "done"}
        # later pages and the log's event stream get in by the cookie alone
        until(lambda: "line 8" in text_of(driver, "#log"), "the log, followed", timeout=40)
        driver.get(base + "/events")
        assert text_of(driver, "h1") == "Events"  # not the 401 page
        screenshot(driver, "token-cookie")
    assert dstack("destroy", "-y").returncode == 0


def test_the_vendored_files_are_listed_with_their_licences() -> None:
    static = REPO_ROOT / "dstack_plan" / "web" / "static"
    listed = (static / "VENDORED.md").read_text()
    for name in ("htmx-2.0.4.min.js", "uPlot-1.6.31.iife.min.js", "uPlot-1.6.31.min.css"):
        assert (static / "vendor" / name).stat().st_size > 1000
        assert name in listed
    for name in ("htmx-LICENSE.txt", "uPlot-LICENSE.txt"):
        assert (static / "vendor" / name).exists()


def test_every_template_and_static_file_is_package_data() -> None:
    import fnmatch

    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["dstack_plan.web"]
    web = REPO_ROOT / "dstack_plan" / "web"
    files = [p for d in ("templates", "static") for p in (web / d).rglob("*") if p.is_file()]
    assert len(files) > 10
    for path in files:
        relative = path.relative_to(web).as_posix()
        assert any(fnmatch.fnmatch(relative, glob) for glob in globs), relative
