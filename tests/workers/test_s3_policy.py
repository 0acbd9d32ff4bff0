"""The nodes' IAM policy (``gpuplan cluster config`` prints it) enforced: moto checks every request of
the real stores against a user holding exactly that policy. Every call the product makes under the
checkpoint root is allowed; an object outside the prefix is denied."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.moto_server import as_policy_user, moto_s3, moto_server
from workers.checkpoint import s3 as checkpoint_s3
from workers.checkpoint.format import Shard, Sink
from workers.checkpoint.local import open_store
from workers.checkpoint.s3 import S3Store
from workers.cluster.config import ClusterOptions
from workers.cluster.notes import iam_policy
from workers.infer.s3_outputs import S3Outputs

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def bucket(url: str) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    admin = moto_s3(url)
    admin.create_bucket(Bucket=name)
    admin.put_object(Bucket=name, Key="other-team/secret.bin", Body=b"not yours")
    return name


def _checkpoint_dir(path: Path, step: int) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "model.bin").write_bytes(bytes([step]) * 1000)
    (path / "sub" / "optim.bin").write_bytes(b"optimizer %d" % step)
    return path


def _bytes(data: bytes) -> Callable[[Sink], None]:
    def write(sink: Sink) -> None:
        sink.write(data)

    return write


def _denied(call: object) -> str:
    with pytest.raises(ClientError) as caught:
        call()  # type: ignore[operator]
    return str(caught.value.response["Error"]["Code"])


def test_every_store_call_is_allowed_under_the_generated_policy(
        url: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = f"s3://{bucket}/gpuplan"
    policy = iam_policy(ClusterOptions(checkpoint_root=root))
    monkeypatch.setattr(checkpoint_s3, "PART_BYTES", 5 * MIB)  # S3's smallest part: a shard of 6 MiB is multipart
    with as_policy_user(url, policy, monkeypatch):
        open_store(root)  # the server's start check (commands/server.py)

        store = open_store(f"{root}/jobs/j-1", keep=1)
        assert isinstance(store, S3Store)
        store.save(1, _checkpoint_dir(tmp_path / "s1", 1))
        local = _checkpoint_dir(tmp_path / "s2", 2)
        store.save(2, local, move=True)  # a node's local checkpoint moved to S3; keep=1 prunes step 1
        assert not local.exists() and [info.step for info in store.list()] == [2]

        staged = store.stage(3, "token")
        files = staged.write([Shard("big.bin", _bytes(b"x" * (6 * MIB))), Shard("small.bin", _bytes(b"y" * 10))])
        staged.commit(files, {"step": 3})
        info = store.latest(deep=True)
        assert info is not None and info.step == 3
        assert store.restore(info, tmp_path / "restored") == {"step": 3}
        assert (tmp_path / "restored" / "big.bin").stat().st_size == 6 * MIB

        outputs = S3Outputs(f"{root}/jobs/j-2", tmp_path / "node" / "outputs.jsonl")
        assert outputs.download() == 0  # no object yet: a 404, not a 403
        outputs.local.write_text('{"id": 1}\n')
        outputs.upload()
        assert outputs.download() == len('{"id": 1}\n')

        client = boto3.client("s3")
        upload = client.create_multipart_upload(Bucket=bucket, Key="gpuplan/jobs/j-1/torn.bin")["UploadId"]
        client.list_parts(Bucket=bucket, Key="gpuplan/jobs/j-1/torn.bin", UploadId=upload)
        client.abort_multipart_upload(Bucket=bucket, Key="gpuplan/jobs/j-1/torn.bin", UploadId=upload)

        assert _denied(lambda: client.get_object(Bucket=bucket, Key="other-team/secret.bin")) == "AccessDenied"
        assert _denied(lambda: client.put_object(Bucket=bucket, Key="other-team/x", Body=b"")) == "AccessDenied"
        assert _denied(lambda: client.put_object(Bucket=bucket, Key="gpuplan-other/x", Body=b"")) == "AccessDenied"


def test_the_bucket_listing_has_no_prefix_condition() -> None:
    """AWS authorizes HeadBucket (every store's first call) as s3:ListBucket, and that request carries no
    s3:prefix, so a prefix condition on the listing denies every store at its start. moto ignores
    StringLike conditions, so this rule is asserted on the policy itself."""
    policy = iam_policy(ClusterOptions(checkpoint_root="s3://bucket-one/gpuplan/team"))
    listing = [s for s in policy["Statement"] if "s3:ListBucket" in s["Action"]]
    assert listing == [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::bucket-one"}]
    assert iam_policy(ClusterOptions(checkpoint_root="/local/disk"))["Statement"] == iam_policy(ClusterOptions())[
        "Statement"] and not any("s3:" in str(s["Action"]) for s in iam_policy(ClusterOptions())["Statement"])
