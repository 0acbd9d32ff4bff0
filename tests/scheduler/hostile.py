"""Hostile inputs for every parameter and JSON field of the served API (issue 9: no 5xx, ever).

:func:`probes` walks the OpenAPI schema, so a new route or field is probed without editing this
file: each path and query parameter, each top-level body field and the job spec's fields get every
hostile text (NUL, lone surrogate, control characters, 10k characters) and every over-long number,
one at a time, with the other parts of the request valid. Bodies are raw bytes, so a lone surrogate
travels as the JSON escape ``\\ud800`` and a number as the literal itself (``1e400``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

TEXT = {
    "nul": "a\x00b",
    "lone surrogate": "\ud800",
    "low surrogate": "x\udfffy",
    "control": "a\x07\x1b[31mb",
    "newline": "a\r\nb",
    "DEL": "a\x7fb",
    "10k characters": "x" * 10_000,
}
NUMBERS = {
    "1e400": "1e400",
    "-1e400": "-1e400",
    "23 digits": "99999999999999999999999",
    "-23 digits": "-99999999999999999999999",
    "5000 digits": "1" + "0" * 5000,
    "NaN": "NaN",
    "Infinity": "Infinity",
}
# Fields of the job spec probed besides the top-level ones (a dotted path; digits index a list).
SPEC_FIELDS = ["name", "task", "model", "model.config", "train.tokens", "train.seq_len", "train.seed",
               "train.data", "train.precision", "train.checkpoint_interval_steps", "resources.accelerators.0",
               "resources.clouds.0", "resources.deadline", "resources.budget_usd", "resources.max_gpus"]
_RAW = "\x01raw-literal\x01"


@dataclass(frozen=True)
class Probe:
    method: str
    path: str  # percent-encoded
    body: bytes | None
    what: str
    must_refuse: bool  # a 2xx would be wrong (hostile text, or a number no field of that kind holds)

    def send(self, client: httpx.Client) -> httpx.Response:
        headers = {"Content-Type": "application/json"} if self.body is not None else {}
        return client.request(self.method, self.path, content=self.body, headers=headers)


def url_part(value: str) -> str:
    """Percent-encode ``value`` as a client would: UTF-8, a lone surrogate as its raw bytes (%ED%A0%80)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def raw_json(document: Any, literal: str | None = None) -> bytes:
    """``document`` as JSON bytes, with the placeholder :data:`_RAW` replaced by ``literal`` verbatim."""
    text = json.dumps(document)  # ASCII: NUL -> \\u0000, a lone surrogate -> \\ud800
    if literal is not None:
        text = text.replace(json.dumps(_RAW), literal)
    return text.encode()


def _resolve(schema: Mapping[str, Any], openapi: Mapping[str, Any]) -> Mapping[str, Any]:
    """Follow $ref and pick the object branch of anyOf (``Body | None``)."""
    while True:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[1]
            schema = openapi["components"]["schemas"][name]
        elif "anyOf" in schema:
            schema = next(s for s in schema["anyOf"] if s.get("type") != "null")
        else:
            return schema


def _kinds(schema: Mapping[str, Any], openapi: Mapping[str, Any]) -> set[str]:
    if "$ref" in schema:
        return _kinds(_resolve(schema, openapi), openapi)
    if "anyOf" in schema:
        return set().union(*(_kinds(s, openapi) for s in schema["anyOf"]))
    return {str(schema.get("type", "any"))}


def _with(document: Any, dotted: str, value: Any) -> Any:
    """A copy of ``document`` with the field at ``dotted`` set to ``value`` (parents created)."""
    head, _, rest = dotted.partition(".")
    if isinstance(document, list):
        index = int(head)
        items = list(document) + [None] * (index + 1 - len(document))
        items[index] = _with(items[index], rest, value) if rest else value
        return items
    out = dict(document) if isinstance(document, dict) else {}
    out[head] = _with(out.get(head, [] if rest.split(".")[0].isdigit() else {}), rest, value) if rest else value
    return out


def _number_refused(literal: str, kinds: set[str], *, in_url: bool) -> bool:
    """Whether a field of these kinds must refuse the number ``literal``: an integer field and the
    free-form spec refuse every one of them (each is out of any bound, past 64 bits or not finite),
    a float field the ones that are not finite or too long (it may take 1e23), a JSON text field
    any number; in a URL, a text parameter takes "1e400" as text."""
    if kinds & {"integer", "any"}:
        return True
    if kinds & {"number", "object"}:
        return literal.lstrip("-") in ("1e400", "NaN", "Infinity") or len(literal) > 100
    return not in_url


def _url(template: str, params: list[dict[str, Any]], path_values: Mapping[str, str],
         override: tuple[str, str] | None = None, query: str = "") -> str:
    """The operation's URL: valid path values, but ``override`` = (name, percent-encoded value)."""
    path = template
    for p in params:
        if p["in"] == "path":
            raw = override[1] if override and override[0] == p["name"] else url_part(path_values[p["name"]])
            path = path.replace("{" + p["name"] + "}", raw)
    return path + (f"?{query}" if query else "")


def probes(openapi: Mapping[str, Any], path_values: Mapping[str, str],
           bodies: Mapping[tuple[str, str], dict[str, Any]], spec_fields: Sequence[str] = SPEC_FIELDS
           ) -> Iterator[Probe]:
    """Every hostile value in every parameter and body field of every operation in ``openapi``.

    ``path_values`` gives a valid value for each path parameter name and ``bodies`` a valid body
    for each (METHOD, path template) that takes one; ``spec_fields`` are probed inside a job spec.
    """
    for template, item in openapi["paths"].items():
        for method, op in item.items():
            method = method.upper()
            params = op.get("parameters", [])
            body = bodies.get((method, template))
            if "requestBody" in op and body is None:
                raise KeyError(f"give a valid body for {method} {template}")
            encoded = None if body is None else raw_json(body)
            for p in params:
                if p["in"] not in ("path", "query"):
                    continue
                kinds = _kinds(p["schema"], openapi)
                values = [(k, url_part(v), True) for k, v in TEXT.items()]
                values += [(k, v, _number_refused(v, kinds, in_url=True)) for k, v in NUMBERS.items()]
                values.append(("not UTF-8", "%ED%A0%80", True))
                for name, raw, refused in values:
                    where = f"{method} {template} {p['in']} {p['name']}={name}"
                    url = (_url(template, params, path_values, (p["name"], raw)) if p["in"] == "path"
                           else _url(template, params, path_values, query=f"{p['name']}={raw}"))
                    yield Probe(method, url, encoded, where, refused)
            if body is not None:
                url = _url(template, params, path_values)
                yield from _body_probes(method, template, url, body, op, openapi, spec_fields)


def _body_probes(method: str, template: str, path: str, body: dict[str, Any], op: Mapping[str, Any],
                 openapi: Mapping[str, Any], spec_fields: Sequence[str]) -> Iterator[Probe]:
    schema = _resolve(op["requestBody"]["content"]["application/json"]["schema"], openapi)
    fields = {name: _kinds(s, openapi) for name, s in schema.get("properties", {}).items()}
    if "spec" in fields:
        fields.update({f"spec.{f}": {"any"} for f in spec_fields})
    for field, kinds in fields.items():
        for name, text in TEXT.items():
            yield Probe(method, path, raw_json(_with(body, field, text)), f"{method} {template} body {field}={name}",
                        True)
        for name, literal in NUMBERS.items():
            yield Probe(method, path, raw_json(_with(body, field, _RAW), literal),
                        f"{method} {template} body {field}={name}", _number_refused(literal, kinds, in_url=False))
    for where in ("", "spec.") if "spec" in fields else ("",):
        for name, text in TEXT.items():
            parent = body.get("spec", {}) if where else body
            keyed = {**parent, text: 1}
            document = {**body, "spec": keyed} if where else keyed
            yield Probe(method, path, raw_json(document), f"{method} {template} body {where}<key {name}>", True)
    for raw in (b'{"\xed\xa0\x80": 1}', b'{"x": "\xff"}'):  # a surrogate's bytes; a byte UTF-8 never has
        yield Probe(method, path, raw, f"{method} {template} body not UTF-8 {raw!r}", True)


@dataclass
class Outcome:
    sent: int
    problems: list[str]  # 5xx, no answer, a hostile value taken, an error out of the one format


def check(base_url: str, openapi: Mapping[str, Any], *, token: str, admin_token: str,
          path_values: Mapping[str, str], bodies: Mapping[tuple[str, str], dict[str, Any]],
          spec_fields: Sequence[str] = SPEC_FIELDS) -> Outcome:
    """Send every probe (team routes and /metrics with the admin token) and collect what went wrong."""
    outcome = Outcome(0, [])
    clients = {who: httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {secret}"}, timeout=60)
               for who, secret in (("team", token), ("admin", admin_token))}
    try:
        for probe in probes(openapi, path_values, bodies, spec_fields):
            client = clients["admin" if probe.path.startswith(("/v1/teams", "/metrics")) else "team"]
            outcome.sent += 1
            try:
                response = probe.send(client)
            except httpx.TransportError as exc:
                outcome.problems.append(f"{probe.what}: no answer ({exc!r})")
                continue
            problem = _problem(probe, response)
            if problem:
                outcome.problems.append(f"{probe.what}: {problem}")
    finally:
        for client in clients.values():
            client.close()
    return outcome


def _problem(probe: Probe, response: httpx.Response) -> str | None:
    status = response.status_code
    if status >= 500 or (probe.must_refuse and status < 400):
        return f"HTTP {status} {response.text[:300]}"
    if status < 400:
        return None
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    if set(body) != {"error"} or not isinstance(error, dict) or not set(error) <= {"code", "message", "path"}:
        return f"not the one error format: {response.text[:300]}"
    message = error.get("message")
    if not isinstance(message, str) or not message or len(message) > 1000 or message != message.strip():
        return f"no clear message: {response.text[:300]}"
    if any(ch < " " or "\ud800" <= ch <= "\udfff" for ch in message):
        return f"the message carries a raw control character or surrogate: {message!r}"
    return None
