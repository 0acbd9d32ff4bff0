"""botocore's failures as gpuplan errors: what the commands that ask the AWS account print as one line.

botocore raises its own exceptions (no credentials, an unreachable endpoint, a ClientError with AWS's
code), which would reach the user as a traceback. ``aws_errors`` turns each into the error tree's
class with what to do: missing or rejected credentials exit 8, an unreachable endpoint 9, anything
else AWS refused is an ExternalServiceError naming the call and AWS's code. Errors that are not
botocore's (gpuplan's own, or a bug) pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from errors import CloudCredentialsMissing, CloudUnreachable, ExternalServiceError, GpuplanError

CREDENTIALS_HINT = ("set AWS_PROFILE (aws configure / aws sso login), or AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, or run on an instance with a role")
# ClientError codes that mean the credentials themselves are wrong, not that they lack a permission
REJECTED = {"InvalidClientTokenId", "UnrecognizedClientException", "AuthFailure", "SignatureDoesNotMatch",
            "InvalidAccessKeyId", "ExpiredToken", "ExpiredTokenException", "RequestExpired", "InvalidToken"}
DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "Forbidden", "403"}


def error_code(exc: BaseException) -> str:
    """AWS's error code of a ClientError ("" for anything else)."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def translate(exc: BaseException, what: str = "AWS") -> GpuplanError | None:
    """The gpuplan error for a botocore failure of ``what`` (a call or service); None if not botocore's."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        ProfileNotFound,
        TokenRetrievalError,
    )

    if isinstance(exc, NoCredentialsError | PartialCredentialsError | TokenRetrievalError):
        return CloudCredentialsMissing(f"no AWS credentials for {what} ({exc})", hint=CREDENTIALS_HINT)
    if isinstance(exc, ProfileNotFound):
        return CloudCredentialsMissing(f"{exc}", hint="fix AWS_PROFILE, or add the profile with aws configure")
    if isinstance(exc, NoRegionError):
        return CloudCredentialsMissing(f"no AWS region for {what}", hint="set AWS_REGION (or AWS_DEFAULT_REGION)")
    if isinstance(exc, EndpointConnectionError | ConnectionError):
        return CloudUnreachable(f"cannot reach AWS for {what}: {exc}",
                                hint="check the network (and AWS_ENDPOINT_URL, if set)")
    if isinstance(exc, ClientError):
        code, message = error_code(exc), exc.response.get("Error", {}).get("Message", "") or str(exc)
        if code in REJECTED:
            return CloudCredentialsMissing(f"AWS rejected the credentials for {what} ({code}: {message})",
                                           hint=CREDENTIALS_HINT)
        if code in DENIED:
            return ExternalServiceError(f"AWS denied {what} to these credentials ({code}: {message})",
                                        hint="use credentials whose policy allows it")
        return ExternalServiceError(f"AWS refused {what} ({code}: {message})")
    if isinstance(exc, BotoCoreError):
        return ExternalServiceError(f"AWS call for {what} failed: {exc}")
    return None


@contextmanager
def aws_errors(what: str = "AWS") -> Iterator[None]:
    """Run a block of AWS calls; a botocore failure leaves it as the gpuplan error for it."""
    try:
        yield
    except GpuplanError:
        raise
    except Exception as exc:
        mapped = translate(exc, what)
        if mapped is None:
            raise
        raise mapped from exc
