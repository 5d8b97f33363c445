"""Hand-made pytest edge cases, run for real by make_corpus.py: parametrised ids with
spaces and brackets, skips, xfail/xpass, fixture errors, failures with ' - ' messages."""

import pytest


@pytest.mark.parametrize(
    "text", ["a b", "x[1]", "two  spaces", "dash - inside", "/tmp/abs/path.txt"]
)
def test_ids_with_spaces(text):
    assert text


@pytest.mark.parametrize("value", [1, 2, 3], ids=["one", "two [nested]", "three"])
def test_bracketed_ids(value):
    assert value != 2, "value - two is broken"


def test_plain_pass():
    assert 1 + 1 == 2


def test_plain_fail():
    assert [1, 2] == [1, 3]


@pytest.mark.skip(reason="not on this platform")
def test_skipped():
    pass


@pytest.mark.xfail(reason="known bug")
def test_expected_failure():
    assert False  # noqa: B011 (a real failing test, on purpose)


@pytest.mark.xfail(reason="fixed already")
def test_unexpected_pass():
    assert True


@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")


def test_fixture_error(broken):
    pass


class TestGroup:
    @pytest.mark.parametrize("n", [0, -1])
    def test_method(self, n):
        assert n == 0
