"""The read model's listings page in id order: every row once, whatever the page size or filter."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

from bb_environments.projections.read_model import Applied, ReadModel
from bb_environments.projections.views import EnvironmentView, HooksView, ThreadView

ENVIRONMENTS = 3000
STATUSES = ("ready", "ready", "error", "removed")


def environment(environment_id: str, status: str) -> EnvironmentView:
    now = datetime.now(UTC)
    return EnvironmentView(
        id=environment_id,
        status=status,
        status_message=None,
        provider_id="personal-workspace",
        host_id="local",
        project_path=None,
        path=f"/w/{environment_id}",
        owns_path=True,
        path_key=environment_id,
        inputs=None,
        thread_ids=[],
        merge_base_branch=None,
        hooks=HooksView(),
        created_at=now,
        updated_at=now,
        version=1,
    )


async def no_gaps(after: int, upto: int) -> list:
    raise AssertionError(f"the batches are consecutive; nothing between {after} and {upto} is missing")


async def read_model_with(tmp_path, views: list) -> ReadModel:
    model = await ReadModel.open(tmp_path / "read-models.sqlite")
    await model.apply([Applied(n, n, view) for n, view in enumerate(views, start=1)], no_gaps)
    return model


async def pages_of(list_page, limit: int) -> list[list[str]]:
    pages, after = [], None
    while page := await list_page(after, limit):
        pages.append([item.id for item in page])
        after = page[-1].id
    return pages


async def test_environment_pages_cover_every_row_once_in_id_order(tmp_path):
    rng = random.Random(7)
    views = [environment(str(uuid.UUID(int=rng.getrandbits(128))), rng.choice(STATUSES)) for _ in range(ENVIRONMENTS)]
    # An environment changed later moves to the end of the table, never within the listing's order.
    views += [environment(views[i].id, "ready") for i in range(0, ENVIRONMENTS, 100)]
    model = await read_model_with(tmp_path, views)
    try:
        latest = {view.id: view.status for view in views}
        not_removed = sorted(i for i, status in latest.items() if status != "removed")

        async def listed(after, limit):
            return await model.environments(include_removed=False, after=after, limit=limit)

        pages = await pages_of(listed, 200)
        assert [i for page in pages for i in page] == not_removed
        assert all(len(page) == 200 for page in pages[:-1])

        async def errors(after, limit):
            return await model.environments(status="error", after=after, limit=limit)

        assert [i for page in await pages_of(errors, 37) for i in page] == sorted(
            i for i, status in latest.items() if status == "error"
        )
        everything = await model.environments(include_removed=True, after=not_removed[-2], limit=10)
        assert [e.id for e in everything] == sorted(i for i in latest if i > not_removed[-2])[:10]
    finally:
        await model.close()


async def test_thread_pages_follow_ids_and_the_environment_asked_for(tmp_path):
    environments = [str(uuid.UUID(int=n)) for n in range(1, 6)]
    threads = [
        ThreadView(id=f"t-{n:05d}", environment_id=environments[n % 5], status="active", parent_thread_id=None)
        for n in range(2500)
    ]
    random.Random(3).shuffle(threads)
    model = await read_model_with(tmp_path, threads)
    try:

        async def listed(after, limit):
            return await model.threads(after=after, limit=limit)

        assert [i for page in await pages_of(listed, 300) for i in page] == sorted(t.id for t in threads)

        async def of_one(after, limit):
            return await model.threads(environments[2], after=after, limit=limit)

        assert [i for page in await pages_of(of_one, 64) for i in page] == sorted(
            t.id for t in threads if t.environment_id == environments[2]
        )
    finally:
        await model.close()
