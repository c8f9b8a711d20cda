"""Secrets in URLs: what specguard shows instead, and what it removes from messages."""

from __future__ import annotations

import pytest

from specguard.common.redact import scrub, secrets_of, shown


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://10.0.0.7:8000/metrics", "http://10.0.0.7:8000/metrics"),
        ("http://admin:s3cr3t@10.0.0.7:8000/metrics", "http://10.0.0.7:8000/metrics"),
        ("http://admin@h:8000/metrics", "http://h:8000/metrics"),
        ("http://h/metrics?token=abc&page=1", "http://h/metrics?token=<redacted>&page=1"),
        (
            "http://h/m?api_key=k1&X-Amz-Signature=s9&Password=p",
            "http://h/m?api_key=<redacted>&X-Amz-Signature=<redacted>&Password=<redacted>",
        ),
        ("https://u:p%40ss@h:9090/?session_id=zz", "https://h:9090/?session_id=<redacted>"),
    ],
)
def test_shown_drops_user_information_and_secret_query_values(url: str, expected: str) -> None:
    assert shown(url) == expected


def test_the_secrets_of_a_url_include_their_encoded_form() -> None:
    assert set(secrets_of("http://u:p%40ss@h/?token=a/b")) >= {"p@ss", "a/b", "a%2Fb"}
    assert secrets_of("http://h/metrics?page=1") == []


def test_scrub_removes_the_url_and_each_secret_where_it_stands_alone() -> None:
    url = "http://ad:pw-9f2e@h:8000/metrics?token=tok%2F1"
    message = (
        f"Cannot connect to host {url} [Connection refused]; "
        "server said: bad password pw-9f2e for ad, token tok/1 (tok%2F1); loading ads"
    )
    scrubbed = scrub(message, url)
    assert "pw-9f2e" not in scrubbed and "tok/1" not in scrubbed and "tok%2F1" not in scrubbed
    assert "http://h:8000/metrics?token=<redacted>" in scrubbed
    assert "for <redacted>," in scrubbed  # the user name alone is removed...
    assert scrubbed.endswith("loading ads")  # ...but not from inside another word
