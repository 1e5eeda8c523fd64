"""A night's batch page at scale: its children counted by status, listed a hundred a page, and
counted live from the server while a page of them is shown. One test drives headless Chromium."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import select, update

from models import Run, RunStatus
from pipeline.db import transaction
from pipeline.runs.schedules import fire
from pipeline.slots import Missed, Overlap, Schedule
from tests.integration.api_fixtures import client, live_server, make_app, person_token
from tests.integration.test_status_page import (
    CHROMIUM,
    CHROMIUM_ARGS,
    _need,
    sign_in,
    sync_playwright,
)
from tests.support import wait_for

CHILDREN = 130
ROW = re.compile(r'<tr data-run="([0-9a-f-]{36})"')


def a_night(children: int = CHILDREN) -> str:
    """A batch fired through the schedule path; no worker runs it, so its children stay
    running until a test says otherwise."""
    night = Schedule(
        name="bench-night", agent="bench", minute="*", params={"children": children, "steps": 1},
        missed=Missed.SKIP, overlap=Overlap.ALLOW,
    )  # fmt: skip
    batch_id = fire(night.name, now=datetime.now(UTC), schedules=[night]).batch_id
    assert batch_id is not None
    return batch_id


def end_children(batch_id: str, count: int, status: RunStatus) -> None:
    with transaction() as session:
        running = select(Run.id).where(Run.batch_id == batch_id, Run.status == RunStatus.RUNNING)
        chosen = list(session.scalars(running.order_by(Run.id).limit(count)))
        session.execute(update(Run).where(Run.id.in_(chosen)).values(status=status))


def test_a_big_batch_page_counts_children_by_status_and_lists_a_hundred_a_page(
    db_url: str,
) -> None:
    # given a night of 130 children, 5 of which failed
    batch_id = a_night()
    end_children(batch_id, 5, RunStatus.FAILED)
    page_client = client()
    sign_in(page_client)
    path = f"/ui/batches/{quote(batch_id, safe='')}"

    # when its page is opened
    first = page_client.get(path).text
    # then it counts every child by status, and lists the first hundred
    assert "5/130" in first
    assert '<span class="n-running">125</span>' in first
    assert '<span class="n-failed">5</span>' in first
    assert len(ROW.findall(first)) == 100
    assert "children 1-100 of 130" in first and 'href="?page=2"' in first

    # and the second page lists the other thirty, with a way back
    second = page_client.get(f"{path}?page=2").text
    assert len(ROW.findall(second)) == 30
    assert "children 101-130 of 130" in second and 'href="?page=1"' in second
    with transaction() as session:
        every = {str(i) for i in session.scalars(select(Run.id).where(Run.batch_id == batch_id))}
    assert set(ROW.findall(first)) | set(ROW.findall(second)) == every

    # and what its counts follow is the batch's progress, for a signed-in page only
    progress = page_client.get(f"{path}/progress").json()["children"]
    assert (progress["running"], progress["failed"], progress["total"]) == (125, 5, CHILDREN)
    assert client().get(f"{path}/progress").status_code == 401


def test_an_open_batch_page_counts_the_children_it_does_not_list(db_url: str) -> None:
    _need(sync_playwright is not None, "the playwright package")
    _need(Path(CHROMIUM).exists(), CHROMIUM)
    assert sync_playwright is not None

    # given a night of 130 children, all running
    batch_id = a_night()

    with live_server(make_app()) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{base}/ui/login")
            page.fill("input[name=token]", person_token("ops@example.com"))
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/ui")
            # when someone opens its page, which lists a hundred of them
            page.goto(f"{base}/ui/batches/{quote(batch_id, safe='')}")
            page.wait_for_selector("body[data-live=on]", state="attached")
            assert page.locator("table.runs tr[data-run]").count() == 100
            counts = page.locator("#batch-children .count")
            assert counts.inner_text() == "0/130"

            # and 110 children finish, most of them not on the page
            end_children(batch_id, 110, RunStatus.SUCCEEDED)

            # then the page counts all of them, without a reload
            wait_for(lambda: counts.inner_text() == "110/130", timeout=20,
                     what="the page to count the finished children")  # fmt: skip
            assert page.locator("#batch-children .n-done").inner_text() == "110"
            assert page.locator("#batch-children .n-running").inner_text() == "20"
        finally:
            browser.close()


def test_a_batch_page_labels_each_child_by_its_item(db_url: str) -> None:
    # given a night of three children, one ticket each (the batch's id and a step count alike)
    batch_id = a_night(3)
    with transaction() as session:
        children = list(session.scalars(select(Run.id).where(Run.batch_id == batch_id)))
        for number, run_id in enumerate(children):
            item = {"ticket": f"T-{number}", "steps": 1, "batch": batch_id}
            session.execute(update(Run).where(Run.id == run_id).values(input=item))
    page_client = client()
    sign_in(page_client)
    # when its page is opened
    page = page_client.get(f"/ui/batches/{quote(batch_id, safe='')}").text
    # then each child's row names its ticket, and not what every child shares
    labels = re.findall(r'<td class="run-item">([^<]*)</td>', page)
    assert sorted(labels) == ["ticket=T-0", "ticket=T-1", "ticket=T-2"], labels
    for number, run_id in enumerate(children):
        row = page.split(f'data-run="{run_id}"', 1)[1].split("</tr>", 1)[0]
        assert f"ticket=T-{number}" in row
