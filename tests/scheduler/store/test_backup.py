"""The head's SQLite database backed up to S3 and restored on a new head (scheduler.store.backup), on moto's
S3: what ``ray down`` then ``ray up`` of a cluster without PostgreSQL must keep — teams, jobs and spend."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from errors import InvalidInput
from scheduler.loop.scheduling import Scheduler
from scheduler.service import ADMIN, SchedulerService
from scheduler.store import backup
from scheduler.store.database import Store
from scheduler.store.models import JobCreate, TeamCreate
from tests.moto_server import moto_s3, moto_server
from tests.scheduler.conftest import spec_dict, toy_plan
from tests.scheduler.fakes import FakeClock, ScriptedExecutor
from workers.executors.protocol import RunState

BUCKET = "gpuplan-backup-test"
URI = f"s3://{BUCKET}/runs/{backup.BACKUP_NAME}"


@pytest.fixture
def s3() -> Iterator[Any]:
    import urllib.request

    with moto_server() as url:
        # moto keeps its state per process, across servers: an earlier test's objects are reset
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=30).close()
        client = moto_s3(url)
        client.create_bucket(Bucket=BUCKET)
        yield client


def _head(db: Path, tmp_path: Path, clock: FakeClock) -> tuple[Store, SchedulerService]:
    store = Store(f"sqlite:///{db}")
    store.migrate()
    return store, SchedulerService(store, toy_plan, clock=clock, checkpoint_root=str(tmp_path / "ckpt"),
                                   admin_token="admin")


def test_a_new_head_restores_teams_jobs_and_spend_from_the_backup(s3: Any, tmp_path: Path) -> None:
    clock = FakeClock()
    db = tmp_path / "head1" / "gpuplan.db"
    db.parent.mkdir()
    store, svc = _head(db, tmp_path, clock)
    svc.create_team(ADMIN, TeamCreate(name="ml", budget_usd=500.0))
    token = svc.create_token(ADMIN, "ml").token
    ml = svc.authenticate(token)
    job = svc.submit(ml, JobCreate(spec=spec_dict(name="sft")))
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock)
    loop.tick()
    clock.advance(hours=1)
    ex.finish(ex.handle_of(job.id), RunState.SUCCEEDED)
    loop.tick()
    spent = svc.get_team(ADMIN, "ml").spent_usd
    assert spent > 0
    # the server keeps running (and its connections open) while the backup is taken
    assert backup.backup(db, URI, s3) is True
    store.dispose()
    shutil.rmtree(db.parent)  # ray down: the head and its disk are gone

    new = tmp_path / "head2" / "gpuplan.db"
    assert backup.restore(new, URI, s3) is True
    store2, svc2 = _head(new, tmp_path, clock)
    assert [t.name for t in svc2.list_teams(ADMIN)] == ["ml"]
    assert svc2.get_team(ADMIN, "ml").spent_usd == pytest.approx(spent)
    assert svc2.status(svc2.authenticate(token), job.id).state == "succeeded"  # the team's token works too
    store2.dispose()


def test_restore_keeps_a_newer_local_file_and_a_new_cluster_restores_nothing(s3: Any, tmp_path: Path) -> None:
    db = tmp_path / "gpuplan.db"
    assert backup.restore(db, URI, s3) is False and not db.exists()  # no backup yet: a new cluster
    assert backup.backup(db, URI, s3) is False  # nothing to upload before a database exists
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET)
    store = Store(f"sqlite:///{db}")
    store.migrate()
    store.dispose()
    assert backup.backup(db, URI, s3) is True
    before = db.read_bytes()
    assert backup.restore(db, URI, s3) is False and db.read_bytes() == before  # a restarted head: its own file
    with pytest.raises(InvalidInput, match="not on S3"):
        backup.restore(db, "/tmp/x.db", s3)


def test_a_damaged_backup_is_refused_not_served(s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"runs/{backup.BACKUP_NAME}", Body=b"SQLite format 3\x00" + b"\x01" * 4000)
    db = tmp_path / "gpuplan.db"
    with pytest.raises(Exception):  # noqa: B017 - sqlite3 says "file is not a database" or the check fails
        backup.restore(db, URI, s3)
    assert not db.exists()


def test_the_loop_uploads_until_stopped(s3: Any, tmp_path: Path) -> None:
    db = tmp_path / "gpuplan.db"
    store = Store(f"sqlite:///{db}")
    store.migrate()
    stop = threading.Event()
    uploads: list[str] = []

    class Counting:
        def upload_file(self, path: str, bucket: str, key: str) -> None:
            s3.upload_file(path, bucket, key)
            uploads.append(key)
            if len(uploads) == 2:
                stop.set()

    backup.backup_loop(db, URI, 0.01, stop, Counting())
    store.dispose()
    assert uploads == [f"runs/{backup.BACKUP_NAME}"] * 2
