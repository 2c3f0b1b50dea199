"""The console's files as the HTTP server serves them: from the package, with headers that keep the page to its
own origin, never a file outside the console's folder, and not at all when `http.console` is off."""

from __future__ import annotations

import re

from starlette.applications import Starlette
from starlette.testclient import TestClient

from orchestrator.api.rest_http import CONSOLE_FILES, rest_routes


def served(console: bool) -> TestClient:
    # the console's files need neither the gateway nor the service: the API routes are not called here
    return TestClient(Starlette(routes=rest_routes(gateway=None, service=None, console=console)))


def test_the_console_is_served_with_its_own_origin_policy():
    with served(console=True) as http:
        page = http.get("/console/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.text == (CONSOLE_FILES / "index.html").read_text()
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert page.headers["x-content-type-options"] == "nosniff"
        assert '<script type="module" src="console.js">' in page.text  # the entry; it imports the other modules
        scripts = sorted(path.name for path in CONSOLE_FILES.glob("*.js"))
        assert len(scripts) > 1
        for asset, kind in [*((name, "javascript") for name in scripts), ("console.css", "text/css")]:
            response = http.get(f"/console/{asset}")
            assert response.status_code == 200 and kind in response.headers["content-type"]
        assert http.get("/", follow_redirects=False).headers["location"] == "/console/"
        assert http.get("/console/../rest_http.py").status_code == 404
        assert http.get("/console/%2e%2e/rest_http.py").status_code == 404


def test_the_console_is_not_served_when_switched_off():
    with served(console=False) as http:
        assert http.get("/console/").status_code == 404
        assert http.get("/", follow_redirects=False).status_code == 404


def test_the_page_loads_only_its_own_files_and_runs_no_inline_script():
    page = (CONSOLE_FILES / "index.html").read_text()
    linked = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert linked and all(not re.match(r"^([a-z]+:|//)", url) for url in linked if not url.startswith("#")), linked
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, flags=re.S)
    assert scripts and all('src="' in attributes and not body.strip() for attributes, body in scripts)  # the policy forbids inline code
