"""Property-based API testing from the gateway's own OpenAPI document (bounded examples).

schemathesis generates requests for every documented operation, JSON and multipart bodies included,
sends them to the real gateway (real Triton behind it) and runs its checks on each answer: no 5xx;
status codes, content types, headers and bodies as documented; invalid data rejected.
(schemathesis' pytest fixture loader does not run under pytest 9, so the operations are driven
through their hypothesis strategies directly.)
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

EXAMPLES_PER_OPERATION = 25
#: The one check left out: "schema-valid data must be accepted" cannot hold for an image API. A
#: JSON schema can say "a base64 string" but not "the base64 of a decodable JPEG", so a valid
#: request with an undecodable image is rightly a 422 naming the item.
EXCLUDED = [positive_data_acceptance]


def conform(url: str, key: str | None = None) -> tuple[list[str], set[str], set[int]]:
    """Every operation of the gateway at ``url``, ``EXAMPLES_PER_OPERATION`` cases each, every
    check but the one excluded; with ``key``, cases carry it and schemathesis' ``ignored_auth``
    check re-sends them without a key and with a wrong one, expecting a refusal."""
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    schema = schemathesis.openapi.from_url(f"{url}/docs/openapi.json", headers=auth)
    tested = []
    media_types: set[str] = set()
    statuses: set[int] = set()
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def check(case) -> None:
            if auth:
                case.headers = {**(case.headers or {}), **auth}
            response = case.call(timeout=60)
            if case.media_type:
                media_types.add(case.media_type)
            statuses.add(response.status_code)
            case.validate_response(response, excluded_checks=EXCLUDED)

        check()
        tested.append(f"{operation.method.upper()} {operation.path}")
    print(f"\nschemathesis: {tested}, bodies {sorted(media_types)}, statuses {sorted(statuses)}")
    return tested, media_types, statuses


EXPECTED = {"POST /v1/embeddings", "GET /v1/models", "GET /healthz", "GET /readyz", "GET /metrics",
            "GET /metrics/triton"}  # fmt: skip


def test_every_documented_operation_conforms(gateway) -> None:
    tested, media_types, statuses = conform(gateway.url)
    assert set(tested) >= EXPECTED
    assert {"application/json", "multipart/form-data"} <= media_types  # both bodies exercised
    assert max(statuses) < 500


def test_every_operation_conforms_with_keys_and_enforces_them(triton, start_gateway) -> None:
    """With API keys, the document declares bearer auth on every route but the probes, and
    ``ignored_auth`` proves each such route refuses a request without the key or a wrong one."""
    import httpx

    keyed = start_gateway(
        triton.grpc_url,
        GATEWAY_API_KEYS='["conformance-key"]',
        GATEWAY_TRITON_METRICS_URL=triton.metrics_url,
    )
    bearer = {"Authorization": "Bearer conformance-key"}
    document = httpx.get(f"{keyed.url}/docs/openapi.json", headers=bearer, timeout=30).json()
    assert document["security"] == [{"bearer": []}]
    tested, _, statuses = conform(keyed.url, "conformance-key")
    assert set(tested) >= EXPECTED
    assert 200 in statuses and max(statuses) < 500
    for path in ("/v1/models", "/metrics", "/metrics/triton", "/docs/openapi.json"):
        assert httpx.get(f"{keyed.url}{path}", timeout=30).status_code == 401
    for path in ("/healthz", "/readyz"):  # the probes stay open
        assert httpx.get(f"{keyed.url}{path}", timeout=30).status_code == 200
