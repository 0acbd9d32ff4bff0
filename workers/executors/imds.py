"""Cloud instance-metadata clients that read a spot/preemption notice.

AWS (IMDSv2): ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` returns a session
token; ``GET /latest/meta-data/spot/instance-action`` with ``X-aws-ec2-metadata-token`` answers 404
until AWS decides to interrupt the instance, then ``{"action": "terminate", "time": "...Z"}``
(about two minutes ahead). Before it, ``GET /latest/meta-data/events/recommendations/rebalance`` answers
404 until AWS sees the instance at an elevated risk of interruption, then ``{"noticeTime": "...Z"}``: an
early notice with no deadline (it may never be followed by an interruption).
GCP: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google`` answers ``FALSE``
or ``TRUE`` (about 30 s ahead).

Each source's ``check()`` returns a :class:`SpotNotice` or None, and raises
:class:`MetadataUnavailable` when the service cannot be reached or answers nonsense, so the caller
decides how to keep polling.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import httpx

from errors import InvalidInput

logger = logging.getLogger(__name__)

DEFAULT_METADATA_URL = "http://169.254.169.254"
AWS_NOTICE_LEAD_S = 120.0  # AWS's documented warning time, used when the notice's time is unreadable
GCP_NOTICE_LEAD_S = 30.0  # GCP's documented preemption warning
# The provisional deadline of a rebalance recommendation, which has none: far enough that a run trains on
# (its checkpoint now, not a just-in-time one), while the interruption notice, if one follows, brings the
# real deadline (the watcher drains again; Ray Train takes the earlier one).
EARLY_NOTICE_HORIZON_S = 6 * 3600.0
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TOKEN_TTL_S = 21600  # IMDSv2 maximum

Clock = Callable[[], float]


class MetadataUnavailable(Exception):
    """The metadata service could not be reached or answered unexpectedly (the watcher retries)."""


@dataclass(frozen=True)
class SpotNotice:
    provider: str  # "aws" | "gcp"
    action: str  # aws: terminate | stop | hibernate; gcp: preempted
    deadline: float  # unix seconds at which the instance goes away (early: a provisional one)
    raw: str
    early: bool = False  # a rebalance recommendation: checkpoint now, keep running, watch for the notice


class NoticeSource(Protocol):
    provider: str

    def check(self) -> SpotNotice | None: ...


def parse_aws_time(text: str) -> float:
    """``2026-11-30T11:22:00Z`` -> unix seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class _MetadataClient:
    """HTTP to a cloud metadata service: connection failures become MetadataUnavailable."""

    def __init__(
        self,
        base_url: str = DEFAULT_METADATA_URL,
        *,
        clock: Clock = time.time,
        timeout_s: float = 1.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._clock = clock
        self._http = client or httpx.Client(timeout=timeout_s)

    def _request(self, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
        try:
            return self._http.request(method, self.base_url + path, headers=headers)
        except httpx.HTTPError as exc:
            raise MetadataUnavailable(f"{self.base_url}{path}: {type(exc).__name__}: {exc}") from exc


class AwsImdsSource(_MetadataClient):
    provider = "aws"
    # no token until the first check; instance attributes once fetched
    _token: str | None = None
    _token_expires: float = 0.0

    def _get_token(self) -> str:
        if self._token is None or self._clock() >= self._token_expires:
            resp = self._request(
                "PUT",
                "/latest/api/token",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            if resp.status_code != 200 or not resp.text:
                raise MetadataUnavailable(f"IMDSv2 token request answered HTTP {resp.status_code}")
            self._token = resp.text.strip()
            self._token_expires = self._clock() + TOKEN_TTL_S - 60
        return self._token

    def check(self) -> SpotNotice | None:
        """The interruption notice; else the rebalance recommendation (an early notice); else None."""
        found = self._get("/latest/meta-data/spot/instance-action")
        if found is not None:
            return self._parse(found)
        found = self._get(REBALANCE_PATH)
        return None if found is None else self._parse_rebalance(found)

    def _get(self, path: str) -> str | None:
        """The body at ``path``; None on 404 (nothing issued)."""
        resp = self._request("GET", path, headers={"X-aws-ec2-metadata-token": self._get_token()})
        if resp.status_code == 401:  # token expired or revoked: fetch a new one once
            self._token = None
            resp = self._request("GET", path, headers={"X-aws-ec2-metadata-token": self._get_token()})
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise MetadataUnavailable(f"{self.base_url}{path} answered HTTP {resp.status_code}")
        return resp.text

    def _parse_rebalance(self, text: str) -> SpotNotice:
        try:
            issued = parse_aws_time(str(json.loads(text)["noticeTime"]))
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("unreadable rebalance recommendation %r (%s); taking it as issued now", text, exc)
            issued = self._clock()
        return SpotNotice("aws", "rebalance", issued + EARLY_NOTICE_HORIZON_S, text, early=True)

    def _parse(self, text: str) -> SpotNotice:
        # A 200 here means an interruption is scheduled; an unreadable body still gets the node drained.
        try:
            body = json.loads(text)
            return SpotNotice("aws", str(body["action"]), parse_aws_time(str(body["time"])), text)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("unreadable spot notice %r (%s); assuming %.0f s of warning", text, exc, AWS_NOTICE_LEAD_S)
            return SpotNotice("aws", "terminate", self._clock() + AWS_NOTICE_LEAD_S, text)


class GcpMetadataSource(_MetadataClient):
    provider = "gcp"

    def check(self) -> SpotNotice | None:
        path = "/computeMetadata/v1/instance/preempted"
        url = self.base_url + path
        resp = self._request("GET", path, headers={"Metadata-Flavor": "Google"})
        if resp.status_code != 200:
            raise MetadataUnavailable(f"{url} answered HTTP {resp.status_code}")
        value = resp.text.strip().upper()
        if value == "FALSE":
            return None
        if value == "TRUE":
            return SpotNotice("gcp", "preempted", self._clock() + GCP_NOTICE_LEAD_S, resp.text)
        raise MetadataUnavailable(f"{url} answered {resp.text!r}, expected TRUE or FALSE")


def make_source(provider: str, base_url: str = DEFAULT_METADATA_URL, *, clock: Clock = time.time) -> NoticeSource:
    if provider == "aws":
        return AwsImdsSource(base_url, clock=clock)
    if provider == "gcp":
        return GcpMetadataSource(base_url, clock=clock)
    raise InvalidInput(f"unknown metadata provider {provider!r}", hint="use aws or gcp")
