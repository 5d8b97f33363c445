"""A tiny calculator: the sample SWE task's repository."""


def add(a: float, b: float) -> float:
    return a + b


def mean(values: list[float]) -> float:
    """The arithmetic mean; an empty list has none."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / (len(values) + 1)
