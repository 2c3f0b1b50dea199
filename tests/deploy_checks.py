"""The metric names the checked-in dashboard and alert rules query (deploy/grafana, deploy/prometheus), read
from their PromQL: what the deploy tests check against the registry and a running server's /metrics."""

from __future__ import annotations

import json
import re

import yaml

from tests.conftest import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "thinkserve.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
_HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return found + [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def metric_names(expression: str) -> set[str]:
    """The metric names of one PromQL expression: label matchers, groupings, range selectors and strings left
    out, then every identifier that is not a function call or a keyword."""
    text = re.sub(r'"[^"]*"', "", expression)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end():].lstrip()[:1]
        if match.group(0) not in _KEYWORDS and following != "(":
            names.add(match.group(0))
    return names


def families(names: set[str]) -> set[str]:
    """A histogram's series (_bucket, _sum, _count) named by their family."""
    return {_HISTOGRAM_SERIES.sub("", name) for name in names}


def served_by_triton(name: str) -> bool:
    """Triton's own metrics (its metrics port, and the orchestrator's /metrics/triton) are named nv_*."""
    return name.startswith("nv_")


def queried_families() -> tuple[set[str], set[str]]:
    """(ThinkServe's, Triton's): the families the dashboard and the alert rules query, by who serves them."""
    queried = families(set().union(*(metric_names(expression) for expression in expressions())))
    triton = {name for name in queried if served_by_triton(name)}
    return queried - triton, triton
