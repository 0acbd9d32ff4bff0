"""The CLI tests' fixtures: `catalog refresh` runs against the catalog tests' moto EC2 and price-list server;
the in-process commands run on the scheduler tests' databases (SQLite and PostgreSQL)."""

from tests.catalog.conftest import fake_aws_credentials, moto_endpoint, price_server
from tests.scheduler.conftest import db_url

__all__ = ["db_url", "fake_aws_credentials", "moto_endpoint", "price_server"]
