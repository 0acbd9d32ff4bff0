"""The CLI tests' fixtures: `catalog refresh` runs against the catalog tests' moto EC2 and price-list server."""

from tests.catalog.conftest import fake_aws_credentials, moto_endpoint, price_server

__all__ = ["fake_aws_credentials", "moto_endpoint", "price_server"]
