# Runs rdma-core's pyverbs test suite (Debian: python3-pyverbs installs it
# under /usr/share/doc/rdma-core/tests, some files gzipped) in one process
# and reports each test on stdout as one line the Rust test parses:
#
#   START <test id>
#   RESULT <test id> <ok|fail|error|skip|xfail|xpass> <one-line reason>
#   DONE
#
# Usage: runner.py SUITE_DIR WORK_DIR TIMEOUT_S [--after TEST_ID] [-k PATTERN]...
#
# The suite is copied to WORK_DIR/tests and decompressed there; the vendor
# modules (mlx5, efa, cuda) are left out. Each test gets TIMEOUT_S seconds:
# a watchdog thread (faulthandler) dumps the stacks and ends the process if
# a test overruns — a hang inside a verb cannot be interrupted from Python.
# The caller then sees a START without its RESULT, and reruns with
# `--after <that test>` to carry on with the tests after it.

import faulthandler
import gzip
import os
import shutil
import sys
import unittest

VENDOR_PREFIXES = ("test_mlx5", "test_efa", "test_cuda")


def prepare(suite_dir, work_dir):
    dst = os.path.join(work_dir, "tests")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    for name in sorted(os.listdir(suite_dir)):
        src = os.path.join(suite_dir, name)
        if not os.path.isfile(src):
            continue
        plain = name[:-3] if name.endswith(".gz") else name
        if plain.startswith(VENDOR_PREFIXES):
            continue
        if name.endswith(".gz"):
            with gzip.open(src, "rb") as f, open(os.path.join(dst, plain), "wb") as out:
                shutil.copyfileobj(f, out)
        else:
            shutil.copyfile(src, os.path.join(dst, plain))
    return dst


def one_line(text):
    lines = [l.strip() for l in str(text).strip().splitlines() if l.strip()]
    return lines[-1] if lines else ""


class Result(unittest.TextTestResult):
    timeout = 60

    def emit(self, test, kind, why):
        print(f"RESULT {test.id()} {kind} {one_line(why)}", flush=True)

    def startTest(self, test):
        print(f"START {test.id()}", flush=True)
        faulthandler.dump_traceback_later(self.timeout, exit=True)
        super().startTest(test)

    def stopTest(self, test):
        faulthandler.cancel_dump_traceback_later()
        super().stopTest(test)

    def addSuccess(self, test):
        super().addSuccess(test)
        self.emit(test, "ok", "")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.emit(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self.emit(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.emit(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.emit(test, "xfail", "")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.emit(test, "xpass", "")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self.emit(subtest, kind, self._exc_info_to_string(err, test))


def flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


def main():
    args = sys.argv[1:]
    suite_dir, work_dir, timeout = args[0], args[1], int(args[2])
    rest = args[3:]
    after = None
    patterns = []
    while rest:
        opt = rest.pop(0)
        if opt == "--after":
            after = rest.pop(0)
        elif opt == "-k":
            patterns.append(rest.pop(0))
        else:
            sys.exit(f"runner.py: unknown option {opt}")
    dst = prepare(suite_dir, work_dir)
    sys.path.insert(0, dst)  # the suite imports `args_parser` by that name
    sys.path.insert(0, work_dir)  # and itself as the package `tests`
    from args_parser import parser

    sys.argv[1:] = []
    parser.parse_args()
    import tests

    loader = unittest.TestLoader()
    if patterns:
        loader.testNamePatterns = [f"*{p}*" for p in patterns]
    ids = []
    suite = unittest.TestSuite()
    for t in flatten(loader.loadTestsFromModule(tests)):
        ids.append(t.id())
        suite.addTest(t)
    if after is not None:
        keep = ids.index(after) + 1 if after in ids else 0
        suite = unittest.TestSuite(list(flatten(suite))[keep:])
    Result.timeout = timeout
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=Result)
    runner.run(suite)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
