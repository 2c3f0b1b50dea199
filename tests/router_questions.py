"""Labelled questions for the router's training tests: three templates, one per route, with varied names."""

from __future__ import annotations

import random

SUBJECTS = ("revenue", "net income", "headcount", "operating margin", "cash position", "research spending", "market share", "dividend")
COMPANIES = ("Northwind", "Contoso", "Fabrikam", "Tailspin", "Litware", "Adatum")
YEARS = ("2019", "2020", "2021", "2022", "2023", "2024")


def labelled_questions(per_route: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)

    def simple() -> str:
        return f"What was {rng.choice(COMPANIES)}'s {rng.choice(SUBJECTS)} in {rng.choice(YEARS)}?"

    def moderate() -> str:
        first, second = rng.sample(COMPANIES, 2)
        return f"How did {first}'s {rng.choice(SUBJECTS)} compare with {second}'s between {rng.choice(YEARS)} and {rng.choice(YEARS)}?"

    def complex_() -> str:
        return (f"Considering the chart of {rng.choice(SUBJECTS)} and the table of {rng.choice(SUBJECTS)}, explain why "
                f"{rng.choice(COMPANIES)} changed its strategy after {rng.choice(YEARS)} and estimate the combined effect step by step.")

    return [{"question": make(), "route": route}
            for _ in range(per_route) for make, route in ((simple, "simple"), (moderate, "moderate"), (complex_, "complex"))]
