"""Hand-made log edge cases (text written here, not produced by a run), for the parity tests."""

from __future__ import annotations

S, E, X = ">>>>> Start Test Output", ">>>>> End Test Output", ">>>>> Test Exit Code"


def wrap(body: str, exit_code: int | None = 0) -> str:
    tail = f"\n{X}: {exit_code}\n" if exit_code is not None else "\n"
    return f"+ setup noise\n{S}\n{body}\n{E}{tail}"


HANDMADE: dict[str, str] = {
    "matplotlib_mousebutton": wrap(
        "PASSED lib/matplotlib/tests/test_backend_bases.py::test_interactive_zoom[MouseButton.LEFT]\n"
        "FAILED lib/matplotlib/tests/test_widgets.py::test_span_selector[MouseButton.RIGHT] - AssertionError\n"
        "SKIPPED [2] lib/matplotlib/tests/test_a.py:12: needs cairo\n"
        "PASSED [100%]",
        1,
    ),
    "seaborn_styles": wrap(
        "tests/test_core.py::TestHue::test_a PASSED [ 10%]\n"
        "PASSED tests/test_core.py::TestHue::test_b\n"
        "FAILED tests/test_core.py::TestHue::test_c - ValueError: x\n"
        "tests/test_core.py::TestHue::test_d FAILED",
        1,
    ),
    "pytest_ansi_and_old_verbose": wrap(
        "\x1b[32mPASSED\x1b[0m tests/test_x.py::test_one[a b]\n"
        "tests/test_x.py::test_two PASSED\n"
        "\x1b[31mFAILED\x1b[0m tests/test_x.py::test_three[x - y] - assert 0\n"
        "XFAIL tests/test_x.py::test_four - reason",
        1,
    ),
    "truncated_ids": wrap(
        "PASSED astropy/io/tests/test_ogip.py::test_fail[log(photon cm-2 s-1)]\n"
        "PASSED astropy/io/tests/test_ogip.py::test_fail[log(photon cm-2 s-2)]\n"
        "FAILED astropy/io/tests/test_ogip.py::test_mixed[a b]\n"
        "PASSED astropy/io/tests/test_ogip.py::test_mixed[a c]",
        1,
    ),
    "go_test": wrap(
        "=== RUN   TestAdd\n--- PASS: TestAdd (0.00s)\n=== RUN   TestSub/neg\n"
        "    --- FAIL: TestSub/neg (0.01s)\n--- SKIP: TestMul (0.00s)\nFAIL\tpkg\t0.02s",
        1,
    ),
    "cargo_test": wrap(
        "running 3 tests\ntest a::works ... ok\ntest a::broken ... FAILED\n"
        "test a::later ... ignored\ntest result: FAILED. 1 passed; 1 failed; 1 ignored",
        101,
    ),
    "jest_verbose": wrap(
        " PASS  src/sum.test.js\n  ✓ adds 1 + 2 (3 ms)\n  ✕ subtracts (1 ms)\n  ○ skipped later\n"
        "Tests:       1 failed, 1 skipped, 1 passed, 3 total",
        1,
    ),
    "jest_summary_only": wrap("Test Suites: 2 passed, 2 total\nTests:       7 passed, 7 total", 0),
    "django_interrupted": wrap(
        "test_a (app.tests.T.test_a) ... ok\n"
        "test_b (app.tests.T.test_b) ... System check identified no issues (0 silenced)\nok\n"
        "test_c (app.tests.T.test_c) ...\nsome output\nok\n"
        "test_d (app.tests.T.test_d) ... skipped 'no db'\n"
        "test_e (app.tests.T.test_e) ... FAIL\n"
        "ERROR: test_f (app.tests.T.test_f)\n"
        "test_g (app.tests.T.test_g) ... expected failure\n"
        "--version is equivalent to version",
        1,
    ),
    "sympy_headers": wrap(
        "test_one ok\ntest_two F\ntest_three E\n"
        "________________ sympy/core/tests/test_x.py:test_two ________________",
        1,
    ),
    "apply_failed": f"{S}\n>>>>> Patch Apply Failed\nPASSED a.py::t\n{E}\n",
    "timed_out": wrap("PASSED a.py::t\n>>>>> Tests Timed Out", None),
    "tests_errored": wrap(">>>>> Tests Errored\nPASSED a.py::t", 0),
    "reset_failed": ">>>>> Reset Failed\n",
    "no_end_marker": f"{S}\nPASSED a.py::t\n",
    "results_outside_markers": f"PASSED a.py::t\nFAILED a.py::u\n{S}\n{E}\n{X}: 1\n",
    "exit_nonzero_no_failures": wrap("PASSED a.py::t\nPASSED a.py::u", 2),
    "exit_nonzero_with_error": wrap("PASSED a.py::t\nERROR a.py::u", 2),
    "empty_but_suite_ran": wrap("5 passing (30ms)", 0),
    "zero_count_summary": wrap("Executed 0 of 0 SUCCESS", 0),
    "mangled_status_word": wrap("PASSEDx a.py::t\nFAILED: a.py::u", 1),
    "crlf_lines": wrap("PASSED a.py::t\r\nFAILED a.py::u\r", 1),
}
