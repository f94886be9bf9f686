"""The operator's status page in a real browser: Debian's headless
Chromium driven by Selenium through Debian's chromedriver, against `fenceproxy
serve` and the demo upstream as processes.

Nothing is downloaded: the driver's path is given (Selenium Manager is skipped).
Without the browser these tests skip locally, with the reason; under CI=true they
fail, since `.ci/run` installs it (ensure_chromium). Every wait is a bounded
WebDriverWait on a condition; each state is saved as a screenshot under the test's
tmp_path (docs/status-page.png, on the docs' "when you are paged" page, is one of them).
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.integration.processes.conftest import ReconcileBlock, Stack, http_call
from tests.needs import missing

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# The page refreshes every 5 s: a wait for what a refresh shows spans two of them.
WAIT_S = 12.0
HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


def _browser_missing() -> str | None:
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.is_file()]
    if not missing:
        return None
    return (
        f"no {' or '.join(missing)}: apt-get install chromium chromium-driver "
        "(.ci/run installs them)"
    )


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    absent = _browser_missing()
    if absent is not None:
        missing(absent)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        # As root (CI, this project's machines) Chromium refuses its sandbox.
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1600",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(argument)
    service = Service(
        executable_path=str(CHROMEDRIVER), log_output=str(tmp_path / "chromedriver.log")
    )
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """The status page of `stack` in `driver`, with screenshots under tmp_path."""

    def __init__(self, driver: WebDriver, stack: Stack) -> None:
        self.driver = driver
        self.stack = stack
        self.url = f"{stack.proxy_url}/_fence/ui/"

    def until(self, condition: Callable[[WebDriver], Any], timeout_s: float = WAIT_S) -> Any:
        return WebDriverWait(
            self.driver, timeout_s, ignored_exceptions=[StaleElementReferenceException]
        ).until(condition)

    def shot(self, name: str) -> Path:
        path = self.stack.tmp_path / f"status-page-{name}.png"
        assert self.driver.save_screenshot(str(path)), path
        return path

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        """What the element holds as text (hidden parts too): never markup."""
        return str(self.find(css).get_property("textContent"))

    def open(self) -> None:
        self.driver.get(self.url)

    def log_in(self, key: str) -> None:
        self.until(lambda d: self.find("#login").is_displayed())
        field = self.find("#token")
        field.clear()
        field.send_keys(key)
        self.find("#login-form button[type=submit]").click()

    def open_logged_in(self) -> None:
        self.open()
        self.log_in(self.stack.admin_token)
        self.until(lambda d: "answers" in self.text("#service"))

    def reload(self) -> None:
        """A new read of everything now, rather than at the next refresh; the key
        stays in the tab's sessionStorage."""
        self.driver.refresh()
        self.until(lambda d: self.text("#refreshed").startswith("refreshed"))

    def act(self, effect_id: str, kind: str, operator: str, reason: str) -> WebElement:
        """Open an action's form on the effect's card, fill it: the form. A refresh may
        replace the card under the click; once a form is open, refreshes wait."""
        card = f'#outstanding article[data-effect-id="{effect_id}"]'

        def opened(driver: WebDriver) -> WebElement | None:
            forms = driver.find_elements(By.CSS_SELECTOR, f"{card} form.action.{kind}")
            if forms:
                return forms[0]
            driver.find_element(By.CSS_SELECTOR, f"{card} button.{kind}").click()
            return None

        form: WebElement = self.until(opened)
        form.find_element(By.NAME, "operator").send_keys(operator)
        form.find_element(By.NAME, "reason").send_keys(reason)
        return form


def _card(page: Page, effect_id: str) -> WebElement:
    element: WebElement = page.find(f'#outstanding article[data-effect-id="{effect_id}"]')
    return element


def _lose_an_answer(stack: Stack, resource_sku: str = "widget") -> str:
    """A place-order (no probe in this stack) whose answer the upstream drops after
    committing: its effect is UNKNOWN and the resource blocked. Returns its id."""
    lease = stack.acquire_ok(f"supplier:{resource_sku}", "worker-a", 30)
    lost = stack.place_order(
        resource_sku, lease["token"], "order-lost-1", extra_headers={"Demo-Drop-Response": "1"}
    )
    assert lost.status >= 500, lost
    effects = stack.proxy_effects(f"supplier:{resource_sku}")
    assert len(effects) == 1 and effects[0]["state"] == "UNKNOWN", effects
    effect_id: str = effects[0]["id"]
    return effect_id


def test_the_page_asks_for_the_key_and_refuses_a_wrong_one(
    browser: WebDriver, stack: Stack
) -> None:
    page = Page(browser, stack)
    page.open()
    page.until(lambda d: page.find("#login").is_displayed())
    assert not page.find("#board").is_displayed()
    page.shot("asks-for-the-key")

    page.log_in("not-the-admin-token")
    page.until(lambda d: "Refused" in page.text("#login-error"))
    assert "Authorization: Bearer" in page.text("#login-error")
    assert not page.find("#board").is_displayed()
    assert browser.execute_script("return sessionStorage.length") == 0
    page.shot("wrong-key-refused")

    page.log_in(stack.admin_token)
    page.until(lambda d: stack.instance_id in page.text("#service"))
    assert "sqlite: answers" in page.text("#service")
    # Its own panel: the policy file this replica serves, and that no replica differs.
    assert stack.config_path is not None
    digest = hashlib.sha256(stack.config_path.read_bytes()).hexdigest()
    page.until(lambda d: f"This replica: {digest[:12]}" in page.text("#policies"))
    assert "serves the same policy file" in page.text("#policies")
    # The key is in the tab's sessionStorage only: no cookie, nothing in the URL.
    assert browser.execute_script("return sessionStorage.length") == 1
    assert browser.get_cookies() == []
    assert stack.admin_token not in browser.current_url
    assert stack.admin_token not in browser.page_source
    page.shot("logged-in")


def test_a_lost_answer_shows_blocked_and_is_resolved_from_the_page(
    browser: WebDriver, stack: Stack
) -> None:
    page = Page(browser, stack)
    page.open_logged_in()
    effect_id = _lose_an_answer(stack)

    # The next refresh, on its own, shows it: the title tells at a glance.
    page.until(lambda d: d.title.startswith("(1 in doubt, 1 blocked)"))
    assert page.text("#outstanding .blocked-resource") == "supplier:widget"
    # The reconciler's own attempt (this route has no probe) is on the card.
    page.until(lambda d: "an operator must resolve this effect" in page.text("#outstanding"))
    page.reload()
    card = _card(page, effect_id)
    assert "UNKNOWN" in card.text and "order-lost-1" in card.text and "worker-a" in card.text
    page.shot("blocked")

    # Its history, in the detail view.
    card.find_element(By.CSS_SELECTOR, "a.detail-link").click()
    page.until(lambda d: page.find("#effect-detail").is_displayed())
    # The reconciler's note, not "no probe attempts left": no probe was ever asked.
    events = "#effect-detail table.events"
    page.until(lambda d: "the route has no reconcile block" in page.text(events))
    assert "no probe attempts left" not in page.text(events)
    page.shot("effect-history")

    # This route has no probe: no "Probe now" (it could only answer no_probe), and the
    # card says so once, with no probe schedule and no no_probe conclusion.
    card = _card(page, effect_id)
    assert card.find_elements(By.CSS_SELECTOR, "button.probe") == []
    assert page.find("#effect-detail").find_elements(By.CSS_SELECTOR, "button.probe") == []
    probes = card.find_element(By.CSS_SELECTOR, ".probes").text
    assert probes.startswith("Route place-order has no probe: an operator must resolve")
    assert "none scheduled" not in probes and "no_probe" not in probes, probes
    assert probes.count("no probe") == 1, probes

    # Resolve: the upstream did commit the order it never answered for.
    form = page.act(effect_id, "resolve", "alice", "the order is in the ERP")
    Select(form.find_element(By.NAME, "outcome")).select_by_value("committed")
    form.find_element(By.CSS_SELECTOR, "button.review").click()
    confirmation = form.find_element(By.CSS_SELECTOR, ".confirmation").text
    assert confirmation.startswith("Resolve as COMMITTED")
    assert effect_id in confirmation and "supplier:widget" in confirmation
    page.shot("resolve-confirmation")
    form.find_element(By.CSS_SELECTOR, "button.confirm").click()
    # The result is shown before the refresh it starts has answered: wait for both.
    page.until(lambda d: "the effect is now COMMITTED" in page.text("#outstanding"))
    page.until(lambda d: "Nothing in doubt" in page.text("#outstanding"))
    assert browser.title == "fenceproxy status"
    page.shot("resolved")

    # The proxy and the upstream's own records agree.
    assert stack.lease("supplier:widget")["blocked"] is False
    settled = stack.effect(effect_id)
    assert settled["state"] == "COMMITTED", settled
    assert settled["events"][-1]["actor"] == "operator:alice", settled
    assert stack.upstream_orders() == 1


# A probe that never concludes (the upstream's 200 is neither outcome): the effect stays
# in doubt while the page is driven, and its route has a probe.
INCONCLUSIVE_PROBE = ReconcileBlock(
    settle_s=60.0, attempts=50, committed=("201",), not_committed=("410",)
)


@pytest.mark.fence_stack(reconcile=INCONCLUSIVE_PROBE)
def test_resolve_opened_while_the_probe_form_is_open_replaces_it(
    browser: WebDriver, stack: Stack
) -> None:
    page = Page(browser, stack)
    page.open_logged_in()
    effect_id = _lose_an_answer(stack)
    page.until(lambda d: d.title.startswith("(1 in doubt, 1 blocked)"))
    # Its route has a probe: offered, and the card shows the probe schedule.
    page.act(effect_id, "probe", "alice", "paged at 3am")
    assert "probes:" in _card(page, effect_id).find_element(By.CSS_SELECTOR, ".probes").text
    _card(page, effect_id).find_element(By.CSS_SELECTOR, "button.resolve").click()
    page.until(lambda d: _card(page, effect_id).find_elements(By.CSS_SELECTOR, "form.resolve"))
    card = _card(page, effect_id)
    assert card.find_elements(By.CSS_SELECTOR, "form.probe") == []
    assert card.find_elements(By.CSS_SELECTOR, "form.action") == [
        card.find_element(By.CSS_SELECTOR, "form.resolve")
    ]
    # And back: the probe form replaces the resolve form.
    card.find_element(By.CSS_SELECTOR, "button.probe").click()
    page.until(lambda d: _card(page, effect_id).find_elements(By.CSS_SELECTOR, "form.probe"))
    assert _card(page, effect_id).find_elements(By.CSS_SELECTOR, "form.resolve") == []


def test_a_refused_action_shows_the_problem_detail_and_refreshes_wait_for_the_form(
    browser: WebDriver, stack: Stack
) -> None:
    page = Page(browser, stack)
    page.open_logged_in()
    effect_id = _lose_an_answer(stack)
    page.reload()
    form = page.act(effect_id, "resolve", "bob", "looks committed")
    Select(form.find_element(By.NAME, "outcome")).select_by_value("not_committed")
    form.find_element(By.CSS_SELECTOR, "button.review").click()

    # Someone else settles it meanwhile; the open form is not refreshed away.
    answer = http_call(
        stack.proxy_url,
        "POST",
        f"/_fence/v1/effects/{effect_id}/resolve",
        json_body={"outcome": "committed", "reason": "from the CLI", "operator": "carol"},
        headers=stack.admin_headers(),
    )
    assert answer.status == 200, answer
    page.until(
        lambda d: (
            int(d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes-paused") or 0)
            >= 1
        )
    )
    assert _card(page, effect_id).find_element(By.CSS_SELECTOR, "form.action").is_displayed()

    form.find_element(By.CSS_SELECTOR, "button.confirm").click()
    page.until(lambda d: "Refused:" in page.text("#outstanding .result"))
    assert "already COMMITTED" in page.text("#outstanding .result")
    page.shot("refusal-in-place")
    assert stack.effect(effect_id)["state"] == "COMMITTED"


def test_hostile_names_are_shown_as_text(browser: WebDriver, stack: Stack) -> None:
    # The proxy refuses such a holder (holder_name), so it is written into the store
    # as an older version or a hand edit could have; a refused request's path is
    # recorded as sent.
    now = time.time()
    with sqlite3.connect(stack.tmp_path / "fence.db", timeout=5.0) as db:
        db.execute(
            "INSERT INTO leases (resource, epoch, holder, token_hash, granted_at, expires_at,"
            " ended_at, end_reason, came_back_at) VALUES (?, 1, ?, 'x', ?, ?, ?, ?, ?)",
            ("rule:hostile", HOSTILE, now - 10, now - 5, now - 4, "superseded", now - 3),
        )
    refused = http_call(stack.proxy_url, "GET", "/%3Cimg%20src=x%20onerror=window.pwned=3%3E")
    assert refused.status == 404, refused

    page = Page(browser, stack)
    page.open_logged_in()
    page.until(lambda d: HOSTILE in page.text("#leases"))
    page.until(lambda d: "<img src=x onerror=window.pwned=3>" in page.text("#refusals"))
    assert "false expiry" in page.text("#leases .ended-leases")
    assert browser.execute_script("return window.pwned === undefined") is True
    assert browser.find_elements(By.CSS_SELECTOR, "#leases img, #refusals img, main script") == []
    page.shot("hostile-names")


def test_the_lease_advice_chart_marks_the_suggested_ttl(browser: WebDriver, stack: Stack) -> None:
    for turn in range(3):
        lease = stack.acquire_ok(f"rule:r{turn}", f"worker-{turn}", 5)
        released = stack.release(lease["token"])
        assert released.status == 200, released
    # One holder that outlived its lease and came back (its release of the expired
    # lease is taken, and marks it): a false expiry.
    late = stack.acquire_ok("rule:late", "worker-late", 0.5)
    stack.wait_not_live("rule:late")
    came_back = stack.release(late["token"])
    assert came_back.status == 200, came_back

    advice = http_call(
        stack.proxy_url, "GET", "/_fence/v1/lease-advice", headers=stack.admin_headers()
    )
    assert advice.status == 200, advice
    (group,) = [g for g in advice.body["groups"] if g["resource"] == "rule:*"]
    assert group["suggested_ttl_s"] is not None, group

    page = Page(browser, stack)
    page.open_logged_in()
    mark = page.until(
        lambda d: d.find_element(By.CSS_SELECTOR, '#advice svg.curve g.mark[data-mark="suggested"]')
    )
    assert float(mark.get_attribute("data-seconds")) == group["suggested_ttl_s"]
    assert page.find("#advice svg.curve path.line").get_attribute("d")
    assert "expected crash-detection delay" in page.text("#advice")
    assert "came back" in page.text("#leases .ended-leases")
    page.shot("lease-advice")
