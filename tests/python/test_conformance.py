"""The shared conformance cases (tests/conformance/*.json) through the Python client: each
request, parsed from protobuf JSON, sent to a real server; values and gradients (or the status
code and message) as the case expects. The Go and Java clients run the same files.

Run: GRADSERVE_SERVER=... GRADSERVE_PY_STUBS=... /usr/bin/python3 tests/python/test_conformance.py
"""

import glob
import json
import os
import unittest

import grpc
import numpy as np
from google.protobuf import json_format

from server_fixture import REPO, ServerProcess  # first: puts client/python on sys.path
from gradserve import BFLOAT16, GradserveError, from_bfloat16
from gradserve.v1 import gradserve_pb2

CASES = sorted(glob.glob(os.path.join(REPO, "tests", "conformance", "*.json")))


def check_tensor(test, what, got, want, tolerance):
    test.assertEqual(list(got.shape), want["shape"], what)
    if got.dtype == BFLOAT16:
        got = from_bfloat16(got)
    np.testing.assert_allclose(np.asarray(got, np.float64).ravel(), want["values"],
                               rtol=tolerance, atol=tolerance, err_msg=what)


class ConformanceTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess().start()
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def test_there_are_cases(self):
        self.assertGreaterEqual(len(CASES), 9)

    def test_cases(self):
        for path in CASES:
            name = os.path.basename(path)
            with self.subTest(case=name):
                with open(path) as f:
                    case = json.load(f)
                request = json_format.ParseDict(case["request"], gradserve_pb2.GradRequest())
                expect = case["expect"]
                if expect["code"] != "OK":
                    with self.assertRaises(GradserveError) as caught:
                        self.client.grad(request)
                    self.assertEqual(caught.exception.code, getattr(grpc.StatusCode, expect["code"]))
                    for part in expect["message_contains"]:
                        self.assertIn(part, caught.exception.message)
                    continue
                result = self.client.grad(request)
                self.assertEqual(len(result.calls), len(expect["calls"]))
                for i, call in enumerate(expect["calls"]):
                    self.assertEqual(set(result.calls[i].gradients), set(call), f"{name} call {i}")
                    for input_name, want in call.items():
                        got = result.calls[i][input_name]
                        if want is None:
                            self.assertIsNone(got, f"{name} call {i} {input_name}")
                        else:
                            check_tensor(self, f"{name} call {i} {input_name}", got, want,
                                         expect["tolerance"])
                for value_name, want in expect.get("values", {}).items():
                    check_tensor(self, f"{name} value {value_name}", result.values[value_name],
                                 want, expect["tolerance"])


if __name__ == "__main__":
    unittest.main()
