"""Run pytest for SWE-Gym grading and record each test's outcome in a report file.

    python -s pytest_runner.py TOKEN_PATH REPORT_PATH PYTEST_ARGS...

Grading copies this file into the sandbox and runs it in place of `python -m pytest`; it imports nothing of
trl_multiturn. Each record is one line `TOKEN JSON` appended to REPORT_PATH: `{"test": nodeid, "status": S}`
with S as pytest's short summary names it (PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS), and a last
`{"exit": code}` once pytest returns. The token is read from TOKEN_PATH, which is deleted before pytest (and so
any of the agent's code) starts: it is in no file, argument or environment variable the tests can read. The
report file is write-only for the sandbox, so the records cannot be read back for their token either. pytest is
imported before the working folder goes on sys.path, so no module of the repository can stand in for it. Grading
reads nothing else the test run prints or writes.
"""

import json
import os
import sys


def _status(report):
    """The outcome pytest's `-rA` summary gives a test after this phase, or None if the phase adds nothing."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "XPASS" if xfail else "PASSED"
        if report.skipped:
            return "XFAIL" if xfail else "SKIPPED"
        return "FAILED"
    if report.failed:
        return "ERROR"
    if report.skipped:
        return "XFAIL" if xfail else "SKIPPED"
    return None


def main() -> int:
    token_path, report_path, *args = sys.argv[1:]
    with open(token_path) as f:
        token = f.read().strip()
    os.unlink(token_path)
    fd = os.open(report_path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    import pytest  # before the working folder is on sys.path: a `pytest.py` of the repository cannot stand in

    sys.path[0] = os.getcwd()  # the working folder first, as `python -m pytest` has it (not this file's folder)

    def write(record: dict) -> None:
        os.write(fd, f"{token} {json.dumps(record)}\n".encode())

    class Recorder:
        def pytest_runtest_logreport(self, report):
            status = _status(report)
            if status is not None:
                write({"test": report.nodeid, "status": status})

    code = int(pytest.main(args, plugins=[Recorder()]))
    write({"exit": code})
    return code


if __name__ == "__main__":
    sys.exit(main())
